//! The load stage: an image of an OCI layout into the Docker daemon, tagged (`build --load`
//! and `cudastack load`). Streaming the image into the daemon is `engine`'s.

use std::path::Path;

use crate::engine::load::layout_tags;
use crate::engine::{split_tag, Engine, LoadReport};
use crate::oci::layout::LayoutImage;
use crate::stack::human_bytes;

use super::{PipelineError, Progress};

/// Load `image` under `tags`. A tag the daemon would refuse is an error before anything is
/// said about loading or any daemon is contacted.
pub async fn load(
    image: &LayoutImage,
    tags: &[String],
    progress: &dyn Progress,
) -> Result<LoadReport, PipelineError> {
    check_tags(tags)?;
    let engine = Engine::connect().await?;
    load_with(&engine, image, tags, progress).await
}

/// `cudastack load`: the image `ref_name` of the layout at `dir`, under `tags` or, when
/// none are given, the tags the layout records for it. What can be checked here fails
/// before the daemon is reached: given tags first, or else the layout (read for its tags).
pub async fn load_from_layout(
    dir: &Path,
    ref_name: &str,
    tags: Option<&[String]>,
    progress: &dyn Progress,
) -> Result<LoadReport, PipelineError> {
    let (image, tags) = match tags {
        Some(tags) => {
            check_tags(tags)?;
            let engine = Engine::connect().await?;
            let image = LayoutImage::open(dir, ref_name)?;
            return load_with(&engine, &image, tags, progress).await;
        }
        None => {
            let image = LayoutImage::open(dir, ref_name)?;
            let tags = layout_tags(&image);
            (image, tags)
        }
    };
    let engine = Engine::connect().await?;
    load_with(&engine, &image, &tags, progress).await
}

fn check_tags(tags: &[String]) -> Result<(), PipelineError> {
    for tag in tags {
        split_tag(tag)?;
    }
    Ok(())
}

/// Load with a status line before and after.
async fn load_with(
    engine: &Engine,
    image: &LayoutImage,
    tags: &[String],
    progress: &dyn Progress,
) -> Result<LoadReport, PipelineError> {
    progress.status(&format!(
        "loading {}:{} into the Docker daemon at {}",
        image.dir.display(),
        image.ref_name,
        engine.host()
    ));
    let report = engine
        .load_stored(&image.image, tags, &image.dir.display().to_string())
        .await?;
    if report.skipped {
        progress.status(&format!(
            "the daemon already has {}; tagged in {:.2}s",
            report.image_id, report.seconds
        ));
    } else {
        progress.status(&format!(
            "loaded {} in {:.1}s ({}/s)",
            human_bytes(report.bytes),
            report.seconds,
            human_bytes(report.throughput() as u64)
        ));
    }
    Ok(report)
}
