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
//! - installed distributions match the expected pins (e.g. torch's `Requires-Dist`);
//! - every library with GPU code has code each target GPU can run (`kernels`).
//!
//! It reads, never writes: ELF headers only (see [`crate::elf`]), small text files, and file
//! digests only for the duplicate copies it reports. Simplifications against glibc, chosen
//! because cudastack images do not depend on them: `$ORIGIN` is the directory of the file as
//! it lies in the tree (not the path it was opened through), the RPATH of the loading
//! executable (python3 has none) is not inherited (the RPATH of loading libraries is), an already-loaded object with a matching SONAME is not
//! reused unless declared preloaded, and `$LIB`/`$PLATFORM` are not expanded.
//!
//! [`audit`] is one walk over the root (`inventory`) followed by one phase per kind of
//! finding, each in its own file: `symlinks`; `needed` (the ELF scan, program interpreters,
//! DT_NEEDED resolution in ld.so's order, symbol versions, inherited DT_RPATH), with
//! `loader` holding what ld.so reads (ld.so.conf, the default directories, ELF headers);
//! `sonames` (one copy per SONAME); `cudnn`; `distributions` (duplicates and pins, the pins
//! themselves from [`pins`]); `kernels` (the fatbins of every ELF against the target GPUs). Paths inside the root resolve through [`crate::rootfs`].

pub mod facts;
pub mod image;
pub mod kernels;
pub mod pins;
/// Kept as `audit::rootfs` for the callers that still name it there; the module itself is
/// [`crate::rootfs`].
pub use crate::rootfs;

mod cudnn;
mod distributions;
mod inventory;
mod loader;
mod needed;
mod sonames;
mod symlinks;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::version::PtxIsa;

pub use cudnn::parse_cudnn_header;
pub use facts::{FactsFs, LayerFacts};
pub use image::{DirFs, ImageFs, LayeredFs, Owner};
pub use kernels::{CoverageGroup, KernelTable};
pub use loader::{image_glibc, ld_so_conf_dirs, DEFAULT_LIBRARY_DIRS};

#[cfg(test)]
use distributions::version_matches;

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
    /// The GPUs the image is for (the recipe's `gpus`): every library with device code
    /// must have SASS or JIT-able PTX for each. Empty: the table is made, nothing checked.
    pub target_gpus: Vec<crate::target_gpu::TargetGpu>,
    /// The newest PTX ISA the driver floor's JIT compiler reads; None counts PTX of any ISA.
    pub jit_ptx_isa: Option<PtxIsa>,
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
    MissingKernels,
    MalformedFatbin,
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
            FindingKind::MissingKernels => "missing-kernels",
            FindingKind::MalformedFatbin => "malformed-fatbin",
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
    /// Every library with GPU code and what it carries.
    pub kernels: KernelTable,
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
            "static audit: {} ELF files, {} DT_NEEDED entries, {} symlinks, {} Python distributions, {} libraries with GPU code: {}",
            self.elf_files,
            self.needed_checked,
            self.symlinks,
            self.distributions,
            self.kernels.libraries.len(),
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

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Audit the image root at `root` (a directory holding the image's `/`).
pub fn audit(root: &Path, options: &AuditOptions) -> Result<AuditReport, AuditError> {
    if !root.is_dir() {
        return Err(AuditError::NotARoot {
            path: root.to_path_buf(),
        });
    }
    audit_image(&DirFs::new(root), options)
}

/// Audit an image's filesystem: one walk, then one phase per kind of finding. Findings are
/// sorted at the end, so the order of the phases does not show in the report.
pub fn audit_image(fs: &dyn ImageFs, options: &AuditOptions) -> Result<AuditReport, AuditError> {
    let inventory = inventory::walk(fs)?;
    let mut loader = loader::Loader::new(fs)?;
    let mut findings = symlinks::check(fs, &inventory.symlinks)?;
    let objects = needed::Objects::read(&mut loader, &inventory.candidates, &mut findings)?;
    let linkage = needed::resolve(&mut loader, options, &objects, &mut findings)?;
    findings.extend(sonames::duplicates(
        fs,
        options,
        &loader.ld_so_conf,
        &objects,
        &linkage.loaded_by,
    )?);
    let installed = distributions::installed(fs, &inventory.dist_infos)?;
    let cudnn_claims = cudnn::claims(
        fs,
        &inventory.cudnn_headers,
        &inventory.cudnn_library_names,
        &installed,
    )?;
    findings.extend(cudnn::mismatch(&cudnn_claims));
    findings.extend(distributions::check(&installed, &options.pins));
    let elf_paths: Vec<PathBuf> = objects.list.iter().map(|(path, _)| path.clone()).collect();
    let (kernel_table, fatbin_findings) = kernels::scan(fs, &elf_paths)?;
    findings.extend(fatbin_findings);
    findings.extend(kernels::missing(
        &kernel_table.groups(),
        &options.target_gpus,
        options.jit_ptx_isa,
    ));
    findings.sort();
    Ok(AuditReport {
        elf_files: objects.list.len(),
        needed_checked: linkage.needed_checked,
        symlinks: inventory.symlinks.len(),
        distributions: installed.len(),
        kernels: kernel_table,
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
