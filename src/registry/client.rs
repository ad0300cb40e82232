//! The distribution API client of one registry: the small generic calls (manifests, blobs)
//! the other stages use, each sent through the auth layer ([`AuthorizedTransport`]) on the
//! retrying transport.

use std::io::Write;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{Method, Response, StatusCode, Url};

use super::auth::Credentials;
use super::authorized::AuthorizedTransport;
use super::authorized::{read_limited, status_error, Body};
use super::RegistryError;
use crate::cache::BlobStore;
use crate::digest::Digest;
use crate::net::{range_headers, Piece, ResumableBody, RetryPolicy};
use crate::reference::Reference;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// The OCI 1.1 empty descriptor's media type (`{}`), the config of artifact manifests.
/// A manifest or index is read up to this size (distribution's own limit on a PUT).
pub const MAX_MANIFEST: u64 = 4 << 20;
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub credentials: Credentials,
    /// Registries (host[:port]) to talk to over plain http. localhost always may.
    pub insecure_registries: Vec<String>,
    pub retry: RetryPolicy,
    pub connect_timeout: Duration,
    /// Longest silence while reading a response.
    pub read_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            credentials: Credentials::Anonymous,
            insecure_registries: Vec::new(),
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(120),
        }
    }
}

/// An OS/architecture pair (`linux/amd64`, `linux/arm64/v8`) to pick from an index.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

/// linux and this machine's architecture (amd64 on x86_64, arm64 on aarch64): the image
/// of a multi-platform index this machine can run.
impl Default for Platform {
    fn default() -> Self {
        crate::platform::Platform::host_or_amd64().into()
    }
}

/// The index entry of one of the platforms cudastack builds (`linux/amd64`, no variant).
impl From<crate::platform::Platform> for Platform {
    fn from(platform: crate::platform::Platform) -> Self {
        Platform {
            os: "linux".to_string(),
            architecture: platform.oci_architecture().to_string(),
            variant: None,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.split('/').collect();
        match parts.as_slice() {
            [os, architecture] | [os, architecture, _]
                if !os.is_empty() && !architecture.is_empty() =>
            {
                Ok(Platform {
                    os: os.to_string(),
                    architecture: architecture.to_string(),
                    variant: parts.get(2).map(|v| v.to_string()),
                })
            }
            _ => Err(format!(
                "`{text}` is not a platform of the form os/architecture[/variant]"
            )),
        }
    }
}

/// A manifest (or index) as the registry holds it: raw bytes, media type and digest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
}

impl Manifest {
    pub fn is_index(&self) -> bool {
        self.media_type == OCI_INDEX || self.media_type == DOCKER_MANIFEST_LIST
    }
}

/// A client for one registry. Cheap to share (`Arc`); safe to use from parallel tasks.
#[derive(Debug)]
pub struct RegistryClient {
    authorized: AuthorizedTransport,
}

/// `repository:NAME:ACTIONS` scopes for the token service.
pub(crate) fn scope(repository: &str, actions: &str) -> String {
    format!("repository:{repository}:{actions}")
}

impl RegistryClient {
    /// A client for the registry of `reference` (no request is made yet).
    pub fn new(reference: &Reference, options: ClientOptions) -> Result<Self, RegistryError> {
        Ok(Self {
            authorized: AuthorizedTransport::new(reference, options)?,
        })
    }

    pub fn registry(&self) -> &str {
        self.authorized.registry()
    }

    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        self.authorized.retry_policy()
    }

    /// `BASE/v2/PATH`.
    pub(crate) fn url(&self, path: &str) -> Url {
        self.authorized.url(path)
    }

    /// Resolve a `Location` header (absolute or relative) against the registry.
    pub(crate) fn location(&self, response: &Response) -> Result<Url, RegistryError> {
        self.authorized.location(response)
    }

    /// Send once with auth (for the steps of an upload session, which must not be sent
    /// twice: push resumes them on its own terms).
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        scopes: &[String],
        headers: HeaderMap,
        body: &Body,
    ) -> Result<Response, RegistryError> {
        self.authorized
            .send(method, url, scopes, headers, body)
            .await
    }

    /// Send with auth, retried by the transport's rule (idempotent requests only; each
    /// retry said on stderr). The response may still have a failure status: the caller
    /// decides what it means. Returns it with the number of attempts made.
    pub(crate) async fn request(
        &self,
        method: Method,
        url: &Url,
        scopes: &[String],
        headers: HeaderMap,
        body: &Body,
    ) -> Result<(Response, u32), RegistryError> {
        self.authorized
            .request(method, url, scopes, headers, body)
            .await
    }

    /// Does `repository` hold the blob? (HEAD; 404 is `false`.)
    pub async fn has_blob(&self, repository: &str, digest: &Digest) -> Result<bool, RegistryError> {
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let (response, attempts) = self
            .request(Method::HEAD, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        match response.status() {
            status if status.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(status_error(Method::HEAD, &url, response, attempts).await),
        }
    }

    /// Upload a small blob held in memory (a config, an artifact payload) if missing.
    pub async fn put_blob_bytes(
        &self,
        repository: &str,
        bytes: Bytes,
    ) -> Result<Digest, RegistryError> {
        Ok(self.put_blob_bytes_counted(repository, bytes).await?.0)
    }

    /// [`Self::put_blob_bytes`], also saying how many bytes went up (0 when the registry
    /// had the blob).
    pub async fn put_blob_bytes_counted(
        &self,
        repository: &str,
        bytes: Bytes,
    ) -> Result<(Digest, u64), RegistryError> {
        let digest = Digest::of_bytes(&bytes);
        if self.has_blob(repository, &digest).await? {
            return Ok((digest, 0));
        }
        let size = bytes.len() as u64;
        let scopes = [scope(repository, "pull,push")];
        let url = self.url(&format!("{repository}/blobs/uploads/"));
        let (response, attempts) = self
            .request(Method::POST, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        if response.status() != StatusCode::ACCEPTED {
            return Err(status_error(Method::POST, &url, response, attempts).await);
        }
        let mut put_url = self.location(&response)?;
        put_url
            .query_pairs_mut()
            .append_pair("digest", &digest.to_string());
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let (response, attempts) = self
            .request(Method::PUT, &put_url, &scopes, headers, &Body::Bytes(bytes))
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(status_error(Method::PUT, &put_url, response, attempts).await);
        }
        Ok((digest, size))
    }

    /// PUT a manifest (or index) as raw bytes under `reference`'s tag (or its digest).
    /// Returns the digest of the bytes, checked against what the registry says it stored.
    pub async fn put_manifest(
        &self,
        reference: &Reference,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<Digest, RegistryError> {
        let digest = Digest::of_bytes(&bytes);
        super::push::check_pinned(reference, &digest)?;
        let target = match (reference.tag(), reference.digest()) {
            (Some(tag), _) => tag.to_string(),
            (None, Some(_)) | (None, None) => digest.to_string(),
        };
        let url = self.url(&format!("{}/manifests/{target}", reference.repository()));
        let scopes = [scope(reference.repository(), "pull,push")];
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(media_type).map_err(|_| RegistryError::UnsupportedMediaType {
                reference: reference.to_string(),
                media_type: media_type.to_string(),
            })?,
        );
        let (response, attempts) = self
            .request(Method::PUT, &url, &scopes, headers, &Body::Bytes(bytes))
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::PUT, &url, response, attempts).await);
        }
        if let Some(stored) = header_digest(&response) {
            if stored != digest {
                return Err(RegistryError::DigestMismatch {
                    what: format!("the manifest `{reference}` as stored by the registry"),
                    expected: digest,
                    found: stored,
                });
            }
        }
        Ok(digest)
    }

    /// GET a manifest or index (any of the OCI and Docker v2 types), digest-checked.
    pub async fn get_manifest(&self, reference: &Reference) -> Result<Manifest, RegistryError> {
        self.get_manifest_limited(reference, MAX_MANIFEST).await
    }

    /// [`Self::get_manifest`], reading at most `max` bytes (at most [`MAX_MANIFEST`]): a
    /// referrer's manifest is read up to the size its index entry gives.
    pub async fn get_manifest_limited(
        &self,
        reference: &Reference,
        max: u64,
    ) -> Result<Manifest, RegistryError> {
        let max = max.min(MAX_MANIFEST);
        let url = self.url(&format!(
            "{}/manifests/{}",
            reference.repository(),
            reference.manifest_target()
        ));
        let scopes = [scope(reference.repository(), "pull")];
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_str(&MANIFEST_TYPES.join(", ")).expect("media types are ASCII"),
        );
        let (response, attempts) = self
            .request(Method::GET, &url, &scopes, headers, &Body::Empty)
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Err(RegistryError::ManifestNotFound {
                reference: reference.to_string(),
            });
        }
        if !response.status().is_success() {
            return Err(status_error(Method::GET, &url, response, attempts).await);
        }
        let header_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let stored = header_digest(&response);
        let bytes = read_limited(response, &url, max, || RegistryError::ManifestTooLarge {
            reference: reference.to_string(),
            max,
        })
        .await?;
        let digest = Digest::of_bytes(&bytes);
        for expected in [reference.digest().copied(), stored].into_iter().flatten() {
            if expected != digest {
                return Err(RegistryError::DigestMismatch {
                    what: format!("the manifest of `{reference}`"),
                    expected,
                    found: digest,
                });
            }
        }
        let media_type = manifest_media_type(reference, &bytes, header_type)?;
        Ok(Manifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// The image manifest of `reference` for `platform`: an index is resolved to its entry.
    pub async fn get_image_manifest(
        &self,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<Manifest, RegistryError> {
        let manifest = self.get_manifest(reference).await?;
        if !manifest.is_index() {
            return Ok(manifest);
        }
        let index: oci_spec::image::ImageIndex =
            serde_json::from_slice(&manifest.bytes).map_err(|e| RegistryError::Document {
                path: reference.to_string(),
                what: "an image index",
                detail: e.to_string(),
            })?;
        let mut available = Vec::new();
        for entry in index.manifests() {
            let Some(p) = entry.platform() else { continue };
            let os = p.os().to_string();
            let architecture = p.architecture().to_string();
            let variant = p.variant().clone();
            available.push(format!(
                "{os}/{architecture}{}",
                variant
                    .as_deref()
                    .map(|v| format!("/{v}"))
                    .unwrap_or_default()
            ));
            if os == platform.os
                && architecture == platform.architecture
                && (platform.variant.is_none() || platform.variant == variant)
            {
                let digest: Digest = entry.digest().to_string().parse().map_err(
                    |e: crate::digest::DigestError| RegistryError::Document {
                        path: reference.to_string(),
                        what: "an image index",
                        detail: e.to_string(),
                    },
                )?;
                let child = self.get_manifest(&reference.with_digest(digest)).await?;
                if child.is_index() {
                    return Err(RegistryError::UnsupportedMediaType {
                        reference: reference.with_digest(digest).to_string(),
                        media_type: format!("{} nested in an index", child.media_type),
                    });
                }
                return Ok(child);
            }
        }
        Err(RegistryError::NoPlatform {
            reference: reference.to_string(),
            platform: platform.to_string(),
            available: if available.is_empty() {
                "no platform entries".to_string()
            } else {
                available.join(", ")
            },
        })
    }

    /// GET a blob into memory, refusing more than `max` bytes; digest-checked. For small
    /// blobs only (configs): layers go through [`RegistryClient::download_blob`].
    pub async fn get_blob_bytes(
        &self,
        repository: &str,
        digest: &Digest,
        max: u64,
    ) -> Result<Bytes, RegistryError> {
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let (response, attempts) = self
            .request(Method::GET, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::GET, &url, response, attempts).await);
        }
        let bytes = read_limited(response, &url, max, || RegistryError::TooLarge {
            repository: repository.to_string(),
            digest: *digest,
            max,
        })
        .await?;
        let found = Digest::of_bytes(&bytes);
        if found != *digest {
            return Err(RegistryError::DigestMismatch {
                what: format!("blob `{url}`"),
                expected: *digest,
                found,
            });
        }
        Ok(bytes)
    }

    /// Stream a blob of `size` bytes (as its manifest gives) into `store`: never written
    /// past `size` ([`RegistryError::TooLarge`]), continued from where it stopped when cut
    /// ([`ResumableBody`]), committed only when its digest is `digest` and it is exactly
    /// `size` long. `what` names it in errors.
    pub(crate) async fn download_blob(
        &self,
        repository: &str,
        digest: &Digest,
        size: u64,
        store: &BlobStore,
        what: &str,
    ) -> Result<(), RegistryError> {
        let max = size;
        let too_large = || RegistryError::TooLarge {
            repository: repository.to_string(),
            digest: *digest,
            max,
        };
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let tmp = store.tmp_dir();
        let io = |source| RegistryError::Io {
            path: tmp.clone(),
            source,
        };
        let mut pending = store.begin()?;
        let mut found = 0u64;
        let mut body = ResumableBody::new(&url, 0, self.retry_policy(), |from| {
            self.open_blob(&url, &scopes, from, max, too_large)
        });
        while let Some(piece) = body.next().await? {
            match piece {
                // Dropping the old temp file deletes it.
                Piece::Restart => (pending, found) = (store.begin()?, 0),
                Piece::Bytes(chunk) => {
                    found += chunk.len() as u64;
                    if found > max {
                        return Err(too_large());
                    }
                    pending.write_all(&chunk).map_err(io)?;
                }
            }
        }
        pending.flush().map_err(io)?;
        pending.commit(Some(digest), what)?;
        if found != size {
            return Err(RegistryError::Document {
                path: what.to_string(),
                what: "the size its manifest gives",
                detail: format!("{found} bytes, the manifest says {size}"),
            });
        }
        Ok(())
    }

    /// The GET of a blob from byte `from`, refused when it says it is larger than `max`.
    async fn open_blob(
        &self,
        url: &Url,
        scopes: &[String],
        from: u64,
        max: u64,
        too_large: impl FnOnce() -> RegistryError,
    ) -> Result<Option<Response>, RegistryError> {
        let (response, attempts) = self
            .request(Method::GET, url, scopes, range_headers(from), &Body::Empty)
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::GET, url, response, attempts).await);
        }
        if response
            .content_length()
            .is_some_and(|len| from.saturating_add(len) > max)
        {
            return Err(too_large());
        }
        Ok(Some(response))
    }
}

/// The `Docker-Content-Digest` header, when present and sha256.
pub(crate) fn header_digest(response: &Response) -> Option<Digest> {
    response
        .headers()
        .get("docker-content-digest")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The manifest types cudastack reads, in the order of its `Accept` header.
const MANIFEST_TYPES: [&str; 4] = [
    OCI_MANIFEST,
    OCI_INDEX,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
];

/// A manifest's media type: its own `mediaType`, else the `Content-Type` the registry sent,
/// else OCI's; one cudastack cannot read is an error.
fn manifest_media_type(
    reference: &Reference,
    bytes: &[u8],
    header_type: Option<String>,
) -> Result<String, RegistryError> {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
    }
    // A manifest is a JSON object: anything else (a body cut short, an HTML page) is named
    // here, with the reference, rather than by a later parser without context.
    let body_type = serde_json::from_slice::<Typed>(bytes)
        .map_err(|e| RegistryError::Document {
            path: reference.to_string(),
            what: "a manifest",
            detail: e.to_string(),
        })?
        .media_type;
    let media_type = body_type
        .or(header_type)
        .unwrap_or_else(|| OCI_MANIFEST.to_string());
    if !MANIFEST_TYPES.contains(&media_type.as_str()) {
        return Err(RegistryError::UnsupportedMediaType {
            reference: reference.to_string(),
            media_type,
        });
    }
    Ok(media_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body cut short is an error naming the reference, not a bare parser message.
    #[test]
    fn a_manifest_that_is_not_json_names_its_reference() {
        let reference: Reference = "127.0.0.1:5000/team/img:1".parse().unwrap();
        let error = manifest_media_type(&reference, br#"{"schemaVe"#, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("team/img:1") && error.contains("manifest"),
            "{error}"
        );
        assert_eq!(
            manifest_media_type(&reference, b"{}", None).unwrap(),
            OCI_MANIFEST
        );
    }

    #[test]
    fn platforms_parse() {
        assert_eq!(
            Platform::from_str("linux/amd64").unwrap(),
            Platform::default()
        );
        let arm: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(arm.variant.as_deref(), Some("v8"));
        assert_eq!(arm.to_string(), "linux/arm64/v8");
        assert!(Platform::from_str("linux").is_err());
    }

    #[test]
    fn http_only_for_localhost_and_listed_hosts() {
        let client = |text: &str, insecure: &[&str]| {
            RegistryClient::new(
                &text.parse().unwrap(),
                ClientOptions {
                    insecure_registries: insecure.iter().map(|s| s.to_string()).collect(),
                    ..ClientOptions::default()
                },
            )
            .unwrap()
        };
        assert_eq!(
            client("127.0.0.1:5000/a", &[]).url("").as_str(),
            "http://127.0.0.1:5000/v2/"
        );
        assert_eq!(
            client("localhost/a", &[]).url("a/blobs/x").as_str(),
            "http://localhost/v2/a/blobs/x"
        );
        assert_eq!(client("reg.lan:5000/a", &[]).url("").scheme(), "https");
        // A host name that starts with `127.` is not this machine.
        assert_eq!(
            client("127.evil.example:5000/a", &[]).url("").as_str(),
            "https://127.evil.example:5000/v2/"
        );
        assert_eq!(
            client("[::1]:5000/a", &[]).url("").as_str(),
            "http://[::1]:5000/v2/"
        );
        assert_eq!(
            client("reg.lan:5000/a", &["reg.lan:5000"]).url("").scheme(),
            "http"
        );
        assert_eq!(
            client("ubuntu", &[]).url("").as_str(),
            "https://registry-1.docker.io/v2/"
        );
    }
}
