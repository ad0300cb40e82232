//! `cudastack doctor`: diagnose a host from the driver up, and (in [`explain`]) turn error
//! messages into causes and fixes.
//!
//! The diagnosis is a funnel of four layers, bottom up, because each one needs the one
//! below it: (1) [`hardware`]: GPUs and the driver; (2) [`runtime`]: Docker and the NVIDIA
//! container runtime; (3) [`stack`]: CUDA toolkits and libraries the loader can see;
//! (4) [`python`]: the Python in use and its torch. The funnel stops at the first broken
//! layer (a finding of severity `error`) and says so; `keep_going` examines the rest anyway.
//! It ends with what `solve` picks for this host's driver and GPUs. Beside the funnel,
//! [`build_host`] says whether this host can run `cudastack build` (no GPU needed).
//!
//! It reads the host only through [`HostRoot`](crate::host::HostRoot), so tests run the
//! whole funnel against planted temp roots. Nothing here changes the host.
//!
//! The `--json` output is a [`DoctorReport`]; docs/doctor.md documents every field.

pub mod build_host;
pub mod explain;
pub mod hardware;
pub mod python;
pub mod runtime;
pub mod stack;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::host::driver::{self, DriverReport};
use crate::host::python::PythonProbe;
use crate::host::HostRoot;
use crate::matrix::solve::{solve, Candidate, SolveQuery};
use crate::matrix::Matrix;
use crate::target_gpu::TargetGpu;
use crate::version::{CudaVersion, DriverVersion, PythonVersion};

/// Versioned identifier of the JSON document.
pub const DOCTOR_SCHEMA: &str = "cudastack.doctor/v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// A check that passed (kept as evidence of what was examined).
    Ok,
    Info,
    Warning,
    /// Breaks this layer: the funnel stops here.
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Hardware,
    ContainerRuntime,
    HostStack,
    Python,
}

impl Layer {
    pub const ALL: [Layer; 4] = [
        Layer::Hardware,
        Layer::ContainerRuntime,
        Layer::HostStack,
        Layer::Python,
    ];
    pub fn title(&self) -> &'static str {
        match self {
            Layer::Hardware => "hardware and driver",
            Layer::ContainerRuntime => "container runtime",
            Layer::HostStack => "host stack hygiene",
            Layer::Python => "Python in use",
        }
    }
}

/// One observation with what it means and what to do.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Stable identifier, e.g. `driver.nvml_mismatch`, `stack.cudnn_versions`.
    pub id: String,
    pub severity: Severity,
    pub summary: String,
    /// What was read (files, command output, versions) that led to the finding.
    pub evidence: Vec<String>,
    /// What to do; absent for `ok` findings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn new(id: &str, severity: Severity, summary: impl Into<String>) -> Self {
        Finding {
            id: id.to_string(),
            severity,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: None,
        }
    }
    pub fn evidence(mut self, line: impl Into<String>) -> Self {
        self.evidence.push(line.into());
        self
    }
    pub fn evidences(mut self, lines: impl IntoIterator<Item = String>) -> Self {
        self.evidence.extend(lines);
        self
    }
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerStatus {
    Ok,
    Warning,
    Broken,
    /// Not examined because a layer below is broken.
    NotChecked,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub layer: Layer,
    pub title: &'static str,
    pub status: LayerStatus,
    pub findings: Vec<Finding>,
}

impl LayerReport {
    /// A layer not examined, and why.
    fn not_checked(layer: Layer, why: String) -> Self {
        LayerReport {
            layer,
            title: layer.title(),
            status: LayerStatus::NotChecked,
            findings: vec![Finding::new("funnel.not_checked", Severity::Info, why)],
        }
    }

    fn from_findings(layer: Layer, findings: Vec<Finding>) -> Self {
        let worst = findings.iter().map(|f| f.severity).max();
        let status = match worst {
            Some(Severity::Error) => LayerStatus::Broken,
            Some(Severity::Warning) => LayerStatus::Warning,
            _ => LayerStatus::Ok,
        };
        LayerReport {
            layer,
            title: layer.title(),
            status,
            findings,
        }
    }
}

/// The host facts the recommendation is based on.
#[derive(Debug, Clone, Serialize)]
pub struct HostSummary {
    pub driver: Option<DriverVersion>,
    pub cuda_ceiling: Option<CudaVersion>,
    pub gpus: Vec<driver::GpuDevice>,
    pub python: Option<String>,
    pub torch: Option<String>,
}

/// What `solve` picks for this host.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// `picked`, `none_fits`, or `not_possible` (no driver known).
    pub status: &'static str,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<Candidate>,
}

/// The whole diagnosis.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    pub schema: &'static str,
    /// The host root examined (`/` for the live system).
    pub root: String,
    /// Every layer, bottom up; layers above a broken one are `not_checked` unless
    /// `keep_going` was set.
    pub layers: Vec<LayerReport>,
    /// The first broken layer, if any.
    pub stopped_at: Option<Layer>,
    pub host: HostSummary,
    pub recommendation: Recommendation,
    /// Whether this host can run `cudastack build` (not part of the funnel: a build host
    /// needs no GPU); absent for a planted host (`--root`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_host: Option<build_host::BuildHostReport>,
}

impl DoctorReport {
    pub fn findings(&self) -> impl Iterator<Item = &Finding> {
        self.layers.iter().flat_map(|l| l.findings.iter())
    }
    pub fn finding(&self, id: &str) -> Option<&Finding> {
        self.findings().find(|f| f.id == id)
    }
    pub fn layer(&self, layer: Layer) -> &LayerReport {
        self.layers
            .iter()
            .find(|l| l.layer == layer)
            .expect("every layer is reported")
    }
}

/// Errors that stop the diagnosis before it starts.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("the host root `{path}` does not exist\n  hint: give --root the directory a host is planted under, or leave --root out to examine this machine")]
    RootMissing { path: PathBuf },
    #[error("the host root `{path}` is not a directory\n  hint: give --root the directory a host is planted under (its `/`), not a file in it")]
    RootNotDirectory { path: PathBuf },
    #[error("cannot read the host root `{path}`")]
    RootUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The host planted under `root` (`doctor --root DIR`), once `root` is known to be a
/// readable directory. Every file the diagnosis reads is looked up under the root, so a
/// missing root would otherwise read as a host with nothing installed: "no driver"
/// instead of "no such directory".
pub fn planted_host(root: &Path, env: BTreeMap<String, String>) -> Result<HostRoot, DoctorError> {
    let metadata = std::fs::metadata(root).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => DoctorError::RootMissing {
            path: root.to_path_buf(),
        },
        _ => DoctorError::RootUnreadable {
            path: root.to_path_buf(),
            source,
        },
    })?;
    if !metadata.is_dir() {
        return Err(DoctorError::RootNotDirectory {
            path: root.to_path_buf(),
        });
    }
    std::fs::read_dir(root).map_err(|source| DoctorError::RootUnreadable {
        path: root.to_path_buf(),
        source,
    })?;
    Ok(HostRoot::planted(root, env))
}

#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// Examine every layer even after a broken one.
    pub keep_going: bool,
    /// How long the Python probe (which imports torch) may take.
    pub python_timeout: Duration,
    /// Run `docker run --rm --gpus all IMAGE nvidia-smi -L` as the quick GPU container test.
    pub gpu_image: Option<String>,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            keep_going: false,
            python_timeout: Duration::from_secs(120),
            gpu_image: None,
        }
    }
}

/// Run the funnel on a host.
pub fn diagnose(host: &HostRoot, options: &DoctorOptions) -> DoctorReport {
    let matrix = Matrix::embedded();
    let driver_report = driver::detect(host);
    let mut layers = Vec::new();
    let mut stopped_at = None;
    let mut python_probe: Option<PythonProbe> = None;
    for layer in Layer::ALL {
        if stopped_at.is_some() && !options.keep_going {
            let below = stopped_at.map(|l: Layer| l.title()).unwrap_or_default();
            layers.push(LayerReport::not_checked(
                layer,
                format!("not checked: the {below} layer below is broken; fix it first (or pass --keep-going)"),
            ));
            continue;
        }
        // Without a GPU, the runtime, stack and Python layers have nothing to run on.
        if layer != Layer::Hardware && driver_report.no_gpu_hardware() {
            layers.push(LayerReport::not_checked(
                layer,
                "not checked: this host has no NVIDIA GPU (see the hardware layer)".to_string(),
            ));
            continue;
        }
        let findings = match layer {
            Layer::Hardware => hardware::check(host, &driver_report, matrix),
            Layer::ContainerRuntime => runtime::check(host, &driver_report, options),
            Layer::HostStack => stack::check(host, matrix),
            Layer::Python => {
                let probe = crate::host::python::probe(host, options.python_timeout);
                let findings = python::check(&probe, &driver_report, matrix);
                python_probe = Some(probe);
                findings
            }
        };
        let report = LayerReport::from_findings(layer, findings);
        if report.status == LayerStatus::Broken && stopped_at.is_none() {
            stopped_at = Some(layer);
        }
        layers.push(report);
    }
    let (python, torch) = match &python_probe {
        Some(PythonProbe::Ok { info, .. }) => (
            Some(info.python.clone()),
            info.torch.as_ref().and_then(|t| t.version.clone()),
        ),
        _ => (None, None),
    };
    let recommendation = recommend(&driver_report, python.as_deref(), matrix);
    DoctorReport {
        schema: DOCTOR_SCHEMA,
        root: host.root().display().to_string(),
        layers,
        stopped_at,
        host: HostSummary {
            driver: driver_report.driver_version.clone(),
            cuda_ceiling: driver_report.cuda_ceiling,
            gpus: driver_report.gpus.clone(),
            python,
            torch,
        },
        recommendation,
        build_host: None,
    }
}

/// Ask `solve` for the best build for this driver and these GPUs.
fn recommend(driver: &DriverReport, python: Option<&str>, matrix: &Matrix) -> Recommendation {
    let Some(version) = driver.driver_version.clone() else {
        return Recommendation {
            status: "not_possible",
            reason: "no NVIDIA driver was detected on this host, so there is no ceiling to solve against; run `cudastack solve --driver VERSION --gpu NAME` for the machine that will run the image".into(),
            best: None,
        };
    };
    let gpus: Vec<TargetGpu> = driver
        .gpus
        .iter()
        .filter_map(|gpu| {
            let cc = gpu
                .cc
                .or_else(|| matrix.gpu(&gpu.name).map(|known| known.cc))?;
            Some(TargetGpu {
                name: gpu.name.clone(),
                cc,
            })
        })
        .collect();
    let python: Option<PythonVersion> = python.and_then(|p| {
        let mut parts = p.split('.');
        format!("{}.{}", parts.next()?, parts.next()?).parse().ok()
    });
    let query = SolveQuery {
        driver: Some(version.clone()),
        gpus: gpus.clone(),
        python,
        torch: None,
        allow_minor_compat: true,
        // PyPI only: what the recipe of the recommendation locks from.
        ..Default::default()
    };
    let mut solution = solve(matrix, &query);
    let mut note = String::new();
    if solution.best().is_none() && python.is_some() {
        // The Python in use may simply be too new or too old for any build: solve without it.
        solution = solve(
            matrix,
            &SolveQuery {
                python: None,
                ..query
            },
        );
        note = " (no build has a wheel for this Python; solved without it)".into();
    }
    let gpu_text = if gpus.is_empty() {
        "no GPU with a known compute capability".to_string()
    } else {
        gpus.iter()
            .map(|g| format!("{} ({})", g.name, g.cc.sm()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match solution.best() {
        Some(best) => Recommendation {
            status: "picked",
            reason: format!("driver {version}, {gpu_text}{note}"),
            best: Some(best.clone()),
        },
        None => Recommendation {
            status: "none_fits",
            reason: format!(
                "no torch build in the matrix fits driver {version} and {gpu_text}; newest rejection: {}",
                solution
                    .candidates
                    .first()
                    .map(|c| c.reasons.join("; "))
                    .unwrap_or_default()
            ),
            best: None,
        },
    }
}
