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
//! Every write goes through one [`LayoutWriter`] (issue 16, "Trust"): it holds the
//! layout directory's `flock(2)` for the whole write, so concurrent builds and pulls into
//! one layout never lose each other's `index.json` entries; it writes blobs first and
//! `index.json` last; and dropped without [`LayoutWriter::commit`] (any error, a full
//! disk) it removes every file and directory it created, so a failed write leaves the
//! layout as it was, and a new layout not at all. Temp files (`.tmp-*`) left by a killed
//! writer are removed by the next one, under the lock.
//!
//! Hard links stay (copying gigabytes per build would cost more than the risk): a layout's
//! layer blob and the cache's blob are one file. The cache checks that file against its
//! integrity record before every reuse ([`crate::cas::BlobStore::verified`]), so an edit
//! through the layout is caught at the next build and the cache entry is rebuilt into a
//! new file (the old layout keeps the damaged one, which `skopeo`/`docker` reject by digest).
//! A blob already in the layout is kept only when it is the very file being placed or
//! hashes to its name; otherwise it is replaced with a warning.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use oci_spec::image::{
    ImageConfiguration, ImageIndex, ImageManifest, MediaType, ANNOTATION_REF_NAME,
};

use super::canonical::to_canonical_json;
use super::{annotated, check_tag, digest_of, io_error, DockerManifestEntry, Image, OciError};
use crate::digest::{Digest, HashingWriter};
use crate::layer::Layer;

const LAYOUT_FILE: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;

/// Write `image` into the layout at `dir` under `ref_name` (e.g. `torch2.4-cu121`).
/// Returns the manifest digest.
pub fn write(image: &Image, dir: &Path, ref_name: &str) -> Result<Digest, OciError> {
    let mut writer = LayoutWriter::open(dir)?;
    let descriptor = put_image(&mut writer, image)?;
    name_in_index(&mut writer, descriptor.clone(), ref_name)?;
    writer.commit();
    digest_of(&descriptor).map_err(|problem| OciError::InvalidLayout {
        dir: dir.to_path_buf(),
        problem,
    })
}

/// Put `image`'s layers, config and manifest into the layout at `dir` without naming it
/// (an image index that refers to it names it). Returns the manifest descriptor.
pub fn write_blobs(image: &Image, dir: &Path) -> Result<oci_spec::image::Descriptor, OciError> {
    let mut writer = LayoutWriter::open(dir)?;
    let descriptor = put_image(&mut writer, image)?;
    writer.commit();
    Ok(descriptor)
}

fn put_image(
    writer: &mut LayoutWriter,
    image: &Image,
) -> Result<oci_spec::image::Descriptor, OciError> {
    for layer in image.layers() {
        writer.put_file(&layer.blob, &layer.digest)?;
    }
    let documents = image.documents()?;
    for blob in [&documents.config, &documents.manifest] {
        writer.put_bytes(&blob.bytes)?;
    }
    Ok(documents.manifest_descriptor())
}

/// Write an image index over images already in the layout at `dir` (each given by its
/// manifest descriptor and platform) and name it `ref_name`: a multi-platform image, as
/// `docker buildx` publishes one. Returns the index digest.
pub fn write_index(
    dir: &Path,
    images: &[(oci_spec::image::Descriptor, oci_spec::image::Platform)],
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
    name_in_index(
        &mut writer,
        super::descriptor(MediaType::ImageIndex, &digest, bytes.len() as u64),
        ref_name,
    )?;
    writer.commit();
    Ok(digest)
}

/// Add (or move) the name `ref_name` in the layout's `index.json` to `descriptor`.
fn name_in_index(
    writer: &mut LayoutWriter,
    descriptor: oci_spec::image::Descriptor,
    ref_name: &str,
) -> Result<(), OciError> {
    let dir = writer.dir().to_path_buf();
    let dir = dir.as_path();
    let mut manifests = match read_index(dir) {
        Ok(index) => index.manifests().clone(),
        Err(OciError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    manifests.retain(|existing| ref_name_of(existing) != Some(ref_name));
    let annotations = HashMap::from([(ANNOTATION_REF_NAME.to_string(), ref_name.to_string())]);
    manifests.push(annotated(descriptor, annotations));
    // A fixed order, so the same set of images gives the same index.json.
    manifests.sort_by(|a, b| {
        (ref_name_of(a), a.digest().to_string()).cmp(&(ref_name_of(b), b.digest().to_string()))
    });
    let (index, bytes) = super::image_index(manifests)?;
    write_docker_manifest(writer, index.manifests())?;
    writer.put_top_level("index.json", &bytes)
}

/// `latest` + `arm64` -> `latest-linux-arm64`: the ref of one platform's image beside the
/// image index named `ref_name`.
pub fn platform_ref_name(ref_name: &str, architecture: &str) -> String {
    format!("{ref_name}-linux-{architecture}")
}

/// The configuration of the image manifest `descriptor` names (digest-verified).
pub fn config_of(
    dir: &Path,
    descriptor: &oci_spec::image::Descriptor,
) -> Result<ImageConfiguration, OciError> {
    let manifest: ImageManifest = read_json_blob(dir, descriptor, "an OCI image manifest")?;
    read_json_blob(dir, manifest.config(), "an OCI image configuration")
}

/// The OCI architecture of the build host (`amd64`, `arm64`): which image of a
/// multi-platform index the commands that run or inspect one image pick.
pub fn host_architecture() -> oci_spec::image::Arch {
    crate::platform::Platform::host_or_amd64().to_oci_arch()
}

/// The image manifest `ref_name` names: itself, or for an image index, its linux image of
/// the host's architecture.
fn image_entry(
    dir: &Path,
    index: &ImageIndex,
    ref_name: &str,
    architecture: Option<&oci_spec::image::Arch>,
) -> Result<oci_spec::image::Descriptor, OciError> {
    let Some(entry) = named(index, ref_name) else {
        return Err(OciError::RefNotFound {
            dir: dir.to_path_buf(),
            reference: ref_name.to_string(),
            available: {
                let names = ref_names(index);
                if names.is_empty() {
                    "no named images".to_string()
                } else {
                    names.join(", ")
                }
            },
        });
    };
    if entry.media_type() != &MediaType::ImageIndex {
        return Ok(entry.clone());
    }
    let child_index: ImageIndex = read_json_blob(dir, entry, "an OCI image index")?;
    let host = architecture.cloned().unwrap_or_else(host_architecture);
    let platforms: Vec<String> = child_index
        .manifests()
        .iter()
        .filter_map(|m| m.platform().as_ref())
        .map(|p| format!("{}/{}", p.os(), p.architecture()))
        .collect();
    child_index
        .manifests()
        .iter()
        .find(|m| {
            m.platform().as_ref().is_some_and(|p| {
                p.architecture() == &host && p.os() == &oci_spec::image::Os::Linux
            })
        })
        .cloned()
        .ok_or_else(|| OciError::InvalidLayout {
            dir: dir.to_path_buf(),
            problem: format!(
                "`{ref_name}` is an image index without a linux/{host} image (it has: {}); name one platform's image instead (`{ref_name}-linux-<arch>`)",
                platforms.join(", ")
            ),
        })
}

/// Keep a docker-save `manifest.json` beside `index.json` (as Docker 25+ `save` does),
/// so a plain tar of the layout is also accepted by `docker load` on daemons that
/// need it (Docker < 25, and the classic image store of later versions). A ref name
/// that is a valid Docker reference becomes the tag (`name` means `name:latest`).
fn write_docker_manifest(
    writer: &mut LayoutWriter,
    manifests: &[oci_spec::image::Descriptor],
) -> Result<(), OciError> {
    let dir = writer.dir().to_path_buf();
    let dir = dir.as_path();
    let mut entries = Vec::new();
    for descriptor in manifests {
        if descriptor.media_type() != &MediaType::ImageManifest
            || descriptor.artifact_type().is_some()
        {
            continue;
        }
        let manifest: ImageManifest = read_json_blob(dir, descriptor, "an OCI image manifest")?;
        let name = |d: &oci_spec::image::Descriptor| -> Result<String, OciError> {
            let digest = digest_of(d).map_err(|problem| OciError::InvalidLayout {
                dir: dir.to_path_buf(),
                problem,
            })?;
            Ok(format!("blobs/sha256/{}", digest.hex()))
        };
        let repo_tags = ref_name_of(descriptor)
            .map(|name| {
                if name.contains(':') {
                    name.to_string()
                } else {
                    format!("{name}:latest")
                }
            })
            .filter(|tag| check_tag(tag).is_ok())
            .into_iter()
            .collect();
        entries.push(DockerManifestEntry {
            config: name(manifest.config())?,
            repo_tags,
            layers: manifest
                .layers()
                .iter()
                .map(name)
                .collect::<Result<_, _>>()?,
        });
    }
    let bytes = to_canonical_json(&entries).expect("manifest.json serialises");
    writer.put_top_level("manifest.json", &bytes)
}

/// The entry of `index` named `ref_name`.
fn named<'a>(index: &'a ImageIndex, ref_name: &str) -> Option<&'a oci_spec::image::Descriptor> {
    index
        .manifests()
        .iter()
        .find(|m| ref_name_of(m) == Some(ref_name))
}

/// A small JSON document (manifest, config, index) a descriptor names, digest-verified.
fn read_json_blob<T: serde::de::DeserializeOwned>(
    dir: &Path,
    descriptor: &oci_spec::image::Descriptor,
    what: &'static str,
) -> Result<T, OciError> {
    serde_json::from_slice(&read_blob(dir, descriptor)?).map_err(|source| OciError::Json {
        path: dir.join("blobs"),
        what,
        source,
    })
}

fn ref_name_of(descriptor: &oci_spec::image::Descriptor) -> Option<&str> {
    descriptor
        .annotations()
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REF_NAME))
        .map(String::as_str)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The digest of the file at `path`, streamed.
fn hash_file(path: &Path) -> io::Result<Digest> {
    let mut file = std::fs::File::open(path)?;
    let mut hashing = HashingWriter::new(io::sink());
    io::copy(&mut file, &mut hashing)?;
    Ok(hashing.finish().1)
}

const TEMP_PREFIX: &str = ".tmp-";

/// One exclusive, all-or-nothing write into an OCI layout directory (see the module
/// docs): the directory's lock, blobs placed first, `index.json` last, and on drop without
/// [`LayoutWriter::commit`] every file and directory it created removed again.
#[derive(Debug)]
pub struct LayoutWriter {
    dir: PathBuf,
    /// The open layout directory, whose `flock(2)` is held while the writer lives.
    _lock: std::fs::File,
    /// Files this writer created (not ones it replaced), removed unless committed.
    created: Vec<PathBuf>,
    /// Directories this writer created, outermost first, removed (if empty) unless committed.
    created_dirs: Vec<PathBuf>,
    committed: bool,
}

impl LayoutWriter {
    /// Open (creating if needed) the layout at `dir` and take its lock, waiting for any
    /// other writer of it.
    pub fn open(dir: &Path) -> Result<Self, OciError> {
        let blobs = dir.join("blobs").join("sha256");
        let (lock, created_dirs) = loop {
            let created_dirs: Vec<PathBuf> = [dir.to_path_buf(), dir.join("blobs"), blobs.clone()]
                .into_iter()
                .filter(|d| !d.exists())
                .collect();
            fs_err::create_dir_all(&blobs).map_err(io_error(&blobs))?;
            let handle = std::fs::File::open(dir).map_err(io_error(dir))?;
            handle.lock().map_err(io_error(dir))?;
            // A writer that failed while we waited may have removed the directory it had
            // created: lock the directory that is there now.
            let current = std::fs::metadata(dir).ok();
            let locked = handle.metadata().map_err(io_error(dir))?;
            if current.is_some_and(|c| {
                use std::os::unix::fs::MetadataExt;
                c.ino() == locked.ino() && c.dev() == locked.dev()
            }) && blobs.is_dir()
            {
                break (handle, created_dirs);
            }
        };
        let mut writer = Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            created: Vec::new(),
            created_dirs,
            committed: false,
        };
        // Temp files of a writer that was killed: nobody else writes while we hold the lock.
        for folder in [dir.to_path_buf(), blobs] {
            if let Ok(entries) = std::fs::read_dir(&folder) {
                for entry in entries.flatten() {
                    if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
        }
        let layout_file = dir.join("oci-layout");
        if fs_err::read(&layout_file).ok().as_deref() != Some(LAYOUT_FILE.as_bytes()) {
            writer.put_top_level("oci-layout", LAYOUT_FILE.as_bytes())?;
        }
        Ok(writer)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keep everything written.
    pub fn commit(mut self) {
        self.committed = true;
    }

    /// Whether the layout already holds the blob `digest` as the file `source` or as a
    /// file that hashes to `digest`. A blob with other bytes is reported and will be
    /// replaced.
    fn holds(&self, target: &Path, digest: &Digest, source: Option<&Path>) -> bool {
        if !target.is_file() {
            return false;
        }
        if source.is_some_and(|source| same_file(source, target)) {
            return true;
        }
        match hash_file(target) {
            Ok(found) if found == *digest => true,
            Ok(found) => {
                tracing::warn!(
                    path = %target.display(),
                    expected = %digest,
                    found = %found,
                    "a blob of the OCI layout does not match its digest; replacing it"
                );
                false
            }
            Err(_) => false,
        }
    }

    /// Put the blob at `source`, whose bytes are `digest`, into the layout: a hard link
    /// when the filesystem allows, else a copy hashed on the way (a mismatch is an error
    /// and nothing is kept).
    pub fn put_file(&mut self, source: &Path, digest: &Digest) -> Result<(), OciError> {
        let blobs = self.dir.join("blobs").join("sha256");
        let target = blobs.join(digest.hex());
        if self.holds(&target, digest, Some(source)) {
            return Ok(());
        }
        let existed = target.exists();
        let linked = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .make_in(&blobs, |path| std::fs::hard_link(source, path));
        match linked {
            Ok(temp) => {
                temp.persist(&target)
                    .map_err(|e| io_error(&target)(e.error))?;
            }
            Err(_) => {
                // Different filesystem (or no hardlink support): copy, verifying.
                let mut reader = fs_err::File::open(source).map_err(io_error(source))?;
                let temp =
                    crate::atomic_file::temp_in(&blobs, TEMP_PREFIX).map_err(io_error(&blobs))?;
                let temp_path = temp.path().to_path_buf();
                let mut writer = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, temp));
                io::copy(&mut reader, &mut writer).map_err(io_error(&temp_path))?;
                let (buffered, found, _) = writer.finish();
                let temp = buffered
                    .into_inner()
                    .map_err(|e| io_error(&temp_path)(e.into_error()))?;
                if found != *digest {
                    return Err(OciError::BlobMismatch {
                        path: source.to_path_buf(),
                        expected: *digest,
                        found,
                    });
                }
                crate::atomic_file::persist(temp, &target).map_err(io_error(&target))?;
            }
        }
        if !existed {
            self.created.push(target);
        }
        Ok(())
    }

    /// Put a small document (config, manifest, index) into the layout; returns its digest.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> Result<Digest, OciError> {
        let digest = Digest::of_bytes(bytes);
        let path = blob_path(&self.dir, &digest);
        if !self.holds(&path, &digest, None) {
            self.write_file(&path, bytes)?;
        }
        Ok(digest)
    }

    /// Replace a file at the top of the layout (`index.json`, `manifest.json`,
    /// `oci-layout`) atomically.
    pub fn put_top_level(&mut self, name: &str, bytes: &[u8]) -> Result<(), OciError> {
        let path = self.dir.join(name);
        self.write_file(&path, bytes)
    }

    fn write_file(&mut self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let existed = path.exists();
        let folder = path.parent().unwrap_or(&self.dir);
        let mut temp =
            crate::atomic_file::temp_in(folder, TEMP_PREFIX).map_err(io_error(folder))?;
        temp.write_all(bytes).map_err(io_error(temp.path()))?;
        crate::atomic_file::persist(temp, path).map_err(io_error(path))?;
        if !existed {
            self.created.push(path.to_path_buf());
        }
        Ok(())
    }
}

impl Drop for LayoutWriter {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for path in self.created.iter().rev() {
            let _ = std::fs::remove_file(path);
        }
        for dir in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &'static str,
) -> Result<T, OciError> {
    let bytes = fs_err::read(path).map_err(|e| OciError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(e.kind(), e),
    })?;
    serde_json::from_slice(&bytes).map_err(|source| OciError::Json {
        path: path.to_path_buf(),
        what,
        source,
    })
}

fn read_index(dir: &Path) -> Result<ImageIndex, OciError> {
    read_json(&dir.join("index.json"), "an OCI image index")
}

/// Read a blob named by a descriptor, verifying its digest (small documents only).
fn read_blob(dir: &Path, descriptor: &oci_spec::image::Descriptor) -> Result<Vec<u8>, OciError> {
    let digest = digest_of(descriptor).map_err(|problem| OciError::InvalidLayout {
        dir: dir.to_path_buf(),
        problem,
    })?;
    let path = blob_path(dir, &digest);
    let bytes = fs_err::read(&path).map_err(io_error(&path))?;
    let found = Digest::of_bytes(&bytes);
    if found != digest {
        return Err(OciError::BlobMismatch {
            path,
            expected: digest,
            found,
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
    let index = read_index(dir)?;
    let entry = &image_entry(dir, &index, ref_name, None)?;
    let invalid = |problem: String| OciError::InvalidLayout {
        dir: dir.to_path_buf(),
        problem,
    };
    let manifest: ImageManifest = read_json_blob(dir, entry, "an OCI image manifest")?;
    let config: ImageConfiguration =
        read_json_blob(dir, manifest.config(), "an OCI image configuration")?;
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != manifest.layers().len() {
        return Err(invalid(format!(
            "image `{ref_name}` has {} layers but {} diff_ids",
            manifest.layers().len(),
            diff_ids.len()
        )));
    }
    let mut layers = Vec::new();
    for (descriptor, diff_id) in manifest.layers().iter().zip(diff_ids) {
        let digest = digest_of(descriptor).map_err(invalid)?;
        let diff_id: Digest = diff_id
            .parse()
            .map_err(|e: crate::digest::DigestError| invalid(e.to_string()))?;
        let blob = blob_path(dir, &digest);
        if !blob.is_file() {
            return Err(invalid(format!("layer blob {digest} is missing")));
        }
        layers.push(Layer {
            digest,
            diff_id,
            size: descriptor.size(),
            uncompressed_size: None,
            media_type: normalise_layer_media_type(descriptor.media_type()),
            blob,
        });
    }
    let mut history = config.history().clone().unwrap_or_default();
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
        config: config.config().clone().unwrap_or_default(),
        architecture: config.architecture().clone(),
        os: config.os().clone(),
        created: config
            .created()
            .as_deref()
            .and_then(super::parse_rfc3339)
            .unwrap_or(0),
    })
}

/// An image of a layout as its documents: what `inspect` and `check` read, without
/// touching layers.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    pub manifest: oci_spec::image::Descriptor,
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
    let index = read_index(dir)?;
    let entry = &image_entry(dir, &index, ref_name, architecture)?;
    let invalid = |problem: String| OciError::InvalidLayout {
        dir: dir.to_path_buf(),
        problem,
    };
    let manifest: ImageManifest = read_json_blob(dir, entry, "an OCI image manifest")?;
    let config: ImageConfiguration =
        read_json_blob(dir, manifest.config(), "an OCI image configuration")?;
    Ok(ResolvedImage {
        manifest: entry.clone(),
        manifest_digest: digest_of(entry).map_err(invalid)?,
        config_digest: digest_of(manifest.config()).map_err(invalid)?,
        config,
    })
}

/// The ref names of a layout's index, sorted.
pub fn list_refs(dir: &Path) -> Result<Vec<String>, OciError> {
    Ok(ref_names(&read_index(dir)?))
}

fn ref_names(index: &ImageIndex) -> Vec<String> {
    let mut names: Vec<String> = index
        .manifests()
        .iter()
        .filter_map(ref_name_of)
        .map(str::to_string)
        .collect();
    names.sort();
    names
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
    name_in_index(&mut writer, entry, ref_name)?;
    writer.commit();
    Ok(digest)
}

/// The first blob of the artifact named `ref_name` (digest-verified), or None when the
/// layout has no such name.
pub fn read_artifact_blob(dir: &Path, ref_name: &str) -> Result<Option<Vec<u8>>, OciError> {
    let index = read_index(dir)?;
    let Some(entry) = named(&index, ref_name) else {
        return Ok(None);
    };
    let manifest: ImageManifest = read_json_blob(dir, entry, "an artifact manifest")?;
    match manifest.layers().first() {
        Some(blob) => Ok(Some(read_blob(dir, blob)?)),
        None => Ok(None),
    }
}

/// The images of the image index `ref_name` names, with their platforms; None when the
/// name is one image's.
pub fn index_images(
    dir: &Path,
    ref_name: &str,
) -> Result<Option<Vec<(oci_spec::image::Descriptor, oci_spec::image::Platform)>>, OciError> {
    let index = read_index(dir)?;
    let Some(entry) = named(&index, ref_name) else {
        return Ok(None);
    };
    if entry.media_type() != &MediaType::ImageIndex {
        return Ok(None);
    }
    let child_index: ImageIndex = read_json_blob(dir, entry, "an OCI image index")?;
    let mut images = Vec::new();
    for child in child_index.manifests() {
        // cudastack's indexes always name each child's platform; one written by another
        // tool may not, and then the child's own config says which platform it is (a
        // default would relabel an arm64 image amd64 when the index is rewritten).
        let platform = match child.platform() {
            Some(platform) => platform.clone(),
            None => {
                let config = config_of(dir, child)?;
                let mut platform = oci_spec::image::Platform::default();
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
