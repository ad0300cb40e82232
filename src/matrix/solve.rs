//! `cudastack solve`: the intersection of what a host's driver allows (a ceiling), what its
//! GPUs need (a floor: kernels for their compute capability) and what the user asks
//! (torch and Python versions), ranked, with the reason each build was chosen or rejected.
//!
//! Ranking puts first what the user can lock and trust: builds on an index the host reaches
//! ([`Reach`]: by default PyPI only, what a recipe without `index:` locks from), then builds
//! that need no minor-version compatibility, then rows read from the wheels or a primary
//! source before partial or unconfirmed ones, then the newest torch. A rejection says whether
//! the stack would not run ([`RejectedBy::Compatibility`]) or cudastack cannot lock it
//! ([`RejectedBy::CudastackLimit`]); when nothing fits, [`Solution::changes`] holds the
//! smallest single changes to the query that make something fit, found by solving again.
//! Solving reads no network: what the host reaches is the user's `--index`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use pep440_rs::{Operator, VersionSpecifiers};
use serde::{Serialize, Serializer};

use super::{GpuDrivers, KernelSupport, Matrix, TorchBuild};
use crate::recipe::{Platform, TorchIndex};
use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, CudaVersion, DriverVersion, PythonVersion};

/// The first PyPI torch release with CUDA wheels for linux/aarch64; older releases were
/// CPU-only there, and PyTorch's own cuXYZ indexes are not locked for arm64. The same fact
/// as `lock::inputs::FIRST_ARM64_CUDA_TORCH` (matrix sits below lock and cannot import it).
pub const FIRST_ARM64_CUDA_TORCH: &str = "2.11.0";

#[derive(Debug, Clone, Default)]
pub struct SolveQuery {
    pub driver: Option<DriverVersion>,
    pub gpus: Vec<TargetGpu>,
    pub torch: Option<VersionSpecifiers>,
    pub python: Option<PythonVersion>,
    /// Also accept builds that need CUDA minor-version compatibility on this driver.
    pub allow_minor_compat: bool,
    /// The torch indexes the host reaches (builds elsewhere rank after those on them).
    pub index: Reach,
}

/// Which torch indexes the host that locks the recipe reaches, besides PyPI (which every
/// lock reads). Given by the user, never probed: a probe would slow every call and answer
/// for this machine, not for the one that runs `cudastack lock`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Reach {
    /// PyPI only: what a recipe without `index:` locks from.
    #[default]
    Pypi,
    /// PyTorch's per-CUDA indexes under `root` (`https://download.pytorch.org/whl/`, or a
    /// mirror of that tree), and PyPI.
    PyTorch { root: String },
    /// One per-CUDA index (`cu121`, at PyTorch's or at a mirror's `url`), and PyPI.
    Variant { variant: String, url: String },
}

impl Reach {
    /// Every index a build can come from: PyTorch's own, and PyPI.
    pub fn pytorch() -> Reach {
        Reach::PyTorch {
            root: TorchIndex::PYTORCH_INDEX_ROOT.to_string(),
        }
    }

    /// Whether a lock on this host can read `build`.
    pub fn reaches(&self, build: &TorchBuild) -> bool {
        self.reaches_build(build.pypi_default, &build.variant)
    }

    fn reaches_build(&self, on_pypi: bool, build_variant: &str) -> bool {
        on_pypi
            || match self {
                Reach::Pypi => false,
                Reach::PyTorch { .. } => true,
                Reach::Variant { variant, .. } => variant == build_variant,
            }
    }

    /// Where the lock reads a build of PyTorch's `variant` index from: this host's mirror
    /// when it names one, else PyTorch's own.
    pub fn index_for(&self, variant: &str) -> TorchIndex {
        let url = match self {
            Reach::PyTorch { root } => format!("{root}{variant}"),
            Reach::Variant { variant: only, url } if only == variant => url.clone(),
            _ => format!("{}{variant}", TorchIndex::PYTORCH_INDEX_ROOT),
        };
        TorchIndex::Variant {
            variant: variant.to_string(),
            url,
        }
    }
}

impl FromStr for Reach {
    type Err = String;
    /// `pypi`, `pytorch`, a variant (`cu121`), an index URL ending in one, or the root of a
    /// mirror of PyTorch's indexes (`https://mirror/whl/`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("pytorch") {
            return Ok(Reach::pytorch());
        }
        let variant_error = match text.parse::<TorchIndex>() {
            Ok(TorchIndex::Pypi) => return Ok(Reach::Pypi),
            Ok(TorchIndex::Variant { variant, url }) => return Ok(Reach::Variant { variant, url }),
            Err(error) => error,
        };
        if text.starts_with("https://") || text.starts_with("http://") {
            // A mirror's root: valid when an index under it would be (no credentials).
            let root = format!("{}/", text.trim_end_matches('/'));
            return match format!("{root}cu000").parse::<TorchIndex>() {
                Ok(_) => Ok(Reach::PyTorch { root }),
                Err(_) => Err(format!(
                    "torch index URL `{}` carries credentials, which the lock would record; cudastack reads the torch index without any\n  hint: give the index's URL without `user:password@`",
                    crate::recipe::masked_urls(text)
                )),
            };
        }
        Err(format!(
            "{variant_error}\n  hint: `--index pypi` (PyPI only, the default), `pytorch` (PyTorch's indexes too), `cu121`, or a mirror's URL"
        ))
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reach::Pypi => f.write_str("pypi"),
            Reach::PyTorch { root } if root == TorchIndex::PYTORCH_INDEX_ROOT => {
                f.write_str("pytorch")
            }
            Reach::PyTorch { root } => f.write_str(root),
            Reach::Variant { variant, url } => f.write_str(
                &TorchIndex::Variant {
                    variant: variant.clone(),
                    url: url.clone(),
                }
                .to_string(),
            ),
        }
    }
}

impl Serialize for Reach {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SolveError {
    #[error("GPU `{name}` is not in the matrix{}\n  hint: give its compute capability instead (e.g. `8.6`; `nvidia-smi --query-gpu=name,compute_cap --format=csv` prints it), or pick a name from `cudastack matrix --table gpus`", did_you_mean(.suggestions))]
    UnknownGpu {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("`{text}` is not a valid torch version specifier: {message}")]
    BadTorchSpec { text: String, message: String },
}

impl SolveQuery {
    /// Resolve a GPU given by name or by compute capability.
    pub fn gpu(matrix: &Matrix, name_or_cc: &str) -> Result<TargetGpu, SolveError> {
        matrix
            .target_gpu(name_or_cc)
            .ok_or_else(|| SolveError::UnknownGpu {
                name: name_or_cc.to_string(),
                suggestions: matrix.gpu_suggestions(name_or_cc),
            })
    }

    /// Parse `2.4.1` (exact), `2.4` (the series `==2.4.*`), `==2.4.*` or
    /// `>=2.3,<2.6`.
    pub fn torch_spec(text: &str) -> Result<VersionSpecifiers, SolveError> {
        let trimmed = text.trim();
        let spec = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
            match trimmed.parse::<pep440_rs::Version>() {
                Ok(version) if crate::recipe::is_series(&version) => format!("=={trimmed}.*"),
                _ => format!("=={trimmed}"),
            }
        } else {
            trimmed.to_string()
        };
        VersionSpecifiers::from_str(&spec).map_err(|e| SolveError::BadTorchSpec {
            text: text.to_string(),
            message: e.to_string(),
        })
    }
}

/// `; did you mean `A10`, `A100`?` for the closest known names, or nothing.
pub fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        return String::new();
    }
    let names: Vec<String> = suggestions.iter().map(|name| format!("`{name}`")).collect();
    format!("; did you mean {}?", names.join(", "))
}

#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub torch_build: String,
    pub torch: String,
    pub variant: String,
    pub index: String,
    pub cuda: CudaVersion,
    pub cudnn: Option<String>,
    pub python: Option<PythonVersion>,
    pub accepted: bool,
    /// On an index the host reaches ([`SolveQuery::index`]): its recipe locks there.
    pub reachable: bool,
    /// Needs CUDA minor-version compatibility on the given driver.
    pub minor_compat: bool,
    /// How sure the matrix row is, as a plain word (`derived`, `confirmed`, `partial`,
    /// `unconfirmed`; see [`super::Status::meaning`]).
    pub status: String,
    /// Why it was accepted (every check it passed) or the first reason it was rejected.
    pub reasons: Vec<String>,
    /// For a rejected build: what rejected it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_by: Option<RejectedBy>,
    /// A recipe to paste, for accepted candidates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
}

/// What rejected a build: the query, a compatibility fact (the stack would not run), or a
/// limit of cudastack's own (the stack would run, cudastack cannot lock it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectedBy {
    /// The torch version asked for.
    Query,
    Compatibility,
    CudastackLimit,
}

/// One change to the query that makes a build fit when nothing does.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub kind: ChangeKind,
    /// The change in words (`driver 580.65.06 or newer (R580 branch)`).
    pub change: String,
    /// The driver to install, for a driver change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverVersion>,
    /// The best answer after the change.
    pub torch_build: String,
    pub index: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Driver,
    Python,
    Gpu,
    Torch,
    MinorCompat,
}

#[derive(Debug, Clone, Serialize)]
pub struct Solution {
    pub driver: Option<DriverVersion>,
    /// The indexes the ranking took as reachable (`pypi`, `pytorch`, a variant or URL).
    pub index: Reach,
    /// The newest CUDA the driver supports natively.
    pub cuda_ceiling: Option<CudaVersion>,
    pub gpus: Vec<TargetGpu>,
    /// The drivers each GPU runs on at all (its minimum, or the last branch that still
    /// runs it), where the matrix knows them.
    pub gpu_drivers: Vec<GpuDrivers>,
    /// What the answer took the query to mean (`torch 2.5 means the 2.5 series; ...`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Accepted first (ranked), then rejected.
    pub candidates: Vec<Candidate>,
    /// The limits of cudastack's own that rejected builds the stack would run, each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
    /// When nothing fits: the smallest single changes that make a build fit, one per kind.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
}

impl Solution {
    pub fn accepted(&self) -> impl Iterator<Item = &Candidate> {
        self.candidates.iter().filter(|c| c.accepted)
    }
    pub fn best(&self) -> Option<&Candidate> {
        self.accepted().next()
    }
}

pub fn solve(matrix: &Matrix, query: &SolveQuery) -> Solution {
    let ceiling = query
        .driver
        .as_ref()
        .and_then(|driver| matrix.cuda_ceiling(driver));
    let mut candidates: Vec<(Candidate, &TorchBuild)> = matrix
        .torch_builds
        .iter()
        .map(|build| (judge(matrix, query, build), build))
        .collect();
    candidates.sort_by(|(a, build_a), (b, build_b)| rank(a, build_a, b, build_b));
    let candidates: Vec<Candidate> = candidates.into_iter().map(|(c, _)| c).collect();
    let mut notes: Vec<String> = series_note(query, candidates.iter().find(|c| c.accepted))
        .into_iter()
        .collect();
    notes.extend(index_note(matrix, query, &candidates));
    Solution {
        driver: query.driver.clone(),
        index: query.index.clone(),
        cuda_ceiling: ceiling,
        gpus: query.gpus.clone(),
        gpu_drivers: gpu_drivers(matrix, query),
        notes,
        limits: limits(matrix, query, &candidates),
        changes: if candidates.iter().any(|c| c.accepted) {
            Vec::new()
        } else {
            changes(matrix, query)
        },
        candidates,
    }
}

/// The best answer to `query` alone (no notes, no changes): what the searches of other
/// queries ask.
fn best_of(matrix: &Matrix, query: &SolveQuery) -> Option<Candidate> {
    matrix
        .torch_builds
        .iter()
        .map(|build| (judge(matrix, query, build), build))
        .filter(|(candidate, _)| candidate.accepted)
        .min_by(|(a, build_a), (b, build_b)| rank(a, build_a, b, build_b))
        .map(|(candidate, _)| candidate)
}

/// The order of candidates. Accepted first, ranked by what a user would pick: a build the
/// host can lock (on an index it reaches) before one it cannot; native before
/// minor-version compatibility (which needs a setting and a compat package); a row read
/// from the wheels or a primary source before a partial or unconfirmed one (a guess must
/// not outrank a fact, however new); the newest torch; then, among builds of one release,
/// the surer row, the PyPI build (no extra index to trust) and the newest CUDA. Rejected
/// builds follow, newest torch first.
fn rank(a: &Candidate, build_a: &TorchBuild, b: &Candidate, build_b: &TorchBuild) -> Ordering {
    let accepted_only = |ordering: Ordering| {
        if a.accepted && b.accepted {
            ordering
        } else {
            Ordering::Equal
        }
    };
    b.accepted
        .cmp(&a.accepted)
        .then(accepted_only(b.reachable.cmp(&a.reachable)))
        .then(accepted_only(a.minor_compat.cmp(&b.minor_compat)))
        .then(accepted_only(
            build_b
                .status
                .is_confirmed()
                .cmp(&build_a.status.is_confirmed()),
        ))
        .then(build_b.torch.cmp(&build_a.torch))
        .then(certainty(build_a).cmp(&certainty(build_b)))
        .then(build_b.pypi_default.cmp(&build_a.pypi_default))
        .then(b.cuda.cmp(&a.cuda))
}

/// What the ranking by reachable index changed: the best answer needs an index the host
/// may not reach, or a build on another index would rank first where it is reachable.
fn index_note(matrix: &Matrix, query: &SolveQuery, candidates: &[Candidate]) -> Option<String> {
    let best = candidates.first().filter(|c| c.accepted)?;
    if !best.reachable {
        let index = query.index.index_for(&best.variant);
        let url = match &index {
            TorchIndex::Variant { url, .. } => url.clone(),
            TorchIndex::Pypi => String::new(),
        };
        return Some(format!(
            "no build on {} fits; the best answer needs PyTorch's {} index ({url}): `cudastack lock` of its recipe fails where that index is not reachable; give `--index pytorch` (or a mirror's URL) where it is",
            reach_words(&query.index),
            best.variant
        ));
    }
    if query.index == Reach::pytorch() {
        return None;
    }
    let everywhere = best_of(
        matrix,
        &SolveQuery {
            index: Reach::pytorch(),
            ..query.clone()
        },
    );
    let other = everywhere.filter(|other| !other.reachable_with(&query.index))?;
    let default = if query.index == Reach::Pypi {
        " (the default: what a recipe without `index:` locks from)"
    } else {
        ""
    };
    Some(format!(
        "ranked for `--index {}`{default}; with `--index pytorch` (where download.pytorch.org is reachable) the best answer would be torch {} ({}) from PyTorch's {} index",
        query.index, other.torch_build, other.status, other.variant
    ))
}

/// `PyPI`, `PyPI or the cu118 index`: what `--index` lets in, in words.
fn reach_words(reach: &Reach) -> String {
    match reach {
        Reach::Pypi => "PyPI".to_string(),
        Reach::PyTorch { root } => format!("PyPI or the indexes under {root}"),
        Reach::Variant { variant, .. } => format!("PyPI or the {variant} index"),
    }
}

impl Candidate {
    /// Whether the build is on an index `reach` lets in.
    fn reachable_with(&self, reach: &Reach) -> bool {
        reach.reaches_build(self.index == "pypi", &self.variant)
    }
}

/// The smallest single changes to `query` that make a build fit, at most one per kind, each
/// found by solving again with that change alone: the nearest driver (the lowest above the
/// host's, else the highest below it for a GPU later branches dropped), the nearest other
/// Python, a GPU left out (or, for one GPU, the nearest compute capability instead), any
/// torch, minor-version compatibility.
fn changes(matrix: &Matrix, query: &SolveQuery) -> Vec<Change> {
    let best = |changed: SolveQuery| best_of(matrix, &changed);
    let mut found: Vec<(ChangeKind, String, Option<DriverVersion>, Candidate)> = Vec::new();
    if let Some(driver) = &query.driver {
        let drivers = known_drivers(matrix);
        let with = |other: &DriverVersion| {
            best(SolveQuery {
                driver: Some(other.clone()),
                ..query.clone()
            })
            .map(|fits| (other.clone(), fits))
        };
        let up = drivers.iter().filter(|d| *d > driver).find_map(with);
        let newest_fits = drivers.last().and_then(with).is_some();
        let change = match up {
            Some(up) => Some((up, newest_fits)),
            None => drivers
                .iter()
                .rev()
                .filter(|d| *d < driver)
                .find_map(with)
                .map(|down| (down, false)),
        };
        if let Some(((to, fits), or_newer)) = change {
            let newer = if or_newer { " or newer" } else { "" };
            let text = if to.to_string() == to.branch().to_string() {
                format!("the R{} driver branch{newer}", to.branch())
            } else {
                format!("driver {to}{newer} (R{} branch)", to.branch())
            };
            found.push((ChangeKind::Driver, text, Some(to), fits));
        }
    }
    if let Some(python) = query.python {
        let mut pythons: Vec<PythonVersion> = matrix
            .torch_builds
            .iter()
            .flat_map(|build| build.python.iter().copied())
            .filter(|other| *other != python)
            .collect();
        pythons.sort_by_key(|other| (python_distance(python, *other), std::cmp::Reverse(*other)));
        pythons.dedup();
        if let Some((other, fits)) = pythons.into_iter().find_map(|other| {
            best(SolveQuery {
                python: Some(other),
                ..query.clone()
            })
            .map(|fits| (other, fits))
        }) {
            found.push((
                ChangeKind::Python,
                format!("Python {other} instead of {python}"),
                None,
                fits,
            ));
        }
    }
    if let Some(change) = gpu_change(matrix, query, &best) {
        found.push(change);
    }
    if let Some(spec) = &query.torch {
        if let Some(fits) = best(SolveQuery {
            torch: None,
            ..query.clone()
        }) {
            found.push((
                ChangeKind::Torch,
                format!("any torch, not {spec}"),
                None,
                fits,
            ));
        }
    }
    if !query.allow_minor_compat {
        if let Some(fits) = best(SolveQuery {
            allow_minor_compat: true,
            ..query.clone()
        }) {
            found.push((
                ChangeKind::MinorCompat,
                "allowing minor-version compatibility".to_string(),
                None,
                fits,
            ));
        }
    }
    found
        .into_iter()
        .map(|(kind, change, driver, fits)| Change {
            kind,
            change,
            driver,
            torch_build: fits.torch_build,
            index: fits.index,
        })
        .collect()
}

/// A GPU left out of several (the first whose absence lets a build fit), or for a single
/// GPU the known GPU nearest in compute capability that fits instead.
fn gpu_change(
    matrix: &Matrix,
    query: &SolveQuery,
    best: &impl Fn(SolveQuery) -> Option<Candidate>,
) -> Option<(ChangeKind, String, Option<DriverVersion>, Candidate)> {
    if query.gpus.len() > 1 {
        return query.gpus.iter().enumerate().find_map(|(at, gpu)| {
            let mut gpus = query.gpus.clone();
            gpus.remove(at);
            best(SolveQuery {
                gpus,
                ..query.clone()
            })
            .map(|fits| (ChangeKind::Gpu, format!("without {}", gpu.name), None, fits))
        });
    }
    let [gpu] = &query.gpus[..] else {
        return None;
    };
    let mut others: Vec<TargetGpu> = matrix
        .gpus
        .iter()
        .filter(|other| other.name != gpu.name)
        .map(|other| TargetGpu {
            name: other.name.clone(),
            cc: other.cc,
        })
        .collect();
    // Stable: among GPUs as near, the matrix's order.
    others.sort_by_key(|other| {
        (
            other.cc.major.abs_diff(gpu.cc.major),
            other.cc.minor.abs_diff(gpu.cc.minor),
        )
    });
    others.into_iter().find_map(|other| {
        let text = format!("{} instead of {}", other.label(), gpu.name);
        best(SolveQuery {
            gpus: vec![other],
            ..query.clone()
        })
        .map(|fits| (ChangeKind::Gpu, text, None, fits))
    })
}

/// How far apart two Python versions are, in minor releases (a major apart: far).
fn python_distance(a: PythonVersion, b: PythonVersion) -> u32 {
    if a.major == b.major {
        a.minor.abs_diff(b.minor)
    } else {
        u32::MAX
    }
}

/// Every driver the matrix names (toolkit minimums, minor-version-compatibility floors,
/// GPU minimums), oldest first: the drivers a change of driver is tried with.
fn known_drivers(matrix: &Matrix) -> Vec<DriverVersion> {
    let mut drivers: Vec<DriverVersion> = matrix
        .cuda_releases
        .iter()
        .map(|row| row.min_driver.clone())
        .chain(matrix.minor_compat.iter().map(|row| row.min_driver.clone()))
        .chain(
            matrix
                .arch_min_drivers
                .iter()
                .map(|row| row.min_driver.clone()),
        )
        .chain(
            matrix
                .gpus
                .iter()
                .filter_map(|gpu| gpu.min_driver.as_ref().map(|own| own.driver.clone())),
        )
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers
}

fn gpu_drivers(matrix: &Matrix, query: &SolveQuery) -> Vec<GpuDrivers> {
    query
        .gpus
        .iter()
        .filter_map(|gpu| matrix.gpu_drivers(gpu))
        .collect()
}

/// `torch 2.5 means the 2.5 series (==2.5.*); picked 2.5.1, ...` when the torch query is
/// one release series (a two-part version is a series, not `==2.5.0`).
fn series_note(query: &SolveQuery, best: Option<&Candidate>) -> Option<String> {
    let spec = query.torch.as_ref()?;
    let [only] = &spec.iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    if *only.operator() != Operator::EqualStar {
        return None;
    }
    let series = only.version();
    let meaning = format!("torch {series} means the {series} series ({spec})");
    Some(match best {
        Some(best) => format!(
            "{meaning}; picked {}, its newest release that fits the rest of the query (give a three-part version such as {} to pin one)",
            best.torch, best.torch
        ),
        None => format!("{meaning}; no release of it fits"),
    })
}

/// The rank of a row's status, surest first (the order of [`super::Status::ALL`]).
fn certainty(build: &TorchBuild) -> usize {
    super::Status::ALL
        .iter()
        .position(|status| *status == build.status)
        .unwrap_or(usize::MAX)
}

/// The platform the recipe must build when a target GPU exists only next to an Arm host
/// (GH200, GB200: `host:` in the matrix), with that GPU's name.
fn arm_host(matrix: &Matrix, query: &SolveQuery) -> Option<(Platform, String)> {
    query.gpus.iter().find_map(|gpu| {
        let host = matrix.gpu(&gpu.name).and_then(|known| known.host)?;
        Some((host, gpu.name.clone()))
    })
}

/// One build against the query: accepted with its reasons and a recipe, or rejected with
/// the first reason it does not fit.
fn judge(matrix: &Matrix, query: &SolveQuery, build: &TorchBuild) -> Candidate {
    let mut candidate = Candidate {
        torch_build: build.label(),
        torch: build.torch.to_string(),
        variant: build.variant.clone(),
        index: if build.pypi_default {
            "pypi".into()
        } else {
            build.variant.clone()
        },
        cuda: build.cuda,
        cudnn: build.cudnn.as_ref().map(ToString::to_string),
        python: None,
        accepted: false,
        reachable: query.index.reaches(build),
        minor_compat: false,
        status: build.status.word().to_string(),
        reasons: Vec::new(),
        rejected_by: None,
        recipe: None,
    };
    match judge_steps(matrix, query, build, &mut candidate) {
        Ok(python) => {
            candidate.accepted = true;
            candidate.recipe = Some(recipe_for(
                matrix,
                build,
                python,
                query,
                candidate.minor_compat,
            ));
        }
        Err((by, reason)) => {
            candidate.reasons = vec![reason];
            candidate.rejected_by = Some(by);
        }
    }
    candidate
}

/// The checks of [`judge`] in order; each adds its reason, or ends with why not. The
/// compatibility facts come before cudastack's own limits, so that a build rejected by a
/// limit is one the stack would run.
fn judge_steps(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
    candidate: &mut Candidate,
) -> Result<PythonVersion, (RejectedBy, String)> {
    if let Some(spec) = &query.torch {
        if !spec.contains(&build.torch) {
            return Err((
                RejectedBy::Query,
                format!("torch {} does not match {spec}", build.torch),
            ));
        }
        candidate
            .reasons
            .push(format!("torch {} matches {spec}", build.torch));
    }
    let fact = |reason: String| (RejectedBy::Compatibility, reason);
    if let Some(driver) = &query.driver {
        if let Some(floor) = gpu_drivers(matrix, query)
            .into_iter()
            .find(|floor| !floor.runs_on(driver))
        {
            return Err(fact(floor.refusal(driver)));
        }
    }
    let python = judge_python(matrix, query, build).map_err(fact)?;
    candidate.python = Some(python);
    candidate
        .reasons
        .push(format!("has a {} wheel", python.cp_tag()));
    judge_driver(
        matrix,
        query,
        build,
        &mut candidate.reasons,
        &mut candidate.minor_compat,
    )
    .map_err(fact)?;
    judge_kernels(query, build, &mut candidate.reasons).map_err(fact)?;
    judge_arm_host(matrix, query, build, &mut candidate.reasons)
        .map_err(|reason| (RejectedBy::CudastackLimit, reason))?;
    Ok(python)
}

/// The query's Python, or the one a known base ships, among the wheel's tags.
fn judge_python(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
) -> Result<PythonVersion, String> {
    match query.python {
        Some(python) if build.python.contains(&python) => Ok(python),
        Some(python) => Err(format!(
            "no wheel for Python {python} (has {})",
            tags(build)
        )),
        None => preferred_python(matrix, build).ok_or_else(|| {
            format!(
                "no wheel for a Python a known base ships (has {})",
                tags(build)
            )
        }),
    }
}

/// GPUs that exist only next to an Arm host need a build with CUDA wheels for it that
/// cudastack can lock: a limit of cudastack's (arm64 torch is locked from PyPI only), not of
/// the stack, and worded so.
fn judge_arm_host(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
    reasons: &mut Vec<String>,
) -> Result<(), String> {
    if let Some((host, gpu)) = arm_host(matrix, query) {
        let first: pep440_rs::Version = FIRST_ARM64_CUDA_TORCH.parse().expect("a valid version");
        if !build.pypi_default {
            return Err(format!(
                "cudastack's limit, not the stack's: cudastack locks {host} torch from PyPI only, and this build is on PyTorch's {} index",
                build.variant
            ));
        }
        if build.torch < first {
            return Err(format!(
                "cudastack's limit, not the stack's: cudastack locks {host} torch from PyPI only; PyPI's first CUDA {host} torch is {FIRST_ARM64_CUDA_TORCH} ({} there is CPU-only)",
                build.torch
            ));
        }
        reasons.push(format!(
            "{gpu} runs next to a {host} host only: the recipe builds {host}"
        ));
    }
    Ok(())
}

/// The limit behind [`judge_arm_host`], in one sentence.
fn arm_limit(host: Platform, gpu: &str) -> String {
    format!("{gpu} runs next to a {host} host only, and cudastack locks {host} torch from PyPI only; PyPI's first CUDA {host} torch is {FIRST_ARM64_CUDA_TORCH}")
}

/// The limits of cudastack's own that rejected a build, each once.
fn limits(matrix: &Matrix, query: &SolveQuery, candidates: &[Candidate]) -> Vec<String> {
    let limited = candidates
        .iter()
        .any(|c| c.rejected_by == Some(RejectedBy::CudastackLimit));
    match arm_host(matrix, query) {
        Some((host, gpu)) if limited => vec![arm_limit(host, &gpu)],
        _ => Vec::new(),
    }
}

/// The host driver against the toolkit's minimum (or minor-version compatibility).
fn judge_driver(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
    reasons: &mut Vec<String>,
    minor_compat: &mut bool,
) -> Result<(), String> {
    let toolkit_driver = matrix.min_driver_for(&build.cuda);
    if let Some(driver) = &query.driver {
        let ceiling = matrix
            .cuda_ceiling(driver)
            .map(|c| c.to_string())
            .unwrap_or_else(|| "nothing".into());
        match toolkit_driver {
            Some(need) if need <= driver => reasons.push(format!(
                "driver {driver} supports CUDA <= {ceiling}, enough for CUDA {} (needs {need})",
                build.cuda.line()
            )),
            Some(need) => {
                let minor = matrix.minor_compat_floor(build.cuda.major);
                match minor {
                    Some(m) if m.min_driver <= *driver && query.allow_minor_compat => {
                        *minor_compat = true;
                        reasons.push(format!(
                            "driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need}, but minor-version compatibility runs it from {} (set `minor_version_compat: true`)",
                            build.cuda.line(),
                            m.min_driver
                        ));
                    }
                    Some(m) if m.min_driver <= *driver => {
                        return Err(format!("driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need} (or minor-version compatibility, which is off)", build.cuda.line()));
                    }
                    _ => {
                        let minor_text = minor
                            .filter(|m| m.min_driver != *need)
                            .map(|m| {
                                format!(", or {} with minor-version compatibility", m.min_driver)
                            })
                            .unwrap_or_default();
                        return Err(format!("driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need}{minor_text}", build.cuda.line()));
                    }
                }
            }
            None => {
                return Err(format!(
                    "CUDA {} has no driver row in the matrix",
                    build.cuda
                ))
            }
        }
    }

    Ok(())
}

/// Each GPU needs SASS for its architecture (or PTX it can JIT) in the build.
fn judge_kernels(
    query: &SolveQuery,
    build: &TorchBuild,
    reasons: &mut Vec<String>,
) -> Result<(), String> {
    for gpu in &query.gpus {
        match build.kernels_for(&gpu.cc) {
            KernelSupport::Sass(sass) => {
                reasons.push(format!("{} runs its {} kernels", gpu.label(), sass.sm()))
            }
            KernelSupport::Ptx(ptx) => reasons.push(format!(
                "{} only through {} PTX (JIT at first use)",
                gpu.label(),
                ptx.sm()
            )),
            KernelSupport::None => {
                let mut archs = build.arch_list.clone();
                archs.sort();
                let archs: Vec<String> = archs.iter().map(ComputeCapability::sm).collect();
                return Err(format!(
                    "no kernels for {}: built for {}",
                    gpu.label(),
                    archs.join(" ")
                ));
            }
        }
    }

    Ok(())
}

fn tags(build: &TorchBuild) -> String {
    build
        .python
        .iter()
        .map(|p| p.cp_tag())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The Python to use when the user gave none: the first known base's Python the build has.
fn preferred_python(matrix: &Matrix, build: &TorchBuild) -> Option<PythonVersion> {
    const PREFERENCE: [(&str, &str); 5] = [
        ("debian", "bookworm"),
        ("ubuntu", "noble"),
        ("ubuntu", "jammy"),
        ("debian", "trixie"),
        ("ubuntu", "focal"),
    ];
    PREFERENCE
        .iter()
        .filter_map(|(distro, release)| matrix.base(distro, release))
        .map(|base| base.python)
        .find(|python| build.python.contains(python))
}

/// A recipe a user can paste for a build, driver floor included.
fn recipe_for(
    matrix: &Matrix,
    build: &TorchBuild,
    python: PythonVersion,
    query: &SolveQuery,
    minor_compat: bool,
) -> String {
    let base = matrix
        .bases
        .iter()
        .find(|b| b.python == python)
        .map(|b| format!("{{ {}: {} }}", b.distro, b.release))
        .unwrap_or_else(|| "{ debian: bookworm }".into());
    let toolkit_floor = if minor_compat {
        matrix
            .minor_compat_floor(build.cuda.major)
            .map(|m| m.min_driver.clone())
    } else {
        matrix.min_driver_for(&build.cuda).cloned()
    };
    // The GPUs' own minimum raises the floor: a recipe for a B200 names a driver that runs it.
    let driver_floor = gpu_drivers(matrix, query)
        .into_iter()
        .filter_map(|drivers| drivers.min_driver)
        .chain(toolkit_floor)
        .max()
        .map(|driver| driver.to_string())
        .unwrap_or_default();
    let mut text = String::new();
    text.push_str(&format!(
        "name: torch{}-{}-py{}\n",
        build.torch, build.variant, python
    ));
    text.push_str(&format!("base: {base}\n"));
    text.push_str(&format!("python: \"{python}\"\n"));
    text.push_str(&format!("driver_floor: \"{driver_floor}\"\n"));
    if let Some((host, _)) = arm_host(matrix, query) {
        text.push_str(&format!("platforms: [{host}]\n"));
    }
    if minor_compat {
        text.push_str("minor_version_compat: true\n");
    }
    text.push_str(&format!(
        "cuda: {{ version: \"{}\", flavor: runtime }}\n",
        build.cuda.line()
    ));
    if let Some(cudnn) = &build.cudnn {
        text.push_str(&format!("cudnn: {{ version: \"{cudnn}\" }}\n"));
    }
    if build.pypi_default {
        text.push_str(&format!("torch: {{ version: \"{}\" }}\n", build.torch));
    } else {
        let index = query.index.index_for(&build.variant).to_string();
        // A URL is quoted: YAML reads it whole either way, and a reader sees one string.
        let index = if index.contains("://") {
            format!("\"{index}\"")
        } else {
            index
        };
        text.push_str(&format!(
            "torch: {{ version: \"{}\", index: {index} }}\n",
            build.torch
        ));
    }
    if !query.gpus.is_empty() {
        let names: Vec<String> = query
            .gpus
            .iter()
            .map(|g| format!("\"{}\"", g.recipe_entry()))
            .collect();
        text.push_str(&format!("gpus: [{}]\n", names.join(", ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(driver: &str, gpu: &str, torch: Option<&str>) -> SolveQuery {
        let matrix = Matrix::embedded();
        SolveQuery {
            driver: Some(driver.parse().unwrap()),
            gpus: vec![SolveQuery::gpu(matrix, gpu).unwrap()],
            torch: torch.map(|text| SolveQuery::torch_spec(text).unwrap()),
            python: None,
            allow_minor_compat: true,
            index: Reach::Pypi,
        }
    }

    /// Hidden-case style: a GPU's own minimum driver, spelled as users type
    /// names, over the edges of each minimum. `None`: nothing is offered, and every
    /// rejection says `why`; `Some(build)`: the best answer.
    #[test]
    fn hidden_case_style_gpu_minimum_drivers() {
        let cases: &[(&str, &str, Option<&str>, &str)] = &[
            (
                "550.54.15",
                "B200",
                None,
                "B200 (sm_100) needs driver 570.133.20 or later (R570 branch)",
            ),
            (
                "550.54.15",
                "nvidia b200",
                None,
                "driver 550.54.15 does not support it at all",
            ),
            (
                "550.54.15",
                "RTX 5090",
                None,
                "GeForce RTX 5090 (sm_120) needs the R570 driver branch or later",
            ),
            (
                "550.54.15",
                "rtx5090",
                None,
                "cuda-toolkit-driver-and-architecture-matrix",
            ),
            (
                "565.57.01",
                "RTX PRO 6000 Blackwell",
                None,
                "needs the R570 driver branch",
            ),
            (
                "570.124.06",
                "B200",
                None,
                "needs driver 570.133.20 or later",
            ),
            (
                "550.54.15",
                "10.0",
                None,
                "sm_100 needs the R570 driver branch or later",
            ),
            (
                "570.124.06",
                "B300",
                None,
                "needs the R575 driver branch or later",
            ),
            (
                "515.65.01",
                "H100",
                None,
                "H100 (sm_90) needs the R520 driver branch or later",
            ),
            (
                "515.65.01",
                "RTX 4090",
                None,
                "needs the R520 driver branch or later",
            ),
            // Architectures later branches dropped: Volta after R580, Kepler after R470.
            ("590.44.01", "V100", None, "Tesla V100 (sm_70) needs a driver of the R580 branch or older: driver 590.44.01 no longer supports it"),
            ("590.48.01", "gtx1080ti", None, "needs a driver of the R580 branch or older"),
            ("495.29.05", "K80", None, "Tesla K80 (sm_37) needs a driver of the R470 branch or older"),
        ];
        let matrix = Matrix::embedded();
        for (driver, gpu, torch, why) in cases {
            let solution = solve(matrix, &query(driver, gpu, *torch));
            assert!(
                solution.best().is_none(),
                "{driver} {gpu}: offered {:?}",
                solution.best().map(|c| &c.torch_build)
            );
            for candidate in &solution.candidates {
                assert!(
                    candidate.reasons[0].contains(why),
                    "{driver} {gpu}: `{why}` not in {:?}",
                    candidate.reasons
                );
            }
        }
        let fits: &[(&str, &str, Option<&str>, &str)] = &[
            ("570.124.06", "RTX 5090", None, "2.10.0+cu128"),
            ("570.124.06", "rtx5090", None, "2.10.0+cu128"),
            ("570.133.20", "B200", None, "2.10.0+cu128"),
            ("575.51.03", "B300", None, "2.10.0+cu128"),
            // No PyPI build fits: the surest of PyTorch's index, not its newest (unconfirmed).
            ("520.61.05", "H100", None, "2.5.1+cu118"),
            ("550.54.15", "RTX 3090", Some("2.5"), "2.5.1+cu124"),
            ("550.54.15", "RTX 3090", Some("2.5.0"), "2.5.0+cu124"),
            ("535.104.05", "A100", Some("2.4"), "2.4.1+cu121"),
        ];
        for (driver, gpu) in [("580.65.06", "V100"), ("470.82.01", "K80")] {
            assert!(
                solve(matrix, &query(driver, gpu, None)).best().is_some(),
                "{driver} {gpu}"
            );
        }
        for (driver, gpu, torch, best) in fits {
            let solution = solve(matrix, &query(driver, gpu, *torch));
            assert_eq!(
                solution.best().map(|c| c.torch_build.as_str()),
                Some(*best),
                "{driver} {gpu} {torch:?}"
            );
        }
    }

    /// A solved recipe carries a driver floor its own GPUs run on, so `validate` accepts it.
    #[test]
    fn the_recipe_floor_covers_the_gpu_minimum() {
        let solution = solve(Matrix::embedded(), &query("570.133.20", "B200", None));
        let recipe = solution.best().unwrap().recipe.as_deref().unwrap();
        assert!(recipe.contains("driver_floor: \"570.133.20\""), "{recipe}");
        assert_eq!(solution.gpu_drivers.len(), 1);
        assert_eq!(solution.gpu_drivers[0].min_branch.as_deref(), Some("R570"));
    }

    /// `--torch 2.5` meant `==2.5` (2.5.0 only); it is the 2.5 series and says so.
    #[test]
    fn a_two_part_torch_version_is_a_series() {
        assert_eq!(
            SolveQuery::torch_spec("2.5").unwrap().to_string(),
            "==2.5.*"
        );
        assert_eq!(
            SolveQuery::torch_spec("2.5.0").unwrap().to_string(),
            "==2.5.0"
        );
        let solution = solve(
            Matrix::embedded(),
            &query("550.54.15", "RTX 3090", Some("2.5")),
        );
        assert_eq!(solution.best().unwrap().torch, "2.5.1");
        assert_eq!(
            solution.notes,
            vec!["torch 2.5 means the 2.5 series (==2.5.*); picked 2.5.1, its newest release that fits the rest of the query (give a three-part version such as 2.5.1 to pin one)"]
        );
        let exact = solve(
            Matrix::embedded(),
            &query("550.54.15", "RTX 3090", Some("2.5.0")),
        );
        assert!(exact.accepted().all(|c| c.torch == "2.5.0"));
        assert!(exact.notes.is_empty());
    }

    /// H100 on driver 535: a build of PyTorch's own index marked unconfirmed (2.7.1+cu118)
    /// ranked above confirmed PyPI builds, and its recipe did not lock where only PyPI is
    /// reachable. PyPI's newest build that fits comes first.
    #[test]
    fn reachable_then_confirmed_builds_rank_first() {
        let solution = solve(Matrix::embedded(), &query("535.104.05", "H100", None));
        let best = solution.best().unwrap();
        assert_eq!(
            (
                best.torch_build.as_str(),
                best.index.as_str(),
                best.status.as_str()
            ),
            ("2.4.1+cu121", "pypi", "derived")
        );
    }

    /// `--index` lets PyTorch's indexes in: the confirmed 2.5.1+cu121 then ranks first, and
    /// the unconfirmed 2.7.1+cu118 after every confirmed native build; with one variant, only
    /// its builds join PyPI's. A build the host does not reach ranks after every one it does.
    #[test]
    fn the_index_the_host_reaches_decides_the_rank() {
        let matrix = Matrix::embedded();
        let pypi = solve(matrix, &query("535.104.05", "H100", None));
        let accepted: Vec<&Candidate> = pypi.accepted().collect();
        let first_unreachable = accepted.iter().position(|c| !c.reachable).unwrap();
        assert!(accepted[first_unreachable..].iter().all(|c| !c.reachable));
        assert!(accepted[..first_unreachable]
            .iter()
            .all(|c| c.index == "pypi"));

        let everywhere = solve(
            matrix,
            &SolveQuery {
                index: Reach::pytorch(),
                ..query("535.104.05", "H100", None)
            },
        );
        let best = everywhere.best().unwrap();
        assert_eq!(
            (best.torch_build.as_str(), best.status.as_str()),
            ("2.5.1+cu121", "confirmed")
        );
        assert!(everywhere.accepted().all(|c| c.reachable));
        let native: Vec<&Candidate> = everywhere.accepted().filter(|c| !c.minor_compat).collect();
        let unsure = native
            .iter()
            .position(|c| c.torch_build == "2.7.1+cu118")
            .unwrap();
        assert!(native[..unsure]
            .iter()
            .all(|c| ["derived", "confirmed", "secondary"].contains(&c.status.as_str())));
        assert!(native[..unsure]
            .iter()
            .any(|c| c.torch_build == "2.0.0+cu118"));

        let cu118 = solve(
            matrix,
            &SolveQuery {
                index: "cu118".parse().unwrap(),
                ..query("535.104.05", "H100", None)
            },
        );
        assert_eq!(cu118.best().unwrap().torch_build, "2.5.1+cu118");
        assert!(cu118
            .accepted()
            .filter(|c| c.reachable)
            .all(|c| c.index == "pypi" || c.variant == "cu118"));
    }

    #[test]
    fn index_choices_parse_and_name_where_the_lock_reads() {
        assert_eq!("pypi".parse::<Reach>().unwrap(), Reach::Pypi);
        assert_eq!("PyTorch".parse::<Reach>().unwrap(), Reach::pytorch());
        let mirror: Reach = "https://mirror.example/whl".parse().unwrap();
        assert_eq!(mirror.to_string(), "https://mirror.example/whl/");
        assert_eq!(
            mirror.index_for("cu121").to_string(),
            "https://mirror.example/whl/cu121"
        );
        let one: Reach = "https://mirror.example/whl/cu118/".parse().unwrap();
        assert_eq!(
            one,
            Reach::Variant {
                variant: "cu118".into(),
                url: "https://mirror.example/whl/cu118".into()
            }
        );
        assert_eq!(one.index_for("cu121").to_string(), "cu121");
        assert_eq!(Reach::pytorch().index_for("cu121").to_string(), "cu121");
        let secret = "https://bob:token@mirror.example/whl/"
            .parse::<Reach>()
            .unwrap_err();
        assert!(!secret.contains("token"), "{secret}");
        assert!(
            secret.contains("`https://****@mirror.example/whl/`"),
            "{secret}"
        );
        assert!("ftp://mirror.example/whl".parse::<Reach>().is_err());
    }

    /// A build the stack would run but cudastack cannot lock (arm64 torch from PyPI only) is
    /// rejected as cudastack's limit; one the stack would not run, as a compatibility fact.
    #[test]
    fn cudastack_limits_are_told_apart_from_compatibility() {
        let solution = solve(Matrix::embedded(), &query("550.54.15", "GH200", None));
        assert!(solution.best().is_none());
        let by = |label: &str| {
            let candidate = solution
                .candidates
                .iter()
                .find(|c| c.torch_build == label)
                .unwrap();
            (candidate.rejected_by, candidate.reasons[0].clone())
        };
        let (limit, why) = by("2.6.0+cu126");
        assert_eq!(limit, Some(RejectedBy::CudastackLimit));
        assert!(why.starts_with("cudastack's limit, not the stack's: cudastack locks linux/arm64 torch from PyPI only"), "{why}");
        let (limit, why) = by("2.10.0+cu128");
        assert_eq!(limit, Some(RejectedBy::CudastackLimit));
        assert!(
            why.contains("PyPI's first CUDA linux/arm64 torch is 2.11.0"),
            "{why}"
        );
        assert_eq!(by("2.14.1+cu130").0, Some(RejectedBy::Compatibility));
        assert_eq!(solution.limits.len(), 1, "{:?}", solution.limits);
        // On amd64 GPUs nothing is a limit.
        let h100 = solve(Matrix::embedded(), &query("550.54.15", "H100", None));
        assert!(h100.limits.is_empty());
        assert!(h100
            .candidates
            .iter()
            .all(|c| c.rejected_by != Some(RejectedBy::CudastackLimit)));
    }

    /// Whether anything fits `query`, solved without the search for changes.
    fn fits(query: &SolveQuery) -> bool {
        best_of(Matrix::embedded(), query).is_some()
    }

    /// Nothing fits: the answer names the smallest single change of each kind, found by
    /// solving again: the lowest driver that opens a build (and none between the host's and
    /// it does), the nearest Python, a GPU left out or the nearest one instead, minor-version
    /// compatibility.
    #[test]
    fn nothing_fits_ends_with_the_smallest_change() {
        let matrix = Matrix::embedded();
        let gh200 = query("550.54.15", "GH200", None);
        let solution = solve(matrix, &gh200);
        let driver = &solution.changes[0];
        assert_eq!(driver.kind, ChangeKind::Driver);
        assert_eq!(driver.driver.as_ref().unwrap().to_string(), "580.65.06");
        assert_eq!(driver.change, "driver 580.65.06 or newer (R580 branch)");
        assert_eq!(
            (driver.torch_build.as_str(), driver.index.as_str()),
            ("2.14.1+cu130", "pypi")
        );
        let host: DriverVersion = "550.54.15".parse().unwrap();
        let to: DriverVersion = "580.65.06".parse().unwrap();
        for between in known_drivers(matrix)
            .into_iter()
            .filter(|d| *d > host && *d < to)
        {
            assert!(
                !fits(&SolveQuery {
                    driver: Some(between.clone()),
                    ..gh200.clone()
                }),
                "{between}"
            );
        }
        let gpu = &solution.changes[1];
        assert_eq!(
            (gpu.kind, gpu.change.as_str()),
            (ChangeKind::Gpu, "H100 (sm_90) instead of GH200")
        );

        // A GPU later branches dropped: the newest driver below the host's that runs it.
        let v100 = solve(matrix, &query("590.44.01", "V100", None));
        assert_eq!(v100.changes[0].change, "driver 580.95.05 (R580 branch)");

        // Another Python: the nearest one that fits.
        let python = solve(
            matrix,
            &SolveQuery {
                python: Some("3.15".parse().unwrap()),
                ..query("550.54.15", "A100", None)
            },
        );
        let change = python
            .changes
            .iter()
            .find(|c| c.kind == ChangeKind::Python)
            .unwrap();
        assert_eq!(change.change, "Python 3.14 instead of 3.15");

        // Two GPUs, one the driver does not run: leave it out.
        let mut pair = query("535.104.05", "A100", None);
        pair.gpus.push(SolveQuery::gpu(matrix, "RTX 5090").unwrap());
        let change = solve(matrix, &pair)
            .changes
            .into_iter()
            .find(|c| c.kind == ChangeKind::Gpu)
            .unwrap();
        assert_eq!(change.change, "without GeForce RTX 5090");
        assert_eq!(change.torch_build, "2.4.1+cu121");

        // Minor-version compatibility turned off: turning it on is a change.
        let strict = solve(
            matrix,
            &SolveQuery {
                allow_minor_compat: false,
                ..query("470.82.01", "V100", None)
            },
        );
        assert!(strict
            .changes
            .iter()
            .any(|c| c.kind == ChangeKind::MinorCompat));

        // Several changes needed (a GPU left out, a Python, a torch): none alone is named.
        let mut both = pair.clone();
        both.python = Some("3.15".parse().unwrap());
        both.torch = Some(SolveQuery::torch_spec("2.0").unwrap());
        let both = solve(matrix, &both);
        assert!(
            both.best().is_none() && both.changes.is_empty(),
            "{:?}",
            both.changes
        );

        // Something fits: no changes.
        assert!(solve(matrix, &query("535.104.05", "H100", None))
            .changes
            .is_empty());
    }
}
