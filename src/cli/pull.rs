//! `cudastack pull REF --layout DIR`: pull an image (by tag or digest) into the blob cache
//! and write it as an OCI layout, every digest verified, no daemon.
//! stdout: the manifest digest and `oci:DIR:REF` (or `--json`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::cache::BlobStore;
use cudastack::registry::{pull, Platform, Reference, RegistryClient};

use super::args::{CacheArgs, RegistryArgs};
use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct PullArgs {
    /// What to pull: [registry/]repository[:tag][@sha256:...].
    reference: String,
    /// The OCI layout directory to write (created if needed).
    #[arg(long)]
    layout: PathBuf,
    /// The name of the image in the layout (default: the tag, else `latest`).
    // `--ref` as in push, load, inspect, check and verify; `--ref-name`, its old name, is
    // a hidden alias so existing scripts keep working.
    #[arg(long = "ref", value_name = "REF", alias = "ref-name")]
    ref_name: Option<String>,
    // No static clap default: the default is this machine's platform, found at run time,
    // and the help says which it is here.
    #[arg(
        long,
        help = super::image_source::platform_help("The platform to pick from a multi-platform index")
    )]
    platform: Option<Platform>,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub fn run(args: PullArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let reference: Reference = args.reference.parse()?;
    let ref_name = args
        .ref_name
        .clone()
        .unwrap_or_else(|| reference.tag().unwrap_or("latest").to_string());
    let platform = args.platform.clone().unwrap_or_default();
    let store = BlobStore::open(args.cache.root())?;
    let client = RegistryClient::new(
        &reference,
        args.registry.resolve()?.client_options(&reference)?,
    )?;
    printer.status(format!("pulling {reference} ({platform})"));
    let report = runtime.block_on(pull(
        &client,
        &reference,
        &platform,
        &store,
        &args.layout,
        &ref_name,
    ))?;
    // What was said about the image comes with it: SBOM, provenance, signed statements.
    // Within the per-image budget, each blob streamed into the layout.
    let referrers = runtime.block_on(cudastack::pipeline::attest::pull_referrers(
        &client,
        &reference,
        &args.layout,
        &report.manifest_digest,
        &store,
    ))?;
    if !referrers.stored.is_empty() {
        printer.status(format!(
            "pulled {} referrer(s) of {}: {}",
            referrers.stored.len(),
            report.manifest_digest,
            referrers.stored.join(", ")
        ));
    }
    if let Some(line) = &referrers.over_budget {
        printer.status(format!("warning: {line}"));
    }
    if referrers.skipped > 0 || referrers.other_types > 0 {
        printer.status(format!(
            "not copied: {} referrer(s) over the budget or unreadable, {} of types cudastack does not read",
            referrers.skipped, referrers.other_types
        ));
    }
    if printer.json {
        printer.json(&report);
    } else {
        printer.status(format!(
            "pulled {} blobs in {:.1}s ({} from the cache), {:.1} MB downloaded",
            report.blobs.len(),
            report.seconds,
            report.blobs.iter().filter(|b| b.cached).count(),
            report.bytes_downloaded as f64 / 1e6
        ));
        printer.line(report.manifest_digest);
        printer.line(format_args!(
            "oci:{}:{}",
            report.layout.display(),
            report.ref_name
        ));
    }
    Ok(ExitCode::SUCCESS)
}
