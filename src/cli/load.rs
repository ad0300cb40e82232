//! `cudastack load images/NAME [--tag T]...`: load an OCI layout's image into the Docker
//! daemon (streamed, skipped when the daemon already has it) and tag it.
//! stdout: the image ID, then the tags (or `--json`: the load report).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use cudastack::engine::load::layout_tags;
use cudastack::engine::{split_tag, Engine, LoadReport};
use cudastack::stack::build::human_bytes;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The OCI layout directory (e.g. images/torch2.4.1-cu121-py3.11).
    layout: PathBuf,
    /// Which image of the layout (its ref name).
    #[arg(long = "ref", default_value = "latest")]
    ref_name: String,
    /// Tag the loaded image as name[:tag] (repeatable). Default: the tags the layout
    /// records for the image (the recipe's tags).
    #[arg(long = "tag", short = 't')]
    tags: Vec<String>,
}

pub fn run(args: LoadArgs, printer: &Printer) -> CommandResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let tags = if args.tags.is_empty() {
        layout_tags(&args.layout, &args.ref_name)?
    } else {
        args.tags
    };
    let report = runtime.block_on(load(&args.layout, &args.ref_name, &tags, printer))?;
    if printer.json {
        printer.json(&report);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Check the tags, connect and load, with a status line on stderr (also used by
/// `build --load`). A tag the daemon would refuse is an error before anything is said
/// about loading or any daemon is contacted.
pub async fn load(
    layout: &Path,
    ref_name: &str,
    tags: &[String],
    printer: &Printer,
) -> Result<LoadReport, Box<dyn std::error::Error + Send + Sync>> {
    for tag in tags {
        split_tag(tag)?;
    }
    let engine = Engine::connect().await?;
    printer.status(format!(
        "loading {}:{ref_name} into the Docker daemon at {}",
        layout.display(),
        engine.host()
    ));
    let report = engine.load_layout(layout, ref_name, tags).await?;
    if report.skipped {
        printer.status(format!(
            "the daemon already has {}; tagged in {:.2}s",
            report.image_id, report.seconds
        ));
    } else {
        printer.status(format!(
            "loaded {} in {:.1}s ({}/s)",
            human_bytes(report.bytes),
            report.seconds,
            human_bytes(report.throughput() as u64)
        ));
    }
    Ok(report)
}

/// The human output on stdout: the image ID, then one tag per line.
pub fn print_report(report: &LoadReport) {
    println!("{}", report.image_id);
    for tag in &report.tags {
        println!("{tag}");
    }
}
