//! The in-toto Statement (v1): what every attestation cudastack writes says, whatever its
//! predicate: these subjects (images, by manifest digest) have this predicate.
//! <https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md>

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AttestError;
use crate::digest::Digest;

/// `_type` of the statements cudastack writes.
pub const STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";
/// `_type` cosign 2/3 still writes; read, never written.
pub const STATEMENT_V01: &str = "https://in-toto.io/Statement/v0.1";
/// The DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// A statement is a few hundred KiB at most (an SBOM predicate of a large image).
pub const MAX_STATEMENT_BYTES: usize = 32 << 20;

/// One thing a statement is about: an image manifest, named by its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: SubjectDigest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectDigest {
    /// Hex, as in-toto's DigestSet writes it (no `sha256:` prefix).
    pub sha256: String,
}

impl Subject {
    pub fn image(name: &str, digest: &Digest) -> Self {
        Subject {
            name: name.to_string(),
            digest: SubjectDigest {
                sha256: digest.hex(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Value,
}

impl Statement {
    pub fn new(subject: Vec<Subject>, predicate_type: &str, predicate: Value) -> Self {
        Statement {
            statement_type: STATEMENT_V1.to_string(),
            subject,
            predicate_type: predicate_type.to_string(),
            predicate,
        }
    }

    /// The canonical bytes: what is signed and stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::canonical::to_canonical_json(self).expect("a statement serialises")
    }

    /// Parse a statement, refusing what is not one (another `_type`, no subject, a subject
    /// whose sha256 is not 64 hex digits).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AttestError> {
        if bytes.len() > MAX_STATEMENT_BYTES {
            return Err(AttestError::Statement(format!(
                "it is {} bytes, more than the {MAX_STATEMENT_BYTES} a statement may be",
                bytes.len()
            )));
        }
        let statement: Statement = serde_json::from_slice(bytes)
            .map_err(|e| AttestError::Statement(format!("not an in-toto statement: {e}")))?;
        if statement.statement_type != STATEMENT_V1 && statement.statement_type != STATEMENT_V01 {
            return Err(AttestError::Statement(format!(
                "its `_type` is `{}`, not `{STATEMENT_V1}`",
                statement.statement_type
            )));
        }
        if statement.subject.is_empty() {
            return Err(AttestError::Statement("it has no subject".to_string()));
        }
        if let Some(bad) = statement
            .subject
            .iter()
            .find(|s| Digest::from_hex(&s.digest.sha256).is_err())
        {
            return Err(AttestError::Statement(format!(
                "subject `{}` has no valid sha256 digest (`{}`)",
                bad.name, bad.digest.sha256
            )));
        }
        Ok(statement)
    }

    /// Whether the statement is about the manifest `digest`.
    pub fn is_about(&self, digest: &Digest) -> bool {
        self.subject.iter().any(|s| s.digest.sha256 == digest.hex())
    }

    /// The statement with `subject` added, when it is not about that digest yet.
    pub fn with_subject(mut self, subject: Subject) -> Self {
        if !self
            .subject
            .iter()
            .any(|s| s.digest.sha256 == subject.digest.sha256)
        {
            self.subject.push(subject);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement() -> Statement {
        Statement::new(
            vec![Subject::image("x", &Digest::of_bytes(b"image"))],
            "https://example.com/p",
            serde_json::json!({"a": 1}),
        )
    }

    #[test]
    fn round_trips_and_knows_its_subjects() {
        let s = statement();
        let parsed = Statement::from_bytes(&s.to_bytes()).unwrap();
        assert_eq!(parsed, s);
        assert!(parsed.is_about(&Digest::of_bytes(b"image")));
        assert!(!parsed.is_about(&Digest::of_bytes(b"other")));
        let more = parsed.with_subject(Subject::image("y", &Digest::of_bytes(b"other")));
        assert_eq!(more.subject.len(), 2);
        let same = more
            .clone()
            .with_subject(Subject::image("z", &Digest::of_bytes(b"other")));
        assert_eq!(same, more);
    }

    #[test]
    fn refuses_what_is_not_a_statement() {
        for (bytes, expected) in [
            (&b"{"[..], "not an in-toto statement"),
            (
                br#"{"_type":"x","subject":[],"predicateType":"p","predicate":{}}"#,
                "`_type` is `x`",
            ),
            (
                br#"{"_type":"https://in-toto.io/Statement/v1","subject":[],"predicateType":"p","predicate":{}}"#,
                "no subject",
            ),
            (
                br#"{"_type":"https://in-toto.io/Statement/v1","subject":[{"name":"a","digest":{"sha256":"zz"}}],"predicateType":"p","predicate":{}}"#,
                "no valid sha256",
            ),
        ] {
            let error = Statement::from_bytes(bytes).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }
}
