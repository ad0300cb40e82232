//! `cudastack build RECIPE`: assemble the image and write it as an OCI layout.
//! stdout: the manifest digest, then the layout reference and the tags (or `--json`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use cudastack::base_root::rootless::BuildMode;
use cudastack::fetch::progress::{IndicatifReporter, NoReporter, Reporter};
use cudastack::layer::{Compression, DEFAULT_GZIP_LEVEL};
use cudastack::pipeline::shared_wheels::SharedWheels;
use cudastack::pipeline::{
    build_verify_publish, PipelineReport, PipelineSettings, PushSettings, PushTarget,
};
use cudastack::registry::Reference;
use cudastack::sign::key::{KeySource, PublicKey};
use cudastack::stack::{human_bytes, BuildProgress, BuildSettings};

use super::args::{CacheArgs, RegistryArgs};
use super::{Async, CommandResult, Printer};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompressionArg {
    /// gzip, except none when the only output is the local daemon (`--load` without
    /// `--push`), which stores layers uncompressed anyway.
    Auto,
    /// gzip: read by every runtime, Docker 20.10, enroot, Apptainer.
    Gzip,
    /// zstd: faster and smaller; needs Docker >= 23 / containerd >= 1.5 to pull.
    Zstd,
    /// No compression (local use only).
    None,
}

/// `--build-mode`: how mmdebstrap builds the Debian base (docs/rootless.md).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum BuildModeArg {
    /// root as uid 0, else unshare when user namespaces work, else fakechroot.
    Auto,
    /// mmdebstrap as root (the build runs as root).
    Root,
    /// A user namespace with the user's /etc/subuid and /etc/subgid ranges (newuidmap).
    Unshare,
    /// fakeroot + fakechroot, no namespaces: works in an unprivileged container.
    Fakechroot,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe (its lock, RECIPE.lock, must exist: see `cudastack lock`).
    recipe: PathBuf,
    /// OCI layout directory to write (default: images/NAME).
    #[arg(long)]
    layout: Option<PathBuf>,
    /// How layers are compressed. `auto`: gzip, except none for `--load` without `--push`
    /// (Docker stores layers uncompressed, so compressing for it is wasted time; the layout
    /// is still written, with uncompressed layers).
    #[arg(long, value_enum, default_value_t = CompressionArg::Auto)]
    compression: CompressionArg,
    /// Compression level (gzip 1-9, default 1: the fastest, 1.5-7% larger than 6, see
    /// docs/compression.md; zstd 1-19, default 3). With `auto`, a level asks for gzip.
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
    /// Also tag the image `name[:tag]` (repeatable; the recipe's placeholders work, e.g.
    /// `{registry}/team/train:{torch}`). Without a tag here or in the recipe, the image is
    /// `{registry}/NAME:latest`.
    #[arg(long = "tag", short = 't', value_name = "TAG")]
    tags: Vec<String>,
    #[command(flatten)]
    cache: CacheArgs,
    /// After writing the layout, push the image to this registry reference.
    #[arg(long, value_name = "REF")]
    push: Option<String>,
    #[command(flatten)]
    registry_args: RegistryArgs,
    /// A registry repository where the wheels of source builds (the recipe's `build:`)
    /// are shared: a wheel the local cache lacks is fetched from it when a build with the
    /// same inputs put it there, and a wheel built here is pushed to it
    /// (docs/source-builds.md). Name one only your builders can push to.
    #[arg(
        long,
        value_name = "REGISTRY/REPOSITORY",
        env = "CUDASTACK_WHEEL_CACHE"
    )]
    wheel_cache: Option<String>,
    /// Take a wheel from `--wheel-cache` only when this public key (cosign.pub, or
    /// env://VAR) signed it (repeatable: any of them). A build with `--sign-key` signs the
    /// wheels it shares.
    #[arg(long, value_name = "KEY", requires = "wheel_cache")]
    wheel_cache_key: Vec<std::ffi::OsString>,
    /// Also load the image into the Docker daemon (DOCKER_HOST or the default socket),
    /// tagged with the image's tags (the recipe's, --tag's, --push's name).
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
    /// How mmdebstrap builds the Debian base: as root, or without root in a user
    /// namespace (unshare) or under fakechroot (docs/rootless.md). `cudastack doctor`
    /// lists the modes this host allows.
    #[arg(long, value_enum, default_value_t = BuildModeArg::Auto, env = "CUDASTACK_BUILD_MODE")]
    build_mode: BuildModeArg,
    /// A mirror of the base's archive, tried first for every locked .deb (the same pool
    /// path under this root); then the URL it was locked from, then the snapshot archive.
    #[arg(long, value_name = "URL", env = "CUDASTACK_APT_MIRROR")]
    apt_mirror: Option<reqwest::Url>,
    /// The keyring that signs `--apt-mirror`'s index (default: the distribution's archive
    /// keyring). Every locked .deb is checked against the archive's signed index before it
    /// is installed.
    #[arg(long, value_name = "FILE", env = "CUDASTACK_APT_KEYRING")]
    apt_keyring: Option<PathBuf>,
    /// A snapshot service in place of snapshot.debian.org / snapshot.ubuntu.com (the same
    /// layout), or the snapshot root of `--apt-mirror`: where .debs the archive no longer
    /// lists are checked, as of the lock's `as_of`.
    #[arg(long, value_name = "URL", env = "CUDASTACK_APT_SNAPSHOT")]
    apt_snapshot: Option<reqwest::Url>,
    /// Kill a source build (the recipe's `build:` list) that runs longer than this many
    /// seconds, with every process it started (docs/source-builds.md). Default: 14400
    /// (4 hours).
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CUDASTACK_SOURCE_BUILD_TIMEOUT",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    source_build_timeout: Option<u64>,
    #[command(flatten)]
    sign: super::args::SignKeyArg,
}

/// The build's stages on stderr, timed from the start, and download bars.
struct StderrProgress<'a> {
    printer: &'a Printer,
    started: Instant,
}

impl BuildProgress for StderrProgress<'_> {
    fn stage(&self, stage: &str, detail: &str) {
        self.printer.status(format!(
            "[{:>6.1}s] {stage:<7} {detail}",
            self.started.elapsed().as_secs_f64()
        ));
    }
    fn downloads(&self) -> Arc<dyn Reporter> {
        if self.printer.quiet {
            Arc::new(NoReporter)
        } else {
            Arc::new(IndicatifReporter::default())
        }
    }
}

pub fn run(args: BuildArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let settings = settings(args)?;
    let loaded = super::matrix::load_from(&settings.build.cache_root, printer)?;
    let progress = StderrProgress {
        printer,
        started: Instant::now(),
    };
    let report = runtime.block_on(build_verify_publish(
        &settings,
        loaded.matrix(),
        &progress,
        printer,
    ))?;
    if printer.json {
        printer.json_sorted(&report);
    } else {
        print_human(
            &report,
            settings.build.compression,
            progress.started,
            printer,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The pipeline's settings from the arguments. The push target is parsed here, before the
/// (long) build, so a typo fails at once; credentials too (stdin, credential helpers), so
/// the push cannot fail on them later.
fn settings(args: BuildArgs) -> Result<PipelineSettings, Box<dyn std::error::Error + Send + Sync>> {
    let compression = compression(
        args.compression,
        args.level,
        args.load && args.push.is_none(),
    );
    let cache_root = args.cache.root();
    let mut tags = args.tags;
    let sign_key = args.sign.load()?;
    // Resolved once (stdin is read once), and only when a registry is named.
    let registry_args = if args.push.is_some() || args.wheel_cache.is_some() {
        Some(args.registry_args.resolve()?)
    } else {
        None
    };
    let registry_args = registry_args.as_ref();
    let wheel_cache = match args.wheel_cache.as_deref() {
        Some(text) => {
            let reference: Reference = text.parse()?;
            let client = registry_args
                .expect("resolved when a registry is named")
                .client_options(&reference)?;
            let trusted = args
                .wheel_cache_key
                .iter()
                .map(|key| PublicKey::load(&KeySource::parse(key)))
                .collect::<Result<Vec<_>, _>>()?;
            let shared = SharedWheels::new(&reference, client)?.trusting(trusted);
            Some(match &sign_key {
                Some(key) => shared.signed_with(key.clone()),
                None => shared,
            })
        }
        None => None,
    };
    let push = match args.push.as_deref() {
        Some(text) => {
            let reference: Reference = text.parse()?;
            // The name the image is pushed as is its local name too (`docker build -t` and
            // `docker push` of the same tag).
            if reference.digest().is_none() {
                let tagged = match reference.tag() {
                    Some(_) => reference.clone(),
                    None => reference.with_tag("latest")?,
                };
                tags.push(tagged.to_string());
            }
            let client = registry_args
                .expect("resolved when a registry is named")
                .client_options(&reference)?;
            Some(PushTarget {
                reference,
                client,
                settings: PushSettings::defaults(cache_root.clone()),
            })
        }
        None => None,
    };
    // `--platform linux/arm64,linux/arm64` builds arm64 once.
    let mut platforms = Vec::new();
    for platform in args.platforms {
        if !platforms.contains(&platform) {
            platforms.push(platform);
        }
    }
    let build = BuildSettings {
        recipe_path: args.recipe,
        cache_root,
        layout_dir: args.layout,
        compression,
        offline: args.offline,
        mirrors: args.mirror,
        registry: args.registry,
        tags,
        platforms: (!platforms.is_empty()).then_some(platforms),
        build_mode: match args.build_mode {
            BuildModeArg::Auto => None,
            BuildModeArg::Root => Some(BuildMode::Root),
            BuildModeArg::Unshare => Some(BuildMode::Unshare),
            BuildModeArg::Fakechroot => Some(BuildMode::Fakechroot),
        },
        apt_mirror: args.apt_mirror,
        apt_keyring: args.apt_keyring,
        apt_snapshot: args.apt_snapshot,
        source_build_timeout: args
            .source_build_timeout
            .map(std::time::Duration::from_secs),
    };
    Ok(PipelineSettings {
        build,
        verify: !args.no_verify,
        load: args.load,
        push,
        sign_key,
        wheel_cache,
    })
}

/// The layers' compression: as asked, or for `auto` none when the only consumer is the
/// local daemon (Docker keeps layers uncompressed: compressing for it alone is wasted
/// time), else gzip. A `--level` asks for compression.
fn compression(asked: CompressionArg, level: Option<i32>, daemon_only: bool) -> Compression {
    match (asked, level) {
        (CompressionArg::Auto, None) if daemon_only => Compression::None,
        (CompressionArg::Auto | CompressionArg::Gzip, level) => Compression::Gzip {
            level: level.map_or(DEFAULT_GZIP_LEVEL, |l| l.clamp(1, 9) as u32),
        },
        (CompressionArg::Zstd, level) => Compression::Zstd {
            level: level.unwrap_or(3).clamp(1, 19),
        },
        (CompressionArg::None, _) => Compression::None,
    }
}

/// The human output: a summary on stderr; on stdout the manifest digest, the layout
/// reference, the tags, then what was loaded and pushed.
fn print_human(
    report: &PipelineReport,
    compression: Compression,
    started: Instant,
    printer: &Printer,
) {
    let built = &report.build;
    printer.status(format!(
        "built {} in {:.1}s: {} layers, {} {}; audit: {} ELF files, {} NEEDED entries checked{}",
        built.recipe,
        started.elapsed().as_secs_f64(),
        built.layers.len(),
        human_bytes(built.size),
        match compression {
            Compression::None => "uncompressed (Docker stores layers uncompressed, so `--load` alone does not compress; `--compression gzip` makes a layout to push)",
            _ => "compressed",
        },
        built.audit.elf_files,
        built.audit.needed_checked,
        if built.audit_cached { " (cached)" } else { "" }
    ));
    if built.platforms.len() > 1 {
        for platform in &built.platforms {
            printer.status(format!(
                "  {}: {} ({}), oci:{}:{}",
                platform.platform,
                platform.manifest_digest,
                human_bytes(platform.size),
                built.layout.display(),
                platform.ref_name
            ));
        }
    }
    printer.line(built.manifest_digest);
    printer.line(format_args!(
        "oci:{}:{}",
        built.layout.display(),
        built.ref_name
    ));
    for tag in &built.tags {
        printer.line(tag);
    }
    if let Some(load) = &report.load {
        printer.line(format_args!("docker:{}", load.image_id));
    }
    if let Some(push) = &report.push {
        printer.line(format_args!("{}@{}", push.reference, push.manifest_digest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_compresses_nothing_only_when_the_daemon_is_the_only_consumer() {
        let auto = |level, daemon_only| compression(CompressionArg::Auto, level, daemon_only);
        assert_eq!(auto(None, true), Compression::None);
        assert_eq!(
            auto(None, false),
            Compression::Gzip {
                level: DEFAULT_GZIP_LEVEL
            }
        );
        // A level asks for compression.
        assert_eq!(auto(Some(9), true), Compression::Gzip { level: 9 });
        // What the user names is what they get, `--load` or not.
        assert_eq!(
            compression(CompressionArg::Gzip, None, true),
            Compression::Gzip {
                level: DEFAULT_GZIP_LEVEL
            }
        );
        assert_eq!(
            compression(CompressionArg::Zstd, Some(30), true),
            Compression::Zstd { level: 19 }
        );
        assert_eq!(
            compression(CompressionArg::None, None, false),
            Compression::None
        );
    }
}
