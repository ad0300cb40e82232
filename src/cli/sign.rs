//! `cudastack sign IMAGE --key KEY`: sign the statements stored beside an image of an OCI
//! layout (SBOM, provenance, verification). Keys are cosign's (`cudastack key generate` or `cosign
//! generate-key-pair`); the password comes from COSIGN_PASSWORD, as for cosign.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Args;
use cudastack::verify::source::ImageLocation;

use super::args::{read_key, RefArg};
use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The image: an OCI layout (`images/NAME` or `oci:DIR[:REF]`). To sign an image of a
    /// registry, pull it into a layout, sign, and push it back (the referrers go with it).
    pub image: String,
    #[command(flatten)]
    pub layout_ref: RefArg,
    /// The cosign private key: a file, or `env://NAME` (password from COSIGN_PASSWORD).
    #[arg(long, value_name = "KEY", env = "CUDASTACK_SIGN_KEY")]
    pub key: OsString,
}

pub fn run(args: SignArgs, printer: &Printer) -> CommandResult {
    let key = read_key(&args.key)?;
    let (dir, ref_name) = match ImageLocation::parse(&args.image, Some(&args.layout_ref.ref_name))? {
        ImageLocation::Layout { dir, ref_name } => (dir, ref_name),
        ImageLocation::Registry(reference) => {
            return Err(format!(
                "`{reference}` is a registry reference: `cudastack pull {reference} --layout DIR`, sign DIR, then `cudastack push DIR {reference}`"
            )
            .into())
        }
        ImageLocation::Daemon(reference) => {
            return Err(format!(
                "`{reference}` is an image of the Docker daemon, which keeps no statement beside an image: sign its OCI layout, then push or load it"
            )
            .into())
        }
    };
    let signed = cudastack::pipeline::attest::sign(&dir, &ref_name, &ref_name, &key, printer)?;
    if printer.json {
        printer.json(&signed);
    } else if signed.is_empty() {
        printer.line(format_args!(
            "nothing to sign: cudastack made no unsigned statement about oci:{}:{ref_name} (those it made are signed already, by this key or another: `cudastack inspect --key KEY.pub` says which; what `pull` fetched is never signed here, and one key signs each statement: co-signing is not supported)",
            dir.display()
        ));
    } else {
        for s in &signed {
            printer.line(format_args!(
                "{}  {}  {}",
                s.kind, s.predicate_type, s.digest
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}
