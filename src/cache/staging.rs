//! The staging area: one directory tree per layer cache key under `staging/`, filled once
//! under a lock and then only read, and the small records kept beside the trees (markers,
//! scan results, audit verdicts).
//!
//! This module decides how trees are kept, never what goes in them: the stack's stagers
//! fill them. Trees are named by the digest of their key (`layer::CacheKey` lends its
//! digest through `Borrow`), since the cache knows no key type of its own.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{hold_builds_lock, io_err, open_lock_file, CacheDir, CacheError};
use crate::digest::Digest;

/// A staged tree, kept per cache key so audits and later builds can reuse it.
///
/// Several builds may share one cache (CI runners, a user's parallel builds).
/// Each tree has a lock file (`<key-hex>.lock`, `flock(2)`): a build stages a tree only
/// while holding it, and the tree counts only once its `.complete` marker exists, which
/// is renamed into place after the tree and its records are whole. So a second build of
/// the same tree waits and then reuses it, builds of different trees run in parallel,
/// and a complete tree is never removed or rewritten. Scratch trees (the merged root for
/// `ldconfig` and the audit) are private to each build ([`Staging::scratch`]).
///
/// Every tree a build opens is also held, for as long as the build runs, by a shared lock
/// on `<key-hex>.use`: `cudastack cache prune` removes a tree only when it gets that lock
/// (and the tree's staging lock) exclusively, so it never removes a tree a build reads.
/// The `.complete` marker's mtime is the tree's last use.
///
/// A build also holds `<cache>/builds.lock` shared for as long as it runs: it looks up
/// cached layers and checks downloaded blobs long before it reads them, so prune removes
/// layer entries and blobs only while it holds that lock exclusively (no build running).
pub struct Staging {
    root: PathBuf,
    /// The `.use` locks of the trees this build opened, released when it is dropped.
    held: Mutex<HashMap<Digest, std::fs::File>>,
    /// The shared `builds.lock` (None where the cache is read-only: nothing prunes it then).
    _building: Option<std::fs::File>,
}

impl Staging {
    /// The staging area of the cache directory `cache_root`, held by this build (its
    /// `builds.lock`) until dropped.
    pub fn open(cache_root: &Path) -> Result<Self, CacheError> {
        let root = CacheDir::new(cache_root).staging();
        fs_err::create_dir_all(&root).map_err(io_err(&root))?;
        let building = hold_builds_lock(cache_root);
        Ok(Self {
            root,
            held: Mutex::new(HashMap::new()),
            _building: building,
        })
    }

    /// The tree of `key` (whether or not it is staged).
    pub fn dir(&self, key: &impl Borrow<Digest>) -> PathBuf {
        self.root.join(key.borrow().hex())
    }

    pub fn is_complete(&self, key: &impl Borrow<Digest>) -> bool {
        self.marker(key).exists()
    }

    /// The `.complete` marker, whose mtime is also the tree's last use
    /// (`cudastack cache prune` removes trees unused for a while).
    fn marker(&self, key: &impl Borrow<Digest>) -> PathBuf {
        marker_path(&self.root, &key.borrow().hex())
    }

    /// Record that this build uses the tree of `key` (its last use is now, and prune
    /// leaves it alone until the build ends), if the tree is complete.
    pub fn touch(&self, key: &impl Borrow<Digest>) {
        if self.is_complete(key) {
            self.hold(key.borrow());
            super::touch_last_use(&self.marker(key));
        }
    }

    /// Take the shared `.use` lock of `key`'s tree for the rest of this build (once).
    /// Waits only while `cudastack cache prune` is removing that tree. Best effort: where
    /// the lock file cannot be written (a read-only cache) no prune can remove the tree
    /// either.
    fn hold(&self, key: &Digest) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.contains_key(key) {
            return;
        }
        let path = use_lock_path(&self.root, &key.hex());
        let file = open_lock_file(&path).and_then(|file| file.lock_shared().map(|()| file));
        match file {
            Ok(file) => {
                held.insert(*key, file);
            }
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "could not hold a staged tree")
            }
        }
    }

    /// Stage into a fresh directory with `fill`, marking it complete only on success, so an
    /// interrupted build never leaves a half-staged tree that looks finished; under the
    /// tree's lock, so concurrent builds never stage the same tree at once.
    pub fn ensure<E: From<CacheError>>(
        &self,
        key: &impl Borrow<Digest>,
        fill: impl FnOnce(&Path) -> Result<(), E>,
    ) -> Result<PathBuf, E> {
        let dir = self.dir(key);
        // Held before it is looked at, so a prune cannot remove it between the two.
        self.hold(key.borrow());
        if self.is_complete(key) && dir.is_dir() {
            self.touch(key);
            return Ok(dir);
        }
        let lock_path = staging_lock_path(&self.root, &key.borrow().hex());
        let _lock = crate::atomic_file::lock(&lock_path).map_err(io_err(&lock_path))?;
        // Another build may have staged it while this one waited.
        if self.is_complete(key) && dir.is_dir() {
            self.touch(key);
            return Ok(dir);
        }
        // What is there is a partial tree of a build that died: start over.
        if fs_err::symlink_metadata(&dir).is_ok() {
            fs_err::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        fs_err::create_dir_all(&dir).map_err(io_err(&dir))?;
        if let Err(error) = fill(&dir) {
            let _ = fs_err::remove_dir_all(&dir);
            return Err(error);
        }
        let marker = self.marker(key);
        crate::atomic_file::write(&marker, b"").map_err(io_err(&marker))?;
        Ok(dir)
    }

    /// Remove the tree of `key`, keeping the records beside it, once nothing needs the
    /// tree itself (a wheel layer's, written and recorded). Only when no other build holds
    /// it (its `.use` lock, taken exclusively without waiting) and none is staging it; the
    /// marker goes first, so the tree never counts as complete while half removed, and a
    /// build that needs it again stages it anew. Returns whether it was removed.
    pub fn evict(&self, key: &impl Borrow<Digest>) -> Result<bool, CacheError> {
        let key = key.borrow();
        // This build's own shared hold first: flock would refuse the exclusive lock beside it.
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        let Some(_locks) = try_lock_tree(&self.root, &key.hex())? else {
            self.hold(key);
            return Ok(false);
        };
        let marker = self.marker(key);
        if marker.exists() {
            fs_err::remove_file(&marker).map_err(io_err(&marker))?;
        }
        let dir = self.dir(key);
        if fs_err::symlink_metadata(&dir).is_ok() {
            fs_err::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        Ok(true)
    }

    /// A record kept beside the trees (`arch-list-<sha256>.json`, `<digest>.audit.json`).
    pub fn record_path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A new empty directory for this build alone (named after `key`, removed when dropped),
    /// on the staging filesystem so trees can be hard-linked into it.
    pub fn scratch(
        &self,
        key: &impl Borrow<Digest>,
        what: &str,
    ) -> Result<tempfile::TempDir, CacheError> {
        tempfile::Builder::new()
            .prefix(&format!("{}.{what}-", key.borrow().hex()))
            .tempdir_in(&self.root)
            .map_err(io_err(&self.root))
    }
}

/// What follows a tree's `<hex>` in the names beside it: its marker (whose mtime is the
/// tree's last use), the lock it is staged under, the lock every build that uses it holds
/// shared.
pub(super) const MARKER: &str = ".complete";
pub(super) const STAGING_LOCK: &str = ".lock";
pub(super) const USE_LOCK: &str = ".use";

/// Both locks of the tree `hex` (its `.use` and staging locks), taken exclusively without
/// waiting: Some while no build uses or stages it, held until dropped.
pub(super) fn try_lock_tree(
    root: &Path,
    hex: &str,
) -> Result<Option<(std::fs::File, std::fs::File)>, CacheError> {
    let use_lock = use_lock_path(root, hex);
    let stage_lock = staging_lock_path(root, hex);
    let unused = super::try_lock(&use_lock).map_err(io_err(&use_lock))?;
    let not_staging = super::try_lock(&stage_lock).map_err(io_err(&stage_lock))?;
    Ok(unused.zip(not_staging))
}

pub(super) fn marker_path(root: &Path, hex: &str) -> PathBuf {
    root.join(format!("{hex}{MARKER}"))
}

pub(super) fn staging_lock_path(root: &Path, hex: &str) -> PathBuf {
    root.join(format!("{hex}{STAGING_LOCK}"))
}

pub(super) fn use_lock_path(root: &Path, hex: &str) -> PathBuf {
    root.join(format!("{hex}{USE_LOCK}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    fn write(path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
        let parent = path.parent().unwrap();
        fs_err::create_dir_all(parent).map_err(io_err(parent))?;
        fs_err::write(path, bytes).map_err(io_err(path))
    }

    /// A tree is evicted only when no other build holds it; its records stay, and the next
    /// build that needs the tree stages it again.
    #[test]
    fn a_tree_is_evicted_only_when_no_other_build_holds_it() {
        let cache = tempfile::tempdir().unwrap();
        let key = Digest::of_bytes(b"a wheel layer");
        let (this, other) = (
            Staging::open(cache.path()).unwrap(),
            Staging::open(cache.path()).unwrap(),
        );
        let fill = |dir: &Path| write(&dir.join("lib/libx.so"), b"x");
        let dir = this.ensure(&key, fill).unwrap();
        let record = dir.with_extension("layer-facts.json");
        write(&record, b"{}").unwrap();
        other.ensure(&key, fill).unwrap();
        assert!(
            !this.evict(&key).unwrap(),
            "evicted while another build holds it"
        );
        assert!(this.is_complete(&key) && dir.is_dir());
        drop(other);
        assert!(this.evict(&key).unwrap());
        assert!(!this.is_complete(&key) && !dir.exists() && record.is_file());
        let again = this.ensure(&key, fill).unwrap();
        assert!(again.join("lib/libx.so").is_file());
    }

    /// Concurrent builds staging the same trees (and scratch dirs) in one cache: each tree
    /// is filled once, nobody sees a half-filled tree, and scratch dirs are private.
    #[test]
    fn concurrent_staging_fills_each_tree_once_and_never_shows_a_partial_one() {
        let cache = tempfile::tempdir().unwrap();
        let fills = Arc::new(AtomicUsize::new(0));
        const THREADS: usize = 6;
        let barrier = Arc::new(Barrier::new(THREADS));
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (fills, barrier, root) = (fills.clone(), barrier.clone(), cache.path());
                scope.spawn(move || {
                    let staging = Staging::open(root).unwrap();
                    // Two trees, three threads each.
                    let key = Digest::of_bytes(format!("tree {}", thread % 2).as_bytes());
                    barrier.wait();
                    let dir = staging
                        .ensure(&key, |dir| {
                            fills.fetch_add(1, Ordering::SeqCst);
                            for i in 0..200 {
                                write(&dir.join(format!("f/{i}")), b"x")?;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            write(&dir.join("last"), b"done")
                        })
                        .unwrap();
                    assert_eq!(fs_err::read(dir.join("last")).unwrap(), b"done");
                    assert_eq!(fs_err::read_dir(dir.join("f")).unwrap().count(), 200);
                    let scratch = staging.scratch(&key, "merged").unwrap();
                    // On the staging filesystem: a tree's files link into it.
                    fs_err::hard_link(dir.join("last"), scratch.path().join("last")).unwrap();
                    assert!(scratch.path().join("last").is_file());
                });
            }
        });
        assert_eq!(fills.load(Ordering::SeqCst), 2, "a tree was staged twice");
        let names: Vec<String> = fs_err::read_dir(cache.path().join("staging"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("merged") || n.contains(".tmp-"))
            .collect();
        assert!(names.is_empty(), "scratch left behind: {names:?}");
    }

    #[test]
    fn a_failed_fill_leaves_no_tree_and_the_next_build_restages() {
        let cache = tempfile::tempdir().unwrap();
        let staging = Staging::open(cache.path()).unwrap();
        let key = Digest::of_bytes(b"fail");
        let error = staging
            .ensure(&key, |dir| {
                write(&dir.join("half"), b"x")?;
                Err(io_err(Path::new("disk"))(std::io::Error::other(
                    "disk full",
                )))
            })
            .unwrap_err();
        assert!(matches!(error, CacheError::Io { .. }), "{error}");
        assert!(!staging.dir(&key).exists());
        assert!(!staging.is_complete(&key));
        let dir = staging
            .ensure(&key, |dir| write(&dir.join("whole"), b"y"))
            .unwrap();
        assert!(dir.join("whole").is_file() && !dir.join("half").exists());
        assert!(cache
            .path()
            .join("staging")
            .join(format!("{}.complete", key.hex()))
            .is_file());
    }
}
