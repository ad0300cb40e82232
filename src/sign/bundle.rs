//! Sigstore bundles (v0.3) around a DSSE envelope: the form cosign 3 stores an attestation
//! in, and the one its `verify-attestation` (default `--new-bundle-format`) reads.
//!
//! Found with cosign 3.1.1 (`cosign attest --key ... --signing-config` with no log, against
//! a distribution 2.8 registry): the attestation is an OCI referrer of the image, a
//! manifest with `artifactType` [`MEDIA_TYPE`], an empty config, one layer of
//! [`MEDIA_TYPE`] holding the bundle JSON, and the annotations [`CONTENT_ANNOTATION`] =
//! [`CONTENT_DSSE`] and [`PREDICATE_TYPE_ANNOTATION`] = the statement's predicate type.
//! The bundle:
//!
//! ```json
//! {"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json",
//!  "verificationMaterial":{"publicKey":{"hint":"<base64 sha256 of the SPKI DER>"}},
//!  "dsseEnvelope":{"payload":"...","payloadType":"application/vnd.in-toto+json",
//!                  "signatures":[{"sig":"..."}]}}
//! ```
//!
//! The hint is the key id of [`PublicKey::key_id`], in base64. A keyless bundle carries a
//! Fulcio certificate and Rekor entries instead; it is read (so `inspect` can say what it
//! is) but never verified here, as this module has no Fulcio root or Rekor key to check.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::dsse::{refuse_oversized, Envelope, WireEnvelope};
use super::key::PublicKey;
use super::SignError;

/// The media type of the bundle (its `mediaType`, and the referrer's `artifactType`).
pub const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The referrer manifest's annotation saying what the bundle holds.
pub const CONTENT_ANNOTATION: &str = "dev.sigstore.bundle.content";
/// Its value for an attestation.
pub const CONTENT_DSSE: &str = "dsse-envelope";
/// The referrer manifest's annotation naming the statement's predicate type.
pub const PREDICATE_TYPE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";

/// A bundle of one DSSE envelope and who signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub envelope: Envelope,
    pub signer: BundleSigner,
}

/// What the bundle's verification material says about the signer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleSigner {
    /// A key the verifier must already hold; the hint names it: the key id (hex) when the
    /// hint is a base64 sha256, as cosign and cudastack write it, else the hint as written.
    Key { hint: Option<String> },
    /// A Fulcio certificate (keyless signing): not verifiable by a key.
    Certificate,
}

#[derive(Serialize, Deserialize)]
struct WireBundle {
    #[serde(rename = "mediaType")]
    media_type: String,
    #[serde(rename = "verificationMaterial")]
    verification_material: WireMaterial,
    #[serde(rename = "dsseEnvelope")]
    dsse_envelope: Option<WireEnvelope>,
}

#[derive(Default, Serialize, Deserialize)]
struct WireMaterial {
    #[serde(rename = "publicKey", skip_serializing_if = "Option::is_none")]
    public_key: Option<WireHint>,
    #[serde(default, skip_serializing)]
    certificate: Option<serde_json::Value>,
    #[serde(rename = "x509CertificateChain", default, skip_serializing)]
    certificate_chain: Option<serde_json::Value>,
}

#[derive(Default, Serialize, Deserialize)]
struct WireHint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
}

impl Bundle {
    /// The bundle of `envelope`, its signer hinted as `key`.
    pub fn new(envelope: Envelope, key: &PublicKey) -> Self {
        Bundle {
            envelope,
            signer: BundleSigner::Key {
                hint: Some(key.key_id()),
            },
        }
    }

    /// The bundle JSON: the layer of the referrer.
    pub fn to_json(&self) -> Vec<u8> {
        let hint = match &self.signer {
            BundleSigner::Key { hint } => hint.as_deref().map(hint_of_key_id),
            BundleSigner::Certificate => None,
        };
        let wire = WireBundle {
            media_type: MEDIA_TYPE.to_string(),
            verification_material: WireMaterial {
                public_key: Some(WireHint { hint }),
                ..WireMaterial::default()
            },
            dsse_envelope: Some(self.envelope.to_wire(false)),
        };
        serde_json::to_vec(&wire).expect("a bundle serialises")
    }

    /// Parse a bundle (nothing is verified yet); `what` names it in errors.
    pub fn from_json(bytes: &[u8], what: &str) -> Result<Self, SignError> {
        let malformed = |detail: String| SignError::Envelope {
            what: what.to_string(),
            detail,
        };
        refuse_oversized(bytes, what, "a sigstore bundle")?;
        let wire: WireBundle = serde_json::from_slice(bytes)
            .map_err(|error| malformed(format!("its bundle JSON does not parse: {error}")))?;
        if !wire
            .media_type
            .starts_with("application/vnd.dev.sigstore.bundle")
        {
            return Err(malformed(format!(
                "its mediaType is `{}`, not a sigstore bundle's",
                wire.media_type
            )));
        }
        let Some(envelope) = wire.dsse_envelope else {
            return Err(malformed(
                "the bundle holds a message signature, not a DSSE envelope (an attestation)"
                    .to_string(),
            ));
        };
        let material = wire.verification_material;
        let signer = if material.certificate.is_some() || material.certificate_chain.is_some() {
            BundleSigner::Certificate
        } else {
            BundleSigner::Key {
                hint: material
                    .public_key
                    .and_then(|key| key.hint)
                    .map(|hint| key_id_of_hint(&hint)),
            }
        };
        Ok(Bundle {
            envelope: Envelope::from_wire(envelope, what)?,
            signer,
        })
    }

    /// The payload, when the envelope verifies with `key` (a keyless bundle never does).
    pub fn verify(&self, key: &PublicKey) -> Result<&[u8], SignError> {
        if self.signer == BundleSigner::Certificate {
            return Err(SignError::Keyless);
        }
        self.envelope.verify(key)
    }
}

/// cosign's hint: the key id's 32 bytes in standard base64.
fn hint_of_key_id(key_id: &str) -> String {
    match hex::decode(key_id) {
        Ok(bytes) => base64::engine::general_purpose::STANDARD.encode(bytes),
        Err(_) => key_id.to_string(),
    }
}

/// The key id (hex) a hint stands for, or the hint itself when it is not a base64 sha256.
fn key_id_of_hint(hint: &str) -> String {
    match base64::engine::general_purpose::STANDARD.decode(hint) {
        Ok(bytes) if bytes.len() == 32 => hex::encode(bytes),
        _ => hint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::dsse::IN_TOTO_PAYLOAD_TYPE;
    use crate::sign::SigningKey;

    /// A bundle `cosign attest-blob --bundle` 3.1.1 wrote (key fd7b33b4..., offline).
    const COSIGN_BUNDLE: &str = r#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{"publicKey":{"hint":"/XsztIoyScbLp2kmz8ZwWqmvyTrFN8seQY6wkEl5mXw="}},"dsseEnvelope":{"payload":"eyJfdHlwZSI6Imh0dHBzOi8vaW4tdG90by5pby9TdGF0ZW1lbnQvdjAuMSIsInN1YmplY3QiOlt7Im5hbWUiOiJibG9iIiwiZGlnZXN0Ijp7InNoYTI1NiI6IjU4OTFiNWI1MjJkNWRmMDg2ZDBmZjBiMTEwZmJkOWQyMWJiNGZjNzE2M2FmMzRkMDgyODZhMmU4NDZmNmJlMDMifX1dLCJwcmVkaWNhdGVUeXBlIjoiaHR0cHM6Ly9leGFtcGxlLmNvbS90L3YxIiwicHJlZGljYXRlIjp7ImJ1aWxkVHlwZSI6IngifX0=","payloadType":"application/vnd.in-toto+json","signatures":[{"sig":"MEUCIQCYwmmEJnpOgeIaEX3ugsk7PAVBZLi2LyH2VYREeYPZmwIgZUP2DWazz4uJjCJLVJ0ivJbRInz4oM5Za+mei+tdWg8="}]}}"#;
    const COSIGN_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEXDwJ36gQijkSavM0p3CQ4WoFL+4L
fptyMRSdtXCiohReM4QUzHIgPbgfTzTfalBjoOGqFE3HG6hMIvi86NGpGA==
-----END PUBLIC KEY-----
";

    #[test]
    fn cosigns_bundle_is_read_and_verified_its_hint_is_the_key_id() {
        let public = PublicKey::from_pem(COSIGN_PUB).unwrap();
        let bundle = Bundle::from_json(COSIGN_BUNDLE.as_bytes(), "cosign.bundle").unwrap();
        assert_eq!(
            bundle.signer,
            BundleSigner::Key {
                hint: Some(public.key_id())
            }
        );
        let payload = bundle.verify(&public).unwrap();
        assert!(payload.starts_with(br#"{"_type":"https://in-toto.io/Statement/v0.1""#));
        let other = SigningKey::generate().unwrap().public_key();
        assert!(bundle.verify(&other).is_err());
    }

    #[test]
    fn our_bundle_has_cosigns_shape_and_round_trips() {
        let key = SigningKey::generate().unwrap();
        let envelope = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{}".to_vec(), &key);
        let bundle = Bundle::new(envelope, &key.public_key());
        let json = String::from_utf8(bundle.to_json()).unwrap();
        let hint = hint_of_key_id(&key.public_key().key_id());
        assert!(json.starts_with(&format!(
            r#"{{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{{"publicKey":{{"hint":"{hint}"}}}},"dsseEnvelope":{{"payload":"e30=","payloadType":"application/vnd.in-toto+json","signatures":[{{"sig":""#
        )), "{json}");
        let again = Bundle::from_json(json.as_bytes(), "b").unwrap();
        assert_eq!(again, bundle);
        assert_eq!(again.verify(&key.public_key()).unwrap(), b"{}");
    }

    #[test]
    fn keyless_and_foreign_documents_are_named() {
        let keyless = COSIGN_BUNDLE.replace(
            r#"{"publicKey":{"hint":"/XsztIoyScbLp2kmz8ZwWqmvyTrFN8seQY6wkEl5mXw="}}"#,
            r#"{"certificate":{"rawBytes":"MIIB"},"tlogEntries":[]}"#,
        );
        let bundle = Bundle::from_json(keyless.as_bytes(), "b").unwrap();
        assert_eq!(bundle.signer, BundleSigner::Certificate);
        let public = PublicKey::from_pem(COSIGN_PUB).unwrap();
        assert!(matches!(bundle.verify(&public), Err(SignError::Keyless)));
        let envelope_only = r#"{"payload":"","payloadType":"t","signatures":[]}"#;
        let error = Bundle::from_json(envelope_only.as_bytes(), "b").unwrap_err();
        assert!(error.to_string().contains("does not parse"), "{error}");
        let message = r#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{},"messageSignature":{}}"#;
        let error = Bundle::from_json(message.as_bytes(), "b").unwrap_err();
        assert!(error.to_string().contains("not a DSSE envelope"), "{error}");
    }
}
