//! The compatibility knowledge cudastack carries, as tables with a source for every row.
//!
//! Three embedded data files (the binary carries exactly what is committed in `data/`):
//! - `nvidia.yaml`: CUDA toolkit -> minimum driver, minor-version-compatibility floors,
//!   cuDNN release -> CUDA majors, cuDNN library sets, arch support per toolkit, GPUs,
//!   base distributions. Curated from NVIDIA's documents (see each table's `source`).
//! - `torch-pypi.json`: every torch release on PyPI with its CUDA, exact nvidia-* pins,
//!   Python tags and compiled sm list. DERIVED from PyPI by `cudastack matrix refresh`
//!   (see [`refresh`]); never typed by hand. A refresh by a user lives in the cache and
//!   takes precedence over the embedded file ([`source`]).
//! - `torch-variants.yaml`: builds on PyTorch's own per-CUDA indexes (cu118, cu124, ...),
//!   from PyTorch's build matrix, since those indexes are not reachable from here.
//!
//! This module only answers questions; [`validate`] and [`solve`] turn answers into verdicts,
//! and [`ResolvedRecipe`] is a recipe `validate` accepted with the facts it decided.

pub mod refresh;
pub mod resolved;
pub mod solve;
pub mod source;
pub mod validate;

pub use resolved::{InvalidRecipe, ResolveError, ResolvedRecipe};

use std::collections::BTreeMap;
use std::sync::OnceLock;

use pep440_rs::Version;
use serde::{Deserialize, Serialize};

use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, CudaVersion, CudnnVersion, DriverVersion, PythonVersion};

pub const NVIDIA_DATA: &str = include_str!("../../data/nvidia.yaml");
pub const TORCH_PYPI_DATA: &str = include_str!("../../data/torch-pypi.json");
pub const TORCH_VARIANTS_DATA: &str = include_str!("../../data/torch-variants.yaml");

#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("the embedded matrix data file `{file}` is invalid: {message}")]
    Data { file: &'static str, message: String },
}

/// How sure a row is (see ../shared/compat: CONFIRMED = read from a primary artifact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    #[serde(rename = "CONFIRMED")]
    Confirmed,
    #[serde(rename = "CONFIRMED-secondary")]
    ConfirmedSecondary,
    #[serde(rename = "PARTIAL")]
    Partial,
    #[serde(rename = "UNCONFIRMED")]
    Unconfirmed,
    /// Derived from the artifacts themselves by `matrix refresh`.
    #[serde(rename = "DERIVED")]
    Derived,
}

impl Status {
    /// The plain word users see (tables, `solve`): never the internal variant name.
    pub fn word(self) -> &'static str {
        match self {
            Status::Confirmed => "confirmed",
            Status::ConfirmedSecondary => "secondary",
            Status::Partial => "partial",
            Status::Unconfirmed => "unconfirmed",
            Status::Derived => "derived",
        }
    }

    /// What the word means, for legends under tables.
    pub fn meaning(self) -> &'static str {
        match self {
            Status::Derived => "read from the published wheels themselves (`matrix refresh`)",
            Status::Confirmed => {
                "read from a primary source (NVIDIA's or PyTorch's own documents or build scripts)"
            }
            Status::ConfirmedSecondary => {
                "read from a copy of a primary source, not the source itself"
            }
            Status::Partial => "some fields read from a primary source, others inferred",
            Status::Unconfirmed => "not read from a primary source here; likely right, not checked",
        }
    }

    /// Read from the artifacts or a primary source (or a copy of one): a fact, where
    /// `partial` and `unconfirmed` rows are partly guesses.
    pub fn is_confirmed(self) -> bool {
        matches!(
            self,
            Status::Derived | Status::Confirmed | Status::ConfirmedSecondary
        )
    }

    /// Every status, most certain first (the order of legends).
    pub const ALL: [Status; 5] = [
        Status::Derived,
        Status::Confirmed,
        Status::ConfirmedSecondary,
        Status::Partial,
        Status::Unconfirmed,
    ];
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CudaRelease {
    pub version: CudaVersion,
    pub min_driver: DriverVersion,
    pub status: Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MinorCompatFloor {
    pub cuda_major: u32,
    pub min_driver: DriverVersion,
    pub status: Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CudnnCudaRange {
    pub first: CudnnVersion,
    pub last: CudnnVersion,
    pub cuda_majors: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CudnnLibrarySet {
    pub major: u32,
    pub libs: Vec<String>,
    pub headers: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchSupport {
    pub cc: ComputeCapability,
    pub first_cuda: Option<CudaVersion>,
    pub removed_in: Option<CudaVersion>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    /// Other names users give the same GPU (`A6000` for `RTX A6000`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    pub cc: ComputeCapability,
    pub arch: String,
    /// The only platform whose images run next to this GPU, for GPUs that exist only with
    /// an Arm host (the Grace superchips: GH200; GB10); absent: linux/amd64 machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::recipe::Platform>,
    pub source: String,
    pub status: Status,
    /// The product's own minimum driver, where it needs a later release than its
    /// architecture's branch (`gpu_min_drivers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver: Option<ProductMinDriver>,
}

/// The oldest driver branch that runs GPUs of one compute capability at all (a
/// Blackwell GPU does not run on an R550 driver, whatever minor-version compatibility
/// allows the CUDA runtime).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchMinDriver {
    pub cc: ComputeCapability,
    pub arch: String,
    /// The branch, as a version (`570`): any 570.x and later.
    pub min_driver: DriverVersion,
    /// The first CUDA toolkit of the architecture, whose driver the branch is.
    pub first_cuda: CudaVersion,
    pub source: String,
    pub status: Status,
}

/// A product's own minimum driver (`B200`: 570.133.20, later than R570's first release).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProductMinDriver {
    pub driver: DriverVersion,
    pub source: String,
    pub status: Status,
}

/// The newest driver branch that still runs GPUs of one compute capability (Kepler: R470;
/// Maxwell, Pascal, Volta: R580): later branches dropped them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchLastDriver {
    pub cc: ComputeCapability,
    pub arch: String,
    pub last_branch: u32,
    pub status: Status,
}

/// The drivers one GPU runs on at all, with where the figures come from: what
/// `solve`, `validate` and `check` compare a driver with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDrivers {
    /// The GPU as reasons name it (`B200 (sm_100)`).
    pub gpu: String,
    /// The oldest driver that runs it (`570.133.20`, or a branch: `570`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_driver: Option<DriverVersion>,
    /// The branch of `min_driver`, the one to install (`R570`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_branch: Option<String>,
    /// The newest branch that still runs it (`R580`); later branches dropped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_branch: Option<String>,
    pub source: String,
    /// How sure the figures are, as a plain word ([`Status::word`]).
    pub status: String,
}

impl GpuDrivers {
    fn last(&self) -> Option<u32> {
        self.last_branch
            .as_deref()?
            .trim_start_matches('R')
            .parse()
            .ok()
    }

    pub fn runs_on(&self, driver: &DriverVersion) -> bool {
        self.min_driver.as_ref().is_none_or(|min| driver >= min)
            && self.last().is_none_or(|last| driver.branch() <= last)
    }

    /// `the R570 driver branch or later` / `driver 570.133.20 or later (R570 branch)` /
    /// `a driver of the R580 branch or older`.
    pub fn requirement(&self) -> String {
        let min = match (&self.min_driver, &self.min_branch) {
            (Some(min), Some(branch)) if min.to_string() == min.branch().to_string() => {
                Some(format!("the {branch} driver branch or later"))
            }
            (Some(min), Some(branch)) => Some(format!("driver {min} or later ({branch} branch)")),
            _ => None,
        };
        let last = self
            .last_branch
            .as_ref()
            .map(|last| format!("a driver of the {last} branch or older"));
        match (min, last) {
            (Some(min), Some(last)) => format!("{min}, and {last}"),
            (Some(one), None) | (None, Some(one)) => one,
            (None, None) => "any driver".to_string(),
        }
    }

    /// Why `driver` cannot run the GPU, naming the GPU, what it needs and the source.
    pub fn refusal(&self, driver: &DriverVersion) -> String {
        let dropped = self.last().is_some_and(|last| driver.branch() > last);
        format!(
            "{} needs {}: driver {driver} {}, with or without minor-version compatibility (source, {}: {})",
            self.gpu,
            self.requirement(),
            if dropped { "no longer supports it" } else { "does not support it at all" },
            self.status,
            self.source
        )
    }

    /// What to do about `driver`.
    pub fn hint(&self, driver: &DriverVersion) -> String {
        match (&self.min_driver, &self.min_branch, &self.last_branch) {
            (Some(min), Some(branch), _) if driver < min => {
                format!("install the {branch} driver branch ({min} or newer) on the host")
            }
            (_, _, Some(last)) => format!(
                "install a driver of the {last} branch (the last that runs this GPU) on the host, or run the image on a newer GPU"
            ),
            _ => "install a driver that supports this GPU".to_string(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BaseDistro {
    pub distro: String,
    pub release: String,
    pub python: PythonVersion,
    pub glibc: String,
    pub status: Status,
}

#[derive(Debug, Clone, Deserialize)]
struct Table<T> {
    source: serde_json::Value,
    rows: Vec<T>,
}

#[derive(Debug, Clone, Deserialize)]
struct LibrarySets {
    sets: Vec<CudnnLibrarySet>,
}

#[derive(Debug, Clone, Deserialize)]
struct NvidiaData {
    cuda_releases: Table<CudaRelease>,
    minor_version_compat: Table<MinorCompatFloor>,
    cudnn_cuda_majors: Table<CudnnCudaRange>,
    cudnn_library_sets: LibrarySets,
    cuda_arch_support: Table<ArchSupport>,
    gpu_min_drivers: Table<ArchMinDriver>,
    gpu_last_drivers: Table<ArchLastDriver>,
    gpus: Vec<Gpu>,
    bases: Vec<BaseDistro>,
}

/// Exact pins a torch wheel's METADATA carries (`Requires-Dist: nvidia-cudnn-cu12==9.1.0.70`).
pub type Pins = BTreeMap<String, String>;

/// One torch build: a release on a given index, for one CUDA version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TorchBuild {
    #[serde(with = "version_serde")]
    pub torch: Version,
    /// `cu121` etc.
    pub variant: String,
    pub cuda: CudaVersion,
    /// Exact CUDA runtime the build pins (`12.1.105`), when known.
    #[serde(default)]
    pub cuda_runtime: Option<String>,
    pub cudnn: Option<CudnnVersion>,
    /// Compute capabilities with SASS (cubins) in the build.
    pub arch_list: Vec<ComputeCapability>,
    /// Whether the build also carries PTX for its newest arch (JIT-able on newer GPUs).
    pub ptx: bool,
    /// CPython versions with a linux x86_64 wheel.
    pub python: Vec<PythonVersion>,
    /// True for the build `pip install torch==X` gets from PyPI.
    pub pypi_default: bool,
    /// manylinux glibc floor of the x86_64 wheels (`2.17`, `2.28`), when known.
    #[serde(default)]
    pub glibc: Option<String>,
    #[serde(default)]
    pub pins: Pins,
    pub source: String,
    pub status: Status,
}

impl TorchBuild {
    /// How the build is referred to: `2.4.1+cu121`.
    pub fn label(&self) -> String {
        format!("{}+{}", self.torch, self.variant)
    }

    /// Whether this build has kernels a GPU of capability `cc` can run, and how.
    pub fn kernels_for(&self, cc: &ComputeCapability) -> KernelSupport {
        if let Some(sass) = self
            .arch_list
            .iter()
            .filter(|arch| arch.cubin_runs_on(cc))
            .max()
        {
            return KernelSupport::Sass(*sass);
        }
        if self.ptx {
            if let Some(newest) = self.arch_list.iter().max() {
                if newest.ptx_runs_on(cc) {
                    return KernelSupport::Ptx(*newest);
                }
            }
        }
        KernelSupport::None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSupport {
    /// Native cubins for this arch (same major, not newer minor).
    Sass(ComputeCapability),
    /// Only PTX that the driver must JIT-compile (slow first start, and needs a driver at
    /// least as new as the toolkit that produced the PTX).
    Ptx(ComputeCapability),
    None,
}

mod version_serde {
    use pep440_rs::Version;
    use serde::{Deserialize, Deserializer, Serializer};
    use std::str::FromStr;

    pub fn serialize<S: Serializer>(version: &Version, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(version)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Version, D::Error> {
        let text = String::deserialize(deserializer)?;
        Version::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// The torch data file written by `matrix refresh`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TorchPypiData {
    /// The day (UTC) the data was read from the index; decides whether a refreshed copy in
    /// the cache is newer than the embedded one ([`source`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated: Option<source::Date>,
    pub generated_by: String,
    pub index: String,
    pub releases: Vec<TorchBuild>,
}

#[derive(Debug, Clone, Deserialize)]
struct VariantRow {
    torch: String,
    variant: String,
    cuda: CudaVersion,
    cudnn: Option<CudnnVersion>,
    arch_list: Vec<ComputeCapability>,
    ptx: bool,
    python: Vec<String>,
    source: String,
    status: Status,
}

#[derive(Debug, Clone, Deserialize)]
struct VariantData {
    variants: Vec<VariantRow>,
}

/// All compatibility knowledge, loaded from the embedded data.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub cuda_releases: Vec<CudaRelease>,
    pub cuda_releases_source: String,
    pub minor_compat: Vec<MinorCompatFloor>,
    pub minor_compat_source: String,
    pub cudnn_ranges: Vec<CudnnCudaRange>,
    pub cudnn_library_sets: Vec<CudnnLibrarySet>,
    pub arch_support: Vec<ArchSupport>,
    /// The oldest driver branch of each architecture (`gpu_min_drivers`).
    pub arch_min_drivers: Vec<ArchMinDriver>,
    /// The last driver branch of each dropped architecture (`gpu_last_drivers`).
    pub arch_last_drivers: Vec<ArchLastDriver>,
    pub arch_last_drivers_source: String,
    pub gpus: Vec<Gpu>,
    pub bases: Vec<BaseDistro>,
    /// Every torch build, newest torch first, PyPI default before index variants.
    pub torch_builds: Vec<TorchBuild>,
}

fn source_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Array(items) => {
            items.iter().map(source_text).collect::<Vec<_>>().join("; ")
        }
        other => other.to_string(),
    }
}

impl Matrix {
    /// The compute capabilities the toolkit of CUDA `cuda` (its release line) generates code
    /// for, oldest first: what the CUDA libraries of an image without torch can carry.
    pub fn cuda_archs(&self, cuda: CudaVersion) -> Vec<ComputeCapability> {
        let line = cuda.line();
        let mut archs: Vec<ComputeCapability> = self
            .arch_support
            .iter()
            .filter(|row| row.first_cuda.is_none_or(|first| line >= first))
            .filter(|row| row.removed_in.is_none_or(|removed| line < removed))
            .map(|row| row.cc)
            .collect();
        archs.sort();
        archs
    }

    /// The matrix compiled into this binary.
    pub fn embedded() -> &'static Matrix {
        static MATRIX: OnceLock<Matrix> = OnceLock::new();
        MATRIX.get_or_init(|| {
            Matrix::from_sources(NVIDIA_DATA, TORCH_PYPI_DATA, TORCH_VARIANTS_DATA)
                .expect("embedded matrix data is validated by tests")
        })
    }

    pub fn from_sources(
        nvidia_yaml: &str,
        torch_pypi_json: &str,
        torch_variants_yaml: &str,
    ) -> Result<Matrix, MatrixError> {
        let nvidia: NvidiaData =
            serde_saphyr::from_str(nvidia_yaml).map_err(|e| MatrixError::Data {
                file: "data/nvidia.yaml",
                message: e.to_string(),
            })?;
        let pypi: TorchPypiData =
            serde_json::from_str(torch_pypi_json).map_err(|e| MatrixError::Data {
                file: "data/torch-pypi.json",
                message: e.to_string(),
            })?;
        let variants: VariantData =
            serde_saphyr::from_str(torch_variants_yaml).map_err(|e| MatrixError::Data {
                file: "data/torch-variants.yaml",
                message: e.to_string(),
            })?;

        let mut torch_builds = pypi.releases;
        for row in variants.variants {
            let torch: Version = row.torch.parse().map_err(|e| MatrixError::Data {
                file: "data/torch-variants.yaml",
                message: format!("torch version `{}`: {e}", row.torch),
            })?;
            let python = row
                .python
                .iter()
                .filter_map(|tag| PythonVersion::from_cp_tag(tag))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            torch_builds.push(TorchBuild {
                torch,
                variant: row.variant,
                cuda: row.cuda,
                cuda_runtime: None,
                cudnn: row.cudnn,
                arch_list: row.arch_list,
                ptx: row.ptx,
                python,
                pypi_default: false,
                glibc: None,
                pins: Pins::new(),
                source: row.source,
                status: row.status,
            });
        }
        torch_builds.sort_by(|a, b| {
            b.torch
                .cmp(&a.torch)
                .then(b.pypi_default.cmp(&a.pypi_default))
                .then(b.cuda.cmp(&a.cuda))
        });

        let mut cuda_releases = nvidia.cuda_releases.rows;
        cuda_releases.sort_by_key(|row| row.version);
        Ok(Matrix {
            cuda_releases,
            cuda_releases_source: source_text(&nvidia.cuda_releases.source),
            minor_compat: nvidia.minor_version_compat.rows,
            minor_compat_source: source_text(&nvidia.minor_version_compat.source),
            cudnn_ranges: nvidia.cudnn_cuda_majors.rows,
            cudnn_library_sets: nvidia.cudnn_library_sets.sets,
            arch_support: nvidia.cuda_arch_support.rows,
            arch_min_drivers: nvidia.gpu_min_drivers.rows,
            arch_last_drivers: nvidia.gpu_last_drivers.rows,
            arch_last_drivers_source: source_text(&nvidia.gpu_last_drivers.source),
            gpus: nvidia.gpus,
            bases: nvidia.bases,
            torch_builds,
        })
    }

    /// The NVIDIA table row for a CUDA version: the exact release when a patch is given,
    /// else the GA (`.0`) release of that line, which is what a `major.minor` requirement
    /// needs at least.
    pub fn cuda_release(&self, cuda: &CudaVersion) -> Option<&CudaRelease> {
        let wanted = CudaVersion::new(cuda.major, cuda.minor, Some(cuda.patch.unwrap_or(0)));
        self.cuda_releases
            .iter()
            .find(|row| {
                row.version.major == wanted.major
                    && row.version.minor == wanted.minor
                    && row.version.patch.unwrap_or(0) == wanted.patch.unwrap_or(0)
            })
            // pip-only point releases (13.0.3) have no row: fall back to the line's GA.
            .or_else(|| {
                self.cuda_releases
                    .iter()
                    .find(|row| row.version.line() == cuda.line())
            })
    }

    /// The minimum driver to run `cuda` without minor-version compatibility.
    pub fn min_driver_for(&self, cuda: &CudaVersion) -> Option<&DriverVersion> {
        self.cuda_release(cuda).map(|row| &row.min_driver)
    }

    /// The drivers `gpu` runs on at all: from its product's own minimum when the matrix
    /// has one, else its architecture's branch, up to its architecture's last branch;
    /// `None` when the matrix knows neither (Turing, whose branches span every CUDA 11+
    /// driver).
    pub fn gpu_drivers(&self, gpu: &TargetGpu) -> Option<GpuDrivers> {
        let arch = self.arch_min_drivers.iter().find(|row| row.cc == gpu.cc);
        let product = self
            .gpu(&gpu.name)
            .filter(|known| known.cc == gpu.cc)
            .and_then(|known| known.min_driver.as_ref());
        let min = match (product, arch) {
            (Some(own), Some(arch)) if arch.min_driver > own.driver => {
                Some((&arch.min_driver, arch.source.clone(), arch.status))
            }
            (Some(own), _) => Some((&own.driver, own.source.clone(), own.status)),
            (None, Some(arch)) => Some((&arch.min_driver, arch.source.clone(), arch.status)),
            (None, None) => None,
        };
        let last = self
            .arch_last_drivers
            .iter()
            .find(|row| row.cc == gpu.cc)
            .map(|row| {
                let source = format!(
                    "{}: {} last runs on R{}",
                    self.arch_last_drivers_source, row.arch, row.last_branch
                );
                (row.last_branch, source, row.status)
            });
        if min.is_none() && last.is_none() {
            return None;
        }
        let sources: Vec<String> = min
            .iter()
            .map(|(_, source, _)| source.clone())
            .chain(last.iter().map(|(_, source, _)| source.clone()))
            .collect();
        // The less certain figure sets the word (the order of `Status::ALL`).
        let status = min
            .iter()
            .map(|(_, _, status)| *status)
            .chain(last.iter().map(|(_, _, status)| *status))
            .max_by_key(|status| Status::ALL.iter().position(|s| s == status))
            .unwrap_or(Status::Unconfirmed);
        Some(GpuDrivers {
            gpu: gpu.label(),
            min_driver: min.as_ref().map(|(driver, _, _)| (*driver).clone()),
            min_branch: min
                .as_ref()
                .map(|(driver, _, _)| format!("R{}", driver.branch())),
            last_branch: last.as_ref().map(|(branch, _, _)| format!("R{branch}")),
            source: sources.join("; "),
            status: status.word().to_string(),
        })
    }

    /// The minor-version-compatibility floor for a CUDA major.
    pub fn minor_compat_floor(&self, cuda_major: u32) -> Option<&MinorCompatFloor> {
        self.minor_compat
            .iter()
            .find(|row| row.cuda_major == cuda_major)
    }

    /// The newest CUDA release a driver supports natively (the "CUDA Version" nvidia-smi
    /// prints), as a `major.minor` line.
    pub fn cuda_ceiling(&self, driver: &DriverVersion) -> Option<CudaVersion> {
        self.cuda_releases
            .iter()
            .filter(|row| row.min_driver <= *driver)
            .map(|row| row.version.line())
            .max()
    }

    /// CUDA majors NVIDIA ships a cuDNN release for.
    pub fn cudnn_cuda_majors(&self, cudnn: &CudnnVersion) -> Option<&[u32]> {
        self.cudnn_ranges
            .iter()
            .find(|range| range.first <= *cudnn && *cudnn <= range.last)
            .map(|range| range.cuda_majors.as_slice())
    }

    pub fn cudnn_library_set(&self, major: u32) -> Option<&CudnnLibrarySet> {
        self.cudnn_library_sets
            .iter()
            .find(|set| set.major == major)
    }

    /// A GPU given by name (as [`Matrix::gpu`] finds it) or by compute capability (`8.9`):
    /// the one way every command and the build resolve what a user names.
    pub fn target_gpu(&self, name_or_cc: &str) -> Option<TargetGpu> {
        match self.gpu(name_or_cc) {
            Some(gpu) => Some(TargetGpu {
                name: gpu.name.clone(),
                cc: gpu.cc,
            }),
            None => name_or_cc
                .parse::<ComputeCapability>()
                .ok()
                .map(TargetGpu::from_cc),
        }
    }

    /// Look a GPU up by name, forgiving vendor prefixes, case, spaces, dashes, memory
    /// suffixes and missing spaces: `RTX 3090`, `rtx3090`, `NVIDIA GeForce RTX 3090`,
    /// `NVIDIA A100-SXM4-80GB`, `Tesla K80` all resolve.
    pub fn gpu(&self, query: &str) -> Option<&Gpu> {
        let parts = gpu_name_parts(query);
        let wanted: Vec<String> = parts.iter().map(|(word, _)| word.clone()).collect();
        if wanted.is_empty() {
            return None;
        }
        // An extension starts a word of its own (`A100-SXM4`), never glued to the last
        // known word (`A10X` is not an `A10`).
        let extends = |known: &[String]| {
            wanted.starts_with(known) && parts.get(known.len()).is_none_or(|(_, starts)| *starts)
        };
        self.gpu_names()
            .filter_map(|(known_name, gpu)| {
                let known = gpu_name_words(known_name);
                // `NVIDIA A100-SXM4-80GB` extends `A100`; `RTX 6000 Ada` abbreviates
                // `RTX 6000 Ada Generation` (only words without digits may be left out, so
                // `RTX` or `A` alone name no GPU). Longer matches win; a full name wins ties.
                if !known.is_empty() && extends(&known) {
                    Some(((known.len(), true), gpu))
                } else if known.starts_with(&wanted)
                    && known[wanted.len()..]
                        .iter()
                        .all(|word| word.bytes().all(|b| b.is_ascii_alphabetic()))
                {
                    Some(((wanted.len(), false), gpu))
                } else {
                    None
                }
            })
            .max_by_key(|(score, _)| *score)
            .map(|(_, gpu)| gpu)
    }

    /// Every name a GPU answers to (the `A / B` alternatives of its name and its aliases).
    fn gpu_names(&self) -> impl Iterator<Item = (&str, &Gpu)> {
        self.gpus.iter().flat_map(|gpu| {
            gpu.name
                .split(" / ")
                .chain(gpu.aliases.iter().map(String::as_str))
                .map(move |name| (name, gpu))
        })
    }

    /// The known GPU names closest to an unknown `query`, closest first (at most three):
    /// the "did you mean" of an unknown-GPU error.
    pub fn gpu_suggestions(&self, query: &str) -> Vec<String> {
        let wanted = gpu_name_words(query).concat();
        if wanted.is_empty() {
            return Vec::new();
        }
        let limit = (wanted.len() / 3).max(2);
        let mut scored: Vec<(usize, &str)> = self
            .gpu_names()
            .filter_map(|(name, gpu)| {
                let known = gpu_name_words(name).concat();
                let distance = edit_distance(&wanted, &known);
                (distance <= limit).then_some((distance, gpu.name.as_str()))
            })
            .collect();
        scored.sort();
        let mut names: Vec<String> = Vec::new();
        for (_, name) in scored {
            if !names.iter().any(|known| known == name) {
                names.push(name.to_string());
            }
        }
        names.truncate(3);
        names
    }

    /// Every torch build of a given torch version.
    pub fn torch_builds_of<'a>(
        &'a self,
        torch: &Version,
    ) -> impl Iterator<Item = &'a TorchBuild> + 'a {
        let torch = torch.clone();
        self.torch_builds
            .iter()
            .filter(move |build| build.torch == torch)
    }

    pub fn base(&self, distro: &str, release: &str) -> Option<&BaseDistro> {
        self.bases
            .iter()
            .find(|base| base.distro == distro && base.release == release)
    }
}

/// The words of a GPU name without vendor/brand words, letters and digits apart:
/// `NVIDIA GeForce RTX 3090` and `rtx3090` -> `[rtx, 3090]`, `A100-SXM4-80GB` ->
/// `[a, 100, sxm, 4, 80, gb]`; a query matches a known GPU when the known words are a prefix
/// of its words (so `RTX 30900` is not `RTX 3090`).
fn gpu_name_words(name: &str) -> Vec<String> {
    gpu_name_parts(name)
        .into_iter()
        .map(|(word, _)| word)
        .collect()
}

/// [`gpu_name_words`], each with whether it starts a word of the name as typed (after a
/// space or dash) rather than at a letter/digit change (in `rtx3090`, `3090` does not).
fn gpu_name_parts(name: &str) -> Vec<(String, bool)> {
    let mut parts = Vec::new();
    for word in name
        .to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
    {
        let mut current = String::new();
        let mut starts = true;
        for c in word.chars() {
            if current
                .chars()
                .last()
                .is_some_and(|last| last.is_ascii_digit() != c.is_ascii_digit())
            {
                parts.push((std::mem::take(&mut current), starts));
                starts = false;
            }
            current.push(c);
        }
        if !current.is_empty() {
            parts.push((current, starts));
        }
    }
    parts.retain(|(word, _)| !matches!(word.as_str(), "nvidia" | "geforce" | "tesla" | "quadro"));
    parts
}

/// Levenshtein distance (insertions, deletions, substitutions), over bytes: GPU names are
/// ASCII after [`gpu_name_words`].
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix() -> &'static Matrix {
        Matrix::embedded()
    }

    #[test]
    fn embedded_data_loads_and_covers_every_cuda_line() {
        let m = matrix();
        for line in [
            "11.0", "11.8", "12.0", "12.1", "12.4", "12.8", "12.9", "13.0", "13.2",
        ] {
            assert!(
                m.cuda_release(&line.parse().unwrap()).is_some(),
                "no row for CUDA {line}"
            );
        }
    }

    #[test]
    fn driver_floors_and_ceilings() {
        let m = matrix();
        assert_eq!(
            m.min_driver_for(&"12.4".parse().unwrap())
                .unwrap()
                .to_string(),
            "550.54.14"
        );
        assert_eq!(
            m.min_driver_for(&"12.4.1".parse().unwrap())
                .unwrap()
                .to_string(),
            "550.54.15"
        );
        // pip-only point release without a row: its line's GA.
        assert_eq!(
            m.min_driver_for(&"13.0.3".parse().unwrap())
                .unwrap()
                .to_string(),
            "580.65.06"
        );
        assert_eq!(
            m.cuda_ceiling(&"535.104.05".parse().unwrap())
                .unwrap()
                .to_string(),
            "12.2"
        );
        assert_eq!(
            m.cuda_ceiling(&"470.82.01".parse().unwrap())
                .unwrap()
                .to_string(),
            "11.4"
        );
        assert_eq!(
            m.cuda_ceiling(&"570.124.06".parse().unwrap())
                .unwrap()
                .to_string(),
            "12.8"
        );
        assert_eq!(
            m.cuda_ceiling(&"550.54.15".parse().unwrap())
                .unwrap()
                .to_string(),
            "12.4"
        );
        assert_eq!(
            m.minor_compat_floor(12).unwrap().min_driver.to_string(),
            "525.60.13"
        );
    }

    #[test]
    fn cudnn_majors() {
        let m = matrix();
        assert_eq!(
            m.cudnn_cuda_majors(&"8.9.7.29".parse().unwrap()),
            Some(&[12][..])
        );
        assert_eq!(
            m.cudnn_cuda_majors(&"9.1.0.70".parse().unwrap()),
            Some(&[11, 12][..])
        );
        assert_eq!(
            m.cudnn_cuda_majors(&"9.20.0.48".parse().unwrap()),
            Some(&[12, 13][..])
        );
        assert_eq!(m.cudnn_library_set(9).unwrap().libs.len(), 8);
    }

    #[test]
    fn gpu_lookup_is_forgiving() {
        let m = matrix();
        assert_eq!(m.gpu("RTX 3090").unwrap().cc.to_string(), "8.6");
        assert_eq!(
            m.gpu("NVIDIA GeForce RTX 3090").unwrap().cc.to_string(),
            "8.6"
        );
        assert_eq!(
            m.gpu("NVIDIA A100-SXM4-80GB").unwrap().cc.to_string(),
            "8.0"
        );
        assert_eq!(m.gpu("NVIDIA H100 80GB HBM3").unwrap().name, "H100");
        assert_eq!(m.gpu("V100").unwrap().cc.to_string(), "7.0");
        assert_eq!(m.gpu("GTX 1080 Ti").unwrap().cc.to_string(), "6.1");
        assert!(m.gpu("RTX 30900").is_none());
        assert_eq!(m.gpu("RTX 6000 Ada").unwrap().cc.to_string(), "8.9");
        assert_eq!(m.gpu("Quadro RTX 6000").unwrap().cc.to_string(), "7.5");
        assert_eq!(m.gpu("GB300").unwrap().cc.to_string(), "10.3");
        assert!(m.gpu("Voodoo 2").is_none());
    }

    /// Names users rent or type were not found.
    #[test]
    fn gpu_lookup_finds_cloud_skus_and_typed_names() {
        let m = matrix();
        let cases = [
            ("A10G", "A10G", "8.6"),
            ("NVIDIA A10G", "A10G", "8.6"),
            ("A6000", "RTX A6000", "8.6"),
            ("NVIDIA RTX A6000", "RTX A6000", "8.6"),
            ("K80", "Tesla K80", "3.7"),
            ("Tesla K80", "Tesla K80", "3.7"),
            ("rtx3090", "GeForce RTX 3090", "8.6"),
            ("geforce-rtx-3090", "GeForce RTX 3090", "8.6"),
            ("A10", "A10", "8.6"),
            ("a100 40gb", "A100", "8.0"),
            ("A100-SXM4-80GB", "A100", "8.0"),
            ("l40s", "L40S", "8.9"),
            ("L40", "L40", "8.9"),
            ("L4", "L4", "8.9"),
            ("T4", "Tesla T4", "7.5"),
            ("Tesla V100-SXM2-16GB", "Tesla V100", "7.0"),
            ("h200", "H200", "9.0"),
            ("GB200", "GB200", "10.0"),
            ("B200", "B200", "10.0"),
        ];
        for (query, name, cc) in cases {
            let gpu = m
                .gpu(query)
                .unwrap_or_else(|| panic!("`{query}` not found"));
            assert_eq!(
                (gpu.name.as_str(), gpu.cc.to_string().as_str()),
                (name, cc),
                "{query}"
            );
        }
        // Bare brand words name no GPU.
        assert!(m.gpu("RTX").is_none());
        assert!(m.gpu("A10X").is_none());
        assert!(m.gpu("RTX 3090X").is_none());
        assert!(m.gpu("A").is_none());
        assert!(m.gpu("").is_none());
    }

    #[test]
    fn unknown_gpu_names_get_the_closest_known_names() {
        let m = matrix();
        assert_eq!(m.gpu_suggestions("RTX 30900")[0], "GeForce RTX 3090");
        assert!(m.gpu_suggestions("A10X").contains(&"A10".to_string()));
        assert!(m.gpu_suggestions("H1000").contains(&"H100".to_string()));
        assert!(m.gpu_suggestions("Voodoo 5").is_empty());
        assert!(m.gpu_suggestions("").is_empty());
    }

    #[test]
    fn every_gpu_row_has_a_source_and_a_distinct_name() {
        let m = matrix();
        let mut seen = std::collections::BTreeSet::new();
        for (name, gpu) in m.gpu_names() {
            assert!(!gpu.source.is_empty(), "{} has no source", gpu.name);
            assert!(
                seen.insert(gpu_name_words(name)),
                "`{name}` is listed twice"
            );
        }
    }

    /// Each architecture's branch is the branch of the driver its first toolkit ships (the
    /// rule `gpu_min_drivers` states), and a product's own figure is never below it.
    #[test]
    fn gpu_minimum_drivers_follow_their_first_toolkit() {
        let m = matrix();
        assert!(m.arch_min_drivers.len() >= 9);
        for row in &m.arch_min_drivers {
            assert!(
                row.source.contains("docs.nvidia.com") || row.status == Status::Unconfirmed,
                "{row:?}"
            );
            let toolkit = m.min_driver_for(&row.first_cuda).unwrap();
            assert_eq!(row.min_driver.branch(), toolkit.branch(), "{row:?}");
            assert_eq!(
                row.min_driver.to_string(),
                row.min_driver.branch().to_string(),
                "a branch: {row:?}"
            );
        }
        for gpu in m.gpus.iter().filter(|gpu| gpu.min_driver.is_some()) {
            let own = &gpu.min_driver.as_ref().unwrap().driver;
            let arch = m
                .arch_min_drivers
                .iter()
                .find(|row| row.cc == gpu.cc)
                .unwrap();
            assert!(*own >= arch.min_driver, "{}", gpu.name);
        }
        let min = |name: &str| {
            let gpu = solve::SolveQuery::gpu(m, name).unwrap();
            m.gpu_drivers(&gpu)
                .and_then(|drivers| drivers.min_driver)
                .map(|min| min.to_string())
        };
        assert_eq!(min("B200").as_deref(), Some("570.133.20"));
        assert_eq!(min("GB200").as_deref(), Some("570"));
        assert_eq!(min("RTX 5090").as_deref(), Some("570"));
        assert_eq!(min("10.0").as_deref(), Some("570"));
        assert_eq!(min("H100").as_deref(), Some("520"));
        assert_eq!(min("L4").as_deref(), Some("520"));
        assert_eq!(min("GB10").as_deref(), Some("575"));
        // Older than Ampere: CUDA 11's own floors already exceed their branches; the
        // architectures NVIDIA dropped have a last branch instead.
        assert_eq!(min("V100"), None);
        assert_eq!(min("T4"), None);
        let last = |name: &str| {
            let gpu = solve::SolveQuery::gpu(m, name).unwrap();
            m.gpu_drivers(&gpu).and_then(|drivers| drivers.last_branch)
        };
        assert_eq!(last("K80").as_deref(), Some("R470"));
        assert_eq!(last("V100").as_deref(), Some("R580"));
        assert_eq!(last("GTX 1080 Ti").as_deref(), Some("R580"));
        assert_eq!(last("T4"), None);
        assert_eq!(last("B200"), None);
        let v100 = m
            .gpu_drivers(&solve::SolveQuery::gpu(m, "V100").unwrap())
            .unwrap();
        assert!(v100.runs_on(&"580.65.06".parse().unwrap()));
        assert!(!v100.runs_on(&"590.44.01".parse().unwrap()));
        assert!(v100.refusal(&"590.44.01".parse().unwrap()).contains("Tesla V100 (sm_70) needs a driver of the R580 branch or older: driver 590.44.01 no longer supports it"));
    }

    #[test]
    fn status_words_are_plain() {
        assert_eq!(Status::ConfirmedSecondary.to_string(), "secondary");
        assert_eq!(Status::Derived.to_string(), "derived");
    }
}
