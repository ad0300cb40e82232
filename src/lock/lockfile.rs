//! The lock file: every artifact a recipe needs, pinned to URL + sha256 + size.
//!
//! Format: JSON, written canonically (fixed field order, artifacts sorted by kind, name and
//! version, edge lists sorted, two-space indentation, trailing newline) so the same
//! resolution always produces the same bytes and diffs stay readable. JSON rather than
//! TOML because every other machine-written file cudastack emits (OCI configs, manifests,
//! verification reports) is JSON, it needs no extra dependency, and `serde_json` without
//! `preserve_order` is deterministic.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::fetch::download::FetchItem;
use crate::lock::target::Target;

/// Bumped when the format changes incompatibly.
pub const LOCK_FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum LockfileError {
    #[error("I/O error on `{path}`")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not a valid cudastack lock file")]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("Lock entry `{name}` has an invalid URL `{url}`")]
    BadUrl {
        name: String,
        url: String,
        #[source]
        source: url::ParseError,
    },
    #[error("`{path}` is lock format {found}; this cudastack reads format {expected}: run `cudastack lock` again")]
    Format {
        path: std::path::PathBuf,
        found: u32,
        expected: u32,
    },
}

/// What an artifact is, which decides how it is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactKind {
    /// An NVIDIA redist `.tar.xz` (CUDA component or cuDNN).
    RedistArchive,
    /// A Python wheel.
    Wheel,
}

/// One pinned artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub kind: ArtifactKind,
    /// Normalised package name, or the redist component name (`cuda_cudart`, `cudnn`).
    pub name: String,
    pub version: String,
    pub filename: String,
    pub url: String,
    pub sha256: Digest,
    pub size: u64,
    /// The index base URL, mirror directory URL or manifest URL it was resolved from.
    pub source: String,
    /// Redist archives: `linux-x86_64`, plus the CUDA variant for cuDNN (`cuda12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Wheels: the requirements of this wheel that applied to the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Wheels: who required it (`<root>`, `torch`, `cuda-toolkit[cudart]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_by: Vec<String>,
}

impl Artifact {
    /// The download of this artifact: URL, expected sha256 and size.
    pub fn fetch_item(&self) -> Result<FetchItem, LockfileError> {
        Ok(FetchItem {
            name: format!("{} {}", self.name, self.version),
            url: self.url.parse().map_err(|source| LockfileError::BadUrl {
                name: self.name.clone(),
                url: self.url.clone(),
                source,
            })?,
            sha256: self.sha256,
            size: Some(self.size),
        })
    }
}

/// A complete lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lockfile {
    pub lock_format: u32,
    /// Digest of the recipe the lock was made from; see [`Lockfile::is_stale`].
    pub recipe_digest: Digest,
    pub target: Target,
    /// The root requirements, as given.
    pub requirements: Vec<String>,
    pub artifacts: Vec<Artifact>,
}

impl Lockfile {
    /// Put everything in canonical order (done by [`Lockfile::to_json`] too).
    pub fn canonicalize(&mut self) {
        for artifact in &mut self.artifacts {
            artifact.requires.sort();
            artifact.requires.dedup();
            artifact.required_by.sort();
            artifact.required_by.dedup();
        }
        self.artifacts.sort_by(|a, b| {
            (a.kind, &a.name, &a.version, &a.variant, &a.filename).cmp(&(
                b.kind,
                &b.name,
                &b.version,
                &b.variant,
                &b.filename,
            ))
        });
    }

    /// The canonical text of the lock.
    pub fn to_json(&self) -> String {
        let mut canonical = self.clone();
        canonical.canonicalize();
        let mut text =
            serde_json::to_string_pretty(&canonical).expect("lock values always serialise");
        text.push('\n');
        text
    }

    /// Whether the recipe changed since the lock was made.
    pub fn is_stale(&self, recipe_digest: &Digest) -> bool {
        &self.recipe_digest != recipe_digest
    }

    /// What the downloader needs to fetch every artifact of the lock, in lock order.
    pub fn fetch_items(&self) -> Result<Vec<FetchItem>, LockfileError> {
        self.artifacts.iter().map(Artifact::fetch_item).collect()
    }

    /// Find a wheel or redist archive by name.
    pub fn artifact(&self, name: &str) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.name == name)
    }

    pub fn read(path: &Path) -> Result<Self, LockfileError> {
        let text = fs_err::read_to_string(path).map_err(|source| LockfileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let lock: Lockfile =
            serde_json::from_str(&text).map_err(|source| LockfileError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        if lock.lock_format != LOCK_FORMAT_VERSION {
            return Err(LockfileError::Format {
                path: path.to_path_buf(),
                found: lock.lock_format,
                expected: LOCK_FORMAT_VERSION,
            });
        }
        Ok(lock)
    }

    /// Write atomically (temp file in the same directory, then rename).
    pub fn write(&self, path: &Path) -> Result<(), LockfileError> {
        let io_error = |source| LockfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        crate::atomic_file::write(path, self.to_json().as_bytes()).map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::target::Arch;

    fn sample() -> Lockfile {
        Lockfile {
            lock_format: LOCK_FORMAT_VERSION,
            recipe_digest: Digest::of_bytes(b"recipe"),
            target: Target::new(
                "3.11".parse().unwrap(),
                Arch::X86_64,
                "2.28".parse().unwrap(),
            )
            .unwrap(),
            requirements: vec!["torch==2.4.1".into()],
            artifacts: vec![
                Artifact {
                    kind: ArtifactKind::Wheel,
                    name: "torch".into(),
                    version: "2.4.1".into(),
                    filename: "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl".into(),
                    url: "https://files.example/torch.whl".into(),
                    sha256: Digest::of_bytes(b"torch"),
                    size: 10,
                    source: "https://pypi.org/simple/".into(),
                    platform: None,
                    variant: None,
                    requires: vec!["sympy".into(), "filelock".into()],
                    required_by: vec!["<root>".into()],
                },
                Artifact {
                    kind: ArtifactKind::RedistArchive,
                    name: "cudnn".into(),
                    version: "9.1.0.70".into(),
                    filename: "cudnn.tar.xz".into(),
                    url: "http://127.0.0.1/cudnn.tar.xz".into(),
                    sha256: Digest::of_bytes(b"cudnn"),
                    size: 5,
                    source: "http://127.0.0.1/redistrib_9.1.0.json".into(),
                    platform: Some("linux-x86_64".into()),
                    variant: Some("cuda12".into()),
                    requires: vec![],
                    required_by: vec![],
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.lock");
        let lock = sample();
        lock.write(&path).unwrap();
        let text = fs_err::read_to_string(&path).unwrap();
        let mut reversed = lock.clone();
        reversed.artifacts.reverse();
        assert_eq!(reversed.to_json(), text);
        let read = Lockfile::read(&path).unwrap();
        assert_eq!(read.to_json(), text);
        // Redist archives sort first; edges are sorted.
        assert_eq!(read.artifacts[0].name, "cudnn");
        assert_eq!(read.artifacts[1].requires, ["filelock", "sympy"]);
        assert!(text.contains("\"kind\": \"redist-archive\""));
    }

    #[test]
    fn staleness_follows_the_recipe_digest() {
        let lock = sample();
        assert!(!lock.is_stale(&Digest::of_bytes(b"recipe")));
        assert!(lock.is_stale(&Digest::of_bytes(b"recipe v2")));
    }

    #[test]
    fn rejects_other_formats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.lock");
        let mut lock = sample();
        lock.lock_format = 99;
        fs_err::write(&path, serde_json::to_string(&lock).unwrap()).unwrap();
        let error = Lockfile::read(&path).unwrap_err();
        assert!(error.to_string().contains("format 99"), "{error}");
    }
}
