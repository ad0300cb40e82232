//! The push stage: an image of an OCI layout to a registry (`build --push` and
//! `cudastack push`), with cross-repository mounts from the push history, then the
//! verification reports stored in the layout as referrers of what was pushed. The upload
//! protocol is `registry`'s; this module decides what goes up and in which order.

use std::path::{Path, PathBuf};

use crate::digest::Digest;
use crate::oci::layout;
use crate::registry::referrers::{push_referrer, ArtifactLayer, Subject};
use crate::registry::{
    push_layout, BlobOutcome, ClientOptions, PushHistory, PushOptions, PushReport, Reference,
    RegistryClient,
};
use crate::verify::record::{report_ref, stored_report};
use crate::verify::REPORT_ARTIFACT_TYPE;

use super::{PipelineError, Progress};

/// Upload tuning.
#[derive(Debug, Clone)]
pub struct PushSettings {
    /// Blobs uploaded at the same time.
    pub parallel: usize,
    /// Blobs larger than this (MiB) are sent in chunks of this size.
    pub chunk_mib: u64,
    /// Repositories of the same registry to mount shared layers from, besides the ones
    /// the push history knows.
    pub mount_from: Vec<String>,
    /// The cache directory whose `registry/push-history.json` is the push history.
    pub cache_root: PathBuf,
}

impl PushSettings {
    /// The defaults of `push` (and all of `build --push`): 3 blobs at a time, 64 MiB chunks.
    pub fn defaults(cache_root: PathBuf) -> Self {
        PushSettings {
            parallel: 3,
            chunk_mib: 64,
            mount_from: Vec::new(),
            cache_root,
        }
    }
}

/// One verification report to push, and the manifest it is about.
pub struct ReportReferrer {
    pub report: Vec<u8>,
    pub subject: Subject,
}

/// Push `ref_name` of `layout` to `reference`, remember the repository for later mounts,
/// push the verification reports as referrers, and say what was sent.
pub async fn push(
    layout: &Path,
    ref_name: &str,
    reference: &Reference,
    settings: &PushSettings,
    client_options: ClientOptions,
    progress: &dyn Progress,
) -> Result<PushReport, PipelineError> {
    let client = RegistryClient::new(reference, client_options)?;
    let history_path = settings
        .cache_root
        .join("registry")
        .join("push-history.json");
    let mut history = PushHistory::load(&history_path);
    let options = PushOptions {
        parallel: settings.parallel.max(1),
        chunk_size: settings.chunk_mib.max(1) << 20,
        mount_from: mount_sources(&settings.mount_from, &history, reference),
    };
    progress.status(&format!("pushing {} to {reference}", layout.display()));
    let report = push_layout(&client, layout, ref_name, reference, &options).await?;
    history.record(reference.registry(), reference.repository());
    if let Err(error) = history.save(&history_path) {
        tracing::warn!(%error, "could not save the push history");
    }
    for referrer in report_referrers(layout, ref_name, report.manifest_digest)? {
        push_report(&client, reference, referrer, progress).await?;
    }
    progress.status(&summary(&report));
    Ok(report)
}

/// The repositories to try mounts from: the ones asked for, then those of the same
/// registry cudastack pushed to before.
fn mount_sources(asked: &[String], history: &PushHistory, reference: &Reference) -> Vec<String> {
    let mut mount_from = asked.to_vec();
    for repository in history.repositories(reference.registry()) {
        if !mount_from.contains(&repository) {
            mount_from.push(repository);
        }
    }
    mount_from
}

/// The verification reports stored beside the image in the layout, each with its subject:
/// the image's own report on the pushed manifest (`pushed`), or for an image index one per
/// platform on the platform's manifest (its report is stored under its platform ref).
pub fn report_referrers(
    dir: &Path,
    ref_name: &str,
    pushed: Digest,
) -> Result<Vec<ReportReferrer>, PipelineError> {
    let Some(children) = layout::index_images(dir, ref_name)? else {
        let Some(report) = stored_report(dir, ref_name)? else {
            return Ok(Vec::new());
        };
        let manifest = layout::resolve(dir, ref_name)?.manifest;
        let subject = Subject {
            media_type: manifest.media_type().to_string(),
            digest: pushed,
            size: manifest.size(),
        };
        return Ok(vec![ReportReferrer { report, subject }]);
    };
    let mut referrers = Vec::new();
    for (child, platform) in children {
        let name = layout::platform_ref_name(ref_name, &platform.architecture().to_string());
        let Some(report) = layout::read_artifact_blob(dir, &report_ref(&name))? else {
            continue;
        };
        let subject = Subject {
            media_type: child.media_type().to_string(),
            digest: crate::oci::digest_of(&child).map_err(PipelineError::Descriptor)?,
            size: child.size(),
        };
        referrers.push(ReportReferrer { report, subject });
    }
    Ok(referrers)
}

/// One report to the registry as an OCI artifact whose `subject` is the manifest it is
/// about (found through the referrers API, or the `sha256-<hex>` fallback tag on
/// registries without it).
async fn push_report(
    client: &RegistryClient,
    reference: &Reference,
    referrer: ReportReferrer,
    progress: &dyn Progress,
) -> Result<(), PipelineError> {
    let layer = ArtifactLayer {
        media_type: REPORT_ARTIFACT_TYPE.to_string(),
        bytes: referrer.report.into(),
        annotations: Default::default(),
    };
    let pushed = push_referrer(
        client,
        reference,
        &referrer.subject,
        REPORT_ARTIFACT_TYPE,
        vec![layer],
        Default::default(),
    )
    .await?;
    progress.status(&format!(
        "pushed the verification report as a referrer of {}: {}",
        referrer.subject.digest, pushed.digest
    ));
    Ok(())
}

/// The last status line of a push: blobs by outcome, bytes sent and the rate.
fn summary(report: &PushReport) -> String {
    let count = |outcome| report.blobs.iter().filter(|b| b.outcome == outcome).count();
    format!(
        "pushed {} blobs in {:.1}s: {} uploaded, {} resumed, {} mounted, {} already present; {:.1} MB sent ({:.1} MB/s)",
        report.blobs.len(),
        report.seconds,
        count(BlobOutcome::Uploaded),
        count(BlobOutcome::Resumed),
        count(BlobOutcome::Mounted),
        count(BlobOutcome::Present),
        report.bytes_uploaded as f64 / 1e6,
        report.bytes_uploaded as f64 / 1e6 / report.seconds.max(1e-3),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_come_from_the_asked_repositories_then_the_history_of_that_registry() {
        let mut history = PushHistory::default();
        history.record("registry.example", "team/base");
        history.record("registry.example", "team/torch");
        history.record("elsewhere.example", "other/repo");
        let reference: Reference = "registry.example/team/new:1".parse().unwrap();
        let asked = vec!["team/torch".to_string(), "vendor/cuda".to_string()];
        assert_eq!(
            mount_sources(&asked, &history, &reference),
            ["team/torch", "vendor/cuda", "team/base"]
        );
    }

    #[test]
    fn defaults_are_those_of_push() {
        let settings = PushSettings::defaults(PathBuf::from("/cache"));
        assert_eq!((settings.parallel, settings.chunk_mib), (3, 64));
        assert!(settings.mount_from.is_empty());
    }
}
