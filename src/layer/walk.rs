//! Turning a directory tree on disk into layer entries.
//!
//! The walk never follows symlinks (a CUDA library chain stays a chain, not three copies:
//! CRATES.md pitfall 2), keeps hardlinks as links, reads directories in sorted order and
//! records only what the layer needs: path, kind, mode, and (optionally) owner. Times,
//! the discovering order and the umask of whoever created the tree do not leak into the
//! layer when [`ModePolicy::Normalized`] (the default) is used.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// A file of [`RecordedOwners`] (JSON) whose owners and modes replace what the disk
    /// says: a tree unpacked by a user other than root has lost them.
    pub recorded: Option<PathBuf>,
}

/// The owner and mode of one entry, as an archive recorded them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits including setuid/setgid/sticky.
    pub mode: u32,
}

/// Owners and modes by layer path, for a tree that was unpacked without root (a
/// rootless base, docs/rootless.md): the copy on disk belongs to whoever unpacked it, and
/// these are what the layer records. An entry with no record (a file cudastack added to
/// the tree itself) is root's, with the mode found on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedOwners {
    entries: BTreeMap<String, Recorded>,
}

impl RecordedOwners {
    pub fn insert(&mut self, path: &LayerPath, recorded: Recorded) {
        self.entries.insert(path.as_str().to_string(), recorded);
    }
    pub fn get(&self, path: &LayerPath) -> Option<&Recorded> {
        self.entries.get(path.as_str())
    }
    pub fn remove(&mut self, path: &LayerPath) {
        self.entries.remove(path.as_str());
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Read a record written by [`Self::to_json`].
    pub fn read(path: &Path) -> Result<Self, LayerError> {
        let bytes = fs_err::read(path).map_err(|source| LayerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| LayerError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("owners serialise")
    }
}

impl LayerContents {
    /// Walk `root` (not following symlinks) and build the layer's contents from it.
    /// The root directory itself is not an entry; its children are.
    pub fn from_dir(root: &Path, options: &DirOptions) -> Result<Self, LayerError> {
        let mut entries = Vec::new();
        let mut inodes: HashMap<(u64, u64), LayerPath> = HashMap::new();
        let recorded = options
            .recorded
            .as_deref()
            .map(RecordedOwners::read)
            .transpose()?;
        let walk_options = Walk {
            options,
            recorded: recorded.as_ref(),
        };
        walk(
            root,
            options.prefix.as_ref(),
            &walk_options,
            &mut entries,
            &mut inodes,
        )?;
        LayerContents::from_entries(entries)
    }
}

/// The options of one walk, with the recorded owners loaded.
struct Walk<'a> {
    options: &'a DirOptions,
    recorded: Option<&'a RecordedOwners>,
}

fn walk(
    dir: &Path,
    prefix: Option<&LayerPath>,
    walk_options: &Walk,
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
        let options = walk_options.options;
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
        if let Some(recorded) = walk_options.recorded {
            apply_recorded(&mut entry, recorded);
        }
        let is_dir = matches!(entry.kind, EntryKind::Dir);
        entries.push(entry);
        if is_dir {
            walk(&disk_path, Some(&path), walk_options, entries, inodes)?;
        }
    }
    Ok(())
}

/// The recorded owner and mode of `entry`, or root's and the disk's mode when none was
/// recorded; a symlink's mode is always 0777, as a root-made tree's is.
fn apply_recorded(entry: &mut Entry, recorded: &RecordedOwners) {
    let (uid, gid, mode) = match recorded.get(&entry.path) {
        Some(r) => (r.uid, r.gid, r.mode & 0o7777),
        None => (0, 0, entry.mode),
    };
    entry.uid = uid;
    entry.gid = gid;
    if !matches!(entry.kind, EntryKind::Symlink { .. }) {
        entry.mode = mode;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree unpacked by a user: the record gives owners and modes (setuid included);
    /// an entry without a record is root's with its disk mode; a symlink stays 0777.
    #[test]
    fn recorded_owners_replace_the_disk_owners() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs_err::create_dir_all(root.join("etc")).unwrap();
        fs_err::write(root.join("etc/shadow"), "x").unwrap();
        fs_err::write(root.join("su"), "y").unwrap();
        fs_err::write(root.join("added"), "z").unwrap();
        std::os::unix::fs::symlink("su", root.join("link")).unwrap();
        let path = |p: &str| LayerPath::parse(p).unwrap();
        let mut recorded = RecordedOwners::default();
        let record = |uid, gid, mode| Recorded { uid, gid, mode };
        recorded.insert(&path("etc"), record(0, 0, 0o755));
        recorded.insert(&path("etc/shadow"), record(0, 42, 0o640));
        recorded.insert(&path("su"), record(0, 0, 0o4755));
        recorded.insert(&path("link"), record(7, 7, 0o777));
        let record_file = dir.path().join("owners.json");
        fs_err::write(&record_file, recorded.to_json()).unwrap();
        let options = DirOptions {
            modes: ModePolicy::Exact,
            keep_owners: true,
            recorded: Some(record_file),
            ..DirOptions::default()
        };
        let contents = LayerContents::from_dir(&root, &options).unwrap();
        let find = |p: &str| {
            let entry = contents
                .entries()
                .iter()
                .find(|e| e.path.as_str() == p)
                .unwrap();
            (entry.uid, entry.gid, entry.mode)
        };
        assert_eq!(find("etc/shadow"), (0, 42, 0o640));
        assert_eq!(find("su"), (0, 0, 0o4755));
        let disk_mode = fs_err::metadata(root.join("added"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(find("added"), (0, 0, disk_mode));
        assert_eq!(find("link"), (7, 7, 0o777));
    }

    #[test]
    fn an_unreadable_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let options = DirOptions {
            recorded: Some(dir.path().join("missing.json")),
            ..DirOptions::default()
        };
        let error = LayerContents::from_dir(dir.path(), &options).unwrap_err();
        assert!(error.to_string().contains("missing.json"), "{error}");
    }
}
