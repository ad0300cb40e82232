//! The read half of `check --require-signed-by KEY` and `verify --emit --require-signed-by
//! KEY`: the verifications KEY signed about an image, from the signature bundles stored
//! beside it (a layout's index, or the registry's referrers within the per-image budget),
//! and the bundles that went unread. What counts as enough is each caller's: `check`
//! compares the node's GPU classes ([`require_signed`]), `verify --emit` the job's. Only
//! bundles are fetched: an SBOM or an unsigned statement never counts.

use crate::attest::policy::{signed_verifications as claims_in, SignedClaims};
use crate::digest::Digest;
use crate::registry::referrers::{ArtifactTypes, SkippedReferrer};
use crate::sign::bundle::MEDIA_TYPE as BUNDLE;
use crate::sign::key::PublicKey;
use crate::verify::check::{Answer, Fit, Node};

use super::image_source::{read_referrers, ImageSource};
use super::PipelineError;

/// What the bundles of an image say for a key, and which were not read.
#[derive(Debug, Default)]
pub struct SignedVerifications {
    pub claims: SignedClaims,
    /// Bundles (or referrers of an unknown type) not read: over the budget, or unreadable.
    /// An unread bundle is not a signature: callers fail closed.
    pub unread: Vec<SkippedReferrer>,
    /// When the budget ran out: the line naming the registry, the image and the limit.
    pub over_budget: Option<String>,
}

/// The verifications `key` signed about the manifest `subject` at `source`.
pub async fn signed_verifications(
    source: ImageSource,
    subject: &Digest,
    key: &PublicKey,
) -> Result<SignedVerifications, PipelineError> {
    let read = read_referrers(source, subject, ArtifactTypes::Only(&[BUNDLE])).await?;
    let bundles = read
        .referrers
        .iter()
        .filter(|r| r.artifact_type == BUNDLE)
        .map(|r| (r.location.clone(), r.blob.as_slice()));
    Ok(SignedVerifications {
        claims: claims_in(bundles, subject, key),
        unread: read.skipped,
        over_budget: read.over_budget,
    })
}

/// `check --require-signed-by KEY`: `answer` (from the image's labels) held to the
/// verifications KEY signed about the image for the node's GPU classes
/// ([`crate::attest::policy::require_signed`]). A requirement that failed while bundles
/// went unread (over the budget, or unreadable) is unknown, not no: the unread ones may
/// hold the signature. Never yes: a skipped bundle can only remove evidence, so it fails
/// closed. A no that the labels already gave stays no.
pub fn require_signed(
    answer: Answer,
    node: &Node,
    signed: &SignedVerifications,
    key: &PublicKey,
) -> Answer {
    let before = answer.fits;
    let mut answer = crate::attest::policy::require_signed(answer, node, &signed.claims, key);
    if answer.fits != Fit::No
        || before == Fit::No
        || node.gpus.is_empty()
        || signed.unread.is_empty()
    {
        return answer;
    }
    answer.fits = Fit::Unknown;
    answer.unknown_because = Some(format!(
        "no signed verification was found in the bundles read, and {} referrer(s) were not read ({}): the signature cannot be confirmed",
        signed.unread.len(),
        signed
            .over_budget
            .clone()
            .unwrap_or_else(|| signed.unread[0].why.clone())
    ));
    answer
}
