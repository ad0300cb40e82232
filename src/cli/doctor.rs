//! `cudastack doctor [--root DIR] [--keep-going] [--gpu-image IMAGE]`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use cudastack::doctor::{diagnose, planted_host, DoctorOptions, LayerStatus, Severity};
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
}

pub fn run(args: DoctorArgs, printer: &Printer) -> CommandResult {
    let host = match &args.root {
        Some(root) => planted_host(root, std::env::vars().collect::<BTreeMap<_, _>>())?,
        None => HostRoot::live(),
    };
    let options = DoctorOptions {
        keep_going: args.keep_going,
        python_timeout: Duration::from_secs(args.python_timeout),
        gpu_image: args.gpu_image,
    };
    let report = diagnose(&host, &options);
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
        let status = match layer.status {
            LayerStatus::Ok => "ok",
            LayerStatus::Warning => "warning",
            LayerStatus::Broken => "BROKEN",
            LayerStatus::NotChecked => "not checked",
        };
        printer.line(format_args!("== {} [{status}]", layer.title));
        for finding in &layer.findings {
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
    Ok(code)
}
