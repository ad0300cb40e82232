//! Static audit of an assembled image root: the loader's view of the image, without running it.
//!
//! Runs after the layers are assembled into a directory (the image's `/`) and before the
//! image is written out; a report with findings fails the build with an explanation. Like
//! `lddtree` over the whole image:
//! - every ELF's `DT_NEEDED` resolves as ld.so would resolve it: `DT_RPATH` (only when there
//!   is no `DT_RUNPATH`), `LD_LIBRARY_PATH` (from the image config), `DT_RUNPATH` (`$ORIGIN`
//!   expanded), the `/etc/ld.so.conf(.d)` directories inside the root, then the default
//!   directories. Libraries the NVIDIA container runtime injects from the host driver are
//!   exempt ([`is_driver_library`]), as are the site MPI/UCX libraries of NVSHMEM's
//!   optional plugins ([`is_site_fabric_dependency`]), and so are SONAMEs the caller declares preloaded
//!   ([`AuditOptions::preloaded`]) when the image holds exactly one copy;
//! - the library a NEEDED resolved to defines every symbol version required from it
//!   (`GLIBC_2.34`: the "version not found" load failure), and every executable's program
//!   interpreter exists;
//! - one real file per SONAME (symlinks to one file are one copy);
//! - no dangling or looping symlinks (absolute targets resolve inside the root);
//! - `cudnn_version.h`, the `libcudnn.so.X.Y.Z` file names and the installed nvidia-cudnn
//!   wheel agree on the cuDNN version;
//! - installed distributions match the expected pins (e.g. torch's `Requires-Dist`).
//!
//! It reads, never writes: ELF headers only (see [`crate::elf`]), small text files, and file
//! digests only for the duplicate copies it reports. Simplifications against glibc, chosen
//! because cudastack images do not depend on them: `$ORIGIN` is the directory of the file as
//! it lies in the tree (not the path it was opened through), the RPATH of the loading
//! executable (python3 has none) is not inherited (the RPATH of loading libraries is), an already-loaded object with a matching SONAME is not
//! reused unless declared preloaded, and `$LIB`/`$PLATFORM` are not expanded.

pub mod pins;
pub mod rootfs;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::digest::{Digest, HashingWriter};
use crate::elf::{expand_origin, read_elf, ElfClass, ElfError, ElfInfo, ElfProbe, Machine};
use rootfs::{host_path, resolve_in_root, Resolution};

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

/// Top-level directories that hold no files of the image (mount points at run time).
const SKIPPED_TOP_DIRS: &[&str] = &["proc", "sys", "dev"];

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("image root `{path}` is not a directory")]
    NotARoot { path: PathBuf },
    #[error("failed to read `{path}` while auditing")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to audit against.
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// `LD_LIBRARY_PATH` of the image config, split on `:`.
    pub ld_library_path: Vec<PathBuf>,
    /// Expected distribution versions: project name -> version (e.g. from torch's
    /// `Requires-Dist: nvidia-cudnn-cu12==9.1.0.70`).
    pub pins: BTreeMap<String, String>,
    /// SONAMEs the application loads itself before the libraries that need them (torch's
    /// `_preload_cuda_deps` loads e.g. `libcublas.so.12` by path, and ld.so then satisfies
    /// any later NEEDED on that SONAME with the loaded copy). A NEEDED on one of these counts
    /// as resolved when exactly one real file in the image provides the SONAME; otherwise it
    /// is still a finding.
    pub preloaded: BTreeSet<String>,
}

impl AuditOptions {
    /// Split an `LD_LIBRARY_PATH` value as the loader does (`:` separated, empty entries
    /// ignored here because they mean the working directory, which an image cannot rely on).
    pub fn with_ld_library_path(mut self, value: &str) -> Self {
        self.ld_library_path = value
            .split(':')
            .filter(|entry| !entry.is_empty())
            .map(PathBuf::from)
            .collect();
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    UnresolvedNeeded,
    MissingSymbolVersion,
    MissingInterpreter,
    DuplicateSoname,
    DanglingSymlink,
    SymlinkLoop,
    MalformedElf,
    CudnnVersionMismatch,
    PinMismatch,
    DuplicateDistribution,
}

impl FindingKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            FindingKind::UnresolvedNeeded => "unresolved-needed",
            FindingKind::MissingSymbolVersion => "missing-symbol-version",
            FindingKind::MissingInterpreter => "missing-interpreter",
            FindingKind::DuplicateSoname => "duplicate-soname",
            FindingKind::DanglingSymlink => "dangling-symlink",
            FindingKind::SymlinkLoop => "symlink-loop",
            FindingKind::MalformedElf => "malformed-elf",
            FindingKind::CudnnVersionMismatch => "cudnn-version-mismatch",
            FindingKind::PinMismatch => "pin-mismatch",
            FindingKind::DuplicateDistribution => "duplicate-distribution",
        }
    }
}

/// One problem, with what proves it and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// Image paths involved, most relevant first.
    pub paths: Vec<PathBuf>,
    pub evidence: String,
    pub hint: String,
}

/// The audit result. Findings are sorted, so equal images give equal reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    pub elf_files: usize,
    pub needed_checked: usize,
    pub symlinks: usize,
    pub distributions: usize,
    pub findings: Vec<Finding>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    pub fn findings_of(&self, kind: FindingKind) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.kind == kind)
    }

    /// A human rendering for the terminal (the CLI prints this on stderr on failure).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "static audit: {} ELF files, {} DT_NEEDED entries, {} symlinks, {} Python distributions: {}",
            self.elf_files,
            self.needed_checked,
            self.symlinks,
            self.distributions,
            match self.findings.len() {
                0 => "clean".to_string(),
                1 => "1 finding".to_string(),
                n => format!("{n} findings"),
            }
        );
        for finding in &self.findings {
            let _ = writeln!(out, "error[{}]", finding.kind.as_str());
            for path in &finding.paths {
                let _ = writeln!(out, "  --> {}", path.display());
            }
            for line in finding.evidence.lines() {
                let _ = writeln!(out, "   |  {line}");
            }
            let _ = writeln!(out, "  hint: {}", finding.hint);
        }
        out
    }
}

/// Driver libraries the NVIDIA container runtime mounts from the host at run time; an
/// image must not ship them, so a NEEDED on them is expected to be unresolved in the image.
pub fn is_driver_library(name: &str) -> bool {
    matches!(
        name,
        "libcuda.so" | "libcuda.so.1" | "libcudadebugger.so.1" | "libnvcuvid.so.1"
    ) || name.starts_with("libnvidia-")
}

/// NVSHMEM's bootstrap and transport plugins (`nvshmem_bootstrap_mpi.so.3`,
/// `nvshmem_transport_ucx.so.3`, ...) link the cluster's own MPI / PMIx / OpenSHMEM / UCX /
/// libfabric, which must match the site's network stack and so come from the host or a
/// site module; NVSHMEM opens a plugin only when `NVSHMEM_BOOTSTRAP` or
/// `NVSHMEM_REMOTE_TRANSPORT` selects it. Those NEEDED entries of those plugins are
/// expected to be unresolved in the image (torch >= 2.9 pulls nvidia-nvshmem in).
pub fn is_site_fabric_dependency(requester: &Path, needed: &str) -> bool {
    let plugin = requester
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| {
            n.starts_with("nvshmem_bootstrap_") || n.starts_with("nvshmem_transport_")
        });
    plugin
        && [
            "libmpi.so",
            "liboshmem.so",
            "libpmix.so",
            "libucp.so",
            "libucs.so",
            "libuct.so",
            "libfabric.so",
        ]
        .iter()
        .any(|prefix| needed.starts_with(prefix))
}

/// A cuDNN version as one source states it; sources that only know the major leave the rest None.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CudnnClaim {
    source: String,
    path: PathBuf,
    parts: Vec<u64>,
}

impl CudnnClaim {
    fn text(&self) -> String {
        self.parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }
}

struct Installed {
    dist_info: PathBuf,
    name: String,
    version: String,
}

#[derive(Default)]
struct Inventory {
    symlinks: Vec<PathBuf>,
    candidates: Vec<PathBuf>,
    cudnn_headers: Vec<PathBuf>,
    cudnn_library_names: Vec<PathBuf>,
    dist_infos: Vec<PathBuf>,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
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

fn walk(root: &Path) -> Result<Inventory, AuditError> {
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

/// The directories named by `/etc/ld.so.conf` inside the root, following `include` lines
/// (with `*` globs in the last component, as ldconfig does), in file order.
pub fn ld_so_conf_dirs(root: &Path) -> Result<Vec<PathBuf>, AuditError> {
    fn read_conf(
        root: &Path,
        file: &Path,
        depth: usize,
        out: &mut Vec<PathBuf>,
    ) -> Result<(), AuditError> {
        if depth > 8 {
            return Ok(());
        }
        let Resolution::Found(resolved) = resolve_in_root(root, file).map_err(io_error(file))?
        else {
            return Ok(());
        };
        let host = host_path(root, &resolved);
        if !host.is_file() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&host).map_err(io_error(&host))?;
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
                    for included in glob_in_root(root, &pattern)? {
                        read_conf(root, &included, depth + 1, out)?;
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
    read_conf(root, Path::new("/etc/ld.so.conf"), 0, &mut out)?;
    Ok(out)
}

/// Expand a `*` glob in the last component of `pattern`, inside the root, sorted.
fn glob_in_root(root: &Path, pattern: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let (Some(dir), Some(last)) = (pattern.parent(), pattern.file_name()) else {
        return Ok(Vec::new());
    };
    let last = last.to_string_lossy();
    let Some((prefix, suffix)) = last.split_once('*') else {
        return Ok(vec![pattern.to_path_buf()]);
    };
    let Resolution::Found(resolved_dir) = resolve_in_root(root, dir).map_err(io_error(dir))? else {
        return Ok(Vec::new());
    };
    let host_dir = host_path(root, &resolved_dir);
    let Ok(entries) = std::fs::read_dir(&host_dir) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
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
    let mut dirs = ld_so_conf_dirs(root)?;
    dirs.extend(DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join("libc.so.6");
        if let Resolution::Found(resolved) =
            resolve_in_root(root, &candidate).map_err(io_error(&candidate))?
        {
            let host = host_path(root, &resolved);
            match read_elf(&host) {
                Ok(ElfProbe::Elf(info)) => return Ok(info.glibc_provided()),
                Ok(ElfProbe::NotElf) | Err(ElfError::Malformed { .. }) => continue,
                Err(ElfError::Io { path, source }) => return Err(AuditError::Io { path, source }),
            }
        }
    }
    Ok(None)
}

/// Parse `#define CUDNN_MAJOR 9` / `CUDNN_MINOR` / `CUDNN_PATCHLEVEL` from cudnn_version.h.
pub fn parse_cudnn_header(text: &str) -> Option<(u64, u64, u64)> {
    let define = |name: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    };
    Some((
        define("CUDNN_MAJOR")?,
        define("CUDNN_MINOR")?,
        define("CUDNN_PATCHLEVEL")?,
    ))
}

fn numeric_parts(text: &str) -> Option<Vec<u64>> {
    text.split('.').map(|part| part.parse().ok()).collect()
}

/// Read Name and Version from a METADATA file's header block.
fn read_metadata(root: &Path, dist_info: &Path) -> Result<Option<(String, String)>, AuditError> {
    let metadata = host_path(root, &dist_info.join("METADATA"));
    let Ok(text) = std::fs::read_to_string(&metadata) else {
        return Ok(None);
    };
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("Name:") {
            name = Some(value.trim().to_string());
        } else if let Some(value) = line.strip_prefix("Version:") {
            version = Some(value.trim().to_string());
        }
    }
    Ok(name.zip(version))
}

fn file_digest(path: &Path) -> Result<Digest, AuditError> {
    let mut file = std::fs::File::open(path).map_err(io_error(path))?;
    let mut sink = HashingWriter::new(std::io::sink());
    std::io::copy(&mut file, &mut sink).map_err(io_error(path))?;
    Ok(sink.finish().1)
}

fn display_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        "(none)".into()
    } else {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// Versions equal under PEP 440, ignoring the installed local label when the pin has none
/// (`2.4.1` pins `2.4.1+cu121`, as `==` does).
fn version_matches(pin: &str, installed: &str) -> bool {
    use pep440_rs::Version;
    match (pin.parse::<Version>(), installed.parse::<Version>()) {
        (Ok(pin), Ok(installed)) => {
            if pin.local().is_empty() {
                pin == installed.without_local()
            } else {
                pin == installed
            }
        }
        _ => pin == installed,
    }
}

struct Auditor<'a> {
    root: &'a Path,
    ld_so_conf: Vec<PathBuf>,
    elf_cache: HashMap<PathBuf, Option<ElfInfo>>,
}

impl Auditor<'_> {
    fn elf_at(&mut self, image_path: &Path) -> Result<Option<ElfInfo>, AuditError> {
        if let Some(cached) = self.elf_cache.get(image_path) {
            return Ok(cached.clone());
        }
        let info = match read_elf(&host_path(self.root, image_path)) {
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
    fn try_dir(
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
        match resolve_in_root(self.root, &candidate).map_err(io_error(&candidate))? {
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

/// Search the DT_RPATH of `path`'s loaders, and theirs, for `needed` (only when `path`
/// itself has no DT_RUNPATH, as glibc does).
fn inherited_rpath_lookup(
    auditor: &mut Auditor<'_>,
    objects: &HashMap<&Path, &ElfInfo>,
    loaded_by: &HashMap<PathBuf, Vec<PathBuf>>,
    path: &Path,
    needed: &str,
) -> Result<Option<PathBuf>, AuditError> {
    let Some(requester) = objects.get(path) else {
        return Ok(None);
    };
    if !requester.runpath.is_empty() {
        return Ok(None);
    }
    let mut queue: Vec<PathBuf> = loaded_by.get(path).cloned().unwrap_or_default();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    while let Some(loader) = queue.pop() {
        if !seen.insert(loader.clone()) {
            continue;
        }
        if let Some(info) = objects.get(loader.as_path()) {
            if info.runpath.is_empty() && !info.rpath.is_empty() {
                let origin = loader.parent().unwrap_or(Path::new("/")).to_path_buf();
                for dir in info.expanded_rpath(&origin) {
                    if let Some(found) =
                        auditor.try_dir(&dir, needed, requester.class, requester.machine)?
                    {
                        return Ok(Some(found));
                    }
                }
            }
        }
        queue.extend(loaded_by.get(&loader).cloned().unwrap_or_default());
    }
    Ok(None)
}

/// Audit the image root at `root` (a directory holding the image's `/`).
pub fn audit(root: &Path, options: &AuditOptions) -> Result<AuditReport, AuditError> {
    if !root.is_dir() {
        return Err(AuditError::NotARoot {
            path: root.to_path_buf(),
        });
    }
    let inventory = walk(root)?;
    let mut auditor = Auditor {
        root,
        ld_so_conf: ld_so_conf_dirs(root)?,
        elf_cache: HashMap::new(),
    };
    let mut findings = Vec::new();

    // Symlinks.
    for link in &inventory.symlinks {
        match resolve_in_root(root, link).map_err(io_error(link))? {
            Resolution::Found(_) => {}
            Resolution::Missing { at } => {
                let target = std::fs::read_link(host_path(root, link)).map_err(io_error(link))?;
                findings.push(Finding {
                    kind: FindingKind::DanglingSymlink,
                    paths: vec![link.clone()],
                    evidence: format!(
                        "points to `{}`; `{}` does not exist in the image",
                        target.display(),
                        at.display()
                    ),
                    hint: "copy the target with the link (`cp -P` / keep the whole symlink chain), or remove the link".into(),
                });
            }
            Resolution::Loop => findings.push(Finding {
                kind: FindingKind::SymlinkLoop,
                paths: vec![link.clone()],
                evidence: "more than 40 symlinks followed".into(),
                hint: "break the cycle of links".into(),
            }),
        }
    }

    // ELF files: read each once; index SONAME providers and file names.
    let mut objects: Vec<(PathBuf, ElfInfo)> = Vec::new();
    for path in &inventory.candidates {
        match read_elf(&host_path(root, path)) {
            Ok(ElfProbe::Elf(info)) => {
                auditor.elf_cache.insert(path.clone(), Some(info.clone()));
                objects.push((path.clone(), info));
            }
            Ok(ElfProbe::NotElf) => {}
            Err(ElfError::Malformed { reason, .. }) => findings.push(Finding {
                kind: FindingKind::MalformedElf,
                paths: vec![path.clone()],
                evidence: reason,
                hint: "the file is truncated or corrupt: re-fetch the artifact it came from".into(),
            }),
            Err(ElfError::Io { path, source }) => return Err(AuditError::Io { path, source }),
        }
    }
    let mut providers: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for (path, info) in &objects {
        if let Some(name) = path.file_name() {
            by_name
                .entry(name.to_string_lossy().into_owned())
                .or_default()
                .push(path.clone());
        }
        if let Some(soname) = &info.soname {
            by_name
                .entry(soname.clone())
                .or_default()
                .push(path.clone());
            // Link-time stubs (`.../stubs/libcuda.so`) are never on a search path.
            let is_stub = path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|d| d == "stubs");
            if !is_stub {
                providers
                    .entry(soname.clone())
                    .or_default()
                    .push(path.clone());
            }
        }
    }

    // DT_NEEDED resolution. Unresolved entries wait until every object has been looked at,
    // because glibc also searches the DT_RPATH of the objects that loaded the requester
    // (auditwheel's vendored `numpy.libs` rely on it).
    let mut needed_checked = 0;
    let mut loaded_by: HashMap<PathBuf, Vec<PathBuf>> = HashMap::new();
    let mut unresolved: Vec<(PathBuf, String, Finding)> = Vec::new();
    for (path, info) in &objects {
        let origin = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        if let Some(interpreter) = info.interpreter.as_deref().filter(|_| info.is_executable()) {
            if !matches!(
                resolve_in_root(root, Path::new(interpreter)).map_err(io_error(path))?,
                Resolution::Found(_)
            ) {
                findings.push(Finding {
                    kind: FindingKind::MissingInterpreter,
                    paths: vec![path.clone()],
                    evidence: format!("its program interpreter `{interpreter}` does not exist in the image"),
                    hint: "the binary was built for another C library or layout: use a build for this base image, or add the loader".into(),
                });
            }
        }
        // NEEDED name -> the file the loader would map.
        let mut resolved_needed: HashMap<&str, PathBuf> = HashMap::new();
        for needed in &info.needed {
            needed_checked += 1;
            if is_driver_library(needed) || is_site_fabric_dependency(path, needed) {
                continue;
            }
            if needed.contains('/') {
                let target = if needed.starts_with('/') {
                    PathBuf::from(needed)
                } else {
                    origin.join(needed)
                };
                if let Resolution::Found(resolved) =
                    resolve_in_root(root, &target).map_err(io_error(&target))?
                {
                    loaded_by
                        .entry(resolved.clone())
                        .or_default()
                        .push(path.clone());
                    resolved_needed.insert(needed, resolved);
                    continue;
                }
            }
            let rpath = if info.runpath.is_empty() {
                info.expanded_rpath(&origin)
            } else {
                Vec::new()
            };
            let ld_library_path: Vec<PathBuf> = options
                .ld_library_path
                .iter()
                .map(|dir| expand_origin(&dir.to_string_lossy(), &origin))
                .collect();
            let runpath = info.expanded_runpath(&origin);
            let conf = auditor.ld_so_conf.clone();
            let defaults: Vec<PathBuf> = DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from).collect();
            let mut found = None;
            for dir in rpath
                .iter()
                .chain(&ld_library_path)
                .chain(&runpath)
                .chain(&conf)
                .chain(&defaults)
            {
                found = auditor.try_dir(dir, needed, info.class, info.machine)?;
                if found.is_some() {
                    break;
                }
            }
            if found.is_none() && options.preloaded.contains(needed) {
                if let Some([only]) = providers.get(needed).map(Vec::as_slice) {
                    found = Some(only.clone());
                }
            }
            if let Some(resolved) = found {
                loaded_by
                    .entry(resolved.clone())
                    .or_default()
                    .push(path.clone());
                resolved_needed.insert(needed, resolved);
                continue;
            }
            let elsewhere: Vec<String> = by_name
                .get(needed)
                .map(|paths| paths.iter().map(|p| p.display().to_string()).collect())
                .unwrap_or_default();
            let mut evidence = format!("needs `{needed}`, which no search directory provides\n");
            if !info.rpath.is_empty() && info.runpath.is_empty() {
                let _ = writeln!(evidence, "RPATH: {}", display_dirs(&rpath));
            }
            let _ = writeln!(
                evidence,
                "LD_LIBRARY_PATH: {}",
                display_dirs(&ld_library_path)
            );
            let _ = writeln!(evidence, "RUNPATH: {}", display_dirs(&runpath));
            let _ = writeln!(evidence, "ld.so.conf: {}", display_dirs(&conf));
            let _ = write!(evidence, "default: {}", display_dirs(&defaults));
            let hint = if elsewhere.is_empty() {
                format!("add the library that provides `{needed}` to the image")
            } else {
                format!(
                    "`{needed}` exists at {} but not on this object's search path: add its directory to the RUNPATH, LD_LIBRARY_PATH or an /etc/ld.so.conf.d entry",
                    elsewhere.join(", ")
                )
            };
            unresolved.push((
                path.clone(),
                needed.clone(),
                Finding {
                    kind: FindingKind::UnresolvedNeeded,
                    paths: vec![path.clone()],
                    evidence,
                    hint,
                },
            ));
        }
        // Symbol versions: ld.so refuses to load when a required version (`GLIBC_2.34`) is
        // not defined by the library that resolved.
        for need in &info.version_needs {
            let Some(provider_path) = resolved_needed.get(need.file.as_str()) else {
                continue;
            };
            let Some(provider) = auditor.elf_at(provider_path)? else {
                continue;
            };
            if provider.version_definitions.is_empty() {
                continue;
            }
            let missing: Vec<&String> = need
                .versions
                .iter()
                .filter(|version| !provider.version_definitions.contains(version))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let missing_text = missing
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let newest = match provider.glibc_provided() {
                Some(glibc) => format!("it provides glibc {glibc}"),
                None => format!("it defines {}", provider.version_definitions.join(", ")),
            };
            let hint = match missing.iter().filter_map(|v| v.parse::<crate::elf::GlibcVersion>().ok()).max() {
                Some(needed_glibc) => format!(
                    "use a base image with glibc >= {needed_glibc}, or a build of this package for an older glibc (a manylinux tag at or below the image's glibc)"
                ),
                None => format!(
                    "install the `{}` this object was built against",
                    need.file
                ),
            };
            findings.push(Finding {
                kind: FindingKind::MissingSymbolVersion,
                paths: vec![path.clone(), provider_path.clone()],
                evidence: format!(
                    "requires version {missing_text} of `{}`, resolved to {}, but {newest}",
                    need.file,
                    provider_path.display()
                ),
                hint,
            });
        }
    }

    // Inherited DT_RPATH: an object without DT_RUNPATH also searches the DT_RPATH of every
    // object up its chain of loaders (glibc `_dl_map_object`: "then that object's
    // dependent, and on up"). Loaders are the objects whose NEEDED resolved to it.
    let rpath_of: HashMap<&Path, &ElfInfo> =
        objects.iter().map(|(p, i)| (p.as_path(), i)).collect();
    // A library found this way becomes a loader in turn (libopenblas -> libgfortran ->
    // libquadmath), so repeat until nothing more resolves.
    let mut pending = unresolved;
    loop {
        let mut still = Vec::new();
        let mut progressed = false;
        for (path, needed, finding) in pending {
            match inherited_rpath_lookup(&mut auditor, &rpath_of, &loaded_by, &path, &needed)? {
                Some(found) => {
                    loaded_by.entry(found).or_default().push(path.clone());
                    progressed = true;
                }
                None => still.push((path, needed, finding)),
            }
        }
        pending = still;
        if !progressed || pending.is_empty() {
            break;
        }
    }
    findings.extend(pending.into_iter().map(|(_, _, finding)| finding));

    // One real file per SONAME among the copies a loader can reach: those some object's
    // DT_NEEDED resolved to; those in a directory searched by every process
    // (LD_LIBRARY_PATH, ld.so.conf, the defaults) or named by some object's RPATH/RUNPATH;
    // torch's preload directories (`site-packages/nvidia/*/lib`, which torch globs for the
    // libraries it preloads); and every copy of a preloaded SONAME. A package's private copy
    // that nothing links and no search path names (triton's bundled CUPTI, which its
    // profiler opens by absolute path) cannot win a loader race, so it is not a duplicate.
    let mut search_dirs: BTreeSet<PathBuf> = options
        .ld_library_path
        .iter()
        .filter(|dir| !dir.to_string_lossy().contains("$ORIGIN"))
        .cloned()
        .chain(auditor.ld_so_conf.iter().cloned())
        .chain(DEFAULT_LIBRARY_DIRS.iter().map(PathBuf::from))
        .collect();
    for (path, info) in &objects {
        let origin = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        search_dirs.extend(info.expanded_rpath(&origin));
        search_dirs.extend(info.expanded_runpath(&origin));
    }
    let torch_preload_dir = |dir: &Path| {
        let parts: Vec<_> = dir.components().rev().take(4).collect();
        matches!(parts.as_slice(), [lib, _, nvidia, packages]
            if lib.as_os_str() == "lib" && nvidia.as_os_str() == "nvidia"
                && (packages.as_os_str() == "site-packages" || packages.as_os_str() == "dist-packages"))
    };
    // A CUDA toolkit's library directory is the one users and images put on LD_LIBRARY_PATH
    // (`/usr/local/cuda*/lib64`, `/usr/local/cuda*/targets/*/lib`): count it as searched.
    let toolkit_lib_dir = |dir: &Path| {
        let text = dir.to_string_lossy();
        text.strip_prefix("/usr/local/cuda").is_some_and(|rest| {
            let rest = rest.split_once('/').map_or("", |(_, tail)| tail);
            rest == "lib64"
                || rest
                    .strip_prefix("targets/")
                    .is_some_and(|t| t.ends_with("/lib") && t.matches('/').count() == 1)
        })
    };
    let reachable = |path: &PathBuf| {
        loaded_by.contains_key(path)
            || path.parent().is_some_and(|dir| {
                search_dirs.contains(dir) || torch_preload_dir(dir) || toolkit_lib_dir(dir)
            })
    };
    for (soname, paths) in &providers {
        let reached = if options.preloaded.contains(soname) {
            paths.len()
        } else {
            paths.iter().filter(|p| reachable(p)).count()
        };
        if reached < 2 {
            continue;
        }
        let mut evidence = format!("{} files provide `{soname}`:\n", paths.len());
        let mut digests = BTreeSet::new();
        for path in paths {
            let host = host_path(root, path);
            let digest = file_digest(&host)?;
            digests.insert(digest);
            let size = std::fs::metadata(&host).map_err(io_error(&host))?.len();
            let _ = writeln!(evidence, "{} ({size} bytes, {digest})", path.display());
        }
        let _ = write!(
            evidence,
            "{}",
            if digests.len() == 1 {
                "the copies are byte-identical"
            } else {
                "the copies differ: which one loads depends on the search order"
            }
        );
        findings.push(Finding {
            kind: FindingKind::DuplicateSoname,
            paths: paths.clone(),
            evidence,
            hint: "keep one copy and replace the others with symlinks to it (cudastack's one-copy step), so every loader path reaches the same file".into(),
        });
    }

    // cuDNN version agreement.
    let mut claims: Vec<CudnnClaim> = Vec::new();
    for header in &inventory.cudnn_headers {
        let host = host_path(root, header);
        let text = std::fs::read_to_string(&host).map_err(io_error(&host))?;
        if let Some((major, minor, patch)) = parse_cudnn_header(&text) {
            claims.push(CudnnClaim {
                source: "cudnn_version.h".into(),
                path: header.clone(),
                parts: vec![major, minor, patch],
            });
        }
    }
    for library in &inventory.cudnn_library_names {
        let name = library.file_name().unwrap_or_default().to_string_lossy();
        if let Some(parts) = name
            .strip_prefix("libcudnn.so.")
            .and_then(numeric_parts)
            .filter(|parts| !parts.is_empty())
        {
            claims.push(CudnnClaim {
                source: "library file name".into(),
                path: library.clone(),
                parts,
            });
        }
    }

    // Installed distributions.
    let mut installed: Vec<Installed> = Vec::new();
    for dist_info in &inventory.dist_infos {
        if let Some((name, version)) = read_metadata(root, dist_info)? {
            installed.push(Installed {
                dist_info: dist_info.clone(),
                name,
                version,
            });
        }
    }
    for dist in &installed {
        let normalized = crate::install::normalize_name(&dist.name);
        if normalized.starts_with("nvidia-cudnn-") {
            if let Some(parts) = dist
                .version
                .split(['+', '-'])
                .next()
                .and_then(numeric_parts)
            {
                claims.push(CudnnClaim {
                    source: format!("{} wheel version", dist.name),
                    path: dist.dist_info.clone(),
                    parts: parts.into_iter().take(3).collect(),
                });
            }
        }
    }
    let agree = |a: &CudnnClaim, b: &CudnnClaim| a.parts.iter().zip(&b.parts).all(|(x, y)| x == y);
    let disagreeing = claims
        .iter()
        .enumerate()
        .any(|(i, a)| claims[i + 1..].iter().any(|b| !agree(a, b)));
    if disagreeing {
        let mut evidence = String::from("the cuDNN version sources disagree:\n");
        for claim in &claims {
            let _ = writeln!(
                evidence,
                "{} says {} ({})",
                claim.source,
                claim.text(),
                claim.path.display()
            );
        }
        findings.push(Finding {
            kind: FindingKind::CudnnVersionMismatch,
            paths: claims.iter().map(|c| c.path.clone()).collect(),
            evidence: evidence.trim_end().to_string(),
            hint: "install headers and libraries from one cuDNN release (the one torch pins), and remove the other copy".into(),
        });
    }

    // Pins and duplicate distributions.
    let mut by_project: BTreeMap<String, Vec<&Installed>> = BTreeMap::new();
    for dist in &installed {
        by_project
            .entry(crate::install::normalize_name(&dist.name))
            .or_default()
            .push(dist);
    }
    for (project, dists) in &by_project {
        if dists.len() > 1 {
            findings.push(Finding {
                kind: FindingKind::DuplicateDistribution,
                paths: dists.iter().map(|d| d.dist_info.clone()).collect(),
                evidence: format!(
                    "{project} is installed {} times: {}",
                    dists.len(),
                    dists
                        .iter()
                        .map(|d| d.version.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                hint: "install each distribution once, into one site-packages directory".into(),
            });
        }
    }
    for (name, pinned) in &options.pins {
        let project = crate::install::normalize_name(name);
        match by_project.get(&project) {
            None => findings.push(Finding {
                kind: FindingKind::PinMismatch,
                paths: Vec::new(),
                evidence: format!("{name}=={pinned} is expected but not installed"),
                hint: format!("install {name}=={pinned}"),
            }),
            Some(dists) => {
                for dist in dists {
                    if !version_matches(pinned, &dist.version) {
                        findings.push(Finding {
                            kind: FindingKind::PinMismatch,
                            paths: vec![dist.dist_info.clone()],
                            evidence: format!(
                                "{name}: expected {pinned}, installed {}",
                                dist.version
                            ),
                            hint: format!(
                                "install {name}=={pinned} (the version the framework was built against) instead of {}",
                                dist.version
                            ),
                        });
                    }
                }
            }
        }
    }

    findings.sort();
    Ok(AuditReport {
        elf_files: objects.len(),
        needed_checked,
        symlinks: inventory.symlinks.len(),
        distributions: installed.len(),
        findings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_libraries() {
        for name in [
            "libcuda.so.1",
            "libnvidia-ml.so.1",
            "libnvidia-ptxjitcompiler.so.1",
            "libcudadebugger.so.1",
            "libnvidia-nvvm.so.4",
        ] {
            assert!(is_driver_library(name), "{name}");
        }
        assert!(!is_driver_library("libcudart.so.12"));
        let plugin =
            Path::new("/usr/local/cuda-13.0/targets/sbsa-linux/lib/nvshmem_bootstrap_mpi.so.3.4.5");
        assert!(is_site_fabric_dependency(plugin, "libmpi.so.40"));
        assert!(!is_site_fabric_dependency(plugin, "libstdc++.so.6"));
        assert!(!is_site_fabric_dependency(
            Path::new("/usr/lib/libtorch.so"),
            "libmpi.so.40"
        ));
        assert!(!is_driver_library("libcudnn.so.9"));
    }

    #[test]
    fn cudnn_header_parsing() {
        let text = "#ifndef CUDNN_VERSION_H_\n#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n";
        assert_eq!(parse_cudnn_header(text), Some((9, 1, 0)));
        assert_eq!(parse_cudnn_header("#define CUDNN_MAJOR 9\n"), None);
    }

    #[test]
    fn pins_compare_as_pep440() {
        assert!(version_matches("2.4.1", "2.4.1+cu121"));
        assert!(version_matches("9.1.0.70", "9.1.0.70"));
        assert!(version_matches("1.0", "1.0.0"));
        assert!(!version_matches("9.1.0.70", "9.1.0.69"));
        assert!(!version_matches("2.4.1+cu124", "2.4.1+cu121"));
    }
}
