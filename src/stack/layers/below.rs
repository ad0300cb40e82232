//! The staged trees of the layers below one that reads them (`user`, `copy`): what the
//! image has at a path, seen the way the merged image will see it, without following a
//! link of the image on the host.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::layer::{LayerPath, Recorded, RecordedOwners};
use crate::stack::error::BuildError;

/// A staged tree below and its owners record (a tree staged without root has one).
pub(crate) struct Below {
    tree: PathBuf,
    owners: Option<RecordedOwners>,
}

impl Below {
    /// The staged tree `tree` with the owners record staged beside it, if any.
    pub(crate) fn open(tree: &Path) -> Result<Self, BuildError> {
        let record = tree.with_extension("owners.json");
        Ok(Self {
            tree: tree.to_path_buf(),
            owners: record
                .exists()
                .then(|| RecordedOwners::read(&record))
                .transpose()?,
        })
    }
}

/// What the top-most tree below has at a path.
pub(crate) struct LowerEntry {
    /// The file on the host, in the staged tree.
    pub disk: PathBuf,
    /// Its owner and mode in the image.
    pub recorded: Recorded,
    pub kind: LowerKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LowerKind {
    Dir,
    /// A symbolic link, with its target.
    Symlink(String),
    Other,
}

/// The entry at `path` (relative, `/`-separated) in the top-most tree that has one. Only
/// that path is looked at: see [`walk_down`] for a path whose parents may be links.
pub(crate) fn top_most(below: &[Below], path: &str) -> Option<LowerEntry> {
    for layer in below.iter().rev() {
        let disk = layer.tree.join(path);
        let Ok(meta) = fs_err::symlink_metadata(&disk) else {
            continue;
        };
        let kind = if meta.file_type().is_symlink() {
            let target = fs_err::read_link(&disk).unwrap_or_default();
            LowerKind::Symlink(target.to_string_lossy().into_owned())
        } else if meta.is_dir() {
            LowerKind::Dir
        } else {
            LowerKind::Other
        };
        let recorded = LayerPath::parse(path)
            .ok()
            .and_then(|p| layer.owners.as_ref()?.get(&p).copied())
            .unwrap_or(Recorded {
                uid: meta.uid(),
                gid: meta.gid(),
                mode: meta.mode() & 0o7777,
            });
        return Some(LowerEntry {
            disk,
            recorded,
            kind,
        });
    }
    None
}

/// The entries at each component of `path` from the top (`a`, `a/b`, `a/b/c`), stopping
/// after the first that does not exist below or is not a directory: so no link of the image
/// is followed on the host, and a link on the way is the last entry returned.
pub(crate) fn walk_down(below: &[Below], path: &str) -> Vec<(String, LowerEntry)> {
    let mut found = Vec::new();
    let mut prefix = String::new();
    for component in path.split('/') {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(component);
        let Some(entry) = top_most(below, &prefix) else {
            break;
        };
        let is_dir = entry.kind == LowerKind::Dir;
        found.push((prefix.clone(), entry));
        if !is_dir {
            break;
        }
    }
    found
}
