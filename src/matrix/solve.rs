//! `cudastack solve`: the intersection of what a host's driver allows (a ceiling), what its
//! GPUs need (a floor: kernels for their compute capability) and what the user asks
//! (torch and Python versions), ranked, with the reason each build was chosen or rejected.

use std::str::FromStr;

use pep440_rs::{Operator, VersionSpecifiers};
use serde::Serialize;

use super::{GpuDrivers, KernelSupport, Matrix, TorchBuild};
use crate::recipe::Platform;
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
    /// The drivers each GPU runs on at all (its minimum, or the last branch that still
    /// runs it), where the matrix knows them.
    pub gpu_drivers: Vec<GpuDrivers>,
    /// What the answer took the query to mean (`torch 2.5 means the 2.5 series; ...`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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
    // Rank by what a user would pick: accepted first; native before
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
    let candidates: Vec<Candidate> = candidates.into_iter().map(|(c, _)| c).collect();
    let notes = series_note(query, candidates.iter().find(|c| c.accepted))
        .into_iter()
        .collect();
    Solution {
        driver: query.driver.clone(),
        cuda_ceiling: ceiling,
        gpus: query.gpus.clone(),
        gpu_drivers: gpu_drivers(matrix, query),
        notes,
        candidates,
    }
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
        minor_compat: false,
        status: build.status.word().to_string(),
        reasons: Vec::new(),
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
        Err(reason) => candidate.reasons = vec![reason],
    }
    candidate
}

/// The checks of [`judge`] in order; each adds its reason, or ends with why not.
fn judge_steps(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
    candidate: &mut Candidate,
) -> Result<PythonVersion, String> {
    if let Some(spec) = &query.torch {
        if !spec.contains(&build.torch) {
            return Err(format!("torch {} does not match {spec}", build.torch));
        }
        candidate
            .reasons
            .push(format!("torch {} matches {spec}", build.torch));
    }
    if let Some(driver) = &query.driver {
        if let Some(floor) = gpu_drivers(matrix, query)
            .into_iter()
            .find(|floor| !floor.runs_on(driver))
        {
            return Err(floor.refusal(driver));
        }
    }
    let python = judge_python(matrix, query, build)?;
    judge_arm_host(matrix, query, build, &mut candidate.reasons)?;
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
    )?;
    judge_kernels(query, build, &mut candidate.reasons)?;
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

/// GPUs that exist only next to an Arm host need a build with CUDA wheels for it.
fn judge_arm_host(
    matrix: &Matrix,
    query: &SolveQuery,
    build: &TorchBuild,
    reasons: &mut Vec<String>,
) -> Result<(), String> {
    if let Some((host, gpu)) = arm_host(matrix, query) {
        let first: pep440_rs::Version = FIRST_ARM64_CUDA_TORCH.parse().expect("a valid version");
        if !build.pypi_default {
            return Err(format!("{gpu} runs next to a {host} host only, and {host} images are locked from PyPI only (not PyTorch's {} index)", build.variant));
        }
        if build.torch < first {
            return Err(format!("{gpu} runs next to a {host} host only, and torch {} has no CUDA wheels for {host} on PyPI (the first is {FIRST_ARM64_CUDA_TORCH})", build.torch));
        }
        reasons.push(format!(
            "{gpu} runs next to a {host} host only: the recipe builds {host}"
        ));
    }
    Ok(())
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
            ("570.124.06", "RTX 5090", None, "2.11.0+cu128"),
            ("570.124.06", "rtx5090", None, "2.11.0+cu128"),
            ("570.133.20", "B200", None, "2.11.0+cu128"),
            ("575.51.03", "B300", None, "2.11.0+cu128"),
            ("520.61.05", "H100", None, "2.7.1+cu118"),
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
}
