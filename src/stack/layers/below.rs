//! The layers below one that reads them (`user`, `copy`): what the image has at a path,
//! seen the way the merged image will see it, without following a link of the image on
//! the host.

use std::path::{Path, PathBuf};

use super::view::LayerBelow;
use crate::audit::{ImageFs, Owner};
use crate::layer::{LayerPath, Recorded, RecordedOwners};
use crate::rootfs::Node;
use crate::stack::error::BuildError;

/// A layer below, seen through its recorded facts or its staged tree ([`LayerBelow`]), and
/// the owners record staged beside its tree (a tree staged without root has one).
pub(crate) struct Below {
    tree: PathBuf,
    view: Box<dyn ImageFs>,
    owners: Option<RecordedOwners>,
}

impl Below {
    /// The layer `layer` with the owners record staged beside its tree, if any.
    pub(crate) fn open(layer: &LayerBelow) -> Result<Self, BuildError> {
        let record = layer.tree.with_extension("owners.json");
        Ok(Self {
            tree: layer.tree.clone(),
            view: layer.view()?,
            owners: record
                .exists()
                .then(|| RecordedOwners::read(&record))
                .transpose()?,
        })
    }
}

/// What the top-most tree below has at a path.
pub(crate) struct LowerEntry {
    /// The file on the host, in the staged tree (for the layers that are never transient:
    /// the base's and apt's /etc files).
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
    let image_path = Path::new("/").join(path);
    for layer in below.iter().rev() {
        let Ok(Some(node)) = layer.view.node(&image_path) else {
            continue;
        };
        let kind = match node {
            Node::Symlink(target) => LowerKind::Symlink(target.to_string_lossy().into_owned()),
            Node::Dir => LowerKind::Dir,
            Node::File { .. } | Node::Other => LowerKind::Other,
        };
        let owner = layer
            .view
            .owner(&image_path)
            .ok()
            .flatten()
            .unwrap_or(Owner {
                uid: 0,
                gid: 0,
                mode: 0o644,
            });
        let recorded = LayerPath::parse(path)
            .ok()
            .and_then(|p| layer.owners.as_ref()?.get(&p).copied())
            .unwrap_or(Recorded {
                uid: owner.uid,
                gid: owner.gid,
                mode: owner.mode,
            });
        return Some(LowerEntry {
            disk: layer.tree.join(path),
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
