//! Layer 4 of the funnel: the Python in use and its torch. Reads what torch itself reports
//! (version, `torch.version.cuda`, the cuDNN it loaded, the compiled sm list, whether CUDA
//! is available) and checks it against the layers below: the driver's CUDA ceiling, the
//! GPUs' compute capabilities, and the cuDNN the torch build pins (matrix). An import
//! failure is run through [`explain`](super::explain).

use std::str::FromStr;

use super::explain::Knowledge;
use super::{Finding, Severity};
use crate::host::driver::DriverReport;
use crate::host::python::{PythonProbe, TorchInfo};
use crate::matrix::{KernelSupport, Matrix};
use crate::version::{ComputeCapability, CudaVersion};

pub fn check(probe: &PythonProbe, driver: &DriverReport, matrix: &Matrix) -> Vec<Finding> {
    let mut findings = Vec::new();
    let (path, info) = match probe {
        PythonProbe::NotFound => {
            findings.push(Finding::new(
                "python.not_found",
                Severity::Info,
                "no python3 on PATH: nothing to check in this layer",
            ));
            return findings;
        }
        PythonProbe::Failed { path, output } => {
            findings.push(
                Finding::new(
                    "python.probe_failed",
                    Severity::Warning,
                    format!("{} did not run the probe", path.display()),
                )
                .evidence(output.clone())
                .fix("run the interpreter by hand; `cudastack explain` its error"),
            );
            return findings;
        }
        PythonProbe::Ok { path, info } => (path, info),
    };
    findings.push(
        Finding::new(
            "python.found",
            Severity::Ok,
            format!("Python {} ({})", info.python, info.executable),
        )
        .evidence(format!("first on PATH: {}", path.display())),
    );
    let Some(torch) = &info.torch else {
        findings.push(Finding::new(
            "python.no_torch",
            Severity::Info,
            "torch is not installed in this Python",
        ));
        return findings;
    };
    if let Some(error) = &torch.import_error {
        let report = Knowledge::embedded().explain(error, matrix);
        let mut finding = Finding::new(
            "python.torch_import_failed",
            Severity::Error,
            "import torch fails",
        )
        .evidence(error.clone());
        finding = match report.explanations.first() {
            Some(explanation) => finding
                .evidence(format!(
                    "explain: {} ({})",
                    explanation.title, explanation.id
                ))
                .fix(explanation.fix.join(" ")),
            None => finding.fix("run `cudastack explain` on the full traceback"),
        };
        findings.push(finding);
        return findings;
    }
    check_torch(torch, driver, matrix, &mut findings);
    check_mapped(torch, &info.prefix, &mut findings);
    findings
}

/// Which cuDNN files the torch process really mapped: two different files of one library,
/// or a copy from outside the Python environment, is the shadowing DESIGN.md warns about.
fn check_mapped(torch: &TorchInfo, prefix: &str, findings: &mut Vec<Finding>) {
    let cudnn: Vec<&String> = torch
        .mapped
        .iter()
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("libcudnn.so") || name.starts_with("libcudnn_")
        })
        .collect();
    if cudnn.is_empty() {
        return;
    }
    let main: Vec<&&String> = cudnn
        .iter()
        .filter(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("libcudnn.so"))
        })
        .collect();
    let dirs: std::collections::BTreeSet<&str> = main
        .iter()
        .filter_map(|path| path.rsplit_once('/').map(|(dir, _)| dir))
        .collect();
    if dirs.len() > 1 {
        findings.push(
            Finding::new(
                "python.cudnn_two_copies",
                Severity::Error,
                "torch's process maps libcudnn from more than one directory: two cuDNN copies in one process",
            )
            .evidences(main.iter().map(|p| format!("mapped: {p}")))
            .fix("leave only the cuDNN torch pins reachable: remove the other directory from LD_LIBRARY_PATH / ld.so.conf.d"),
        );
    }
    let outside: Vec<&&String> = cudnn
        .iter()
        .filter(|path| !prefix.is_empty() && !path.starts_with(prefix))
        .collect();
    if !outside.is_empty() {
        findings.push(
            Finding::new(
                "python.cudnn_outside_env",
                Severity::Warning,
                format!("torch maps cuDNN from outside its Python environment ({prefix})"),
            )
            .evidences(outside.iter().map(|p| format!("mapped: {p}")))
            .fix("a system or LD_LIBRARY_PATH copy shadows the one installed with torch: remove it from the loader path unless you installed torch against it on purpose"),
        );
    } else {
        findings.push(
            Finding::new(
                "python.cudnn_mapped",
                Severity::Ok,
                "torch maps the cuDNN of its own environment",
            )
            .evidences(cudnn.iter().map(|p| format!("mapped: {p}"))),
        );
    }
}

/// The checks of a CUDA torch build against the layers below; a CPU-only build is one finding.
fn check_torch(
    torch: &TorchInfo,
    driver: &DriverReport,
    matrix: &Matrix,
    findings: &mut Vec<Finding>,
) {
    let version = torch.version.clone().unwrap_or_else(|| "?".into());
    let have_gpus = !driver.gpus.is_empty();
    let Some(cuda_text) = &torch.cuda else {
        findings.push(
            Finding::new(
                "python.torch_cpu_only",
                if have_gpus { Severity::Error } else { Severity::Warning },
                format!("torch {version} is a CPU-only build (torch.version.cuda is None)"),
            )
            .evidence(format!("torch at {}", torch.file.clone().unwrap_or_default()))
            .fix("install a CUDA build: `pip install torch==<version>` from PyPI on Linux x86_64, or `--index-url https://download.pytorch.org/whl/cuXYZ` (`cudastack solve` picks one for this host)"),
        );
        return;
    };
    let cuda: Option<CudaVersion> = cuda_text.parse().ok();
    findings.push(
        Finding::new(
            "python.torch",
            Severity::Ok,
            format!(
                "torch {version}, built for CUDA {cuda_text}, cuDNN {}",
                torch
                    .cudnn
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none".into())
            ),
        )
        .evidence(format!(
            "torch at {}",
            torch.file.clone().unwrap_or_default()
        )),
    );
    findings.extend(cuda_above_driver_finding(&version, cuda, driver, matrix));
    findings.extend(kernel_findings(torch, &version, driver, matrix));
    findings.extend(cudnn_skew_finding(torch, cuda, matrix));
    findings.extend(cuda_available_finding(torch, have_gpus));
}

/// Driver ceiling vs the runtime torch brings.
fn cuda_above_driver_finding(
    version: &str,
    cuda: Option<CudaVersion>,
    driver: &DriverReport,
    matrix: &Matrix,
) -> Option<Finding> {
    let (Some(cuda), Some(ceiling)) = (cuda, driver.cuda_ceiling) else {
        return None;
    };
    if cuda.line() <= ceiling {
        return None;
    }
    let need = matrix
        .min_driver_for(&cuda)
        .map(|d| d.to_string())
        .unwrap_or_else(|| "?".into());
    let minor_ok = driver.driver_version.as_ref().is_some_and(|d| {
        cuda.major == ceiling.major
            && matrix
                .minor_compat_floor(cuda.major)
                .is_some_and(|m| m.min_driver <= *d)
    });
    Some(
        Finding::new(
            "python.torch_cuda_above_driver",
            if minor_ok {
                Severity::Warning
            } else {
                Severity::Error
            },
            format!(
                "torch {version} needs CUDA {cuda} but the driver supports CUDA <= {ceiling}{}",
                if minor_ok {
                    " (minor-version compatibility may carry it; PTX JIT and some APIs will fail)"
                } else {
                    ""
                }
            ),
        )
        .evidence(format!("CUDA {cuda} needs a driver >= {need}"))
        .fix(format!(
            "upgrade the driver to >= {need}, or install a torch built for CUDA <= {ceiling}"
        )),
    )
}

/// Kernels for each GPU: native (SASS), PTX only, or none.
fn kernel_findings(
    torch: &TorchInfo,
    version: &str,
    driver: &DriverReport,
    matrix: &Matrix,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let archs: Vec<ComputeCapability> = torch
        .arch_list
        .iter()
        .filter_map(|a| ComputeCapability::from_str(a).ok())
        .collect();
    let has_ptx = torch.arch_list.iter().any(|a| a.starts_with("compute_"));
    for gpu in &driver.gpus {
        let Some(cc) = gpu.cc.or_else(|| matrix.gpu(&gpu.name).map(|g| g.cc)) else {
            continue;
        };
        if archs.is_empty() {
            continue;
        }
        let sass = archs.iter().any(|a| a.cubin_runs_on(&cc));
        let ptx = has_ptx && archs.iter().any(|a| a.ptx_runs_on(&cc));
        let support = if sass {
            KernelSupport::Sass(cc)
        } else if ptx {
            KernelSupport::Ptx(cc)
        } else {
            KernelSupport::None
        };
        match support {
            KernelSupport::Sass(_) => {}
            KernelSupport::Ptx(_) => findings.push(
                Finding::new(
                    "python.torch_ptx_only",
                    Severity::Warning,
                    format!("torch has no native kernels for {} ({}); it will JIT-compile PTX (slow first run)", gpu.name, cc.sm()),
                )
                .evidence(format!("arch list: {}", torch.arch_list.join(" ")))
                .fix("install a torch build whose arch list includes this GPU"),
            ),
            KernelSupport::None => findings.push(
                Finding::new(
                    "python.torch_no_kernels",
                    Severity::Error,
                    format!("torch {version} has no kernels for {} ({}): 'no kernel image is available for execution on the device'", gpu.name, cc.sm()),
                )
                .evidence(format!("arch list: {}", torch.arch_list.join(" ")))
                .fix(format!("install a build with {} kernels (`cudastack solve --cc {cc}`)", cc.sm())),
            ),
        }
    }
    findings
}

/// cuDNN torch loaded vs the one its build pins.
fn cudnn_skew_finding(
    torch: &TorchInfo,
    cuda: Option<CudaVersion>,
    matrix: &Matrix,
) -> Option<Finding> {
    let (Some(loaded), Some(torch_version)) = (torch.cudnn, torch.version.as_deref()) else {
        return None;
    };
    let (release, variant) = torch_version.split_once('+').unwrap_or((torch_version, ""));
    let build = pep440_rs::Version::from_str(release).ok().and_then(|v| {
        let builds: Vec<_> = matrix.torch_builds_of(&v).collect();
        builds
            .iter()
            .find(|b| !variant.is_empty() && b.variant == variant)
            .or_else(|| builds.iter().find(|b| b.pypi_default && variant.is_empty()))
            .or_else(|| {
                builds
                    .iter()
                    .find(|b| cuda.is_some_and(|c| b.cuda.line() == c.line()))
            })
            .copied()
    });
    let pinned = build.and_then(|b| b.cudnn.as_ref())?;
    let expected = pinned.version_macro();
    (expected != loaded).then(|| {
        Finding::new(
            "python.cudnn_skew",
            Severity::Warning,
            format!("torch {torch_version} loaded cuDNN {loaded} but its build pins cuDNN {pinned} ({expected})"),
        )
        .evidence("another libcudnn (LD_LIBRARY_PATH, ld.so.cache, or a different nvidia-cudnn wheel) won the loader race".to_string())
        .fix("make the pinned nvidia-cudnn wheel the only cuDNN this process can reach (see the host stack layer for copies on the loader path)")
    })
}

/// Whether torch sees the GPUs the driver reports.
fn cuda_available_finding(torch: &TorchInfo, have_gpus: bool) -> Option<Finding> {
    if have_gpus && !torch.available {
        let mut finding = Finding::new(
            "python.cuda_unavailable",
            Severity::Error,
            "GPUs are present but torch.cuda.is_available() is False",
        );
        if let Some(error) = &torch.cuda_error {
            finding = finding.evidence(error.clone());
        }
        Some(finding.fix("run `python -c \"import torch; torch.cuda.init()\"` and pass its message to `cudastack explain`"))
    } else if torch.available {
        Some(
            Finding::new(
                "python.cuda_available",
                Severity::Ok,
                format!("torch sees {} GPU(s)", torch.devices.len()),
            )
            .evidences(
                torch
                    .devices
                    .iter()
                    .map(|d| format!("{} (compute capability {})", d.name, d.cc)),
            ),
        )
    } else {
        None
    }
}
