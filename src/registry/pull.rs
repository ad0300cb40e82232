//! Pull: manifest (an index resolved to one platform), config and layers into the blob
//! cache, every digest verified, then an OCI layout holding the manifest byte for byte
//! (so the layout's manifest digest is the registry's).

use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use oci_spec::image::{ImageManifest, MediaType};
use serde::Serialize;

use super::client::{Platform, RegistryClient};
use super::RegistryError;
use crate::cache::BlobStore;
use crate::digest::Digest;
use crate::reference::Reference;

/// Configs are small; refuse a "config" bigger than this.
const MAX_CONFIG: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct PulledBlob {
    pub digest: Digest,
    pub size: u64,
    /// Already in the blob cache: nothing was downloaded.
    pub cached: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    pub reference: String,
    pub manifest_digest: Digest,
    pub media_type: String,
    pub platform: Platform,
    pub layout: PathBuf,
    pub ref_name: String,
    pub blobs: Vec<PulledBlob>,
    pub bytes_downloaded: u64,
    pub seconds: f64,
}

/// Pull `reference` for `platform` into `store` and write it into the OCI layout at
/// `layout_dir` under `ref_name`.
pub async fn pull(
    client: &RegistryClient,
    reference: &Reference,
    platform: &Platform,
    store: &BlobStore,
    layout_dir: &Path,
    ref_name: &str,
) -> Result<PullReport, RegistryError> {
    let started = Instant::now();
    let manifest = client.get_image_manifest(reference, platform).await?;
    let parsed: ImageManifest =
        serde_json::from_slice(&manifest.bytes).map_err(|e| RegistryError::Document {
            path: reference.to_string(),
            what: "an image manifest",
            detail: e.to_string(),
        })?;
    let repository = reference.repository();
    let digest_of = |descriptor: &oci_spec::image::Descriptor| {
        descriptor
            .digest()
            .to_string()
            .parse::<Digest>()
            .map_err(|e| RegistryError::Document {
                path: reference.to_string(),
                what: "a manifest with sha256 digests",
                detail: e.to_string(),
            })
    };

    let config_digest = digest_of(parsed.config())?;
    let mut blobs = Vec::new();
    let config_cached = store.contains(&config_digest);
    if !config_cached {
        let bytes = client
            .get_blob_bytes(repository, &config_digest, MAX_CONFIG)
            .await?;
        store.put_bytes(&bytes)?;
    }
    blobs.push(PulledBlob {
        digest: config_digest,
        size: parsed.config().size(),
        cached: config_cached,
    });

    let layers = parsed
        .layers()
        .iter()
        .map(|d| Ok((digest_of(d)?, d.size())))
        .collect::<Result<Vec<_>, RegistryError>>()?;
    let pulled: Vec<PulledBlob> = futures_util::stream::iter(layers)
        .map(|(digest, size)| pull_layer(client, repository, store, digest, size))
        .buffered(3)
        .try_collect()
        .await?;
    let bytes_downloaded = pulled.iter().filter(|b| !b.cached).map(|b| b.size).sum();
    blobs.extend(pulled);

    write_layout(
        store,
        layout_dir,
        ref_name,
        &manifest.bytes,
        &manifest.media_type,
        &manifest.digest,
        blobs.iter().map(|b| &b.digest),
    )?;
    Ok(PullReport {
        reference: reference.to_string(),
        manifest_digest: manifest.digest,
        media_type: manifest.media_type,
        platform: platform.clone(),
        layout: layout_dir.to_path_buf(),
        ref_name: ref_name.to_string(),
        blobs,
        bytes_downloaded,
        seconds: started.elapsed().as_secs_f64(),
    })
}

async fn pull_layer(
    client: &RegistryClient,
    repository: &str,
    store: &BlobStore,
    digest: Digest,
    size: u64,
) -> Result<PulledBlob, RegistryError> {
    if store.contains(&digest) {
        return Ok(PulledBlob {
            digest,
            size,
            cached: true,
        });
    }
    let what = format!("blob {digest} of `{}/{repository}`", client.registry());
    client
        .download_blob(repository, &digest, size, store, &what)
        .await?;
    Ok(PulledBlob {
        digest,
        size,
        cached: false,
    })
}

/// Put the blobs (hardlinked from the store when possible) and the manifest into the layout
/// and name the manifest `ref_name` in its `index.json`, through one
/// [`LayoutWriter`](crate::oci::layout::LayoutWriter) (the one writer of a layout): under the
/// layout's lock, `index.json` last, and on any error every file and directory this pull
/// created removed again.
fn write_layout<'a>(
    store: &BlobStore,
    dir: &Path,
    ref_name: &str,
    manifest: &Bytes,
    media_type: &str,
    manifest_digest: &Digest,
    blobs: impl Iterator<Item = &'a Digest>,
) -> Result<(), RegistryError> {
    let mut writer = crate::oci::layout::LayoutWriter::open(dir)?;
    for digest in blobs {
        // Verified (and repaired) when it was found in or fetched into the store.
        writer.put_file(&store.path(digest), digest)?;
    }
    let written = writer.put_bytes(manifest)?;
    if written != *manifest_digest {
        return Err(RegistryError::Document {
            path: dir.display().to_string(),
            what: "a manifest whose bytes match its digest",
            detail: format!("expected {manifest_digest}, found {written}"),
        });
    }

    let descriptor = crate::oci::descriptor(
        MediaType::from(media_type),
        manifest_digest,
        manifest.len() as u64,
    );
    // A pulled image gets no docker-save `manifest.json` entry (that file is left as it was).
    writer.name_in_index_only(descriptor, ref_name)?;
    writer.commit();
    Ok(())
}
