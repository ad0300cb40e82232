//! Small records kept by key in one directory of the cache (`layers/`, `verify/`): one
//! `<key hex>.json` per key, written whole (a temp file in `tmp/`, renamed in) so a reader
//! that takes no lock sees a whole record or none, and a `<key hex>.lock` beside it for
//! writers that build what a record describes (two builds of one entry build it once).
//! A record's mtime is its last use where its owner stamps it ([`Records::touch`]).
//!
//! What a record means is its owner's: `layer::LayerCache` keeps layer descriptors here,
//! `verify::cache` verification results. One convention crosses the line, for prune: a
//! record that keeps a blob of the store alive names it as its top-level `digest` (a layer
//! descriptor does), and [`RecordEntry::blob`] reads it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{io_err, try_lock, CacheDir, CacheError};
use crate::digest::Digest;

/// The prefix of a record's temp file in `tmp/` (swept when a writer was killed).
pub(super) const TEMP_PREFIX: &str = "record-";

/// The records of one directory of the cache.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
    tmp: PathBuf,
}

/// One record as listed for `cudastack cache`.
#[derive(Debug, Clone)]
pub struct RecordEntry {
    pub path: PathBuf,
    /// Size of the record file itself.
    pub size: u64,
    /// Its mtime, the last use its owner stamped.
    pub last_use: SystemTime,
    /// The blob of the store the record keeps (its top-level `digest`), if it names one.
    pub blob: Option<Digest>,
}

/// What prune reads of a record: the blob it keeps, if any.
#[derive(serde::Deserialize)]
struct NamesBlob {
    digest: Digest,
}

impl Records {
    /// The layer cache's records (`layers/`).
    pub fn layers(cache: &CacheDir) -> Self {
        Self::in_dir(cache, cache.layers())
    }

    /// The verification cache's records (`verify/`).
    pub fn verify(cache: &CacheDir) -> Self {
        Self::in_dir(cache, cache.verify())
    }

    fn in_dir(cache: &CacheDir, dir: PathBuf) -> Self {
        Self {
            dir,
            tmp: cache.tmp(),
        }
    }

    /// Make the directory now, so a cache that cannot hold records fails at once.
    pub fn create(&self) -> Result<(), CacheError> {
        fs_err::create_dir_all(&self.dir).map_err(io_err(&self.dir))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the record of `key` is (whether or not it exists).
    pub fn path(&self, key: &Digest) -> PathBuf {
        self.dir.join(format!("{}.json", key.hex()))
    }

    fn lock_path(&self, key: &Digest) -> PathBuf {
        self.dir.join(format!("{}.lock", key.hex()))
    }

    /// The bytes of the record of `key`; None when there is none.
    pub fn read(&self, key: &Digest) -> Result<Option<Vec<u8>>, CacheError> {
        let path = self.path(key);
        match fs_err::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CacheError::Io { path, source }),
        }
    }

    /// Stamp the record of `key` as used now (`cudastack cache prune` reads it).
    pub fn touch(&self, key: &Digest) {
        super::touch_last_use(&self.path(key));
    }

    /// Write the record of `key` whole: a concurrent reader sees the old one or the new one.
    pub fn write(&self, key: &Digest, bytes: &[u8]) -> Result<(), CacheError> {
        for dir in [&self.dir, &self.tmp] {
            fs_err::create_dir_all(dir).map_err(io_err(dir))?;
        }
        let mut temp =
            crate::atomic_file::temp_in(&self.tmp, TEMP_PREFIX).map_err(io_err(&self.tmp))?;
        std::io::Write::write_all(&mut temp, bytes).map_err(io_err(temp.path()))?;
        let path = self.path(key);
        crate::atomic_file::persist(temp, &path).map_err(io_err(&path))
    }

    /// Take the lock of `key`'s entry, held until the returned file is dropped: whoever
    /// builds what the record will describe holds it, so a second build waits and reuses.
    pub fn lock(&self, key: &Digest) -> Result<std::fs::File, CacheError> {
        fs_err::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.lock_path(key);
        crate::atomic_file::lock(&path).map_err(io_err(&path))
    }

    /// Every record of the directory (none when it does not exist), sorted by path.
    pub fn entries(&self) -> Result<Vec<RecordEntry>, CacheError> {
        let dirents = match fs_err::read_dir(&self.dir) {
            Ok(dirents) => dirents,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(io_err(&self.dir)(source)),
        };
        let mut entries = Vec::new();
        for dirent in dirents {
            let path = dirent.map_err(io_err(&self.dir))?.path();
            if path.extension().is_none_or(|ext| ext != "json") {
                continue;
            }
            let Ok(meta) = fs_err::metadata(&path) else {
                continue; // removed by a concurrent prune
            };
            let blob = fs_err::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<NamesBlob>(&bytes).ok())
                .map(|named| named.digest);
            entries.push(RecordEntry {
                last_use: meta.modified().map_err(io_err(&path))?,
                size: meta.len(),
                path,
                blob,
            });
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// Remove `entry` if nothing used it since `cutoff` and no one holds its lock now.
    /// Returns whether it was removed; the blob it names is the store's to prune.
    pub fn remove_if_unused_since(
        &self,
        entry: &RecordEntry,
        cutoff: SystemTime,
    ) -> Result<bool, CacheError> {
        let lock_path = entry.path.with_extension("lock");
        let Some(_lock) = try_lock(&lock_path).map_err(io_err(&lock_path))? else {
            return Ok(false);
        };
        // Looked at again under the lock: a build may have used it since it was listed.
        let used = fs_err::metadata(&entry.path).and_then(|m| m.modified());
        if used.is_ok_and(|used| used >= cutoff) {
            return Ok(false);
        }
        match fs_err::remove_file(&entry.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(io_err(&entry.path)(source)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_written_whole_under_its_key_and_names_the_blob_it_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path());
        let records = Records::layers(&cache);
        let key = Digest::of_bytes(b"inputs");
        assert_eq!(records.read(&key).unwrap(), None);
        assert!(records.entries().unwrap().is_empty());
        let blob = Digest::of_bytes(b"layer");
        let text = format!("{{\"digest\":\"{blob}\",\"size\":5}}");
        records.write(&key, text.as_bytes()).unwrap();
        assert_eq!(
            records.path(&key),
            dir.path()
                .join("layers")
                .join(format!("{}.json", key.hex()))
        );
        assert_eq!(records.read(&key).unwrap().unwrap(), text.as_bytes());
        let entries = records.entries().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].blob, Some(blob));
        assert_eq!(fs_err::read_dir(cache.tmp()).unwrap().count(), 0);
        // A record that names no blob keeps none.
        records.write(&blob, b"{\"key\":{}}").unwrap();
        assert_eq!(
            records
                .entries()
                .unwrap()
                .iter()
                .filter(|e| e.blob.is_none())
                .count(),
            1
        );
    }

    #[test]
    fn a_locked_record_is_not_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::verify(&CacheDir::new(dir.path()));
        let key = Digest::of_bytes(b"key");
        records.write(&key, b"{}").unwrap();
        let entry = records.entries().unwrap().remove(0);
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let held = records.lock(&key).unwrap();
        assert!(!records.remove_if_unused_since(&entry, later).unwrap());
        drop(held);
        assert!(records.remove_if_unused_since(&entry, later).unwrap());
        assert_eq!(records.read(&key).unwrap(), None);
    }
}
