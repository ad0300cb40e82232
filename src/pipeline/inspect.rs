//! What `inspect` answers about an image, wherever it lives: its documents, what its
//! config declares (recipe, versions, driver floor, kernels, lineage), the verification
//! report stored beside it in a layout, and its referrers (SBOM, provenance, statements),
//! each described and, with a key, its signature checked. Only documents and referrers are
//! read, never a layer. Rendering it is the binary's.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::attest::describe::{describe, ReferrerSummary};
use crate::recipe::Platform;
use crate::registry::referrers::{ArtifactTypes, SkippedReferrer};
use crate::sign::key::PublicKey;
use crate::verify::check::{labels_and_env, ImageClaims};
use crate::verify::record::{image_ref, report_ref};
use crate::verify::source::ImageDocuments;

use super::image_source::{read_documents, read_referrers, ImageSource, ReadReferrers};
use super::PipelineError;

/// An image inspected. Serialised as `inspect --json`.
#[derive(Debug, Serialize)]
pub struct Inspection {
    #[serde(flatten)]
    pub documents: ImageDocuments,
    pub declared: ImageClaims,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// The name of the verification report stored beside the image (a layout's only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_ref: Option<String>,
    /// The SBOM, provenance and statements stored as referrers of the image.
    pub referrers: Vec<ReferrerSummary>,
    /// Referrers of the types read that were not read: over the per-image budget, or
    /// unreadable.
    pub referrers_skipped: Vec<SkippedReferrer>,
    /// Referrers of types cudastack does not read: listed, never fetched.
    pub referrers_of_other_types: usize,
    /// When the referrers' budget ran out: the line naming the registry, the image and the
    /// limit.
    #[serde(skip)]
    pub over_budget: Option<String>,
}

/// Inspect the image at `source` (of `platform`'s image when it names a multi-platform
/// one; default: this machine's), checking signed statements with `key` when given.
pub async fn inspect(
    source: &ImageSource,
    platform: Option<Platform>,
    key: Option<&PublicKey>,
) -> Result<Inspection, PipelineError> {
    let documents = read_documents(source.clone(), platform).await?;
    let config = documents.config.config().clone().unwrap_or_default();
    let (labels, env) = labels_and_env(&config);
    let declared = ImageClaims::from_image(&documents.config);
    let report_ref = match source {
        ImageSource::Layout { dir, ref_name } => {
            let name = report_ref(&image_ref(dir, ref_name)?);
            crate::oci::layout::list_refs(dir)?
                .contains(&name)
                .then_some(name)
        }
        ImageSource::Registry { .. } | ImageSource::Daemon { .. } => None,
    };
    // Every type cudastack reads, within the per-image budget. An image known by no
    // manifest (a daemon's) has none.
    let (read, referrers) = match &documents.manifest_digest {
        Some(subject) => {
            let read = read_referrers(
                source.clone(),
                subject,
                ArtifactTypes::Only(super::attest::KNOWN_REFERRER_TYPES),
            )
            .await?;
            let referrers = read
                .referrers
                .iter()
                .map(|r| {
                    describe(
                        &r.location,
                        r.kind.as_deref(),
                        &r.artifact_type,
                        &r.blob,
                        subject,
                        key,
                    )
                })
                .collect();
            (read, referrers)
        }
        None => (ReadReferrers::default(), Vec::new()),
    };
    Ok(Inspection {
        documents,
        declared,
        env,
        labels,
        report_ref,
        referrers,
        referrers_skipped: read.skipped,
        referrers_of_other_types: read.other_types,
        over_budget: read.over_budget,
    })
}
