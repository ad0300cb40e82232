//! OCI layout bookkeeping: replacing a ref, copying across filesystems with
//! verification, and reading back what was written.

use crate::gate;

use std::path::Path;

use cudastack::cache::BlobStore;
use cudastack::layer::{self, BuildOptions, Compression, Entry, Layer, LayerContents, LayerPath};
use cudastack::oci::{layout, Image, OciError};

const EPOCH: u64 = 1_714_521_600;

fn small_layer(store: &BlobStore, text: &str) -> Layer {
    let contents = LayerContents::from_entries([Entry::file_bytes(
        LayerPath::parse("etc/text").unwrap(),
        0o644,
        text.as_bytes().to_vec(),
    )])
    .unwrap();
    layer::build(
        store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::Gzip { level: 6 }),
    )
    .unwrap()
}

#[test]
fn writing_the_same_ref_again_replaces_it_in_index_and_manifest_json() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let dir = work.path().join("layout");
    let first = Image::new(EPOCH).with_layer(small_layer(&store, "one"), "one");
    let second = Image::new(EPOCH).with_layer(small_layer(&store, "two"), "two");
    layout::write(&first, &dir, "app").unwrap();
    let other = layout::write(&first, &dir, "other").unwrap();
    let replaced = layout::write(&second, &dir, "app").unwrap();

    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 2, "{index}");
    assert_eq!(manifests[0]["digest"], replaced.to_string());
    assert_eq!(manifests[1]["digest"], other.to_string());
    let docker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(docker[0]["RepoTags"][0], "app:latest", "{docker}");
    assert_eq!(docker[1]["RepoTags"][0], "other:latest", "{docker}");
    assert_eq!(
        layout::read(&dir, "app")
            .unwrap()
            .with_created(EPOCH)
            .digest()
            .unwrap(),
        replaced
    );
    // Writing is idempotent: the same image again changes no byte of the index.
    let before = std::fs::read(dir.join("index.json")).unwrap();
    layout::write(&second, &dir, "app").unwrap();
    assert_eq!(std::fs::read(dir.join("index.json")).unwrap(), before);
}

fn on_other_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(a).unwrap().dev() != std::fs::metadata(b).unwrap().dev()
}

#[test]
fn across_filesystems_blobs_are_copied_and_verified() {
    let shm = Path::new("/dev/shm");
    let work = tempfile::tempdir().unwrap();
    if !shm.is_dir() || !on_other_filesystem(shm, work.path()) {
        gate::not_applicable("/dev/shm is not a separate filesystem here");
        return;
    }
    let store_dir = tempfile::tempdir_in(shm).unwrap();
    let store = BlobStore::open(store_dir.path()).unwrap();
    let layer = small_layer(&store, "copied");
    let image = Image::new(EPOCH).with_layer(layer.clone(), "copy");
    let dir = work.path().join("layout");
    layout::write(&image, &dir, "copy").unwrap();
    let copied = layout::blob_path(&dir, &layer.digest);
    assert_eq!(
        std::fs::read(&copied).unwrap(),
        std::fs::read(&layer.blob).unwrap()
    );

    // A store blob that rotted is caught while copying, and nothing is left behind.
    let other_dir = work.path().join("layout2");
    std::fs::write(&layer.blob, b"corrupted").unwrap();
    let corrupt = Layer {
        size: 9,
        ..layer.clone()
    };
    let err =
        layout::write(&Image::new(EPOCH).with_layer(corrupt, "x"), &other_dir, "x").unwrap_err();
    assert!(matches!(err, OciError::BlobMismatch { .. }), "{err}");
    assert!(err.to_string().contains("Expected: sha256:"), "{err}");
    assert!(!layout::blob_path(&other_dir, &layer.digest).exists());
}

#[test]
fn reading_a_missing_layout_or_ref_names_what_is_missing() {
    let work = tempfile::tempdir().unwrap();
    let err = layout::read(&work.path().join("nothing"), "x").unwrap_err();
    assert!(err.to_string().contains("nothing"), "{err}");
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let dir = work.path().join("layout");
    layout::write(
        &Image::new(EPOCH).with_layer(small_layer(&store, "a"), "a"),
        &dir,
        "present",
    )
    .unwrap();
    let err = layout::read(&dir, "absent").unwrap_err().to_string();
    assert!(err.contains("absent") && err.contains("present"), "{err}");
}
