//! Reading a file of a directory a pull request controls (a recipe's directory, a build
//! context, a sandbox) without leaving it.
//!
//! The path is opened one component at a time below an open directory of the root, each
//! with `O_NOFOLLOW`: no symbolic link is followed, so a link swapped in during the build
//! cannot make cudastack (often root) read a host file. Only a regular file is opened:
//! a FIFO or a device is refused from `lstat` before the open, and the open itself is
//! `O_NONBLOCK`, so a FIFO swapped in between never blocks. Reads take exactly the size
//! `fstat` gave (one byte more is read to see growth): `/dev/zero` or a file that grows
//! cannot fill memory or a disk. A file read twice (planned, then copied) is checked to be
//! the same inode of the same size.
//!
//! Must not: follow a link, accept `..` or an absolute path, read past the planned size.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ContainedError {
    #[error("`{}` does not exist", crate::printable::path(.path))]
    Missing { path: PathBuf },
    #[error("`{}` is not a path below `{}` (an absolute path or `..`)\n  hint: name a file inside the directory", crate::printable::path(.path), crate::printable::path(.root))]
    Outside { path: PathBuf, root: PathBuf },
    #[error("`{}` goes through `{}`, a symbolic link; cudastack does not follow links when it reads from `{}`, so a link cannot reach a file outside it\n  hint: put the file itself there, not a link to it", crate::printable::path(.path), crate::printable::path(.link), crate::printable::path(.root))]
    Link {
        path: PathBuf,
        link: PathBuf,
        root: PathBuf,
    },
    #[error("`{}` is a {kind}, not a regular file; cudastack reads regular files only (a FIFO blocks a read, a device never ends)\n  hint: replace it with a regular file", crate::printable::path(.path))]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("`{}` is {size} bytes, more than the {limit} bytes allowed\n  hint: make it smaller", crate::printable::path(.path))]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("`{}` changed while it was read ({what}); build again when the files are settled", crate::printable::path(.path))]
    Changed { path: PathBuf, what: String },
    // The cause is in the message, not chained: callers wrap this error in their own.
    #[error("cannot read `{}`: {error}", crate::printable::path(.path))]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot write what `{}` holds: {error}", crate::printable::path(.path))]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Which file was opened, to check that a second open finds the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
}

/// A regular file opened below a root without following links.
#[derive(Debug)]
pub struct ContainedFile {
    file: File,
    /// `root/relative`, for messages.
    path: PathBuf,
    identity: FileIdentity,
    mode: u32,
}

impl ContainedFile {
    /// Open `relative` below `root` (the root itself may be reached through links: it is
    /// the caller's, not the pull request's).
    pub fn open(root: &Path, relative: &Path) -> Result<Self, ContainedError> {
        let path = root.join(relative);
        let names = plain_components(root, relative)?;
        let (last, directories) = names.split_last().ok_or_else(|| ContainedError::Outside {
            path: path.clone(),
            root: root.to_path_buf(),
        })?;
        let io = |error: std::io::Error| ContainedError::Io {
            path: path.clone(),
            error,
        };
        let (directory, mut walked) = open_directories(root, directories, &path)?;
        walked.push(std::ffi::OsStr::from_bytes(last.as_bytes()));
        // lstat first: a FIFO or a device is never opened (opening one can block or act).
        let before =
            lstat_below(&directory, last).map_err(|e| classify(e, &path, &walked, root))?;
        refuse_special(before.st_mode, &path, &walked, root)?;
        let file = open_below(&directory, last, libc::O_NONBLOCK | libc::O_NOCTTY)
            .map_err(|error| classify(error, &path, &walked, root))?;
        let file = File::from(file);
        let meta = file.metadata().map_err(io)?;
        // The inode lstat saw is the one opened: nothing was swapped in between.
        refuse_special(meta.mode(), &path, &walked, root)?;
        if (meta.dev(), meta.ino()) != (before.st_dev, before.st_ino) {
            return Err(ContainedError::Changed {
                path,
                what: "another file took its place as it was opened".into(),
            });
        }
        Ok(Self {
            identity: FileIdentity {
                device: meta.dev(),
                inode: meta.ino(),
                size: meta.len(),
            },
            mode: meta.mode(),
            file,
            path,
        })
    }

    /// Open `relative` as [`open`](Self::open) does, and check it is the file `planned`
    /// was taken from: same inode, same size.
    pub fn open_planned(
        root: &Path,
        relative: &Path,
        planned: FileIdentity,
    ) -> Result<Self, ContainedError> {
        let file = Self::open(root, relative)?;
        if file.identity != planned {
            let what =
                if (file.identity.device, file.identity.inode) == (planned.device, planned.inode) {
                    format!(
                        "{} bytes when planned, {} now",
                        planned.size, file.identity.size
                    )
                } else {
                    "another file took its place".to_string()
                };
            return Err(ContainedError::Changed {
                path: file.path,
                what,
            });
        }
        Ok(file)
    }

    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// The size `fstat` gave when the file was opened: all a read will take.
    pub fn size(&self) -> u64 {
        self.identity.size
    }

    /// The file's mode bits (`st_mode`).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, for a reader that seeks (a zip's central directory). Reads through it
    /// are not bounded by the size: the caller bounds what it inflates, and rewinds before
    /// [`copy_to`](Self::copy_to), which reads from the current position.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The whole file in memory, refused above `limit` bytes. Buffers: for small files.
    pub fn read_to_vec(self, limit: u64) -> Result<Vec<u8>, ContainedError> {
        let size = self.size();
        if size > limit {
            return Err(ContainedError::TooLarge {
                path: self.path,
                size,
                limit,
            });
        }
        let mut bytes = Vec::with_capacity(self.size() as usize);
        self.copy_to(&mut bytes)?;
        Ok(bytes)
    }

    /// Copy exactly the file's size to `out`; a file that grew or shrank since it was
    /// opened is an error, and no more than its size and one byte is read.
    pub fn copy_to(self, out: &mut impl Write) -> Result<u64, ContainedError> {
        let size = self.size();
        let path = self.path;
        let mut reader = self.file.take(size.saturating_add(1));
        let mut buffer = vec![0u8; (1 << 20).min((size as usize).saturating_add(1))];
        let mut copied: u64 = 0;
        loop {
            let read = match reader.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(ContainedError::Io { path, error }),
            };
            copied += read as u64;
            if copied > size {
                return Err(ContainedError::Changed {
                    path,
                    what: format!("it grew past the {size} bytes it had when opened"),
                });
            }
            out.write_all(&buffer[..read])
                .map_err(|error| ContainedError::Write {
                    path: path.clone(),
                    error,
                })?;
        }
        if copied != size {
            return Err(ContainedError::Changed {
                path,
                what: format!("{copied} bytes read of the {size} it had when opened"),
            });
        }
        Ok(copied)
    }
}

/// The names in directory `relative` below `root`, sorted, reached as [`ContainedFile::open`]
/// reaches a file: no symbolic link on the way, `relative` itself not a link. Each entry
/// is only a name: open it with [`ContainedFile::open`], which refuses links, FIFOs and
/// devices among them.
pub fn read_dir(root: &Path, relative: &Path) -> Result<Vec<std::ffi::OsString>, ContainedError> {
    let path = root.join(relative);
    let names = plain_components(root, relative)?;
    // Holding the directory open proves nothing was swapped in on the way; the listing
    // then reads the path it was found at (each entry is opened contained again).
    let _directory = open_directories(root, &names, &path)?;
    let io = |error: std::io::Error| ContainedError::Io {
        path: path.clone(),
        error,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(&path).map_err(io)? {
        entries.push(entry.map_err(io)?.file_name());
    }
    entries.sort();
    Ok(entries)
}

/// Open each of `names` below `root` as a directory, never through a link; the last one
/// opened and the path walked.
fn open_directories(
    root: &Path,
    names: &[CString],
    path: &Path,
) -> Result<(OwnedFd, PathBuf), ContainedError> {
    let mut directory = open_root(root).map_err(|error| ContainedError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let mut walked = root.to_path_buf();
    for name in names {
        walked.push(std::ffi::OsStr::from_bytes(name.as_bytes()));
        directory = open_below(&directory, name, libc::O_DIRECTORY).map_err(|error| {
            // O_DIRECTORY | O_NOFOLLOW on a link is ENOTDIR: lstat says which it was.
            let link = lstat_below(&directory, name)
                .is_ok_and(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFLNK);
            let error = if link {
                std::io::Error::from_raw_os_error(libc::ELOOP)
            } else {
                error
            };
            classify(error, path, &walked, root)
        })?;
    }
    Ok((directory, walked))
}

/// The names of `relative`, each a plain name (no `/`, `.`, `..` or root).
fn plain_components(root: &Path, relative: &Path) -> Result<Vec<CString>, ContainedError> {
    let outside = || ContainedError::Outside {
        path: relative.to_path_buf(),
        root: root.to_path_buf(),
    };
    let mut names = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => {
                names.push(CString::new(name.as_bytes()).map_err(|_| outside())?)
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside())
            }
        }
    }
    Ok(names)
}

fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(root)?;
    Ok(OwnedFd::from(file))
}

/// `openat(directory, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | flags)`.
fn open_below(directory: &OwnedFd, name: &CString, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | flags;
    // SAFETY: `name` is a NUL-terminated string and `directory` an open descriptor; the
    // result is a new descriptor we own, or -1.
    let fd = unsafe { libc::openat(directory.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(directory, name, AT_SYMLINK_NOFOLLOW)`.
fn lstat_below(directory: &OwnedFd, name: &CString) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, `stat` a writable struct of the type.
    let result = unsafe {
        libc::fstatat(
            directory.as_raw_fd(),
            name.as_ptr(),
            &mut stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat)
}

/// What `mode` is when it is not a regular file (a link is named as the link it is).
fn refuse_special(mode: u32, path: &Path, at: &Path, root: &Path) -> Result<(), ContainedError> {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFREG => return Ok(()),
        libc::S_IFLNK => {
            return Err(ContainedError::Link {
                path: path.to_path_buf(),
                link: at.to_path_buf(),
                root: root.to_path_buf(),
            })
        }
        libc::S_IFIFO => "named pipe (FIFO)",
        libc::S_IFCHR | libc::S_IFBLK => "device",
        libc::S_IFSOCK => "socket",
        libc::S_IFDIR => "directory",
        _ => "special file",
    };
    Err(ContainedError::NotRegular {
        path: path.to_path_buf(),
        kind,
    })
}

/// An open error, said as what it means here: `ELOOP` from `O_NOFOLLOW` is a link on the
/// way, `ENOTDIR` a file where a directory was expected.
fn classify(error: std::io::Error, path: &Path, at: &Path, root: &Path) -> ContainedError {
    match error.raw_os_error() {
        Some(libc::ELOOP) => ContainedError::Link {
            path: path.to_path_buf(),
            link: at.to_path_buf(),
            root: root.to_path_buf(),
        },
        Some(libc::ENOENT) => ContainedError::Missing {
            path: path.to_path_buf(),
        },
        Some(libc::ENOTDIR) => ContainedError::NotRegular {
            path: at.to_path_buf(),
            kind: "file where a directory was expected",
        },
        _ => ContainedError::Io {
            path: path.to_path_buf(),
            error,
        },
    }
}

/// Open `path` for reading if it is a regular file, else say what it is.
/// `O_NONBLOCK` makes the open of a FIFO return at once instead of waiting for a writer,
/// and the type is read from the opened file (`fstat`), so a file swapped for a FIFO after
/// any earlier look is caught too. On a regular file `O_NONBLOCK` changes nothing.
pub fn open_regular(path: &Path) -> std::io::Result<Result<std::fs::File, &'static str>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    Ok(if kind.is_file() {
        Ok(file)
    } else if kind.is_fifo() {
        Err("a named pipe (FIFO)")
    } else if kind.is_dir() {
        Err("a directory")
    } else if kind.is_char_device() || kind.is_block_device() {
        Err("a device")
    } else if kind.is_socket() {
        Err("a socket")
    } else {
        Err("of another kind")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_below_the_root() {
        let root = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(root.path().join("a/b")).unwrap();
        fs_err::write(root.path().join("a/b/c.txt"), "hello").unwrap();
        let file = ContainedFile::open(root.path(), Path::new("a/./b/c.txt")).unwrap();
        assert_eq!(file.size(), 5);
        assert_eq!(file.read_to_vec(5).unwrap(), b"hello");
    }

    #[test]
    fn lists_a_directory_below_the_root_only() {
        let root = tempfile::tempdir().unwrap();
        fs_err::create_dir_all(root.path().join("d/sub")).unwrap();
        fs_err::write(root.path().join("d/b"), "").unwrap();
        fs_err::write(root.path().join("d/a"), "").unwrap();
        let names = read_dir(root.path(), Path::new("d")).unwrap();
        assert_eq!(names, ["a", "b", "sub"]);
        std::os::unix::fs::symlink(root.path().join("d"), root.path().join("l")).unwrap();
        for bad in ["l", "../d", "/etc"] {
            let error = read_dir(root.path(), Path::new(bad)).unwrap_err();
            assert!(
                matches!(
                    error,
                    ContainedError::Link { .. } | ContainedError::Outside { .. }
                ),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn refuses_parents_and_absolute_paths() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["../etc/passwd", "/etc/passwd", "a/../../x", ""] {
            let error = ContainedFile::open(root.path(), Path::new(bad)).unwrap_err();
            assert!(
                matches!(error, ContainedError::Outside { .. }),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn a_link_in_a_directory_on_the_way_is_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs_err::write(outside.path().join("secret"), "root:x:0:0\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dir")).unwrap();
        let error = ContainedFile::open(root.path(), Path::new("dir/secret")).unwrap_err();
        assert!(matches!(error, ContainedError::Link { .. }), "{error}");
        assert!(!error.to_string().contains("root:x"), "{error}");
    }

    #[test]
    fn a_file_that_grew_or_shrank_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("f");
        fs_err::write(&path, "12345").unwrap();
        let file = ContainedFile::open(root.path(), Path::new("f")).unwrap();
        fs_err::write(&path, "1234567890").unwrap();
        let error = file.read_to_vec(100).unwrap_err();
        assert!(
            error.to_string().contains("grew past the 5 bytes"),
            "{error}"
        );
        let file = ContainedFile::open(root.path(), Path::new("f")).unwrap();
        fs_err::write(&path, "1").unwrap();
        let error = file.read_to_vec(100).unwrap_err();
        assert!(
            error.to_string().contains("1 bytes read of the 10"),
            "{error}"
        );
    }

    #[test]
    fn a_second_open_must_find_the_planned_file() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("f");
        fs_err::write(&path, "12345").unwrap();
        let planned = ContainedFile::open(root.path(), Path::new("f"))
            .unwrap()
            .identity();
        ContainedFile::open_planned(root.path(), Path::new("f"), planned).unwrap();
        // Written while `f` exists, `g` has another inode; then it takes `f`'s place.
        fs_err::write(root.path().join("g"), "54321").unwrap();
        fs_err::rename(root.path().join("g"), &path).unwrap();
        let error = ContainedFile::open_planned(root.path(), Path::new("f"), planned).unwrap_err();
        assert!(matches!(error, ContainedError::Changed { .. }), "{error}");
    }

    #[test]
    fn a_too_large_file_is_refused_before_reading() {
        let root = tempfile::tempdir().unwrap();
        fs_err::write(root.path().join("f"), vec![b'x'; 100]).unwrap();
        let error = ContainedFile::open(root.path(), Path::new("f"))
            .unwrap()
            .read_to_vec(10)
            .unwrap_err();
        assert!(
            matches!(
                error,
                ContainedError::TooLarge {
                    size: 100,
                    limit: 10,
                    ..
                }
            ),
            "{error}"
        );
    }
}
