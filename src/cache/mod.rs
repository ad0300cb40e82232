//! The cache directory (default `~/.cache/cudastack`, `$CUDASTACK_CACHE_DIR` or
//! `--cache-dir`): what makes a rebuild fast, kept whole or not at all, shared by concurrent
//! builds. This module owns its layout ([`CacheDir`]: every name below is spelled there and
//! nowhere else), the content-addressed [`BlobStore`], the keyed [`Records`], the
//! [`Staging`] area of unpacked layer trees, the builds lock, and what `cudastack cache`
//! lists and prunes ([`cache_usage`], [`prune`]).
//!
//! ```text
//! blobs/sha256/<hex>         complete, verified blobs: downloads, compressed layers, configs
//! verified/sha256/<hex>      a blob's integrity record; its mtime is the blob's last use
//! tmp/                       writes in progress, on the same filesystem so renames are atomic
//! locks/                     `flock(2)` files of resumable downloads
//! layers/<hex>.json, .lock   layer records (`layer::LayerCache`), keyed by a layer's inputs
//! verify/<hex>.json          verification results (`verify::cache`)
//! staging/<hex>              unpacked layer trees, with `.complete`, `.lock`, `.use` and the
//!                            stagers' records beside them
//! wheels/<hex>/<file>        links to wheel blobs under their file names (the installer reads
//!                            a wheel's tags from its name)
//! source-builds/<hex>/       wheels built from sdists, with their logs (`source_build`)
//! apt-verified/              .deb sets checked against their archive's signed index
//! matrix/                    the refreshed torch data (`cudastack matrix refresh`)
//! registry/                  the push history (mount sources)
//! builds.lock                held shared by every build, exclusively by prune
//! ```
//! Changing a name here orphans every user's cache: the names and the keys are the
//! on-disk contract.
//!
//! Where it sits: low, beside the vocabulary. fetch puts downloads in the blob store, and
//! layer, oci and registry read and write blobs, so a cache module that imported any of
//! them would close a cycle. It knows bytes, paths, locks and digests, never what a record
//! means: the layer cache (which builds layers) and the verification cache (whose key is a
//! host's GPUs and a probe) keep their typed records in their own modules, on top of
//! [`Records`]; one convention lets prune see which blobs a record keeps (a record's
//! top-level `digest`, see [`Records`]), which is less glue than a callback for each kind.
//! What it must not do: decide what goes into a cached thing, or name another module.

mod blobs;
mod records;
mod staging;
mod usage;

use std::io;
use std::path::{Path, PathBuf};

pub use blobs::{BlobStore, PendingBlob};
pub use records::{RecordEntry, Records};
pub use staging::Staging;
pub use usage::{cache_usage, prune, CacheKind, CacheUsage, KindUsage, PruneReport};

/// What can go wrong in the cache directory.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("content of {what} does not match its digest\n  Expected: {expected}\n  Found:    {found} ({size} bytes)")]
    Mismatch {
        what: String,
        expected: crate::digest::Digest,
        found: crate::digest::Digest,
        size: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The paths of a cache directory: the one place its names are spelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDir {
    root: PathBuf,
}

impl CacheDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `blobs/sha256`: the blob store's blobs, named by their hex digest.
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// `verified/sha256`: the blobs' integrity records.
    pub fn integrity_records(&self) -> PathBuf {
        self.root.join("verified").join("sha256")
    }

    /// `tmp`: temp files of writes in progress.
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// `locks`: the locks of resumable downloads.
    pub fn locks(&self) -> PathBuf {
        self.root.join("locks")
    }

    /// `layers`: the layer cache's records.
    pub fn layers(&self) -> PathBuf {
        self.root.join("layers")
    }

    /// `verify`: the verification cache's records.
    pub fn verify(&self) -> PathBuf {
        self.root.join("verify")
    }

    /// `staging`: staged layer trees and the records beside them.
    pub fn staging(&self) -> PathBuf {
        self.root.join("staging")
    }

    /// `wheels`: `<hex>/<file name>` links to wheel blobs.
    pub fn wheels(&self) -> PathBuf {
        self.root.join("wheels")
    }

    /// `source-builds`: wheels built from sdists, their logs, the builder roots.
    pub fn source_builds(&self) -> PathBuf {
        self.root.join("source-builds")
    }

    /// `apt-verified`: .deb sets already checked against a signed archive index.
    pub fn apt_verified(&self) -> PathBuf {
        self.root.join("apt-verified")
    }

    /// `matrix`: compatibility data refreshed from PyPI.
    pub fn matrix(&self) -> PathBuf {
        self.root.join("matrix")
    }

    /// `registry`: what pushes remember (the push history).
    pub fn registry(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// `builds.lock`: every build holds it shared, so prune (holding it exclusively)
    /// removes layer records and blobs only while no build runs.
    pub fn builds_lock(&self) -> PathBuf {
        self.root.join("builds.lock")
    }
}

/// The cache root a command uses: `given` (`--cache-dir`) or the default, made absolute so
/// links and records made under it do not depend on the working directory.
pub fn cache_root(given: Option<PathBuf>) -> PathBuf {
    let root = given.unwrap_or_else(default_cache_root);
    std::path::absolute(&root).unwrap_or(root)
}

/// The default cache root: `$CUDASTACK_CACHE_DIR`, else `$XDG_CACHE_HOME/cudastack`,
/// else `~/.cache/cudastack`.
pub fn default_cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CUDASTACK_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("cudastack");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache").join("cudastack")
}

/// Set `path`'s mtime to now: the last-use stamp of a cache entry (an integrity record, a
/// layer record, a staged tree's marker), which `cudastack cache prune` reads. Best
/// effort: a stamp that could not be written only makes the entry look older.
pub fn touch_last_use(path: &Path) {
    let touched = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| file.set_modified(std::time::SystemTime::now()));
    if let Err(error) = touched {
        tracing::debug!(path = %path.display(), %error, "could not stamp a cache entry's last use");
    }
}

/// Take the `flock(2)` of `path` if no one holds it: Some(lock) held until dropped, or None.
pub fn try_lock(path: &Path) -> io::Result<Option<std::fs::File>> {
    let file = open_lock_file(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(error)) => Err(error),
    }
}

fn open_lock_file(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// Take `builds.lock` shared, for as long as the returned file lives: what a build (or
/// the uploads it started) looked up in the cache stays there, since prune removes layer
/// records and blobs only while it holds that lock exclusively. None where the cache is
/// read-only (nothing prunes it then).
pub fn hold_builds_lock(cache_root: &Path) -> Option<std::fs::File> {
    open_lock_file(&CacheDir::new(cache_root).builds_lock())
        .and_then(|file| file.lock_shared().map(|()| file))
        .inspect_err(|error| tracing::debug!(%error, "could not take the builds lock"))
        .ok()
}
