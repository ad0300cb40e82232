//! The software bill of materials of an image: what it contains and what it was made
//! from, as SPDX 2.3 JSON (and CycloneDX 1.6 JSON), stored beside the image as an OCI
//! referrer.
//!
//! Produced from the lock and the image config's facts, not from a scan after the fact:
//! the lock names every Debian package, wheel and source distribution by URL and sha256;
//! the nvidia-* wheels are the CUDA components the toolkit layers place in
//! `/usr/local/cuda` ([`cuda`]); the config's labels carry the GPU facts (driver floor,
//! CUDA and cuDNN versions, torch's arch list, the kernel audit's coverage groups) and the
//! wheels compiled from `build:` sdists. One [`inventory::Inventory`] is derived from them and
//! written in each format, so the formats cannot say different things.
//!
//! An output of the image, beside `verify`: it reads lock, stack and audit types and
//! writes bytes; storing and pushing them is the caller's (src/oci, src/registry).
//! Output is byte-for-byte deterministic: the only time in it is the image's own
//! created time, and the document namespace is a digest of the content.
//! docs/sbom.md documents the mapping.

pub mod cuda;
pub mod cyclonedx;
pub mod inventory;
pub mod license;
pub mod spdx;
pub mod summary;

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::digest::Digest;
use crate::labels;
use crate::lock::lockfile::{Artifact, Lockfile};
use crate::target_gpu::TargetGpu;
use crate::verify::check::ImageClaims;

pub use cyclonedx::{cyclonedx_json, CYCLONEDX_MEDIA_TYPE};
pub use license::wheel_license;
pub use spdx::{spdx_json, SPDX_MEDIA_TYPE};
pub use summary::{SbomError, Summary};

/// What an SBOM is made of.
pub struct SbomInput<'a> {
    /// The image's name (`torch2.4.1-cu121-py3.11:latest`, or the recipe name).
    pub name: &'a str,
    /// The image manifest's digest, when known: the root package's checksum and purl.
    pub image: Option<Digest>,
    pub lock: &'a Lockfile,
    /// What the image config states (`ImageClaims::from_image`).
    pub claims: &'a ImageClaims,
    /// The wheels compiled from the lock's sdists ([`BuiltWheel::from_labels`]).
    pub built: &'a [BuiltWheel],
    /// The GPUs the recipe targets: its `gpus:` as validation resolved them
    /// (`matrix::ResolvedRecipe::target_gpus`), which the build's kernel audit checked and its
    /// report records; not in the image config.
    pub targets: &'a [TargetGpu],
    /// The image's created time, epoch seconds: the document's only time.
    pub created: u64,
    /// An artifact's declared license as a valid SPDX expression (for wheels,
    /// [`wheel_license`] of the fetched file); None for NOASSERTION. An expression that
    /// is not valid is written as NOASSERTION.
    pub licenses: &'a dyn Fn(&Artifact) -> Option<String>,
}

/// A wheel compiled by `build` from a `build:` sdist and installed in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltWheel {
    /// The sdist's (normalised) name.
    pub name: String,
    pub version: String,
    /// The wheel's file name.
    pub filename: String,
    pub sha256: Digest,
}

impl BuiltWheel {
    /// The built wheels an image config records (`io.cudastack.built.<name>` labels), sorted
    /// by name; a label that does not read as `<version> <file> <sha256>` is skipped.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Vec<BuiltWheel> {
        labels
            .iter()
            .filter_map(|(key, value)| {
                let name = key.strip_prefix(labels::BUILT_PREFIX)?;
                let mut words = value.split_whitespace();
                let (version, filename, sha256) = (words.next()?, words.next()?, words.next()?);
                if words.next().is_some() || name.is_empty() {
                    return None;
                }
                Some(BuiltWheel {
                    name: name.to_string(),
                    version: version.to_string(),
                    filename: filename.to_string(),
                    sha256: Digest::from_str(sha256).ok()?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_wheels_are_read_from_their_labels() {
        let sha = Digest::of_bytes(b"wheel");
        let labels: BTreeMap<String, String> = [
            (
                "io.cudastack.built.cuda-ext".to_string(),
                format!("0.1.0 cuda_ext-0.1.0-cp311-cp311-linux_x86_64.whl {sha}"),
            ),
            ("io.cudastack.built.bad".to_string(), "0.1 file".to_string()),
            (
                "io.cudastack.built.worse".to_string(),
                "0.1 file sha256:zz".to_string(),
            ),
            ("io.cudastack.torch".to_string(), "2.4.1".to_string()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            BuiltWheel::from_labels(&labels),
            [BuiltWheel {
                name: "cuda-ext".into(),
                version: "0.1.0".into(),
                filename: "cuda_ext-0.1.0-cp311-cp311-linux_x86_64.whl".into(),
                sha256: sha,
            }]
        );
    }
}
