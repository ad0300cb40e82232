//! The OCI image layout output (and input): a directory any OCI tool can read.
//!
//! ```text
//! DIR/oci-layout          {"imageLayoutVersion":"1.0.0"}
//! DIR/index.json          one manifest descriptor per image, named by the
//!                         `org.opencontainers.image.ref.name` annotation
//! DIR/blobs/sha256/<hex>  layers, configs, manifests
//! ```
//! Layer blobs are hardlinked from the BlobStore when it is on the same filesystem
//! (a multi-GB image costs no copy), and copied with digest verification otherwise.
//! Writing a second image into the same directory adds (or replaces, for the same ref
//! name) its entry in `index.json`; every file is renamed into place atomically.
//! [`read`] turns an image of a layout back into an [`Image`], to be used as a base.
//!
//! One reader and one writer: [`Layout`] parses `index.json` and hands out each
//! image as a [`StoredImage`] (its manifest and config bytes as stored, digest-verified);
//! [`LayoutWriter`] is the only code that writes the layout's files, and
//! [`LayoutWriter::name`] the only one that writes `index.json` ([`index`] is its format).
//! The functions below are the short paths other stages call.
//!
//! Every write goes through one [`LayoutWriter`]: it holds the
//! layout directory's `flock(2)` for the whole write, so concurrent builds and pulls into
//! one layout never lose each other's `index.json` entries; it writes blobs first and
//! `index.json` last; and dropped without [`LayoutWriter::commit`] (any error, a full
//! disk) it removes every file and directory it created, so a failed write leaves the
//! layout as it was, and a new layout not at all. Temp files (`.tmp-*`) left by a killed
//! writer are removed by the next one, under the lock.
//!
//! Hard links stay (copying gigabytes per build would cost more than the risk): a layout's
//! layer blob and the cache's blob are one file. The cache checks that file against its
//! integrity record before every reuse ([`crate::cache::BlobStore::verified`]), so an edit
//! through the layout is caught at the next build and the cache entry is rebuilt into a
//! new file (the old layout keeps the damaged one, which `skopeo`/`docker` reject by digest).
//! A blob already in the layout is kept only when it is the very file being placed or
//! hashes to its name; otherwise it is replaced with a warning.

mod index;
mod reader;
mod writer;

use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageConfiguration, MediaType};

use super::{Image, OciError, StoredImage};
use crate::canonical::to_canonical_json;
use crate::digest::Digest;
pub use index::{ref_name_of, LayoutIndex};
pub use reader::{Layout, LayoutImage};
pub use writer::LayoutWriter;

const LAYOUT_FILE: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// Write `image` into the layout at `dir` under `ref_name` (e.g. `torch2.4-cu121`).
/// Returns the manifest digest.
pub fn write(image: &Image, dir: &Path, ref_name: &str) -> Result<Digest, OciError> {
    write_stored(&StoredImage::of(image)?, dir, ref_name)
}

/// Write a stored image (its layer blobs are linked or copied from where they are) into the
/// layout at `dir` under `ref_name`. Returns the manifest digest.
pub fn write_stored(image: &StoredImage, dir: &Path, ref_name: &str) -> Result<Digest, OciError> {
    let mut writer = LayoutWriter::open(dir)?;
    let descriptor = put_image(&mut writer, image)?;
    writer.name(descriptor, ref_name)?;
    writer.commit();
    Ok(image.manifest_digest())
}

/// Put `image`'s layers, config and manifest into the layout at `dir` without naming it
/// (an image index that refers to it names it). Returns the manifest descriptor.
pub fn write_blobs(image: &Image, dir: &Path) -> Result<Descriptor, OciError> {
    let mut writer = LayoutWriter::open(dir)?;
    let descriptor = put_image(&mut writer, &StoredImage::of(image)?)?;
    writer.commit();
    Ok(descriptor)
}

fn put_image(writer: &mut LayoutWriter, image: &StoredImage) -> Result<Descriptor, OciError> {
    for layer in &image.layers {
        writer.put_file(&layer.blob, &layer.digest)?;
    }
    for blob in [&image.config, &image.manifest] {
        writer.put_bytes(&blob.bytes)?;
    }
    Ok(image.manifest_descriptor())
}

/// Write an image index over images already in the layout at `dir` (each given by its
/// manifest descriptor and platform) and name it `ref_name`: a multi-platform image, as
/// `docker buildx` publishes one. Returns the index digest.
pub fn write_index(
    dir: &Path,
    images: &[(Descriptor, oci_spec::image::Platform)],
    ref_name: &str,
) -> Result<Digest, OciError> {
    let children = images
        .iter()
        .map(|(descriptor, platform)| {
            let mut child = descriptor.clone();
            child.set_platform(Some(platform.clone()));
            child.set_annotations(None);
            child
        })
        .collect();
    let (_, bytes) = super::image_index(children)?;
    let mut writer = LayoutWriter::open(dir)?;
    let digest = writer.put_bytes(&bytes)?;
    writer.name(
        super::descriptor(MediaType::ImageIndex, &digest, bytes.len() as u64),
        ref_name,
    )?;
    writer.commit();
    Ok(digest)
}

/// `latest` + `arm64` -> `latest-linux-arm64`: the ref of one platform's image beside the
/// image index named `ref_name`.
pub fn platform_ref_name(ref_name: &str, architecture: &str) -> String {
    format!("{ref_name}-linux-{architecture}")
}

/// The configuration of the image manifest `descriptor` names (digest-verified).
pub fn config_of(dir: &Path, descriptor: &Descriptor) -> Result<ImageConfiguration, OciError> {
    let manifest: oci_spec::image::ImageManifest =
        reader::read_json_blob(dir, descriptor, "an OCI image manifest")?;
    reader::read_json_blob(dir, manifest.config(), "an OCI image configuration")
}

/// The OCI architecture of the build host (`amd64`, `arm64`): which image of a
/// multi-platform index the commands that run or inspect one image pick.
pub fn host_architecture() -> oci_spec::image::Arch {
    crate::platform::Platform::host_or_amd64().to_oci_arch()
}

/// The largest JSON document of a layout read: `index.json`, a manifest, a
/// config, a referrer's blob. They are read whole, and a layout may come from a pull
/// request; a registry's config limit (src/registry/pull.rs) is the same.
pub const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// Read a layout's JSON document at `path` whole: a regular file of at most
/// [`MAX_DOCUMENT_BYTES`], refused before more is read.
pub(crate) fn read_document_file(path: &Path) -> Result<Vec<u8>, OciError> {
    use std::io::Read;
    let io = |source| OciError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match crate::contained_file::open_regular(path).map_err(io)? {
        Ok(file) => file,
        Err(kind) => {
            return Err(OciError::NotAFile {
                path: path.to_path_buf(),
                kind,
            })
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(OciError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_DOCUMENT_BYTES,
        });
    }
    Ok(bytes)
}

/// Where a blob lives in a layout.
pub fn blob_path(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join("blobs").join("sha256").join(digest.hex())
}

/// Read the image named `ref_name` from the layout at `dir`, to build on top of it:
/// its layers become the first layers of the new image, its config the starting config.
/// The layer blobs are not read (they are referenced where they are). The returned
/// image's creation time is 0: set the new image's with [`Image::with_created`].
pub fn read(dir: &Path, ref_name: &str) -> Result<Image, OciError> {
    let stored = Layout::open(dir)?.complete_image(ref_name, None)?;
    let created = stored.created();
    let configuration = stored.configuration;
    let layers: Vec<_> = stored
        .layers
        .into_iter()
        .map(|mut layer| {
            layer.media_type = normalise_layer_media_type(&layer.media_type);
            layer
        })
        .collect();
    let mut history = configuration.history().clone().unwrap_or_default();
    if history.is_empty() {
        history = layers
            .iter()
            .map(|_| {
                oci_spec::image::HistoryBuilder::default()
                    .created_by(format!("base image {ref_name}"))
                    .build()
                    .expect("history has no required fields")
            })
            .collect();
    }
    Ok(Image {
        layers,
        history,
        config: configuration.config().clone().unwrap_or_default(),
        architecture: configuration.architecture().clone(),
        os: configuration.os().clone(),
        created,
    })
}

/// An image of a layout as its documents: what `inspect` and `check` read, without
/// touching layers.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    pub manifest: Descriptor,
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    pub config: ImageConfiguration,
}

/// Find `ref_name` in the layout at `dir` and read its manifest and config (of the host's
/// platform, for an image index).
pub fn resolve(dir: &Path, ref_name: &str) -> Result<ResolvedImage, OciError> {
    resolve_platform(dir, ref_name, None)
}

/// [`resolve`], picking `architecture`'s image from an image index (None: the host's).
pub fn resolve_platform(
    dir: &Path,
    ref_name: &str,
    architecture: Option<&oci_spec::image::Arch>,
) -> Result<ResolvedImage, OciError> {
    let stored = Layout::open(dir)?.image(ref_name, architecture)?;
    Ok(ResolvedImage {
        manifest_digest: stored.manifest_digest(),
        config_digest: stored.config_digest(),
        manifest: stored.entry,
        config: stored.configuration,
    })
}

/// The ref names of a layout's index, sorted.
pub fn list_refs(dir: &Path) -> Result<Vec<String>, OciError> {
    Ok(LayoutIndex::read(dir)?.ref_names())
}

/// An OCI 1.1 artifact: typed blobs attached to an image through `subject`
/// (a verification report, for instance).
#[derive(Debug, Clone)]
pub struct Artifact {
    pub artifact_type: String,
    pub subject: oci_spec::image::Descriptor,
    /// (media type, bytes) of each blob.
    pub blobs: Vec<(String, Vec<u8>)>,
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The empty config every artifact manifest names (OCI 1.1 image-spec).
pub const EMPTY_CONFIG: &[u8] = b"{}";
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

impl Artifact {
    /// The artifact's manifest, as canonical bytes: an image manifest with `artifactType`,
    /// the empty config and `subject` (what registries index for the referrers API).
    pub fn manifest_bytes(&self) -> Vec<u8> {
        let descriptor = |media_type: &str, bytes: &[u8]| {
            serde_json::json!({
                "mediaType": media_type,
                "digest": Digest::of_bytes(bytes).to_string(),
                "size": bytes.len(),
            })
        };
        let subject = serde_json::json!({
            "mediaType": self.subject.media_type().to_string(),
            "digest": self.subject.digest().to_string(),
            "size": self.subject.size(),
        });
        let value = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "artifactType": self.artifact_type,
            "config": descriptor(EMPTY_CONFIG_MEDIA_TYPE, EMPTY_CONFIG),
            "layers": self.blobs.iter().map(|(m, b)| descriptor(m, b)).collect::<Vec<_>>(),
            "subject": subject,
            "annotations": self.annotations,
        });
        to_canonical_json(&value).expect("artifact manifest serialises")
    }
}

/// Store `artifact` in the layout at `dir` under `ref_name`; returns its manifest digest.
/// Artifacts are left out of the docker-save `manifest.json` (they are not images).
pub fn write_artifact(dir: &Path, artifact: &Artifact, ref_name: &str) -> Result<Digest, OciError> {
    let mut writer = LayoutWriter::open(dir)?;
    for bytes in
        std::iter::once(EMPTY_CONFIG).chain(artifact.blobs.iter().map(|(_, b)| b.as_slice()))
    {
        writer.put_bytes(bytes)?;
    }
    let manifest = artifact.manifest_bytes();
    let digest = writer.put_bytes(&manifest)?;
    let mut entry = super::descriptor(MediaType::ImageManifest, &digest, manifest.len() as u64);
    entry.set_artifact_type(Some(MediaType::Other(artifact.artifact_type.clone())));
    writer.name(entry, ref_name)?;
    writer.commit();
    Ok(digest)
}

/// The first blob of the artifact named `ref_name` (digest-verified), or None when the
/// layout has no such name.
pub fn read_artifact_blob(dir: &Path, ref_name: &str) -> Result<Option<Vec<u8>>, OciError> {
    let layout = Layout::open(dir)?;
    let Some(entry) = layout.index().named(ref_name) else {
        return Ok(None);
    };
    let manifest: oci_spec::image::ImageManifest =
        layout.read_json_blob(entry, "an artifact manifest")?;
    match manifest.layers().first() {
        Some(blob) => Ok(Some(layout.read_blob(blob)?)),
        None => Ok(None),
    }
}

/// The images of the image index `ref_name` names, with their platforms; None when the
/// name is one image's.
pub fn index_images(
    dir: &Path,
    ref_name: &str,
) -> Result<Option<Vec<(Descriptor, oci_spec::image::Platform)>>, OciError> {
    Layout::open(dir)?.index_images(ref_name)
}

/// Docker's layer media types name the same bytes as OCI's; an OCI manifest must use
/// the OCI names.
fn normalise_layer_media_type(media_type: &MediaType) -> MediaType {
    match media_type {
        MediaType::Other(other) => match other.as_str() {
            "application/vnd.docker.image.rootfs.diff.tar.gzip" => MediaType::ImageLayerGzip,
            "application/vnd.docker.image.rootfs.diff.tar" => MediaType::ImageLayer,
            "application/vnd.docker.image.rootfs.diff.tar.zstd" => MediaType::ImageLayerZstd,
            _ => media_type.clone(),
        },
        _ => media_type.clone(),
    }
}
