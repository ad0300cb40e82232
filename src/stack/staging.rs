//! The staging area of the layer cache: one directory tree per layer cache key under
//! `<cache>/staging`, filled once under a lock and then only read, plus the small records
//! kept beside the trees (markers, scan results, audit verdicts) and the filesystem helpers
//! the stagers share (writing a file, overlaying trees, running a command).
//!
//! This module decides how trees are kept, never what goes in them: the stagers in
//! [`super::layers`] fill them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::layer::CacheKey;
use crate::stack::error::{io_error, BuildError};

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
pub(crate) struct Staging {
    root: PathBuf,
    /// The `.use` locks of the trees this build opened, released when it is dropped.
    held: Mutex<HashMap<CacheKey, std::fs::File>>,
    /// The shared `builds.lock` (None where the cache is read-only: nothing prunes it then).
    _building: Option<std::fs::File>,
}

/// Take `builds.lock` shared, for as long as the returned file lives: what a build (or
/// the uploads it started) looked up in the cache stays there. None where the cache is
/// read-only (nothing prunes it then).
pub(crate) fn hold_builds_lock(cache_root: &Path) -> Option<std::fs::File> {
    open_lock_file(&builds_lock_path(cache_root))
        .and_then(|file| file.lock_shared().map(|()| file))
        .inspect_err(|error| tracing::debug!(%error, "could not take the builds lock"))
        .ok()
}

/// The cache-wide lock every build holds shared (see [`Staging`]).
pub(crate) fn builds_lock_path(cache_root: &Path) -> PathBuf {
    crate::cache::CacheDir::new(cache_root).builds_lock()
}

impl Staging {
    pub(crate) fn open(cache_root: &Path) -> Result<Self, BuildError> {
        let root = crate::cache::CacheDir::new(cache_root).staging();
        fs_err::create_dir_all(&root).map_err(io_error(&root))?;
        let building = hold_builds_lock(cache_root);
        Ok(Self {
            root,
            held: Mutex::new(HashMap::new()),
            _building: building,
        })
    }
    pub(crate) fn dir(&self, key: &CacheKey) -> PathBuf {
        self.root.join(key.digest().hex())
    }
    pub(crate) fn is_complete(&self, key: &CacheKey) -> bool {
        self.marker(key).exists()
    }
    /// The `.complete` marker, whose mtime is also the tree's last use
    /// (`cudastack cache prune` removes trees unused for a while).
    fn marker(&self, key: &CacheKey) -> PathBuf {
        self.root.join(format!("{}.complete", key.digest().hex()))
    }
    /// Record that this build uses the tree of `key` (its last use is now, and prune
    /// leaves it alone until the build ends), if the tree is complete.
    pub(crate) fn touch(&self, key: &CacheKey) {
        if self.is_complete(key) {
            self.hold(key);
            crate::cache::touch_last_use(&self.marker(key));
        }
    }
    /// Take the shared `.use` lock of `key`'s tree for the rest of this build (once).
    /// Waits only while `cudastack cache prune` is removing that tree. Best effort: where
    /// the lock file cannot be written (a read-only cache) no prune can remove the tree
    /// either.
    fn hold(&self, key: &CacheKey) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.contains_key(key) {
            return;
        }
        let path = use_lock_path(&self.root, &key.digest().hex());
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
    pub(crate) fn ensure(
        &self,
        key: &CacheKey,
        fill: impl FnOnce(&Path) -> Result<(), BuildError>,
    ) -> Result<PathBuf, BuildError> {
        let dir = self.dir(key);
        // Held before it is looked at, so a prune cannot remove it between the two.
        self.hold(key);
        if self.is_complete(key) && dir.is_dir() {
            self.touch(key);
            return Ok(dir);
        }
        let lock_path = self.root.join(format!("{}.lock", key.digest().hex()));
        let _lock = crate::atomic_file::lock(&lock_path).map_err(io_error(&lock_path))?;
        // Another build may have staged it while this one waited.
        if self.is_complete(key) && dir.is_dir() {
            self.touch(key);
            return Ok(dir);
        }
        // What is there is a partial tree of a build that died: start over.
        if fs_err::symlink_metadata(&dir).is_ok() {
            fs_err::remove_dir_all(&dir).map_err(io_error(&dir))?;
        }
        fs_err::create_dir_all(&dir).map_err(io_error(&dir))?;
        if let Err(error) = fill(&dir) {
            let _ = fs_err::remove_dir_all(&dir);
            return Err(error);
        }
        write_record(&self.marker(key), b"")?;
        Ok(dir)
    }
    /// A record kept beside the trees (`arch-list-<sha256>.json`, `<digest>.audit.json`).
    pub(crate) fn record_path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    /// A new empty directory for this build alone (named after `key`, removed when dropped),
    /// on the staging filesystem so trees can be hard-linked into it.
    pub(crate) fn scratch(
        &self,
        key: &CacheKey,
        what: &str,
    ) -> Result<tempfile::TempDir, BuildError> {
        tempfile::Builder::new()
            .prefix(&format!("{}.{what}-", key.digest().hex()))
            .tempdir_in(&self.root)
            .map_err(io_error(&self.root))
    }
}

fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// The lock a build holds shared on every tree it uses (`<hex>.use`).
pub(crate) fn use_lock_path(root: &Path, hex: &str) -> PathBuf {
    root.join(format!("{hex}.use"))
}

/// Write a small record of the cache (a marker, a scan result, audit facts) whole or not
/// at all, so a concurrent build never reads half of one.
pub(crate) fn write_record(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    crate::atomic_file::write(path, bytes).map_err(io_error(path))
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    if let Some(parent) = path.parent() {
        fs_err::create_dir_all(parent).map_err(io_error(parent))?;
    }
    fs_err::write(path, bytes).map_err(io_error(path))
}

/// Overlay staged layer trees into `merged` as hard links (no bytes copied), later trees
/// winning, the way the container runtime will stack the layers.
pub(crate) fn merge_trees(trees: &[&Path], merged: &Path) -> Result<(), BuildError> {
    if merged.exists() {
        fs_err::remove_dir_all(merged).map_err(io_error(merged))?;
    }
    fs_err::create_dir_all(merged).map_err(io_error(merged))?;
    for tree in trees {
        run(Command::new("cp")
            .arg("-a")
            .arg("-l")
            .arg("--remove-destination")
            .arg(format!("{}/.", tree.display()))
            .arg(merged))?;
    }
    Ok(())
}

pub(crate) fn run(command: &mut Command) -> Result<(), BuildError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|source| BuildError::Io {
        path: PathBuf::from(&shown),
        source,
    })?;
    if !output.status.success() {
        return Err(BuildError::Command {
            command: shown,
            status: output.status.to_string(),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

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
                    let key = CacheKey::new("staging-test", &[], &(thread % 2));
                    barrier.wait();
                    let dir = staging
                        .ensure(&key, |dir| {
                            fills.fetch_add(1, Ordering::SeqCst);
                            for i in 0..200 {
                                write_file(&dir.join(format!("f/{i}")), b"x")?;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            write_file(&dir.join("last"), b"done")
                        })
                        .unwrap();
                    assert_eq!(fs_err::read(dir.join("last")).unwrap(), b"done");
                    assert_eq!(fs_err::read_dir(dir.join("f")).unwrap().count(), 200);
                    let scratch = staging.scratch(&key, "merged").unwrap();
                    merge_trees(&[&dir], scratch.path()).unwrap();
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
        let key = CacheKey::new("staging-test", &[], &"fail");
        let error = staging
            .ensure(&key, |dir| {
                write_file(&dir.join("half"), b"x")?;
                Err(BuildError::Unsupported("disk full".into()))
            })
            .unwrap_err();
        assert!(error.to_string().contains("disk full"));
        assert!(!staging.dir(&key).exists());
        assert!(!staging.is_complete(&key));
        let dir = staging
            .ensure(&key, |dir| write_file(&dir.join("whole"), b"y"))
            .unwrap();
        assert!(dir.join("whole").is_file() && !dir.join("half").exists());
    }
}
