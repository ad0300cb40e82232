//! NVIDIA redistributable manifests (`redistrib_<version>.json`) for CUDA components and
//! cuDNN, as published under `https://developer.download.nvidia.com/compute/<product>/redist/`.
//!
//! A manifest maps each component (`cuda_cudart`, `libcublas`, `cudnn`, ...) to a version
//! and, per platform (`linux-x86_64`, `linux-sbsa`), to an archive: `relative_path` (against
//! the manifest's directory), `sha256`, `md5` and `size` (a string in NVIDIA's files).
//! cuDNN's manifest nests one more level: per CUDA variant (`cuda11`, `cuda12`). This
//! module parses manifests and resolves component names to URL + sha256 + size; the
//! archives are fetched like any other artifact and unpacked by the layer code.

use std::collections::BTreeMap;

use reqwest::Url;
use serde_json::Value;

use crate::digest::{Digest, DigestError};
use crate::fetch::file_name::{FileName, FileNameError};
use crate::fetch::http::{HttpClient, HttpError};

#[derive(Debug, thiserror::Error)]
pub enum RedistError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("Failed to parse the NVIDIA redist manifest `{url}`")]
    Json {
        url: Url,
        #[source]
        source: serde_json::Error,
    },
    #[error("Redist manifest `{url}` is malformed: {reason}")]
    Malformed { url: Url, reason: String },
    #[error("Redist manifest `{url}` has no component `{component}`; it has: {}", available.join(", "))]
    NoComponent {
        url: Url,
        component: String,
        available: Vec<String>,
    },
    #[error("Component `{component}` in `{url}` has no archive for platform `{platform}`; it has: {}", available.join(", "))]
    NoPlatform {
        url: Url,
        component: String,
        platform: String,
        available: Vec<String>,
    },
    #[error("Component `{component}` in `{url}` is built per CUDA variant ({}); say which one (e.g. `cuda12`)", available.join(", "))]
    VariantRequired {
        url: Url,
        component: String,
        available: Vec<String>,
    },
    #[error("Component `{component}` in `{url}` has no `{variant}` build; it has: {}", available.join(", "))]
    NoVariant {
        url: Url,
        component: String,
        variant: String,
        available: Vec<String>,
    },
    #[error("Component `{component}` in `{url}` lists an unusable sha256")]
    BadDigest {
        url: Url,
        component: String,
        #[source]
        source: DigestError,
    },
}

/// One archive entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistArchive {
    pub relative_path: String,
    pub sha256: Digest,
    pub size: u64,
}

/// One component: its version and archives per platform (and per CUDA variant for cuDNN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistComponent {
    pub name: String,
    pub display_name: Option<String>,
    pub version: String,
    /// platform -> variant (`""` when the component has no variants) -> archive.
    pub archives: BTreeMap<String, BTreeMap<String, RedistArchive>>,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistManifest {
    pub url: Url,
    pub release_label: Option<String>,
    pub release_product: Option<String>,
    pub components: BTreeMap<String, RedistComponent>,
}

/// What to take from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistRequest {
    pub manifest_url: Url,
    pub components: Vec<String>,
    /// `linux-x86_64` or `linux-sbsa`.
    pub platform: String,
    /// For per-variant components such as cuDNN: `cuda12`.
    pub cuda_variant: Option<String>,
}

/// A component resolved to one downloadable archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedistArtifact {
    pub component: String,
    pub version: String,
    pub platform: String,
    pub variant: Option<String>,
    pub url: Url,
    pub sha256: Digest,
    pub size: u64,
    pub manifest_url: Url,
}

impl RedistArtifact {
    /// The archive's file name (last path segment), checked to be a plain file name.
    pub fn filename(&self) -> Result<FileName, FileNameError> {
        FileName::new(
            self.url
                .path_segments()
                .and_then(|mut s| s.next_back().map(str::to_string))
                .unwrap_or_default(),
        )
    }
}

fn archive_from(
    url: &Url,
    component: &str,
    value: &Value,
) -> Result<Option<RedistArchive>, RedistError> {
    let Some(object) = value.as_object() else {
        return Ok(None);
    };
    let Some(relative_path) = object.get("relative_path").and_then(Value::as_str) else {
        return Ok(None);
    };
    let malformed = |reason: String| RedistError::Malformed {
        url: url.clone(),
        reason,
    };
    let sha256 = object
        .get("sha256")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("`{relative_path}` has no sha256")))?;
    let sha256 = Digest::from_hex(sha256).map_err(|source| RedistError::BadDigest {
        url: url.clone(),
        component: component.to_string(),
        source,
    })?;
    let size = match object.get("size") {
        Some(Value::String(s)) => s.parse().ok(),
        Some(Value::Number(n)) => n.as_u64(),
        _ => None,
    }
    .ok_or_else(|| malformed(format!("`{relative_path}` has no usable size")))?;
    Ok(Some(RedistArchive {
        relative_path: relative_path.to_string(),
        sha256,
        size,
    }))
}

impl RedistManifest {
    /// Parse manifest JSON that was fetched from `url`.
    pub fn parse(url: Url, body: &[u8]) -> Result<Self, RedistError> {
        let value: Value = serde_json::from_slice(body).map_err(|source| RedistError::Json {
            url: url.clone(),
            source,
        })?;
        let Value::Object(top) = value else {
            return Err(RedistError::Malformed {
                url,
                reason: "the top level is not an object".into(),
            });
        };
        let mut components = BTreeMap::new();
        for (name, value) in &top {
            let Value::Object(fields) = value else {
                continue;
            };
            let Some(version) = fields.get("version").and_then(Value::as_str) else {
                continue;
            };
            let mut archives: BTreeMap<String, BTreeMap<String, RedistArchive>> = BTreeMap::new();
            for (platform, entry) in fields {
                if let Some(archive) = archive_from(&url, name, entry)? {
                    archives
                        .entry(platform.clone())
                        .or_default()
                        .insert(String::new(), archive);
                } else if let Some(variants) = entry.as_object() {
                    for (variant, inner) in variants {
                        if let Some(archive) = archive_from(&url, name, inner)? {
                            archives
                                .entry(platform.clone())
                                .or_default()
                                .insert(variant.clone(), archive);
                        }
                    }
                }
            }
            components.insert(
                name.clone(),
                RedistComponent {
                    name: name.clone(),
                    display_name: fields
                        .get("name")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    version: version.to_string(),
                    archives,
                },
            );
        }
        Ok(RedistManifest {
            release_label: top
                .get("release_label")
                .and_then(Value::as_str)
                .map(str::to_string),
            release_product: top
                .get("release_product")
                .and_then(Value::as_str)
                .map(str::to_string),
            url,
            components,
        })
    }

    /// Fetch and parse a manifest. A `file://` URL reads a mirrored manifest from disk
    /// (air-gapped sites); its archives then resolve to `file://` URLs beside it.
    pub async fn fetch(client: &HttpClient, url: Url) -> Result<Self, RedistError> {
        if url.scheme() == "file" {
            let path = url.to_file_path().map_err(|()| RedistError::Malformed {
                url: url.clone(),
                reason: "not a local file URL".into(),
            })?;
            let malformed = |reason: String| RedistError::Malformed {
                url: url.clone(),
                reason,
            };
            // The same bound as a manifest fetched over HTTP.
            let limit = crate::fetch::http::MAX_DOCUMENT_BYTES;
            let file = fs_err::File::open(&path).map_err(|e| malformed(e.to_string()))?;
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(file, limit + 1), &mut body)
                .map_err(|e| malformed(e.to_string()))?;
            if body.len() as u64 > limit {
                return Err(malformed(format!("larger than {limit} bytes")));
            }
            return Self::parse(url, &body);
        }
        let body = client.get_bytes(&url, Some("application/json")).await?;
        Self::parse(url, &body)
    }

    /// Resolve one component for a platform (and CUDA variant when it has variants).
    pub fn resolve(
        &self,
        component: &str,
        platform: &str,
        variant: Option<&str>,
    ) -> Result<RedistArtifact, RedistError> {
        let entry = self
            .components
            .get(component)
            .ok_or_else(|| RedistError::NoComponent {
                url: self.url.clone(),
                component: component.to_string(),
                available: self.components.keys().cloned().collect(),
            })?;
        let per_variant = entry
            .archives
            .get(platform)
            .ok_or_else(|| RedistError::NoPlatform {
                url: self.url.clone(),
                component: component.to_string(),
                platform: platform.to_string(),
                available: entry.archives.keys().cloned().collect(),
            })?;
        let (chosen_variant, archive) = if let Some(archive) = per_variant.get("") {
            (None, archive)
        } else {
            let available: Vec<String> = per_variant.keys().cloned().collect();
            let variant = variant.ok_or_else(|| RedistError::VariantRequired {
                url: self.url.clone(),
                component: component.to_string(),
                available: available.clone(),
            })?;
            let archive = per_variant
                .get(variant)
                .ok_or_else(|| RedistError::NoVariant {
                    url: self.url.clone(),
                    component: component.to_string(),
                    variant: variant.to_string(),
                    available,
                })?;
            (Some(variant.to_string()), archive)
        };
        let url = below_manifest(&self.url, &archive.relative_path).map_err(|reason| {
            RedistError::Malformed {
                url: self.url.clone(),
                reason: format!("bad relative_path `{}`: {reason}", archive.relative_path),
            }
        })?;
        Ok(RedistArtifact {
            component: component.to_string(),
            version: entry.version.clone(),
            platform: platform.to_string(),
            variant: chosen_variant,
            url,
            sha256: archive.sha256,
            size: archive.size,
            manifest_url: self.url.clone(),
        })
    }
}

/// Fetch the manifest of `request` and resolve all its components.
pub async fn resolve_request(
    client: &HttpClient,
    request: &RedistRequest,
) -> Result<Vec<RedistArtifact>, RedistError> {
    let manifest = RedistManifest::fetch(client, request.manifest_url.clone()).await?;
    request
        .components
        .iter()
        .map(|component| {
            manifest.resolve(
                component,
                &request.platform,
                request.cuda_variant.as_deref(),
            )
        })
        .collect()
}

/// `relative_path` joined to the manifest's URL, which it may not leave: the manifest is
/// the server's word, and `//host/x`, `https://host/x` or `../..` would send the lock to
/// another host or another part of this one.
fn below_manifest(manifest: &Url, relative_path: &str) -> Result<Url, String> {
    let url = manifest.join(relative_path).map_err(|e| e.to_string())?;
    let directory = manifest.join(".").map_err(|e| e.to_string())?;
    // Scheme, host and port compared as such: a file: URL's origin is opaque, never equal.
    let same_place = url.scheme() == directory.scheme()
        && url.host_str() == directory.host_str()
        && url.port_or_known_default() == directory.port_or_known_default();
    if !same_place || !url.path().starts_with(directory.path()) {
        return Err(format!(
            "it leads to {url}, outside {directory}, where the manifest lists its archives"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX_A: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const HEX_B: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    fn cuda_manifest() -> RedistManifest {
        let body = format!(
            r#"{{"release_date":"2024-04-15","release_label":"12.4.1","release_product":"cuda",
            "cuda_cudart":{{"name":"CUDA Runtime (cudart)","license":"CUDA Toolkit","version":"12.4.127",
              "linux-x86_64":{{"relative_path":"cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz","sha256":"{HEX_A}","md5":"x","size":"1048576"}},
              "linux-sbsa":{{"relative_path":"cuda_cudart/linux-sbsa/a.tar.xz","sha256":"{HEX_B}","md5":"x","size":10}}}}}}"#
        );
        RedistManifest::parse(
            Url::parse(
                "https://developer.download.nvidia.com/compute/cuda/redist/redistrib_12.4.1.json",
            )
            .unwrap(),
            body.as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn resolves_cuda_component() {
        let manifest = cuda_manifest();
        assert_eq!(manifest.release_label.as_deref(), Some("12.4.1"));
        let artifact = manifest
            .resolve("cuda_cudart", "linux-x86_64", None)
            .unwrap();
        assert_eq!(artifact.version, "12.4.127");
        assert_eq!(artifact.size, 1_048_576);
        assert_eq!(artifact.sha256, Digest::from_hex(HEX_A).unwrap());
        assert_eq!(
            artifact.url.as_str(),
            "https://developer.download.nvidia.com/compute/cuda/redist/cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz"
        );
        assert_eq!(
            artifact.filename().unwrap(),
            "cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz"
        );
        let error = manifest
            .resolve("cuda_nvcc", "linux-x86_64", None)
            .unwrap_err();
        assert!(error.to_string().contains("cuda_cudart"), "{error}");
        let error = manifest
            .resolve("cuda_cudart", "windows-x86_64", None)
            .unwrap_err();
        assert!(error.to_string().contains("linux-sbsa"), "{error}");
    }

    #[test]
    fn cudnn_variants() {
        let body = format!(
            r#"{{"release_label":"9.1.0","cudnn":{{"name":"NVIDIA CUDA Deep Neural Network library","version":"9.1.0.70",
            "linux-x86_64":{{
              "cuda11":{{"relative_path":"cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda11-archive.tar.xz","sha256":"{HEX_A}","md5":"x","size":"5"}},
              "cuda12":{{"relative_path":"cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz","sha256":"{HEX_B}","md5":"x","size":"6"}}}},
            "cuda_variant":["11","12"]}}}}"#
        );
        let manifest = RedistManifest::parse(
            Url::parse("http://127.0.0.1:1/cudnn/redist/redistrib_9.1.0.json").unwrap(),
            body.as_bytes(),
        )
        .unwrap();
        let artifact = manifest
            .resolve("cudnn", "linux-x86_64", Some("cuda12"))
            .unwrap();
        assert_eq!(artifact.sha256, Digest::from_hex(HEX_B).unwrap());
        assert_eq!(artifact.variant.as_deref(), Some("cuda12"));
        assert!(matches!(
            manifest.resolve("cudnn", "linux-x86_64", None),
            Err(RedistError::VariantRequired { .. })
        ));
        let error = manifest
            .resolve("cudnn", "linux-x86_64", Some("cuda13"))
            .unwrap_err();
        assert!(error.to_string().contains("cuda11, cuda12"), "{error}");
    }

    #[test]
    fn an_archive_path_may_not_leave_the_manifest_directory() {
        let mirror: Url = "file:///srv/mirror/redistrib_12.4.1.json".parse().unwrap();
        assert!(below_manifest(&mirror, "cuda_nvrtc/a.tar.xz").is_ok());
        assert!(below_manifest(&mirror, "../etc/passwd").is_err());
        let manifest: Url = "https://mirror.example/cuda/redist/redistrib_12.4.1.json"
            .parse()
            .unwrap();
        let inside = below_manifest(&manifest, "cuda_nvcc/linux-x86_64/a.tar.xz").unwrap();
        assert_eq!(
            inside.as_str(),
            "https://mirror.example/cuda/redist/cuda_nvcc/linux-x86_64/a.tar.xz"
        );
        for hostile in [
            "//evil.example/a.tar.xz",
            "https://evil.example/a.tar.xz",
            "../../a.tar.xz",
            "/a.tar.xz",
            "http://mirror.example/cuda/redist/a.tar.xz",
            "file:///cuda/redist/a.tar.xz",
        ] {
            let error = below_manifest(&manifest, hostile).unwrap_err();
            assert!(error.contains("outside"), "{hostile}: {error}");
        }
    }
}
