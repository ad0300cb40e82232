//! `check --require-signed-by KEY`: an image is accepted on a node only when a verification
//! attestation signed by KEY says the image passed on a GPU of the node's class (the same
//! compute capability), whatever the image's labels claim. Labels are the image's word about
//! itself; the signed statement is the word of whoever holds the key.

use super::verification::{VerificationPredicate, PREDICATE_TYPE};
use crate::digest::Digest;
use crate::sign::bundle::Bundle;
use crate::sign::key::PublicKey;
use crate::verify::check::{Answer, Finding, Fit, Node};

/// What the referrers of an image hold for `key`: the verification predicates it signed
/// about the image, and why each other bundle did not count.
#[derive(Debug, Default)]
pub struct SignedClaims {
    pub verifications: Vec<VerificationPredicate>,
    pub rejected: Vec<String>,
}

impl SignedClaims {
    /// A row of a signed, verified run on compute capability `cc` (`9.0`), or on any GPU
    /// when `cc` is None.
    pub fn verified_row(&self, cc: Option<&str>) -> Option<&crate::verify::record::VerifiedOn> {
        self.verifications
            .iter()
            .filter(|p| p.verdict == "verified")
            .flat_map(|p| p.matrix.iter())
            .find(|row| cc.is_none_or(|cc| row.compute_capability == cc))
    }
}

/// Read every bundle in `bundles` (their bytes, with a label for messages) for signed
/// verification statements about `image`.
pub fn signed_verifications<'a>(
    bundles: impl IntoIterator<Item = (String, &'a [u8])>,
    image: &Digest,
    key: &PublicKey,
) -> SignedClaims {
    let mut claims = SignedClaims::default();
    for (label, bytes) in bundles {
        let statement = Bundle::from_json(bytes, &label)
            .map_err(super::AttestError::from)
            .and_then(|b| super::open(&b, key));
        let statement = match statement {
            Ok(statement) => statement,
            Err(error) => {
                claims.rejected.push(format!("{label}: {error}"));
                continue;
            }
        };
        if statement.predicate_type != PREDICATE_TYPE {
            continue;
        }
        if !statement.is_about(image) {
            claims.rejected.push(format!(
                "{label}: signed by the key, but about other images ({})",
                statement
                    .subject
                    .iter()
                    .map(|s| format!("sha256:{}", s.digest.sha256))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        }
        match VerificationPredicate::of(&statement) {
            Ok(predicate) => claims.verifications.push(predicate),
            Err(error) => claims.rejected.push(format!("{label}: {error}")),
        }
    }
    claims
}

/// `answer` with the signature requirement added: per node GPU, a finding that a signed,
/// verified row of its compute capability exists (or a no naming what was found).
pub fn require_signed(
    mut answer: Answer,
    node: &Node,
    claims: &SignedClaims,
    key: &PublicKey,
) -> Answer {
    let key_id = key.key_id();
    let short = &key_id[..12.min(key_id.len())];
    if node.gpus.is_empty() {
        answer.findings.push(Finding {
            ok: false,
            subject: format!("signed by key {short}"),
            what: "cannot be checked: the node's GPUs are not known".to_string(),
            hint: Some("give the node's GPUs (--gpu NAME, --cc X.Y) or --detect".to_string()),
        });
        answer.fits = Fit::No;
        return answer;
    }
    for gpu in &node.gpus {
        let cc = format!(
            "{}.{}",
            gpu.compute_capability.major, gpu.compute_capability.minor
        );
        let row = claims.verified_row(Some(&cc));
        let subject = format!(
            "{} (sm_{}) signed by key {short}",
            gpu.name,
            cc.replace('.', "")
        );
        match row {
            Some(row) => answer.findings.push(Finding {
                ok: true,
                subject,
                what: format!(
                    "a signed verification attestation: verified on {} with driver {} on {}",
                    row.gpu, row.driver, row.date
                ),
                hint: None,
            }),
            None => {
                let seen: Vec<String> = claims
                    .verifications
                    .iter()
                    .flat_map(|p| {
                        p.matrix
                            .iter()
                            .map(|r| format!("{} ({})", r.gpu, r.compute_capability))
                    })
                    .collect();
                answer.findings.push(Finding {
                    ok: false,
                    subject,
                    what: if seen.is_empty() {
                        let mut what = "no verification attestation signed by this key is about this image".to_string();
                        if let Some(first) = claims.rejected.first() {
                            what.push_str(&format!(" ({} other bundle(s) did not count; first: {first})", claims.rejected.len()));
                        }
                        what
                    } else {
                        format!("the signed verifications cover other GPU classes only: {}", seen.join(", "))
                    },
                    hint: Some("verify the image on a GPU of this class and sign the result (`cudastack verify IMAGE --sign-key KEY`), or check with the key that signed it".to_string()),
                });
            }
        }
    }
    if answer.findings.iter().any(|f| !f.ok) {
        answer.fits = Fit::No;
        answer.unknown_because = None;
    }
    answer
}
