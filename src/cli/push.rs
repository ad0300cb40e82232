//! `cudastack push images/NAME REF`: push an image of an OCI layout to a registry, with no
//! daemon. stdout: `REF@DIGEST` (or `--json`: the push report). Also the registry options
//! that `pull` and `build --push` share.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::pipeline::push::{push, PushSettings};
use cudastack::registry::auth::{docker_config_path, from_docker_config};
use cudastack::registry::{ClientOptions, Credentials, Reference, Secret};

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
    // `--ref` in every command that names an image of a layout; `--ref-name`, push's old
    // name, is a hidden alias so existing scripts keep working.
    #[arg(
        long = "ref",
        value_name = "REF",
        default_value = "latest",
        alias = "ref-name"
    )]
    ref_name: String,
    #[command(flatten)]
    push: PushFlags,
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
    /// Cache directory (holds the push history used for cross-repository mounts).
    #[arg(long, env = "CUDASTACK_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
}

impl PushFlags {
    /// The pipeline's upload settings; the cache directory defaults to the user's.
    fn settings(&self) -> PushSettings {
        PushSettings {
            parallel: self.parallel,
            chunk_mib: self.chunk_mib,
            mount_from: self.mount_from.clone(),
            cache_root: cudastack::cas::cache_root(self.cache_dir.clone()),
        }
    }
}

pub fn run(args: PushArgs, printer: &Printer) -> CommandResult {
    let reference: Reference = args.reference.parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let client = args.registry.client_options(&reference)?;
    let report = runtime.block_on(push(
        &args.layout,
        &args.ref_name,
        &reference,
        &args.push.settings(),
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
