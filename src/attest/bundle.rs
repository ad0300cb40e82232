//! Sigstore bundle v0.3 holding one DSSE envelope: the form `cosign attest` (v3) stores an
//! attestation in, as an OCI referrer of the image with artifact type [`MEDIA_TYPE`], so
//! `cosign verify-attestation --key KEY.pub --insecure-ignore-tlog IMAGE` verifies what
//! cudastack signed. A key-signed bundle names its key by `publicKey.hint`: base64 of the
//! sha256 of the key's SubjectPublicKeyInfo DER (what cosign writes).
//!
//! Keyless signing would put a Fulcio certificate in `verificationMaterial` and a Rekor
//! entry in `tlogEntries`; neither service is reachable where cudastack is built and
//! tested, so only key-signed bundles are written (docs/security.md).

use base64::Engine as _;
use serde_json::{json, Value};

use super::AttestError;
use crate::sign::dsse::Envelope;
use crate::sign::key::PublicKey;

pub const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// Annotations cosign puts on a bundle referrer's manifest.
pub const CONTENT_ANNOTATION: &str = "dev.sigstore.bundle.content";
pub const PREDICATE_TYPE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";
/// A bundle of one statement stays well under this.
const MAX_BUNDLE_BYTES: usize = 48 << 20;

/// A bundle's DSSE envelope and the hint naming the key it says signed it.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub envelope: Envelope,
    pub key_hint: Option<String>,
}

/// The hint of `key`: base64 of the sha256 of its SPKI DER.
pub fn key_hint(key: &PublicKey) -> String {
    let raw = hex::decode(key.key_id()).expect("a key id is hex");
    base64::engine::general_purpose::STANDARD.encode(raw)
}

impl Bundle {
    pub fn new(envelope: Envelope, key: &PublicKey) -> Self {
        Bundle {
            envelope,
            key_hint: Some(key_hint(key)),
        }
    }

    /// The bundle's JSON, keys sorted.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut material = json!({});
        if let Some(hint) = &self.key_hint {
            material["publicKey"] = json!({ "hint": hint });
        }
        let value = json!({
            "mediaType": MEDIA_TYPE,
            "verificationMaterial": material,
            "dsseEnvelope": serde_json::from_slice::<Value>(&self.envelope.to_json())
                .expect("an envelope is JSON"),
        });
        crate::canonical::to_canonical_json(&value).expect("a bundle serialises")
    }

    /// Read a bundle that holds a DSSE envelope (a bundle of a plain message signature, or
    /// of another version, is refused by name).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AttestError> {
        let bad = |why: String| AttestError::Bundle(why);
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(bad(format!(
                "it is {} bytes, more than a bundle of one statement may be ({MAX_BUNDLE_BYTES})",
                bytes.len()
            )));
        }
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let media_type = value["mediaType"].as_str().unwrap_or_default();
        if !media_type.starts_with("application/vnd.dev.sigstore.bundle") {
            return Err(bad(format!(
                "its mediaType is `{media_type}`, not a sigstore bundle"
            )));
        }
        let envelope = value
            .get("dsseEnvelope")
            .ok_or_else(|| bad("it holds no DSSE envelope (a plain signature bundle?)".into()))?;
        let envelope = Envelope::from_json(&serde_json::to_vec(envelope).unwrap_or_default())
            .map_err(|e| bad(format!("its DSSE envelope: {e}")))?;
        let key_hint = value["verificationMaterial"]["publicKey"]["hint"]
            .as_str()
            .map(str::to_string);
        Ok(Bundle { envelope, key_hint })
    }
}
