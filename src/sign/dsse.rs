//! DSSE envelopes (Dead Simple Signing Envelope, v1: https://github.com/secure-systems-lab/dsse):
//! a payload, its type, and signatures over the pre-authentication encoding
//! [`pae`] of both, so a signature never covers bytes of an ambiguous type.
//!
//! The JSON is the spec's: `{"payload": base64, "payloadType": str, "signatures":
//! [{"keyid": str, "sig": base64}]}`, standard base64 with padding. cosign
//! (`verify-blob-attestation`, `verify-attestation`) and securesystemslib read it.
//!
//! `keyid` is a hint, not authenticated, and we write it empty (`"keyid": ""`), as cosign
//! does (cosign omits it). Found with cosign 3.1.1: its bundle verifier (sigstore-go)
//! skips every signature whose keyid is not empty, so an envelope with the key's id as
//! keyid fails `cosign verify-attestation` in cosign 3's default format; the field is kept,
//! empty, because securesystemslib's `Envelope.from_dict` requires it (and then tries only
//! signatures whose keyid equals its key's: build the key with keyid "" there). The signer
//! is named instead by the sigstore bundle's key hint ([`super::bundle`]). On verifying we
//! try every signature against the key, whatever its keyid, as the spec says.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::key::{PublicKey, SigningKey};
use super::SignError;

/// The media type of a DSSE envelope as an OCI artifact or layer.
pub const MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// The payload type of an in-toto statement in an envelope.
pub const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// An envelope larger than this is refused before it is parsed. Statements carry an SBOM
/// (a few MB for thousands of packages) at most; 64 MiB leaves room and bounds memory.
pub const MAX_ENVELOPE_BYTES: usize = 64 << 20;
/// The most signatures an envelope may carry.
pub const MAX_SIGNATURES: usize = 16;

/// A signed payload. Build one with [`Envelope::sign`]; read one with
/// [`Envelope::from_json`], trust its payload only through [`Envelope::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub payload_type: String,
    pub payload: Vec<u8>,
    pub signatures: Vec<Signature>,
}

/// One signature: ECDSA-SHA256, ASN.1 DER, over [`pae`] of the envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub keyid: String,
    pub sig: Vec<u8>,
}

/// The wire form: field names and base64 as the spec has them.
#[derive(Serialize, Deserialize)]
pub(super) struct WireEnvelope {
    payload: String,
    #[serde(rename = "payloadType")]
    payload_type: String,
    signatures: Vec<WireSignature>,
}

#[derive(Serialize, Deserialize)]
struct WireSignature {
    /// Absent in cosign's output and in a bundle (protobuf JSON omits empty strings);
    /// present, maybe empty, in the envelopes we write (securesystemslib requires it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keyid: Option<String>,
    sig: String,
}

/// Refuse a signed document (`kind`: an envelope, a bundle) of more than
/// [`MAX_ENVELOPE_BYTES`] before it is parsed.
pub(super) fn refuse_oversized(
    bytes: &[u8],
    what: &str,
    kind: &'static str,
) -> Result<(), SignError> {
    if bytes.len() <= MAX_ENVELOPE_BYTES {
        return Ok(());
    }
    Err(SignError::TooLarge {
        what: what.to_string(),
        kind,
        size: bytes.len() as u64,
        limit: MAX_ENVELOPE_BYTES as u64,
        hint: "it holds one statement; this is not one cudastack or cosign made",
    })
}

/// The pre-authentication encoding the signatures cover:
/// `"DSSEv1" SP LEN(type) SP type SP LEN(payload) SP payload`, lengths in ASCII decimal.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

impl Envelope {
    /// An envelope of `payload` signed by `key`.
    pub fn sign(payload_type: impl Into<String>, payload: Vec<u8>, key: &SigningKey) -> Self {
        let mut envelope = Envelope {
            payload_type: payload_type.into(),
            payload,
            signatures: Vec::new(),
        };
        envelope.add_signature(key);
        envelope
    }

    /// Add `key`'s signature (a second signer of the same payload).
    pub fn add_signature(&mut self, key: &SigningKey) {
        let sig = key.sign(&pae(&self.payload_type, &self.payload));
        // Empty: see the module's note on keyid.
        self.signatures.push(Signature {
            keyid: String::new(),
            sig,
        });
    }

    /// The payload, when at least one signature verifies with `key` over the PAE of this
    /// envelope's type and payload; an error that says how many were tried otherwise.
    pub fn verify(&self, key: &PublicKey) -> Result<&[u8], SignError> {
        let message = pae(&self.payload_type, &self.payload);
        // Every signature is tried: a keyid is unauthenticated and may be anything.
        if self
            .signatures
            .iter()
            .any(|signature| key.verify(&message, &signature.sig).is_ok())
        {
            return Ok(&self.payload);
        }
        Err(SignError::NotSignedBy {
            key_id: key.key_id(),
            count: self.signatures.len(),
        })
    }

    /// Those of `keys` that signed this envelope (each verifies one of its signatures over
    /// the PAE), in the order given: who signed it among the keys a caller knows.
    pub fn verified_by<'k>(&self, keys: &'k [PublicKey]) -> Vec<&'k PublicKey> {
        let message = pae(&self.payload_type, &self.payload);
        keys.iter()
            .filter(|key| {
                self.signatures
                    .iter()
                    .any(|signature| key.verify(&message, &signature.sig).is_ok())
            })
            .collect()
    }

    /// The JSON of the envelope (the bytes to store; deterministic for the same key and
    /// payload, since signing is).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_wire(true)).expect("an envelope serialises")
    }

    /// The wire form; `with_keyid: false` leaves empty keyids out (a bundle's protobuf
    /// JSON form).
    pub(super) fn to_wire(&self, with_keyid: bool) -> WireEnvelope {
        WireEnvelope {
            payload: STANDARD.encode(&self.payload),
            payload_type: self.payload_type.clone(),
            signatures: self
                .signatures
                .iter()
                .map(|signature| WireSignature {
                    keyid: (with_keyid || !signature.keyid.is_empty())
                        .then(|| signature.keyid.clone()),
                    sig: STANDARD.encode(&signature.sig),
                })
                .collect(),
        }
    }

    /// Parse an envelope (nothing is verified yet), refusing more than
    /// [`MAX_ENVELOPE_BYTES`].
    pub fn from_json(bytes: &[u8]) -> Result<Self, SignError> {
        Self::from_json_named(bytes, "the envelope")
    }

    /// [`Envelope::from_json`] with `what` (a file, a referrer's digest) named in errors.
    pub fn from_json_named(bytes: &[u8], what: &str) -> Result<Self, SignError> {
        let malformed = |detail: String| SignError::Envelope {
            what: what.to_string(),
            detail,
        };
        refuse_oversized(bytes, what, "a DSSE envelope")?;
        let wire: WireEnvelope = serde_json::from_slice(bytes)
            .map_err(|error| malformed(format!("its JSON does not parse: {error}")))?;
        Self::from_wire(wire, what)
    }

    /// Decode the base64 of a parsed wire form.
    pub(super) fn from_wire(wire: WireEnvelope, what: &str) -> Result<Self, SignError> {
        let malformed = |detail: String| SignError::Envelope {
            what: what.to_string(),
            detail,
        };
        let payload = decode_base64(&wire.payload)
            .map_err(|error| malformed(format!("`payload` is not base64: {error}")))?;
        // Every signature is tried against the key: a few are a co-signed statement,
        // thousands are an attempt to make verification take minutes.
        if wire.signatures.len() > MAX_SIGNATURES {
            return Err(malformed(format!(
                "it has {} signatures; cudastack reads at most {MAX_SIGNATURES}",
                wire.signatures.len()
            )));
        }
        let signatures = wire
            .signatures
            .into_iter()
            .enumerate()
            .map(|(index, signature)| {
                let sig = decode_base64(&signature.sig).map_err(|error| {
                    malformed(format!("`signatures[{index}].sig` is not base64: {error}"))
                })?;
                Ok(Signature {
                    keyid: signature.keyid.unwrap_or_default(),
                    sig,
                })
            })
            .collect::<Result<_, SignError>>()?;
        Ok(Envelope {
            payload_type: wire.payload_type,
            payload,
            signatures,
        })
    }
}

const STANDARD: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The spec lets a writer use standard or URL-safe base64; readers accept both, padded or
/// not (Go's protobuf JSON writes standard padded; other writers vary).
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let unpadded = text.trim_end_matches('=');
    if text.contains(['-', '_']) {
        URL_SAFE_NO_PAD.decode(unpadded)
    } else {
        STANDARD_NO_PAD.decode(unpadded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PAE example of the DSSE spec (protocol.md, "Test vectors" use this encoding).
    #[test]
    fn pae_matches_the_spec() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
    }

    #[test]
    fn a_signed_envelope_round_trips_and_verifies() {
        let key = SigningKey::generate().unwrap();
        let envelope = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{\"a\":1}".to_vec(), &key);
        let json = envelope.to_json();
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.starts_with(r#"{"payload":"eyJhIjoxfQ==","payloadType":"application/vnd.in-toto+json","signatures":[{"keyid":"","sig":""#), "{text}");
        let parsed = Envelope::from_json(&json).unwrap();
        assert_eq!(parsed, envelope);
        assert_eq!(parsed.verify(&key.public_key()).unwrap(), b"{\"a\":1}");
        assert_eq!(
            json,
            Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"{\"a\":1}".to_vec(), &key).to_json()
        );
    }

    #[test]
    fn a_changed_payload_type_signature_or_key_is_refused() {
        let key = SigningKey::generate().unwrap();
        let public = key.public_key();
        let envelope = Envelope::sign(IN_TOTO_PAYLOAD_TYPE, b"statement".to_vec(), &key);
        let mut changed = envelope.clone();
        changed.payload[0] ^= 1;
        assert!(changed.verify(&public).is_err());
        let mut changed = envelope.clone();
        changed.payload_type = "application/json".into();
        assert!(changed.verify(&public).is_err());
        let mut changed = envelope.clone();
        let last = changed.signatures[0].sig.len() - 1;
        changed.signatures[0].sig[last] ^= 1;
        assert!(changed.verify(&public).is_err());
        let other = SigningKey::generate().unwrap().public_key();
        let error = envelope.verify(&other).unwrap_err();
        assert!(
            matches!(error, SignError::NotSignedBy { count: 1, .. }),
            "{error}"
        );
        let mut unsigned = envelope.clone();
        unsigned.signatures.clear();
        let error = unsigned.verify(&public).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("none of the envelope's 0 signature(s)"),
            "{error}"
        );
    }

    #[test]
    fn any_signature_counts_whatever_its_keyid() {
        let key = SigningKey::generate().unwrap();
        let other = SigningKey::generate().unwrap();
        let mut envelope = Envelope::sign("t", b"p".to_vec(), &other);
        envelope.add_signature(&key);
        envelope.signatures[1].keyid = "misleading".into();
        assert!(envelope.verify(&key.public_key()).is_ok());
        assert!(envelope.verify(&other.public_key()).is_ok());
    }

    #[test]
    fn verified_by_names_the_signers_among_the_known_keys() {
        let keys: Vec<SigningKey> = (0..3).map(|_| SigningKey::generate().unwrap()).collect();
        let public: Vec<PublicKey> = keys.iter().map(SigningKey::public_key).collect();
        let mut envelope = Envelope::sign("t", b"p".to_vec(), &keys[2]);
        envelope.add_signature(&keys[0]);
        let signers = envelope.verified_by(&public);
        assert_eq!(signers, [&public[0], &public[2]]);
        envelope.payload.push(b'!');
        assert!(envelope.verified_by(&public).is_empty());
    }

    #[test]
    fn malformed_json_is_named_precisely() {
        let cases: [(&[u8], &str); 5] = [
            (b"", "JSON does not parse"),
            (b"{\"payload\":\"\"}", "missing field `payloadType`"),
            (
                br#"{"payload":"!","payloadType":"t","signatures":[]}"#,
                "`payload` is not base64",
            ),
            (
                br#"{"payload":"","payloadType":"t","signatures":[{"sig":"%%"}]}"#,
                "`signatures[0].sig` is not base64",
            ),
            (
                br#"{"payload":"","payloadType":"t","signatures":[{"keyid":1,"sig":""}]}"#,
                "JSON does not parse",
            ),
        ];
        for (bytes, expected) in cases {
            let error = Envelope::from_json(bytes).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
        let huge = vec![b' '; MAX_ENVELOPE_BYTES + 1];
        let error = Envelope::from_json(&huge).unwrap_err();
        assert!(matches!(error, SignError::TooLarge { .. }), "{error}");
    }

    #[test]
    fn url_safe_and_unpadded_base64_are_read() {
        let envelope = Envelope::from_json(
            br#"{"payload":"-_8","payloadType":"t","signatures":[{"sig":"AA"}]}"#,
        )
        .unwrap();
        assert_eq!(envelope.payload, [0xfb, 0xff]);
        assert_eq!(envelope.signatures[0].sig, [0]);
        assert_eq!(envelope.signatures[0].keyid, "");
    }
}
