//! Version types of the GPU stack, parsed once at the edge and compared as values.
//!
//! Each number in a CUDA stack means something different (DESIGN.md): a driver version
//! (`535.104.05`) sets a ceiling, a CUDA version (`12.1`) is what a runtime was built for,
//! a cuDNN version (`9.1.0.70`) is what a framework pins, a compute capability (`8.6`) is
//! what a GPU is. Giving each its own type keeps them from being compared with each other.
//! The CPython line (`3.11`) and the glibc level (`2.28`, or a symbol version `GLIBC_2.2.5`)
//! of an image are here too: every stage (recipe, matrix, lock, install, elf, audit) uses
//! these one definitions. Python package versions use `pep440_rs::Version`.
//!
//! This module is shared vocabulary: it depends on no other module of the crate.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("`{text}` is not a valid {what}: expected {expected}")]
pub struct VersionError {
    pub text: String,
    pub what: &'static str,
    pub expected: &'static str,
}

fn numeric_parts(text: &str, min: usize, max: usize) -> Option<Vec<u32>> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() < min || parts.len() > max {
        return None;
    }
    parts
        .iter()
        .map(|part| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 9 {
                None
            } else {
                part.parse().ok()
            }
        })
        .collect()
}

macro_rules! serde_via_str {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A CUDA toolkit / runtime version: `12.1` (a release line) or `12.4.1` (an exact release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32, patch: Option<u32>) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }
    /// The `major.minor` release line this version belongs to.
    pub fn line(&self) -> CudaVersion {
        CudaVersion {
            patch: None,
            ..*self
        }
    }
    /// `cu121` style variant name used by PyTorch indexes.
    pub fn variant_name(&self) -> String {
        format!("cu{}{}", self.major, self.minor)
    }
    fn key(&self) -> (u32, u32, u32) {
        (self.major, self.minor, self.patch.unwrap_or(0))
    }
    /// Whether `self` (perhaps only `major.minor`) names `exact` or the line containing it.
    pub fn matches(&self, exact: &CudaVersion) -> bool {
        self.major == exact.major
            && self.minor == exact.minor
            && self.patch.is_none_or(|p| Some(p) == exact.patch)
    }
}

impl Ord for CudaVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}
impl PartialOrd for CudaVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for CudaVersion {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text
            .trim()
            .trim_start_matches("cuda")
            .trim_start_matches('-');
        // Accept the `cu121` variant spelling too.
        if let Some(digits) = trimmed.strip_prefix("cu") {
            if digits.len() >= 3 && digits.bytes().all(|b| b.is_ascii_digit()) {
                let (major, minor) = digits.split_at(digits.len() - 1);
                return Ok(CudaVersion::new(
                    major.parse().unwrap_or(0),
                    minor.parse().unwrap_or(0),
                    None,
                ));
            }
        }
        match numeric_parts(trimmed, 2, 3) {
            Some(parts) => Ok(CudaVersion::new(parts[0], parts[1], parts.get(2).copied())),
            None => Err(VersionError {
                text: text.to_string(),
                what: "CUDA version",
                expected: "MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 12.1 or 12.4.1",
            }),
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(patch) => write!(f, "{}.{}.{}", self.major, self.minor, patch),
            None => write!(f, "{}.{}", self.major, self.minor),
        }
    }
}
serde_via_str!(CudaVersion);

/// An NVIDIA Linux driver version such as `535.104.05` or `570.26`. Compared numerically
/// (`535.104.5 == 535.104.05`); printed as written.
#[derive(Debug, Clone)]
pub struct DriverVersion {
    parts: [u32; 3],
    text: String,
}

impl DriverVersion {
    pub fn branch(&self) -> u32 {
        self.parts[0]
    }

    /// Branch, minor and patch (0 where the version gave none): `535.104.05` -> [535, 104, 5].
    pub fn parts(&self) -> [u32; 3] {
        self.parts
    }
}

impl PartialEq for DriverVersion {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}
impl Eq for DriverVersion {}
impl std::hash::Hash for DriverVersion {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts.hash(state)
    }
}
impl Ord for DriverVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts.cmp(&other.parts)
    }
}
impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for DriverVersion {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        match numeric_parts(trimmed, 1, 3) {
            Some(parts) if parts[0] >= 100 => Ok(DriverVersion {
                parts: [
                    parts[0],
                    parts.get(1).copied().unwrap_or(0),
                    parts.get(2).copied().unwrap_or(0),
                ],
                text: trimmed.to_string(),
            }),
            _ => Err(VersionError {
                text: text.to_string(),
                what: "NVIDIA driver version",
                expected: "BRANCH.MINOR[.PATCH], e.g. 535.104.05",
            }),
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
serde_via_str!(DriverVersion);

/// A cuDNN version: `9.1.0.70` (exact, as PyPI and NVIDIA publish it), or a prefix such as
/// `9.1` or `9` in a recipe that accepts any matching release.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudnnVersion {
    parts: Vec<u32>,
}

impl CudnnVersion {
    pub fn major(&self) -> u32 {
        self.parts[0]
    }
    pub fn minor(&self) -> Option<u32> {
        self.parts.get(1).copied()
    }
    pub fn patch(&self) -> Option<u32> {
        self.parts.get(2).copied()
    }
    /// Whether all four components are given (a pin rather than a prefix).
    pub fn is_exact(&self) -> bool {
        self.parts.len() == 4
    }
    /// Whether `self`, read as a prefix, names `exact`.
    pub fn matches(&self, exact: &CudnnVersion) -> bool {
        exact.parts.starts_with(&self.parts)
    }
    /// The value of `CUDNN_VERSION` in cudnn_version.h and of `torch.backends.cudnn.version()`:
    /// 8.9.2 -> 8902 (major*1000 before cuDNN 9), 9.1.0 -> 90100 (major*10000 from 9 on).
    pub fn version_macro(&self) -> u32 {
        let (major, minor, patch) = (
            self.major(),
            self.minor().unwrap_or(0),
            self.patch().unwrap_or(0),
        );
        if major >= 9 {
            major * 10000 + minor * 100 + patch
        } else {
            major * 1000 + minor * 100 + patch
        }
    }
}

impl Ord for CudnnVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts.cmp(&other.parts)
    }
}
impl PartialOrd for CudnnVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for CudnnVersion {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match numeric_parts(text.trim(), 1, 4) {
            Some(parts) => Ok(CudnnVersion { parts }),
            None => Err(VersionError {
                text: text.to_string(),
                what: "cuDNN version",
                expected: "MAJOR[.MINOR[.PATCH[.BUILD]]], e.g. 9.1.0.70",
            }),
        }
    }
}

impl fmt::Display for CudnnVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.parts.iter().map(u32::to_string).collect();
        f.write_str(&text.join("."))
    }
}
serde_via_str!(CudnnVersion);

/// A GPU compute capability (`8.6`, also accepted as `sm_86` or `86`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
    /// `sm_86`.
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
    /// The CUDA binary compatibility rule: a cubin built for `self` runs on `device` when
    /// both have the same major and the device's minor is not lower (sm_80 runs on 8.6;
    /// nothing crosses majors). Source: NVIDIA Blackwell compatibility guide.
    pub fn cubin_runs_on(&self, device: &ComputeCapability) -> bool {
        self.major == device.major && self.minor <= device.minor
    }
    /// PTX for `self` can be JIT-compiled for any device of equal or newer capability.
    pub fn ptx_runs_on(&self, device: &ComputeCapability) -> bool {
        self <= device
    }
}

impl FromStr for ComputeCapability {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || VersionError {
            text: text.to_string(),
            what: "compute capability",
            expected: "MAJOR.MINOR or sm_XY, e.g. 8.6 or sm_86",
        };
        let trimmed = text.trim();
        if let Some(parts) = numeric_parts(trimmed, 2, 2) {
            return Ok(ComputeCapability::new(parts[0], parts[1]));
        }
        let digits = trimmed
            .strip_prefix("sm_")
            .or_else(|| trimmed.strip_prefix("compute_"))
            .unwrap_or(trimmed);
        // Arch suffixes (sm_90a, sm_100f) do not change the capability.
        let digits = digits.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        if digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit()) {
            let (major, minor) = digits.split_at(digits.len() - 1);
            return Ok(ComputeCapability::new(
                major.parse().map_err(|_| error())?,
                minor.parse().map_err(|_| error())?,
            ));
        }
        Err(error())
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
serde_via_str!(ComputeCapability);

/// What a compiled GPU target is specific to, from nvcc's suffixes (CUDA C++ Programming
/// Guide, "Feature Availability": architecture-specific and family-specific features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ArchVariant {
    /// `sm_86`: the usual rules (a cubin runs on its major at an equal or newer minor,
    /// PTX JIT-compiles for any equal or newer GPU).
    #[default]
    Portable,
    /// `sm_100f` / `compute_120f`: family-specific features, so the code runs only within
    /// its major (a cubin's reach is unchanged; PTX no longer JITs for a later major).
    Family,
    /// `sm_90a` / `compute_90a`: architecture-specific features, so the code runs only on
    /// exactly that compute capability.
    Specific,
}

/// A GPU code target as nvcc and cuobjdump name it: `sm_90`, `sm_90a`, `sm_120f`. The
/// device it runs on is the [`ComputeCapability`]; the suffix narrows where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuArch {
    pub cc: ComputeCapability,
    pub variant: ArchVariant,
}

impl GpuArch {
    pub const fn new(cc: ComputeCapability, variant: ArchVariant) -> Self {
        Self { cc, variant }
    }

    /// Whether SASS (a cubin) for this target runs on `device`: the binary compatibility
    /// rule of [`ComputeCapability::cubin_runs_on`], or only `device` itself for `sm_90a`.
    pub fn sass_runs_on(&self, device: &ComputeCapability) -> bool {
        match self.variant {
            ArchVariant::Specific => self.cc == *device,
            ArchVariant::Portable | ArchVariant::Family => self.cc.cubin_runs_on(device),
        }
    }

    /// Whether the driver can JIT-compile PTX for this target to `device` (the PTX ISA
    /// version is a separate condition, see [`PtxIsa`]).
    pub fn ptx_jits_for(&self, device: &ComputeCapability) -> bool {
        match self.variant {
            ArchVariant::Portable => self.cc.ptx_runs_on(device),
            ArchVariant::Family => self.cc.cubin_runs_on(device),
            ArchVariant::Specific => self.cc == *device,
        }
    }

    fn suffix(&self) -> &'static str {
        match self.variant {
            ArchVariant::Portable => "",
            ArchVariant::Family => "f",
            ArchVariant::Specific => "a",
        }
    }
}

impl FromStr for GpuArch {
    type Err = VersionError;
    /// `sm_90a`, `compute_120f`, `sm_86`, `9.0a`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let variant = match trimmed.chars().last() {
            Some('a') => ArchVariant::Specific,
            Some('f') => ArchVariant::Family,
            _ => ArchVariant::Portable,
        };
        let digits = match variant {
            ArchVariant::Portable => trimmed,
            _ => &trimmed[..trimmed.len() - 1],
        };
        let error = || VersionError {
            text: text.to_string(),
            what: "GPU architecture",
            expected: "sm_XY with an optional a or f suffix, e.g. sm_86, sm_90a, sm_120f",
        };
        // ComputeCapability forgives any trailing letters; an arch must not: `sm_100x` from
        // a newer writer or a hostile label is no plain sm_100 (that would reach the most
        // GPUs).
        let number = digits
            .strip_prefix("sm_")
            .or_else(|| digits.strip_prefix("compute_"))
            .unwrap_or(digits);
        if !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(error());
        }
        let cc = ComputeCapability::from_str(digits).map_err(|_| error())?;
        Ok(Self { cc, variant })
    }
}

impl fmt::Display for GpuArch {
    /// `sm_90a`: the cuobjdump spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.cc.sm(), self.suffix())
    }
}
serde_via_str!(GpuArch);

/// A PTX ISA version (`.version 8.1` in PTX text, and the version field of a fatbin's PTX
/// entry). The driver JIT-compiles PTX only up to the ISA of the CUDA release it supports:
/// minor version compatibility does not extend to PTX (CUDA Compatibility guide, "Minor
/// Version Compatibility", limitation "Applications that use PTX").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PtxIsa {
    pub major: u32,
    pub minor: u32,
}

/// PTX ISA version -> the CUDA release that introduced it, oldest first. Sources: NVIDIA,
/// "Parallel Thread Execution ISA", chapter "Release Notes", table "PTX Release History"
/// (docs.nvidia.com/cuda/parallel-thread-execution/#release-notes), as NVIDIA's cuda-python
/// copies it for 5.0 .. 9.1 (`cuda_bindings/cuda/bindings/utils/_ptx_utils.py`,
/// `_ptx_to_cuda`). CUDA 12.6 kept ISA 8.5, and ISA 8.6 is listed for CUDA 12.7, a version
/// that was never released. So a CUDA 12.6 driver does not read 8.6. 9.4 = CUDA 13.4 and
/// 9.5 = CUDA 13.5 are as the PTX ISA 9.4 and 9.5 documents name them. 9.2 and 9.3 follow
/// the one-to-one numbering of 13.x (not read from a source). Checked against real
/// libraries: cuDNN 8.9.2.26 (built with 12.1) carries ISA 8.1, cuDNN 9.1.0.70 ISA 8.4,
/// cuDNN 9.28.0.42 ISA 8.8 (12.9).
pub const PTX_ISA_RELEASES: &[(PtxIsa, CudaVersion)] = &[
    (PtxIsa::new(5, 0), CudaVersion::new(8, 0, None)),
    (PtxIsa::new(6, 0), CudaVersion::new(9, 0, None)),
    (PtxIsa::new(6, 1), CudaVersion::new(9, 1, None)),
    (PtxIsa::new(6, 2), CudaVersion::new(9, 2, None)),
    (PtxIsa::new(6, 3), CudaVersion::new(10, 0, None)),
    (PtxIsa::new(6, 4), CudaVersion::new(10, 1, None)),
    (PtxIsa::new(6, 5), CudaVersion::new(10, 2, None)),
    (PtxIsa::new(7, 0), CudaVersion::new(11, 0, None)),
    (PtxIsa::new(7, 1), CudaVersion::new(11, 1, None)),
    (PtxIsa::new(7, 2), CudaVersion::new(11, 2, None)),
    (PtxIsa::new(7, 3), CudaVersion::new(11, 3, None)),
    (PtxIsa::new(7, 4), CudaVersion::new(11, 4, None)),
    (PtxIsa::new(7, 5), CudaVersion::new(11, 5, None)),
    (PtxIsa::new(7, 6), CudaVersion::new(11, 6, None)),
    (PtxIsa::new(7, 7), CudaVersion::new(11, 7, None)),
    (PtxIsa::new(7, 8), CudaVersion::new(11, 8, None)),
    (PtxIsa::new(8, 0), CudaVersion::new(12, 0, None)),
    (PtxIsa::new(8, 1), CudaVersion::new(12, 1, None)),
    (PtxIsa::new(8, 2), CudaVersion::new(12, 2, None)),
    (PtxIsa::new(8, 3), CudaVersion::new(12, 3, None)),
    (PtxIsa::new(8, 4), CudaVersion::new(12, 4, None)),
    (PtxIsa::new(8, 5), CudaVersion::new(12, 5, None)),
    (PtxIsa::new(8, 6), CudaVersion::new(12, 7, None)),
    (PtxIsa::new(8, 7), CudaVersion::new(12, 8, None)),
    (PtxIsa::new(8, 8), CudaVersion::new(12, 9, None)),
    (PtxIsa::new(9, 0), CudaVersion::new(13, 0, None)),
    (PtxIsa::new(9, 1), CudaVersion::new(13, 1, None)),
    (PtxIsa::new(9, 2), CudaVersion::new(13, 2, None)),
    (PtxIsa::new(9, 3), CudaVersion::new(13, 3, None)),
    (PtxIsa::new(9, 4), CudaVersion::new(13, 4, None)),
    (PtxIsa::new(9, 5), CudaVersion::new(13, 5, None)),
];

impl PtxIsa {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The CUDA release line that introduced this ISA; None for an ISA newer than the table.
    pub fn cuda(&self) -> Option<CudaVersion> {
        PTX_ISA_RELEASES
            .iter()
            .find(|(isa, _)| isa == self)
            .map(|(_, cuda)| *cuda)
    }

    /// The newest ISA a driver that supports CUDA `cuda` can JIT-compile.
    pub fn newest_for(cuda: CudaVersion) -> Option<PtxIsa> {
        PTX_ISA_RELEASES
            .iter()
            .filter(|(_, release)| *release <= cuda.line())
            .map(|(isa, _)| *isa)
            .max()
    }
}

impl FromStr for PtxIsa {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        numeric_parts(text.trim(), 2, 2)
            .map(|parts| PtxIsa::new(parts[0], parts[1]))
            .ok_or_else(|| VersionError {
                text: text.to_string(),
                what: "PTX ISA version",
                expected: "MAJOR.MINOR, e.g. 8.1",
            })
    }
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
serde_via_str!(PtxIsa);

/// A CPython `major.minor` version (`3.11`), the unit wheels are tagged with (`cp311`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PythonVersion {
    pub major: u32,
    pub minor: u32,
}

impl PythonVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
    /// The CPython wheel tag, `cp311`.
    pub fn cp_tag(&self) -> String {
        format!("cp{}{}", self.major, self.minor)
    }
    /// Parse a `cp311` tag.
    pub fn from_cp_tag(tag: &str) -> Option<Self> {
        let digits = tag.strip_prefix("cp")?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (major, minor) = digits.split_at(1);
        Some(PythonVersion::new(major.parse().ok()?, minor.parse().ok()?))
    }
}

impl PythonVersion {
    /// The full version for `python_full_version` markers and `Requires-Python` checks:
    /// the patch is unknown and taken as `.0` (`3.11` -> `3.11.0`).
    pub fn full(&self) -> pep440_rs::Version {
        pep440_rs::Version::new([u64::from(self.major), u64::from(self.minor), 0])
    }
}

impl FromStr for PythonVersion {
    type Err = VersionError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(version) = PythonVersion::from_cp_tag(text.trim()) {
            return Ok(version);
        }
        match numeric_parts(text.trim(), 2, 2) {
            Some(parts) if parts[0] == 3 => Ok(PythonVersion::new(parts[0], parts[1])),
            _ => Err(VersionError {
                text: text.to_string(),
                what: "Python version",
                expected: "3.MINOR, e.g. 3.11",
            }),
        }
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
serde_via_str!(PythonVersion);

/// A glibc version: the release of an image's `libc.so.6` (`2.36`), the level a manylinux
/// tag promises (`manylinux_2_28` -> `2.28`), or a symbol version a binary needs
/// (`GLIBC_2.2.5`). Ordered numerically; printed without a zero patch (`2.28`, `2.2.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GlibcVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl GlibcVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self {
            major,
            minor,
            patch: 0,
        }
    }
}

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.patch == 0 {
            write!(f, "{}.{}", self.major, self.minor)
        } else {
            write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
        }
    }
}

/// Error for a version name that is not `GLIBC_<n>.<n>[.<n>]` (or a bare `<n>.<n>[.<n>]`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{0}` is not a glibc version (expected GLIBC_2.34 or 2.34)")]
pub struct GlibcVersionError(String);

impl FromStr for GlibcVersion {
    type Err = GlibcVersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let numbers = s.strip_prefix("GLIBC_").unwrap_or(s);
        let parts: Vec<&str> = numbers.split('.').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(GlibcVersionError(s.to_string()));
        }
        let mut values = [0u32; 3];
        for (slot, part) in values.iter_mut().zip(&parts) {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(GlibcVersionError(s.to_string()));
            }
            *slot = part.parse().map_err(|_| GlibcVersionError(s.to_string()))?;
        }
        Ok(GlibcVersion {
            major: values[0],
            minor: values[1],
            patch: values[2],
        })
    }
}
serde_via_str!(GlibcVersion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_compare_numerically() {
        let a: DriverVersion = "535.104.05".parse().unwrap();
        let b: DriverVersion = "535.104.5".parse().unwrap();
        let c: DriverVersion = "570.26".parse().unwrap();
        assert_eq!(a, b);
        assert!(c > a);
        assert_eq!(a.to_string(), "535.104.05");
        assert!("12.1".parse::<DriverVersion>().is_err());
        assert!("abc".parse::<DriverVersion>().is_err());
    }

    #[test]
    fn cuda_versions_parse_lines_exact_and_variants() {
        let line: CudaVersion = "12.1".parse().unwrap();
        let exact: CudaVersion = "12.1.1".parse().unwrap();
        assert!(line.matches(&exact));
        assert!(!exact.matches(&"12.1.0".parse().unwrap()));
        assert_eq!("cu121".parse::<CudaVersion>().unwrap(), line);
        assert_eq!("cu118".parse::<CudaVersion>().unwrap().to_string(), "11.8");
        assert_eq!("cu130".parse::<CudaVersion>().unwrap().to_string(), "13.0");
        assert!("12".parse::<CudaVersion>().is_err());
        assert!(exact > line);
    }

    #[test]
    fn cudnn_macro_changes_scheme_at_9() {
        assert_eq!(
            "8.9.2.26".parse::<CudnnVersion>().unwrap().version_macro(),
            8902
        );
        assert_eq!(
            "9.1.0.70".parse::<CudnnVersion>().unwrap().version_macro(),
            90100
        );
        assert_eq!(
            "9.10.2.21".parse::<CudnnVersion>().unwrap().version_macro(),
            91002
        );
        let prefix: CudnnVersion = "9.1".parse().unwrap();
        assert!(prefix.matches(&"9.1.0.70".parse().unwrap()));
        assert!(!prefix.matches(&"9.10.2.21".parse().unwrap()));
    }

    #[test]
    fn compute_capability_rules() {
        let sm80: ComputeCapability = "sm_80".parse().unwrap();
        let cc86: ComputeCapability = "8.6".parse().unwrap();
        let sm90a: ComputeCapability = "sm_90a".parse().unwrap();
        let sm120: ComputeCapability = "sm_120".parse().unwrap();
        assert_eq!(sm90a, ComputeCapability::new(9, 0));
        assert_eq!(sm120, ComputeCapability::new(12, 0));
        assert!(sm80.cubin_runs_on(&cc86));
        assert!(!cc86.cubin_runs_on(&sm80));
        assert!(!sm80.cubin_runs_on(&ComputeCapability::new(9, 0)));
        assert!(sm80.ptx_runs_on(&sm120));
    }

    #[test]
    fn arch_suffixes_narrow_where_code_runs() {
        let cc = |text: &str| text.parse::<ComputeCapability>().unwrap();
        let arch = |text: &str| text.parse::<GpuArch>().unwrap();
        assert_eq!(arch("sm_90a").to_string(), "sm_90a");
        assert_eq!(arch("compute_120f").to_string(), "sm_120f");
        assert_eq!(arch("sm_86").variant, ArchVariant::Portable);
        assert!(arch("sm_90a").sass_runs_on(&cc("9.0")));
        assert!(!arch("sm_90a").sass_runs_on(&cc("9.1")));
        assert!(arch("sm_90").sass_runs_on(&cc("9.1")));
        assert!(arch("sm_100f").sass_runs_on(&cc("10.3")));
        assert!(!arch("sm_100").sass_runs_on(&cc("12.0")));
        assert!(arch("sm_90").ptx_jits_for(&cc("12.0")));
        assert!(!arch("sm_90a").ptx_jits_for(&cc("10.0")));
        assert!(arch("sm_120f").ptx_jits_for(&cc("12.1")));
        assert!(!arch("sm_100f").ptx_jits_for(&cc("12.0")));
        assert!("sm_x".parse::<GpuArch>().is_err());
        assert!("a".parse::<GpuArch>().is_err());
        assert!(arch("sm_90a") > arch("sm_90"));
    }

    #[test]
    fn ptx_isa_table_maps_to_cuda_releases() {
        let isa = |text: &str| text.parse::<PtxIsa>().unwrap();
        let cuda = |text: &str| text.parse::<CudaVersion>().unwrap();
        assert_eq!(isa("8.0").cuda(), Some(cuda("12.0")));
        assert_eq!(isa("8.6").cuda(), Some(cuda("12.7")));
        assert_eq!(isa("8.7").cuda(), Some(cuda("12.8")));
        assert_eq!(isa("9.9").cuda(), None);
        for bad in ["sm_100x", "compute_90A", "sm_90aa", "sm_", "sm_9b0"] {
            assert!(bad.parse::<GpuArch>().is_err(), "{bad}");
        }
        for good in ["sm_90a", "compute_120f", "sm_86", "9.0a", "compute_90"] {
            assert!(good.parse::<GpuArch>().is_ok(), "{good}");
        }
        assert_eq!(PtxIsa::newest_for(cuda("12.2")), Some(isa("8.2")));
        assert_eq!(PtxIsa::newest_for(cuda("12.4.1")), Some(isa("8.4")));
        // CUDA 12.6 kept ISA 8.5: its driver does not read 8.6.
        assert_eq!(PtxIsa::newest_for(cuda("12.6")), Some(isa("8.5")));
        assert_eq!(PtxIsa::newest_for(cuda("13.5")), Some(isa("9.5")));
        assert_eq!(PtxIsa::newest_for(cuda("7.5")), None);
        assert!(PTX_ISA_RELEASES.windows(2).all(|w| w[0] < w[1]));
        assert!("8".parse::<PtxIsa>().is_err());
    }

    #[test]
    fn python_versions_and_tags() {
        let py: PythonVersion = "3.11".parse().unwrap();
        assert_eq!(py.cp_tag(), "cp311");
        assert_eq!(
            PythonVersion::from_cp_tag("cp39"),
            Some(PythonVersion::new(3, 9))
        );
        assert_eq!(
            "cp313".parse::<PythonVersion>().unwrap().to_string(),
            "3.13"
        );
        assert!("2.7".parse::<PythonVersion>().is_err());
        assert_eq!(py.full().to_string(), "3.11.0");
    }

    #[test]
    fn glibc_versions_parse_symbol_names_and_levels() {
        let level: GlibcVersion = "2.28".parse().unwrap();
        assert_eq!(level, GlibcVersion::new(2, 28));
        assert_eq!(level.to_string(), "2.28");
        let symbol: GlibcVersion = "GLIBC_2.2.5".parse().unwrap();
        assert_eq!(symbol.to_string(), "2.2.5");
        assert!(symbol < GlibcVersion::new(2, 5));
        assert_eq!(serde_json::to_string(&level).unwrap(), "\"2.28\"");
        assert_eq!(
            serde_json::from_str::<GlibcVersion>("\"2.36\"").unwrap(),
            GlibcVersion::new(2, 36)
        );
        assert!("2_28".parse::<GlibcVersion>().is_err());
    }
}
