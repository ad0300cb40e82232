//! `cudastack validate`: check a recipe against the matrix and report every problem with
//! what is wrong, why it matters, and what to do.
//!
//! Validation never stops at the first problem: a user fixing a recipe wants the whole
//! list. Each problem has a stable `code` so tests, CI and `--json` consumers can match it.

use pep440_rs::Version;
use serde::Serialize;

use super::{KernelSupport, Matrix, TorchBuild};
use crate::recipe::Recipe;
use crate::target_gpu::TargetGpu;
use crate::version::{ComputeCapability, CudaVersion, DriverVersion};

pub mod system_packages;

pub use system_packages::{library_family, LibraryFamily, NamePattern, Provided, LIBRARY_FAMILIES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Note,
    Warning,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub severity: Severity,
    /// Stable identifier, e.g. `driver-floor-below-toolkit`.
    pub code: &'static str,
    /// What is wrong.
    pub what: String,
    /// Why it matters.
    pub why: String,
    /// What to do.
    pub hint: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub recipe: String,
    pub recipe_digest: String,
    /// The torch build the recipe selects (`2.4.1+cu121`), when it names one that exists.
    pub torch_build: Option<String>,
    /// `cuda>=X.Y` for NVIDIA_REQUIRE_CUDA, derived from the driver floor.
    pub nvidia_require_cuda: Option<String>,
    pub problems: Vec<Problem>,
}

impl Validation {
    pub fn is_valid(&self) -> bool {
        !self
            .problems
            .iter()
            .any(|problem| problem.severity == Severity::Error)
    }
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|problem| problem.severity == Severity::Error)
    }
}

struct Collector(Vec<Problem>);

impl Collector {
    fn push(
        &mut self,
        severity: Severity,
        code: &'static str,
        what: String,
        why: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.0.push(Problem {
            severity,
            code,
            what,
            why: why.into(),
            hint: hint.into(),
        });
    }
    fn error(
        &mut self,
        code: &'static str,
        what: String,
        why: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.push(Severity::Error, code, what, why, hint)
    }
}

/// The torch release a recipe names: its exact version, or for a series (`version: "2.4"`)
/// the newest release of the series whose build on the recipe's index is for
/// the recipe's CUDA line and Python; failing that, the series' newest release, so the
/// checks below say what does not fit.
pub fn torch_release(matrix: &Matrix, recipe: &Recipe) -> Option<Version> {
    let torch = recipe.torch.as_ref()?;
    if !torch.is_series() {
        return Some(torch.version.clone());
    }
    let in_series = || {
        matrix
            .torch_builds
            .iter()
            .filter(|build| torch.admits(&build.torch))
    };
    let of_index: Vec<&TorchBuild> = in_series()
        .filter(|build| match torch.index.variant() {
            None => build.pypi_default,
            Some(variant) => build.variant == variant,
        })
        .collect();
    of_index
        .iter()
        .find(|build| {
            build.cuda.line() == recipe.cuda.version.line() && build.python.contains(&recipe.python)
        })
        .or(of_index.first())
        .copied()
        .or_else(|| in_series().next())
        .map(|build| build.torch.clone())
}

/// The torch build a recipe selects: the PyPI default build, or the named index variant,
/// of [`torch_release`].
pub fn selected_torch_build<'m>(matrix: &'m Matrix, recipe: &Recipe) -> Option<&'m TorchBuild> {
    let release = torch_release(matrix, recipe)?;
    build_of_release(matrix, recipe, &release)
}

/// The build of the recipe's index for one torch release, such as the version a lock
/// records (`2.4.1`, or `2.4.1+cu121` from a PyTorch index): what `build` labels its image
/// with, whatever release the matrix would pick for a series today.
pub fn locked_torch_build<'m>(
    matrix: &'m Matrix,
    recipe: &Recipe,
    locked: &str,
) -> Option<&'m TorchBuild> {
    let public = locked.split_once('+').map_or(locked, |(public, _)| public);
    match public.parse::<Version>() {
        Ok(release) => build_of_release(matrix, recipe, &release),
        Err(_) => selected_torch_build(matrix, recipe),
    }
}

fn build_of_release<'m>(
    matrix: &'m Matrix,
    recipe: &Recipe,
    release: &Version,
) -> Option<&'m TorchBuild> {
    let torch = recipe.torch.as_ref()?;
    let mut builds = matrix.torch_builds_of(release);
    match torch.index.variant() {
        None => builds.find(|build| build.pypi_default),
        Some(variant) => builds.find(|build| build.variant == variant),
    }
}

/// The CUDA version the NVIDIA runtime should require: what the floor driver supports,
/// capped at the recipe's CUDA (a `cuda>=` above the recipe's CUDA would refuse drivers
/// that run it fine).
pub fn nvidia_require_cuda(matrix: &Matrix, recipe: &Recipe) -> Option<CudaVersion> {
    let ceiling = matrix.cuda_ceiling(&recipe.driver_floor)?;
    Some(std::cmp::min(ceiling, recipe.cuda.version.line()))
}

/// Every problem of `recipe` against `matrix`, and the facts the checks decided (the
/// selected torch build, NVIDIA_REQUIRE_CUDA) as text for the report. What the later stages
/// use comes as values from [`ResolvedRecipe`](super::ResolvedRecipe), which runs this.
pub fn validate(matrix: &Matrix, recipe: &Recipe) -> Validation {
    check(matrix, recipe).0
}

/// The report of [`validate`] and the torch build the checks selected, so that a caller
/// keeping the build gets the very one the checks were run against.
pub(super) fn check<'m>(
    matrix: &'m Matrix,
    recipe: &Recipe,
) -> (Validation, Option<&'m TorchBuild>) {
    let mut problems = Collector(Vec::new());
    let cuda = recipe.cuda.version;
    let known_cuda = matrix.cuda_release(&cuda).is_some();

    if !known_cuda {
        let lines: Vec<String> = matrix
            .cuda_releases
            .iter()
            .map(|row| row.version.line().to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        problems.error(
            "unknown-cuda",
            format!("CUDA {cuda} is not a release cudastack knows"),
            format!(
                "the driver floor and cuDNN checks need NVIDIA's table row for it ({})",
                matrix.cuda_releases_source
            ),
            format!("use one of: {}", lines.join(", ")),
        );
    } else {
        check_driver_floor(matrix, recipe, &mut problems);
    }

    check_cudnn(matrix, recipe, &mut problems);
    let build = check_torch(matrix, recipe, &mut problems);
    check_base(matrix, recipe, build, &mut problems);
    check_apt(recipe, &mut problems);
    check_gpus(matrix, recipe, build, &mut problems);
    if let Some([what, why, hint]) = crate::recipe::build::nvcc_unavailable(recipe) {
        problems.error("build-needs-nvcc", what, why, hint);
    }

    let mut problems = problems.0;
    problems.sort_by_key(|problem| std::cmp::Reverse(problem.severity));
    let validation = Validation {
        recipe: recipe.name.clone(),
        recipe_digest: recipe.digest().to_string(),
        torch_build: build.map(TorchBuild::label),
        nvidia_require_cuda: nvidia_require_cuda(matrix, recipe)
            .map(|cuda| format!("cuda>={cuda}")),
        problems,
    };
    (validation, build)
}

fn check_driver_floor(matrix: &Matrix, recipe: &Recipe, problems: &mut Collector) {
    let cuda = recipe.cuda.version;
    let floor: &DriverVersion = &recipe.driver_floor;
    let Some(toolkit_driver) = matrix.min_driver_for(&cuda) else {
        return;
    };
    if floor >= toolkit_driver {
        return;
    }
    let ceiling = matrix
        .cuda_ceiling(floor)
        .map(|c| c.to_string())
        .unwrap_or_else(|| "none (older than every CUDA 11 release)".into());
    let minor = matrix.minor_compat_floor(cuda.major);
    let minor_text = minor
        .map(|m| {
            format!(
                "CUDA {}.x minor-version compatibility runs a {cuda} runtime from driver {} on",
                cuda.major, m.min_driver
            )
        })
        .unwrap_or_else(|| {
            format!(
                "CUDA {}.x has no minor-version-compatibility floor in the matrix",
                cuda.major
            )
        });
    match minor {
        Some(m) if *floor >= m.min_driver => {
            if recipe.minor_version_compat {
                problems.push(
                    Severity::Note,
                    "minor-version-compat",
                    format!("driver floor {floor} is below {toolkit_driver} (the driver CUDA {cuda} ships with) and relies on minor-version compatibility"),
                    format!("{minor_text}; PTX newer than the driver cannot be JIT-compiled, and NVIDIA_REQUIRE_CUDA is set to cuda>={ceiling} so the runtime admits drivers from {floor}"),
                    "nothing to do if the stack carries SASS for your GPUs (PyPI torch wheels do)",
                );
            } else {
                problems.error(
                    "driver-floor-below-toolkit",
                    format!("driver floor {floor} is below {toolkit_driver}, the driver CUDA {cuda} needs (driver {floor} supports CUDA <= {ceiling})"),
                    format!("{minor_text}, but the NVIDIA container runtime checks NVIDIA_REQUIRE_CUDA (cuda>={}) against the driver's CUDA version WITHOUT minor-version compatibility, so a container needing CUDA {} would be refused on driver {floor}", cuda.line(), cuda.line()),
                    format!("raise driver_floor to >= {toolkit_driver}, or set `minor_version_compat: true` to rely on minor-version compatibility from {}", m.min_driver),
                );
            }
        }
        _ => {
            let alternative = matrix
                .torch_builds
                .iter()
                .find(|build| {
                    matrix
                        .min_driver_for(&build.cuda)
                        .is_some_and(|need| need <= floor)
                })
                .map(|build| {
                    format!(
                        ", or target CUDA <= {ceiling} (e.g. torch {})",
                        build.label()
                    )
                })
                .unwrap_or_default();
            problems.error(
                "driver-floor-too-old",
                format!("driver floor {floor} is too old for CUDA {cuda}: it supports CUDA <= {ceiling}, and CUDA {cuda} needs {toolkit_driver}{}", minor.map(|m| format!(" ({} with minor-version compatibility)", m.min_driver)).unwrap_or_default()),
                format!("{minor_text}; below that the CUDA runtime fails with \"The NVIDIA driver on your system is too old\" (cudaErrorInsufficientDriver)"),
                format!("raise driver_floor to >= {toolkit_driver}{alternative}"),
            );
        }
    }
}

fn check_cudnn(matrix: &Matrix, recipe: &Recipe, problems: &mut Collector) {
    let Some(cudnn) = recipe.cudnn.as_ref().map(|spec| &spec.version) else {
        return;
    };
    let known_exact = matrix
        .torch_builds
        .iter()
        .filter_map(|b| b.cudnn.as_ref())
        .any(|v| cudnn.matches(v));
    match matrix.cudnn_cuda_majors(cudnn) {
        None if !known_exact => problems.error(
            "unknown-cudnn",
            format!("cuDNN {cudnn} is not a release cudastack knows"),
            "cudastack checks which CUDA majors a cuDNN release ships for, from NVIDIA's published wheels",
            "use an exact version published as nvidia-cudnn-cu11/cu12/cu13 on PyPI, such as 9.1.0.70 or 8.9.2.26",
        ),
        None => {}
        Some(majors) if !majors.contains(&recipe.cuda.version.major) => {
            let list: Vec<String> = majors.iter().map(|m| format!("CUDA {m}")).collect();
            problems.error(
                "cudnn-cuda-major",
                format!("cuDNN {cudnn} is not built for CUDA {}: NVIDIA ships it for {}", recipe.cuda.version.major, list.join(" and ")),
                "cuDNN is compiled against one CUDA major; loading it with another fails with CUDNN_STATUS_NOT_INITIALIZED or missing symbols",
                format!("pick a cuDNN release built for CUDA {} (see `cudastack matrix --cuda {}`)", recipe.cuda.version.major, recipe.cuda.version.line()),
            );
        }
        Some(_) => {}
    }
}

fn check_torch<'m>(
    matrix: &'m Matrix,
    recipe: &Recipe,
    problems: &mut Collector,
) -> Option<&'m TorchBuild> {
    let torch = recipe.torch.as_ref()?;
    let release = torch_release(matrix, recipe);
    let builds: Vec<&TorchBuild> = release
        .as_ref()
        .map(|release| matrix.torch_builds_of(release).collect())
        .unwrap_or_default();
    if builds.is_empty() {
        let newest = matrix
            .torch_builds
            .first()
            .map(|b| b.torch.to_string())
            .unwrap_or_default();
        let named = if torch.is_series() {
            format!(
                "the torch {} series (`=={}.*`) has no release",
                torch.version, torch.version
            )
        } else {
            format!("torch {} is not", torch.version)
        };
        problems.error(
            "unknown-torch",
            format!("{named} in the matrix"),
            format!("the matrix has every torch release from 2.0.0 to {newest} on PyPI; its pins are what cudastack checks the recipe against"),
            format!("use a released version (newest known: {newest}), or run `cudastack matrix refresh` if it was released after this cudastack"),
        );
        return None;
    }
    let Some(build) = selected_torch_build(matrix, recipe) else {
        let variants: Vec<String> = builds
            .iter()
            .map(|b| {
                format!(
                    "{}{}",
                    b.variant,
                    if b.pypi_default {
                        " (PyPI default)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        problems.error(
            "unknown-torch-variant",
            format!(
                "torch {} has no `{}` build in the matrix",
                builds[0].torch, torch.index
            ),
            "each PyTorch index serves one CUDA build of a release",
            format!("use one of: {}", variants.join(", ")),
        );
        return None;
    };
    note_series(recipe, build, problems);
    let where_from = if build.pypi_default {
        "from PyPI".to_string()
    } else {
        format!("from the {} index", build.variant)
    };
    check_torch_cuda(recipe, build, &builds, &where_from, problems);
    check_torch_cudnn(recipe, build, &where_from, problems);
    check_torch_python(recipe, build, problems);
    note_unconfirmed(build, problems);
    Some(build)
}

/// A two-part torch version is a series: say which release it picked.
fn note_series(recipe: &Recipe, build: &TorchBuild, problems: &mut Collector) {
    let Some(torch) = recipe.torch.as_ref() else {
        return;
    };
    if torch.is_series() {
        problems.push(
            Severity::Note,
            "torch-series",
            format!(
                "torch \"{}\" means the {} series; picked {}, its newest release {} for CUDA {} and Python {}",
                torch.version,
                torch.version,
                build.torch,
                if build.pypi_default { "on PyPI".to_string() } else { format!("on the {} index", build.variant) },
                recipe.cuda.version.line(),
                recipe.python
            ),
            "a two-part version names a release series (`==X.Y.*`); a three-part version is exact",
            format!("nothing to do: `cudastack lock` records torch {} exactly; write version: \"{}\" to pin it in the recipe too", build.torch, build.torch),
        );
    }
}

/// torch loads the CUDA runtime it was built with: the recipe's CUDA must be that line.
fn check_torch_cuda(
    recipe: &Recipe,
    build: &TorchBuild,
    builds: &[&TorchBuild],
    where_from: &str,
    problems: &mut Collector,
) {
    let runtime_pin = build
        .cuda_runtime
        .as_ref()
        .map(|r| format!(" (its CUDA runtime pin is {r})"))
        .unwrap_or_default();
    if build.cuda.line() != recipe.cuda.version.line() {
        let alternative = builds
            .iter()
            .find(|b| b.cuda.line() == recipe.cuda.version.line());
        let hint = match alternative {
            Some(alt) if alt.pypi_default => format!(
                "set cuda.version to {}, or drop `index` to use the PyPI build {}",
                build.cuda.line(),
                alt.label()
            ),
            Some(alt) => format!(
                "set cuda.version to {}, or use `torch: {{ version: \"{}\", index: {} }}` ({})",
                build.cuda.line(),
                alt.torch,
                alt.variant,
                alt.label()
            ),
            None => format!(
                "set cuda.version to {}; no torch {} build for CUDA {} is known",
                build.cuda.line(),
                build.torch,
                recipe.cuda.version.line()
            ),
        };
        problems.error(
            "torch-cuda-mismatch",
            format!("torch {} {where_from} is built for CUDA {}{runtime_pin}; the recipe asks for CUDA {}", build.torch, build.cuda.line(), recipe.cuda.version),
            "torch loads the CUDA runtime it was built with; a toolkit of another version beside it is a second, unused copy that extension builds (nvcc) would compile against",
            hint,
        );
    }
}

/// torch loads the cuDNN it pins: the recipe's cuDNN must match it.
fn check_torch_cudnn(
    recipe: &Recipe,
    build: &TorchBuild,
    where_from: &str,
    problems: &mut Collector,
) {
    if let (Some(wanted), Some(pinned)) = (
        recipe.cudnn.as_ref().map(|s| &s.version),
        build.cudnn.as_ref(),
    ) {
        if !wanted.matches(pinned) {
            problems.error(
                "torch-cudnn-mismatch",
                format!("torch {} {where_from} pins cuDNN {pinned}; the recipe asks for cuDNN {wanted}", build.torch),
                "torch loads the cuDNN it was built against; two cuDNN copies in one image is how version skew and CUDNN_STATUS_EXECUTION_FAILED happen",
                format!("set cudnn.version to {pinned} (or leave cudnn out: cudastack takes torch's pin)"),
            );
        }
    }
}

/// The recipe's Python must be among the wheel's tags.
fn check_torch_python(recipe: &Recipe, build: &TorchBuild, problems: &mut Collector) {
    if !build.python.contains(&recipe.python) {
        let tags: Vec<String> = build.python.iter().map(|p| p.cp_tag()).collect();
        problems.error(
            "python-not-supported",
            format!(
                "torch {} has no wheel for Python {} ({}); it has {}",
                build.label(),
                recipe.python,
                recipe.python.cp_tag(),
                tags.join(" ")
            ),
            "pip and cudastack install only wheels tagged for the interpreter's version",
            format!(
                "use python {} or a torch release that ships {}",
                build
                    .python
                    .iter()
                    .max()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                recipe.python.cp_tag()
            ),
        );
    }
}

/// Rows from PyTorch's build scripts rather than a read wheel say so.
fn note_unconfirmed(build: &TorchBuild, problems: &mut Collector) {
    if matches!(
        build.status,
        super::Status::Unconfirmed | super::Status::Partial
    ) {
        problems.push(
            Severity::Note,
            "torch-variant-unconfirmed",
            format!("the matrix row for torch {} is {:?}: {}", build.label(), build.status, build.source),
            "PyTorch's own indexes are not reachable from where the matrix was compiled, so the pins are from its build scripts, not from the wheel",
            "`cudastack lock` reads the wheel's METADATA and will report any disagreement",
        );
    }
}

fn check_base(
    matrix: &Matrix,
    recipe: &Recipe,
    build: Option<&TorchBuild>,
    problems: &mut Collector,
) {
    let Some((distro, release)) = recipe.base.distro() else {
        // `image:` and `oci:` parse (the recipe format reserves them) but nothing builds
        // them yet: refusing here refuses them in `validate`, `lock` and `build` alike,
        // and `build` validates before it reads the lock or fetches anything.
        let known: Vec<String> = matrix
            .bases
            .iter()
            .map(|b| format!("{{ {}: {} }}", b.distro, b.release))
            .collect();
        problems.error(
            "unsupported-base",
            format!("base {} is not supported: cudastack builds its own base from a Debian or Ubuntu release", recipe.base),
            "the lock needs the base's Python and glibc (known for the releases in the matrix, not for an arbitrary image), and the build assembles, audits and labels a root filesystem it made itself with mmdebstrap; an existing image would otherwise only fail in `build`, after the wheels are downloaded",
            format!("use `base:` with one of {}", known.join(", ")),
        );
        return;
    };
    let Some(base) = matrix.base(distro, release) else {
        let known: Vec<String> = matrix
            .bases
            .iter()
            .map(|b| format!("{}: {}", b.distro, b.release))
            .collect();
        problems.error(
            "unknown-base",
            format!("base {} is not a release cudastack can build", recipe.base),
            "cudastack needs the release's Python and glibc to choose wheels",
            format!("use one of: {}", known.join(", ")),
        );
        return;
    };
    if base.python != recipe.python {
        let same_python: Vec<String> = matrix
            .bases
            .iter()
            .filter(|b| b.python == recipe.python)
            .map(|b| format!("{}: {}", b.distro, b.release))
            .collect();
        problems.error(
            "base-python-mismatch",
            format!("base {} ships Python {}; the recipe asks for Python {}", recipe.base, base.python, recipe.python),
            "wheels are installed into the base's python3; a cp311 wheel cannot be imported by Python 3.12",
            if same_python.is_empty() { format!("set python to {}", base.python) } else { format!("set python to {}, or use base {}", base.python, same_python.join(" or ")) },
        );
    }
    if let Some(needed) = build.and_then(|b| b.glibc.as_ref()) {
        if glibc_key(&base.glibc) < glibc_key(needed) {
            problems.error(
                "base-glibc-too-old",
                format!("base {} has glibc {}; the torch wheels are manylinux_{} and need glibc >= {needed}", recipe.base, base.glibc, needed.replace('.', "_")),
                "a manylinux_2_X wheel links against glibc symbols of version 2.X",
                "use a newer base release",
            );
        }
    }
}

/// The recipe's `apt:` packages: a base apt can install into, and no package that adds a
/// second CUDA, cuDNN or NCCL or a copy of the host's driver. Whether a package exists is
/// the lock's question (apt answers it against the base's release).
fn check_apt(recipe: &Recipe, problems: &mut Collector) {
    if recipe.apt.is_empty() {
        return;
    }
    if recipe.base.distro().is_none() {
        problems.error(
            "apt-needs-debian-base",
            format!("`apt:` asks for Debian packages, and base {} is not a Debian or Ubuntu release cudastack builds", recipe.base),
            "cudastack resolves and pins `apt:` packages with apt against the release of a base it builds itself; an existing image has no release cudastack can lock against",
            "use `base: { debian: bookworm }` (or another Debian or Ubuntu release), or drop `apt:`",
        );
    }
    for package in &recipe.apt {
        if let Some(family) = library_family(&package.name) {
            let provided = match family.provided {
                Provided::Always => true,
                Provided::WithTorchOrCudnn => recipe.torch.is_some() || recipe.cudnn.is_some(),
                Provided::WithTorch => recipe.torch.is_some(),
            };
            problems.error(
                family.code,
                format!("apt package `{package}` would install {}", family.installs),
                family.why,
                if provided {
                    family.hint
                } else {
                    family.hint_when_absent
                },
            );
        }
    }
}

fn glibc_key(text: &str) -> (u32, u32) {
    let mut parts = text.split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The errors of the recipe's `gpus:` against one platform's torch build (its own wheel's
/// arch list, which differs between x86_64 and aarch64 wheels of one release).
pub fn kernel_errors(matrix: &Matrix, gpus: &[TargetGpu], build: &TorchBuild) -> Vec<Problem> {
    let mut problems = Collector(Vec::new());
    for gpu in gpus {
        check_kernels(matrix, gpu, build, &mut problems);
    }
    problems
        .0
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}

fn check_gpus(
    matrix: &Matrix,
    recipe: &Recipe,
    build: Option<&TorchBuild>,
    problems: &mut Collector,
) {
    for name in &recipe.gpus {
        if let Some(host) = matrix.gpu(name).and_then(|g| g.host) {
            if !recipe.platforms().contains(&host) {
                problems.error(
                    "gpu-host-platform",
                    format!("GPU `{name}` exists only in {host} machines, and the recipe does not build {host}"),
                    format!("its host CPU runs {host} images only, so no image of this recipe can be verified on it or run next to it"),
                    format!("add {host} to `platforms:` (torch >= 2.11 has aarch64 CUDA wheels on PyPI) and run `cudastack lock` again"),
                );
            }
        }
        // A GPU given by capability (`"8.9"`) is named by its sm alone (not `sm_89 (sm_89)`).
        let Some(gpu) = matrix.target_gpu(name) else {
            problems.error(
                "unknown-gpu",
                format!("GPU `{name}` is not in the matrix{}", super::solve::did_you_mean(&matrix.gpu_suggestions(name))),
                "cudastack needs the GPU's compute capability to check that the build has kernels for it",
                "use a name from `cudastack matrix --table gpus`, or give the compute capability directly (e.g. \"8.6\")",
            );
            continue;
        };
        check_gpu_driver(matrix, recipe, &gpu, problems);
        let (gpu_label, cc) = (gpu.label(), gpu.cc);
        if let Some(build) = build {
            check_kernels(matrix, &gpu, build, problems);
        } else if let Some(support) = matrix.arch_support.iter().find(|row| {
            row.cc.major == cc.major
                && row.cc.minor <= cc.minor
                && (row.cc.minor == cc.minor || !matrix.arch_support.iter().any(|r| r.cc == cc))
        }) {
            let cuda = recipe.cuda.version.line();
            if support.removed_in.is_some_and(|removed| cuda >= removed) {
                problems.error(
                    "gpu-arch-removed",
                    format!("CUDA {cuda} cannot compile for {gpu_label}: support was removed in CUDA {}", support.removed_in.unwrap()),
                    "the toolkit's compilers and libraries carry no code for that architecture",
                    format!("use CUDA < {}", support.removed_in.unwrap()),
                );
            }
            if support.first_cuda.is_some_and(|first| cuda < first) {
                problems.error(
                    "gpu-arch-too-new",
                    format!(
                        "CUDA {cuda} predates {gpu_label}: the first toolkit for it is CUDA {}",
                        support.first_cuda.unwrap()
                    ),
                    "the toolkit cannot generate code for an architecture it does not know",
                    format!("use CUDA >= {}", support.first_cuda.unwrap()),
                );
            }
        }
    }
}

/// The kernels `build` carries for `gpu`: nothing to say when it has native ones, a
/// warning for PTX only, an error for none.
fn check_kernels(matrix: &Matrix, gpu: &TargetGpu, build: &TorchBuild, problems: &mut Collector) {
    let (gpu_label, cc) = (gpu.label(), gpu.cc);
    let gpu_with_cc = if gpu.named() {
        format!("{} (compute capability {cc}, {})", gpu.name, cc.sm())
    } else {
        format!("{} (compute capability {cc})", cc.sm())
    };
    let mut archs = build.arch_list.clone();
    archs.sort();
    let archs: Vec<String> = archs.iter().map(ComputeCapability::sm).collect();
    match build.kernels_for(&cc) {
        KernelSupport::Sass(_) => {}
        KernelSupport::Ptx(ptx) => problems.push(
            Severity::Warning,
            "gpu-ptx-only",
            format!("{gpu_label} has no native kernels in torch {}; it would run {}'s PTX through the driver's JIT", build.label(), ptx.sm()),
            "JIT compilation makes the first run slow and needs a driver at least as new as the build's CUDA",
            "prefer a build whose arch list contains the GPU's major",
        ),
        KernelSupport::None => {
            let first = matrix
                .torch_builds
                .iter()
                .filter(|b| b.pypi_default && matches!(b.kernels_for(&cc), KernelSupport::Sass(_)))
                .min_by(|a, b| a.torch.cmp(&b.torch));
            let last = matrix.torch_builds.iter().filter(|b| b.pypi_default && matches!(b.kernels_for(&cc), KernelSupport::Sass(_))).max_by(|a, b| a.torch.cmp(&b.torch));
            let hint = match (first, last) {
                (Some(first), Some(last)) => format!("PyPI builds with kernels for {}: torch {} .. {} (e.g. {} for CUDA {})", cc.sm(), first.torch, last.torch, last.label(), last.cuda),
                _ => format!("no PyPI torch build has kernels for {}; check `cudastack solve --cc {cc}`", cc.sm()),
            };
            problems.error(
                "gpu-no-kernels",
                format!("{gpu_with_cc} has no kernels in torch {} (built for {})", build.label(), archs.join(" ")),
                format!("a cubin runs only on its own major with an equal or newer minor, and {} carries {}; the first CUDA op would fail with \"no kernel image is available for execution on the device\"", build.label(), if build.ptx { "PTX only for its newest arch" } else { "no PTX" }),
                hint,
            );
        }
    }
}

/// The recipe's driver floor against the drivers the GPU runs on at all (an
/// R550 floor for a B200 passed through minor-version compatibility).
fn check_gpu_driver(matrix: &Matrix, recipe: &Recipe, gpu: &TargetGpu, problems: &mut Collector) {
    let Some(drivers) = matrix.gpu_drivers(gpu) else {
        return;
    };
    let floor = &recipe.driver_floor;
    if drivers.runs_on(floor) {
        return;
    }
    let why = format!(
        "a driver that does not support a GPU's architecture does not list the GPU, so CUDA finds no device; minor-version compatibility does not change that (source, {}: {})",
        drivers.status, drivers.source
    );
    let what = format!(
        "driver floor {floor} is {} for {}: it needs {}",
        if drivers.min_driver.as_ref().is_some_and(|min| floor < min) {
            "too old"
        } else {
            "too new"
        },
        drivers.gpu,
        drivers.requirement()
    );
    let hint = match (&drivers.min_driver, &drivers.min_branch, &drivers.last_branch) {
        (Some(min), Some(branch), _) if floor < min => {
            // A floor that names a release, not a bare branch, and that the recipe's CUDA
            // accepts.
            let raise_to = matrix
                .min_driver_for(&recipe.cuda.version)
                .filter(|toolkit| drivers.runs_on(toolkit))
                .unwrap_or(min);
            format!("raise driver_floor to >= {raise_to} and run the image on hosts with the {branch} driver branch or newer")
        }
        (_, _, Some(last)) => format!("lower driver_floor to a driver of the {last} branch or older (with a CUDA that branch supports), or drop this GPU from `gpus:`"),
        _ => drivers.hint(floor),
    };
    problems.error("gpu-driver-unsupported", what, why, hint);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The aarch64 torch 2.11 wheel carries sm_80 and up only: the same recipe GPU that the
    /// x86_64 row accepts is an error against that platform's build.
    #[test]
    fn kernel_errors_use_the_platform_build_given() {
        let matrix = Matrix::embedded();
        let recipe = Recipe::parse(
            "name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"580.65.06\"\ncuda: { version: \"13.0\" }\ncudnn: { version: \"9.19.0.56\" }\ntorch: { version: \"2.11.0\" }\ngpus: [\"Tesla T4\"]\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let x86_64 = selected_torch_build(matrix, &recipe).expect("torch 2.11.0 is in the matrix");
        let gpus = [matrix.target_gpu("Tesla T4").unwrap()];
        assert!(kernel_errors(matrix, &gpus, x86_64).is_empty());
        let aarch64 = TorchBuild {
            arch_list: ["8.0", "9.0", "10.0", "11.0", "12.0"]
                .iter()
                .map(|cc| cc.parse().unwrap())
                .collect(),
            ptx: false,
            ..x86_64.clone()
        };
        let errors = kernel_errors(matrix, &gpus, &aarch64);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code, "gpu-no-kernels");
        assert!(errors[0].what.contains("sm_75"), "{}", errors[0].what);
    }

    /// `image:` and `oci:` bases passed `validate` and failed in `build` only
    /// after the downloads; `build` and `lock` run this before anything else.
    #[test]
    fn image_and_oci_bases_are_refused() {
        let matrix = Matrix::embedded();
        for base in [
            "{ image: \"debian:bookworm@sha256:0000000000000000000000000000000000000000000000000000000000000000\" }",
            "{ oci: \"layouts/debian:latest\" }",
        ] {
            let recipe = Recipe::parse(
                &format!("name: t\nbase: {base}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\n"),
                Path::new("t.yaml"),
            )
            .unwrap();
            let validation = validate(matrix, &recipe);
            let errors: Vec<&Problem> = validation.errors().collect();
            assert_eq!(errors.len(), 1, "{base}: {errors:?}");
            assert_eq!(errors[0].code, "unsupported-base");
            assert!(errors[0].hint.contains("{ debian: bookworm }"), "{}", errors[0].hint);
        }
    }

    fn parse(text: &str) -> Recipe {
        Recipe::parse(text, Path::new("t.yaml")).unwrap()
    }

    /// An `apt:` package that adds a second CUDA, cuDNN or NCCL, or a copy of
    /// the host's driver, is an error with its reason; other packages pass.
    #[test]
    fn apt_packages_that_copy_the_stacks_libraries_are_errors() {
        let matrix = Matrix::embedded();
        let recipe = |apt: &str| {
            parse(&format!("name: t\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: {{ version: \"12.1\" }}\ntorch: {{ version: \"2.4.1\" }}\napt: {apt}\n"))
        };
        let fine = recipe("[git, openssh-client, libgl1, build-essential, libibverbs1, rdma-core]");
        let validation = validate(matrix, &fine);
        assert!(validation.is_valid(), "{:?}", validation.problems);
        for (package, code, why) in [
            ("libcudnn8", "apt-second-cudnn", "one copy of every library"),
            ("nvidia-cudnn", "apt-second-cudnn", "CUDNN_STATUS"),
            (
                "nvidia-cuda-toolkit",
                "apt-second-cuda",
                "one copy of every library",
            ),
            (
                "cuda-toolkit-12-4",
                "apt-second-cuda",
                "nvidia-*-cu* wheels",
            ),
            (
                "\"libnccl2=2.21.5-1+cuda12.4\"",
                "apt-second-nccl",
                "one copy of every library",
            ),
            (
                "libcuda1",
                "apt-driver-library",
                "mounts the host's own copies",
            ),
            ("nvidia-smi", "apt-driver-library", "error 803"),
        ] {
            let validation = validate(matrix, &recipe(&format!("[git, {package}]")));
            let errors: Vec<&Problem> = validation.errors().collect();
            assert_eq!(errors.len(), 1, "{package}: {errors:?}");
            assert_eq!(errors[0].code, code, "{package}");
            let shown = package.trim_matches('"');
            assert!(
                errors[0]
                    .what
                    .contains(&format!("apt package `{shown}` would install")),
                "{}",
                errors[0].what
            );
            assert!(errors[0].why.contains(why), "{package}: {}", errors[0].why);
            assert!(
                errors[0].hint.starts_with("remove it from `apt:`"),
                "{}",
                errors[0].hint
            );
        }
        // Without torch, the hint says how to get cuDNN or NCCL the locked way.
        let bare = parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\napt: [libcudnn9-cuda-12, libnccl2]\n");
        let hints: Vec<String> = validate(matrix, &bare)
            .errors()
            .map(|p| p.hint.clone())
            .collect();
        assert!(
            hints[0].contains("give `cudnn: { version: ... }`"),
            "{hints:?}"
        );
        assert!(hints[1].contains("`nvidia-nccl-cu12`"), "{hints:?}");
        // Every offending entry is reported, not only the first.
        let validation = validate(matrix, &recipe("[libcudnn8, libcudnn8-dev, libcuda1]"));
        assert_eq!(validation.errors().count(), 3, "{:?}", validation.problems);
    }

    /// `apt:` needs a base that cudastack builds with apt.
    #[test]
    fn apt_with_an_image_base_is_an_error() {
        let matrix = Matrix::embedded();
        let recipe = parse("name: t\nbase: { oci: \"layouts/debian\" }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\napt: [git]\n");
        let codes: Vec<&str> = validate(matrix, &recipe).errors().map(|p| p.code).collect();
        assert_eq!(codes, ["unsupported-base", "apt-needs-debian-base"]);
    }

    /// An R550 floor for a Blackwell GPU passed through minor-version
    /// compatibility; the GPU does not run on that driver at all.
    #[test]
    fn a_floor_below_the_gpus_own_minimum_is_an_error() {
        let matrix = Matrix::embedded();
        let recipe = parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.15\"\nminor_version_compat: true\ncuda: { version: \"12.8\" }\ntorch: { version: \"2.8.0\" }\ngpus: [\"B200\"]\n");
        let validation = validate(matrix, &recipe);
        let errors: Vec<&Problem> = validation.errors().collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code, "gpu-driver-unsupported");
        assert!(errors[0].what.contains("driver floor 550.54.15 is too old for B200 (sm_100): it needs driver 570.133.20 or later (R570 branch)"), "{}", errors[0].what);
        assert!(
            errors[0].why.contains("docs.nvidia.com"),
            "{}",
            errors[0].why
        );
        assert!(
            errors[0]
                .hint
                .contains("raise driver_floor to >= 570.133.20"),
            "{}",
            errors[0].hint
        );
        // A GPU given by capability, whose minimum is its architecture's branch: the hint
        // names a release that the recipe's CUDA also accepts.
        let by_cc = parse(&recipe.canonical_json().replace("\"B200\"", "\"12.0\""));
        let errors: Vec<Problem> = validate(matrix, &by_cc).errors().cloned().collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].hint.contains("raise driver_floor to >= 570.26"),
            "{}",
            errors[0].hint
        );
        let fixed = parse(&recipe.canonical_json().replace("550.54.15", "570.133.20"));
        assert!(validate(matrix, &fixed).is_valid());
        // A floor newer than the last branch of a dropped architecture is an error too.
        let volta = parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"590.44.01\"\ncuda: { version: \"12.8\" }\ngpus: [\"V100\"]\n");
        let errors: Vec<Problem> = validate(matrix, &volta).errors().cloned().collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].what.contains("driver floor 590.44.01 is too new for Tesla V100 (sm_70): it needs a driver of the R580 branch or older"), "{}", errors[0].what);
        assert!(
            errors[0]
                .hint
                .contains("lower driver_floor to a driver of the R580 branch or older"),
            "{}",
            errors[0].hint
        );
    }

    /// `version: "2.4"` meant 2.4.0; it is the 2.4 series, resolved to its newest
    /// release that fits the recipe, with a note that says so.
    #[test]
    fn a_two_part_torch_version_picks_the_newest_fitting_release() {
        let matrix = Matrix::embedded();
        let recipe = parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4\" }\n");
        let validation = validate(matrix, &recipe);
        assert!(validation.is_valid(), "{:?}", validation.problems);
        assert_eq!(validation.torch_build.as_deref(), Some("2.4.1+cu121"));
        let note = validation
            .problems
            .iter()
            .find(|p| p.code == "torch-series")
            .unwrap();
        assert!(
            note.what
                .contains("torch \"2.4\" means the 2.4 series; picked 2.4.1"),
            "{}",
            note.what
        );
        // The index and CUDA line are part of the fit: cu118 of the 2.5 series.
        let cu118 = parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"520.61.05\"\ncuda: { version: \"11.8\" }\ntorch: { version: \"2.5\", index: cu118 }\n");
        assert_eq!(
            selected_torch_build(matrix, &cu118).unwrap().label(),
            "2.5.1+cu118"
        );
        // `build` labels the image with the release the lock records.
        assert_eq!(
            locked_torch_build(matrix, &cu118, "2.5.0+cu118")
                .unwrap()
                .label(),
            "2.5.0+cu118"
        );
        assert_eq!(
            locked_torch_build(matrix, &recipe, "2.4.0")
                .unwrap()
                .label(),
            "2.4.0+cu121"
        );
        // Three parts stay exact, and a series without releases says so.
        let exact = parse(&recipe.canonical_json().replace("\"2.4\"", "\"2.4.0\""));
        assert_eq!(
            validate(matrix, &exact).torch_build.as_deref(),
            Some("2.4.0+cu121")
        );
        let none = parse(&recipe.canonical_json().replace("\"2.4\"", "\"2.99\""));
        let errors: Vec<Problem> = validate(matrix, &none).errors().cloned().collect();
        assert!(
            errors[0]
                .what
                .contains("the torch 2.99 series (`==2.99.*`) has no release"),
            "{errors:?}"
        );
    }
}
