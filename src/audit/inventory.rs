//! The one walk over an image root: symlinks, ELF candidates, cuDNN headers and library
//! names, and `.dist-info` directories, each list sorted so the audit is deterministic.

use std::path::{Path, PathBuf};

use super::image::ImageFs;
use super::{io_error, AuditError};
use crate::rootfs::Node;

/// Top-level directories that hold no files of the image (mount points at run time).
const SKIPPED_TOP_DIRS: &[&str] = &["proc", "sys", "dev"];

/// The files of the root the later phases look at, each list sorted.
#[derive(Default)]
pub(super) struct Inventory {
    pub symlinks: Vec<PathBuf>,
    pub candidates: Vec<PathBuf>,
    pub cudnn_headers: Vec<PathBuf>,
    pub cudnn_library_names: Vec<PathBuf>,
    pub dist_infos: Vec<PathBuf>,
}

pub(super) fn looks_like_library(name: &str) -> bool {
    name.ends_with(".so") || name.contains(".so.")
}

pub(super) fn in_binary_dir(image_path: &Path) -> bool {
    image_path.parent().is_some_and(|parent| {
        parent.components().any(|c| {
            let c = c.as_os_str().to_string_lossy();
            c == "bin" || c == "sbin" || c.starts_with("lib") || c == "libexec"
        })
    })
}

/// Walk the root once (skipping the run-time mount points) and sort what it holds into the
/// lists the phases need.
pub(super) fn walk(fs: &dyn ImageFs) -> Result<Inventory, AuditError> {
    let mut inventory = Inventory::default();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(dir) = stack.pop() {
        let names = fs.list(&dir).map_err(io_error(&dir))?;
        for name in names.into_iter().rev() {
            let image_path = dir.join(&name);
            if dir == Path::new("/") && SKIPPED_TOP_DIRS.contains(&name.as_str()) {
                continue;
            }
            let Some(node) = fs.node(&image_path).map_err(io_error(&image_path))? else {
                continue;
            };
            let is_cudnn_name = name.starts_with("libcudnn.so.");
            match node {
                Node::Symlink(_) => {
                    if is_cudnn_name {
                        inventory.cudnn_library_names.push(image_path.clone());
                    }
                    inventory.symlinks.push(image_path);
                }
                Node::Dir => {
                    if name.ends_with(".dist-info") {
                        inventory.dist_infos.push(image_path.clone());
                    }
                    stack.push(image_path);
                }
                Node::File { mode, .. } => {
                    if name == "cudnn_version.h" {
                        inventory.cudnn_headers.push(image_path.clone());
                    }
                    if is_cudnn_name {
                        inventory.cudnn_library_names.push(image_path.clone());
                    }
                    let executable = mode & 0o111 != 0;
                    if looks_like_library(&name) || (executable && in_binary_dir(&image_path)) {
                        inventory.candidates.push(image_path);
                    }
                }
                Node::Other => {}
            }
        }
    }
    for list in [
        &mut inventory.symlinks,
        &mut inventory.candidates,
        &mut inventory.cudnn_headers,
        &mut inventory.cudnn_library_names,
        &mut inventory.dist_infos,
    ] {
        list.sort();
    }
    Ok(inventory)
}
