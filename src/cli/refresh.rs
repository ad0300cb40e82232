//! `cudastack matrix refresh`: regenerate data/torch-pypi.json from PyPI.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use clap::Args;
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::matrix::refresh::{refresh, to_canonical_json, IndexTorchSource, RefreshReporter};
use cudastack::matrix::TorchPypiData;
use pep440_rs::Version;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
#[command(after_help = super::examples::REFRESH)]
pub struct RefreshArgs {
    /// PEP 691 JSON simple index to read torch from.
    #[arg(long, default_value = "https://pypi.org/simple/")]
    pub index: String,
    /// Where to write the data file.
    #[arg(long, default_value = "data/torch-pypi.json")]
    pub output: PathBuf,
    /// Oldest torch release to include.
    #[arg(long, default_value = "2.0.0")]
    pub since: String,
    /// Skip reading each release's sm list from libtorch (reuses rows already in --output).
    #[arg(long)]
    pub no_arch_scan: bool,
}

/// `matrix refresh --json`: the file written and how many releases it holds.
#[derive(serde::Serialize)]
struct Written<'a> {
    output: &'a std::path::Path,
    releases: usize,
}

struct StderrReporter<'a>(&'a Printer);

impl RefreshReporter for StderrReporter<'_> {
    fn release(&self, version: &Version, what: &str) {
        self.0.status(format!("torch {version}: {what}"));
    }
}

pub fn run(args: RefreshArgs, printer: &Printer) -> CommandResult {
    let since =
        Version::from_str(&args.since).map_err(|e| format!("--since `{}`: {e}", args.since))?;
    let previous: Option<TorchPypiData> = match fs_err::read_to_string(&args.output) {
        Ok(text) => serde_json::from_str(&text).ok(),
        Err(_) => None,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let data = runtime.block_on(async {
        let client = HttpClient::with_defaults()?;
        let base = args
            .index
            .parse()
            .map_err(|e| format!("--index `{}`: {e}", args.index))?;
        let source = IndexTorchSource {
            index: SimpleIndex::new(client, base),
        };
        let data = refresh(
            &source,
            &args.index,
            &since,
            previous.as_ref(),
            !args.no_arch_scan,
            &StderrReporter(printer),
        )
        .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(data)
    })?;
    let text = to_canonical_json(&data);
    // Write next to the target and rename, so an interrupted refresh leaves the old file.
    let temp = args.output.with_extension("json.tmp");
    fs_err::write(&temp, &text)?;
    fs_err::rename(&temp, &args.output)?;
    if printer.json {
        printer.json(&Written {
            output: &args.output,
            releases: data.releases.len(),
        });
    } else {
        printer.line(format_args!(
            "wrote {} torch releases to {}",
            data.releases.len(),
            args.output.display()
        ));
    }
    Ok(ExitCode::SUCCESS)
}
