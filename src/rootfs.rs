//! Path resolution inside an image root on disk.
//!
//! An assembled image lives in a host directory, but its symlinks are written for the
//! container: an absolute target such as `/usr/local/cuda/lib64` means `<root>/usr/local/...`,
//! never the host's `/usr/local`. Everything that follows links in a staged root (the
//! installer, the ld.so.cache writer, the audit) goes through [`resolve_in_root`], which never
//! leaves the root.
//!
//! Shared vocabulary at the bottom of the dependency order: it depends on `std` only, so
//! `install`, `stack` and `audit` can all use it without depending on each other (it used to
//! be `audit::rootfs`, which made install depend on audit).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Linux gives up after 40 links (`ELOOP`); so do we.
const MAX_LINKS: usize = 40;

/// The outcome of resolving an image path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The fully resolved image path (absolute, no symlinks) of an existing object.
    Found(PathBuf),
    /// Some component does not exist (or is not a directory): `at` is the first image path
    /// that could not be found.
    Missing { at: PathBuf },
    /// More than 40 symlinks were followed.
    Loop,
}

/// The host path of an image path: `root` joined with `image_path` minus its leading `/`.
pub fn host_path(root: &Path, image_path: &Path) -> PathBuf {
    match image_path.strip_prefix("/") {
        Ok(relative) => root.join(relative),
        Err(_) => root.join(image_path),
    }
}

/// What lies at an image path, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    /// A regular file: its permission bits and size.
    File {
        mode: u32,
        size: u64,
    },
    /// A symlink and its target, as written.
    Symlink(PathBuf),
    /// A device, fifo or socket.
    Other,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        matches!(self, Node::Dir)
    }
}

/// The node at `image_path` of the root in the host directory `root`; None when it or a
/// parent does not exist (or a parent is not a directory). The parents must be directories
/// of the root, not links: [`resolve_with`] only asks for such paths.
pub fn dir_node(root: &Path, image_path: &Path) -> io::Result<Option<Node>> {
    use std::os::unix::fs::PermissionsExt;
    let host = host_path(root, image_path);
    let metadata = match std::fs::symlink_metadata(&host) {
        Ok(metadata) => metadata,
        Err(error)
            if error.kind() == io::ErrorKind::NotFound
                || error.raw_os_error() == Some(20 /* ENOTDIR */) =>
        {
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    let file_type = metadata.file_type();
    Ok(Some(if file_type.is_symlink() {
        Node::Symlink(std::fs::read_link(&host)?)
    } else if file_type.is_dir() {
        Node::Dir
    } else if file_type.is_file() {
        Node::File {
            mode: metadata.permissions().mode(),
            size: metadata.len(),
        }
    } else {
        Node::Other
    }))
}

/// Resolve `image_path` (absolute inside the image) following every symlink inside `root`.
pub fn resolve_in_root(root: &Path, image_path: &Path) -> io::Result<Resolution> {
    resolve_with(&|path: &Path| dir_node(root, path), image_path)
}

/// Resolve `image_path` following every symlink, in a root seen through `node` (which
/// answers for paths whose parents are resolved directories): a directory on disk, or
/// layers seen as one.
pub fn resolve_with(
    node: &dyn Fn(&Path) -> io::Result<Option<Node>>,
    image_path: &Path,
) -> io::Result<Resolution> {
    let mut pending: VecDeque<OsString> = VecDeque::new();
    push_components(&mut pending, image_path, false);
    let mut current = PathBuf::from("/");
    let mut links = 0;
    while let Some(component) = pending.pop_front() {
        if component == ".." {
            current.pop();
            continue;
        }
        let candidate = current.join(&component);
        match node(&candidate)? {
            None => return Ok(Resolution::Missing { at: candidate }),
            Some(Node::Symlink(target)) => {
                links += 1;
                if links > MAX_LINKS {
                    return Ok(Resolution::Loop);
                }
                if target.is_absolute() {
                    current = PathBuf::from("/");
                }
                push_components(&mut pending, &target, true);
            }
            Some(found) => {
                if !pending.is_empty() && !found.is_dir() {
                    return Ok(Resolution::Missing { at: candidate });
                }
                current = candidate;
            }
        }
    }
    Ok(Resolution::Found(current))
}

/// Queue the components of `path` (at the front when `front`), keeping `..` for the walk.
fn push_components(pending: &mut VecDeque<OsString>, path: &Path, front: bool) {
    let components: Vec<OsString> = path
        .components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    if front {
        for component in components.into_iter().rev() {
            pending.push_front(component);
        }
    } else {
        pending.extend(components);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn absolute_links_stay_in_the_root() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        std::fs::create_dir_all(root.join("usr/local/cuda-12.1/lib")).unwrap();
        std::fs::write(root.join("usr/local/cuda-12.1/lib/libx.so.1"), b"x").unwrap();
        symlink("/usr/local/cuda-12.1", root.join("usr/local/cuda")).unwrap();
        symlink("libx.so.1", root.join("usr/local/cuda-12.1/lib/libx.so")).unwrap();
        assert_eq!(
            resolve_in_root(root, Path::new("/usr/local/cuda/lib/libx.so")).unwrap(),
            Resolution::Found(PathBuf::from("/usr/local/cuda-12.1/lib/libx.so.1"))
        );
        // A link climbing above the root stops at the root, as in the container.
        symlink("../../../../../usr/local/cuda", root.join("usr/local/up")).unwrap();
        assert_eq!(
            resolve_in_root(root, Path::new("/usr/local/up/lib/libx.so.1")).unwrap(),
            Resolution::Found(PathBuf::from("/usr/local/cuda-12.1/lib/libx.so.1"))
        );
        // /etc/passwd exists on the host, not in the root.
        symlink("/etc/passwd", root.join("usr/local/host")).unwrap();
        assert_eq!(
            resolve_in_root(root, Path::new("/usr/local/host")).unwrap(),
            Resolution::Missing {
                at: PathBuf::from("/etc")
            }
        );
    }

    #[test]
    fn loops_are_detected() {
        let temp = tempfile::tempdir().unwrap();
        symlink("b", temp.path().join("a")).unwrap();
        symlink("a", temp.path().join("b")).unwrap();
        assert_eq!(
            resolve_in_root(temp.path(), Path::new("/a")).unwrap(),
            Resolution::Loop
        );
    }
}
