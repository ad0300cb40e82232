//! A verified image as the cluster generators take it, read from its registry: pinned by
//! the digest the registry serves, its placement (the GPU products of its verified matrix
//! and its driver floor), and what its job runs (entrypoint and command, working directory,
//! runtime needs) from its config. With a key, the verified products are those of the
//! verifications the key signed about that digest, not the image's own labels: labels are
//! the image's word about itself.

use crate::pipeline::image_source::{read_documents, ImageSource};
use crate::pipeline::signed::signed_verifications;
use crate::recipe::{Platform, RuntimeSpec};
use crate::sign::key::PublicKey;
use crate::verify::check::ImageClaims;
use crate::verify::record::VerifiedOn;
use crate::verify::source::ImageDocuments;

use super::placement::Placement;
use super::{ClusterError, PinnedImage};

/// A verified image, pinned, with where it may run and what it runs.
#[derive(Debug, Clone)]
pub struct PlacedImage {
    pub image: PinnedImage,
    pub placement: Placement,
    /// The config's Entrypoint followed by its Cmd, without the start guard.
    pub command: Vec<String>,
    /// The start guard in front of them, when the image has one.
    pub start_guard: Vec<String>,
    pub working_dir: Option<String>,
    pub needs: RuntimeSpec,
}

/// An image pinned by the digest its registry serves now, with what its job needs to run
/// (shared memory, ulimits: its `io.cudastack.runtime.*` labels), and the documents read.
#[derive(Debug, Clone)]
pub struct Pinned {
    pub image: PinnedImage,
    pub needs: RuntimeSpec,
    pub documents: ImageDocuments,
}

/// Pin the image `text` (a registry reference, `host/repo:tag` or `@sha256:…`) through
/// `source` (its registry): what `verify --emit` runs the probe on, and what a placement
/// places. An image only on disk is refused: cluster nodes pull from a registry.
pub async fn pin(
    text: &str,
    source: ImageSource,
    platform: Option<Platform>,
) -> Result<Pinned, ClusterError> {
    if !matches!(source, ImageSource::Registry { .. }) {
        return Err(ClusterError::Unplaceable {
            why: format!("`{text}` is not in a registry; cluster nodes pull images from one"),
            hint: "push the image (`cudastack push`) and use the reference it prints".to_string(),
        });
    }
    let documents = read_documents(source, platform).await.map_err(read)?;
    let repository = text.split('@').next().unwrap_or(text);
    // A registry always names the manifest it served.
    let manifest = documents
        .manifest_digest
        .as_ref()
        .ok_or_else(|| ClusterError::Unplaceable {
            why: format!("`{text}` has no manifest digest"),
            hint: "push the image (`cudastack push`) and use the reference it prints".to_string(),
        })?;
    let image: PinnedImage = format!("{repository}@{manifest}").parse()?;
    let config = documents.config.config().clone().unwrap_or_default();
    let labels = config.labels().clone().unwrap_or_default();
    let needs = RuntimeSpec::from_labels(&labels.into_iter().collect()).map_err(|error| {
        ClusterError::Invalid {
            field: "runtime label",
            value: error,
            rule: "io.cudastack.runtime.* labels as cudastack writes them",
        }
    })?;
    Ok(Pinned {
        image,
        needs,
        documents,
    })
}

/// Read the image `text` (a registry reference, `host/repo:tag` or `@sha256:…`) through
/// `source` (its registry) and place it. `signed`: with a key, the rows are read from the
/// verifications the key signed instead (a second source of the same image, as reading
/// consumes one).
pub async fn placed_image(
    text: &str,
    source: ImageSource,
    platform: Option<Platform>,
    signed: Option<(ImageSource, &PublicKey)>,
) -> Result<PlacedImage, ClusterError> {
    let Pinned {
        image,
        needs,
        documents,
    } = pin(text, source, platform).await?;
    let claims = ImageClaims::from_image(&documents.config);
    let rows: Vec<VerifiedOn> = match signed {
        None => claims.verified.clone(),
        Some((source, key)) => {
            let signed = signed_verifications(source, &image.digest, key)
                .await
                .map_err(read)?;
            let rows: Vec<VerifiedOn> = signed
                .claims
                .verifications
                .iter()
                .filter(|v| v.verdict == "verified")
                .flat_map(|v| v.matrix.iter().cloned())
                .collect();
            if rows.is_empty() {
                return Err(ClusterError::Unplaceable {
                    why: format!(
                        "no verification of {image} signed by key {} was found{}",
                        &key.key_id()[..12],
                        if signed.unread.is_empty() {
                            String::new()
                        } else {
                            format!(" ({} referrer(s) were not read)", signed.unread.len())
                        }
                    ),
                    hint: "verify the image with `--sign-key` on each GPU type it must run on, or place it without --require-signed-by to trust its labels".to_string(),
                });
            }
            rows
        }
    };
    let placement = Placement::new(&claims, &rows)?;
    let config = documents.config.config().clone().unwrap_or_default();
    let command: Vec<String> = config
        .entrypoint()
        .iter()
        .flatten()
        .chain(config.cmd().iter().flatten())
        .cloned()
        .collect();
    let (start_guard, command) = match crate::probe::guard::unguarded(&command) {
        Some(behind) => (crate::probe::guard::guard_prefix(), behind.to_vec()),
        None => (Vec::new(), command),
    };
    Ok(PlacedImage {
        image,
        placement,
        command,
        start_guard,
        working_dir: config.working_dir().clone().filter(|dir| !dir.is_empty()),
        needs,
    })
}

fn read(error: crate::pipeline::PipelineError) -> ClusterError {
    ClusterError::Read(Box::new(error))
}
