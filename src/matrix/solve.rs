//! `cudastack solve`: the intersection of what a host's driver allows (a ceiling), what its
//! GPUs need (a floor: kernels for their compute capability) and what the user asks
//! (torch and Python versions), ranked, with the reason each build was chosen or rejected.

use std::str::FromStr;

use pep440_rs::VersionSpecifiers;
use serde::Serialize;

use super::{KernelSupport, Matrix, TorchBuild};
use crate::recipe::Platform;
use crate::version::{ComputeCapability, CudaVersion, DriverVersion, PythonVersion};

/// The first PyPI torch release with CUDA wheels for linux/aarch64; older releases were
/// CPU-only there, and PyTorch's own cuXYZ indexes are not locked for arm64. The same fact
/// as `lock::inputs::FIRST_ARM64_CUDA_TORCH` (matrix sits below lock and cannot import it).
pub const FIRST_ARM64_CUDA_TORCH: &str = "2.11.0";

/// A GPU the answer must run on. A GPU given by compute capability alone carries its sm
/// (`sm_89`) as its name.
#[derive(Debug, Clone, Serialize)]
pub struct TargetGpu {
    pub name: String,
    pub cc: ComputeCapability,
}

impl TargetGpu {
    /// A GPU known only by its compute capability (`--cc 8.9`).
    pub fn from_cc(cc: ComputeCapability) -> TargetGpu {
        TargetGpu { name: cc.sm(), cc }
    }

    /// Whether the user named the GPU (rather than giving a compute capability).
    pub fn named(&self) -> bool {
        self.name != self.cc.sm()
    }

    /// How reasons name it: `GeForce RTX 3090 (sm_86)`, or `sm_89` alone.
    pub fn label(&self) -> String {
        if self.named() {
            format!("{} ({})", self.name, self.cc.sm())
        } else {
            self.cc.sm()
        }
    }

    /// How a recipe's `gpus:` names it: the GPU's name, or its capability (`8.9`), the two
    /// forms `validate` accepts.
    pub fn recipe_entry(&self) -> String {
        if self.named() {
            self.name.clone()
        } else {
            self.cc.to_string()
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SolveQuery {
    pub driver: Option<DriverVersion>,
    pub gpus: Vec<TargetGpu>,
    pub torch: Option<VersionSpecifiers>,
    pub python: Option<PythonVersion>,
    /// Also accept builds that need CUDA minor-version compatibility on this driver.
    pub allow_minor_compat: bool,
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
        if let Some(gpu) = matrix.gpu(name_or_cc) {
            return Ok(TargetGpu {
                name: gpu.name.clone(),
                cc: gpu.cc,
            });
        }
        match ComputeCapability::from_str(name_or_cc) {
            Ok(cc) => Ok(TargetGpu::from_cc(cc)),
            Err(_) => Err(SolveError::UnknownGpu {
                name: name_or_cc.to_string(),
                suggestions: matrix.gpu_suggestions(name_or_cc),
            }),
        }
    }

    /// Parse `2.4.1`, `==2.4.*` or `>=2.3,<2.6`.
    pub fn torch_spec(text: &str) -> Result<VersionSpecifiers, SolveError> {
        let trimmed = text.trim();
        let spec = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
            format!("=={trimmed}")
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
    /// Needs CUDA minor-version compatibility on the given driver.
    pub minor_compat: bool,
    /// How sure the matrix row is, as a plain word (`derived`, `confirmed`, `partial`,
    /// `unconfirmed`; see [`super::Status::meaning`]).
    pub status: String,
    /// Why it was accepted (every check it passed) or the first reason it was rejected.
    pub reasons: Vec<String>,
    /// A recipe to paste, for accepted candidates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Solution {
    pub driver: Option<DriverVersion>,
    /// The newest CUDA the driver supports natively.
    pub cuda_ceiling: Option<CudaVersion>,
    pub gpus: Vec<TargetGpu>,
    /// Accepted first (ranked), then rejected.
    pub candidates: Vec<Candidate>,
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
    // Rank by what a user would pick (issue 24): accepted first; native before
    // minor-version compatibility (which needs a setting and a compat package); newest torch;
    // then, among builds of one torch release, the surer row (read from the wheels, then from
    // primary sources: a tie-breaker, never a demotion below older releases), the PyPI build
    // (no extra index to trust) before index variants, and the newest CUDA. The text output
    // shows each row's status so an unconfirmed first answer says so.
    candidates.sort_by(|(a, build_a), (b, build_b)| {
        b.accepted
            .cmp(&a.accepted)
            .then(a.minor_compat.cmp(&b.minor_compat))
            .then(build_b.torch.cmp(&build_a.torch))
            .then(certainty(build_a).cmp(&certainty(build_b)))
            .then(build_b.pypi_default.cmp(&build_a.pypi_default))
            .then(b.cuda.cmp(&a.cuda))
    });
    Solution {
        driver: query.driver.clone(),
        cuda_ceiling: ceiling,
        gpus: query.gpus.clone(),
        candidates: candidates.into_iter().map(|(c, _)| c).collect(),
    }
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
        minor_compat: false,
        status: build.status.word().to_string(),
        reasons: Vec::new(),
        recipe: None,
    };
    let reject = |mut candidate: Candidate, reason: String| {
        candidate.reasons = vec![reason];
        candidate
    };

    if let Some(spec) = &query.torch {
        if !spec.contains(&build.torch) {
            return reject(
                candidate,
                format!("torch {} does not match {spec}", build.torch),
            );
        }
        candidate
            .reasons
            .push(format!("torch {} matches {spec}", build.torch));
    }

    let python = match query.python {
        Some(python) if build.python.contains(&python) => python,
        Some(python) => {
            return reject(
                candidate,
                format!("no wheel for Python {python} (has {})", tags(build)),
            )
        }
        None => match preferred_python(matrix, build) {
            Some(python) => python,
            None => {
                return reject(
                    candidate,
                    format!(
                        "no wheel for a Python a known base ships (has {})",
                        tags(build)
                    ),
                )
            }
        },
    };
    if let Some((host, gpu)) = arm_host(matrix, query) {
        let first: pep440_rs::Version = FIRST_ARM64_CUDA_TORCH.parse().expect("a valid version");
        if !build.pypi_default {
            return reject(candidate, format!("{gpu} runs next to a {host} host only, and {host} images are locked from PyPI only (not PyTorch's {} index)", build.variant));
        }
        if build.torch < first {
            return reject(candidate, format!("{gpu} runs next to a {host} host only, and torch {} has no CUDA wheels for {host} on PyPI (the first is {FIRST_ARM64_CUDA_TORCH})", build.torch));
        }
        candidate.reasons.push(format!(
            "{gpu} runs next to a {host} host only: the recipe builds {host}"
        ));
    }
    candidate.python = Some(python);
    candidate
        .reasons
        .push(format!("has a {} wheel", python.cp_tag()));

    let toolkit_driver = matrix.min_driver_for(&build.cuda);
    if let Some(driver) = &query.driver {
        let ceiling = matrix
            .cuda_ceiling(driver)
            .map(|c| c.to_string())
            .unwrap_or_else(|| "nothing".into());
        match toolkit_driver {
            Some(need) if need <= driver => candidate.reasons.push(format!(
                "driver {driver} supports CUDA <= {ceiling}, enough for CUDA {} (needs {need})",
                build.cuda.line()
            )),
            Some(need) => {
                let minor = matrix.minor_compat_floor(build.cuda.major);
                match minor {
                    Some(m) if m.min_driver <= *driver && query.allow_minor_compat => {
                        candidate.minor_compat = true;
                        candidate.reasons.push(format!(
                            "driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need}, but minor-version compatibility runs it from {} (set `minor_version_compat: true`)",
                            build.cuda.line(),
                            m.min_driver
                        ));
                    }
                    Some(m) if m.min_driver <= *driver => {
                        return reject(candidate, format!("driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need} (or minor-version compatibility, which is off)", build.cuda.line()));
                    }
                    _ => {
                        let minor_text = minor
                            .filter(|m| m.min_driver != *need)
                            .map(|m| {
                                format!(", or {} with minor-version compatibility", m.min_driver)
                            })
                            .unwrap_or_default();
                        return reject(candidate, format!("driver {driver} supports CUDA <= {ceiling}; CUDA {} needs {need}{minor_text}", build.cuda.line()));
                    }
                }
            }
            None => {
                return reject(
                    candidate,
                    format!("CUDA {} has no driver row in the matrix", build.cuda),
                )
            }
        }
    }

    for gpu in &query.gpus {
        match build.kernels_for(&gpu.cc) {
            KernelSupport::Sass(sass) => {
                candidate
                    .reasons
                    .push(format!("{} runs its {} kernels", gpu.label(), sass.sm()))
            }
            KernelSupport::Ptx(ptx) => candidate.reasons.push(format!(
                "{} only through {} PTX (JIT at first use)",
                gpu.label(),
                ptx.sm()
            )),
            KernelSupport::None => {
                let mut archs = build.arch_list.clone();
                archs.sort();
                let archs: Vec<String> = archs.iter().map(ComputeCapability::sm).collect();
                return reject(
                    candidate,
                    format!(
                        "no kernels for {}: built for {}",
                        gpu.label(),
                        archs.join(" ")
                    ),
                );
            }
        }
    }

    candidate.accepted = true;
    candidate.recipe = Some(recipe_for(
        matrix,
        build,
        python,
        query,
        candidate.minor_compat,
    ));
    candidate
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
    let driver_floor = if minor_compat {
        matrix
            .minor_compat_floor(build.cuda.major)
            .map(|m| m.min_driver.to_string())
    } else {
        matrix.min_driver_for(&build.cuda).map(ToString::to_string)
    }
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
        text.push_str(&format!(
            "torch: {{ version: \"{}\", index: {} }}\n",
            build.torch, build.variant
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
