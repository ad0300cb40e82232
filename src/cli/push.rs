//! `cudastack push images/NAME REF`: push an image of an OCI layout to a registry, with no
//! daemon. stdout: `REF@DIGEST` (or `--json`: the push report). Also the registry options
//! that `pull` and `build --push` share.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::cas::default_cache_root;
use cudastack::registry::auth::{docker_config_path, from_docker_config};
use cudastack::registry::{
    push_layout, ClientOptions, Credentials, PushHistory, PushOptions, PushReport, Reference,
    RegistryClient, Secret,
};

use super::{CommandResult, Printer};

/// How to reach and authenticate to a registry.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Registry username (else the Docker config's credentials, else anonymous).
    #[arg(long, env = "CUDASTACK_REGISTRY_USERNAME")]
    username: Option<String>,
    /// Read the password or token from stdin (else $CUDASTACK_REGISTRY_PASSWORD).
    #[arg(long)]
    password_stdin: bool,
    /// Allow plain http to this registry (host[:port]); localhost always may.
    #[arg(long = "insecure-registry", value_name = "HOST")]
    insecure_registries: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
enum CredentialError {
    #[error("--username is set but no password was given\n  hint: pipe it into --password-stdin, or set CUDASTACK_REGISTRY_PASSWORD")]
    NoPassword,
    #[error("--password-stdin was given but stdin was empty")]
    EmptyStdin,
    #[error("--password-stdin needs --username (or CUDASTACK_REGISTRY_USERNAME)")]
    NoUsername,
    #[error("failed to read the password from stdin")]
    Stdin(#[source] std::io::Error),
}

impl RegistryArgs {
    /// Client options for `reference`: explicit credentials, else the Docker config's.
    pub fn client_options(
        &self,
        reference: &Reference,
    ) -> Result<ClientOptions, Box<dyn std::error::Error + Send + Sync>> {
        let password = if self.password_stdin {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .map_err(CredentialError::Stdin)?;
            let line = line.trim_end_matches(['\r', '\n']).to_string();
            if line.is_empty() {
                return Err(CredentialError::EmptyStdin.into());
            }
            Some(Secret::new(line))
        } else {
            std::env::var("CUDASTACK_REGISTRY_PASSWORD")
                .ok()
                .filter(|p| !p.is_empty())
                .map(Secret::new)
        };
        let credentials = match (&self.username, password) {
            (Some(username), Some(password)) => Credentials::basic(username.clone(), password),
            (Some(_), None) => return Err(CredentialError::NoPassword.into()),
            (None, Some(_)) if self.password_stdin => {
                return Err(CredentialError::NoUsername.into())
            }
            (None, _) => match docker_config_path() {
                Some(path) => from_docker_config(&path, reference.registry())?,
                None => Credentials::Anonymous,
            },
        };
        Ok(ClientOptions {
            credentials,
            insecure_registries: self.insecure_registries.clone(),
            ..ClientOptions::default()
        })
    }
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The OCI layout directory (e.g. images/NAME).
    layout: PathBuf,
    /// Where to push: [registry/]repository[:tag].
    reference: String,
    /// The image of the layout to push (its `org.opencontainers.image.ref.name`).
    #[arg(long, default_value = "latest")]
    ref_name: String,
    #[command(flatten)]
    push: PushFlags,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Upload tuning shared by `push` and `build --push`.
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
    /// Cache directory (holds the push history used for cross-repository mounts).
    #[arg(long, env = "CUDASTACK_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
}

impl PushFlags {
    /// The defaults, for `build --push`.
    pub fn defaults(cache_dir: PathBuf) -> Self {
        PushFlags {
            parallel: 3,
            chunk_mib: 64,
            mount_from: Vec::new(),
            cache_dir: Some(cache_dir),
        }
    }
}

/// Push `ref_name` of `layout` to `reference` and print the result.
pub fn push_and_report(
    layout: &std::path::Path,
    ref_name: &str,
    reference: &Reference,
    flags: &PushFlags,
    client_options: ClientOptions,
    printer: &Printer,
    runtime: &tokio::runtime::Runtime,
) -> Result<PushReport, Box<dyn std::error::Error + Send + Sync>> {
    let client = RegistryClient::new(reference, client_options)?;
    let history_path = flags
        .cache_dir
        .clone()
        .unwrap_or_else(default_cache_root)
        .join("registry")
        .join("push-history.json");
    let mut history = PushHistory::load(&history_path);
    let mut mount_from = flags.mount_from.clone();
    for repository in history.repositories(reference.registry()) {
        if !mount_from.contains(&repository) {
            mount_from.push(repository);
        }
    }
    let options = PushOptions {
        parallel: flags.parallel.max(1),
        chunk_size: flags.chunk_mib.max(1) << 20,
        mount_from,
    };
    printer.status(format!("pushing {} to {reference}", layout.display()));
    let report = runtime.block_on(push_layout(&client, layout, ref_name, reference, &options))?;
    history.record(reference.registry(), reference.repository());
    if let Err(error) = history.save(&history_path) {
        tracing::warn!(%error, "could not save the push history");
    }
    push_report_referrer(
        &client, layout, ref_name, reference, &report, printer, runtime,
    )?;
    let count = |outcome| report.blobs.iter().filter(|b| b.outcome == outcome).count();
    use cudastack::registry::BlobOutcome::*;
    printer.status(format!(
        "pushed {} blobs in {:.1}s: {} uploaded, {} resumed, {} mounted, {} already present; {:.1} MB sent ({:.1} MB/s)",
        report.blobs.len(),
        report.seconds,
        count(Uploaded),
        count(Resumed),
        count(Mounted),
        count(Present),
        report.bytes_uploaded as f64 / 1e6,
        report.bytes_uploaded as f64 / 1e6 / report.seconds.max(1e-3),
    ));
    Ok(report)
}

/// The verification report stored beside the image in the layout goes to the registry as
/// an OCI artifact whose `subject` is the pushed manifest (found through the referrers API,
/// or the `sha256-<hex>` fallback tag on registries without it).
fn push_report_referrer(
    client: &RegistryClient,
    layout: &std::path::Path,
    ref_name: &str,
    reference: &Reference,
    pushed: &PushReport,
    printer: &Printer,
    runtime: &tokio::runtime::Runtime,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use cudastack::oci::layout;
    use cudastack::registry::referrers::{push_referrer, ArtifactLayer, Subject};
    use cudastack::verify::record::{report_ref, stored_report};
    use cudastack::verify::REPORT_ARTIFACT_TYPE;
    // (report, subject): the image's own, or one per platform of an image index, each on
    // the platform's manifest (its report is stored under its platform ref).
    let mut reports = Vec::new();
    match layout::index_images(layout, ref_name)? {
        None => {
            if let Some(report) = stored_report(layout, ref_name)? {
                let manifest = layout::resolve(layout, ref_name)?.manifest;
                reports.push((
                    report,
                    Subject {
                        media_type: manifest.media_type().to_string(),
                        digest: pushed.manifest_digest,
                        size: manifest.size(),
                    },
                ));
            }
        }
        Some(children) => {
            for (child, platform) in children {
                let name =
                    layout::platform_ref_name(ref_name, &platform.architecture().to_string());
                let Some(report) = layout::read_artifact_blob(layout, &report_ref(&name))? else {
                    continue;
                };
                reports.push((
                    report,
                    Subject {
                        media_type: child.media_type().to_string(),
                        digest: cudastack::oci::digest_of(&child)?,
                        size: child.size(),
                    },
                ));
            }
        }
    }
    for (report, subject) in reports {
        let layer = ArtifactLayer {
            media_type: REPORT_ARTIFACT_TYPE.to_string(),
            bytes: report.into(),
            annotations: Default::default(),
        };
        let referrer = runtime.block_on(push_referrer(
            client,
            reference,
            &subject,
            REPORT_ARTIFACT_TYPE,
            vec![layer],
            Default::default(),
        ))?;
        printer.status(format!(
            "pushed the verification report as a referrer of {}: {}",
            subject.digest, referrer.digest
        ));
    }
    Ok(())
}

pub fn run(args: PushArgs, printer: &Printer) -> CommandResult {
    let reference: Reference = args.reference.parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = push_and_report(
        &args.layout,
        &args.ref_name,
        &reference,
        &args.push,
        args.registry.client_options(&reference)?,
        printer,
        &runtime,
    )?;
    if printer.json {
        printer.json(&report);
    } else {
        println!("{}", reference.pinned(report.manifest_digest));
    }
    Ok(ExitCode::SUCCESS)
}
