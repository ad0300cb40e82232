//! Reading an OCI layout: its `index.json` once, then the images and blobs it names.
//!
//! Every reader of a layout in cudastack (building on a base image, inspect, verify, load,
//! push) goes through [`Layout`]; what it hands out is a [`StoredImage`], the manifest and
//! config bytes as stored (digest-verified) with the layer blobs' paths. Layer blobs are
//! not read here.

use std::path::{Path, PathBuf};

use oci_spec::image::{
    Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os, Platform,
};

use super::index::{available, LayoutIndex};
use super::{blob_path, host_architecture};
use crate::digest::Digest;
use crate::layer::Layer;
use crate::oci::{digest_of, Blob, OciError, StoredImage};

/// One image of a layout as one reading found it: the layout it lives in (where reports and
/// attestations about it are written), the name it was read by, the layout's other names
/// of the same manifest (the tags it records for it), and its documents and layers. The
/// stages after a build take this value instead of reading the layout again.
#[derive(Debug, Clone)]
pub struct LayoutImage {
    pub dir: PathBuf,
    pub ref_name: String,
    /// The layout's other names of the same manifest, sorted.
    pub other_names: Vec<String>,
    pub image: StoredImage,
}

impl LayoutImage {
    /// Open the layout at `dir` and read the image `ref_name` names (for an image index,
    /// the host's platform's), checked to be whole.
    pub fn open(dir: &Path, ref_name: &str) -> Result<Self, OciError> {
        let layout = Layout::open(dir)?;
        let image = layout.complete_image(ref_name, None)?;
        let mut other_names: Vec<String> = layout
            .index
            .names_of_same_manifest(layout.entry(ref_name)?)
            .into_iter()
            .filter(|name| *name != ref_name)
            .map(str::to_string)
            .collect();
        other_names.sort();
        other_names.dedup();
        Ok(Self {
            dir: dir.to_path_buf(),
            ref_name: ref_name.to_string(),
            other_names,
            image,
        })
    }

    /// `image` as just written to the layout at `dir` under `ref_name` and `other_names`:
    /// its layer blobs are the layout's copies.
    pub fn written(dir: &Path, ref_name: &str, other_names: &[String], image: StoredImage) -> Self {
        let mut image = image;
        for layer in &mut image.layers {
            layer.blob = blob_path(dir, &layer.digest);
        }
        image.ref_name = Some(ref_name.to_string());
        Self {
            dir: dir.to_path_buf(),
            ref_name: ref_name.to_string(),
            other_names: other_names.to_vec(),
            image,
        }
    }

    /// `oci:DIR:REF`, how messages and reports name it.
    pub fn location(&self) -> String {
        format!("oci:{}:{}", self.dir.display(), self.ref_name)
    }
}

/// An OCI layout opened for reading (see the module docs).
#[derive(Debug, Clone)]
pub struct Layout {
    dir: PathBuf,
    index: LayoutIndex,
}

impl Layout {
    /// Open the layout at `dir`, reading its `index.json`.
    pub fn open(dir: &Path) -> Result<Self, OciError> {
        Ok(Self {
            dir: dir.to_path_buf(),
            index: LayoutIndex::read(dir)?,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn index(&self) -> &LayoutIndex {
        &self.index
    }

    /// The entry named `ref_name`, or an error listing the names there are.
    pub fn entry(&self, ref_name: &str) -> Result<&Descriptor, OciError> {
        self.index
            .named(ref_name)
            .ok_or_else(|| OciError::RefNotFound {
                dir: self.dir.clone(),
                reference: ref_name.to_string(),
                available: available(&self.index),
            })
    }

    /// The image `ref_name` names: itself, or for an image index, its linux image of
    /// `architecture` (None: the host's).
    pub fn image(
        &self,
        ref_name: &str,
        architecture: Option<&Arch>,
    ) -> Result<StoredImage, OciError> {
        let entry = self.entry(ref_name)?;
        if entry.media_type() != &MediaType::ImageIndex {
            return self.image_at(entry, Some(ref_name));
        }
        let child_index = self.child_index(entry)?;
        let host = architecture.cloned().unwrap_or_else(host_architecture);
        let child = child_index.manifests().iter().find(|m| {
            m.platform()
                .as_ref()
                .is_some_and(|p| p.architecture() == &host && p.os() == &Os::Linux)
        });
        match child {
            Some(child) => self.image_at(child, Some(ref_name)),
            None => {
                let platforms: Vec<String> = child_index
                    .manifests()
                    .iter()
                    .filter_map(|m| m.platform().as_ref())
                    .map(|p| format!("{}/{}", p.os(), p.architecture()))
                    .collect();
                Err(self.invalid(format!(
                    "`{ref_name}` is an image index without a linux/{host} image (it has: {}); name one platform's image instead (`{ref_name}-linux-<arch>`)",
                    platforms.join(", ")
                )))
            }
        }
    }

    /// [`Self::image`], checked to be whole: every layer blob it names is in the layout.
    /// What building on the image or loading it needs.
    pub fn complete_image(
        &self,
        ref_name: &str,
        architecture: Option<&Arch>,
    ) -> Result<StoredImage, OciError> {
        let image = self.image(ref_name, architecture)?;
        if let Some(missing) = image.layers.iter().find(|layer| !layer.blob.is_file()) {
            return Err(self.invalid(format!("layer blob {} is missing", missing.digest)));
        }
        Ok(image)
    }

    /// The image whose manifest `entry` describes (an entry of `index.json` or of an image
    /// index), found by the name `ref_name`.
    pub fn image_at(
        &self,
        entry: &Descriptor,
        ref_name: Option<&str>,
    ) -> Result<StoredImage, OciError> {
        let manifest = read_document(&self.dir, entry)?;
        let parsed: ImageManifest = self.parse(&manifest.bytes, "an OCI image manifest")?;
        let config = read_document(&self.dir, parsed.config())?;
        let configuration: ImageConfiguration =
            self.parse(&config.bytes, "an OCI image configuration")?;
        let name = ref_name.map_or_else(|| entry.digest().to_string(), str::to_string);
        let layers = self.layers(&parsed, &configuration, &name)?;
        Ok(StoredImage {
            ref_name: ref_name.map(str::to_string),
            entry: entry.clone(),
            manifest,
            config,
            configuration,
            layers,
        })
    }

    /// The manifest's layers with their diff_ids and blob paths.
    fn layers(
        &self,
        manifest: &ImageManifest,
        configuration: &ImageConfiguration,
        name: &str,
    ) -> Result<Vec<Layer>, OciError> {
        let diff_ids = configuration.rootfs().diff_ids();
        if diff_ids.len() != manifest.layers().len() {
            return Err(self.invalid(format!(
                "image `{name}` has {} layers but {} diff_ids",
                manifest.layers().len(),
                diff_ids.len()
            )));
        }
        let invalid = |problem: String| self.invalid(problem);
        let mut layers = Vec::new();
        for (descriptor, diff_id) in manifest.layers().iter().zip(diff_ids) {
            let digest = digest_of(descriptor).map_err(invalid)?;
            let diff_id: Digest = diff_id
                .parse()
                .map_err(|e: crate::digest::DigestError| invalid(e.to_string()))?;
            layers.push(Layer {
                digest,
                diff_id,
                size: descriptor.size(),
                uncompressed_size: None,
                media_type: descriptor.media_type().clone(),
                blob: blob_path(&self.dir, &digest),
            });
        }
        Ok(layers)
    }

    /// The images of the image index `ref_name` names, with their platforms; None when the
    /// name is one image's (or no entry's).
    pub fn index_images(
        &self,
        ref_name: &str,
    ) -> Result<Option<Vec<(Descriptor, Platform)>>, OciError> {
        let Some(entry) = self.index.named(ref_name) else {
            return Ok(None);
        };
        if entry.media_type() != &MediaType::ImageIndex {
            return Ok(None);
        }
        let mut images = Vec::new();
        for child in self.child_index(entry)?.manifests() {
            // cudastack's indexes always name each child's platform; one written by another
            // tool may not, and then the child's own config says which platform it is (a
            // default would relabel an arm64 image amd64 when the index is rewritten).
            let platform = match child.platform() {
                Some(platform) => platform.clone(),
                None => {
                    let config = self.configuration_of(child)?;
                    let mut platform = Platform::default();
                    platform.set_os(config.os().clone());
                    platform.set_architecture(config.architecture().clone());
                    platform.set_variant(config.variant().clone());
                    platform
                }
            };
            images.push((child.clone(), platform));
        }
        Ok(Some(images))
    }

    /// The configuration of the image manifest `descriptor` names (digest-verified).
    pub fn configuration_of(
        &self,
        descriptor: &Descriptor,
    ) -> Result<ImageConfiguration, OciError> {
        let manifest: ImageManifest = self.read_json_blob(descriptor, "an OCI image manifest")?;
        self.read_json_blob(manifest.config(), "an OCI image configuration")
    }

    /// The image index an entry of media type `ImageIndex` names.
    pub fn child_index(&self, entry: &Descriptor) -> Result<ImageIndex, OciError> {
        self.read_json_blob(entry, "an OCI image index")
    }

    /// A small JSON document (manifest, config, index) a descriptor names, digest-verified.
    pub fn read_json_blob<T: serde::de::DeserializeOwned>(
        &self,
        descriptor: &Descriptor,
        what: &'static str,
    ) -> Result<T, OciError> {
        read_json_blob(&self.dir, descriptor, what)
    }

    /// A blob a descriptor names, digest-verified (small documents only: it is read whole).
    pub fn read_blob(&self, descriptor: &Descriptor) -> Result<Vec<u8>, OciError> {
        Ok(read_document(&self.dir, descriptor)?.bytes)
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        bytes: &[u8],
        what: &'static str,
    ) -> Result<T, OciError> {
        serde_json::from_slice(bytes).map_err(|source| OciError::Json {
            path: self.dir.join("blobs"),
            what,
            source,
        })
    }

    fn invalid(&self, problem: String) -> OciError {
        OciError::InvalidLayout {
            dir: self.dir.clone(),
            problem,
        }
    }
}

/// A small JSON document a descriptor names in the layout at `dir`, digest-verified.
pub(super) fn read_json_blob<T: serde::de::DeserializeOwned>(
    dir: &Path,
    descriptor: &Descriptor,
    what: &'static str,
) -> Result<T, OciError> {
    serde_json::from_slice(&read_document(dir, descriptor)?.bytes).map_err(|source| {
        OciError::Json {
            path: dir.join("blobs"),
            what,
            source,
        }
    })
}

/// Read a blob named by a descriptor, verifying its digest (small documents only).
fn read_document(dir: &Path, descriptor: &Descriptor) -> Result<Blob, OciError> {
    let digest = digest_of(descriptor).map_err(|problem| OciError::InvalidLayout {
        dir: dir.to_path_buf(),
        problem,
    })?;
    let path = blob_path(dir, &digest);
    let bytes = super::read_document_file(&path)?;
    let found = Digest::of_bytes(&bytes);
    if found != digest {
        return Err(OciError::BlobMismatch {
            path,
            expected: digest,
            found,
        });
    }
    Ok(Blob { bytes, digest })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::layout::{self, LayoutWriter};
    use crate::oci::{docker_archive, Image};

    /// An image of one small layer whose blob is a file under `dir`.
    fn image_in(dir: &Path) -> Image {
        let bytes = b"not really a tar, but hashed like one".to_vec();
        let blob = dir.join("layer-blob");
        std::fs::write(&blob, &bytes).unwrap();
        let layer = Layer {
            digest: Digest::of_bytes(&bytes),
            diff_id: Digest::of_bytes(b"diff"),
            size: bytes.len() as u64,
            uncompressed_size: None,
            media_type: MediaType::ImageLayer,
            blob,
        };
        Image::new(1_700_000_000)
            .with_layer(layer, "one layer")
            .with_label("io.cudastack.test", "reader")
    }

    #[test]
    fn a_written_image_reads_back_as_the_same_stored_bytes() {
        let work = tempfile::tempdir().unwrap();
        let image = image_in(work.path());
        let dir = work.path().join("layout");
        let digest = layout::write(&image, &dir, "latest").unwrap();
        layout::write(&image, &dir, "cudastack/test:1").unwrap();

        let layout = Layout::open(&dir).unwrap();
        let stored = layout.complete_image("latest", None).unwrap();
        let value = StoredImage::of(&image).unwrap();
        assert_eq!(stored.manifest_digest(), digest);
        assert_eq!(stored.manifest, value.manifest);
        assert_eq!(stored.config, value.config);
        assert_eq!(stored.ref_name.as_deref(), Some("latest"));
        assert_eq!(
            stored.layers[0].blob,
            blob_path(&dir, &stored.layers[0].digest)
        );
        assert_eq!(
            layout.index().names_of_same_manifest(&stored.entry),
            ["cudastack/test:1", "latest"]
        );
        // Stored again elsewhere, from what was read: the same files, byte for byte.
        let copy = work.path().join("copy");
        layout::write_stored(&stored, &copy, "latest").unwrap();
        layout::write_stored(&stored, &copy, "cudastack/test:1").unwrap();
        for file in ["index.json", "manifest.json", "oci-layout"] {
            assert_eq!(
                std::fs::read(dir.join(file)).unwrap(),
                std::fs::read(copy.join(file)).unwrap(),
                "{file}"
            );
        }
        // The docker archive of the stored image is the value's.
        let tags = ["cudastack/test:1".to_string()];
        assert_eq!(
            docker_archive::write_stored(&stored, &tags, 0, Vec::new()).unwrap(),
            docker_archive::write(&image, &tags, Vec::new()).unwrap()
        );
    }

    #[test]
    fn a_config_written_by_another_tool_is_kept_byte_for_byte() {
        let work = tempfile::tempdir().unwrap();
        let image = image_in(work.path());
        let documents = image.documents().unwrap();
        // The same config, spelled with whitespace (as other tools write it): another digest.
        let value: serde_json::Value = serde_json::from_slice(&documents.config.bytes).unwrap();
        let config = serde_json::to_vec_pretty(&value).unwrap();
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&documents.manifest.bytes).unwrap();
        manifest["config"]["digest"] = Digest::of_bytes(&config).to_string().into();
        manifest["config"]["size"] = config.len().into();
        let manifest = serde_json::to_vec_pretty(&manifest).unwrap();

        let dir = work.path().join("layout");
        let mut writer = LayoutWriter::open(&dir).unwrap();
        let layer = &image.layers()[0];
        writer.put_file(&layer.blob, &layer.digest).unwrap();
        writer.put_bytes(&config).unwrap();
        let digest = writer.put_bytes(&manifest).unwrap();
        let entry =
            crate::oci::descriptor(MediaType::ImageManifest, &digest, manifest.len() as u64);
        writer.name(entry, "foreign").unwrap();
        writer.commit();

        let stored = Layout::open(&dir).unwrap().image("foreign", None).unwrap();
        assert_eq!(stored.config.bytes, config);
        assert_eq!(stored.config_digest(), Digest::of_bytes(&config));
        assert_eq!(stored.manifest_digest(), digest);
        assert_ne!(stored.config_digest(), documents.config.digest);
        assert_eq!(stored.created(), 1_700_000_000);
    }

    #[test]
    fn an_index_gives_the_image_of_the_platform_asked_for() {
        let work = tempfile::tempdir().unwrap();
        let amd64 = image_in(work.path());
        let arm64 = amd64
            .clone()
            .with_platform(Arch::ARM64, Os::Linux)
            .with_label("arch", "arm64");
        let dir = work.path().join("layout");
        let mut children = Vec::new();
        for (image, arch) in [(&amd64, Arch::Amd64), (&arm64, Arch::ARM64)] {
            let mut platform = Platform::default();
            platform.set_architecture(arch);
            platform.set_os(Os::Linux);
            children.push((layout::write_blobs(image, &dir).unwrap(), platform));
        }
        layout::write_index(&dir, &children, "latest").unwrap();

        let layout = Layout::open(&dir).unwrap();
        let stored = layout.image("latest", Some(&Arch::ARM64)).unwrap();
        assert_eq!(stored.manifest_digest(), arm64.digest().unwrap());
        assert_eq!(
            stored.platform().map(|p| p.architecture().clone()),
            Some(Arch::ARM64)
        );
        let error = layout
            .image("latest", Some(&Arch::s390x))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("without a linux/s390x image (it has: linux/amd64, linux/arm64)"),
            "{error}"
        );
        let error = layout.image("nope", None).unwrap_err().to_string();
        assert!(error.contains("it has: latest"), "{error}");
    }
}
