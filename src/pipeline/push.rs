//! The push stage: an image of an OCI layout to a registry (`build --push` and
//! `cudastack push`), with cross-repository mounts from the push history, then the
//! verification reports stored in the layout as referrers of what was pushed. The upload
//! protocol is `registry`'s; this module decides what goes up and in which order.

use std::path::{Path, PathBuf};

use oci_spec::image::MediaType;

use crate::digest::Digest;
use crate::oci::layout;
use crate::registry::referrers::{push_referrer, ArtifactLayer, Subject};
use crate::registry::{
    push_layout, BlobOutcome, ClientOptions, PushHistory, PushOptions, PushReport, Reference,
    RegistryClient,
};
use crate::stack::human_bytes;
use crate::verify::record::{report_ref, stored_report};
use crate::verify::REPORT_ARTIFACT_TYPE;

pub use super::early_push::SentWhileBuilding;
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
    let destination = Destination {
        reference,
        settings,
        client_options,
    };
    push_after(
        layout,
        ref_name,
        &destination,
        SentWhileBuilding::default(),
        progress,
    )
    .await
}

/// Where a push goes and how.
pub struct Destination<'a> {
    pub reference: &'a Reference,
    pub settings: &'a PushSettings,
    pub client_options: ClientOptions,
}

/// [`push`] of an image some of whose blobs went up before (`build --push` sends layers
/// while building): those the registry now has are found present and not sent again, and
/// the report counts them as sent, with their bytes.
pub async fn push_after(
    layout: &Path,
    ref_name: &str,
    destination: &Destination<'_>,
    early: SentWhileBuilding,
    progress: &dyn Progress,
) -> Result<PushReport, PipelineError> {
    let Destination {
        reference,
        settings,
        ..
    } = *destination;
    let client = RegistryClient::new(reference, destination.client_options.clone())?;
    let history_path = history_path(settings);
    let mut history = PushHistory::load(&history_path);
    let options = push_options(settings, reference);
    if let Some(warning) = uncompressed_warning(layout, ref_name) {
        progress.status(&warning);
    }
    progress.status(&format!("pushing {} to {reference}", layout.display()));
    let mut report = push_layout(&client, layout, ref_name, reference, &options).await?;
    count_early_uploads(&mut report, early);
    history.record(reference.registry(), reference.repository());
    if let Err(error) = history.save(&history_path) {
        tracing::warn!(%error, "could not save the push history");
    }
    // The referrers' bytes count as sent: the report says what went on the wire.
    for referrer in report_referrers(layout, ref_name, report.manifest_digest)? {
        report.bytes_uploaded += push_report(&client, reference, referrer, progress).await?;
    }
    report.bytes_uploaded +=
        push_attestations(&client, reference, layout, ref_name, progress).await?;
    progress.status(&summary(&report));
    Ok(report)
}

fn history_path(settings: &PushSettings) -> PathBuf {
    crate::cache::CacheDir::new(&settings.cache_root)
        .registry()
        .join("push-history.json")
}

/// The upload options of `settings` for `reference`, with the mount sources of the push
/// history (what `push` and the early uploads of `build --push` both use).
pub(crate) fn push_options(settings: &PushSettings, reference: &Reference) -> PushOptions {
    let history = PushHistory::load(&history_path(settings));
    PushOptions {
        parallel: settings.parallel.max(1),
        chunk_size: settings.chunk_mib.max(1) << 20,
        mount_from: mount_sources(&settings.mount_from, &history, reference),
    }
}

/// The blobs the push found present because the early uploads had sent them take the
/// early outcome (uploaded, resumed, mounted), and their bytes count as sent.
fn count_early_uploads(report: &mut PushReport, early: SentWhileBuilding) {
    // A blob two platforms share is listed once per platform but went up once.
    let mut counted = std::collections::HashSet::new();
    for blob in &mut report.blobs {
        if blob.outcome != BlobOutcome::Present || !counted.insert(blob.digest) {
            continue;
        }
        let sent = early
            .blobs
            .iter()
            .find(|b| b.digest == blob.digest && b.outcome != BlobOutcome::Present);
        if let Some(sent) = sent {
            *blob = sent.clone();
            report.uploaded_while_building += 1;
        }
    }
    report.bytes_uploaded += early.bytes;
}

/// One line when the image has uncompressed layers (`build --load` makes them by default):
/// a registry stores and serves them as they are, so pulls move several times the bytes.
/// They are pushed as they are: compressing them on the way would change the manifest
/// digest that the verification report and the labels name.
fn uncompressed_warning(dir: &Path, ref_name: &str) -> Option<String> {
    let layout = layout::Layout::open(dir).ok()?;
    let entry = layout.entry(ref_name).ok()?;
    let images = if entry.media_type() == &MediaType::ImageIndex {
        let index = layout.child_index(entry).ok()?;
        index
            .manifests()
            .iter()
            .filter_map(|child| layout.image_at(child, None).ok())
            .collect()
    } else {
        vec![layout.image_at(entry, Some(ref_name)).ok()?]
    };
    let uncompressed: Vec<_> = images
        .iter()
        .flat_map(|image| &image.layers)
        .filter(|layer| layer.media_type == MediaType::ImageLayer)
        .collect();
    if uncompressed.is_empty() {
        return None;
    }
    Some(format!(
        "warning: {} of the image's layers in {} are uncompressed ({}), and a registry serves them as they are, so every pull moves the full size; to push a compressed image, build it again with `--compression gzip` (or zstd)",
        uncompressed.len(),
        dir.display(),
        human_bytes(uncompressed.iter().map(|layer| layer.size).sum()),
    ))
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
) -> Result<u64, PipelineError> {
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
    Ok(pushed.bytes_uploaded)
}

/// The SBOM, provenance and verification statements (signed or not) stored in the layout
/// as referrers of the pushed image, or of each platform's image of a pushed index, each
/// pushed as a referrer of the same manifest in the registry. Returns the blob bytes sent.
async fn push_attestations(
    client: &RegistryClient,
    reference: &Reference,
    dir: &Path,
    ref_name: &str,
    progress: &dyn Progress,
) -> Result<u64, PipelineError> {
    let mut sent = 0;
    let images: Vec<oci_spec::image::Descriptor> = match layout::index_images(dir, ref_name)? {
        Some(children) => children.into_iter().map(|(d, _)| d).collect(),
        None => vec![layout::resolve(dir, ref_name)?.manifest],
    };
    let mut pushed = Vec::new();
    for image in images {
        let subject = Subject {
            media_type: image.media_type().to_string(),
            digest: crate::oci::digest_of(&image).map_err(PipelineError::Descriptor)?,
            size: image.size(),
        };
        let referrers = crate::attest::store::referrers_of(dir, &subject.digest)?;
        // This layout's own reports go up through `report_referrers`; pulled ones here.
        for referrer in referrers
            .into_iter()
            .filter(|r| r.fetched || r.artifact_type != REPORT_ARTIFACT_TYPE)
        {
            let layer = ArtifactLayer {
                media_type: referrer.artifact_type.clone(),
                bytes: referrer.blob.into(),
                annotations: Default::default(),
            };
            sent += push_referrer(
                client,
                reference,
                &subject,
                &referrer.artifact_type,
                vec![layer],
                referrer.annotations,
            )
            .await?
            .bytes_uploaded;
            pushed.push(referrer.kind);
        }
    }
    if !pushed.is_empty() {
        progress.status(&format!(
            "pushed {} referrer(s): {}",
            pushed.len(),
            pushed.join(", ")
        ));
    }
    Ok(sent)
}

/// The last status line of a push: blobs by outcome, bytes sent and the rate.
fn summary(report: &PushReport) -> String {
    let count = |outcome| report.blobs.iter().filter(|b| b.outcome == outcome).count();
    let mb = report.bytes_uploaded as f64 / 1e6;
    // Blobs sent while building took the build's time, not the push stage's: no rate then.
    let (while_building, rate) = match report.uploaded_while_building {
        0 => (
            String::new(),
            format!(" ({:.1} MB/s)", mb / report.seconds.max(1e-3)),
        ),
        n => (format!(" ({n} of them while building)"), String::new()),
    };
    format!(
        "pushed {} blobs in {:.1}s: {} uploaded, {} resumed, {} mounted{while_building}, {} already present; {mb:.1} MB sent{rate}",
        report.blobs.len(),
        report.seconds,
        count(BlobOutcome::Uploaded),
        count(BlobOutcome::Resumed),
        count(BlobOutcome::Mounted),
        count(BlobOutcome::Present),
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
