//! What the audit reads of one layer, recorded once: every node of its tree, the ELF facts,
//! GPU code and digest of every file that may be a library or program, and the small texts
//! the audit reads (a dist-info's METADATA, `cudnn_version.h`, ld.so.conf). A layer's facts
//! depend on its contents only, so they are kept by its diff_id: a rebuild that changes
//! the team's layers audits the stack's from their facts and never reads their 5 GB again,
//! and [`FactsFs`] answers the audit as the tree itself would.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use super::image::{ImageFs, Owner};
use super::inventory::{in_binary_dir, looks_like_library};
use crate::digest::Digest;
use crate::elf::fatbin::{DeviceCode, FatbinError};
use crate::elf::{ElfError, ElfProbe};
use crate::rootfs::Node;

/// Files read at once (ELF headers, fatbin headers): small reads spread over large files,
/// which a few threads overlap well.
const READ_THREADS: usize = 8;

/// One node of a layer's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum RecordedNode {
    Dir,
    File { mode: u32, size: u64 },
    Symlink { target: PathBuf },
    Other,
}

/// What reading a file as ELF gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum RecordedElf {
    Elf {
        info: Box<crate::elf::ElfInfo>,
        /// Its GPU code, when it has a fatbin.
        device_code: Option<Box<DeviceCode>>,
        /// Why its fatbin could not be read.
        malformed_fatbin: Option<String>,
        digest: Digest,
    },
    Malformed {
        reason: String,
    },
}

/// The facts of one layer's tree (see the module's text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerFacts {
    nodes: BTreeMap<PathBuf, RecordedNode>,
    /// The owner of every node (as the tree had them when recorded).
    owners: BTreeMap<PathBuf, Owner>,
    /// Files that may be ELF and are (or claim to be and are malformed); a file of the
    /// tree not here is not ELF.
    elf: BTreeMap<PathBuf, RecordedElf>,
    texts: BTreeMap<PathBuf, String>,
}

impl LayerFacts {
    /// Read the facts of the image `fs` (one layer's tree): one walk, then the files that
    /// may be ELF on a few threads.
    pub fn read(fs: &dyn ImageFs) -> io::Result<Self> {
        let mut facts = LayerFacts::default();
        let mut may_be_elf = Vec::new();
        let mut dirs = vec![PathBuf::from("/")];
        while let Some(dir) = dirs.pop() {
            for name in fs.list(&dir)? {
                let path = dir.join(&name);
                let Some(node) = fs.node(&path)? else {
                    continue;
                };
                let recorded = match node {
                    Node::Dir => {
                        dirs.push(path.clone());
                        RecordedNode::Dir
                    }
                    Node::File { mode, size } => {
                        if looks_like_library(&name) || (mode & 0o111 != 0 && in_binary_dir(&path))
                        {
                            may_be_elf.push(path.clone());
                        }
                        if is_text_the_audit_reads(&path) {
                            facts.texts.insert(path.clone(), fs.read_text(&path)?);
                        }
                        RecordedNode::File { mode, size }
                    }
                    Node::Symlink(target) => RecordedNode::Symlink { target },
                    Node::Other => RecordedNode::Other,
                };
                if let Some(owner) = fs.owner(&path)? {
                    facts.owners.insert(path.clone(), owner);
                }
                facts.nodes.insert(path, recorded);
            }
        }
        for (path, elf) in read_in_parallel(&may_be_elf, |path| read_elf_facts(fs, path)) {
            if let Some(elf) = elf? {
                facts.elf.insert(path.clone(), elf);
            }
        }
        Ok(facts)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("facts serialise")
    }

    pub fn from_json(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The texts the audit reads whole: a distribution's METADATA, the cuDNN version header,
/// and the loader's configuration.
fn is_text_the_audit_reads(path: &Path) -> bool {
    let in_dist_info = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|dir| dir.to_string_lossy().ends_with(".dist-info"));
    (in_dist_info && path.file_name().is_some_and(|name| name == "METADATA"))
        || path
            .file_name()
            .is_some_and(|name| name == "cudnn_version.h")
        || path.starts_with("/etc/ld.so.conf")
        || path.starts_with("/etc/ld.so.conf.d")
}

/// The ELF facts of one file; None when it is not ELF.
fn read_elf_facts(fs: &dyn ImageFs, path: &Path) -> io::Result<Option<RecordedElf>> {
    let info = match fs.elf(path) {
        Ok(ElfProbe::Elf(info)) => info,
        Ok(ElfProbe::NotElf) => return Ok(None),
        Err(ElfError::Malformed { reason, .. }) => {
            return Ok(Some(RecordedElf::Malformed { reason }))
        }
        Err(ElfError::Io { source, .. }) => return Err(source),
    };
    let (device_code, malformed_fatbin) = match fs.device_code(path) {
        Ok(code) => (code.map(Box::new), None),
        Err(FatbinError::Io { source, .. }) => return Err(source),
        Err(error) => (None, Some(error.to_string())),
    };
    Ok(Some(RecordedElf::Elf {
        info: Box::new(info),
        device_code,
        malformed_fatbin,
        digest: fs.digest(path)?,
    }))
}

/// `read` of every path, on up to [`READ_THREADS`] threads, in the order of `paths`.
pub(super) fn read_in_parallel<T: Send>(
    paths: &[PathBuf],
    read: impl Fn(&Path) -> T + Sync,
) -> Vec<(&PathBuf, T)> {
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, READ_THREADS);
    let mut results: Vec<(usize, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = paths.get(index) else {
                            break;
                        };
                        out.push((index, read(path)));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.sort_by_key(|(index, _)| *index);
    results
        .into_iter()
        .map(|(index, value)| (&paths[index], value))
        .collect()
}

/// A layer seen through its recorded facts: the audit reads it as it would read its tree.
pub struct FactsFs {
    facts: LayerFacts,
    /// Directory -> the names in it, sorted.
    children: BTreeMap<PathBuf, Vec<String>>,
}

impl FactsFs {
    pub fn new(facts: LayerFacts) -> Self {
        let mut children: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
        children.insert(PathBuf::from("/"), Vec::new());
        for path in facts.nodes.keys() {
            if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
                children
                    .entry(parent.to_path_buf())
                    .or_default()
                    .push(name.to_string_lossy().into_owned());
            }
        }
        for names in children.values_mut() {
            names.sort();
        }
        Self { facts, children }
    }

    fn not_recorded(path: &Path, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the layer's recorded facts have no {what} for {}",
                path.display()
            ),
        )
    }
}

impl ImageFs for FactsFs {
    fn node(&self, path: &Path) -> io::Result<Option<Node>> {
        if path == Path::new("/") {
            return Ok(Some(Node::Dir));
        }
        Ok(self.facts.nodes.get(path).map(|node| match node {
            RecordedNode::Dir => Node::Dir,
            RecordedNode::File { mode, size } => Node::File {
                mode: *mode,
                size: *size,
            },
            RecordedNode::Symlink { target } => Node::Symlink(target.clone()),
            RecordedNode::Other => Node::Other,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        Ok(self.children.get(dir).cloned().unwrap_or_default())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.facts
            .texts
            .get(path)
            .map(|text| text.clone().into_bytes())
            .ok_or_else(|| Self::not_recorded(path, "text"))
    }

    fn elf(&self, path: &Path) -> Result<ElfProbe, ElfError> {
        Ok(match self.facts.elf.get(path) {
            Some(RecordedElf::Elf { info, .. }) => ElfProbe::Elf(info.as_ref().clone()),
            Some(RecordedElf::Malformed { reason }) => {
                return Err(ElfError::Malformed {
                    path: path.to_path_buf(),
                    reason: reason.clone(),
                })
            }
            None => ElfProbe::NotElf,
        })
    }

    fn device_code(&self, path: &Path) -> Result<Option<DeviceCode>, FatbinError> {
        match self.facts.elf.get(path) {
            Some(RecordedElf::Elf {
                malformed_fatbin: Some(reason),
                ..
            }) => Err(FatbinError::Recorded {
                path: path.to_path_buf(),
                message: reason.clone(),
            }),
            Some(RecordedElf::Elf { device_code, .. }) => Ok(device_code.as_deref().cloned()),
            _ => Ok(None),
        }
    }

    fn digest(&self, path: &Path) -> io::Result<Digest> {
        match self.facts.elf.get(path) {
            Some(RecordedElf::Elf { digest, .. }) => Ok(*digest),
            _ => Err(Self::not_recorded(path, "digest")),
        }
    }

    fn owner(&self, path: &Path) -> io::Result<Option<Owner>> {
        Ok(self.facts.owners.get(path).copied())
    }
}
