//! The option groups several commands share, each flattened into its commands with
//! `#[command(flatten)]` so that a flag is spelled, documented and defaulted once: which
//! image of a layout (`--ref`), where an image lives (inspect, check), how to reach a
//! registry, the key that signs (`--sign-key`), and the cache directory. Each group
//! resolves into settings once per command: `--password-stdin` reads stdin once, however
//! many requests follow.

use std::ffi::{OsStr, OsString};
use std::io::BufRead;
use std::path::PathBuf;

use clap::Args;
use cudastack::pipeline::image_source::ImageSource;
use cudastack::registry::auth::{docker_config_path, from_docker_config};
use cudastack::registry::{ClientOptions, Credentials, Reference, Secret};
use cudastack::sign::key::{password_from_env, KeySource, SigningKey};
use cudastack::verify::source::ImageLocation;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// `--ref`: which image of an OCI layout.
#[derive(Debug, Args)]
pub struct RefArg {
    /// Which image of an OCI layout: its ref name (`org.opencontainers.image.ref.name`).
    // `--ref-name`, push's old name, is a hidden alias so existing scripts keep working.
    #[arg(
        long = "ref",
        value_name = "REF",
        default_value = "latest",
        alias = "ref-name"
    )]
    pub ref_name: String,
}

/// Where an image lives, for the commands that only read its documents.
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// `images/NAME`, `oci:DIR[:REF]`, a registry reference `host/repo:tag`, or an image
    /// of the local Docker daemon `docker-daemon:NAME[:TAG]`.
    pub image: String,
    #[command(flatten)]
    pub layout_ref: RefArg,
    #[arg(
        long,
        help = super::image_source::platform_help(
            "Of a multi-platform image, the platform's image to read (`linux/amd64`, `linux/arm64`)"
        )
    )]
    pub platform: Option<cudastack::recipe::Platform>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// [`ImageArgs`] resolved: the parsed location, the platform, and the registry's settings.
pub struct ImageSettings {
    pub location: ImageLocation,
    pub platform: Option<cudastack::recipe::Platform>,
    pub registry: RegistrySettings,
}

impl ImageArgs {
    pub fn resolve(&self) -> Result<ImageSettings, Error> {
        Ok(ImageSettings {
            location: ImageLocation::parse(&self.image, Some(&self.layout_ref.ref_name))?,
            platform: self.platform,
            registry: self.registry.resolve()?,
        })
    }
}

impl ImageSettings {
    /// The library's source for this image.
    pub fn source(&self) -> Result<ImageSource, Error> {
        self.registry.source(&self.location)
    }
}

/// The heading of [`RegistryArgs`] in every command's help. Set on each argument, not
/// as the group's `next_help_heading`, which would also take in the options after it.
const REGISTRY_OPTIONS: &str = "Registry options";

/// How to reach and authenticate to a registry: under their own heading in every
/// command's help, so they read alike wherever they appear.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Registry username (else the Docker config's credentials, else anonymous).
    #[arg(long, env = "CUDASTACK_REGISTRY_USERNAME", help_heading = REGISTRY_OPTIONS)]
    username: Option<String>,
    /// Read the password or token from stdin (else $CUDASTACK_REGISTRY_PASSWORD).
    #[arg(long, help_heading = REGISTRY_OPTIONS)]
    password_stdin: bool,
    /// Allow plain http to this registry (host[:port]); localhost always may.
    #[arg(
        long = "insecure-registry",
        value_name = "HOST",
        help_heading = REGISTRY_OPTIONS
    )]
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

/// [`RegistryArgs`] resolved: the explicit credentials (the password read), or none,
/// when each registry's come from the Docker config.
pub struct RegistrySettings {
    credentials: Option<Credentials>,
    insecure_registries: Vec<String>,
}

impl RegistryArgs {
    /// Read the password (stdin or $CUDASTACK_REGISTRY_PASSWORD) and pair it with the
    /// username. Call once per command: stdin can be read only once.
    pub fn resolve(&self) -> Result<RegistrySettings, Error> {
        let password = if self.password_stdin {
            Some(read_stdin_password()?)
        } else {
            std::env::var("CUDASTACK_REGISTRY_PASSWORD")
                .ok()
                .filter(|p| !p.is_empty())
                .map(Secret::new)
        };
        let credentials = match (&self.username, password) {
            (Some(username), Some(password)) => {
                Some(Credentials::basic(username.clone(), password))
            }
            (Some(_), None) => return Err(CredentialError::NoPassword.into()),
            (None, Some(_)) if self.password_stdin => {
                return Err(CredentialError::NoUsername.into())
            }
            (None, _) => None,
        };
        Ok(RegistrySettings {
            credentials,
            insecure_registries: self.insecure_registries.clone(),
        })
    }
}

/// The first line of stdin, without its line ending.
fn read_stdin_password() -> Result<Secret, CredentialError> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(CredentialError::Stdin)?;
    let line = line.trim_end_matches(['\r', '\n']).to_string();
    if line.is_empty() {
        return Err(CredentialError::EmptyStdin);
    }
    Ok(Secret::new(line))
}

impl RegistrySettings {
    /// Client options for `reference`: the explicit credentials, else the Docker config's
    /// for its registry, else anonymous.
    pub fn client_options(&self, reference: &Reference) -> Result<ClientOptions, Error> {
        let credentials = match &self.credentials {
            Some(credentials) => credentials.clone(),
            None => match docker_config_path() {
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

    /// The library's source for the image at `location`, with this registry's options
    /// when it lives in one.
    pub fn source(&self, location: &ImageLocation) -> Result<ImageSource, Error> {
        Ok(match location {
            ImageLocation::Layout { dir, ref_name } => ImageSource::Layout {
                dir: dir.clone(),
                ref_name: ref_name.clone(),
            },
            ImageLocation::Registry(text) => {
                let reference: Reference = text.parse()?;
                let client = Box::new(self.client_options(&reference)?);
                ImageSource::Registry { reference, client }
            }
            ImageLocation::Daemon(reference) => ImageSource::Daemon {
                reference: reference.clone(),
            },
        })
    }
}

/// `--sign-key KEY`: sign what the command stores (build, verify).
#[derive(Debug, Args)]
pub struct SignKeyArg {
    /// Sign the image's SBOM, provenance and verification statements with this cosign
    /// private key (a file, or `env://NAME` for a variable holding it; password from
    /// COSIGN_PASSWORD), as `cosign attest` stores them.
    #[arg(long, value_name = "KEY", env = "CUDASTACK_SIGN_KEY")]
    pub sign_key: Option<OsString>,
}

impl SignKeyArg {
    /// The key, read (and decrypted) before any work starts, so a wrong password fails at
    /// once rather than after a long build.
    pub fn load(&self) -> Result<Option<SigningKey>, Error> {
        self.sign_key.as_deref().map(read_key).transpose()
    }
}

/// The key at `key`: an unencrypted one needs no COSIGN_PASSWORD; an encrypted one is
/// opened with it (and its absence is the error then).
pub fn read_key(key: &OsStr) -> Result<SigningKey, Error> {
    let source = KeySource::parse(key);
    match SigningKey::load(&source, b"") {
        Ok(key) => Ok(key),
        Err(_) => {
            let password = password_from_env()?;
            Ok(SigningKey::load(&source, &password)?)
        }
    }
}

/// `--cache-dir`: where blobs, layers, verification reports and the push history are kept.
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Cache directory: blobs, layers, verification reports, push history (default:
    /// $XDG_CACHE_HOME/cudastack, else ~/.cache/cudastack).
    #[arg(long, env = "CUDASTACK_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

impl CacheArgs {
    /// The cache directory, absolute.
    pub fn root(&self) -> PathBuf {
        cudastack::cache::cache_root(self.cache_dir.clone())
    }
}
