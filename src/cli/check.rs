//! `cudastack check IMAGE [--driver V] [--gpu NAME|--cc X.Y] [--detect]`: will this image
//! run on this node? From the image config alone (labels and NVIDIA_REQUIRE_CUDA).
//! Exit status: 0 yes, 1 no, 2 error, 3 unknown.

use std::process::ExitCode;

use clap::Args;
use cudastack::printable::escape;
use cudastack::verify::check::{check, Fit, ImageClaims, Node, NodeGpu};
use cudastack::verify::source::ImageLocation;
use cudastack::version::{ComputeCapability, DriverVersion};
use serde::Serialize;

use super::args::ImageArgs;
use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub image: ImageArgs,
    /// The node's driver version (as nvidia-smi prints it).
    #[arg(long)]
    pub driver: Option<DriverVersion>,
    /// A GPU on the node, by name (`H100`, `RTX 4090`); repeatable.
    #[arg(long = "gpu")]
    pub gpus: Vec<String>,
    /// A GPU on the node, by compute capability (`8.6`, `sm_90`); repeatable.
    #[arg(long = "cc")]
    pub ccs: Vec<ComputeCapability>,
    /// Read the driver and GPUs of this machine.
    #[arg(long)]
    pub detect: bool,
    /// Answer no unless a verification attestation signed by this public key (cosign's
    /// PEM format) says the image passed on a GPU of each of the node's classes (same
    /// compute capability); needs the node's GPUs (--gpu, --cc or --detect).
    #[arg(long, value_name = "KEY.pub")]
    pub require_signed_by: Option<std::ffi::OsString>,
}

#[derive(Serialize)]
struct CheckOutput<'a> {
    image: &'a str,
    /// None for a daemon's image known by no manifest.
    manifest_digest: Option<String>,
    bytes_read: u64,
    node: &'a Node,
    #[serde(flatten)]
    answer: &'a cudastack::verify::check::Answer,
}

pub fn run(args: CheckArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let mut node = Node {
        driver: args.driver.clone(),
        gpus: Vec::new(),
    };
    for name in &args.gpus {
        let gpu = matrix.gpu(name).ok_or_else(|| {
            format!(
                "unknown GPU `{name}`{}\n  hint: give its compute capability with --cc X.Y instead (see `cudastack matrix --table gpus`)",
                cudastack::matrix::solve::did_you_mean(&matrix.gpu_suggestions(name))
            )
        })?;
        node.gpus.push(NodeGpu {
            name: gpu.name.clone(),
            compute_capability: gpu.cc,
        });
    }
    for cc in &args.ccs {
        node.gpus.push(NodeGpu {
            name: format!("GPU {}.{}", cc.major, cc.minor),
            compute_capability: *cc,
        });
    }
    if args.detect {
        super::image_source::detect_node(&mut node, printer)?;
    }
    let image = args.image.resolve()?;
    let documents = super::image_source::read_documents(image.source()?, image.platform, runtime)?;
    let claims = ImageClaims::from_image(&documents.config);
    let mut answer = check(matrix, &claims, &node);
    if let Some(path) = &args.require_signed_by {
        let key =
            cudastack::sign::key::PublicKey::load(&cudastack::sign::key::KeySource::parse(path))?;
        // Signatures are referrers of the manifest, in a layout or a registry; a daemon
        // keeps neither.
        let Some(subject) = documents
            .manifest_digest
            .as_ref()
            .filter(|_| !matches!(image.location, ImageLocation::Daemon(_)))
        else {
            return Err(format!(
                "--require-signed-by: {} is an image of the Docker daemon, which keeps no signature beside an image\n  hint: check the image where it was pushed (`docker image inspect --format '{{{{index .RepoDigests 0}}}}' NAME` names it) or its OCI layout",
                documents.location
            )
            .into());
        };
        let signed = super::image_source::signed_verifications(
            image.source()?,
            subject,
            &key,
            runtime,
            printer,
        )?;
        answer = cudastack::pipeline::signed::require_signed(answer, &node, &signed, &key);
    }
    if printer.json {
        printer.json(&CheckOutput {
            image: &documents.location,
            manifest_digest: documents.manifest_digest.as_ref().map(ToString::to_string),
            bytes_read: documents.bytes_read,
            node: &node,
            answer: &answer,
        });
    } else {
        // A finding quotes the image's labels (the verified GPUs, the kernel table): each
        // part stays on its line, so a label cannot print a fake `ok` or `yes`.
        for finding in &answer.findings {
            printer.line(format_args!(
                "{} {} {}",
                if finding.ok { "ok " } else { "NO " },
                escape(&finding.subject),
                escape(&finding.what)
            ));
            if let Some(hint) = &finding.hint {
                printer.line(format_args!("    hint: {}", escape(hint)));
            }
        }
        let location = escape(&documents.location);
        printer.line(format_args!(
            "{}",
            match answer.fits {
                Fit::Yes => format!("yes: {location} runs on this node"),
                Fit::No => format!("no: {location} will not run on this node"),
                Fit::Unknown => format!(
                    "unknown: {}",
                    escape(
                        answer
                            .unknown_because
                            .as_deref()
                            .unwrap_or("not every requirement was compared")
                    )
                ),
            }
        ));
    }
    Ok(exit_code(answer.fits))
}

/// The exit status of `check` (documented in its `--help` and in README): 0 yes, 1 no,
/// 3 unknown; 2 is an error, from `cli::main`. Unknown is not yes, so scripts that test
/// `$?` never read "cannot tell" as "runs".
pub const EXIT_YES: u8 = 0;
pub const EXIT_NO: u8 = 1;
pub const EXIT_UNKNOWN: u8 = 3;

fn exit_code(fits: Fit) -> ExitCode {
    ExitCode::from(match fits {
        Fit::Yes => EXIT_YES,
        Fit::No => EXIT_NO,
        Fit::Unknown => EXIT_UNKNOWN,
    })
}
