//! `cudastack build RECIPE`: assemble the image and write it as an OCI layout.
//! stdout: the manifest digest, then the layout reference and the tags (or `--json`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use cudastack::cas::default_cache_root;
use cudastack::fetch::progress::{IndicatifReporter, NoReporter, Reporter};
use cudastack::layer::Compression;
use cudastack::matrix::Matrix;
use cudastack::stack::build::{build, human_bytes, BuildProgress, BuildSettings};

use super::{CommandResult, Printer};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompressionArg {
    /// gzip: read by every runtime, Docker 20.10, enroot, Apptainer (default).
    Gzip,
    /// zstd: faster and smaller; needs Docker >= 23 / containerd >= 1.5 to pull.
    Zstd,
    /// No compression (local use only).
    None,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe (its lock, RECIPE.lock, must exist: see `cudastack lock`).
    recipe: PathBuf,
    /// OCI layout directory to write (default: images/NAME).
    #[arg(long)]
    layout: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = CompressionArg::Gzip)]
    compression: CompressionArg,
    /// Compression level (gzip 1-9, default 6; zstd 1-19, default 3).
    #[arg(long)]
    level: Option<i32>,
    /// Use only the local cache; fail listing what is missing.
    #[arg(long)]
    offline: bool,
    /// A local directory of wheels the lock's `file://` URLs may read (repeatable).
    #[arg(long, value_name = "DIR")]
    mirror: Vec<PathBuf>,
    /// Registry host substituted for {registry} in the recipe's tags.
    #[arg(long, default_value = "localhost")]
    registry: String,
    /// Cache directory (blobs, layers, staging).
    #[arg(long, env = "CUDASTACK_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// After writing the layout, push the image to this registry reference.
    #[arg(long, value_name = "REF")]
    push: Option<String>,
    #[command(flatten)]
    registry_args: super::push::RegistryArgs,
    /// Also load the image into the Docker daemon (DOCKER_HOST or the default socket),
    /// tagged with the recipe's tags.
    #[arg(long)]
    load: bool,
    /// Skip the verification stage whatever the recipe's `verify.gpu` says.
    #[arg(long)]
    no_verify: bool,
    /// Build only these of the recipe's platforms (`linux/amd64`, `linux/arm64`; repeat or
    /// separate with commas). Default: every platform the recipe names; several give an
    /// OCI image index.
    #[arg(long = "platform", value_delimiter = ',', value_name = "PLATFORM")]
    platforms: Vec<cudastack::recipe::Platform>,
}

struct StderrProgress {
    quiet: bool,
    started: Instant,
}

impl BuildProgress for StderrProgress {
    fn stage(&self, stage: &str, detail: &str) {
        if !self.quiet {
            eprintln!(
                "[{:>6.1}s] {stage:<7} {detail}",
                self.started.elapsed().as_secs_f64()
            );
        }
    }
    fn downloads(&self) -> Arc<dyn Reporter> {
        if self.quiet {
            Arc::new(NoReporter)
        } else {
            Arc::new(IndicatifReporter::default())
        }
    }
}

pub fn run(args: BuildArgs, printer: &Printer) -> CommandResult {
    let compression = match (args.compression, args.level) {
        (CompressionArg::Gzip, level) => Compression::Gzip {
            level: level.unwrap_or(6).clamp(1, 9) as u32,
        },
        (CompressionArg::Zstd, level) => Compression::Zstd {
            level: level.unwrap_or(3).clamp(1, 19),
        },
        (CompressionArg::None, _) => Compression::None,
    };
    // Parse the push target before the (long) build, so a typo fails at once.
    // Credentials too (stdin, credential helpers), so the push cannot fail on them later.
    let push_target = match args.push.as_deref() {
        Some(text) => {
            let reference: cudastack::registry::Reference = text.parse()?;
            let options = args.registry_args.client_options(&reference)?;
            Some((reference, options))
        }
        None => None,
    };
    let cache_root = args.cache_dir.clone().unwrap_or_else(default_cache_root);
    let settings = BuildSettings {
        recipe_path: args.recipe,
        cache_root: cache_root.clone(),
        layout_dir: args.layout,
        compression,
        offline: args.offline,
        mirrors: args.mirror,
        registry: args.registry,
        // `--platform linux/arm64,linux/arm64` builds arm64 once.
        platforms: (!args.platforms.is_empty()).then(|| {
            let mut unique = Vec::new();
            for platform in &args.platforms {
                if !unique.contains(platform) {
                    unique.push(*platform);
                }
            }
            unique
        }),
    };
    let progress = StderrProgress {
        quiet: printer.quiet,
        started: Instant::now(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let policy = cudastack::recipe::Recipe::load(&settings.recipe_path)?
        .verify
        .gpu;
    let report = runtime.block_on(build(&settings, Matrix::embedded(), &progress))?;
    // Verify before loading or pushing, so a verified image is what gets published.
    // Both run the image of this host's platform; an image index is pushed whole.
    let verified = match (&report.host_ref, args.no_verify) {
        (_, true) => None,
        (Some(host_ref), false) => super::verify::after_build(
            &report.layout,
            host_ref,
            policy,
            &cache_root,
            printer,
            &runtime,
        )?,
        (None, false) => {
            printer.status(format!(
                "verify  skipped: this build has no image for this host ({}); verify it on a {} machine",
                cudastack::platform::host_cpu(),
                report.platforms.iter().map(|p| p.platform.as_str()).collect::<Vec<_>>().join(" or ")
            ));
            None
        }
    };
    let loaded = match (&report.host_ref, args.load) {
        (_, false) => None,
        (Some(host_ref), true) => Some(runtime.block_on(super::load::load(
            &report.layout,
            host_ref,
            &report.tags,
            printer,
        ))?),
        (None, true) => {
            return Err(format!(
                "--load: this build has no image for this host's platform ({}); Docker runs images of its own platform",
                cudastack::platform::host_cpu()
            )
            .into())
        }
    };
    let pushed = match push_target {
        Some((reference, options)) => Some(super::push::push_and_report(
            &report.layout,
            &report.ref_name,
            &reference,
            &super::push::PushFlags::defaults(cache_root),
            options,
            printer,
            &runtime,
        )?),
        None => None,
    };
    if printer.json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(verified) = &verified {
            value["verify"] = serde_json::to_value(verified)?;
        }
        if let Some(load) = &loaded {
            value["load"] = serde_json::to_value(load)?;
        }
        if let Some(push) = &pushed {
            value["push"] = serde_json::to_value(push)?;
        }
        printer.json(&value);
    } else {
        printer.status(format!(
            "built {} in {:.1}s: {} layers, {} compressed; audit: {} ELF files, {} NEEDED entries checked{}",
            report.recipe,
            progress.started.elapsed().as_secs_f64(),
            report.layers.len(),
            human_bytes(report.size),
            report.audit.elf_files,
            report.audit.needed_checked,
            if report.audit_cached { " (cached)" } else { "" }
        ));
        if report.platforms.len() > 1 {
            for platform in &report.platforms {
                printer.status(format!(
                    "  {}: {} ({}), oci:{}:{}",
                    platform.platform,
                    platform.manifest_digest,
                    human_bytes(platform.size),
                    report.layout.display(),
                    platform.ref_name
                ));
            }
        }
        println!("{}", report.manifest_digest);
        println!("oci:{}:{}", report.layout.display(), report.ref_name);
        for tag in &report.tags {
            println!("{tag}");
        }
        if let Some(load) = &loaded {
            println!("docker:{}", load.image_id);
        }
        if let Some(push) = &pushed {
            println!("{}@{}", push.reference, push.manifest_digest);
        }
    }
    Ok(ExitCode::SUCCESS)
}
