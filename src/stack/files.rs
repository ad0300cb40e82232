//! The filesystem helpers the stagers share: writing a file or a record of the staging
//! area, overlaying staged trees, running a command. How trees are kept (keys, locks,
//! markers) is the cache's [`crate::cache::Staging`]; this is what goes in them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::stack::error::{io_error, BuildError};

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

    #[test]
    fn merged_trees_are_hard_links_with_later_trees_winning() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper, merged) = (
            dir.path().join("lower"),
            dir.path().join("upper"),
            dir.path().join("merged"),
        );
        write_file(&lower.join("etc/a"), b"lower").unwrap();
        write_file(&lower.join("etc/only-lower"), b"x").unwrap();
        write_file(&upper.join("etc/a"), b"upper").unwrap();
        merge_trees(&[&lower, &upper], &merged).unwrap();
        assert_eq!(fs_err::read(merged.join("etc/a")).unwrap(), b"upper");
        assert!(merged.join("etc/only-lower").is_file());
        let inode = |p: &Path| fs_err::metadata(p).unwrap().ino();
        assert_eq!(inode(&merged.join("etc/a")), inode(&upper.join("etc/a")));
    }
}
