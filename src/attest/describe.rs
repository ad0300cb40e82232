//! What `inspect` says about each referrer of an image: what it is, who signed it (and,
//! given the key, whether the signature holds), what it is about and a line or two of
//! what it says. Any bytes may arrive here from a registry: a referrer that does not read
//! is described as such, never an error for the whole inspection.

use serde::Serialize;
use serde_json::Value;

use super::statement::Statement;
use super::{provenance, verification, SPDX_PREDICATE_TYPE, STATEMENT_ARTIFACT_TYPE};
use crate::digest::Digest;
use crate::sign::bundle::{self, Bundle, BundleSigner};
use crate::sign::key::PublicKey;

/// One referrer, described.
#[derive(Debug, Clone, Serialize)]
pub struct ReferrerSummary {
    pub location: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub artifact_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicate_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureSummary>,
    /// `sha256:…` of each image the statement is about.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<String>,
    pub detail: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SignatureSummary {
    /// The key whose signature verified (hex sha256 of its public key): only when one did.
    pub key_id: Option<String>,
    /// The key the bundle says signed it (its unauthenticated hint).
    pub claimed_key_id: Option<String>,
    /// `valid`, `valid, but about other images`, `invalid: why`, or `not checked`.
    pub status: String,
}

/// Describe one referrer (`blob` of `artifact_type`) of the manifest `image`, checking a
/// bundle's signature against `key` when one is given. Every string that came with the
/// referrer is shown with its control characters escaped: it may come from a registry.
pub fn describe(
    location: &str,
    kind: Option<&str>,
    artifact_type: &str,
    blob: &[u8],
    image: &Digest,
    key: Option<&PublicKey>,
) -> ReferrerSummary {
    let mut summary = describe_unescaped(location, kind, artifact_type, blob, image, key);
    summary.location = printable(&summary.location);
    summary.kind = summary.kind.as_deref().map(printable);
    summary.artifact_type = printable(&summary.artifact_type);
    summary.predicate_type = summary.predicate_type.as_deref().map(printable);
    summary.detail = summary.detail.iter().map(|l| printable(l)).collect();
    summary.subjects = summary.subjects.iter().map(|s| printable(s)).collect();
    if let Some(signature) = &mut summary.signature {
        signature.claimed_key_id = signature.claimed_key_id.as_deref().map(printable);
        signature.status = printable(&signature.status);
    }
    summary
}

/// `text` with control characters (newlines, escapes) and bidi controls written as Rust
/// escapes: the one escaping of the crate.
fn printable(text: &str) -> String {
    crate::printable::escape(text).into_owned()
}

fn describe_unescaped(
    location: &str,
    kind: Option<&str>,
    artifact_type: &str,
    blob: &[u8],
    image: &Digest,
    key: Option<&PublicKey>,
) -> ReferrerSummary {
    let mut summary = ReferrerSummary {
        location: location.to_string(),
        kind: kind.map(str::to_string),
        artifact_type: artifact_type.to_string(),
        predicate_type: None,
        signature: None,
        subjects: Vec::new(),
        detail: Vec::new(),
    };
    let statement = match artifact_type {
        crate::sbom::SPDX_MEDIA_TYPE => {
            summary.detail = sbom_lines(blob);
            return summary;
        }
        crate::sbom::CYCLONEDX_MEDIA_TYPE => {
            summary.detail = vec!["CycloneDX 1.6: the same inventory as the SPDX SBOM".to_string()];
            return summary;
        }
        crate::verify::REPORT_ARTIFACT_TYPE => {
            summary.detail = vec!["the verification report (unsigned)".to_string()];
            return summary;
        }
        STATEMENT_ARTIFACT_TYPE => Statement::from_bytes(blob),
        bundle::MEDIA_TYPE => match Bundle::from_json(blob, location) {
            Ok(bundle) => {
                let (signature, statement) = signed_statement(&bundle, key);
                summary.signature = Some(signature);
                statement
            }
            Err(error) => Err(error.into()),
        },
        _ => {
            summary.detail = vec![format!("{} bytes", blob.len())];
            return summary;
        }
    };
    match statement {
        Ok(statement) => {
            if let Some(signature) = &mut summary.signature {
                if signature.status == "valid" && !statement.is_about(image) {
                    signature.status =
                        "valid, but about other images: it says nothing about this one".to_string();
                }
            }
            summary.subjects = statement
                .subject
                .iter()
                .map(|s| format!("sha256:{}", s.digest.sha256))
                .collect();
            summary.detail = predicate_lines(&statement);
            summary.predicate_type = Some(statement.predicate_type);
        }
        Err(error) => summary.detail = vec![format!("unreadable: {error}")],
    }
    summary
}

/// The bundle's signature status and its statement (verified when a key is given; read
/// unverified, and said so, when not).
fn signed_statement(
    bundle: &Bundle,
    key: Option<&PublicKey>,
) -> (SignatureSummary, Result<Statement, super::AttestError>) {
    let claimed_key_id = match &bundle.signer {
        BundleSigner::Key { hint } => hint.clone(),
        BundleSigner::Certificate => {
            return (
                SignatureSummary {
                    key_id: None,
                    claimed_key_id: None,
                    status: "keyless (a Fulcio certificate): not checked by cudastack; use cosign verify-attestation --certificate-identity".to_string(),
                },
                Statement::from_bytes(&bundle.envelope.payload),
            )
        }
    };
    match key {
        Some(key) => match super::open(bundle, key) {
            Ok(statement) => (
                SignatureSummary {
                    key_id: Some(key.key_id()),
                    claimed_key_id,
                    status: "valid".to_string(),
                },
                Ok(statement),
            ),
            Err(error) => (
                SignatureSummary {
                    key_id: None,
                    claimed_key_id,
                    status: format!("invalid: {error}"),
                },
                Statement::from_bytes(&bundle.envelope.payload),
            ),
        },
        None => (
            SignatureSummary {
                key_id: None,
                claimed_key_id,
                status: "not checked (give --key KEY.pub)".to_string(),
            },
            Statement::from_bytes(&bundle.envelope.payload),
        ),
    }
}

fn sbom_lines(document: &[u8]) -> Vec<String> {
    match crate::sbom::Summary::of_spdx(document) {
        Ok(summary) => {
            let mut lines = vec![format!(
                "SPDX 2.3: {} Debian packages, {} wheels ({} built from source)",
                summary.debs, summary.wheels, summary.built_wheels
            )];
            if !summary.cuda.is_empty() {
                lines.push(format!(
                    "CUDA components: {}",
                    summary
                        .cuda
                        .iter()
                        .map(|c| format!("{} {}", c.name, c.version))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            lines
        }
        Err(error) => vec![format!("unreadable SBOM: {error}")],
    }
}

/// A line or two of what the statement says, by predicate type.
fn predicate_lines(statement: &Statement) -> Vec<String> {
    let p = &statement.predicate;
    match statement.predicate_type.as_str() {
        provenance::PREDICATE_TYPE => {
            let text = |v: &Value| v.as_str().unwrap_or("?").to_string();
            vec![
                format!(
                    "built by {} {}",
                    text(&p["runDetails"]["builder"]["id"]),
                    text(&p["runDetails"]["builder"]["version"]["cudastack"])
                ),
                format!(
                    "recipe {} sha256:{}, lock sha256:{}, {} resolved dependencies",
                    text(&p["buildDefinition"]["externalParameters"]["recipe"]["path"]),
                    text(&p["buildDefinition"]["externalParameters"]["recipe"]["digest"]["sha256"]),
                    text(&p["buildDefinition"]["externalParameters"]["lock"]["digest"]["sha256"]),
                    p["buildDefinition"]["resolvedDependencies"]
                        .as_array()
                        .map_or(0, Vec::len)
                ),
            ]
        }
        verification::PREDICATE_TYPE => match verification::VerificationPredicate::of(statement) {
            Ok(predicate) => {
                let mut lines = vec![format!("verdict {}", predicate.verdict)];
                lines.extend(predicate.matrix.iter().map(|row| {
                    format!(
                        "verified on {} x{} (compute capability {}), driver {}, {}",
                        row.gpu, row.count, row.compute_capability, row.driver, row.date
                    )
                }));
                lines
            }
            Err(error) => vec![format!("unreadable: {error}")],
        },
        SPDX_PREDICATE_TYPE => sbom_lines(&serde_json::to_vec(p).unwrap_or_default()),
        super::CYCLONEDX_PREDICATE_TYPE => vec![format!(
            "CycloneDX {}: {} components",
            p["specVersion"].as_str().unwrap_or("?"),
            p["components"].as_array().map_or(0, Vec::len)
        )],
        other => vec![format!("predicate {other}")],
    }
}
