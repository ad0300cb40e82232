//! Command-line interface: clap definitions (their doc comments are the help text), one
//! function per command, and the shared printer. stdout carries data only (tables, the
//! final reference, or `--json`); progress and logs go to stderr.
//!
//! The three layers of every command: a clap struct whose doc comments are the help text,
//! its translation into the library's settings, and one library call whose result is
//! printed through the [`Printer`] (typed structs for `--json`). Deciding anything about
//! images belongs to the library (`cudastack::pipeline` and the stages below it).
//!
//! What commands share is declared once: the option groups in `args.rs` (`--ref`, where an
//! image lives, the registry's credentials, `--cache-dir`), each resolved once per command,
//! and one tokio runtime, [`Async`], built here on first use and lent to the commands that
//! wait on I/O.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod build;
mod cache;
mod check;
mod ci;
mod doctor;
mod examples;
mod explain;
mod image_source;
mod init;
mod inspect;
mod key;
mod load;
mod lock;
mod matrix;
mod place;
mod printer;
mod promote;
mod pull;
mod push;
mod refresh;
mod sbom;
mod sign;
mod solve;
mod validate;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use printer::{report_error, Printer};

/// Build reproducible, verified container images for GPU deep learning.
#[derive(Debug, Parser)]
#[command(
    name = "cudastack",
    version,
    about,
    propagate_version = true,
    after_help = examples::TOP
)]
pub struct Cli {
    /// Print machine-readable JSON on stdout instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Only print errors on stderr.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a training project: a commented recipe (the stack `solve` picks for your
    /// nodes, requirements, code, user, entrypoint) that validates, and the files it names.
    #[command(after_help = examples::INIT)]
    Init(init::InitArgs),
    /// Check recipes against the compatibility matrix; exit 1 if any is invalid.
    #[command(after_help = examples::VALIDATE)]
    Validate {
        /// Recipe files (YAML).
        #[arg(required = true)]
        recipes: Vec<PathBuf>,
    },
    /// Build a recipe's image as an OCI layout (images/NAME), deterministically.
    #[command(after_help = examples::BUILD)]
    Build(build::BuildArgs),
    /// Show what the cache directory holds by kind, or prune what no build used lately.
    #[command(after_help = examples::CACHE)]
    Cache(cache::CacheArgs),
    /// Resolve every artifact of a recipe to a URL and sha256 (RECIPE.lock beside it).
    #[command(after_help = examples::LOCK)]
    Lock(lock::LockArgs),
    /// Show the compatibility matrix, or regenerate its torch data from PyPI.
    #[command(after_help = examples::MATRIX)]
    Matrix(matrix::MatrixArgs),
    /// Generate the CI workflows that publish and verify the recipe matrix.
    #[command(after_help = examples::CI)]
    Ci(ci::CiArgs),
    /// Find the torch/CUDA/cuDNN builds that fit a driver and GPUs, ranked, with reasons.
    #[command(after_help = examples::SOLVE)]
    Solve(solve::SolveArgs),
    /// Show an image's declared and verified matrix (reads only manifest and config).
    #[command(after_help = examples::INSPECT)]
    Inspect(inspect::InspectArgs),
    /// Write the SBOM stored beside an image (SPDX 2.3 or CycloneDX 1.6 JSON) to a file or stdout.
    #[command(after_help = examples::SBOM)]
    Sbom(sbom::SbomArgs),
    /// Will this image run on this node? From the image config alone.
    ///
    /// Exit status: 0 yes (every requirement the image declares was compared with the
    /// node and met), 1 no, 2 error, 3 unknown (the image declares nothing, or a node fact
    /// a requirement needs was not given).
    #[command(after_help = examples::CHECK)]
    Check(check::CheckArgs),
    /// Load an OCI layout's image into the Docker daemon and tag it (skipped if present).
    #[command(after_help = examples::LOAD)]
    Load(load::LoadArgs),
    /// Run the verification probe in a container from the image (on GPUs when available),
    /// record the report, and label the image only if every level passed on a GPU.
    #[command(after_help = examples::VERIFY)]
    Verify(verify::VerifyArgs),
    /// Push an image of an OCI layout to a registry (no daemon needed).
    #[command(after_help = examples::PUSH)]
    Push(push::PushArgs),
    /// Where a verified image may run: node affinity, a DRA claim or Slurm lines for its verified GPUs and driver floor.
    #[command(after_help = examples::PLACE)]
    Place(place::PlaceArgs),
    /// The team's training job where a verified image may run: a Kubernetes Job or a Slurm sbatch script.
    #[command(after_help = examples::JOB)]
    Job(place::JobArgs),
    /// A Kubernetes admission policy: GPU pods run only images verified for their GPU product.
    #[command(after_help = examples::ADMISSION)]
    Admission(place::AdmissionArgs),
    /// Give a verified image in a registry its plain tag, once it passed on every GPU
    /// class required; refuses (exit 1) with what is missing or failed.
    #[command(after_help = examples::PROMOTE)]
    Promote(promote::PromoteArgs),
    /// Sign the SBOM, provenance and verification statements stored beside an image of a
    /// layout with a cosign key, as `cosign attest` stores them (DSSE in a sigstore bundle).
    #[command(after_help = examples::SIGN)]
    Sign(sign::SignArgs),
    /// Pull an image from a registry into an OCI layout (no daemon needed).
    #[command(after_help = examples::PULL)]
    Pull(pull::PullArgs),
    /// Diagnose this host from the driver up: driver and GPUs, container runtime, CUDA
    /// libraries on the loader path, the Python in use; stops at the first broken layer.
    #[command(after_help = examples::DOCTOR)]
    Doctor(doctor::DoctorArgs),
    /// Explain an error message (argument, --file LOG, or stdin): cause, checks, fix.
    #[command(after_help = examples::EXPLAIN)]
    Explain(explain::ExplainArgs),
    /// Make and read the ECDSA P-256 keys that sign attestations (cosign's key format).
    #[command(after_help = key::KEY)]
    Key(key::KeyArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = if cli.quiet { "error" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CUDASTACK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: warnings such as registry retries also
        // land in CI logs and files, where escape codes are noise (and NO_COLOR says no).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    let printer = Printer {
        json: cli.json,
        quiet: cli.quiet,
    };
    let runtime = Async::default();
    let result = match cli.command {
        Command::Init(args) => init::run(args, &printer),
        Command::Validate { recipes } => validate::run(&recipes, &printer),
        Command::Build(args) => build::run(args, &runtime, &printer),
        Command::Cache(args) => cache::run(args, &printer),
        Command::Lock(args) => lock::run(args, &runtime, &printer),
        Command::Matrix(args) => matrix::run(args, &runtime, &printer),
        Command::Solve(args) => solve::run(args, &printer),
        Command::Inspect(args) => inspect::run(args, &runtime, &printer),
        Command::Sbom(args) => sbom::run(args, &runtime, &printer),
        Command::Check(args) => check::run(args, &runtime, &printer),
        Command::Load(args) => load::run(args, &runtime, &printer),
        Command::Verify(args) => verify::run(args, &runtime, &printer),
        Command::Push(args) => push::run(args, &runtime, &printer),
        Command::Place(args) => place::place(args, &runtime, &printer),
        Command::Job(args) => place::job(args, &runtime, &printer),
        Command::Admission(args) => place::admission(args, &runtime, &printer),
        Command::Promote(args) => promote::run(args, &runtime, &printer),
        Command::Pull(args) => pull::run(args, &runtime, &printer),
        Command::Sign(args) => sign::run(args, &printer),
        Command::Ci(args) => ci::run(args, &printer),
        Command::Doctor(args) => doctor::run(args, &printer),
        Command::Explain(args) => explain::run(args, &printer),
        Command::Key(args) => key::run(args, &printer),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            report_error(error.as_ref());
            ExitCode::from(2)
        }
    }
}

pub type CommandResult = Result<ExitCode, Box<dyn std::error::Error + Send + Sync>>;

/// The one tokio runtime of a run, built on first use: a command that never waits on the
/// network, Docker or a registry (validate, solve, --help) starts no worker threads.
#[derive(Default)]
pub struct Async {
    runtime: std::sync::OnceLock<tokio::runtime::Runtime>,
}

impl Async {
    /// The runtime, built now if no command step needed it before.
    pub fn runtime(&self) -> std::io::Result<&tokio::runtime::Runtime> {
        if let Some(runtime) = self.runtime.get() {
            return Ok(runtime);
        }
        let built = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        Ok(self.runtime.get_or_init(|| built))
    }

    /// Run `future` to its end; its error, or the runtime's, as the command's.
    pub fn block_on<T, E>(
        &self,
        future: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, Box<dyn std::error::Error + Send + Sync>>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.runtime()?.block_on(future).map_err(Into::into)
    }
}
