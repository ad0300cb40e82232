//! Signatures: ECDSA P-256 keys in the files cosign reads and writes, and DSSE
//! envelopes signed with them.
//!
//! Where it sits: among the outputs and their proof. The pipeline signs what it attaches to
//! an image (the SBOM, the provenance, the verification attestation) as in-toto statements
//! in DSSE envelopes, and `check --require-signed-by` verifies them; this module only knows
//! keys, bytes and envelopes, never images or registries.
//!
//! - [`key`]: [`SigningKey`] (read from cosign's `ENCRYPTED SIGSTORE PRIVATE KEY` file or
//!   a PKCS#8 `PRIVATE KEY`, generated, written back in cosign's format) and [`PublicKey`]
//!   (SPKI `PUBLIC KEY`), ECDSA-SHA256 signatures in ASN.1 DER.
//! - [`dsse`]: the envelope, its pre-authentication encoding, signing and verifying.
//! - [`bundle`]: the sigstore bundle around an envelope, the form cosign 3 stores and
//!   verifies attestations in (an OCI referrer of the image).
//!
//! Keyless signing (a Fulcio certificate for an OIDC identity, the signature logged in
//! Rekor) needs those services, which this module does not reach: a key the user holds is
//! the only signer, and nothing here pretends otherwise. What must not happen here: hand-
//! written cryptography (RustCrypto does the curve, scrypt and the secretbox), a panic on a
//! hostile file, or unbounded work or memory for one (sizes and scrypt costs are capped).

pub mod bundle;
pub mod dsse;
mod encrypted;
pub mod key;

use std::path::PathBuf;

pub use bundle::{Bundle, BundleSigner};
pub use dsse::{Envelope, Signature};
pub use key::{password_from_env, write_key_pair, KeyPairFiles, KeySource, PublicKey, SigningKey};

/// The environment variable that holds the password of a private key; cosign's own, so
/// that one CI secret serves both tools.
pub const PASSWORD_VARIABLE: &str = "COSIGN_PASSWORD";

/// What the hints say makes a usable key.
const MAKE_A_KEY: &str =
    "`cudastack key generate` or `cosign generate-key-pair` writes a key pair cudastack reads";

/// Everything that goes wrong with keys, signatures and envelopes. `what` names the file
/// (or says which text) the problem is in.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("could not read `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is a {kind}, not a regular file; a key is read from a file (or `env://NAME`)\n  hint: give the path of the cosign.key or cosign.pub file", crate::printable::path(.path))]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("`{}` already exists; cudastack never overwrites a key\n  hint: move it away, or give another --output-prefix", path.display())]
    Exists { path: PathBuf },
    #[error(
        "`{what}` is {size} bytes, more than the {limit} bytes {kind} may have\n  hint: {hint}"
    )]
    TooLarge {
        what: String,
        kind: &'static str,
        size: u64,
        limit: u64,
        hint: &'static str,
    },
    #[error("`{what}` is not a PEM file: {detail}\n  hint: {MAKE_A_KEY}")]
    NotPem { what: String, detail: String },
    #[error("`{what}` holds the PEM block `{found}`, not {expected}\n  hint: {hint}")]
    WrongBlock {
        what: String,
        found: String,
        expected: &'static str,
        hint: String,
    },
    #[error("`{what}` is not an encrypted cosign key: {detail}\n  hint: {MAKE_A_KEY}")]
    EncryptedKey { what: String, detail: String },
    #[error("`{what}` asks scrypt for N={n}, r={r}, p={p}, more than cudastack spends on a key (N*r at most {max_nr}, r at most {max_r}, p at most {max_p}: {max_mib} MiB)\n  hint: {MAKE_A_KEY}, with N=65536, r=8, p=1", max_nr = encrypted::MAX_N_TIMES_R, max_p = encrypted::MAX_P, max_r = encrypted::MAX_R, max_mib = (encrypted::MAX_N_TIMES_R * 128) >> 20)]
    KdfTooCostly {
        what: String,
        n: u64,
        r: u64,
        p: u64,
    },
    #[error("could not decrypt `{what}`: wrong password ({PASSWORD_VARIABLE})?\n  hint: set {PASSWORD_VARIABLE} to the password the key was generated with (the file may also have been changed)")]
    WrongPassword { what: String },
    #[error("`{what}` is {algorithm} key; cudastack signs and verifies with ECDSA P-256 keys only\n  hint: {MAKE_A_KEY}")]
    UnsupportedKey { what: String, algorithm: String },
    #[error("`{what}` does not hold a valid ECDSA P-256 key: {detail}\n  hint: {MAKE_A_KEY}")]
    InvalidKey { what: String, detail: String },
    #[error("the environment variable {name} (from `env://{name}`) is not set\n  hint: set it to the PEM text of the key (in CI, from a repository secret), or give the key's file")]
    KeyVariableUnset { name: String },
    #[error("{PASSWORD_VARIABLE} is not set: it is the password that protects the private key\n  hint: export {PASSWORD_VARIABLE}=... (in CI, from a repository secret); an empty value is allowed and leaves the key unprotected, as cosign allows")]
    PasswordUnset,
    #[error("the system's random number generator failed: {0}")]
    Random(String),
    #[error("the signature is not an ASN.1 DER ECDSA signature: {detail}")]
    MalformedSignature { detail: String },
    #[error("the signature does not verify with key {key_id}\n  hint: the signed bytes changed after signing, or another key signed them")]
    BadSignature { key_id: String },
    #[error("`{what}` is not a DSSE envelope: {detail}\n  hint: an envelope is JSON with `payload`, `payloadType` and `signatures` (https://github.com/secure-systems-lab/dsse)")]
    Envelope { what: String, detail: String },
    #[error("the bundle is signed keylessly (a Fulcio certificate); cudastack verifies signatures by a key it is given\n  hint: verify it with `cosign verify-attestation --certificate-identity ... --certificate-oidc-issuer ...`, or sign with a key (`cudastack key generate`)")]
    Keyless,
    #[error("none of the envelope's {count} signature(s) verifies with key {key_id}\n  hint: another key signed it, or its payload or a signature changed after signing")]
    NotSignedBy { key_id: String, count: usize },
}
