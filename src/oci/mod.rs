//! Images as values, and the documents derived from them (config, manifest).
//!
//! Position in the pipeline: after `layer` (which produces [`Layer`] blobs), before the
//! outputs. An [`Image`] is an ordered list of layers plus the runtime configuration;
//! `with_*` functions return new images, so "the base image plus a CUDA layer" and
//! "the same image with verification labels" are two values sharing their layers.
//! The config and manifest are built with oci-spec and serialised canonically
//! ([`canonical`]): the bytes hashed are the bytes written.
//!
//! Every output takes the same image as it is stored, a [`StoredImage`] (STYLE.md 3): its manifest and config bytes, computed once from an [`Image`]
//! ([`StoredImage::of`]) or read from a layout ([`layout::Layout`]), and its layer blobs.
//! [`layout::write_stored`] (an OCI image layout directory), [`docker_archive::write_stored`]
//! (a `docker load` stream), and the outputs above this module (`engine`, `registry`) take
//! it. Reading an existing layout as a base image is [`layout::read`]; [`layout::Layout`]
//! is the one reader of a layout's `index.json` and [`layout::LayoutWriter`] its one writer.
//!
//! Depends on `layer` (the [`Layer`] blobs), `digest` and `canonical`; never on an output.

/// Canonical JSON lives at the vocabulary level ([`crate::canonical`]), below both `layer`
/// and `oci`; this path is kept for callers that name it here.
pub use crate::canonical;
pub mod docker_archive;
pub mod layout;
pub mod stored;

use std::io;
use std::path::PathBuf;
use std::str::FromStr;

use oci_spec::image::{
    Arch, Config, ConfigBuilder, Descriptor, DescriptorBuilder, History, HistoryBuilder,
    ImageConfiguration, ImageConfigurationBuilder, ImageManifest, ImageManifestBuilder, MediaType,
    Os, RootFsBuilder,
};

use crate::canonical::to_canonical_json;
use crate::digest::Digest;
use crate::layer::{Layer, LayerError};
pub use stored::StoredImage;

/// Errors from building and writing images.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`{path}` is not valid JSON for {what}")]
    Json {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("failed to build the image {what}")]
    Spec {
        what: &'static str,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("no image named `{reference}` in the OCI layout `{dir}` (it has: {available})")]
    RefNotFound {
        dir: PathBuf,
        reference: String,
        available: String,
    },
    /// A layout may come from a pull request, and its documents are read whole.
    #[error("`{path}` is larger than {limit} bytes, more than any OCI index, manifest or config\n  hint: check that this is the OCI layout you meant")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("`{path}` is {kind}, not a regular file; cudastack reads an OCI layout's documents from regular files only (a FIFO blocks a read, a device never ends)\n  hint: put the file itself in the layout")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("the OCI layout `{dir}`: {problem}")]
    InvalidLayout { dir: PathBuf, problem: String },
    #[error(
        "blob `{path}` does not match its digest\n  Expected: {expected}\n  Found:    {found}"
    )]
    BlobMismatch {
        path: PathBuf,
        expected: Digest,
        found: Digest,
    },
    #[error(
        "`{tag}` is not a valid image tag (expected name[:tag], e.g. `cudastack/torch:2.4.1`)"
    )]
    InvalidTag { tag: String },
    #[error("failed to write the docker archive")]
    WriteArchive(#[source] io::Error),
    #[error(transparent)]
    Layer(#[from] LayerError),
}

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> OciError {
    let path = path.into();
    move |source| OciError::Io { path, source }
}

/// Seconds since the epoch as RFC 3339 UTC (`2024-05-01T12:00:00Z`); epochs past year 9999
/// (refused by the recipe parser) saturate at its last second. Civil time rather than
/// `jiff::Timestamp`, whose range ends a day early to leave room for offsets.
pub fn rfc3339(epoch: u64) -> String {
    let seconds = i64::try_from(epoch).unwrap_or(i64::MAX);
    let time = unix_epoch()
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(jiff::civil::date(9999, 12, 31).at(23, 59, 59, 0));
    // Whole seconds: jiff prints no fraction for them, so the bytes match other writers.
    format!("{time}Z")
}

/// Parse RFC 3339 UTC (`2024-05-01T12:00:00Z`, fractional seconds ignored) back to seconds
/// since the epoch: the inverse of [`rfc3339`]. None for other spellings or offsets, and for
/// times before the epoch.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let time: jiff::civil::DateTime = text.strip_suffix('Z')?.parse().ok()?;
    let since = time.duration_since(unix_epoch());
    u64::try_from(since.as_secs()).ok()
}

fn unix_epoch() -> jiff::civil::DateTime {
    jiff::civil::date(1970, 1, 1).at(0, 0, 0, 0)
}

/// Build a descriptor from our digest type.
pub fn descriptor(media_type: MediaType, digest: &Digest, size: u64) -> Descriptor {
    let digest = oci_spec::image::Digest::from_str(&digest.to_string())
        .expect("a sha256 digest is a valid OCI digest");
    Descriptor::new(media_type, size, digest)
}

/// Parse an OCI descriptor's digest into ours.
pub fn digest_of(descriptor: &Descriptor) -> Result<Digest, String> {
    descriptor
        .digest()
        .to_string()
        .parse()
        .map_err(|e: crate::digest::DigestError| e.to_string())
}

/// A serialised document (config or manifest): its canonical bytes and their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub bytes: Vec<u8>,
    pub digest: Digest,
}

impl Blob {
    fn of<T: serde::Serialize>(value: &T) -> Self {
        let bytes = to_canonical_json(value).expect("OCI documents serialise");
        let digest = Digest::of_bytes(&bytes);
        Self { bytes, digest }
    }
    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// An image: layers in order plus configuration. Cheap to clone (layers are descriptors).
#[derive(Debug, Clone)]
pub struct Image {
    layers: Vec<Layer>,
    history: Vec<History>,
    config: Config,
    architecture: Arch,
    os: Os,
    created: u64,
}

impl Image {
    /// An empty linux/amd64 image created at `created` (SOURCE_DATE_EPOCH).
    pub fn new(created: u64) -> Self {
        Self {
            layers: Vec::new(),
            history: Vec::new(),
            config: Config::default(),
            architecture: Arch::Amd64,
            os: Os::Linux,
            created,
        }
    }

    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    pub fn runtime_config(&self) -> &Config {
        &self.config
    }

    pub fn history(&self) -> &[History] {
        &self.history
    }

    pub fn created(&self) -> u64 {
        self.created
    }

    pub fn with_created(mut self, created: u64) -> Self {
        self.created = created;
        self
    }

    pub fn with_platform(mut self, architecture: Arch, os: Os) -> Self {
        self.architecture = architecture;
        self.os = os;
        self
    }

    /// Append a layer, with a history entry saying what made it.
    pub fn with_layer(mut self, layer: Layer, created_by: &str) -> Self {
        let history = HistoryBuilder::default()
            .created(rfc3339(self.created))
            .created_by(created_by.to_string())
            .comment("cudastack".to_string())
            .build()
            .expect("history has no required fields");
        self.layers.push(layer);
        self.history.push(history);
        self
    }

    /// Replace the runtime configuration as a whole.
    pub fn with_config(mut self, edit: impl FnOnce(&mut Config)) -> Self {
        edit(&mut self.config);
        self
    }

    /// Set an environment variable (replacing an earlier value of the same name).
    pub fn with_env(self, name: &str, value: &str) -> Self {
        self.with_config(|config| {
            let mut env = config.env().clone().unwrap_or_default();
            let prefix = format!("{name}=");
            env.retain(|item| !item.starts_with(&prefix));
            env.push(format!("{name}={value}"));
            config.set_env(Some(env));
        })
    }

    pub fn with_label(self, name: &str, value: &str) -> Self {
        self.with_config(|config| {
            let mut labels = config.labels().clone().unwrap_or_default();
            labels.insert(name.to_string(), value.to_string());
            config.set_labels(Some(labels));
        })
    }

    pub fn with_entrypoint(self, entrypoint: Vec<String>) -> Self {
        self.with_config(|config| {
            config.set_entrypoint(Some(entrypoint));
        })
    }

    pub fn with_cmd(self, cmd: Vec<String>) -> Self {
        self.with_config(|config| {
            config.set_cmd(Some(cmd));
        })
    }

    pub fn with_working_dir(self, dir: &str) -> Self {
        self.with_config(|config| {
            config.set_working_dir(Some(dir.to_string()));
        })
    }

    /// The image configuration document.
    pub fn configuration(&self) -> Result<ImageConfiguration, OciError> {
        let spec = |source| OciError::Spec {
            what: "configuration",
            source,
        };
        let rootfs = RootFsBuilder::default()
            .typ("layers".to_string())
            .diff_ids(
                self.layers
                    .iter()
                    .map(|layer| layer.diff_id.to_string())
                    .collect::<Vec<_>>(),
            )
            .build()
            .map_err(spec)?;
        let config = if self.config == Config::default() {
            ConfigBuilder::default().build().map_err(spec)?
        } else {
            self.config.clone()
        };
        let mut builder = ImageConfigurationBuilder::default()
            .created(rfc3339(self.created))
            .architecture(self.architecture.clone())
            .os(self.os.clone())
            .config(config)
            .rootfs(rootfs);
        if !self.history.is_empty() {
            builder = builder.history(self.history.clone());
        }
        builder.build().map_err(spec)
    }

    /// The canonical config blob.
    pub fn config_blob(&self) -> Result<Blob, OciError> {
        Ok(Blob::of(&self.configuration()?))
    }

    /// The manifest document for a given config blob.
    fn manifest_for(&self, config: &Blob) -> Result<ImageManifest, OciError> {
        ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(descriptor(
                MediaType::ImageConfig,
                &config.digest,
                config.size(),
            ))
            .layers(
                self.layers
                    .iter()
                    .map(|layer| descriptor(layer.media_type.clone(), &layer.digest, layer.size))
                    .collect::<Vec<_>>(),
            )
            .build()
            .map_err(|source| OciError::Spec {
                what: "manifest",
                source,
            })
    }

    /// Config and manifest blobs, computed together (the manifest names the config).
    pub fn documents(&self) -> Result<Documents, OciError> {
        let config = self.config_blob()?;
        let manifest = Blob::of(&self.manifest_for(&config)?);
        Ok(Documents { config, manifest })
    }

    /// The manifest digest: the image's identity.
    pub fn digest(&self) -> Result<Digest, OciError> {
        Ok(self.documents()?.manifest.digest)
    }
}

/// The serialised config and manifest of an image.
#[derive(Debug, Clone)]
pub struct Documents {
    pub config: Blob,
    pub manifest: Blob,
}

impl Documents {
    pub fn manifest_descriptor(&self) -> Descriptor {
        descriptor(
            MediaType::ImageManifest,
            &self.manifest.digest,
            self.manifest.size(),
        )
    }
}

/// Check a `name[:tag]` reference enough to give a clear error before Docker does.
pub(crate) fn check_tag(tag: &str) -> Result<(), OciError> {
    let valid = !tag.is_empty()
        && !tag.starts_with(['/', ':', '.', '-'])
        && !tag.ends_with([':', '/'])
        && tag.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b"._-/:".contains(&b)
                || (b.is_ascii_uppercase() && tag.rfind(':').is_some())
        });
    if valid {
        Ok(())
    } else {
        Err(OciError::InvalidTag {
            tag: tag.to_string(),
        })
    }
}

/// One entry of a docker-save `manifest.json` (what `docker load` before 25 reads).
#[derive(serde::Serialize)]
pub(crate) struct DockerManifestEntry {
    #[serde(rename = "Config")]
    pub config: String,
    #[serde(rename = "RepoTags")]
    pub repo_tags: Vec<String>,
    #[serde(rename = "Layers")]
    pub layers: Vec<String>,
}

/// Build a descriptor with annotations (used for index entries).
pub(crate) fn annotated(
    base: Descriptor,
    annotations: std::collections::HashMap<String, String>,
) -> Descriptor {
    let mut descriptor = DescriptorBuilder::default()
        .media_type(base.media_type().clone())
        .digest(base.digest().clone())
        .size(base.size())
        .annotations(annotations)
        .build()
        .expect("descriptor fields are set");
    // An artifact's entry keeps its type: what tells a referrer from an image in an index.
    descriptor.set_artifact_type(base.artifact_type().clone());
    descriptor
}

/// An image index over `manifests`, as the value and its canonical JSON bytes (the layout's
/// `index.json` and the docker-archive's share this one spelling).
pub fn image_index(
    manifests: Vec<Descriptor>,
) -> Result<(oci_spec::image::ImageIndex, Vec<u8>), OciError> {
    let index = oci_spec::image::ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests)
        .build()
        .map_err(|source| OciError::Spec {
            what: "index",
            source,
        })?;
    let bytes = to_canonical_json(&index).expect("index serialises");
    Ok((index, bytes))
}

/// The OCI chain IDs of a stack of layers, bottom to top: the first layer's is its diff_id,
/// each next one `sha256("<chain id below> <diff_id>")`. A runtime keys its unpacked layers
/// by these, so two images share a layer on a node only when they share its chain.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut chain: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match chain.last() {
            None => *diff_id,
            Some(below) => Digest::of_bytes(format!("{below} {diff_id}").as_bytes()),
        };
        chain.push(next);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_back() {
        for epoch in [0, 951_782_400, 1_700_000_000, 4_102_444_799, 1_704_067_200] {
            assert_eq!(parse_rfc3339(&rfc3339(epoch)), Some(epoch));
        }
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20+01:00"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
        // The recipe's last allowed second (year 9999) round-trips; later epochs saturate.
        let last = 253_402_300_799;
        assert_eq!(rfc3339(last), "9999-12-31T23:59:59Z");
        assert_eq!(parse_rfc3339(&rfc3339(last)), Some(last));
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn config_is_canonical_and_images_are_values() {
        let layer = Layer {
            digest: Digest::of_bytes(b"blob"),
            diff_id: Digest::of_bytes(b"tar"),
            size: 4,
            uncompressed_size: Some(3),
            media_type: MediaType::ImageLayerGzip,
            blob: PathBuf::from("/nonexistent"),
        };
        let mut base = Image::new(1_700_000_000).with_layer(layer, "test layer");
        for i in 0..20 {
            base = base.with_label(&format!("io.cudastack.l{i}"), "x");
        }
        let labelled = base.clone().with_label("io.cudastack.verified", "true");
        let first = base.documents().unwrap();
        for _ in 0..5 {
            assert_eq!(base.clone().documents().unwrap().config, first.config);
        }
        assert_ne!(labelled.digest().unwrap(), base.digest().unwrap());
        let text = String::from_utf8(first.config.bytes.clone()).unwrap();
        assert!(
            text.contains(r#""created":"2023-11-14T22:13:20Z""#),
            "{text}"
        );
        assert!(
            text.contains(&Digest::of_bytes(b"tar").to_string()),
            "{text}"
        );
        let env = Image::new(0)
            .with_env("PATH", "/a")
            .with_env("X", "1")
            .with_env("PATH", "/b");
        assert_eq!(
            env.runtime_config().env().clone().unwrap(),
            ["X=1", "PATH=/b"]
        );
    }
}
