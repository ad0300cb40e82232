//! `pull` against a real registry (Debian's docker-registry on 127.0.0.1) with a damaged
//! blob cache (issue 16, "Trust"): a cached blob was reused, and hard-linked into the new
//! layout, because it existed; now it is checked, fetched again with a warning, and the new
//! layout holds the registry's bytes. A pull that fails leaves no layout and no temp file.

use crate::oci_support;
use crate::registry_support;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::oci;
use cudastack::registry::{
    pull, push_image, ClientOptions, Platform, PushOptions, Reference, RegistryClient,
};
use registry_support::*;

fn hash(path: &Path) -> Digest {
    Digest::of_bytes(&std::fs::read(path).unwrap())
}

fn names_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(names_under(&path));
        }
        out.push(path.display().to_string());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_cached_blob_is_fetched_again_not_linked_into_the_layout() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let source = BlobStore::open(work.path().join("source")).unwrap();
    let base = random_layer(&source, "base", 11, 1 << 20);
    let app = random_layer(&source, "app", 12, 1 << 20);
    let image = image_of(&[base.clone(), app.clone()], "integrity");
    let reference: Reference = format!("{}/cudastack/integrity:a", registry.host())
        .parse()
        .unwrap();
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let digest = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap()
        .manifest_digest;

    let cache = BlobStore::open(work.path().join("cache")).unwrap();
    let first_dir = work.path().join("first");
    let first = pull(
        &client,
        &reference,
        &Platform::default(),
        &cache,
        &first_dir,
        "a",
    )
    .await
    .unwrap();
    assert_eq!(first.manifest_digest, digest);

    // Flip a byte of the cached base layer in place (after a timestamp tick, as a later
    // accident would be), and truncate the app layer.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(cache.path(&base.digest))
        .unwrap();
    file.seek(SeekFrom::Start(base.size / 2)).unwrap();
    file.write_all(b"\0\0\0\0").unwrap();
    drop(file);
    std::fs::OpenOptions::new()
        .write(true)
        .open(cache.path(&app.digest))
        .unwrap()
        .set_len(10)
        .unwrap();

    let second_dir = work.path().join("second");
    let second = pull(
        &client,
        &reference,
        &Platform::default(),
        &cache,
        &second_dir,
        "a",
    )
    .await
    .unwrap();
    assert_eq!(
        second.bytes_downloaded,
        base.size + app.size,
        "the damaged blobs were reused: {second:?}"
    );
    for layer in [&base, &app] {
        assert_eq!(
            hash(&oci::layout::blob_path(&second_dir, &layer.digest)),
            layer.digest
        );
        assert_eq!(hash(&cache.path(&layer.digest)), layer.digest);
    }
    // Pulling into the first layout again repairs its damaged (hard-linked) copies too.
    pull(
        &client,
        &reference,
        &Platform::default(),
        &cache,
        &first_dir,
        "a",
    )
    .await
    .unwrap();
    for layer in [&base, &app] {
        assert_eq!(
            hash(&oci::layout::blob_path(&first_dir, &layer.digest)),
            layer.digest
        );
    }
    if oci_support::have("skopeo") {
        oci_support::run(
            std::process::Command::new("skopeo")
                .args(["inspect", &format!("oci:{}:a", second_dir.display())]),
        );
    }

    // A pull that fails (the registry is gone) leaves no layout and no temp file.
    let empty_cache = BlobStore::open(work.path().join("empty-cache")).unwrap();
    registry.kill();
    let failed_dir = work.path().join("failed");
    let error = pull(
        &client,
        &reference,
        &Platform::default(),
        &empty_cache,
        &failed_dir,
        "a",
    )
    .await
    .unwrap_err();
    eprintln!("failed as expected: {error}");
    assert!(!failed_dir.exists());
    assert_eq!(
        names_under(&empty_cache.tmp_dir()),
        Vec::<String>::new(),
        "temp files left behind"
    );
}
