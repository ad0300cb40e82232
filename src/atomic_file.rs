//! Files that appear whole or not at all, with the modes the user's umask asks for.
//!
//! Every file cudastack writes for others to read (locks, layout blobs and index.json,
//! cache entries, reports) goes through here: bytes go to a temp file in the target's own
//! directory (so the rename is atomic), are synced, and the temp file is renamed over the
//! target. `tempfile` creates files 0600; a lock or a layout written that way cannot be read
//! by a CI user other than the builder, so temp files are created 0666 and the umask
//! applies, as for any file `open(2)` creates.

use std::fs::Permissions;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tempfile::NamedTempFile;

/// A new temp file in `dir` named `PREFIX…`, mode 0666 less the umask. Dropped without
/// [`NamedTempFile::persist`], it is removed.
pub fn temp_in(dir: &Path, prefix: &str) -> io::Result<NamedTempFile> {
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)
}

/// Write `bytes` to `path` atomically: a reader sees the old file or the new one, never a
/// part. The temp file lives beside `path` (its parent, or `.`).
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = temp_in(dir, ".tmp-")?;
    temp.write_all(bytes)?;
    persist(temp, path)
}

/// Sync `temp` and rename it to `path`.
pub fn persist(temp: NamedTempFile, path: &Path) -> io::Result<()> {
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Take the exclusive advisory lock (`flock(2)`) of `path`, creating it (0666 less the
/// umask) if needed; held until the returned file is dropped, released by the kernel if the
/// process dies. Cache entries use one lock file each, so concurrent builds of the same
/// entry wait for each other while different entries proceed in parallel.
pub fn lock(path: &Path) -> io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    file.lock()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_follow_the_umask_not_tempfiles_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        write(&path, b"{}").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        // The test process's umask is typically 022; whatever it is, group/other read
        // bits must be what it allows, not tempfile's 0600.
        let umask = current_umask();
        assert_eq!(mode, 0o666 & !umask, "mode {mode:o} with umask {umask:o}");
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a directory: the rename fails, and the temp file must go.
        let target = dir.path().join("taken");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"x").unwrap();
        assert!(write(&target, b"new").is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("taken")]);
    }

    fn current_umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }
}
