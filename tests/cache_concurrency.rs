//! Several builds sharing one cache and one OCI layout at once, as CI runners and users do
//! (issue 16, "Trust"): every build must succeed, each layer must be built once, and no
//! build may lose another's `index.json` entry.
//!
//! Each thread opens its own `LayerCache` over the same directory, as a separate process
//! would; the locks are `flock(2)` locks on files, which separate opens of one file in one
//! process contend for exactly as separate processes do. The whole pipeline, as processes,
//! is `tests/stack_concurrent_builds.rs`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Barrier};

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::layer::{
    BuildOptions, CacheKey, Compression, Entry, Layer, LayerCache, LayerContents, LayerPath,
};
use cudastack::oci::{layout, Image};

const EPOCH: u64 = 1_714_521_600;
const THREADS: usize = 8;

/// A layer of a few MB of incompressible bytes, so building it takes long enough for
/// other threads to arrive while it is written.
fn contents(seed: u64) -> LayerContents {
    let mut bytes = Vec::with_capacity(4 << 20);
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    while bytes.len() < 4 << 20 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    LayerContents::from_entries([Entry::file_bytes(
        LayerPath::parse(&format!("data/{seed}.bin")).unwrap(),
        0o644,
        bytes,
    )])
    .unwrap()
}

fn key(seed: u64) -> CacheKey {
    CacheKey::new(
        "concurrency-test/1",
        &[Digest::of_bytes(&seed.to_le_bytes())],
        &seed,
    )
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walk(dir) {
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with(".tmp-") || name.contains(".merged") {
            found.push(entry.display().to_string());
        }
    }
    found
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn concurrent_builds_of_same_and_different_layers_build_each_once() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("cache");
    let options = BuildOptions::new(EPOCH, Compression::Gzip { level: 1 });
    let barrier = Arc::new(Barrier::new(THREADS));
    // Threads 0..4 build layer 0; 4..8 build layers 1 and 2 (two threads each).
    let seeds: Vec<u64> = (0..THREADS as u64)
        .map(|i| if i < 4 { 0 } else { 1 + i % 2 })
        .collect();
    let results: Vec<(u64, Layer, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds
            .iter()
            .map(|&seed| {
                let barrier = barrier.clone();
                let root = root.clone();
                scope.spawn(move || {
                    let store = BlobStore::open(&root).unwrap();
                    let cache = LayerCache::open(store).unwrap();
                    barrier.wait();
                    let layer = cache
                        .get_or_build(&key(seed), &options, || Ok(contents(seed)))
                        .unwrap();
                    (seed, layer, cache.stats().builds)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let builds: u64 = results.iter().map(|(_, _, builds)| builds).sum();
    assert_eq!(builds, 3, "each of the 3 layers must be built exactly once");
    for seed in 0..3 {
        let digests: BTreeSet<Digest> = results
            .iter()
            .filter(|(s, _, _)| *s == seed)
            .map(|(_, layer, _)| layer.digest)
            .collect();
        assert_eq!(digests.len(), 1, "layer {seed}: {digests:?}");
    }
    // Every blob handed out is whole.
    for (_, layer, _) in &results {
        let bytes = std::fs::read(&layer.blob).unwrap();
        assert_eq!(Digest::of_bytes(&bytes), layer.digest);
    }
    let tmp: Vec<_> = std::fs::read_dir(root.join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "temp files left: {tmp:?}");
}

#[test]
fn concurrent_writes_into_one_layout_keep_every_name() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let options = BuildOptions::new(EPOCH, Compression::Gzip { level: 1 });
    let cache = LayerCache::open(store.clone()).unwrap();
    // Two shared layers: every writer places the same blobs at the same time.
    let shared = cache
        .get_or_build(&key(10), &options, || Ok(contents(10)))
        .unwrap();
    let images: Vec<Image> = (0..THREADS)
        .map(|i| {
            Image::new(EPOCH)
                .with_layer(shared.clone(), "shared")
                .with_label("n", &i.to_string())
        })
        .collect();
    let dir = work.path().join("layout");
    let barrier = Arc::new(Barrier::new(THREADS));
    let digests: Vec<Digest> = std::thread::scope(|scope| {
        let handles: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let barrier = barrier.clone();
                let dir = dir.clone();
                scope.spawn(move || {
                    barrier.wait();
                    layout::write(image, &dir, &format!("image-{i}")).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let names = layout::list_refs(&dir).unwrap();
    assert_eq!(names.len(), THREADS, "names lost: {names:?}");
    for (i, digest) in digests.iter().enumerate() {
        let resolved = layout::resolve(&dir, &format!("image-{i}")).unwrap();
        assert_eq!(resolved.manifest_digest, *digest);
    }
    assert_eq!(leftovers(&dir), Vec::<String>::new());
}
