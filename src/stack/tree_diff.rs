//! The tree of a layer that goes on top of another: every entry of `upper` that `lower`
//! lacks or has otherwise (type, content, link target, mode, owner), with the directories
//! above it. Stacking the result on `lower` gives `upper` exactly, so the `apt:` layer is
//! what installing the recipe's packages changed in the shared base.
//!
//! Entries of `lower` that `upper` lacks would need whiteouts; installing packages does not
//! remove base files, so they are returned for the caller to refuse.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::layer::{LayerPath, Recorded, RecordedOwners};
use crate::stack::error::{io_error, BuildError};

/// What [`diff_trees`] found.
pub(crate) struct TreeDiff {
    /// The owners of the entries written, when `upper`'s came from a record (rootless).
    pub owners: Option<RecordedOwners>,
    /// Entries of `lower` missing from `upper` (layer paths).
    pub removed: Vec<String>,
    /// Files of `upper` with several links, by (device, inode) -> the first copy written,
    /// so a hard-linked group stays one file in the layer.
    links: std::collections::HashMap<(u64, u64), PathBuf>,
}

/// The owners and modes of one tree: on disk, or from its record (a rootless tree).
pub(crate) struct Tree<'a> {
    pub root: &'a Path,
    pub owners: Option<&'a RecordedOwners>,
}

impl Tree<'_> {
    fn recorded(&self, rel: &str, meta: &std::fs::Metadata) -> Recorded {
        let on_disk = Recorded {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
        };
        let Some(owners) = self.owners else {
            return on_disk;
        };
        LayerPath::parse(rel)
            .ok()
            .and_then(|path| owners.get(&path).cloned())
            .unwrap_or(Recorded {
                uid: 0,
                gid: 0,
                mode: on_disk.mode,
            })
    }
}

/// Write into `out` (an empty directory) what `upper` has on top of `lower`.
pub(crate) fn diff_trees(upper: &Tree, lower: &Tree, out: &Path) -> Result<TreeDiff, BuildError> {
    let mut diff = TreeDiff {
        owners: upper.owners.map(|_| RecordedOwners::default()),
        removed: Vec::new(),
        links: std::collections::HashMap::new(),
    };
    walk(upper, Some(lower), out, "", &mut diff)?;
    find_removed(upper.root, lower.root, "", &mut diff.removed)?;
    Ok(diff)
}

/// The sorted names in `dir`.
fn names(dir: &Path) -> Result<Vec<std::ffi::OsString>, BuildError> {
    let mut names = Vec::new();
    for entry in fs_err::read_dir(dir).map_err(io_error(dir))? {
        names.push(entry.map_err(io_error(dir))?.file_name());
    }
    names.sort();
    Ok(names)
}

fn join(rel: &str, name: &std::ffi::OsStr) -> String {
    let name = name.to_string_lossy();
    if rel.is_empty() {
        name.into_owned()
    } else {
        format!("{rel}/{name}")
    }
}

/// Copy what differs under `rel`. `lower` is None below a directory `lower` does not
/// have as a real directory (absent, a file, or a symlink that must not be followed):
/// everything there is new.
fn walk(
    upper: &Tree,
    lower: Option<&Tree>,
    out: &Path,
    rel: &str,
    diff: &mut TreeDiff,
) -> Result<(), BuildError> {
    let dir = upper.root.join(rel);
    for name in names(&dir)? {
        let child = join(rel, &name);
        let path = upper.root.join(&child);
        let meta = fs_err::symlink_metadata(&path).map_err(io_error(&path))?;
        let changed = match lower {
            Some(lower) => differs(upper, lower, &child, &meta)?,
            None => true,
        };
        if changed {
            copy_entry(upper, out, &child, &meta, diff)?;
        }
        if meta.is_dir() {
            let lower_dir = lower.filter(|lower| {
                fs_err::symlink_metadata(lower.root.join(&child)).is_ok_and(|m| m.is_dir())
            });
            walk(upper, lower_dir, out, &child, diff)?;
        }
    }
    Ok(())
}

/// Whether `rel` in `upper` is new or different from `lower`'s.
fn differs(
    upper: &Tree,
    lower: &Tree,
    rel: &str,
    meta: &std::fs::Metadata,
) -> Result<bool, BuildError> {
    let lower_path = lower.root.join(rel);
    let Ok(lower_meta) = fs_err::symlink_metadata(&lower_path) else {
        return Ok(true);
    };
    if meta.file_type() != lower_meta.file_type()
        || upper.recorded(rel, meta) != lower.recorded(rel, &lower_meta)
    {
        return Ok(true);
    }
    let upper_path = upper.root.join(rel);
    if meta.file_type().is_symlink() {
        let a = fs_err::read_link(&upper_path).map_err(io_error(&upper_path))?;
        let b = fs_err::read_link(&lower_path).map_err(io_error(&lower_path))?;
        return Ok(a != b);
    }
    if meta.is_file() {
        return Ok(meta.len() != lower_meta.len() || !same_bytes(&upper_path, &lower_path)?);
    }
    Ok(false)
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool, BuildError> {
    let mut fa = fs_err::File::open(a).map_err(io_error(a))?;
    let mut fb = fs_err::File::open(b).map_err(io_error(b))?;
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(io_error(a))?;
        let nb = read_full(&mut fb, &mut bb).map_err(io_error(b))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(file: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Copy `rel` of `upper` into `out`, with every directory above it as `upper` has it.
fn copy_entry(
    upper: &Tree,
    out: &Path,
    rel: &str,
    meta: &std::fs::Metadata,
    diff: &mut TreeDiff,
) -> Result<(), BuildError> {
    let mut ancestors: Vec<&str> = Vec::new();
    let mut at = rel;
    while let Some((parent, _)) = at.rsplit_once('/') {
        ancestors.push(parent);
        at = parent;
    }
    for parent in ancestors.into_iter().rev() {
        let target = out.join(parent);
        if fs_err::symlink_metadata(&target).is_err() {
            let source = upper.root.join(parent);
            let parent_meta = fs_err::symlink_metadata(&source).map_err(io_error(&source))?;
            fs_err::create_dir(&target).map_err(io_error(&target))?;
            finish(upper, &target, parent, &parent_meta, diff)?;
        }
    }
    let source = upper.root.join(rel);
    let target = out.join(rel);
    if meta.is_dir() {
        if fs_err::symlink_metadata(&target).is_err() {
            fs_err::create_dir(&target).map_err(io_error(&target))?;
        }
    } else if meta.file_type().is_symlink() {
        let link = fs_err::read_link(&source).map_err(io_error(&source))?;
        std::os::unix::fs::symlink(&link, &target).map_err(io_error(&target))?;
    } else if meta.is_file() {
        let inode = (meta.dev(), meta.ino());
        match diff.links.get(&inode).filter(|_| meta.nlink() > 1) {
            // Another name of a file already written: the same file, as in `upper`.
            Some(first) => fs_err::hard_link(first, &target).map_err(io_error(&target))?,
            None => {
                fs_err::copy(&source, &target).map_err(io_error(&target))?;
                if meta.nlink() > 1 {
                    diff.links.insert(inode, target.clone());
                }
            }
        }
    } else {
        // Device nodes and FIFOs have no place in a package layer (the base drops /dev's).
        return Ok(());
    }
    finish(upper, &target, rel, meta, diff)
}

/// Give a written entry `upper`'s mode and owner: on disk as root, in the record otherwise.
fn finish(
    upper: &Tree,
    target: &Path,
    rel: &str,
    meta: &std::fs::Metadata,
    diff: &mut TreeDiff,
) -> Result<(), BuildError> {
    let recorded = upper.recorded(rel, meta);
    match diff.owners.as_mut() {
        Some(owners) => {
            if let Ok(path) = LayerPath::parse(rel) {
                owners.insert(&path, recorded);
            }
            if !meta.file_type().is_symlink() {
                // Keep the copy readable and writable by this user; the record has the mode.
                let mode = meta.mode() & 0o7777 | 0o600 | if meta.is_dir() { 0o100 } else { 0 };
                fs_err::set_permissions(target, std::fs::Permissions::from_mode(mode))
                    .map_err(io_error(target))?;
            }
        }
        None => {
            std::os::unix::fs::lchown(target, Some(recorded.uid), Some(recorded.gid))
                .map_err(io_error(target))?;
            if !meta.file_type().is_symlink() {
                fs_err::set_permissions(target, std::fs::Permissions::from_mode(recorded.mode))
                    .map_err(io_error(target))?;
            }
        }
    }
    Ok(())
}

/// Entries of `lower` that `upper` lacks.
fn find_removed(
    upper: &Path,
    lower: &Path,
    rel: &str,
    removed: &mut Vec<String>,
) -> Result<(), BuildError> {
    let dir = lower.join(rel);
    for name in names(&dir)? {
        let child = join(rel, &name);
        let upper_path: PathBuf = upper.join(&child);
        match fs_err::symlink_metadata(&upper_path) {
            Err(_) => removed.push(child),
            Ok(meta) => {
                let lower_path = lower.join(&child);
                let lower_dir = fs_err::symlink_metadata(&lower_path)
                    .map(|m| m.is_dir())
                    .unwrap_or(false);
                match (lower_dir, meta.is_dir()) {
                    (true, true) => find_removed(upper, lower, &child, removed)?,
                    // A directory replaced by a file or a symlink: its contents are gone.
                    (true, false) => removed.push(child),
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
