//! `cudastack verify IMAGE`: run the probe in a container from the image (GPUs through the
//! NVIDIA runtime when there are any), record the report in the layout, and on a full pass
//! on a GPU label and tag the verified image. Also `--native` (this host's PyTorch, no
//! Docker) and `--from-log` (a report a Kubernetes Job printed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use cudastack::engine::run::GpuRequest;

use cudastack::pipeline::verify::verify;
use cudastack::verify::record::Recorded;
use cudastack::verify::report::{wrap_line, Level, Report, Verdict, RENDER_WIDTH};
use cudastack::verify::runner::{verify_native, GpuChoice, VerifySettings};
use cudastack::verify::source::ImageLocation;
use serde::Serialize;

use super::args::{CacheArgs, RefArg, RegistryArgs, RegistrySettings};
use super::{Async, CommandResult, Printer};
use cudastack::pipeline::image_source::ImageSource;
use cudastack::pipeline::record::{self, report_from_log};

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The image: an OCI layout (`images/NAME` or `oci:DIR[:REF]`); with --emit or
    /// --from-log also a registry reference (`host/repo:tag[@sha256:…]`). Not needed with
    /// --native.
    pub image: Option<String>,
    #[command(flatten)]
    pub layout_ref: RefArg,
    /// GPUs for the container: auto (all when the host and daemon can provide them, else
    /// none: static level only), none, all, a count, or device ids (`0,1` or UUIDs).
    #[arg(long, default_value = "auto")]
    pub gpus: String,
    /// Fail instead of running the static level only when no GPU can be provided.
    #[arg(long)]
    pub require_gpu: bool,
    /// Run the levels up to this one: static, driver, device, ops, train (all).
    #[arg(long, default_value = "train")]
    pub level: Level,
    /// Stop the probe after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Run the probe even when the verification cache holds a report for this image,
    /// probe and host.
    #[arg(long)]
    pub no_cache: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Run the probe with this host's Python instead of a container (a GPU machine without
    /// Docker); proves the host's PyTorch stack, records nothing on an image.
    #[arg(long, conflicts_with = "from_log")]
    pub native: bool,
    /// The Python for --native.
    #[arg(long, default_value = "python3", requires = "native")]
    pub python: String,
    /// Expectations file for --native (default: none, versions are reported, not compared).
    #[arg(long, requires = "native")]
    pub expect: Option<PathBuf>,
    /// Record the report found in this log (e.g. `kubectl logs job/NAME`) instead of running:
    /// in the layout, or, for a registry IMAGE, as a referrer of the image and (verified)
    /// a `TAG-verified` tag, uploading only the new config and the report.
    #[arg(long)]
    pub from_log: Option<PathBuf>,
    /// Instead of running, print a job that runs the probe on a cluster: k8s-job (a
    /// Kubernetes Job for the NVIDIA GPU Operator), sbatch (enroot + pyxis) or
    /// sbatch-apptainer. IMAGE is then a registry reference; a tag is pinned to its digest.
    #[arg(long, value_name = "TARGET", conflicts_with_all = ["native", "from_log"])]
    pub emit: Option<cudastack::cluster::Emit>,
    /// With --emit: the GPU type (k8s: the `nvidia.com/gpu.product` label value; Slurm: the
    /// GRES type).
    #[arg(long, requires = "emit")]
    pub gpu_type: Option<String>,
    /// With --emit k8s-job: the namespace.
    #[arg(long, requires = "emit")]
    pub namespace: Option<String>,
    /// With --emit sbatch*: a squashfs/SIF made on the login node.
    #[arg(long, requires = "emit")]
    pub local_image: Option<PathBuf>,
    /// With --emit k8s-job: a Secret (of the Job's namespace, type
    /// kubernetes.io/dockerconfigjson) to pull a private image with; repeatable.
    #[arg(long, value_name = "NAME", requires = "emit")]
    pub image_pull_secret: Vec<String>,
    #[arg(
        long,
        help = super::image_source::platform_help(
            "With --emit, of a multi-platform image the platform whose image the job pins (`linux/arm64` for GH200 nodes)"
        )
    )]
    pub platform: Option<cudastack::recipe::Platform>,
    /// With --emit (needs --gpu-type): emit the job only if a verification attestation
    /// signed by this public key says the pinned image passed on the compute capability of
    /// the --gpu-type's GPU, as `check --require-signed-by` asks of a node; a type the
    /// matrix does not know is an error, never "any GPU".
    #[arg(long, value_name = "KEY.pub", requires = "emit")]
    pub require_signed_by: Option<std::ffi::OsString>,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub sign: super::args::SignKeyArg,
}

#[derive(Serialize)]
struct Output<'a> {
    verdict: Verdict,
    report: &'a Report,
    #[serde(skip_serializing_if = "Option::is_none")]
    recorded: Option<&'a Recorded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load: Option<&'a cudastack::engine::LoadReport>,
}

pub fn parse_gpus(text: &str) -> Result<Option<GpuRequest>, String> {
    Ok(Some(match text {
        "auto" => return Ok(None),
        "none" | "0" => GpuRequest::None,
        "all" => GpuRequest::All,
        n if n.parse::<u32>().is_ok() => GpuRequest::Count(n.parse().expect("checked")),
        ids if !ids.is_empty() => {
            GpuRequest::DeviceIds(ids.split(',').map(str::to_string).collect())
        }
        _ => return Err("--gpus takes auto, none, all, a count, or device ids".into()),
    }))
}

pub fn run(args: VerifyArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    if args.native {
        let (report, _) = verify_native(
            &args.python,
            args.level,
            args.expect.as_deref(),
            args.require_gpu,
        )?;
        return finish(&report, None, None, printer);
    }
    let Some(image) = &args.image else {
        return Err("give the image to verify (images/NAME), or --native".into());
    };
    if let Some(target) = args.emit {
        return emit(target, image, &args, runtime, printer);
    }
    if let Some(log) = &args.from_log {
        return record_log(log, image, &args, runtime, printer);
    }
    let (dir, ref_name) = layout_of(image, &args.layout_ref.ref_name)?;
    let settings = settings(&args)?;
    let key = args.sign.load()?;
    let outcome = runtime.block_on(verify(&dir, &ref_name, &settings, printer))?;
    cudastack::pipeline::attest::after_run(
        &dir,
        &ref_name,
        &outcome.report,
        &outcome.recorded,
        key.as_ref(),
        printer,
    )?;
    finish(
        &outcome.report,
        Some(&outcome.recorded),
        outcome.load.as_ref(),
        printer,
    )
}

/// The layout and ref of IMAGE: a registry reference cannot be verified in place.
fn layout_of(
    image: &str,
    ref_name: &str,
) -> Result<(PathBuf, String), Box<dyn std::error::Error + Send + Sync>> {
    match ImageLocation::parse(image, Some(ref_name))? {
        ImageLocation::Layout { dir, ref_name } => Ok((dir, ref_name)),
        ImageLocation::Registry(reference) => Err(format!(
            "`{reference}` is a registry reference: pull it into a layout first \
             (`cudastack pull {reference} --layout DIR`), or run the probe as a Kubernetes \
             Job (`--emit k8s-job`) and record its log with --from-log"
        )
        .into()),
        // The probe runs on the image Docker holds only as a layout's copy: what is
        // verified is then the layout's, which can be labelled and signed.
        ImageLocation::Daemon(reference) => Err(format!(
            "`{reference}` is an image of the Docker daemon: verify its OCI layout \
             (`cudastack build` writes one; the verification loads it into Docker itself)"
        )
        .into()),
    }
}

/// `--from-log`: record the report a Kubernetes Job or sbatch script printed, as if it
/// had run here: in the layout, or on the image in its registry (nothing is pulled).
fn record_log(
    log: &std::path::Path,
    image: &str,
    args: &VerifyArgs,
    runtime: &Async,
    printer: &Printer,
) -> CommandResult {
    let text = fs_err::read_to_string(log)?;
    let report = report_from_log(&text, &log.display().to_string())?;
    let key = args.sign.load()?;
    let location = ImageLocation::parse(image, Some(&args.layout_ref.ref_name))?;
    let destination = match &location {
        ImageLocation::Layout { dir, ref_name } => ImageSource::Layout {
            dir: dir.clone(),
            ref_name: ref_name.clone(),
        },
        // Refused before credentials are looked for: nothing is signed on a registry here.
        ImageLocation::Registry(_) if key.is_some() => {
            return Err(cudastack::pipeline::PipelineError::SignRemoteLog.into())
        }
        ImageLocation::Registry(_) | ImageLocation::Daemon(_) => {
            args.registry.resolve()?.source(&location)?
        }
    };
    let recorded = runtime.block_on(record::record_log(
        &report,
        &destination,
        key.as_ref(),
        printer,
    ))?;
    finish(&report, Some(&recorded), None, printer)
}

/// The runner's settings from `--gpus`, `--require-gpu`, `--level`, `--timeout` and the
/// cache options.
fn settings(args: &VerifyArgs) -> Result<VerifySettings, String> {
    let gpus = match (parse_gpus(&args.gpus)?, args.require_gpu) {
        (None, false) => GpuChoice::Auto,
        (None, true) => GpuChoice::Required(GpuRequest::All),
        (Some(request), true) => GpuChoice::Required(request),
        (Some(request), false) => GpuChoice::Exactly(request),
    };
    Ok(VerifySettings {
        gpus,
        level: args.level,
        timeout: Duration::from_secs(args.timeout),
        cache: (!args.no_cache).then(|| args.cache.root()),
        keep_loaded: false,
    })
}

/// Print a cluster job that runs the probe on the image pinned by digest.
fn emit(
    target: cudastack::cluster::Emit,
    image: &str,
    args: &VerifyArgs,
    runtime: &Async,
    printer: &Printer,
) -> CommandResult {
    use cudastack::cluster::{EmitOptions, PinnedImage};
    let registry = args.registry.resolve()?;
    // A digest alone is emitted without contacting the registry; a tag is pinned to the
    // digest the registry serves now, and the image's runtime needs (shm size, ulimits)
    // come from its config.
    let (pinned, needs): (PinnedImage, _) = match image.parse() {
        Ok(pinned) => (pinned, cudastack::recipe::RuntimeSpec::default()),
        Err(_) => {
            let location = ImageLocation::parse(image, None)?;
            let source = registry.source(&location)?;
            let pinned = runtime.block_on(cudastack::cluster::placed::pin(
                image,
                source,
                args.platform,
            ))?;
            printer.status(format!("pinned {image} to {}", pinned.image));
            (pinned.image, pinned.needs)
        }
    };
    if let Some(key) = &args.require_signed_by {
        if let Some(refusal) = signed_for_job(&pinned, key, args, &registry, runtime, printer)? {
            printer.line(format_args!("no: {refusal}"));
            return Ok(ExitCode::from(1));
        }
    }
    let gpus = match parse_gpus(&args.gpus)? {
        Some(GpuRequest::Count(n)) => Some(n),
        Some(GpuRequest::DeviceIds(ids)) => Some(ids.len() as u32),
        _ => None,
    };
    let text = cudastack::cluster::emit(
        target,
        pinned,
        &EmitOptions {
            gpu_type: args.gpu_type.clone(),
            gpus,
            namespace: args.namespace.clone(),
            local_image: args.local_image.clone(),
            image_pull_secrets: args.image_pull_secret.clone(),
            needs,
        },
    )?;
    printer.text(text);
    Ok(ExitCode::SUCCESS)
}

/// `--emit --require-signed-by KEY`: why the job must not be emitted (no verification signed
/// by KEY about the pinned digest on the job's GPU class), or None. The job runs exactly the
/// pinned digest, so checking it here is checking what the nodes will run.
fn signed_for_job(
    pinned: &cudastack::cluster::PinnedImage,
    key: &std::ffi::OsStr,
    args: &VerifyArgs,
    registry: &RegistrySettings,
    runtime: &Async,
    printer: &Printer,
) -> Result<Option<String>, Box<dyn std::error::Error + Send + Sync>> {
    let key = cudastack::sign::key::PublicKey::load(&cudastack::sign::key::KeySource::parse(key))?;
    let location = ImageLocation::Registry(pinned.by_digest());
    let signed = super::image_source::signed_verifications(
        registry.source(&location)?,
        &pinned.digest,
        &key,
        runtime,
        printer,
    )?;
    let loaded = super::matrix::load(printer)?;
    // The GPU class the job runs on decides what must have been verified: never "any GPU".
    let Some(gpu_type) = args.gpu_type.as_deref() else {
        return Err("--require-signed-by needs --gpu-type: the GPU class the job runs on is what the signed verification must cover".into());
    };
    let Some(gpu) = loaded.matrix().gpu(&gpu_type.replace(['-', '_'], " ")) else {
        return Err(format!(
            "--require-signed-by: `{gpu_type}` is not a GPU the matrix knows, so its class cannot be checked\n  hint: `cudastack matrix --table gpus` lists them; give the product name (NVIDIA-H100-80GB-HBM3, h100)"
        )
        .into());
    };
    let class = format!("{}.{}", gpu.cc.major, gpu.cc.minor);
    Ok(match signed.claims.verified_row(Some(&class)) {
        Some(row) => {
            printer.status(format!(
                "signed verification found: {} on {} with driver {}",
                pinned, row.gpu, row.driver
            ));
            None
        }
        None => Some(format!(
            "no verification of {pinned} signed by key {} on compute capability {class}{}",
            &key.key_id()[..12],
            if signed.unread.is_empty() {
                String::new()
            } else {
                // Fails closed: an unread bundle is not a signature.
                format!(
                    " among the bundles read; {} referrer(s) were not read",
                    signed.unread.len()
                )
            }
        )),
    })
}

/// Print the report and what was recorded; exit 1 when a check failed.
pub fn finish(
    report: &Report,
    recorded: Option<&Recorded>,
    load: Option<&cudastack::engine::LoadReport>,
    printer: &Printer,
) -> CommandResult {
    let verdict = report.verdict();
    if printer.json {
        printer.json(&Output {
            verdict: verdict.clone(),
            report,
            recorded,
            load,
        });
    } else {
        printer.text(report.render());
        // Like the table, every line fits RENDER_WIDTH columns, unless one word is wider:
        // wrap_line cuts such a word, and an image reference cut in two (registry, repository
        // and a 71-character digest are wider than a line) cannot be copied. Its line is
        // widened to hold it whole, with the indent of a continued line.
        let wrapped = |line: String| {
            let widest = line.split(' ').map(|word| word.chars().count() + 2).max();
            wrap_line(&line, RENDER_WIDTH.max(widest.unwrap_or(0)))
        };
        if let Some(note) = report.runner.as_ref().and_then(|r| r.note.as_ref()) {
            printer.text(wrapped(format!("note: {note}")));
        }
        // Whether the host vouches for the report, and for what.
        if let Some(witness) = report.runner.as_ref().and_then(|r| r.witness.as_ref()) {
            printer.text(wrapped(format!("witness: {}", witness.summary())));
        }
        if let Some(recorded) = recorded {
            printer.text(wrapped(format!(
                "report stored as {} ({})",
                recorded.report_ref, recorded.report_digest
            )));
            printer.text(wrapped(match &recorded.verified_manifest {
                Some(digest) => format!(
                    "verified image {digest}: {}",
                    recorded.verified_refs.join(", ")
                ),
                None => format!("no verified label or tag: {verdict}"),
            }));
        }
    }
    Ok(match verdict {
        Verdict::Failed { .. } => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}
