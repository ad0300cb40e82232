//! The content-addressed blob store shared by every stage that keeps bytes on disk.
//!
//! Layout under the cache root (default `~/.cache/cudastack`, or `$CUDASTACK_CACHE_DIR`):
//! ```text
//! blobs/sha256/<hex>   complete, verified blobs (downloads, compressed layers, configs)
//! tmp/                 in-progress writes; same filesystem so the final rename is atomic
//! ```
//! A blob appears under `blobs/` only after its bytes hashed to the name it gets, so a
//! reader never sees a corrupt or half-written entry (DESIGN.md, "Safe"). An interrupted
//! write leaves at most a file in `tmp/`, which is never read as a blob.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::digest::{Digest, HashingWriter};

#[derive(Debug, thiserror::Error)]
pub enum CasError {
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("content of {what} does not match its digest\n  Expected: {expected}\n  Found:    {found} ({size} bytes)")]
    Mismatch {
        what: String,
        expected: Digest,
        found: Digest,
        size: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CasError + '_ {
    move |source| CasError::Io {
        path: path.to_path_buf(),
        source,
    }
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

/// A content-addressed store of sha256 blobs.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    /// Open (creating if needed) the store under `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, CasError> {
        let root = root.into();
        for dir in [root.join("blobs").join("sha256"), root.join("tmp")] {
            fs_err::create_dir_all(&dir).map_err(|source| CasError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob with this digest lives (whether or not it exists yet).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs").join("sha256").join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    /// Directory for temporary files on the store's filesystem.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// A stable name in `tmp/` for a resumable download of the blob `expected`, so a rerun
    /// can continue where an interrupted one stopped. Never read as a blob until adopted.
    pub fn partial_path(&self, expected: &Digest) -> PathBuf {
        self.tmp_dir().join(format!("partial-{}", expected.hex()))
    }

    /// Move a fully written and hashed temp file (e.g. a finished partial download) into
    /// the store. `found` is the digest its bytes hashed to; unless it equals `expected`
    /// the file is deleted and a [`CasError::Mismatch`] naming `what` is returned.
    pub fn adopt(
        &self,
        temp_path: &Path,
        found: Digest,
        size: u64,
        expected: &Digest,
        what: &str,
    ) -> Result<PathBuf, CasError> {
        if found != *expected {
            let _ = fs_err::remove_file(temp_path);
            return Err(CasError::Mismatch {
                what: what.to_string(),
                expected: *expected,
                found,
                size,
            });
        }
        fs_err::File::open(temp_path)
            .and_then(|file| file.sync_all())
            .map_err(io_err(temp_path))?;
        let final_path = self.path(expected);
        fs_err::rename(temp_path, &final_path).map_err(io_err(&final_path))?;
        Ok(final_path)
    }

    /// Start writing a new blob; its digest is known only when it is committed.
    pub fn begin(&self) -> Result<PendingBlob, CasError> {
        let tmp_dir = self.tmp_dir();
        let file = crate::atomic_file::temp_in(&tmp_dir, "blob-").map_err(io_err(&tmp_dir))?;
        Ok(PendingBlob {
            store: self.clone(),
            writer: HashingWriter::new(io::BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// Store bytes held in memory (configs, manifests). Returns their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest, CasError> {
        let digest = Digest::of_bytes(bytes);
        if self.contains(&digest) {
            return Ok(digest);
        }
        let mut pending = self.begin()?;
        pending.write_all(bytes).map_err(io_err(&self.tmp_dir()))?;
        pending.commit(Some(&digest), "in-memory blob")?;
        Ok(digest)
    }
}

/// A blob being written: bytes go to a temp file and are hashed on the way.
/// Dropping it without [`PendingBlob::commit`] deletes the temp file.
pub struct PendingBlob {
    store: BlobStore,
    writer: HashingWriter<io::BufWriter<tempfile::NamedTempFile>>,
}

impl PendingBlob {
    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.writer.bytes_written()
    }

    /// Finish the blob. With `expected`, the content must hash to it or nothing is kept
    /// (the error names `what`, e.g. the URL it came from). Returns the digest and size.
    pub fn commit(self, expected: Option<&Digest>, what: &str) -> Result<(Digest, u64), CasError> {
        let tmp_dir = self.store.tmp_dir();
        let (buffered, digest, size) = self.writer.finish();
        let temp = buffered.into_inner().map_err(|e| CasError::Io {
            path: tmp_dir.clone(),
            source: e.into_error(),
        })?;
        if let Some(expected) = expected {
            if *expected != digest {
                // `temp` is dropped here, which removes the partial file.
                return Err(CasError::Mismatch {
                    what: what.to_string(),
                    expected: *expected,
                    found: digest,
                    size,
                });
            }
        }
        temp.as_file().sync_all().map_err(io_err(temp.path()))?;
        let final_path = self.store.path(&digest);
        temp.persist(&final_path).map_err(|e| CasError::Io {
            path: final_path.clone(),
            source: e.error,
        })?;
        Ok((digest, size))
    }
}

impl Write for PendingBlob {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writer.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_verifies_and_renames() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let mut pending = store.begin().unwrap();
        pending.write_all(b"layer bytes").unwrap();
        let (digest, size) = pending
            .commit(Some(&Digest::of_bytes(b"layer bytes")), "test")
            .unwrap();
        assert_eq!(size, 11);
        assert_eq!(fs_err::read(store.path(&digest)).unwrap(), b"layer bytes");
        assert_eq!(fs_err::read_dir(store.tmp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn mismatch_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let mut pending = store.begin().unwrap();
        pending.write_all(b"corrupt").unwrap();
        let expected = Digest::of_bytes(b"good");
        let err = pending
            .commit(Some(&expected), "https://example.invalid/x.whl")
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("Expected: sha256:"), "{message}");
        assert!(message.contains("x.whl"), "{message}");
        assert!(!store.contains(&expected));
        assert!(!store.contains(&Digest::of_bytes(b"corrupt")));
        assert_eq!(fs_err::read_dir(store.tmp_dir()).unwrap().count(), 0);
    }
}
