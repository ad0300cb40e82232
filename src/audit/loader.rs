//! How ld.so finds libraries inside the root: the default directories, `/etc/ld.so.conf`
//! (with its `include` globs), and a cache of ELF headers so each file is read once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::image::{DirFs, ImageFs};
use super::{io_error, AuditError};
use crate::elf::{ElfClass, ElfError, ElfInfo, ElfProbe, Machine};
use crate::rootfs::{Node, Resolution};

/// The loader's built-in search directories (glibc on Debian/Ubuntu/RHEL: the trusted
/// directories plus the multiarch ones ldconfig caches by default), for x86_64 and
/// aarch64 images alike: a directory of the other architecture cannot satisfy a NEEDED,
/// because every candidate must match the requester's ELF class and machine.
pub const DEFAULT_LIBRARY_DIRS: &[&str] = &[
    "/lib",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
];

/// The directories named by `/etc/ld.so.conf` inside the root, following `include` lines
/// (with `*` globs in the last component, as ldconfig does), in file order.
pub fn ld_so_conf_dirs(fs: &dyn ImageFs) -> Result<Vec<PathBuf>, AuditError> {
    fn read_conf(
        fs: &dyn ImageFs,
        file: &Path,
        depth: usize,
        out: &mut Vec<PathBuf>,
    ) -> Result<(), AuditError> {
        if depth > 8 {
            return Ok(());
        }
        let Resolution::Found(resolved) = fs.resolve(file).map_err(io_error(file))? else {
            return Ok(());
        };
        if !matches!(
            fs.node(&resolved).map_err(io_error(&resolved))?,
            Some(Node::File { .. })
        ) {
            return Ok(());
        }
        let text = fs.read_text(&resolved).map_err(io_error(&resolved))?;
        for raw in text.lines() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            if let Some(pattern) = line.strip_prefix("include") {
                for pattern in pattern.split_whitespace() {
                    let pattern = if pattern.starts_with('/') {
                        PathBuf::from(pattern)
                    } else {
                        file.parent().unwrap_or(Path::new("/")).join(pattern)
                    };
                    for included in glob_in_root(fs, &pattern)? {
                        read_conf(fs, &included, depth + 1, out)?;
                    }
                }
            } else if !line.starts_with("hwcap") {
                // `dir` or the old `dir=TYPE` form.
                let dir = line.split('=').next().unwrap_or(line).trim();
                if dir.starts_with('/') {
                    out.push(PathBuf::from(dir));
                }
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    read_conf(fs, Path::new("/etc/ld.so.conf"), 0, &mut out)?;
    Ok(out)
}

/// Expand a `*` glob in the last component of `pattern`, inside the root, sorted.
fn glob_in_root(fs: &dyn ImageFs, pattern: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let (Some(dir), Some(last)) = (pattern.parent(), pattern.file_name()) else {
        return Ok(Vec::new());
    };
    let last = last.to_string_lossy();
    let Some((prefix, suffix)) = last.split_once('*') else {
        return Ok(vec![pattern.to_path_buf()]);
    };
    let Resolution::Found(resolved_dir) = fs.resolve(dir).map_err(io_error(dir))? else {
        return Ok(Vec::new());
    };
    let Ok(names) = fs.list(&resolved_dir) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<PathBuf> = names
        .into_iter()
        .filter(|name| {
            name.len() >= prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        })
        .map(|name| dir.join(name))
        .collect();
    out.sort();
    Ok(out)
}

/// The glibc release of the image at `root`: the newest `GLIBC_*` version its `libc.so.6`
/// (found through ld.so.conf and the default directories) defines. None without a glibc.
pub fn image_glibc(root: &Path) -> Result<Option<crate::elf::GlibcVersion>, AuditError> {
    let fs = DirFs::new(root);
    let mut dirs = ld_so_conf_dirs(&fs)?;
    dirs.extend(DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join("libc.so.6");
        if let Resolution::Found(resolved) = fs.resolve(&candidate).map_err(io_error(&candidate))? {
            match fs.elf(&resolved) {
                Ok(ElfProbe::Elf(info)) => return Ok(info.glibc_provided()),
                Ok(ElfProbe::NotElf) | Err(ElfError::Malformed { .. }) => continue,
                Err(ElfError::Io { path, source }) => return Err(AuditError::Io { path, source }),
            }
        }
    }
    Ok(None)
}

/// The loader's view of one root: its ld.so.conf directories, and every ELF header read at
/// most once.
pub(super) struct Loader<'a> {
    pub fs: &'a dyn ImageFs,
    pub ld_so_conf: Vec<PathBuf>,
    elf_cache: HashMap<PathBuf, Option<ElfInfo>>,
}

impl<'a> Loader<'a> {
    pub fn new(fs: &'a dyn ImageFs) -> Result<Self, AuditError> {
        Ok(Loader {
            fs,
            ld_so_conf: ld_so_conf_dirs(fs)?,
            elf_cache: HashMap::new(),
        })
    }

    /// Record a header the ELF scan has already read.
    pub fn remember(&mut self, image_path: &Path, info: &ElfInfo) {
        self.elf_cache
            .insert(image_path.to_path_buf(), Some(info.clone()));
    }

    pub fn elf_at(&mut self, image_path: &Path) -> Result<Option<ElfInfo>, AuditError> {
        if let Some(cached) = self.elf_cache.get(image_path) {
            return Ok(cached.clone());
        }
        let info = match self.fs.elf(image_path) {
            Ok(ElfProbe::Elf(info)) => Some(info),
            Ok(ElfProbe::NotElf) | Err(ElfError::Malformed { .. }) => None,
            Err(ElfError::Io { path, source }) => return Err(AuditError::Io { path, source }),
        };
        self.elf_cache
            .insert(image_path.to_path_buf(), info.clone());
        Ok(info)
    }

    /// Does `dir/name` exist inside the root as an ELF the loader would accept for an
    /// object of this class and machine?
    pub fn try_dir(
        &mut self,
        dir: &Path,
        name: &str,
        class: ElfClass,
        machine: Machine,
    ) -> Result<Option<PathBuf>, AuditError> {
        if !dir.is_absolute() {
            return Ok(None);
        }
        let candidate = dir.join(name);
        match self.fs.resolve(&candidate).map_err(io_error(&candidate))? {
            Resolution::Found(resolved) => {
                let accepted = self
                    .elf_at(&resolved)?
                    .is_some_and(|info| info.class == class && info.machine == machine);
                Ok(accepted.then_some(resolved))
            }
            _ => Ok(None),
        }
    }
}
