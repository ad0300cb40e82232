//! The docker-archive output: a `docker load` stream, written as it is read.
//!
//! The archive is both a docker-save tar and an OCI image layout, the way Docker 25+
//! saves images: `manifest.json` (required by Docker before 25, CRATES.md pitfall 3)
//! points at `blobs/sha256/<hex>` files that `index.json` and `oci-layout` also
//! describe. Layer blobs are streamed from where they are stored; nothing is buffered
//! beyond one copy buffer, so the writer can feed a pipe to the daemon.
//! Layers may be uncompressed (the fast path for a local daemon, DESIGN.md) or gzip;
//! zstd layers need Docker >= 23.

use std::collections::HashMap;
use std::io::Write;

use oci_spec::image::ANNOTATION_REF_NAME;

use super::canonical::to_canonical_json;
use super::{annotated, check_tag, DockerManifestEntry, Image, OciError};
use crate::layer::{ContentError, Header, TarWriter};

/// Stream `image` as a docker-archive tar (also a valid OCI layout tar) into `out`,
/// tagged with `tags` (`name:tag`). Returns `out`.
pub fn write<W: Write>(image: &Image, tags: &[String], out: W) -> Result<W, OciError> {
    write_skipping(image, tags, 0, out)
}

/// Like [`write`], but the first `present` layers are written as empty files: a daemon
/// with the classic image store (Docker's `tarexport` loader) looks each layer's chain ID
/// up before opening its file, so layers it already has need not be sent. The result is
/// only for such a daemon: it is not a valid OCI layout any more.
pub fn write_skipping<W: Write>(
    image: &Image,
    tags: &[String],
    present: usize,
    out: W,
) -> Result<W, OciError> {
    for tag in tags {
        check_tag(tag)?;
    }
    let documents = image.documents()?;
    let blob_name = |hex: String| format!("blobs/sha256/{hex}");
    let mut tar = TarWriter::new(out, image.created());
    let write_err = OciError::WriteArchive;

    for dir in ["blobs/", "blobs/sha256/"] {
        tar.write_header(&header(dir, b'5', 0o755, 0))
            .map_err(write_err)?;
    }
    let small = |tar: &mut TarWriter<W>, name: &str, bytes: &[u8]| {
        tar.write_header(&header(name, b'0', 0o644, bytes.len() as u64))?;
        tar.get_mut().write_all(bytes)?;
        tar.pad(bytes.len() as u64)
    };
    small(
        &mut tar,
        &blob_name(documents.config.digest.hex()),
        &documents.config.bytes,
    )
    .map_err(write_err)?;

    let mut written = std::collections::HashSet::new();
    // A blob that also appears after the present prefix must be sent whole.
    let needed: std::collections::HashSet<_> = image
        .layers()
        .iter()
        .skip(present)
        .map(|l| l.digest)
        .collect();
    for (index, layer) in image.layers().iter().enumerate() {
        if !written.insert(layer.digest) {
            continue;
        }
        let name = blob_name(layer.digest.hex());
        if index < present && !needed.contains(&layer.digest) {
            small(&mut tar, &name, b"").map_err(write_err)?;
            continue;
        }
        let mut reader = layer.open()?;
        tar.append_reader(&header(&name, b'0', 0o644, layer.size), &mut reader)
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
            })?;
    }
    small(
        &mut tar,
        &blob_name(documents.manifest.digest.hex()),
        &documents.manifest.bytes,
    )
    .map_err(write_err)?;

    // index.json: one entry per tag, named like Docker's own save does.
    let mut manifests = Vec::new();
    let mut sorted_tags: Vec<&String> = tags.iter().collect();
    sorted_tags.sort();
    for tag in &sorted_tags {
        let short = tag.rsplit_once(':').map_or(tag.as_str(), |(_, t)| t);
        let annotations = HashMap::from([
            ("io.containerd.image.name".to_string(), tag.to_string()),
            (ANNOTATION_REF_NAME.to_string(), short.to_string()),
        ]);
        manifests.push(annotated(documents.manifest_descriptor(), annotations));
    }
    if manifests.is_empty() {
        manifests.push(documents.manifest_descriptor());
    }
    let (_, index_bytes) = super::image_index(manifests)?;
    small(&mut tar, "index.json", &index_bytes).map_err(write_err)?;

    let docker_manifest = [DockerManifestEntry {
        config: blob_name(documents.config.digest.hex()),
        repo_tags: tags.to_vec(),
        layers: image
            .layers()
            .iter()
            .map(|layer| blob_name(layer.digest.hex()))
            .collect(),
    }];
    let manifest_bytes = to_canonical_json(&docker_manifest).expect("manifest serialises");
    small(&mut tar, "manifest.json", &manifest_bytes).map_err(write_err)?;
    small(&mut tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(write_err)?;
    tar.finish().map_err(write_err)
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
