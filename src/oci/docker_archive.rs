//! The docker-archive output: a `docker load` stream, written as it is read.
//!
//! The archive is both a docker-save tar and an OCI image layout, the way Docker 25+
//! saves images: `manifest.json` (required by Docker before 25, CRATES.md pitfall 3)
//! points at `blobs/sha256/<hex>` files that `index.json` and `oci-layout` also
//! describe. Layer blobs are streamed from where they are stored; nothing is buffered
//! beyond one copy buffer, so the writer can feed a pipe to the daemon.
//! Layers may be uncompressed (the fast path for a local daemon, DESIGN.md) or gzip;
//! zstd layers need Docker >= 23.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use oci_spec::image::ANNOTATION_REF_NAME;

use super::{annotated, check_tag, DockerManifestEntry, Image, OciError, StoredImage};
use crate::canonical::to_canonical_json;
use crate::layer::{ContentError, Header, Layer, TarWriter};

/// Stream `image` as a docker-archive tar (also a valid OCI layout tar) into `out`,
/// tagged with `tags` (`name:tag`). Returns `out`.
pub fn write<W: Write>(image: &Image, tags: &[String], out: W) -> Result<W, OciError> {
    write_stored(&StoredImage::of(image)?, tags, 0, out)
}

/// Stream a stored image as a docker-archive tar into `out`, its manifest and config as
/// stored. The first `present` layers are written as empty files: a daemon with the
/// classic image store (Docker's `tarexport` loader) looks each layer's chain ID up before
/// opening its file, so layers it already has need not be sent. With `present > 0` the
/// result is only for such a daemon: it is not a valid OCI layout any more.
pub fn write_stored<W: Write>(
    image: &StoredImage,
    tags: &[String],
    present: usize,
    out: W,
) -> Result<W, OciError> {
    for tag in tags {
        check_tag(tag)?;
    }
    let mut archive = Archive {
        tar: TarWriter::new(out, image.created()),
    };
    for dir in ["blobs/", "blobs/sha256/"] {
        archive.directory(dir)?;
    }
    archive.small(&blob_name(image.config.digest.hex()), &image.config.bytes)?;
    archive.layers(&image.layers, present)?;
    archive.small(
        &blob_name(image.manifest.digest.hex()),
        &image.manifest.bytes,
    )?;
    archive.small("index.json", &index_json(image, tags)?)?;
    archive.small("manifest.json", &docker_manifest(image, tags))?;
    archive.small("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    archive.tar.finish().map_err(OciError::WriteArchive)
}

fn blob_name(hex: String) -> String {
    format!("blobs/sha256/{hex}")
}

/// The archive's `index.json`: one entry per tag, named like Docker's own save does.
fn index_json(image: &StoredImage, tags: &[String]) -> Result<Vec<u8>, OciError> {
    let mut manifests = Vec::new();
    let mut sorted_tags: Vec<&String> = tags.iter().collect();
    sorted_tags.sort();
    for tag in &sorted_tags {
        let short = tag.rsplit_once(':').map_or(tag.as_str(), |(_, t)| t);
        let annotations = HashMap::from([
            ("io.containerd.image.name".to_string(), tag.to_string()),
            (ANNOTATION_REF_NAME.to_string(), short.to_string()),
        ]);
        manifests.push(annotated(image.manifest_descriptor(), annotations));
    }
    if manifests.is_empty() {
        manifests.push(image.manifest_descriptor());
    }
    Ok(super::image_index(manifests)?.1)
}

/// The archive's docker-save `manifest.json` (what `docker load` before 25 reads).
fn docker_manifest(image: &StoredImage, tags: &[String]) -> Vec<u8> {
    let docker_manifest = [DockerManifestEntry {
        config: blob_name(image.config.digest.hex()),
        repo_tags: tags.to_vec(),
        layers: image
            .layers
            .iter()
            .map(|layer| blob_name(layer.digest.hex()))
            .collect(),
    }];
    to_canonical_json(&docker_manifest).expect("manifest serialises")
}

/// The tar being written.
struct Archive<W: Write> {
    tar: TarWriter<W>,
}

impl<W: Write> Archive<W> {
    fn directory(&mut self, name: &str) -> Result<(), OciError> {
        self.tar
            .write_header(&header(name, b'5', 0o755, 0))
            .map_err(OciError::WriteArchive)
    }

    /// A file whose bytes are in memory.
    fn small(&mut self, name: &str, bytes: &[u8]) -> Result<(), OciError> {
        let mut write = || {
            self.tar
                .write_header(&header(name, b'0', 0o644, bytes.len() as u64))?;
            self.tar.get_mut().write_all(bytes)?;
            self.tar.pad(bytes.len() as u64)
        };
        write().map_err(OciError::WriteArchive)
    }

    /// Each layer blob once, streamed from its file; the first `present` as empty files
    /// (see [`write_stored`]).
    fn layers(&mut self, layers: &[Layer], present: usize) -> Result<(), OciError> {
        let mut written = HashSet::new();
        // A blob that also appears after the present prefix must be sent whole.
        let needed: HashSet<_> = layers.iter().skip(present).map(|l| l.digest).collect();
        for (index, layer) in layers.iter().enumerate() {
            if !written.insert(layer.digest) {
                continue;
            }
            let name = blob_name(layer.digest.hex());
            if index < present && !needed.contains(&layer.digest) {
                self.small(&name, b"")?;
            } else {
                self.layer(&name, layer)?;
            }
        }
        Ok(())
    }

    fn layer(&mut self, name: &str, layer: &Layer) -> Result<(), OciError> {
        let mut reader = layer.open()?;
        self.tar
            .append_reader(&header(name, b'0', 0o644, layer.size), &mut reader)
            .map_err(|error| match error {
                ContentError::Write(e) => OciError::WriteArchive(e),
                ContentError::Read(source) => OciError::Io {
                    path: layer.blob.clone(),
                    source,
                },
                ContentError::SizeMismatch { found } => OciError::InvalidLayout {
                    dir: layer.blob.clone(),
                    problem: format!(
                        "layer blob {} has {found} bytes, its descriptor says {}",
                        layer.digest, layer.size
                    ),
                },
            })
    }
}

fn header(name: &str, typeflag: u8, mode: u32, size: u64) -> Header<'_> {
    Header {
        name,
        typeflag,
        mode,
        uid: 0,
        gid: 0,
        size,
        link_name: "",
    }
}

#[cfg(test)]
mod tests {
    use crate::oci::check_tag;

    #[test]
    fn tags_are_checked() {
        for good in [
            "busybox:1",
            "cudastack/torch:2.4.1-cu121",
            "localhost:5000/a/b:T1",
        ] {
            assert!(check_tag(good).is_ok(), "{good}");
        }
        for bad in ["", "UPPER", "a b:c", ":x", "x:"] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }
}
