//! An image as it is stored: its exact manifest and config bytes, and its layer blobs.
//!
//! Position in the pipeline: between the image values ([`Image`]) and the outputs. A
//! [`StoredImage`] is what every output takes (go-containerregistry's
//! `RawManifest`/`RawConfigFile`): the Docker load (`engine`), the registry push and the
//! docker-archive writer move these bytes as they are and never rebuild them, so an image
//! keeps its digests wherever it goes, whoever wrote it. One comes from an OCI layout
//! ([`super::layout::Layout::image`], the only reader of `index.json`) or from an [`Image`]
//! value ([`StoredImage::of`], which serialises it once). A stored image is not edited:
//! change the [`Image`] and store it again.

use oci_spec::image::{Descriptor, ImageConfiguration, MediaType, Platform};

use super::{descriptor, Blob, Image, OciError};
use crate::digest::Digest;
use crate::layer::Layer;

/// An image's stored documents and layers (see the module docs).
#[derive(Debug, Clone)]
pub struct StoredImage {
    /// The name `index.json` gives it (`org.opencontainers.image.ref.name`), or gives the
    /// image index it was chosen from; None for an image that was not read from a layout.
    pub ref_name: Option<String>,
    /// The index entry that names the manifest, as stored: the layout's (with its ref name
    /// annotation), or the image index's (with its platform). For an image value, its
    /// manifest descriptor.
    pub entry: Descriptor,
    /// The manifest, byte for byte; its digest is the image's identity.
    pub manifest: Blob,
    /// The config, byte for byte; its digest is the Docker image ID.
    pub config: Blob,
    /// The config, parsed.
    pub configuration: ImageConfiguration,
    /// The manifest's layers in order, each with its diff_id (from the config) and the file
    /// holding its blob. Media types are the manifest's, as stored.
    pub layers: Vec<Layer>,
}

impl StoredImage {
    /// `image` serialised (canonically, as every output of cudastack stores it).
    pub fn of(image: &Image) -> Result<Self, OciError> {
        let documents = image.documents()?;
        Ok(Self {
            ref_name: None,
            entry: documents.manifest_descriptor(),
            manifest: documents.manifest,
            config: documents.config,
            configuration: image.configuration()?,
            layers: image.layers().to_vec(),
        })
    }

    /// The manifest's media type (OCI, or Docker schema 2 for a pulled image).
    pub fn media_type(&self) -> &MediaType {
        self.entry.media_type()
    }

    /// The platform of the image index entry it was chosen by; None when it was named
    /// directly.
    pub fn platform(&self) -> Option<&Platform> {
        self.entry.platform().as_ref()
    }

    /// The manifest digest: the image's identity.
    pub fn manifest_digest(&self) -> Digest {
        self.manifest.digest
    }

    /// The config digest: the image ID a Docker daemon with the classic image store gives it.
    pub fn config_digest(&self) -> Digest {
        self.config.digest
    }

    /// The descriptor of the manifest (media type, digest, size; no annotations).
    pub fn manifest_descriptor(&self) -> Descriptor {
        descriptor(
            self.media_type().clone(),
            &self.manifest.digest,
            self.manifest.size(),
        )
    }

    /// The config's creation time in seconds since the epoch (0 when it has none, or one
    /// spelled otherwise than RFC 3339 UTC).
    pub fn created(&self) -> u64 {
        self.configuration
            .created()
            .as_deref()
            .and_then(super::parse_rfc3339)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn an_image_value_is_stored_with_the_documents_it_computes() {
        let layer = Layer {
            digest: Digest::of_bytes(b"blob"),
            diff_id: Digest::of_bytes(b"tar"),
            size: 4,
            uncompressed_size: Some(3),
            media_type: MediaType::ImageLayerGzip,
            blob: PathBuf::from("/nonexistent"),
        };
        let image = Image::new(1_700_000_000)
            .with_layer(layer, "test layer")
            .with_label("a", "b");
        let stored = StoredImage::of(&image).unwrap();
        let documents = image.documents().unwrap();
        assert_eq!(stored.manifest, documents.manifest);
        assert_eq!(stored.config, documents.config);
        assert_eq!(
            stored.manifest_descriptor(),
            documents.manifest_descriptor()
        );
        assert_eq!(stored.created(), 1_700_000_000);
        assert_eq!(stored.layers.len(), 1);
    }
}
