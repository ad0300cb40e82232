//! The load stage: an image of an OCI layout into the Docker daemon, tagged (`build --load`
//! and `cudastack load`). Streaming the layout into the daemon is `engine`'s.

use std::path::Path;

use crate::engine::{split_tag, Engine, LoadReport};
use crate::stack::human_bytes;

use super::{PipelineError, Progress};

/// Check the tags, connect and load, with a status line before and after. A tag the
/// daemon would refuse is an error before anything is said about loading or any daemon
/// is contacted.
pub async fn load(
    layout: &Path,
    ref_name: &str,
    tags: &[String],
    progress: &dyn Progress,
) -> Result<LoadReport, PipelineError> {
    for tag in tags {
        split_tag(tag)?;
    }
    let engine = Engine::connect().await?;
    progress.status(&format!(
        "loading {}:{ref_name} into the Docker daemon at {}",
        layout.display(),
        engine.host()
    ));
    let report = engine.load_layout(layout, ref_name, tags).await?;
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
