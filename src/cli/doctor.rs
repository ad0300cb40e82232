//! `cudastack doctor [--root DIR] [--keep-going] [--gpu-image IMAGE] [--build-host]`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use cudastack::doctor::build_host::{self, BuildHostReport};
use cudastack::doctor::{diagnose, planted_host, DoctorOptions, Finding, LayerStatus, Severity};
use cudastack::host::HostRoot;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Examine a host planted under DIR instead of this machine (the environment is this
    /// process's; absolute paths are read under DIR).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Examine every layer even after a broken one.
    #[arg(long)]
    keep_going: bool,
    /// Start a GPU container from this local image (`docker run --rm --gpus all IMAGE
    /// nvidia-smi -L`); nothing is pulled.
    #[arg(long, value_name = "IMAGE")]
    gpu_image: Option<String>,
    /// Seconds the Python probe (which imports torch) may take.
    #[arg(long, default_value_t = 120)]
    python_timeout: u64,
    /// Check only whether this host can run `cudastack build` (mmdebstrap, the build modes
    /// root / unshare / fakechroot, the cache directory and its free space, Docker); no
    /// GPU needed. Exit 1 when it cannot.
    #[arg(long, conflicts_with = "root")]
    build_host: bool,
    /// The cache directory a build would use (checked for writability and free space).
    #[arg(long, env = "CUDASTACK_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

pub fn run(args: DoctorArgs, printer: &Printer) -> CommandResult {
    let host = match &args.root {
        Some(root) => planted_host(root, std::env::vars().collect::<BTreeMap<_, _>>())?,
        None => HostRoot::live(),
    };
    let cache_dir = cudastack::cache::cache_root(args.cache_dir.clone());
    if args.build_host {
        let report = build_host::check(&host, &cache_dir);
        if printer.json {
            printer.json(&report);
        } else {
            print_build_host(&report, printer);
        }
        return Ok(match report.status {
            LayerStatus::Broken => ExitCode::from(1),
            _ => ExitCode::SUCCESS,
        });
    }
    let options = DoctorOptions {
        keep_going: args.keep_going,
        python_timeout: Duration::from_secs(args.python_timeout),
        gpu_image: args.gpu_image,
    };
    let mut report = diagnose(&host, &options);
    // A planted host describes a GPU machine; the build host is always this one.
    if args.root.is_none() {
        report.build_host = Some(build_host::check(&host, &cache_dir));
    }
    let code = if report.stopped_at.is_some() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if printer.json {
        printer.json(&report);
        return Ok(code);
    }
    for layer in &report.layers {
        print_section(layer.title, layer.status, &layer.findings, printer);
    }
    printer.line("");
    if let Some(layer) = report.stopped_at {
        printer.line(format_args!(
            "stopped at the first broken layer: {}",
            layer.title()
        ));
    }
    match &report.recommendation.best {
        Some(best) => {
            printer.line(format_args!(
                "solve picks for this host ({}): torch {} (index {}, CUDA {}, cuDNN {})",
                report.recommendation.reason,
                best.torch_build,
                best.index,
                best.cuda,
                best.cudnn.as_deref().unwrap_or("-")
            ));
            if let Some(recipe) = &best.recipe {
                printer.line(format_args!("---\n{recipe}"));
            }
        }
        None => printer.line(format_args!("solve: {}", report.recommendation.reason)),
    }
    if let Some(build) = &report.build_host {
        printer.line("");
        print_build_host(build, printer);
    }
    Ok(code)
}

fn print_build_host(report: &BuildHostReport, printer: &Printer) {
    print_section(report.title, report.status, &report.findings, printer);
}

/// One section: its title and status, then each finding with its evidence and fix.
fn print_section(title: &str, status: LayerStatus, findings: &[Finding], printer: &Printer) {
    let status = match status {
        LayerStatus::Ok => "ok",
        LayerStatus::Warning => "warning",
        LayerStatus::Broken => "BROKEN",
        LayerStatus::NotChecked => "not checked",
    };
    printer.line(format_args!("== {title} [{status}]"));
    for finding in findings {
        let mark = match finding.severity {
            Severity::Ok => "ok  ",
            Severity::Info => "info",
            Severity::Warning => "warn",
            Severity::Error => "FAIL",
        };
        printer.line(format_args!(
            "  {mark} {} ({})",
            finding.summary, finding.id
        ));
        for line in &finding.evidence {
            printer.line(format_args!("         | {line}"));
        }
        if let Some(fix) = &finding.fix {
            printer.line(format_args!("         fix: {fix}"));
        }
    }
}
