//! The content-addressed blob store shared by every stage that keeps bytes on disk: the
//! `blobs/`, `verified/`, `tmp/` and `locks/` directories of the cache (the module's head
//! has the whole layout).
//!
//! A blob appears under `blobs/` only after its bytes hashed to the name it gets, so a
//! reader never sees a half-written entry (DESIGN.md, "Safe"). An interrupted write leaves
//! at most a file in `tmp/`, which is never read as a blob.
//!
//! A blob can still change after it was stored: a disk that fills, a tool that truncates
//! or edits a file of a layout that is a hard link to the blob. So the
//! store hands out a blob only through [`BlobStore::verified`] (and [`BlobStore::contains`],
//! which uses it), and the rule is: **a blob is used only while its integrity record
//! matches its `stat`; otherwise it is hashed again before use.** Any write, truncation or
//! replacement changes the size, the mtime or the inode, so the record no longer matches
//! and the bytes are hashed; a blob whose bytes do not hash to its name is removed with a
//! warning and reported missing, so the caller fetches or builds it again. The record costs
//! one `stat` and one small read per use (a no-op rebuild stays instant) instead of hashing
//! gigabytes at ~1.2 GB/s. What the record cannot see is a change that keeps size and mtime
//! (bit rot, or someone restoring the mtime on purpose; whoever can write the blob can
//! write its record too); `cudastack` never writes a blob in place, it renames new ones in.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{io_err, touch_last_use, try_lock, CacheDir, CacheError};
use crate::digest::{Digest, HashingWriter};

/// How long a temp file in `tmp/` may go unwritten before it counts as abandoned.
const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// The temp files of `tmp/` a killed writer can leave: blobs, records, and the layer
/// records of caches written before records had one store (`layer-index-`). Resumable
/// downloads (`partial-`) are not among them: resuming them is their point.
const STALE_TEMP_PREFIXES: [&str; 3] = ["blob-", super::records::TEMP_PREFIX, "layer-index-"];

/// A content-addressed store of sha256 blobs.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: CacheDir,
}

impl BlobStore {
    /// Open (creating if needed) the store of the cache directory `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let dir = CacheDir::new(root);
        for path in [dir.blobs(), dir.integrity_records(), dir.tmp(), dir.locks()] {
            fs_err::create_dir_all(&path).map_err(io_err(&path))?;
        }
        let store = Self { dir };
        store.sweep_stale_temp_files();
        Ok(store)
    }

    /// Remove temp files of writers that were killed (a `kill -9`, a lost CI runner): a
    /// live writer keeps its file's mtime fresh, so one untouched for a day is abandoned.
    /// Resumable downloads (`partial-*`) stay: resuming them is their point.
    fn sweep_stale_temp_files(&self) {
        let Ok(entries) = std::fs::read_dir(self.tmp_dir()) else {
            return;
        };
        let now = std::time::SystemTime::now();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !STALE_TEMP_PREFIXES.iter().any(|p| name.starts_with(p)) {
                continue;
            }
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age > STALE_TEMP_AGE);
            if stale {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The cache directory the store is part of.
    pub fn root(&self) -> &Path {
        self.dir.root()
    }

    pub fn cache_dir(&self) -> &CacheDir {
        &self.dir
    }

    /// Where the blob with this digest lives (whether or not it exists yet).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.blobs().join(digest.hex())
    }

    /// Whether the store holds the blob `digest` with bytes that hash to it (see
    /// [`BlobStore::verified`]; a corrupt entry is removed and counts as absent, an I/O
    /// error counts as absent, so the caller fetches or builds the blob again).
    pub fn contains(&self, digest: &Digest) -> bool {
        match self.verified(digest) {
            Ok(found) => found.is_some(),
            Err(error) => {
                tracing::warn!(%digest, error = %error, "cannot check a cached blob; fetching it again");
                false
            }
        }
    }

    /// The path of the blob `digest` if it is present and its bytes hash to its name:
    /// checked against the integrity record (one `stat`), and hashed again when the record
    /// is missing or no longer matches. A blob whose bytes are not what its name says is
    /// removed with a warning and `None` is returned, so callers repair the entry by
    /// fetching or rebuilding it.
    pub fn verified(&self, digest: &Digest) -> Result<Option<PathBuf>, CacheError> {
        let path = self.path(digest);
        let meta = match fs_err::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_err(&path)(source)),
        };
        if !meta.is_file() {
            tracing::warn!(path = %path.display(), "a cached blob is not a regular file; removing it");
            remove_any(&path).map_err(io_err(&path))?;
            return Ok(None);
        }
        if self.read_record(digest).as_ref() == Some(&Stamp::of(&meta)) {
            // The record's own mtime is the blob's last use (it describes the blob, not
            // itself), so `cudastack cache prune` keeps what builds still read.
            touch_last_use(&self.record_path(digest));
            return Ok(Some(path));
        }
        // No record, or the file changed since it was hashed: hash it (through one open
        // file, so the record describes exactly the bytes that were hashed).
        let mut file = match fs_err::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(io_err(&path)(source)),
        };
        let stamp = Stamp::of(&file.metadata().map_err(io_err(&path))?);
        let mut hashing = HashingWriter::new(io::sink());
        io::copy(&mut file, &mut hashing).map_err(io_err(&path))?;
        let (_, found, size) = hashing.finish();
        if found == *digest {
            self.write_record(digest, &stamp);
            return Ok(Some(path));
        }
        tracing::warn!(
            path = %path.display(),
            expected = %digest,
            found = %found,
            size,
            "a cached blob does not match its digest (truncated or modified on disk); removing it, it will be fetched or built again"
        );
        // Remove it only if it is still the file that was hashed (another process may have
        // just renamed a good copy into place).
        if fs_err::symlink_metadata(&path).is_ok_and(|now| Stamp::of(&now).same_file(&stamp)) {
            match fs_err::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(io_err(&path)(source)),
            }
        }
        let _ = std::fs::remove_file(self.record_path(digest));
        Ok(None)
    }

    /// The integrity record of `digest`; its mtime is the blob's last use.
    pub fn record_path(&self, digest: &Digest) -> PathBuf {
        self.dir.integrity_records().join(digest.hex())
    }

    fn read_record(&self, digest: &Digest) -> Option<Stamp> {
        let text = std::fs::read_to_string(self.record_path(digest)).ok()?;
        Stamp::parse(&text)
    }

    /// Record that the blob `digest`, as `stamp` describes it, hashed to its name. Best
    /// effort: without a record the next use hashes the blob again.
    fn write_record(&self, digest: &Digest, stamp: &Stamp) {
        let path = self.record_path(digest);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| crate::atomic_file::write(&path, stamp.to_string().as_bytes()));
        if let Err(error) = written {
            tracing::debug!(path = %path.display(), %error, "could not write an integrity record");
        }
    }

    /// Write the integrity record of a blob just renamed into place after hashing.
    fn record_new(&self, digest: &Digest) {
        if let Ok(meta) = std::fs::metadata(self.path(digest)) {
            self.write_record(digest, &Stamp::of(&meta));
        }
    }

    /// Directory for temporary files on the store's filesystem.
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.tmp()
    }

    /// A stable name in `tmp/` for a resumable download of the blob `expected`, so a rerun
    /// can continue where an interrupted one stopped. Never read as a blob until adopted.
    pub fn partial_path(&self, expected: &Digest) -> PathBuf {
        self.tmp_dir().join(format!("partial-{}", expected.hex()))
    }

    /// Take the lock of the resumable download of `expected` ([`BlobStore::partial_path`]),
    /// held until the returned file is dropped: two builds sharing the cache must never
    /// append to one partial file. After taking it, check [`BlobStore::verified`] again:
    /// the other build may have finished the blob.
    pub fn lock_partial(&self, expected: &Digest) -> Result<std::fs::File, CacheError> {
        let path = self.partial_lock_path(expected);
        crate::atomic_file::lock(&path).map_err(io_err(&path))
    }

    /// The lock of the resumable download of `digest`, kept in `locks/` (removing a lock
    /// file another process waits on would split the lock).
    fn partial_lock_path(&self, digest: &Digest) -> PathBuf {
        self.dir
            .locks()
            .join(format!("partial-{}.lock", digest.hex()))
    }

    /// Move a fully written and hashed temp file (e.g. a finished partial download) into
    /// the store. `found` is the digest its bytes hashed to; unless it equals `expected`
    /// the file is deleted and a [`CacheError::Mismatch`] naming `what` is returned.
    pub fn adopt(
        &self,
        temp_path: &Path,
        found: Digest,
        size: u64,
        expected: &Digest,
        what: &str,
    ) -> Result<PathBuf, CacheError> {
        if found != *expected {
            let _ = fs_err::remove_file(temp_path);
            return Err(CacheError::Mismatch {
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
        self.record_new(expected);
        Ok(final_path)
    }

    /// Start writing a new blob; its digest is known only when it is committed.
    pub fn begin(&self) -> Result<PendingBlob, CacheError> {
        let tmp_dir = self.tmp_dir();
        let file = crate::atomic_file::temp_in(&tmp_dir, "blob-").map_err(io_err(&tmp_dir))?;
        Ok(PendingBlob {
            store: self.clone(),
            writer: HashingWriter::new(io::BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// Store bytes held in memory (configs, manifests). Returns their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest, CacheError> {
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

/// Listing and pruning, for `cudastack cache`.
impl BlobStore {
    /// Every blob in the store: its digest and path (names that are not a digest, which
    /// cudastack never writes, are left out).
    pub fn blobs(&self) -> Result<Vec<(Digest, PathBuf)>, CacheError> {
        let dir = self.dir.blobs();
        let mut blobs = Vec::new();
        for entry in fs_err::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            if let Ok(digest) = Digest::from_hex(&entry.file_name().to_string_lossy()) {
                blobs.push((digest, entry.path()));
            }
        }
        blobs.sort();
        Ok(blobs)
    }

    /// When a build last used the blob: its integrity record's mtime (touched by
    /// [`BlobStore::verified`]), else the blob's own; None when it is gone.
    pub fn last_use(&self, digest: &Digest) -> Option<std::time::SystemTime> {
        [self.record_path(digest), self.path(digest)]
            .iter()
            .find_map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
    }

    /// Remove the blob `digest` if no build used it since `cutoff` and no download of it is
    /// under way (its lock is free). Returns the bytes freed, or None when it was kept.
    pub fn remove_if_unused_since(
        &self,
        digest: &Digest,
        cutoff: std::time::SystemTime,
    ) -> Result<Option<u64>, CacheError> {
        let lock_path = self.partial_lock_path(digest);
        let Some(_lock) = try_lock(&lock_path).map_err(io_err(&lock_path))? else {
            return Ok(None);
        };
        if self.last_use(digest).is_none_or(|used| used >= cutoff) {
            return Ok(None);
        }
        let path = self.path(digest);
        let size = fs_err::symlink_metadata(&path)
            .map_err(io_err(&path))?
            .len();
        remove_any(&path).map_err(io_err(&path))?;
        let _ = std::fs::remove_file(self.record_path(digest));
        Ok(Some(size))
    }
}

/// What an integrity record holds: enough of a blob's `stat` that any write, truncation or
/// replacement of the file changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }

    fn same_file(&self, other: &Stamp) -> bool {
        self.inode == other.inode && self.device == other.device
    }

    fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_whitespace();
        let mut next = |name: &str| {
            let field = fields.next()?;
            field
                .strip_prefix(name)?
                .strip_prefix('=')
                .map(str::to_string)
        };
        Some(Self {
            size: next("size")?.parse().ok()?,
            mtime_ns: next("mtime_ns")?.parse().ok()?,
            inode: next("inode")?.parse().ok()?,
            device: next("device")?.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "size={} mtime_ns={} inode={} device={}",
            self.size, self.mtime_ns, self.inode, self.device
        )
    }
}

fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(_) if path.is_dir() => std::fs::remove_dir_all(path),
        other => other,
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
    pub fn commit(
        self,
        expected: Option<&Digest>,
        what: &str,
    ) -> Result<(Digest, u64), CacheError> {
        let tmp_dir = self.store.tmp_dir();
        let (buffered, digest, size) = self.writer.finish();
        let temp = buffered.into_inner().map_err(|e| CacheError::Io {
            path: tmp_dir.clone(),
            source: e.into_error(),
        })?;
        if let Some(expected) = expected {
            if *expected != digest {
                // `temp` is dropped here, which removes the partial file.
                return Err(CacheError::Mismatch {
                    what: what.to_string(),
                    expected: *expected,
                    found: digest,
                    size,
                });
            }
        }
        temp.as_file().sync_all().map_err(io_err(temp.path()))?;
        let final_path = self.store.path(&digest);
        temp.persist(&final_path).map_err(|e| CacheError::Io {
            path: final_path.clone(),
            source: e.error,
        })?;
        self.store.record_new(&digest);
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

    fn stored(store: &BlobStore, bytes: &[u8]) -> Digest {
        let mut pending = store.begin().unwrap();
        pending.write_all(bytes).unwrap();
        pending.commit(None, "test").unwrap().0
    }

    /// Coarse kernel timestamps tick every few milliseconds: wait one tick so a change
    /// made right after a write gets a new mtime, as any later corruption would.
    fn next_tick() {
        std::thread::sleep(std::time::Duration::from_millis(30));
    }

    #[test]
    fn a_truncated_blob_is_not_handed_out_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let digest = stored(&store, b"0123456789 layer bytes");
        assert!(store.contains(&digest));
        next_tick();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(store.path(&digest))
            .unwrap();
        file.set_len(5).unwrap();
        drop(file);
        assert!(
            !store.contains(&digest),
            "a truncated blob passed as cached"
        );
        assert!(
            !store.path(&digest).exists(),
            "the bad entry was not removed"
        );
        // Repaired by storing it again.
        assert_eq!(stored(&store, b"0123456789 layer bytes"), digest);
        assert_eq!(store.verified(&digest).unwrap(), Some(store.path(&digest)));
    }

    #[test]
    fn a_flipped_byte_of_the_same_size_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let digest = stored(&store, b"abcdefgh");
        next_tick();
        // In place, as an editor of a hard-linked layout file would.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(store.path(&digest))
            .unwrap();
        file.write_all(b"X").unwrap();
        drop(file);
        assert_eq!(store.verified(&digest).unwrap(), None);
        assert!(!store.path(&digest).exists());
    }

    #[test]
    fn a_blob_without_a_record_is_hashed_once_then_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let bytes = b"from an older cudastack";
        let digest = Digest::of_bytes(bytes);
        std::fs::write(store.path(&digest), bytes).unwrap();
        assert!(!store.record_path(&digest).exists());
        assert!(store.contains(&digest));
        let record = std::fs::read_to_string(store.record_path(&digest)).unwrap();
        assert!(record.starts_with("size=23 "), "{record}");
        // A blob placed under a wrong name is never handed out.
        let wrong = Digest::of_bytes(b"something else");
        std::fs::write(store.path(&wrong), bytes).unwrap();
        assert!(!store.contains(&wrong));
        assert!(!store.path(&wrong).exists());
    }

    #[test]
    fn a_corrupt_record_only_costs_a_rehash() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let digest = stored(&store, b"bytes");
        std::fs::write(store.record_path(&digest), b"size=\xff garbage").unwrap();
        assert!(store.contains(&digest));
        assert!(
            Stamp::parse(&std::fs::read_to_string(store.record_path(&digest)).unwrap()).is_some()
        );
    }

    #[test]
    fn temp_files_of_killed_writers_are_swept_live_ones_and_partials_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let old = std::time::SystemTime::now() - STALE_TEMP_AGE * 2;
        for name in [
            "blob-abandoned",
            "record-abandoned",
            "layer-index-abandoned",
            "partial-abc",
        ] {
            let file = std::fs::File::create(store.tmp_dir().join(name)).unwrap();
            file.set_modified(old).unwrap();
        }
        std::fs::write(store.tmp_dir().join("blob-live"), b"x").unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(store.tmp_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["blob-live", "partial-abc"]);
    }
}
