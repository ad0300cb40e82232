//! What a build reports: per platform, the image's manifest digest, its layers (with
//! whether each came from the cache) and the static audit's summary. Serialised as is by
//! `cudastack build --json`.

use std::path::PathBuf;

use serde::Serialize;

use crate::digest::Digest;

#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub name: String,
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    /// True when the layer came from the cache with no tar or compression work.
    pub cached: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    pub recipe: String,
    /// What `ref_name` names: the image manifest, or with several platforms the image index.
    pub manifest_digest: Digest,
    pub layout: PathBuf,
    pub ref_name: String,
    pub tags: Vec<String>,
    /// The ref of the image of the build host's platform, which the verification stage and
    /// `--load` run (`latest`, or `latest-linux-amd64` beside an index); None when the
    /// host's platform was not built.
    pub host_ref: Option<String>,
    /// That image as written to the layout: the stages after the build (verification, load)
    /// take it instead of reading the layout again.
    #[serde(skip)]
    pub host_image: Option<crate::oci::layout::LayoutImage>,
    /// The tags are only [`crate::stack::DEFAULT_TAG`]'s: neither the recipe nor the command
    /// line named the image. The verification then does not leave it in Docker under that
    /// name; `--load` gives it the name.
    #[serde(skip)]
    pub named_by_default: bool,
    /// The first platform's layers, size and audit (the only one in a single-platform build).
    pub layers: Vec<LayerReport>,
    /// Compressed size of all layers.
    pub size: u64,
    pub audit: AuditSummary,
    pub audit_cached: bool,
    pub platforms: Vec<PlatformReport>,
}

/// One platform's image of a build.
#[derive(Debug, Clone, Serialize)]
pub struct PlatformReport {
    pub platform: String,
    pub manifest_digest: Digest,
    /// Its own ref in the layout when the build has several platforms.
    pub ref_name: String,
    pub layers: Vec<LayerReport>,
    pub size: u64,
    pub audit: AuditSummary,
    pub audit_cached: bool,
    /// What the image was made from, for its SBOM and provenance (crate::attest).
    #[serde(skip)]
    pub built_from: BuiltFrom,
}

/// The inputs of one platform's image that its SBOM and provenance describe; the lock is
/// its own file, so `build --json` leaves this out.
#[derive(Debug, Clone, Default)]
pub struct BuiltFrom {
    pub lock: Option<crate::lock::Lockfile>,
    /// Wheel name -> the wheel file the image's Python layer was made from (the locked
    /// wheels, and those built from the recipe's sdists).
    pub wheel_files: std::collections::BTreeMap<String, PathBuf>,
    /// The recipe's GPUs as the build resolved them (the SBOM's target GPUs).
    pub targets: Vec<crate::target_gpu::TargetGpu>,
    /// The image as the build assembled it: its config (labels, env, created) and manifest,
    /// so the SBOM describes what was built without reading the layout back.
    pub image: Option<crate::oci::Image>,
}

/// What the static audit looked at (it found nothing wrong, or the build failed).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AuditSummary {
    pub elf_files: usize,
    pub needed_checked: usize,
    pub symlinks: usize,
    pub distributions: usize,
    /// The image's libraries with GPU code, grouped by identical SASS/PTX targets (the
    /// `io.cudastack.kernels` label). None in a record written before the kernel audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<Vec<crate::audit::kernels::CoverageGroup>>,
}

/// `1536` -> `1.5 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
