//! What is inside an image and who proved it: the SBOM, the build provenance and the
//! verification attestation, stored beside the image as OCI referrers, signed when a key
//! is given (docs/security.md has the trust chain).
//!
//! ```text
//! build ──> SBOM (SPDX 2.3 JSON, crate::sbom)      referrer `application/spdx+json`
//!       └─> provenance (SLSA v1 in-toto statement) referrer `application/vnd.in-toto+json`
//! verify ─> verification statement (ours)          referrer `application/vnd.in-toto+json`
//! sign ───> each statement (and the SBOM as one) in a DSSE envelope in a sigstore bundle:
//!           referrer `application/vnd.dev.sigstore.bundle.v0.3+json`, as `cosign attest`
//!           stores it, so `cosign verify-attestation --key` checks it too
//! check --require-signed-by KEY: a bundle whose envelope KEY signed, about this image,
//!           with a verified row for the node's GPU
//! ```
//!
//! Statements are stored unsigned first and signed in one step ([`store::sign_referrers`]),
//! after verification has made the verified image: a signed statement names every image it
//! is about, the one built and the verified copy, so a signature never has to be redone
//! because a later stage changed the image's digest.

pub mod describe;
pub mod git_source;
pub mod policy;
pub mod provenance;
pub mod statement;
pub mod store;
pub mod verification;

use crate::oci::OciError;
use crate::sign::bundle::Bundle;
use crate::sign::dsse::Envelope;
use crate::sign::key::{PublicKey, SigningKey};
use statement::{Statement, PAYLOAD_TYPE};

/// The artifact type of an unsigned in-toto statement referrer.
pub const STATEMENT_ARTIFACT_TYPE: &str = "application/vnd.in-toto+json";
/// The predicate type of an SPDX SBOM in a statement (what `cosign attest --type spdxjson`
/// writes).
pub const SPDX_PREDICATE_TYPE: &str = "https://spdx.dev/Document";
/// The predicate type of a CycloneDX SBOM in a statement (`cosign attest --type cyclonedx`).
pub const CYCLONEDX_PREDICATE_TYPE: &str = "https://cyclonedx.org/bom";

#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error("the statement is not usable: {0}")]
    Statement(String),
    #[error(transparent)]
    Sign(#[from] crate::sign::SignError),
}

/// `statement` in a DSSE envelope signed by `key`, in a bundle naming the key.
pub fn sign(statement: &Statement, key: &SigningKey) -> Bundle {
    let envelope = Envelope::sign(PAYLOAD_TYPE, statement.to_bytes(), key);
    Bundle::new(envelope, &key.public_key())
}

/// The statement a bundle holds, when `key` signed its envelope.
pub fn open(bundle: &Bundle, key: &PublicKey) -> Result<Statement, AttestError> {
    if bundle.envelope.payload_type != PAYLOAD_TYPE {
        return Err(AttestError::Statement(format!(
            "the bundle's envelope holds `{}`, not an in-toto statement",
            bundle.envelope.payload_type
        )));
    }
    let payload = bundle.verify(key)?;
    Statement::from_bytes(payload)
}
