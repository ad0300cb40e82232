//! Where an image to inspect, check or verify lives: an OCI layout on disk
//! (`images/NAME`, `oci:DIR[:REF]`) or a registry (`host/repo:tag`, `host/repo@sha256:..`).
//! Only documents are read (manifest and config): never a layer.

use std::path::{Path, PathBuf};

use oci_spec::image::ImageConfiguration;
use serde::Serialize;

use crate::digest::Digest;
use crate::oci::layout;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error("`{0}` is neither an OCI layout directory (no index.json there), a registry reference (host/repository[:tag|@digest]) nor an image of the local Docker daemon (docker-daemon:NAME[:TAG])")]
    Unrecognised(String),
    #[error(transparent)]
    Registry(Box<dyn std::error::Error + Send + Sync>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageLocation {
    Layout {
        dir: PathBuf,
        ref_name: String,
    },
    Registry(String),
    /// `docker-daemon:NAME[:TAG]` (skopeo's name for it): an image of the local Docker
    /// daemon.
    Daemon(String),
}

/// The prefix that names an image of the local Docker daemon.
pub const DAEMON_PREFIX: &str = "docker-daemon:";

impl std::fmt::Display for ImageLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageLocation::Layout { dir, ref_name } => {
                write!(f, "oci:{}:{ref_name}", dir.display())
            }
            ImageLocation::Registry(reference) => write!(f, "{reference}"),
            ImageLocation::Daemon(reference) => write!(f, "{DAEMON_PREFIX}{reference}"),
        }
    }
}

impl ImageLocation {
    /// `images/NAME` (a layout dir, ref `ref_name` or `latest`), `oci:DIR[:REF]`,
    /// `docker-daemon:NAME[:TAG]`, or a registry reference.
    pub fn parse(text: &str, ref_name: Option<&str>) -> Result<Self, SourceError> {
        let default_ref = ref_name.unwrap_or("latest").to_string();
        if let Some(reference) = text.strip_prefix(DAEMON_PREFIX) {
            if reference.is_empty() {
                return Err(SourceError::Unrecognised(text.to_string()));
            }
            return Ok(ImageLocation::Daemon(reference.to_string()));
        }
        if let Some(rest) = text.strip_prefix("oci:") {
            let (dir, reference) = match rest.split_once(':') {
                Some((dir, reference)) => (dir, reference.to_string()),
                None => (rest, default_ref),
            };
            return Ok(ImageLocation::Layout {
                dir: PathBuf::from(dir),
                ref_name: reference,
            });
        }
        if Path::new(text).join("index.json").is_file() {
            return Ok(ImageLocation::Layout {
                dir: PathBuf::from(text),
                ref_name: default_ref,
            });
        }
        let looks_remote =
            text.contains('/') && !text.starts_with(['.', '/']) && !Path::new(text).exists();
        if looks_remote {
            return Ok(ImageLocation::Registry(text.to_string()));
        }
        Err(SourceError::Unrecognised(text.to_string()))
    }
}

/// An image's documents.
#[derive(Debug, Clone, Serialize)]
pub struct ImageDocuments {
    pub location: String,
    /// None for an image of a Docker daemon that keeps no manifest for it (a loaded image
    /// in the classic store).
    pub manifest_digest: Option<Digest>,
    /// None for an image of a Docker daemon with the containerd image store, whose image
    /// ID is its manifest's (or index's) digest, not its config's.
    pub config_digest: Option<Digest>,
    #[serde(skip)]
    pub config: ImageConfiguration,
    /// Bytes fetched to answer (registry) or read (layout): manifest + config only.
    pub bytes_read: u64,
}

/// Read the manifest and config of a layout image.
pub fn read_layout(
    dir: &Path,
    ref_name: &str,
    architecture: Option<&oci_spec::image::Arch>,
) -> Result<ImageDocuments, SourceError> {
    let resolved = layout::resolve_platform(dir, ref_name, architecture)?;
    let size = |digest: &Digest| {
        std::fs::metadata(layout::blob_path(dir, digest))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    Ok(ImageDocuments {
        location: format!("oci:{}:{ref_name}", dir.display()),
        bytes_read: size(&resolved.manifest_digest) + size(&resolved.config_digest),
        manifest_digest: Some(resolved.manifest_digest),
        config_digest: Some(resolved.config_digest),
        config: resolved.config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(
            ImageLocation::parse("oci:images/x:v1", None).unwrap(),
            ImageLocation::Layout {
                dir: "images/x".into(),
                ref_name: "v1".into()
            }
        );
        assert_eq!(
            ImageLocation::parse("127.0.0.1:5000/cudastack/torch:2.4.1", None).unwrap(),
            ImageLocation::Registry("127.0.0.1:5000/cudastack/torch:2.4.1".into())
        );
        assert!(ImageLocation::parse("nothing-here", None).is_err());
        assert_eq!(
            ImageLocation::parse("docker-daemon:acme-train:latest", None).unwrap(),
            ImageLocation::Daemon("acme-train:latest".into())
        );
        assert!(ImageLocation::parse("docker-daemon:", None).is_err());
    }
}
