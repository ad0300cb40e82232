//! `cudastack matrix refresh`: read the torch releases from PyPI into a matrix that every
//! command then uses.
//!
//! Users: the data goes to the cache (`<cache>/matrix/torch-pypi.json`, see
//! `cudastack::matrix::source`), since an installed binary cannot change what is compiled
//! in. Contributors: `--output data/torch-pypi.json` regenerates the embedded data of a
//! checkout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use clap::Args;
use cudastack::cache::default_cache_root;
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::matrix::refresh::{
    refresh, to_canonical_json, IndexTorchSource, RefreshOptions, RefreshReporter,
};
use cudastack::matrix::source::{refreshed_path, Date};
use cudastack::matrix::{TorchPypiData, TORCH_PYPI_DATA};
use pep440_rs::Version;

use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
#[command(after_help = super::examples::REFRESH)]
pub struct RefreshArgs {
    /// PEP 691 JSON simple index to read torch from.
    #[arg(long, default_value = "https://pypi.org/simple/")]
    pub index: String,
    /// Write the data here instead of the cache, which every command reads
    /// (contributors: `--output data/torch-pypi.json` regenerates the embedded data).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Oldest torch release to include.
    #[arg(long, default_value = "2.0.0")]
    pub since: String,
    /// Skip reading each new release's sm list from libtorch (rows already read keep theirs).
    #[arg(long)]
    pub no_arch_scan: bool,
}

/// `matrix refresh --json`: the file written, its date, and whether commands now use it.
#[derive(serde::Serialize)]
struct Written<'a> {
    output: &'a std::path::Path,
    releases: usize,
    generated: Date,
    /// True when written to the cache, where every command reads it.
    in_use: bool,
}

struct StderrReporter<'a>(&'a Printer);

impl RefreshReporter for StderrReporter<'_> {
    fn release(&self, version: &Version, what: &str) {
        self.0.status(format!("torch {version}: {what}"));
    }
}

/// The rows a refresh may reuse (arch lists of unchanged wheels): the file being replaced
/// when it is a torch matrix, else the embedded data, so a first refresh only scans the
/// releases this binary does not know.
fn previous_data(output: &std::path::Path) -> Option<TorchPypiData> {
    fs_err::read_to_string(output)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .or_else(|| serde_json::from_str(TORCH_PYPI_DATA).ok())
}

pub fn run(args: RefreshArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let since =
        Version::from_str(&args.since).map_err(|e| format!("--since `{}`: {e}", args.since))?;
    let in_use = args.output.is_none();
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| refreshed_path(&default_cache_root()));
    let previous = previous_data(&output);
    let generated = Date::today();
    let data = runtime.block_on(async {
        let client = HttpClient::with_defaults()?;
        let base = args
            .index
            .parse()
            .map_err(|e| format!("--index `{}`: {e}", args.index))?;
        let source = IndexTorchSource {
            index: SimpleIndex::new(client, base),
        };
        let options = RefreshOptions {
            index_url: &args.index,
            since: &since,
            previous: previous.as_ref(),
            scan_arch: !args.no_arch_scan,
            generated,
        };
        let data = refresh(&source, options, &StderrReporter(printer)).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(data)
    })?;
    if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs_err::create_dir_all(parent)?;
    }
    // Whole or not at all: an interrupted refresh leaves the old file.
    cudastack::atomic_file::write(&output, to_canonical_json(&data).as_bytes())
        .map_err(|e| format!("failed to write `{}`: {e}", output.display()))?;
    if printer.json {
        printer.json(&Written {
            output: &output,
            releases: data.releases.len(),
            generated,
            in_use,
        });
        return Ok(ExitCode::SUCCESS);
    }
    let releases = data.releases.len();
    printer.line(format_args!(
        "wrote {releases} torch release{} (generated {generated}) to {}",
        if releases == 1 { "" } else { "s" },
        output.display()
    ));
    if in_use {
        printer.line(format_args!(
            "solve, validate, lock, check, build and matrix now use it; delete {} to go back to the matrix built into cudastack",
            output.display()
        ));
    }
    Ok(ExitCode::SUCCESS)
}
