//! `cudastack sign IMAGE --key KEY`: sign the statements stored beside an image of an OCI
//! layout (SBOM, provenance, verification), and the `--sign-key` option `build` and
//! `verify` share. Keys are cosign's (`cudastack key generate` or `cosign
//! generate-key-pair`); the password comes from COSIGN_PASSWORD, as for cosign.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Args;
use cudastack::sign::key::{password_from_env, KeySource, SigningKey};
use cudastack::verify::source::ImageLocation;

use super::{CommandResult, Printer};

/// `--sign-key KEY`, shared by `build` and `verify`.
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
    pub fn load(&self) -> Result<Option<SigningKey>, Box<dyn std::error::Error + Send + Sync>> {
        self.sign_key.as_deref().map(read_key).transpose()
    }
}

/// The key at `key`: an unencrypted one needs no COSIGN_PASSWORD; an encrypted one is
/// opened with it (and its absence is the error then).
fn read_key(key: &std::ffi::OsStr) -> Result<SigningKey, Box<dyn std::error::Error + Send + Sync>> {
    let source = KeySource::parse(key);
    match SigningKey::load(&source, b"") {
        Ok(key) => Ok(key),
        Err(_) => {
            let password = password_from_env()?;
            Ok(SigningKey::load(&source, &password)?)
        }
    }
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The image: an OCI layout (`images/NAME` or `oci:DIR[:REF]`). To sign an image of a
    /// registry, pull it into a layout, sign, and push it back (the referrers go with it).
    pub image: String,
    /// The ref name inside the layout.
    #[arg(long = "ref", value_name = "REF", default_value = "latest")]
    pub ref_name: String,
    /// The cosign private key: a file, or `env://NAME` (password from COSIGN_PASSWORD).
    #[arg(long, value_name = "KEY", env = "CUDASTACK_SIGN_KEY")]
    pub key: OsString,
}

pub fn run(args: SignArgs, printer: &Printer) -> CommandResult {
    let key = read_key(&args.key)?;
    let (dir, ref_name) = match ImageLocation::parse(&args.image, Some(&args.ref_name))? {
        ImageLocation::Layout { dir, ref_name } => (dir, ref_name),
        ImageLocation::Registry(reference) => {
            return Err(format!(
                "`{reference}` is a registry reference: `cudastack pull {reference} --layout DIR`, sign DIR, then `cudastack push DIR {reference}`"
            )
            .into())
        }
    };
    let signed = cudastack::pipeline::attest::sign(&dir, &ref_name, &ref_name, &key, printer)?;
    if printer.json {
        printer.json(&signed);
    } else if signed.is_empty() {
        printer.text(format!(
            "nothing to sign: cudastack made no unsigned statement about oci:{}:{ref_name} (those it made are signed already, by this key or another: `cudastack inspect --key KEY.pub` says which; what `pull` fetched is never signed here, and one key signs each statement: co-signing is not supported)",
            dir.display()
        ));
    } else {
        for s in &signed {
            printer.text(format!("{}  {}  {}", s.kind, s.predicate_type, s.digest));
        }
    }
    Ok(ExitCode::SUCCESS)
}
