//! Recording a cluster run (`cudastack verify IMAGE --from-log LOG`): the report the job's
//! log holds, recorded as if it had run here, in a layout ([`crate::verify::record`]) or on
//! the image in its registry.
//!
//! On a registry, the report becomes a referrer of the image, and a verified report a
//! `-verified` tag on a labelled copy of it, without pulling the image.
//! Only the manifest and the config are read; the verified manifest names the same layer
//! descriptors in the same repository, so the new config and the report artifact are the
//! only blobs uploaded (a 10 GB image is recorded in a few kilobytes). The order makes a
//! failure safe: the report referrer first, then the config, and the tag last, so a
//! registry that fails midway leaves no `-verified` tag naming a half-written image. A tag
//! that names a multi-platform index is never replaced by one platform's image: the
//! verified image is then pushed by digest only.
//! The labels are [`crate::verify::record`]'s, the same as a layout's verified image gets.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::digest::Digest;
use crate::labels;
use crate::registry::referrers::{push_referrer, ArtifactLayer, Subject};
use crate::registry::{ClientOptions, Manifest, Reference, RegistryClient, RegistryError};
use crate::sign::key::SigningKey;
use crate::verify::record::{
    check_report_image, config_labels, matrix_rows, report_annotations, verified_documents,
    verified_labels, RecordError, Recorded,
};
use crate::verify::report::{Report, RunnerFacts, Verdict};
use crate::verify::REPORT_ARTIFACT_TYPE;

use super::image_source::ImageSource;
use super::{PipelineError, Progress};

/// The report in a cluster job's log (`log_name` names the log in messages): the image is
/// the one its `cudastack-image-v1` line names (the report line's parser drops any `image`
/// or `runner` the line carried: the probe writes neither), and the runner says that no
/// host witnessed the run.
pub fn report_from_log(text: &str, log_name: &str) -> Result<Report, PipelineError> {
    let mut report = Report::from_output(text, &format!("log {log_name}"))?;
    report.image = crate::verify::record::image_in_log(text)?;
    report.runner = Some(RunnerFacts {
        kind: "cluster".to_string(),
        cudastack_version: env!("CARGO_PKG_VERSION").to_string(),
        gpus_requested: "see the job".to_string(),
        engine: None,
        // No host watched this run, so nothing here is its testimony.
        note: Some(format!(
            "not host-witnessed: recorded from {log_name}, a log made elsewhere (no nonce, no comparison with the GPUs a host gave the probe)"
        )),
        witness: None,
    });
    Ok(report)
}

/// Record a log's `report` on the image at `destination`: in its layout (its statement
/// stored and, with `key`, signed), or on the image in its registry. A signature says
/// "this image passed", so with a key the report must name the image, and only a layout
/// is signed here (what is signed is then what was checked).
pub async fn record_log(
    report: &Report,
    destination: &ImageSource,
    key: Option<&SigningKey>,
    progress: &dyn Progress,
) -> Result<Recorded, PipelineError> {
    match destination {
        ImageSource::Layout { dir, ref_name } => {
            if key.is_some() {
                let digest = crate::oci::layout::resolve(dir, ref_name)?.manifest_digest;
                check_report_image(report, ref_name, &digest, true)?;
            }
            let recorded = crate::verify::record::record_in_layout(dir, ref_name, report)?;
            super::attest::after_run(dir, ref_name, report, &recorded, key, progress)?;
            Ok(recorded)
        }
        ImageSource::Registry { .. } if key.is_some() => Err(PipelineError::SignRemoteLog),
        ImageSource::Registry { reference, client } => {
            Ok(record_in_registry(reference, report, (**client).clone(), progress).await?)
        }
        ImageSource::Daemon { reference } => Err(PipelineError::DaemonKeepsNoReferrers {
            image: reference.clone(),
        }),
    }
}

/// Configs are small JSON documents; more than this is not an image config.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What stops recording on a registry image.
#[derive(Debug, thiserror::Error)]
pub enum RemoteRecordError {
    #[error("`{reference}` is a multi-platform image index; a report is about one platform's image\n  hint: record it on the image the job ran, by digest (`REPOSITORY@sha256:…`, as the job's header prints it)")]
    Index { reference: String },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Reference(#[from] crate::reference::ReferenceError),
    /// Boxed: a registry error names its URL and would make every `Result` large.
    #[error(transparent)]
    Registry(Box<RegistryError>),
}

impl From<RegistryError> for RemoteRecordError {
    fn from(error: RegistryError) -> Self {
        RemoteRecordError::Registry(Box::new(error))
    }
}

/// Record `report` (from a cluster job's log) on the image `reference` names in its
/// registry: check the report is about that image, push it as a referrer, and on a
/// verified report push the labelled image under the `-verified` tag (by digest only when
/// `reference` has no tag).
pub async fn record_in_registry(
    reference: &Reference,
    report: &Report,
    client_options: ClientOptions,
    progress: &dyn Progress,
) -> Result<Recorded, RemoteRecordError> {
    let client = RegistryClient::new(reference, client_options)?;
    let manifest = client.get_manifest(reference).await?;
    if manifest.is_index() {
        return Err(RemoteRecordError::Index {
            reference: reference.to_string(),
        });
    }
    check_report_image(report, &reference.to_string(), &manifest.digest, true)?;
    let report_bytes = report.to_json();
    let report_digest = Digest::of_bytes(&report_bytes);
    let subject = Subject {
        media_type: manifest.media_type.clone(),
        digest: manifest.digest,
        size: manifest.bytes.len() as u64,
    };
    let layer = ArtifactLayer {
        media_type: REPORT_ARTIFACT_TYPE.to_string(),
        bytes: report_bytes.into(),
        annotations: Default::default(),
    };
    let referrer = push_referrer(
        &client,
        reference,
        &subject,
        REPORT_ARTIFACT_TYPE,
        vec![layer],
        report_annotations(report),
    )
    .await?;
    let repository = reference.without_digest().with_digest(referrer.digest);
    progress.status(&format!(
        "pushed the verification report as a referrer of {}: {}",
        manifest.digest, referrer.digest
    ));
    let verdict = report.verdict();
    let mut recorded = Recorded {
        verdict: verdict.clone(),
        report_digest,
        report_ref: repository.to_string(),
        verified_manifest: None,
        verified_refs: Vec::new(),
        ran: None,
        verified: None,
        verified_image: None,
    };
    if verdict != Verdict::Verified {
        return Ok(recorded);
    }
    let mut target = verified_target(reference)?;
    if let Some(index) = multi_platform_tag(&client, reference, &target).await? {
        // One platform's verified image must not replace a multi-platform tag: the other
        // platforms' nodes would pull an image for the wrong architecture.
        progress.status(&format!(
            "`{index}` is a multi-platform image index: the verified image is pushed by digest, not tagged"
        ));
        target = untagged(reference)?;
    }
    let (digest, pushed) = push_verified(
        &client,
        reference,
        &manifest,
        &target,
        report,
        &report_digest,
    )
    .await?;
    recorded.verified_manifest = Some(digest);
    recorded.verified_refs = vec![pushed];
    Ok(recorded)
}

/// Where the verified image goes: `repo:TAG-verified` (a `-verified` tag stays itself, so
/// a second GPU type adds to it), or, for a reference without a tag, by digest only.
fn verified_target(reference: &Reference) -> Result<Reference, crate::reference::ReferenceError> {
    match reference.tag() {
        Some(tag) if tag.ends_with("-verified") || tag == "verified" => {
            Ok(reference.with_tag(tag)?)
        }
        Some(tag) => Ok(reference.with_tag(&format!("{tag}-verified"))?),
        None => untagged(reference),
    }
}

/// The repository alone: a manifest PUT to it goes by the digest of its bytes.
fn untagged(reference: &Reference) -> Result<Reference, crate::reference::ReferenceError> {
    Reference::new(reference.registry(), reference.repository(), None, None)
}

/// The tag of REF or of the `-verified` target, when one of them holds an image index now.
async fn multi_platform_tag(
    client: &RegistryClient,
    reference: &Reference,
    target: &Reference,
) -> Result<Option<String>, RemoteRecordError> {
    for tagged in [reference.without_digest(), target.clone()] {
        if tagged.tag().is_none() {
            continue;
        }
        match client.get_manifest(&tagged).await {
            Ok(manifest) if manifest.is_index() => return Ok(Some(tagged.to_string())),
            Ok(_) | Err(RegistryError::ManifestNotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(None)
}

/// Upload the labelled config and put the verified manifest under `target`; returns its
/// digest and the reference it was pushed as.
async fn push_verified(
    client: &RegistryClient,
    reference: &Reference,
    manifest: &Manifest,
    target: &Reference,
    report: &Report,
    report_digest: &Digest,
) -> Result<(Digest, String), RemoteRecordError> {
    let repository = reference.repository();
    let config = read_config(client, reference, manifest).await?;
    let mut labels = config_labels(&config.1);
    // Rows already recorded on the -verified image of the same layers (another GPU type)
    // are kept: verified_labels accumulates over them.
    let mut earlier = labels.clone();
    if target.tag().is_some() {
        if let Some(matrix) = earlier_matrix(client, target, manifest).await? {
            earlier.insert(labels::VERIFIED_MATRIX.to_string(), matrix);
        }
    }
    labels.extend(verified_labels(
        &earlier,
        matrix_rows(report, report_digest)?,
    ));
    let (config_bytes, manifest_bytes) = verified_documents(&manifest.bytes, &config.0, &labels)?;
    client
        .put_blob_bytes(repository, Bytes::from(config_bytes))
        .await?;
    let digest = client
        .put_manifest(target, &manifest.media_type, Bytes::from(manifest_bytes))
        .await?;
    let pushed = match target.tag() {
        Some(_) => target.pinned(digest).to_string(),
        None => target.with_digest(digest).to_string(),
    };
    Ok((digest, pushed))
}

/// The config of an image manifest: its bytes and its JSON.
async fn read_config(
    client: &RegistryClient,
    reference: &Reference,
    manifest: &Manifest,
) -> Result<(Bytes, serde_json::Value), RemoteRecordError> {
    let document = |detail: String| RecordError::Document {
        what: reference.to_string(),
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&manifest.bytes).map_err(|e| document(e.to_string()))?;
    let digest: Digest = value["config"]["digest"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .map_err(|e: crate::digest::DigestError| document(format!("config digest: {e}")))?;
    let bytes = client
        .get_blob_bytes(reference.repository(), &digest, MAX_CONFIG_BYTES)
        .await?;
    let config = serde_json::from_slice(&bytes).map_err(|e| document(e.to_string()))?;
    Ok((bytes, config))
}

/// The verified matrix of the image now at `target`, when it is a verified copy of the
/// same layers; None when there is none or it is another image.
async fn earlier_matrix(
    client: &RegistryClient,
    target: &Reference,
    manifest: &Manifest,
) -> Result<Option<String>, RemoteRecordError> {
    let existing = match client.get_manifest(target).await {
        Ok(existing) if !existing.is_index() => existing,
        Ok(_) | Err(RegistryError::ManifestNotFound { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let layers = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .map(|value| value["layers"].clone())
            .ok()
    };
    if layers(&existing.bytes).is_none() || layers(&existing.bytes) != layers(&manifest.bytes) {
        return Ok(None);
    }
    let (_, config) = read_config(client, target, &existing).await?;
    let labels: BTreeMap<String, String> = config_labels(&config);
    Ok(labels.get(labels::VERIFIED_MATRIX).cloned())
}
