//! The verification stage: prove an image's stack by running it, record what was seen.
//!
//! ```text
//! probe/probe.py  (baked into the config layer at PROBE_PATH, beside EXPECT_PATH)
//!      │  runs inside a container from the image (Docker API + NVIDIA runtime,
//!      │  a Kubernetes Job, or natively), prints `cudastack-report-v1 {json}` last
//!      ▼                  (with the run's nonce when cudastack started it: witness)
//! witness: exactly one report, from this run's probe; no GPU results without a GPU given;
//!          the driver and GPUs it names are the host's
//!      ▼
//! report::Report ──verdict──> Verified | StaticOnly | Failed
//!      │
//! record: on Verified only, a new config (same layers) with io.cudastack.verified.*
//!         labels and the verified tags; the report stored beside the image as an OCI
//!         artifact whose `subject` is the image manifest.
//! check:  "will this image run on this node?" from the config alone (labels and
//!         NVIDIA_REQUIRE_CUDA), so a login node can answer without pulling layers.
//! ```
//!
//! [`crate::probe`] holds the assets the build bakes in (probe.py, the native probe, the
//! expectations document); it sits below the assembler, which computes the expectations and
//! writes them, and below this module, which runs the probe and reads what it printed.
//!
//! The probe is baked in rather than mounted at verify time so that every runner (Docker,
//! a Kubernetes Job, enroot on Slurm) runs the same bytes with nothing to mount; it is a
//! few tens of KiB in the small config layer, and a probe change rebuilds only that layer.
//! The report schema is documented in docs/verify.md.

pub mod cache;
pub mod check;
pub mod derived;
pub mod record;
pub mod report;
pub mod runner;
pub mod source;
pub mod witness;

use crate::probe::{PROBE_INTERPRETER, PROBE_PATH};
/// Prefix of the report line the probe prints last on stdout.
pub const REPORT_PREFIX: &str = "cudastack-report-v1 ";
/// Prefix of the line a cluster job prints before the probe runs: the image it runs, by
/// digest (`cudastack-image-v1 REPO@sha256:…`), so `verify --from-log` can tell which image
/// a log is about (the probe inside cannot know its own manifest digest).
pub const IMAGE_PREFIX: &str = "cudastack-image-v1 ";
/// The OCI artifact type of a stored verification report.
pub const REPORT_ARTIFACT_TYPE: &str = "application/vnd.cudastack.verify.report.v1+json";

/// The command that runs the probe in a container, up to `level`: the base's interpreter
/// by absolute path ([`PROBE_INTERPRETER`]) with `-I -S`, so nothing of the image runs
/// before the probe: `-I` ignores PYTHON*
/// variables and the user's site, `-S` skips `site`, and with it every `.pth` file and
/// `sitecustomize` a package could have installed. The probe adds the site directories
/// to `sys.path` itself, without running their `.pth` files.
pub fn probe_command(level: report::Level) -> Vec<String> {
    vec![
        PROBE_INTERPRETER.to_string(),
        "-I".to_string(),
        "-S".to_string(),
        PROBE_PATH.to_string(),
        "--level".to_string(),
        level.as_str().to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{EXPECT_PATH, PROBE_SOURCE};

    #[test]
    fn the_probe_and_the_rust_side_agree_on_the_contract() {
        assert!(PROBE_SOURCE.contains(&format!("REPORT_PREFIX = \"{REPORT_PREFIX}\"")));
        assert!(PROBE_SOURCE.contains(&format!("EXPECT_PATH = \"{EXPECT_PATH}\"")));
        assert!(PROBE_SOURCE.contains(&format!("REPORT_SCHEMA = \"{}\"", report::REPORT_SCHEMA)));
    }
}
