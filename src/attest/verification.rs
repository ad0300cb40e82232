//! The verification attestation: an in-toto statement whose subjects are the image the
//! probe ran in and the verified image recording made of it (same layers, the verified
//! labels added), and whose predicate is the report and the matrix it proves.
//!
//! Predicate type [`PREDICATE_TYPE`] (ours; documented in docs/security.md):
//! `{"verdict": "verified"|"partial"|"failed", "ranImage": "sha256:…",
//!   "report": <the report, as the probe wrote it>, "reportDigest": "sha256:…",
//!   "matrix": [<one row per GPU type and driver, as `io.cudastack.verified.matrix`>]}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::statement::{Statement, Subject};
use super::AttestError;
use crate::digest::Digest;
use crate::verify::record::{matrix_rows, VerifiedOn};
use crate::verify::report::{Report, Verdict};

pub const PREDICATE_TYPE: &str = "https://cudastack.dev/attestation/verification/v1";

/// The predicate of a verification attestation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerificationPredicate {
    pub verdict: String,
    #[serde(rename = "ranImage")]
    pub ran_image: Digest,
    pub report: Value,
    #[serde(rename = "reportDigest")]
    pub report_digest: Digest,
    /// Empty unless the verdict is `verified`.
    pub matrix: Vec<VerifiedOn>,
}

/// The verdict's one word.
pub fn verdict_word(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Verified => "verified",
        Verdict::Partial { .. } => "partial",
        Verdict::Failed { .. } => "failed",
    }
}

/// The statement of one verification run: about `ran` (named `name`) and, when the run
/// made one, the verified image.
pub fn statement(
    name: &str,
    report: &Report,
    ran: &Digest,
    verified: Option<&Digest>,
) -> Statement {
    let report_bytes = report.to_json();
    let report_digest = Digest::of_bytes(&report_bytes);
    let matrix = matrix_rows(report, &report_digest).unwrap_or_default();
    let predicate = VerificationPredicate {
        verdict: verdict_word(&report.verdict()).to_string(),
        ran_image: *ran,
        report: serde_json::from_slice(&report_bytes).unwrap_or(Value::Null),
        report_digest,
        matrix,
    };
    let mut subjects = vec![Subject::image(name, ran)];
    if let Some(verified) = verified.filter(|v| *v != ran) {
        subjects.push(Subject::image(name, verified));
    }
    Statement::new(
        subjects,
        PREDICATE_TYPE,
        serde_json::to_value(&predicate).expect("the predicate serialises"),
    )
}

impl VerificationPredicate {
    /// The predicate of a statement of [`PREDICATE_TYPE`].
    pub fn of(statement: &Statement) -> Result<Self, AttestError> {
        if statement.predicate_type != PREDICATE_TYPE {
            return Err(AttestError::Statement(format!(
                "its predicate type is `{}`, not `{PREDICATE_TYPE}`",
                statement.predicate_type
            )));
        }
        serde_json::from_value(statement.predicate.clone()).map_err(|e| {
            AttestError::Statement(format!("its verification predicate does not parse: {e}"))
        })
    }
}
