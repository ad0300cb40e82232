//! What the audit reads of an image's filesystem, behind one trait: its nodes, the names in
//! its directories, small text files, ELF headers, GPU code and file digests. The audit
//! never asks for more, so an image it reads need not lie in one directory: [`DirFs`] is a
//! root on disk, [`LayeredFs`] stacks several as the runtime stacks layers (without
//! copying or linking a file), and the stack's layers written straight from wheels
//! answer from their recorded facts.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::digest::{Digest, HashingWriter};
use crate::elf::fatbin::{read_device_code, DeviceCode, FatbinError};
use crate::elf::{read_elf, ElfError, ElfProbe};
use crate::rootfs::{dir_node, host_path, resolve_with, Node, Resolution};

/// An image's filesystem as the audit reads it. Paths are image paths (absolute inside the
/// image); every method but [`ImageFs::resolve`] takes paths whose parents are resolved
/// directories (no link among them), as [`ImageFs::resolve`] and a walk from `/` give.
pub trait ImageFs: Sync {
    /// What lies at `path`, a final symlink not followed; None when nothing does.
    fn node(&self, path: &Path) -> io::Result<Option<Node>>;
    /// The names in the directory at `path`, sorted.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The bytes of the file at `path` (the audit reads only small text files whole).
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The ELF header and dynamic sections of the file at `path`.
    fn elf(&self, path: &Path) -> Result<ElfProbe, ElfError>;
    /// The GPU code the file at `path` embeds; None for a file without a fatbin.
    fn device_code(&self, path: &Path) -> Result<Option<DeviceCode>, FatbinError>;
    /// The sha256 of the file at `path`.
    fn digest(&self, path: &Path) -> io::Result<Digest>;
    /// The owner and permission bits of what lies at `path` (not the audit's: the layers
    /// above read them where they write into a directory of this one).
    fn owner(&self, path: &Path) -> io::Result<Option<Owner>>;

    /// Resolve `path` following every symlink inside the image.
    fn resolve(&self, path: &Path) -> io::Result<Resolution> {
        resolve_with(&|candidate: &Path| self.node(candidate), path)
    }

    /// The text of the file at `path`, lossily decoded.
    fn read_text(&self, path: &Path) -> io::Result<String> {
        Ok(String::from_utf8_lossy(&self.read(path)?).into_owned())
    }
}

/// Who owns an entry, and its permission bits (`mode & 0o7777`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// An image root in a host directory.
#[derive(Debug, Clone)]
pub struct DirFs {
    root: PathBuf,
}

impl DirFs {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn host(&self, path: &Path) -> PathBuf {
        host_path(&self.root, path)
    }
}

impl ImageFs for DirFs {
    fn node(&self, path: &Path) -> io::Result<Option<Node>> {
        dir_node(&self.root, path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for item in std::fs::read_dir(self.host(dir))? {
            names.push(item?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(self.host(path))
    }

    fn elf(&self, path: &Path) -> Result<ElfProbe, ElfError> {
        read_elf(&self.host(path)).map_err(|error| match error {
            ElfError::Io { source, .. } => ElfError::Io {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    fn device_code(&self, path: &Path) -> Result<Option<DeviceCode>, FatbinError> {
        read_device_code(&self.host(path))
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        let mut file = std::fs::File::open(self.host(path))?;
        let mut sink = HashingWriter::new(io::sink());
        io::copy(&mut file, &mut sink)?;
        Ok(sink.finish().1)
    }

    fn owner(&self, path: &Path) -> io::Result<Option<Owner>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(self.host(path)) {
            Ok(meta) => Ok(Some(Owner {
                uid: meta.uid(),
                gid: meta.gid(),
                mode: meta.mode() & 0o7777,
            })),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// Layers seen as one filesystem, the upper winning, the way a container runtime stacks
/// them: a path is what the topmost layer holding it has there, a directory lists the names
/// of every layer's directory at that path down to a layer holding something else there,
/// and a layer's non-directory hides what the layers below hold under it. A layer's entries
/// are reached only through its own directories, so no lookup follows a link on the host.
pub struct LayeredFs<'a> {
    /// Bottom first.
    layers: Vec<&'a dyn ImageFs>,
    /// (layer, directory) -> how that layer reaches the directory.
    reach: Mutex<HashMap<(usize, PathBuf), Reach>>,
}

/// How one layer reaches a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// It and all its parents are directories of the layer.
    Dir,
    /// The layer does not hold it (or a parent).
    Missing,
    /// The layer holds a non-directory there or at a parent: it hides the layers below.
    NotDir,
}

impl<'a> LayeredFs<'a> {
    /// `layers` bottom first.
    pub fn new(layers: Vec<&'a dyn ImageFs>) -> Self {
        Self {
            layers,
            reach: Mutex::new(HashMap::new()),
        }
    }

    /// How layer `index` reaches the directory `dir`.
    fn reach(&self, index: usize, dir: &Path) -> io::Result<Reach> {
        let Some(parent) = dir.parent() else {
            return Ok(Reach::Dir);
        };
        let key = (index, dir.to_path_buf());
        if let Some(known) = self
            .reach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(*known);
        }
        let reach = match self.reach(index, parent)? {
            Reach::Dir => match self.layers[index].node(dir)? {
                None => Reach::Missing,
                Some(Node::Dir) => Reach::Dir,
                Some(_) => Reach::NotDir,
            },
            other => other,
        };
        self.reach
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, reach);
        Ok(reach)
    }

    /// The topmost layer holding `path`, with its node there.
    fn owner_layer(&self, path: &Path) -> io::Result<Option<(usize, Node)>> {
        let parent = path.parent().unwrap_or(Path::new("/"));
        for index in (0..self.layers.len()).rev() {
            match self.reach(index, parent)? {
                Reach::Dir => {
                    if let Some(node) = self.layers[index].node(path)? {
                        return Ok(Some((index, node)));
                    }
                }
                Reach::NotDir => return Ok(None),
                Reach::Missing => {}
            }
        }
        Ok(None)
    }

    /// The layer whose file is at `path`, or NotFound.
    fn file_layer(&self, path: &Path) -> io::Result<&'a dyn ImageFs> {
        match self.owner_layer(path)? {
            Some((index, _)) => Ok(self.layers[index]),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is in no layer", path.display()),
            )),
        }
    }
}

impl ImageFs for LayeredFs<'_> {
    fn node(&self, path: &Path) -> io::Result<Option<Node>> {
        Ok(self.owner_layer(path)?.map(|(_, node)| node))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for index in (0..self.layers.len()).rev() {
            match self.reach(index, dir)? {
                Reach::Dir => names.extend(self.layers[index].list(dir)?),
                Reach::NotDir => break,
                Reach::Missing => {}
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.file_layer(path)?.read(path)
    }

    fn elf(&self, path: &Path) -> Result<ElfProbe, ElfError> {
        self.file_layer(path)
            .map_err(|source| ElfError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .elf(path)
    }

    fn device_code(&self, path: &Path) -> Result<Option<DeviceCode>, FatbinError> {
        self.file_layer(path)
            .map_err(|source| FatbinError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .device_code(path)
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        self.file_layer(path)?.digest(path)
    }

    fn owner(&self, path: &Path) -> io::Result<Option<Owner>> {
        match self.owner_layer(path)? {
            Some((index, _)) => self.layers[index].owner(path),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(root: &Path, path: &str, bytes: &[u8]) {
        let host = root.join(path);
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::write(host, bytes).unwrap();
    }

    /// Upper files win, directories merge, and links resolve across layers.
    #[test]
    fn layers_are_seen_as_the_runtime_stacks_them() {
        let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(lower.path(), "usr/lib/libx.so.1", b"lower");
        write(lower.path(), "usr/lib/liby.so.1", b"only lower");
        write(upper.path(), "usr/lib/libx.so.1", b"upper");
        write(upper.path(), "opt/z", b"z");
        symlink("/usr/lib/liby.so.1", upper.path().join("opt/y")).unwrap();
        let (lower_fs, upper_fs) = (DirFs::new(lower.path()), DirFs::new(upper.path()));
        let merged = LayeredFs::new(vec![&lower_fs, &upper_fs]);
        assert_eq!(
            merged.read(Path::new("/usr/lib/libx.so.1")).unwrap(),
            b"upper"
        );
        assert_eq!(
            merged.list(Path::new("/usr/lib")).unwrap(),
            ["libx.so.1", "liby.so.1"]
        );
        assert_eq!(merged.list(Path::new("/")).unwrap(), ["opt", "usr"]);
        assert_eq!(
            merged.resolve(Path::new("/opt/y")).unwrap(),
            Resolution::Found(PathBuf::from("/usr/lib/liby.so.1"))
        );
        assert_eq!(
            merged.digest(Path::new("/usr/lib/liby.so.1")).unwrap(),
            Digest::of_bytes(b"only lower")
        );
        assert!(merged
            .node(Path::new("/usr/lib/libnone.so"))
            .unwrap()
            .is_none());
    }

    /// A lower layer's link under an upper layer's directory of the same name is not
    /// followed on the host: the link's target (here the host's /etc) never shows.
    #[test]
    fn a_lower_link_under_an_upper_directory_is_not_followed() {
        let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        symlink("/etc", lower.path().join("data")).unwrap();
        write(upper.path(), "data/own", b"own");
        let (lower_fs, upper_fs) = (DirFs::new(lower.path()), DirFs::new(upper.path()));
        let merged = LayeredFs::new(vec![&lower_fs, &upper_fs]);
        assert_eq!(merged.list(Path::new("/data")).unwrap(), ["own"]);
        assert!(merged.node(Path::new("/data/passwd")).unwrap().is_none());
        // And a file of a middle layer hides the directory below it.
        let middle = tempfile::tempdir().unwrap();
        write(lower.path(), "opt/tool/bin", b"lower");
        write(middle.path(), "opt/tool", b"a file now");
        let middle_fs = DirFs::new(middle.path());
        let merged = LayeredFs::new(vec![&lower_fs, &middle_fs]);
        assert!(merged.node(Path::new("/opt/tool/bin")).unwrap().is_none());
        assert_eq!(merged.read(Path::new("/opt/tool")).unwrap(), b"a file now");
    }
}
