//! `cudastack key generate`: an ECDSA P-256 key pair in cosign's format (PREFIX.key,
//! encrypted with COSIGN_PASSWORD, and PREFIX.pub); stdout: the key id.
//! `cudastack key public KEY`: the public key of a key file; stdout: its PEM (so that
//! `> cosign.pub` writes a usable file), the key id on stderr (or both with `--json`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{OsStringValueParser, TypedValueParser as _};
use clap::{Args, Subcommand};
use cudastack::sign::key::{COSIGN_PRIVATE_KEY_LABEL, SIGSTORE_PRIVATE_KEY_LABEL};
use cudastack::sign::{
    password_from_env, write_key_pair, KeySource, PublicKey, SignError, SigningKey,
};

use super::{CommandResult, Printer};

pub const KEY: &str = "\
Examples:
  # A key pair for signing: cosign.key (encrypted with $COSIGN_PASSWORD) and
  # cosign.pub
  cudastack key generate
  # The public key and key id of a private key (cosign's or ours)
  cudastack key public cosign.key";

pub const KEY_GENERATE: &str = "\
Examples:
  # release.key and release.pub, the private key encrypted with $COSIGN_PASSWORD
  # (cosign signs with it too: cosign sign-blob --key release.key FILE)
  cudastack key generate --output-prefix release";

pub const KEY_PUBLIC: &str = "\
Examples:
  # Recover the PEM of cosign.pub from cosign.key (opened with $COSIGN_PASSWORD)
  cudastack key public cosign.key
  # The key id that inspect shows for signatures by this key
  cudastack key public cosign.pub --json
  # A key in an environment variable (a CI secret), as cosign's --key env://
  cudastack key public env://COSIGN_PRIVATE_KEY";

#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    action: KeyAction,
}

#[derive(Debug, Subcommand)]
enum KeyAction {
    /// Generate an ECDSA P-256 key pair that cosign reads too: PREFIX.key, encrypted with
    /// the password in COSIGN_PASSWORD (mode 0600; never overwritten), and PREFIX.pub.
    #[command(after_help = KEY_GENERATE)]
    Generate {
        /// Where to write: PREFIX.key and PREFIX.pub.
        #[arg(long, value_name = "PREFIX", default_value = "cosign")]
        output_prefix: PathBuf,
    },
    /// Print the public key (PEM) of a private or public key file, and its key id (the
    /// sha256 of the key, as `inspect` names signers). A cosign encrypted key is opened
    /// with COSIGN_PASSWORD.
    #[command(after_help = KEY_PUBLIC)]
    Public {
        /// cosign.key, cosign.pub, or a PKCS#8 PEM file; or env://NAME for the PEM text in
        /// the environment variable NAME (as cosign's --key).
        #[arg(value_parser = OsStringValueParser::new().map(|text| KeySource::parse(&text)))]
        key: KeySource,
    },
}

#[derive(serde::Serialize)]
struct PublicKeyOutput {
    key_id: String,
    public_key: String,
}

pub fn run(args: KeyArgs, printer: &Printer) -> CommandResult {
    match args.action {
        KeyAction::Generate { output_prefix } => {
            let password = password_from_env()?;
            let files = write_key_pair(&output_prefix, &password)?;
            if printer.json {
                printer.json(&files);
            } else {
                printer.status(format!(
                    "Private key written to {} (encrypted with COSIGN_PASSWORD)",
                    files.private_key.display()
                ));
                printer.status(format!(
                    "Public key written to {}",
                    files.public_key.display()
                ));
                printer.line(&files.key_id);
            }
        }
        KeyAction::Public { key } => {
            let public = public_key_of(&key)?;
            if printer.json {
                printer.json(&PublicKeyOutput {
                    key_id: public.key_id(),
                    public_key: public.to_pem(),
                });
            } else {
                printer.text(public.to_pem());
                printer.status(format!("key id: {}", public.key_id()));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The public key of a public key file, or of a private key file: cosign's encrypted key
/// is opened with COSIGN_PASSWORD; any other private key needs none (an unencrypted PKCS#8
/// key is read, the rest refused with what to do).
fn public_key_of(source: &KeySource) -> Result<PublicKey, SignError> {
    match PublicKey::load(source) {
        Err(SignError::WrongBlock { found, .. })
            if found == SIGSTORE_PRIVATE_KEY_LABEL || found == COSIGN_PRIVATE_KEY_LABEL =>
        {
            let password = password_from_env()?;
            Ok(SigningKey::load(source, &password)?.public_key())
        }
        Err(SignError::WrongBlock { found, .. }) if found.contains("PRIVATE KEY") => {
            Ok(SigningKey::load(source, b"")?.public_key())
        }
        other => other,
    }
}
