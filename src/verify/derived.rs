//! What another tool's layers changed in a cudastack image. An image built FROM a cudastack
//! image (a Dockerfile's `RUN pip install`, umoci, ...) keeps its labels, its probe and its
//! expectations, so the probe alone would vouch for the stack it was built from; and code
//! in the image cannot vouch for itself. So before the probe runs, the host reads the added
//! layers ([`Lineage::Derived`]) and compares them with the lock the cudastack image
//! carries: a locked distribution installed again at another version or removed, or a
//! second copy of a CUDA library, fails the verification, naming it; a distribution the
//! lock does not have is listed and passes.
//!
//! What it reads: the added layers' tar entries (the `*.dist-info/METADATA` of installed
//! distributions, whiteouts, file names of CUDA libraries) and the lock in the cudastack
//! image's config layer. What it does not: the contents of the added files (a file that
//! patches a library in place under its own name is seen only by the probe's checks).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::PathBuf;

use oci_spec::image::MediaType;
use serde::Serialize;

use super::check::Lineage;
use super::report::{CheckResult, Level, Status};
use crate::labels;
use crate::layer::Layer;
use crate::lock::lockfile::{ArtifactKind, Lockfile};
use crate::names::normalize_name;
use crate::oci::StoredImage;

/// The largest lock read from an image: the image is untrusted, and a real lock is a few
/// hundred KiB.
const LOCK_LIMIT: u64 = 64 << 20;

/// The id of the check in the report.
pub const CHECK_ID: &str = "static.derived_layers";

#[derive(Debug, thiserror::Error)]
pub enum DerivedError {
    #[error("failed to read layer {digest} of the image ({path})")]
    Read {
        digest: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "layer {digest} of the image has media type {media_type}, which cudastack cannot read"
    )]
    MediaType { digest: String, media_type: String },
    #[error("the cudastack image below the added layers has no lock at /{}: it was not built by cudastack, or its config layer was replaced", labels::LOCK_IN_IMAGE)]
    NoLock,
    #[error("the lock in the cudastack image below the added layers is over {} MiB: not a lock cudastack wrote", LOCK_LIMIT >> 20)]
    LockTooLarge,
    #[error("the lock in the cudastack image below the added layers does not parse: {0}")]
    Lock(String),
}

/// A distribution installed by the added layers: its name as the lock spells it (PEP 503
/// normalised) and its version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Distribution {
    pub name: String,
    pub version: String,
}

/// A locked distribution installed again at another version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replaced {
    pub name: String,
    pub locked: String,
    pub found: String,
}

/// What the added layers changed, against the lock of the image below them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub base_layers: usize,
    pub added_layers: usize,
    pub replaced: Vec<Replaced>,
    /// Locked distributions whose metadata the added layers remove.
    pub removed: Vec<String>,
    /// Distributions the lock does not have.
    pub added: Vec<Distribution>,
    /// CUDA libraries the added layers hold: a second copy beside the stack's.
    pub libraries: Vec<String>,
}

impl Changes {
    /// Whether the stack the lock describes is still what the image holds.
    pub fn stack_intact(&self) -> bool {
        self.replaced.is_empty() && self.removed.is_empty() && self.libraries.is_empty()
    }

    /// The report's check: a fail that names what changed, or a pass that lists what was
    /// added.
    pub fn check(&self, seconds: f64) -> CheckResult {
        let mut said = Vec::new();
        for replaced in &self.replaced {
            said.push(format!(
                "replaces {} {} with {}",
                replaced.name, replaced.locked, replaced.found
            ));
        }
        for name in &self.removed {
            said.push(format!("removes {name}"));
        }
        for path in &self.libraries {
            said.push(format!("adds a second copy of a CUDA library: /{path}"));
        }
        let added = if self.added.is_empty() {
            "adds no Python distribution".to_string()
        } else {
            format!(
                "adds {}",
                self.added
                    .iter()
                    .map(|d| format!("{} {}", d.name, d.version))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let head = format!(
            "{} layer(s) added above the cudastack image's {} by another tool",
            self.added_layers, self.base_layers
        );
        let (status, detail) = if self.stack_intact() {
            (
                Status::Pass,
                format!("{head}: {added}; the locked stack is intact"),
            )
        } else {
            (
                Status::Fail,
                format!(
                    "{head}: {}; the image is no longer the stack it was verified as (rebuild it with cudastack, with the change in the recipe)",
                    said.join("; ")
                ),
            )
        };
        CheckResult {
            id: CHECK_ID.to_string(),
            level: Level::Static,
            status,
            seconds,
            detail,
            data: serde_json::to_value(self).ok(),
        }
    }
}

/// What the layers added above a cudastack image changed; None for an image that is not
/// derived from one (its lineage says so from the config alone).
pub fn examine(image: &StoredImage) -> Result<Option<Changes>, DerivedError> {
    let (labels, _) =
        super::check::labels_and_env(&image.configuration.config().clone().unwrap_or_default());
    let diff_ids: Vec<_> = image.layers.iter().map(|layer| layer.diff_id).collect();
    let Lineage::Derived { base, added } = Lineage::of(&labels, &diff_ids) else {
        return Ok(None);
    };
    let lock = lock_below(image, base)?;
    let locked: BTreeMap<String, String> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel)
        .map(|a| (normalize_name(&a.name), a.version.clone()))
        .collect();
    let mut installed = BTreeSet::new();
    let mut whited_out = BTreeSet::new();
    let mut libraries = Vec::new();
    for layer in &image.layers[base..] {
        find_entry(layer, |path, _| {
            if let Some(distribution) = dist_info(path, "METADATA") {
                installed.insert(distribution);
            } else if let Some(distribution) = whiteout_of_dist_info(path) {
                whited_out.insert(distribution);
            } else if is_cuda_library(path) {
                libraries.push(path.to_string());
            }
            Ok(None::<()>)
        })?;
    }
    let mut changes = Changes {
        base_layers: base,
        added_layers: added,
        libraries,
        ..Changes::default()
    };
    for distribution in &installed {
        match locked.get(&distribution.name) {
            Some(version) if *version == distribution.version => {}
            Some(version) => changes.replaced.push(Replaced {
                name: distribution.name.clone(),
                locked: version.clone(),
                found: distribution.version.clone(),
            }),
            None => changes.added.push(distribution.clone()),
        }
    }
    for distribution in &whited_out {
        let reinstalled = installed.iter().any(|d| d.name == distribution.name);
        if locked.contains_key(&distribution.name) && !reinstalled {
            changes.removed.push(distribution.name.clone());
        }
    }
    Ok(Some(changes))
}

/// The lock in the config layer of the cudastack image's `base` layers.
fn lock_below(image: &StoredImage, base: usize) -> Result<Lockfile, DerivedError> {
    // The history entries of layers (not of config-only steps) line up with the layers.
    let history = image.configuration.history().clone().unwrap_or_default();
    let config = labels::layer_created_by("config");
    let index = history
        .iter()
        .filter(|entry| !entry.empty_layer().unwrap_or(false))
        .position(|entry| entry.created_by().as_deref() == Some(config.as_str()))
        .filter(|index| *index < base)
        .ok_or(DerivedError::NoLock)?;
    let bytes =
        read_file(&image.layers[index], labels::LOCK_IN_IMAGE)?.ok_or(DerivedError::NoLock)?;
    if bytes.len() as u64 > LOCK_LIMIT {
        return Err(DerivedError::LockTooLarge);
    }
    let text = String::from_utf8(bytes).map_err(|_| DerivedError::Lock("not UTF-8".into()))?;
    Lockfile::from_json(&text, std::path::Path::new(labels::LOCK_IN_IMAGE))
        .map_err(|error| DerivedError::Lock(error.to_string()))
}

/// The layer's uncompressed tar stream.
fn open_tar(layer: &Layer) -> Result<Box<dyn Read>, DerivedError> {
    let read_error = |source| DerivedError::Read {
        digest: layer.digest.to_string(),
        path: layer.blob.clone(),
        source,
    };
    let file = std::io::BufReader::new(std::fs::File::open(&layer.blob).map_err(read_error)?);
    let media_type = layer.media_type.to_string();
    Ok(match &layer.media_type {
        MediaType::ImageLayer => Box::new(file),
        MediaType::ImageLayerGzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        MediaType::ImageLayerZstd => {
            Box::new(zstd::stream::read::Decoder::with_buffer(file).map_err(read_error)?)
        }
        _ if media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
            Box::new(flate2::read::MultiGzDecoder::new(file))
        }
        _ => {
            return Err(DerivedError::MediaType {
                digest: layer.digest.to_string(),
                media_type,
            })
        }
    })
}

/// Walk the layer's entries in order, each with its path (relative, no leading `./` or `/`),
/// until `visit` returns `Some`.
fn find_entry<T>(
    layer: &Layer,
    mut visit: impl FnMut(&str, &mut dyn Read) -> std::io::Result<Option<T>>,
) -> Result<Option<T>, DerivedError> {
    let read_error = |source| DerivedError::Read {
        digest: layer.digest.to_string(),
        path: layer.blob.clone(),
        source,
    };
    let mut archive = tar::Archive::new(open_tar(layer)?);
    for entry in archive.entries().map_err(read_error)? {
        let mut entry = entry.map_err(read_error)?;
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let path = path.trim_start_matches("./").trim_start_matches('/');
        if let Some(found) = visit(path, &mut entry).map_err(read_error)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The bytes of the file at `wanted` in the layer (at most [`LOCK_LIMIT`] + 1), if it has it.
fn read_file(layer: &Layer, wanted: &str) -> Result<Option<Vec<u8>>, DerivedError> {
    find_entry(layer, |path, entry| {
        if path != wanted {
            return Ok(None);
        }
        // One byte over the limit is enough to tell it is too large.
        let mut bytes = Vec::new();
        entry.take(LOCK_LIMIT + 1).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    })
}

/// The distribution of `<site>/<name>-<version>.dist-info/<file>` in a Python site directory.
fn dist_info(path: &str, file: &str) -> Option<Distribution> {
    let rest = path.strip_suffix(file)?.strip_suffix('/')?;
    let (site, dir) = rest.rsplit_once('/')?;
    in_site(site).then_some(())?;
    distribution_of(dir)
}

/// The distribution whose `.dist-info` directory a whiteout (`.wh.<dir>`) removes.
fn whiteout_of_dist_info(path: &str) -> Option<Distribution> {
    let (site, name) = path.rsplit_once('/')?;
    in_site(site).then_some(())?;
    distribution_of(name.strip_prefix(".wh.")?)
}

fn in_site(dir: &str) -> bool {
    dir.ends_with("/site-packages") || dir.ends_with("/dist-packages")
}

/// `numpy-2.1.0.dist-info`: the name (escaped with `_` by the wheel spec) before the first
/// `-`, the version after it.
fn distribution_of(dir: &str) -> Option<Distribution> {
    let stem = dir.strip_suffix(".dist-info")?;
    let (name, version) = stem.split_once('-')?;
    (!name.is_empty() && !version.is_empty()).then(|| Distribution {
        name: normalize_name(name),
        version: version.to_string(),
    })
}

/// A file named as one of the CUDA libraries a stack carries once (`libcudnn.so.9`,
/// `libcublasLt.so.12.1.3.1`, ...), whiteouts aside.
fn is_cuda_library(path: &str) -> bool {
    const FAMILIES: &[&str] = &[
        "libcudart",
        "libcudnn",
        "libcublas",
        "libcublasLt",
        "libcufft",
        "libcurand",
        "libcusolver",
        "libcusparse",
        "libnccl",
        "libnvrtc",
        "libnvJitLink",
        "libcupti",
    ];
    let name = path.rsplit('/').next().unwrap_or(path);
    let Some((stem, _)) = name.split_once(".so") else {
        return false;
    };
    let family = stem.split('_').next().unwrap_or(stem);
    FAMILIES.contains(&family)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_and_libraries_are_read_from_entry_paths() {
        let site = "usr/local/lib/python3.11/dist-packages";
        assert_eq!(
            dist_info(
                &format!("{site}/Torch-2.5.1.dist-info/METADATA"),
                "METADATA"
            ),
            Some(Distribution {
                name: "torch".into(),
                version: "2.5.1".into()
            })
        );
        assert_eq!(
            dist_info(
                &format!("{site}/nvidia_cudnn_cu12-9.1.0.70.dist-info/METADATA"),
                "METADATA"
            )
            .unwrap()
            .name,
            "nvidia-cudnn-cu12"
        );
        // Outside a site directory, or another file: not an installed distribution.
        assert_eq!(
            dist_info("opt/x/numpy-2.1.0.dist-info/METADATA", "METADATA"),
            None
        );
        assert_eq!(
            dist_info(&format!("{site}/numpy-2.1.0.dist-info/RECORD"), "METADATA"),
            None
        );
        assert_eq!(
            whiteout_of_dist_info(&format!("{site}/.wh.numpy-1.26.4.dist-info"))
                .unwrap()
                .version,
            "1.26.4"
        );
        assert!(is_cuda_library("opt/conda/lib/libcudnn.so.9"));
        assert!(is_cuda_library("x/libcudnn_ops.so.9.1.0"));
        assert!(is_cuda_library("x/libcublasLt.so.12"));
        assert!(!is_cuda_library("x/libcudnn_frontend.h"));
        assert!(!is_cuda_library("x/libtorch_cuda.so"));
    }
}
