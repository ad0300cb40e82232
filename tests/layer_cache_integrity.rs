//! A cached layer whose bytes changed on disk is never reused (issue 16, "Trust"): the
//! cache used to check only the blob's size, so a flipped byte went into every later
//! layout with exit 0. Now the entry is rebuilt with a warning, and a layout that holds
//! the damaged file gets the good one.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::layer::{
    BuildOptions, CacheKey, Compression, Entry, LayerCache, LayerContents, LayerPath,
};
use cudastack::oci::{layout, Image};

const EPOCH: u64 = 1_714_521_600;

fn contents() -> LayerContents {
    LayerContents::from_entries([Entry::file_bytes(
        LayerPath::parse("usr/lib/libexample.so.1").unwrap(),
        0o755,
        (0..200_000u32)
            .flat_map(|i| i.to_le_bytes())
            .collect::<Vec<u8>>(),
    )])
    .unwrap()
}

fn hash(path: &Path) -> Digest {
    Digest::of_bytes(&std::fs::read(path).unwrap())
}

/// Change one byte in place (same size), as an editor or a stray `dd` would; a kernel
/// timestamp tick first, as there would be between a build and a later accident.
fn flip_byte(path: &Path, at: u64) {
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(at)).unwrap();
    std::io::Read::read_exact(&mut file, &mut byte).unwrap();
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&[byte[0] ^ 0xff]).unwrap();
}

#[test]
fn a_corrupted_cached_layer_is_rebuilt_not_reused() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let options = BuildOptions::new(EPOCH, Compression::Gzip { level: 1 });
    let key = CacheKey::new("integrity-test/1", &[], &"x");
    let cache = LayerCache::open(store.clone()).unwrap();
    let first = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    let layout_a = work.path().join("a");
    layout::write(
        &Image::new(EPOCH).with_layer(first.clone(), "x"),
        &layout_a,
        "x",
    )
    .unwrap();

    // Through the layout (a hard link to the cache's blob on one filesystem).
    flip_byte(&layout::blob_path(&layout_a, &first.digest), first.size / 2);

    let cache = LayerCache::open(store.clone()).unwrap();
    let again = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    assert_eq!(cache.stats().builds, 1, "the corrupt entry was reused");
    assert_eq!(again.digest, first.digest, "the layer is deterministic");
    assert_eq!(hash(&again.blob), again.digest);

    // A new layout gets good bytes; the damaged one is repaired when written again.
    let layout_b = work.path().join("b");
    layout::write(
        &Image::new(EPOCH).with_layer(again.clone(), "x"),
        &layout_b,
        "x",
    )
    .unwrap();
    assert_eq!(
        hash(&layout::blob_path(&layout_b, &again.digest)),
        again.digest
    );
    layout::write(
        &Image::new(EPOCH).with_layer(again.clone(), "x"),
        &layout_a,
        "x",
    )
    .unwrap();
    assert_eq!(
        hash(&layout::blob_path(&layout_a, &again.digest)),
        again.digest
    );
}

#[test]
fn a_truncated_cached_layer_of_the_right_name_is_rebuilt() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let options = BuildOptions::new(EPOCH, Compression::None);
    let key = CacheKey::new("integrity-test/1", &[], &"y");
    let cache = LayerCache::open(store.clone()).unwrap();
    let first = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&first.blob)
        .unwrap()
        .set_len(first.size / 3)
        .unwrap();
    let cache = LayerCache::open(store).unwrap();
    let again = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    assert_eq!(cache.stats().builds, 1);
    assert_eq!(hash(&again.blob), first.digest);
}

#[test]
fn an_unreadable_index_entry_is_a_miss_not_an_error() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let options = BuildOptions::new(EPOCH, Compression::None);
    let key = CacheKey::new("integrity-test/1", &[], &"z");
    let cache = LayerCache::open(store.clone()).unwrap();
    let first = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    for entry in std::fs::read_dir(work.path().join("cache/layers")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::write(&path, b"{\"digest\": 12").unwrap();
        }
    }
    let cache = LayerCache::open(store).unwrap();
    let again = cache
        .get_or_build(&key, &options, || Ok(contents()))
        .unwrap();
    assert_eq!(cache.stats().builds, 1);
    assert_eq!(again.digest, first.digest);
}
