//! One copy of every library: make the nvidia-* wheels' `nvidia/*/lib` files and the CUDA
//! toolkit's `targets/<arch>/lib` files one set of bytes.
//!
//! PyPI torch wheels load CUDA and cuDNN from `site-packages/nvidia/*/lib` (their RUNPATH);
//! extension builds link `-lcudnn` from the toolkit. Two copies double the image and let
//! versions drift. Given an assembled root, [`plan_one_copy`] pairs each wheel library with
//! the toolkit file of the same name (or the same SONAME), and when both have the same
//! digest plans a symlink replacing one with a link to the other. Differing copies are
//! reported, never linked: that is a version skew for the audit to explain.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{EntryContent, InstallEntry};
use crate::audit::rootfs::{host_path, resolve_in_root, Resolution};
use crate::digest::{Digest, HashingWriter};
use crate::elf::{read_elf, ElfProbe};

#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    #[error("failed to read `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Elf(#[from] crate::elf::ElfError),
}

/// Which copy survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Keep the toolkit's file; the wheel's copy becomes a link to it.
    Toolkit,
    /// Keep the wheel's file; the toolkit's copy becomes a link to it.
    Wheel,
}

/// A pair of identical files that the plan merges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MergedCopy {
    pub wheel_file: PathBuf,
    /// The toolkit name the wheel file matched (may itself be a link of the chain).
    pub toolkit_name: PathBuf,
    /// The toolkit's regular file (the chain resolved).
    pub toolkit_file: PathBuf,
    pub digest: Digest,
    pub size: u64,
}

/// A pair with the same name or SONAME but different bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DifferingCopy {
    pub wheel_file: PathBuf,
    pub toolkit_file: PathBuf,
    pub wheel_digest: Digest,
    pub toolkit_digest: Digest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DedupPlan {
    /// Symlink entries to apply (with [`super::apply_entries`] or a layer writer), sorted.
    pub entries: Vec<InstallEntry>,
    pub merged: Vec<MergedCopy>,
    pub differing: Vec<DifferingCopy>,
    /// Bytes the image no longer holds twice.
    pub saved_bytes: u64,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> DedupError + '_ {
    move |source| DedupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn file_digest(path: &Path) -> Result<(Digest, u64), DedupError> {
    let mut file = std::fs::File::open(path).map_err(io_error(path))?;
    let mut sink = HashingWriter::new(std::io::sink());
    std::io::copy(&mut file, &mut sink).map_err(io_error(path))?;
    let (_, digest, size) = sink.finish();
    Ok((digest, size))
}

/// Plan links between the wheel library directories and the toolkit library directory,
/// all image paths inside `root` (e.g. `/usr/local/lib/python3.11/site-packages/nvidia/cudnn/lib`
/// and `/usr/local/cuda-12.1/targets/x86_64-linux/lib`). Link targets are absolute image
/// paths, so the link resolves the same wherever the layer is unpacked.
pub fn plan_one_copy(
    root: &Path,
    wheel_lib_dirs: &[PathBuf],
    toolkit_lib_dir: &Path,
    keep: Keep,
) -> Result<DedupPlan, DedupError> {
    let mut plan = DedupPlan {
        entries: Vec::new(),
        merged: Vec::new(),
        differing: Vec::new(),
        saved_bytes: 0,
    };
    let mut wheel_dirs = wheel_lib_dirs.to_vec();
    wheel_dirs.sort();
    for wheel_dir in &wheel_dirs {
        let host_dir = host_path(root, wheel_dir);
        let mut names: Vec<String> = Vec::new();
        for item in std::fs::read_dir(&host_dir).map_err(io_error(&host_dir))? {
            let item = item.map_err(io_error(&host_dir))?;
            if item.file_type().map_err(io_error(&host_dir))?.is_file() {
                names.push(item.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        for name in names {
            let wheel_file = wheel_dir.join(&name);
            let wheel_host = host_path(root, &wheel_file);
            let mut candidates = vec![name.clone()];
            if name.contains(".so") {
                if let ElfProbe::Elf(info) = read_elf(&wheel_host)? {
                    if let Some(soname) = info.soname.filter(|s| *s != name && !s.contains('/')) {
                        candidates.push(soname);
                    }
                }
            }
            let mut matched = None;
            for candidate in candidates {
                let toolkit_name = toolkit_lib_dir.join(&candidate);
                if let Resolution::Found(resolved) =
                    resolve_in_root(root, &toolkit_name).map_err(io_error(&toolkit_name))?
                {
                    if host_path(root, &resolved).is_file() {
                        matched = Some((toolkit_name, resolved));
                        break;
                    }
                }
            }
            let Some((toolkit_name, toolkit_file)) = matched else {
                continue;
            };
            let (wheel_digest, size) = file_digest(&wheel_host)?;
            let (toolkit_digest, _) = file_digest(&host_path(root, &toolkit_file))?;
            if wheel_digest != toolkit_digest {
                plan.differing.push(DifferingCopy {
                    wheel_file,
                    toolkit_file,
                    wheel_digest,
                    toolkit_digest,
                });
                continue;
            }
            let (path, target) = match keep {
                Keep::Toolkit => (wheel_file.clone(), toolkit_name.clone()),
                Keep::Wheel => (toolkit_file.clone(), wheel_file.clone()),
            };
            plan.entries.push(InstallEntry {
                path,
                mode: 0o777,
                content: EntryContent::Symlink { target },
            });
            plan.saved_bytes += size;
            plan.merged.push(MergedCopy {
                wheel_file,
                toolkit_name,
                toolkit_file,
                digest: wheel_digest,
                size,
            });
        }
    }
    plan.entries.sort_by(|a, b| a.path.cmp(&b.path));
    plan.entries.dedup_by(|a, b| a.path == b.path);
    Ok(plan)
}
