//! `cudastack push images/NAME REF`: push an image of an OCI layout to a registry, with no
//! daemon. stdout: `REF@DIGEST` (or `--json`: the push report).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::pipeline::push::{push, PushSettings};
use cudastack::registry::Reference;

use super::args::{CacheArgs, RefArg, RegistryArgs};
use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The OCI layout directory (e.g. images/NAME).
    layout: PathBuf,
    /// Where to push: [registry/]repository[:tag].
    reference: String,
    #[command(flatten)]
    layout_ref: RefArg,
    #[command(flatten)]
    push: PushFlags,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Upload tuning of `push` (`build --push` uses the defaults).
#[derive(Debug, Args)]
pub struct PushFlags {
    /// Blobs uploaded at the same time.
    #[arg(long, default_value_t = 3)]
    parallel: usize,
    /// Blobs larger than this (MiB) are sent in chunks of this size, so an interrupted
    /// upload resumes; smaller ones in a single request.
    #[arg(long, default_value_t = 64)]
    chunk_mib: u64,
    /// Repositories of the same registry to mount shared layers from (besides the ones
    /// cudastack pushed to before).
    #[arg(long = "mount-from", value_name = "REPOSITORY")]
    mount_from: Vec<String>,
}

impl PushFlags {
    /// The pipeline's upload settings; the cache holds the push history used for
    /// cross-repository mounts.
    fn settings(&self, cache: &CacheArgs) -> PushSettings {
        PushSettings {
            parallel: self.parallel,
            chunk_mib: self.chunk_mib,
            mount_from: self.mount_from.clone(),
            cache_root: cache.root(),
        }
    }
}

pub fn run(args: PushArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let reference: Reference = args.reference.parse()?;
    let client = args.registry.resolve()?.client_options(&reference)?;
    let report = runtime.block_on(push(
        &args.layout,
        &args.layout_ref.ref_name,
        &reference,
        &args.push.settings(&args.cache),
        client,
        printer,
    ))?;
    if printer.json {
        printer.json(&report);
    } else {
        printer.line(reference.pinned(report.manifest_digest));
    }
    Ok(ExitCode::SUCCESS)
}
