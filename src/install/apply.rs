//! Carrying a plan out onto a directory (the image's `/`): directories, generated files,
//! symlinks, and zip members streamed through their RECORD check. Never writes through a
//! symlinked directory inside the root, so a hostile root cannot redirect writes onto the
//! host.

use std::fs::{Metadata, Permissions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{
    is_normalised_absolute, EntryContent, InstallEntry, InstallError, InstallPlan, MemberMismatch,
    WheelReader,
};
use crate::digest::Digest;

/// Carry out `plan` onto the directory `root` (the image's `/`), streaming every wheel
/// member through its RECORD check. Existing files at a planned path are replaced. Refuses to
/// write through a symlinked directory inside `root`, so a hostile root cannot redirect
/// writes onto the host.
pub fn install_to_dir(
    plan: &InstallPlan,
    reader: &mut WheelReader,
    root: &Path,
) -> Result<(), InstallError> {
    apply_entries(&plan.entries, Some(reader), root)
}

/// Write entries (directories, generated files, symlinks, and zip members when `reader` is
/// given) under `root`.
pub fn apply_entries(
    entries: &[InstallEntry],
    mut reader: Option<&mut WheelReader>,
    root: &Path,
) -> Result<(), InstallError> {
    for entry in entries {
        let host = checked_host_path(root, &entry.path)?;
        let write_error = |source| InstallError::Write {
            path: host.clone(),
            source,
        };
        let existing = std::fs::symlink_metadata(&host).ok();
        if let Some(parent) = host.parent() {
            std::fs::create_dir_all(parent).map_err(write_error)?;
        }
        if let EntryContent::Directory = entry.content {
            write_directory(entry, &host, existing.as_ref())?;
            continue;
        }
        remove_existing(&host, existing.as_ref())?;
        match &entry.content {
            EntryContent::Directory => unreachable!("handled above"),
            EntryContent::Symlink { target } => {
                std::os::unix::fs::symlink(target, &host).map_err(write_error)?;
            }
            EntryContent::Generated { bytes, .. } => {
                std::fs::write(&host, bytes).map_err(write_error)?;
                set_mode(&host, entry.mode)?;
            }
            EntryContent::ZipMember {
                index,
                name,
                digest,
                size,
            } => {
                let reader = reader.as_deref_mut().ok_or_else(|| InstallError::Write {
                    path: host.clone(),
                    source: io::Error::other("a zip member was planned but no wheel is open"),
                })?;
                write_member(reader, *index, name, *digest, *size, &host)?;
                set_mode(&host, entry.mode)?;
            }
        }
    }
    Ok(())
}

/// The host path of the image path `path` under `root`, once `path` is known to be an
/// absolute, normalised path other than `/` with no symlinked directory above it.
fn checked_host_path(root: &Path, path: &Path) -> Result<PathBuf, InstallError> {
    if !is_normalised_absolute(path) || path == Path::new("/") {
        return Err(InstallError::BadDestination {
            path: path.to_path_buf(),
        });
    }
    let host = crate::rootfs::host_path(root, path);
    check_no_symlinked_parent(root, path)?;
    Ok(host)
}

/// Create the directory `entry` at `host`. A symlink where the plan wants a directory
/// belongs to the base (e.g. a merged-usr `/lib`): it is never replaced.
fn write_directory(
    entry: &InstallEntry,
    host: &Path,
    existing: Option<&Metadata>,
) -> Result<(), InstallError> {
    let write_error = |source| InstallError::Write {
        path: host.to_path_buf(),
        source,
    };
    if existing.is_some_and(|metadata| metadata.file_type().is_symlink()) {
        return Err(InstallError::SymlinkInRoot {
            path: entry.path.clone(),
            symlink: entry.path.clone(),
        });
    }
    if existing.is_some_and(|metadata| !metadata.is_dir()) {
        std::fs::remove_file(host).map_err(write_error)?;
    }
    std::fs::create_dir_all(host).map_err(write_error)?;
    set_mode(host, entry.mode)
}

/// Make room for a file or symlink at `host`: an existing file is replaced, an existing
/// directory only when it is empty.
fn remove_existing(host: &Path, existing: Option<&Metadata>) -> Result<(), InstallError> {
    let result = match existing {
        Some(metadata) if metadata.is_dir() => std::fs::remove_dir(host),
        Some(_) => std::fs::remove_file(host),
        None => Ok(()),
    };
    result.map_err(|source| InstallError::Write {
        path: host.to_path_buf(),
        source,
    })
}

fn set_mode(host: &Path, mode: u32) -> Result<(), InstallError> {
    std::fs::set_permissions(host, Permissions::from_mode(mode)).map_err(|source| {
        InstallError::Write {
            path: host.to_path_buf(),
            source,
        }
    })
}

/// Stream zip member `index` (`name`, with the `digest` and `size` RECORD promises) into a
/// new file at `host`. On a read error or RECORD mismatch the partial file is removed.
fn write_member(
    reader: &mut WheelReader,
    index: usize,
    name: &str,
    digest: Digest,
    size: u64,
    host: &Path,
) -> Result<(), InstallError> {
    let wheel = reader.path.clone();
    let mut source = reader.open_member(index, name, digest, size)?;
    let mut file = std::fs::File::create(host).map_err(|source| InstallError::Write {
        path: host.to_path_buf(),
        source,
    })?;
    let Err(error) = io::copy(&mut source, &mut file) else {
        return Ok(());
    };
    drop(file);
    let _ = std::fs::remove_file(host);
    let mismatch = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<MemberMismatch>());
    Err(match mismatch {
        Some(mismatch) => InstallError::HashMismatch {
            wheel,
            member: name.to_string(),
            expected: mismatch.expected.clone(),
            found: mismatch.found.clone(),
        },
        None => InstallError::ReadMember {
            wheel,
            member: name.to_string(),
            source: error,
        },
    })
}

fn check_no_symlinked_parent(root: &Path, path: &Path) -> Result<(), InstallError> {
    for ancestor in path.ancestors().skip(1) {
        if ancestor == Path::new("/") {
            break;
        }
        let host = crate::rootfs::host_path(root, ancestor);
        if let Ok(metadata) = std::fs::symlink_metadata(&host) {
            if metadata.file_type().is_symlink() {
                return Err(InstallError::SymlinkInRoot {
                    path: path.to_path_buf(),
                    symlink: ancestor.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}
