//! The verification stage of the pipeline: run the probe on the built image as the
//! recipe's `verify.gpu` asks, through the verification cache; a failed check fails the
//! build. The probe itself, the report and its recording are `verify`'s.

use std::path::Path;

use crate::digest::Digest;
use crate::engine::run::GpuRequest;
use crate::engine::Engine;
use crate::recipe::GpuPolicy;
use crate::stack::BuildReport;
use crate::verify::report::Verdict;
use crate::verify::runner::{
    verify_image, verify_layout, GpuChoice, VerifyOutcome, VerifySettings,
};

use super::{PipelineError, Progress};

/// The verification stage of `cudastack build`: `auto` runs the probe when a Docker daemon
/// is reachable (on GPUs when there are any, else the static level) and says so when none
/// is; `required` fails without a GPU; `skip` runs nothing. A build without an image of
/// this host's platform is not verified here (Docker runs images of its own platform).
///
/// `keep_loaded`: a load of the verified image follows, so an untagged image the probe ran
/// in stays loaded for it (its layers go to Docker once); the caller removes it with
/// [`remove_left_loaded`].
pub async fn after_build(
    built: &BuildReport,
    policy: GpuPolicy,
    cache_root: &Path,
    keep_loaded: bool,
    progress: &dyn Progress,
) -> Result<Option<VerifyOutcome>, PipelineError> {
    let Some(host_image) = &built.host_image else {
        let platforms: Vec<&str> = built
            .platforms
            .iter()
            .map(|p| p.platform.as_str())
            .collect();
        progress.status(&format!(
            "verify  skipped: this build has no image for this host ({}); verify it on a {} machine",
            crate::platform::host_cpu(),
            platforms.join(" or ")
        ));
        return Ok(None);
    };
    let gpus = match policy {
        GpuPolicy::Skip => {
            progress.status("verify  skipped: the recipe says verify.gpu: skip");
            return Ok(None);
        }
        GpuPolicy::Auto => GpuChoice::Auto,
        GpuPolicy::Required => GpuChoice::Required(GpuRequest::All),
    };
    let engine = match Engine::connect().await {
        Ok(engine) => engine,
        Err(error) if policy == GpuPolicy::Auto => {
            progress.status(&format!(
                "verify  skipped: {}",
                error.to_string().lines().next().unwrap_or_default()
            ));
            return Ok(None);
        }
        Err(error) => return Err(error.into()),
    };
    progress.status(&format!(
        "verify  running the probe in a container ({})",
        engine.host()
    ));
    let settings = VerifySettings {
        gpus,
        cache: Some(cache_root.to_path_buf()),
        keep_loaded,
        ..VerifySettings::default()
    };
    // The probe's image keeps the names someone asked for (as `docker build -t` leaves its
    // result); under the default name alone it would be left in Docker by every build.
    let tags = match built.named_by_default {
        true => Vec::new(),
        false => crate::engine::load::layout_tags(host_image),
    };
    let outcome = verify_image(&engine, host_image, &tags, &settings).await?;
    let left_loaded = outcome.left_loaded;
    let judged = judge(outcome, &built.layout, progress);
    if judged.is_err() {
        remove_left_loaded(left_loaded, None).await;
    }
    judged.map(Some)
}

/// Remove the image the probe left loaded for a load ([`VerifySettings::keep_loaded`]),
/// unless it is the image that load left (`loaded`): its layers stay, held by that image.
pub async fn remove_left_loaded(left_loaded: Option<Digest>, loaded: Option<&Digest>) {
    let Some(id) = left_loaded.filter(|id| Some(id) != loaded) else {
        return;
    };
    if let Ok(engine) = Engine::connect().await {
        if let Err(error) = engine.remove_image(&id.to_string()).await {
            tracing::warn!("the image {id} the verification loaded was not removed: {error}");
        }
    }
}

/// `cudastack verify`: run the probe on `ref_name` of `layout` through the Docker daemon
/// with `settings`, and say what was cleaned up or taken from the cache.
pub async fn verify(
    layout: &Path,
    ref_name: &str,
    settings: &VerifySettings,
    progress: &dyn Progress,
) -> Result<VerifyOutcome, PipelineError> {
    let engine = Engine::connect().await?;
    progress.status(&format!(
        "verifying oci:{}:{ref_name} through the Docker daemon at {}",
        layout.display(),
        engine.host()
    ));
    let outcome = verify_layout(&engine, layout, ref_name, settings).await?;
    for line in housekeeping(&outcome) {
        progress.status(&line);
    }
    Ok(outcome)
}

/// Show the report and pass the outcome on, unless a check failed.
fn judge(
    outcome: VerifyOutcome,
    layout: &Path,
    progress: &dyn Progress,
) -> Result<VerifyOutcome, PipelineError> {
    for line in housekeeping(&outcome) {
        progress.status(&line);
    }
    progress.verification(&outcome.report);
    match outcome.report.verdict() {
        Verdict::Failed { checks } => Err(PipelineError::VerificationFailed {
            checks,
            report_ref: outcome.recorded.report_ref,
            layout: layout.to_path_buf(),
        }),
        Verdict::Verified => {
            progress.status(&format!(
                "verify  verified: {}",
                outcome.recorded.verified_refs.join(", ")
            ));
            Ok(outcome)
        }
        Verdict::Partial { reason } => {
            progress.status(&format!(
                "verify  static level passed; no verified label: {reason}"
            ));
            Ok(outcome)
        }
    }
}

/// The status lines of a verification beside its report: the orphaned containers removed,
/// and a cached report used instead of a run.
fn housekeeping(outcome: &VerifyOutcome) -> Vec<String> {
    let mut lines: Vec<String> = outcome
        .reaped
        .iter()
        .map(|reaped| {
            format!(
                "removed container {} ({}) left behind: {}",
                &reaped.id[..reaped.id.len().min(12)],
                reaped.image,
                reaped.reason
            )
        })
        .collect();
    if let Some(date) = &outcome.cached {
        let digest = outcome
            .report
            .image
            .as_ref()
            .and_then(|image| image.manifest_digest.as_deref())
            .unwrap_or("the image");
        lines.push(format!(
            "verification: cached report of {date} for {digest}"
        ));
    }
    lines
}
