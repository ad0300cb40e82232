//! `cudastack load images/NAME [--tag T]...`: load an OCI layout's image into the Docker
//! daemon (streamed, skipped when the daemon already has it) and tag it.
//! stdout: the image ID, then the tags (or `--json`: the load report).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::engine::LoadReport;
use cudastack::pipeline::load::load_from_layout;

use super::args::RefArg;
use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The OCI layout directory (e.g. images/torch2.4.1-cu121-py3.11).
    layout: PathBuf,
    #[command(flatten)]
    layout_ref: RefArg,
    /// Tag the loaded image as name[:tag] (repeatable). Default: the tags the layout
    /// records for the image (the recipe's tags).
    #[arg(long = "tag", short = 't')]
    tags: Vec<String>,
}

pub fn run(args: LoadArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let tags = (!args.tags.is_empty()).then_some(args.tags.as_slice());
    let report = runtime.block_on(load_from_layout(
        &args.layout,
        &args.layout_ref.ref_name,
        tags,
        printer,
    ))?;
    if printer.json {
        printer.json(&report);
    } else {
        print_report(&report, printer);
    }
    Ok(ExitCode::SUCCESS)
}

/// The human output on stdout: the image ID, then one tag per line.
fn print_report(report: &LoadReport, printer: &Printer) {
    printer.line(report.image_id);
    for tag in &report.tags {
        printer.line(tag);
    }
}
