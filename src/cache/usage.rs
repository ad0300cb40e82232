//! What a cache directory holds, by kind, and pruning what no build used for a while
//! (`cudastack cache`, docs/cache.md). The cache keeps what makes a rebuild fast: the
//! locked downloads (blobs), the layer cache (index entries and their blobs) and the staged
//! trees that the audit and the upper layers read when a layer above them changes.
//!
//! Builds stamp what they use ([`super::touch_last_use`]): a blob's integrity record,
//! a layer entry, a tree's `.complete` marker. Pruning removes what is older than a cutoff
//! and that no build holds: a tree only under its `.use` and staging locks, a layer entry
//! under its lock, a blob only when no remaining layer entry names it and no download of it
//! is under way. Lock files stay (removing a lock another process waits on splits it).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::staging::{marker_path, try_lock_tree, MARKER, STAGING_LOCK, USE_LOCK};
use super::{io_err, try_lock, BlobStore, CacheError, Records};
use crate::digest::Digest;

/// The kinds of things a cache directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheKind {
    /// Blobs no layer entry names: the locked downloads (wheels, .debs), image configs.
    Downloads,
    /// Compressed layers named by layer cache entries: the images' bytes.
    LayerBlobs,
    /// Unpacked layer trees, read by the audit and the layers above when one changes.
    StagedTrees,
    /// Wheels compiled from the recipes' `build:` sdists (or fetched from a wheel cache),
    /// with their logs: `source-builds/<key>/`.
    BuiltWheels,
    /// Layer cache entries, integrity records, audit and scan records, wheel links, locks.
    Records,
    /// Verification results (`verify/`), so a verified image is not run again.
    VerifyResults,
    /// Partial downloads, writes in progress, trees of builds that died.
    Temporary,
}

impl CacheKind {
    pub fn describe(&self) -> &'static str {
        match self {
            CacheKind::Downloads => "downloads (wheels, .debs)",
            CacheKind::LayerBlobs => "layer blobs",
            CacheKind::StagedTrees => "staged trees",
            CacheKind::BuiltWheels => "source-built wheels",
            CacheKind::Records => "records",
            CacheKind::VerifyResults => "verify results",
            CacheKind::Temporary => "temporary",
        }
    }
}

/// How many of one kind, and the disk space they take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KindUsage {
    pub count: u64,
    /// Disk usage (allocated blocks); a file hard-linked twice counts once.
    pub bytes: u64,
}

/// What `cudastack cache` shows.
#[derive(Debug, Clone, Serialize)]
pub struct CacheUsage {
    pub root: PathBuf,
    pub kinds: BTreeMap<CacheKind, KindUsage>,
    pub total_bytes: u64,
}

/// What `cudastack cache prune` removed and kept.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    pub older_than_days: f64,
    pub removed: BTreeMap<CacheKind, KindUsage>,
    /// Old entries left because a build holds them now.
    pub kept_in_use: u64,
    /// A build was running: only staged trees were looked at (layer entries and blobs are
    /// pruned only while no build runs).
    pub builds_running: bool,
}

/// Disk usage of files and trees, each inode counted once.
#[derive(Default)]
struct DiskUsage {
    seen: HashSet<(u64, u64)>,
}

impl DiskUsage {
    /// Bytes of `path` (a file or a whole tree, symlinks not followed) not counted before.
    fn of(&mut self, path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return 0;
        };
        let mut bytes = 0;
        if self.seen.insert((meta.dev(), meta.ino())) {
            bytes += meta.blocks() * 512;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                bytes += self.of(&entry.path());
            }
        }
        bytes
    }
}

fn add(kinds: &mut BTreeMap<CacheKind, KindUsage>, kind: CacheKind, count: u64, bytes: u64) {
    let usage = kinds.entry(kind).or_default();
    usage.count += count;
    usage.bytes += bytes;
}

/// A staged tree's key (`<64 hex>`), from a name in `staging/`.
fn tree_hex(name: &str) -> Option<&str> {
    let hex = name.get(..64)?;
    (hex.bytes().all(|b| b.is_ascii_hexdigit()) && !hex.bytes().any(|b| b.is_ascii_uppercase()))
        .then_some(hex)
}

/// The staged trees under `staging/`: key hex -> complete (has its marker).
fn staged_trees(staging: &Path) -> Result<BTreeMap<String, bool>, CacheError> {
    let mut trees = BTreeMap::new();
    for entry in fs_err::read_dir(staging).map_err(io_err(staging))? {
        let name = entry.map_err(io_err(staging))?.file_name();
        let name = name.to_string_lossy();
        let Some(hex) = tree_hex(&name) else { continue };
        if name.len() == 64 || name.ends_with(MARKER) {
            *trees.entry(hex.to_string()).or_insert(false) |= name.ends_with(MARKER);
        }
    }
    Ok(trees)
}

/// What the cache directory at `root` holds, by kind.
pub fn cache_usage(root: &Path) -> Result<CacheUsage, CacheError> {
    let store = BlobStore::open(root)?;
    let layers = Records::layers(store.cache_dir());
    layers.create()?;
    let staging = store.cache_dir().staging();
    fs_err::create_dir_all(&staging).map_err(io_err(&staging))?;
    // Every kind, even when there is none of it.
    let mut kinds: BTreeMap<CacheKind, KindUsage> = [
        CacheKind::Downloads,
        CacheKind::LayerBlobs,
        CacheKind::StagedTrees,
        CacheKind::BuiltWheels,
        CacheKind::Records,
        CacheKind::VerifyResults,
        CacheKind::Temporary,
    ]
    .into_iter()
    .map(|kind| (kind, KindUsage::default()))
    .collect();
    let mut disk = DiskUsage::default();
    let entries = layers.entries()?;
    let layer_blobs: BTreeSet<Digest> = entries.iter().filter_map(|e| e.blob).collect();
    for (digest, path) in store.blobs()? {
        let kind = if layer_blobs.contains(&digest) {
            CacheKind::LayerBlobs
        } else {
            CacheKind::Downloads
        };
        add(&mut kinds, kind, 1, disk.of(&path));
    }
    for (hex, complete) in staged_trees(&staging)? {
        let kind = if complete {
            CacheKind::StagedTrees
        } else {
            CacheKind::Temporary
        };
        add(&mut kinds, kind, 1, disk.of(&staging.join(hex)));
    }
    add(
        &mut kinds,
        CacheKind::Temporary,
        0,
        disk.of(&store.tmp_dir()),
    );
    for built in built_wheels(&store.cache_dir().source_builds())? {
        let kind = if built.complete {
            CacheKind::BuiltWheels
        } else {
            CacheKind::Temporary
        };
        add(&mut kinds, kind, 1, disk.of(&built.dir));
    }
    let verify = store.cache_dir().verify();
    let results = fs_err::read_dir(&verify).map(|d| d.count()).unwrap_or(0);
    add(
        &mut kinds,
        CacheKind::VerifyResults,
        results as u64,
        disk.of(&verify),
    );
    // Everything else is a record: index entries, integrity records, staging records
    // (markers, facts, audit verdicts, scratch of live builds), wheel links, locks.
    add(
        &mut kinds,
        CacheKind::Records,
        entries.len() as u64,
        disk.of(root),
    );
    let total_bytes = kinds.values().map(|k| k.bytes).sum();
    Ok(CacheUsage {
        root: root.to_path_buf(),
        kinds,
        total_bytes,
    })
}

/// Remove from the cache at `root` the staged trees, layer cache entries and blobs that no
/// build used in the last `older_than`, leaving whatever a running build holds.
pub fn prune(root: &Path, older_than: Duration) -> Result<PruneReport, CacheError> {
    let cutoff = SystemTime::now()
        .checked_sub(older_than)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let store = BlobStore::open(root)?;
    let layers = Records::layers(store.cache_dir());
    layers.create()?;
    let mut report = PruneReport {
        older_than_days: older_than.as_secs_f64() / 86_400.0,
        ..Default::default()
    };
    let mut disk = DiskUsage::default();
    prune_trees(&store.cache_dir().staging(), cutoff, &mut disk, &mut report)?;
    // Layer entries and blobs only while no build runs: a build looks them up long before
    // it reads them (see Staging). Trees have locks of their own.
    let builds = store.cache_dir().builds_lock();
    let Some(_no_build) = try_lock(&builds).map_err(io_err(&builds))? else {
        report.builds_running = true;
        return Ok(report);
    };
    // A build looks its wheels up long before the layers read them, as it does blobs.
    prune_built_wheels(
        &store.cache_dir().source_builds(),
        cutoff,
        &mut disk,
        &mut report,
    )?;
    // A transient layer's records go with its layer entry's kind of age: only while no
    // build runs, since a build looks them up as it looks up layer entries.
    let staging = store.cache_dir().staging();
    let trees = staged_trees(&staging)?;
    prune_recorded_layers(&staging, &trees, cutoff, &mut disk, &mut report)?;
    let entries = layers.entries()?;
    let layer_blobs: BTreeSet<Digest> = entries.iter().filter_map(|e| e.blob).collect();
    for entry in entries {
        if entry.last_use >= cutoff {
            continue;
        }
        if layers.remove_if_unused_since(&entry, cutoff)? {
            add(&mut report.removed, CacheKind::Records, 1, entry.size);
        } else {
            report.kept_in_use += 1;
        }
    }
    // A blob stays while any remaining entry names it (layers shared by several images).
    let named: BTreeSet<Digest> = layers.entries()?.iter().filter_map(|e| e.blob).collect();
    for (digest, path) in store.blobs()? {
        if named.contains(&digest) || store.last_use(&digest).is_none_or(|u| u >= cutoff) {
            continue;
        }
        let bytes = disk.of(&path);
        if store.remove_if_unused_since(&digest, cutoff)?.is_some() {
            let kind = if layer_blobs.contains(&digest) {
                CacheKind::LayerBlobs
            } else {
                CacheKind::Downloads
            };
            add(&mut report.removed, kind, 1, bytes);
            // The wheel's named link (`wheels/<hex>/<file>`) would point at nothing.
            let _ = std::fs::remove_dir_all(store.cache_dir().wheels().join(digest.hex()));
        }
    }
    Ok(report)
}

/// Remove the staged trees unused since `cutoff` (and trees of builds that died), each
/// only while holding its `.use` and staging locks.
fn prune_trees(
    staging: &Path,
    cutoff: SystemTime,
    disk: &mut DiskUsage,
    report: &mut PruneReport,
) -> Result<(), CacheError> {
    if !staging.is_dir() {
        return Ok(());
    }
    for (hex, complete) in staged_trees(staging)? {
        let marker = marker_path(staging, &hex);
        let used = |marker: &Path| fs_err::metadata(marker).and_then(|m| m.modified()).ok();
        if complete && used(&marker).is_none_or(|u| u >= cutoff) {
            continue;
        }
        let Some(_locks) = try_lock_tree(staging, &hex)? else {
            report.kept_in_use += 1;
            continue;
        };
        // Looked at again under the locks: a build may have used it since.
        if complete && used(&marker).is_none_or(|u| u >= cutoff) {
            continue;
        }
        let tree = staging.join(&hex);
        let bytes = disk.of(&tree);
        // The marker first: a tree without it is never read as complete.
        remove_path(&marker)?;
        remove_path(&tree)?;
        remove_tree_records(staging, &hex)?;
        let kind = if complete {
            CacheKind::StagedTrees
        } else {
            CacheKind::Temporary
        };
        add(&mut report.removed, kind, 1, bytes);
    }
    Ok(())
}

/// An entry of `source-builds/`: a key's wheel (complete once its `complete` record is
/// there, whose mtime is its last use), or a builder root or a partial entry of a build
/// that died (never complete).
struct BuiltWheel {
    dir: PathBuf,
    /// The lock a build of the key, or the builder root's owner, holds.
    lock: PathBuf,
    complete: bool,
}

/// The entries of `source-builds/` (none when it does not exist).
fn built_wheels(dir: &Path) -> Result<Vec<BuiltWheel>, CacheError> {
    let mut found = Vec::new();
    let Ok(entries) = fs_err::read_dir(dir) else {
        return Ok(found);
    };
    for entry in entries {
        let path = entry.map_err(io_err(dir))?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !path.is_dir() {
            continue;
        }
        let key = tree_hex(&name).filter(|hex| hex.len() == name.len());
        let lock = path.with_extension("lock");
        if key.is_some() {
            let complete = path.join("complete").is_file();
            found.push(BuiltWheel {
                dir: path,
                lock,
                complete,
            });
        } else if name.starts_with("builder-") || name.starts_with(".partial-") {
            found.push(BuiltWheel {
                dir: path,
                lock,
                complete: false,
            });
        }
    }
    Ok(found)
}

/// Remove the built wheels unused since `cutoff`, and what builds that died left (builder
/// roots, partial entries), each only while no build holds its lock. The `complete`
/// record goes first: an entry without it is never reused.
fn prune_built_wheels(
    dir: &Path,
    cutoff: SystemTime,
    disk: &mut DiskUsage,
    report: &mut PruneReport,
) -> Result<(), CacheError> {
    let used = |path: &Path| fs_err::metadata(path).and_then(|m| m.modified()).ok();
    for built in built_wheels(dir)? {
        let record = built.dir.join("complete");
        if built.complete && used(&record).is_none_or(|u| u >= cutoff) {
            continue;
        }
        // A partial entry is held by no lock of its own: its build holds the key's, which
        // the builds lock this prune holds already rules out.
        let lock = if built.lock.exists() {
            match try_lock(&built.lock).map_err(io_err(&built.lock))? {
                Some(lock) => Some(lock),
                None => {
                    report.kept_in_use += 1;
                    continue;
                }
            }
        } else {
            None
        };
        let bytes = disk.of(&built.dir);
        remove_path(&record)?;
        remove_path(&built.dir)?;
        drop(lock);
        let kind = if built.complete {
            CacheKind::BuiltWheels
        } else {
            CacheKind::Temporary
        };
        add(&mut report.removed, kind, 1, bytes);
    }
    Ok(())
}

/// The layers whose tree was transient (removed once written, [`crate::stack`]'s wheel
/// layers), kept as records beside where the tree was: key hex -> the facts record, whose
/// mtime is the layer's last use.
fn recorded_layers(
    staging: &Path,
    trees: &BTreeMap<String, bool>,
) -> Result<BTreeMap<String, PathBuf>, CacheError> {
    let mut recorded = BTreeMap::new();
    for entry in fs_err::read_dir(staging).map_err(io_err(staging))? {
        let name = entry.map_err(io_err(staging))?.file_name();
        let name = name.to_string_lossy();
        let Some(hex) = tree_hex(&name) else { continue };
        if name[hex.len()..].starts_with(".layer-facts.") && !trees.contains_key(hex) {
            recorded.insert(hex.to_string(), staging.join(name.as_ref()));
        }
    }
    Ok(recorded)
}

/// Remove the records of transient layers unused since `cutoff` (their facts, placement,
/// members), each only while holding its `.use` and staging locks.
fn prune_recorded_layers(
    staging: &Path,
    trees: &BTreeMap<String, bool>,
    cutoff: SystemTime,
    disk: &mut DiskUsage,
    report: &mut PruneReport,
) -> Result<(), CacheError> {
    let used = |record: &Path| fs_err::metadata(record).and_then(|m| m.modified()).ok();
    for (hex, record) in recorded_layers(staging, trees)? {
        if used(&record).is_none_or(|u| u >= cutoff) {
            continue;
        }
        let Some(_locks) = try_lock_tree(staging, &hex)? else {
            report.kept_in_use += 1;
            continue;
        };
        if used(&record).is_none_or(|u| u >= cutoff) {
            continue;
        }
        let bytes = disk.of(&record);
        remove_tree_records(staging, &hex)?;
        add(&mut report.removed, CacheKind::Records, 1, bytes);
    }
    Ok(())
}

/// The records and scratch kept beside a tree (`<hex>.facts.json`, `<hex>.scratch`, ...),
/// all but its lock files.
fn remove_tree_records(staging: &Path, hex: &str) -> Result<(), CacheError> {
    let prefix = format!("{hex}.");
    for entry in fs_err::read_dir(staging).map_err(io_err(staging))? {
        let name = entry.map_err(io_err(staging))?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && !name.ends_with(STAGING_LOCK) && !name.ends_with(USE_LOCK) {
            remove_path(&staging.join(name.as_ref()))?;
        }
    }
    Ok(())
}

fn remove_path(path: &Path) -> Result<(), CacheError> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(error) => Err(error),
    };
    match removed {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(io_err(path)(error)),
        _ => Ok(()),
    }
}
