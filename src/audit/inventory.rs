//! The one walk over an image root: symlinks, ELF candidates, cuDNN headers and library
//! names, and `.dist-info` directories, each list sorted so the audit is deterministic.

use std::path::{Path, PathBuf};

use super::{io_error, AuditError};
use crate::rootfs::host_path;

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

fn looks_like_library(name: &str) -> bool {
    name.ends_with(".so") || name.contains(".so.")
}

fn in_binary_dir(image_path: &Path) -> bool {
    image_path.parent().is_some_and(|parent| {
        parent.components().any(|c| {
            let c = c.as_os_str().to_string_lossy();
            c == "bin" || c == "sbin" || c.starts_with("lib") || c == "libexec"
        })
    })
}

/// Walk the root once (skipping the run-time mount points) and sort what it holds into the
/// lists the phases need.
pub(super) fn walk(root: &Path) -> Result<Inventory, AuditError> {
    use std::os::unix::fs::PermissionsExt;
    let mut inventory = Inventory::default();
    let mut stack = vec![PathBuf::from("/")];
    while let Some(dir) = stack.pop() {
        let host_dir = host_path(root, &dir);
        let mut items: Vec<_> = std::fs::read_dir(&host_dir)
            .map_err(io_error(&host_dir))?
            .collect::<Result<_, _>>()
            .map_err(io_error(&host_dir))?;
        items.sort_by_key(|item| item.file_name());
        for item in items.into_iter().rev() {
            let name = item.file_name().to_string_lossy().into_owned();
            let image_path = dir.join(&name);
            if dir == Path::new("/") && SKIPPED_TOP_DIRS.contains(&name.as_str()) {
                continue;
            }
            let host = item.path();
            let metadata = std::fs::symlink_metadata(&host).map_err(io_error(&host))?;
            let file_type = metadata.file_type();
            let is_cudnn_name = name.starts_with("libcudnn.so.");
            if file_type.is_symlink() {
                if is_cudnn_name {
                    inventory.cudnn_library_names.push(image_path.clone());
                }
                inventory.symlinks.push(image_path);
            } else if file_type.is_dir() {
                if name.ends_with(".dist-info") {
                    inventory.dist_infos.push(image_path.clone());
                }
                stack.push(image_path);
            } else if file_type.is_file() {
                if name == "cudnn_version.h" {
                    inventory.cudnn_headers.push(image_path.clone());
                }
                if is_cudnn_name {
                    inventory.cudnn_library_names.push(image_path.clone());
                }
                let executable = metadata.permissions().mode() & 0o111 != 0;
                if looks_like_library(&name) || (executable && in_binary_dir(&image_path)) {
                    inventory.candidates.push(image_path);
                }
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
