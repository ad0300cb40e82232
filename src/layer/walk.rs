//! Turning a directory tree on disk into layer entries.
//!
//! The walk never follows symlinks (a CUDA library chain stays a chain, not three copies:
//! CRATES.md pitfall 2), keeps hardlinks as links, reads directories in sorted order and
//! records only what the layer needs: path, kind, mode, and (optionally) owner. Times,
//! the discovering order and the umask of whoever created the tree do not leak into the
//! layer when [`ModePolicy::Normalized`] (the default) is used.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::entry::{Entry, EntryKind, FileSource, LayerContents, LayerPath};
use super::LayerError;

/// How file modes found on disk become layer modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModePolicy {
    /// Directories 0755, files 0755 if the owner may execute them else 0644, symlinks
    /// 0777; an entry with setuid, setgid or sticky bits keeps its mode exactly (so a
    /// `tmp` directory stays 1777). Independent of the umask the tree was created with.
    #[default]
    Normalized,
    /// The permission bits exactly as on disk.
    Exact,
}

/// Options for [`LayerContents::from_dir`].
#[derive(Debug, Clone, Default)]
pub struct DirOptions {
    pub modes: ModePolicy,
    /// Keep the numeric uid/gid found on disk instead of 0:0.
    pub keep_owners: bool,
    /// Place the tree under this path inside the layer (e.g. `usr/local/cuda-12.1`).
    pub prefix: Option<LayerPath>,
}

impl LayerContents {
    /// Walk `root` (not following symlinks) and build the layer's contents from it.
    /// The root directory itself is not an entry; its children are.
    pub fn from_dir(root: &Path, options: &DirOptions) -> Result<Self, LayerError> {
        let mut entries = Vec::new();
        let mut inodes: HashMap<(u64, u64), LayerPath> = HashMap::new();
        walk(
            root,
            options.prefix.as_ref(),
            options,
            &mut entries,
            &mut inodes,
        )?;
        LayerContents::from_entries(entries)
    }
}

fn walk(
    dir: &Path,
    prefix: Option<&LayerPath>,
    options: &DirOptions,
    entries: &mut Vec<Entry>,
    inodes: &mut HashMap<(u64, u64), LayerPath>,
) -> Result<(), LayerError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LayerError::Io { path, source }
    };
    let mut children: Vec<(String, PathBuf)> = Vec::new();
    for child in fs_err::read_dir(dir).map_err(io(dir))? {
        let child = child.map_err(io(dir))?;
        let name = child
            .file_name()
            .into_string()
            .map_err(|name| LayerError::NonUtf8Path {
                path: dir.join(name),
            })?;
        children.push((name, child.path()));
    }
    children.sort();
    for (name, disk_path) in children {
        let path = match prefix {
            Some(prefix) => prefix.join(&name)?,
            None => LayerPath::parse(&name)?,
        };
        let meta = fs_err::symlink_metadata(&disk_path).map_err(io(&disk_path))?;
        let file_type = meta.file_type();
        let disk_mode = meta.permissions().mode() & 0o7777;
        let mode = |kind: &EntryKind| match options.modes {
            ModePolicy::Exact => disk_mode,
            ModePolicy::Normalized if disk_mode & 0o7000 != 0 => disk_mode,
            ModePolicy::Normalized => match kind {
                EntryKind::Dir => 0o755,
                EntryKind::Symlink { .. } => 0o777,
                _ if disk_mode & 0o100 != 0 => 0o755,
                _ => 0o644,
            },
        };
        let kind = if file_type.is_symlink() {
            let target = fs_err::read_link(&disk_path).map_err(io(&disk_path))?;
            let target =
                target
                    .into_os_string()
                    .into_string()
                    .map_err(|_| LayerError::NonUtf8Path {
                        path: disk_path.clone(),
                    })?;
            EntryKind::Symlink { target }
        } else if file_type.is_dir() {
            EntryKind::Dir
        } else if file_type.is_file() {
            let key = (meta.dev(), meta.ino());
            match inodes.get(&key) {
                Some(first) if meta.nlink() > 1 => EntryKind::Hardlink {
                    target: first.clone(),
                },
                _ => {
                    if meta.nlink() > 1 {
                        inodes.insert(key, path.clone());
                    }
                    EntryKind::File {
                        size: meta.len(),
                        source: FileSource::Path(disk_path.clone()),
                    }
                }
            }
        } else {
            return Err(LayerError::UnsupportedFileType { path: disk_path });
        };
        let mut entry = Entry::new(path.clone(), kind, 0);
        entry.mode = mode(&entry.kind);
        if options.keep_owners {
            entry.uid = meta.uid();
            entry.gid = meta.gid();
        }
        let is_dir = matches!(entry.kind, EntryKind::Dir);
        entries.push(entry);
        if is_dir {
            walk(&disk_path, Some(&path), options, entries, inodes)?;
        }
    }
    Ok(())
}
