//! `cudastack sbom IMAGE`: write the SBOM stored beside an image to a file (or stdout).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use cudastack::pipeline::sbom::{stored_sbom, SbomFormat};

use super::args::ImageArgs;
use super::{Async, CommandResult, Printer};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// SPDX 2.3 JSON.
    Spdx,
    /// CycloneDX 1.6 JSON.
    Cyclonedx,
}

#[derive(Debug, Args)]
pub struct SbomArgs {
    #[command(flatten)]
    pub image: ImageArgs,
    /// Which of the stored SBOMs.
    #[arg(long, value_enum, default_value = "spdx")]
    pub format: FormatArg,
    /// Write it to this file (whole or not at all) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(args: SbomArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let image = args.image.resolve()?;
    let format = match args.format {
        FormatArg::Spdx => SbomFormat::Spdx,
        FormatArg::Cyclonedx => SbomFormat::Cyclonedx,
    };
    let sbom = runtime.block_on(stored_sbom(&image.source()?, image.platform, format))?;
    match &args.output {
        Some(path) => {
            cudastack::atomic_file::write(path, &sbom.bytes).map_err(|source| {
                format!("failed to write the SBOM to `{}`: {source}", path.display())
            })?;
            if printer.json {
                printer.json(&serde_json::json!({
                    "subject": sbom.subject,
                    "referrer": sbom.location,
                    "format": format,
                    "output": path,
                    "bytes": sbom.bytes.len(),
                }));
            } else {
                printer.status(format!(
                    "wrote the {} SBOM of {} ({} bytes, stored as {}) to {}",
                    format.name(),
                    sbom.subject,
                    sbom.bytes.len(),
                    cudastack::printable::escape(&sbom.location),
                    path.display()
                ));
            }
        }
        None => {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(&sbom.bytes).and_then(|()| stdout.flush()) {
                // A reader that stopped early (`| head`) is not a failure of ours.
                Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
                written => written
                    .map_err(|source| format!("failed to write the SBOM to stdout: {source}"))?,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
