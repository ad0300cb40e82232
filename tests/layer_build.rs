//! Layers built from real trees, read back by real tools (GNU tar, the `tar` crate).
//!
//! Determinism: two trees made by different shell sessions (different temp dirs, umask,
//! file mtimes, creation order) must give byte-identical layers and OCI layouts.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cudastack::cache::BlobStore;
use cudastack::layer::{
    self, BuildOptions, CacheKey, Compression, DirOptions, Entry, FileSource, LayerCache,
    LayerContents, LayerError, LayerPath, OpenContent,
};
use cudastack::oci::{layout, Image};

const EPOCH: u64 = 1_714_521_600; // 2024-05-01T00:00:00Z

fn sh(script: &str) {
    let status = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .status()
        .expect("sh runs");
    assert!(status.success(), "script failed: {script}");
}

fn long_name(len: usize) -> String {
    // Components of at most 50 bytes, so every one is a legal file name.
    let mut path = String::new();
    let mut i = 0;
    while path.len() < len {
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&format!("component{i:02}-{}", "x".repeat(36)));
        i += 1;
    }
    path
}

/// A tree with everything a CUDA/cuDNN layer has: library symlink chains, hardlinks,
/// executables, an empty directory, /tmp with 1777, long paths.
fn make_tree(root: &Path, umask: &str, reverse: bool, touch_date: &str) {
    let long_dir = long_name(260);
    let mut steps = [
        "mkdir -p usr/lib/x86_64-linux-gnu".to_string(),
        "ln -s libfoo.so.1.2.3 usr/lib/x86_64-linux-gnu/libfoo.so.1 || true".to_string(),
        "mkdir -p usr/bin && printf '#!/bin/sh\\necho hi\\n' > usr/bin/tool && chmod u+x usr/bin/tool".to_string(),
        "mkdir -p usr/share/doc && yes doc | head -n 5000 > usr/share/doc/one && ln usr/share/doc/one usr/share/doc/two".to_string(),
        "mkdir -p tmp && chmod 1777 tmp".to_string(),
        "mkdir -p var/empty/dir".to_string(),
        format!("mkdir -p '{long_dir}' && echo deep > '{long_dir}/file'"),
        format!("mkdir -p usr/share/longname && echo long > 'usr/share/longname/{}'", "n".repeat(120)),
    ];
    if reverse {
        steps.reverse();
    }
    // The random library must be the same in both trees: generate it once, copy it.
    let script = format!(
        "umask {umask}; cd '{}'; {}; ln -sfn libfoo.so.1 usr/lib/x86_64-linux-gnu/libfoo.so; \
         cp /tmp/cudastack-layer-test-lib usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3; \
         ln -sfn libfoo.so.1.2.3 usr/lib/x86_64-linux-gnu/libfoo.so.1; \
         find . -exec touch -h -d '{touch_date}' {{}} +",
        root.display(),
        steps.join("; ")
    );
    sh(&script);
}

fn shared_library_bytes() {
    sh("[ -f /tmp/cudastack-layer-test-lib ] || { head -c 300000 /dev/urandom > /tmp/cudastack-layer-test-lib.$$ && mv /tmp/cudastack-layer-test-lib.$$ /tmp/cudastack-layer-test-lib; }");
}

fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn two_builds_from_differently_made_trees_are_byte_identical() {
    shared_library_bytes();
    let mut results = Vec::new();
    for (umask, reverse, date, threads) in [
        ("022", false, "2020-01-01 00:00:00", 1),
        ("077", true, "2023-06-15 12:34:56", 2),
    ] {
        let work = tempfile::tempdir().unwrap();
        let tree = work.path().join(format!("tree-{umask}"));
        std::fs::create_dir(&tree).unwrap();
        make_tree(&tree, umask, reverse, date);
        let store = BlobStore::open(work.path().join("store")).unwrap();
        let contents = LayerContents::from_dir(&tree, &DirOptions::default()).unwrap();
        let mut layers = Vec::new();
        for compression in [
            Compression::Gzip { level: 6 },
            Compression::Zstd { level: 3 },
            Compression::None,
        ] {
            let options = BuildOptions {
                mtime: EPOCH,
                compression,
                threads,
            };
            layers.push(layer::build(&store, &contents, &options).unwrap());
        }
        let image = Image::new(EPOCH)
            .with_layer(layers[0].clone(), "test tree")
            .with_env("PATH", "/usr/bin")
            .with_label("io.cudastack.test", "determinism");
        let out = work.path().join("layout");
        let digest = layout::write(&image, &out, "test").unwrap();
        let blobs: Vec<Vec<u8>> = layers
            .iter()
            .map(|l| std::fs::read(&l.blob).unwrap())
            .collect();
        results.push((layers, digest, files_under(&out), blobs));
    }
    let (a, b) = (&results[0], &results[1]);
    for (la, lb) in a.0.iter().zip(&b.0) {
        assert_eq!(la.digest, lb.digest, "{:?}", la.media_type);
        assert_eq!(la.diff_id, lb.diff_id);
        assert_eq!(la.size, lb.size);
    }
    assert_eq!(a.3, b.3, "layer blobs differ");
    assert_eq!(a.1, b.1, "manifest digests differ");
    assert_eq!(a.2, b.2, "layout files differ");
    // All three compressions share one diff_id; uncompressed digest == diff_id.
    assert_eq!(a.0[0].diff_id, a.0[1].diff_id);
    assert_eq!(a.0[2].digest, a.0[2].diff_id);
}

fn extract(tar_path: &Path, dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    let status = Command::new("tar")
        .args(["-xpf"])
        .arg(tar_path)
        .arg("-C")
        .arg(dest)
        .arg("--numeric-owner")
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn gnu_tar_extracts_chains_hardlinks_modes_long_paths_and_whiteouts() {
    shared_library_bytes();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    make_tree(&tree, "022", false, "2021-01-01 00:00:00");
    let from_dir = LayerContents::from_dir(&tree, &DirOptions::default()).unwrap();
    let p = |s: &str| LayerPath::parse(s).unwrap();
    let mut entries = from_dir.entries().to_vec();
    entries.push(Entry::whiteout(p("etc/removed.conf")));
    entries.push(Entry::opaque_whiteout(p("var/cache/apt")));
    entries.push(Entry::file_bytes(p("etc/owned"), 0o640, &b"x"[..]).with_owner(1000, 1001));
    let contents = LayerContents::from_entries(entries).unwrap();
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let layer = layer::build(
        &store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::None),
    )
    .unwrap();

    // Listing: order, whiteout names, mtimes, owners.
    let listing = Command::new("tar")
        .args(["--numeric-owner", "--full-time", "-tvf"])
        .arg(&layer.blob)
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    assert!(listing.contains("etc/.wh.removed.conf"), "{listing}");
    assert!(listing.contains("var/cache/apt/.wh..wh..opq"), "{listing}");
    assert!(listing.contains("1000/1001"), "{listing}");
    for line in listing.lines() {
        assert!(
            line.contains("2024-05-01 00:00:00"),
            "mtime not fixed: {line}"
        );
        assert!(
            line.contains(" 0/0 ") || line.contains("1000/1001"),
            "{line}"
        );
    }
    // Parents before children, every directory explicit.
    let names: Vec<String> = contents.entries().iter().map(|e| e.tar_name()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    for (i, name) in names.iter().enumerate() {
        if let Some((parent, _)) = name.rsplit_once('/') {
            assert!(
                names[..i].contains(&parent.to_string()),
                "{parent} missing before {name}"
            );
        }
    }

    // PAX headers only for the long names: count raw `x` entries.
    let bytes = std::fs::read(&layer.blob).unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let pax = archive
        .entries()
        .unwrap()
        .raw(true)
        .filter(|e| e.as_ref().unwrap().header().entry_type() == tar::EntryType::XHeader)
        .count();
    let long_members = contents
        .entries()
        .iter()
        .filter(|e| e.tar_name().len() + 1 > 100)
        .count();
    assert_eq!(pax, long_members);
    assert!(pax >= 3, "expected long paths in the test tree");

    let out = work.path().join("out");
    extract(&layer.blob, &out);
    let lib = out.join("usr/lib/x86_64-linux-gnu");
    assert_eq!(
        std::fs::read_link(lib.join("libfoo.so")).unwrap(),
        Path::new("libfoo.so.1")
    );
    assert_eq!(
        std::fs::read_link(lib.join("libfoo.so.1")).unwrap(),
        Path::new("libfoo.so.1.2.3")
    );
    assert_eq!(
        std::fs::read(lib.join("libfoo.so")).unwrap(),
        std::fs::read("/tmp/cudastack-layer-test-lib").unwrap()
    );
    let one = std::fs::metadata(out.join("usr/share/doc/one")).unwrap();
    let two = std::fs::metadata(out.join("usr/share/doc/two")).unwrap();
    assert_eq!(one.ino(), two.ino(), "hardlink became a copy");
    assert_eq!(
        std::fs::metadata(out.join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert_eq!(
        std::fs::metadata(out.join("usr/bin/tool")).unwrap().mode() & 0o7777,
        0o755
    );
    assert!(out.join("var/empty/dir").is_dir());
    let deep = out.join(long_name(260)).join("file");
    assert!(deep.to_str().unwrap().len() > 255);
    assert_eq!(std::fs::read_to_string(deep).unwrap(), "deep\n");
    assert_eq!(
        std::fs::read_to_string(out.join("usr/share/longname").join("n".repeat(120))).unwrap(),
        "long\n"
    );
    assert_eq!(
        std::fs::metadata(out.join("etc/owned")).unwrap().uid(),
        1000
    );
}

#[test]
fn paths_that_escape_the_root_are_rejected_with_the_path_named() {
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    sh(&format!(
        "mkdir -p '{0}/a/b' && ln -s ../../../etc/passwd '{0}/a/b/evil'",
        tree.display()
    ));
    let err = LayerContents::from_dir(&tree, &DirOptions::default()).unwrap_err();
    assert!(matches!(err, LayerError::SymlinkEscape { .. }), "{err}");
    assert!(err.to_string().contains("a/b/evil"), "{err}");

    for bad in [
        "/etc/shadow",
        "../outside",
        "usr/../../outside",
        "usr/lib/../../../x",
    ] {
        let err = LayerPath::parse(bad).unwrap_err();
        assert!(err.to_string().contains(bad), "{err}");
    }
    // A file placed below a symlink could land anywhere on extraction.
    let p = |s: &str| LayerPath::parse(s).unwrap();
    let err = LayerContents::from_entries([
        Entry::symlink(p("lib"), "/usr/lib"),
        Entry::file_bytes(p("lib/libc.so.6"), 0o755, &b""[..]),
    ])
    .unwrap_err();
    assert!(
        matches!(err, LayerError::ParentNotDirectory { .. }),
        "{err}"
    );
}

/// A wheel member streamed from a real zip archive, never staged on disk.
struct ZipMember {
    archive: PathBuf,
    name: String,
}

impl OpenContent for ZipMember {
    fn copy_to(&self, sink: &mut dyn std::io::Write) -> std::io::Result<u64> {
        let file = std::fs::File::open(&self.archive)?;
        let mut zip = zip::ZipArchive::new(file).map_err(std::io::Error::other)?;
        let mut member = zip.by_name(&self.name).map_err(std::io::Error::other)?;
        std::io::copy(&mut member, sink)
    }
    fn describe(&self) -> String {
        format!("{}!{}", self.archive.display(), self.name)
    }
}

#[test]
fn lazy_sources_stream_zip_members_into_a_layer() {
    let work = tempfile::tempdir().unwrap();
    let wheel = work.path().join("pkg-1.0-py3-none-any.whl");
    let body: Vec<u8> = (0..200_000u32)
        .flat_map(|i| (i % 251).to_le_bytes())
        .collect();
    {
        let mut writer = zip::ZipWriter::new(std::fs::File::create(&wheel).unwrap());
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        writer.start_file("pkg/lib/libpkg.so", options).unwrap();
        std::io::Write::write_all(&mut writer, &body).unwrap();
        writer.finish().unwrap();
    }
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel).unwrap()).unwrap();
    let size = zip.by_name("pkg/lib/libpkg.so").unwrap().size();
    let p = |s: &str| LayerPath::parse(s).unwrap();
    let member = |size| {
        Entry::file(
            p("usr/lib/python3/site-packages/pkg/lib/libpkg.so"),
            0o755,
            size,
            FileSource::Lazy(Arc::new(ZipMember {
                archive: wheel.clone(),
                name: "pkg/lib/libpkg.so".to_string(),
            })),
        )
    };
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let contents = LayerContents::from_entries([member(size)]).unwrap();
    let layer = layer::build(
        &store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::None),
    )
    .unwrap();
    let bytes = std::fs::read(&layer.blob).unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let mut found = None;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().ends_with("libpkg.so") {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            found = Some(data);
        }
    }
    assert_eq!(found.unwrap(), body);

    // A declared size that does not match the member is an error naming the member.
    let contents = LayerContents::from_entries([member(size - 1)]).unwrap();
    let err = layer::build(
        &store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::None),
    )
    .unwrap_err();
    assert!(matches!(err, LayerError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("whl!pkg/lib/libpkg.so"), "{err}");
    // The same through the compressing pipeline (producer thread + compressor).
    let err = layer::build(
        &store,
        &contents,
        &BuildOptions::new(EPOCH, Compression::Gzip { level: 6 }),
    )
    .unwrap_err();
    assert!(matches!(err, LayerError::SizeMismatch { .. }), "{err}");
    // Nothing half-written is left in the store.
    assert_eq!(std::fs::read_dir(store.tmp_dir()).unwrap().count(), 0);
}

#[test]
fn a_warm_cache_rebuild_does_no_tar_or_compression_work() {
    shared_library_bytes();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    make_tree(&tree, "022", false, "2021-01-01 00:00:00");
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let options = BuildOptions::new(EPOCH, Compression::Gzip { level: 6 });
    let key = CacheKey::new(
        "test-assembler/1",
        &[cudastack::digest::Digest::of_bytes(b"artifact")],
        &serde_json::json!({"prefix": "/"}),
    );

    let cache = LayerCache::open(store.clone()).unwrap();
    let mut calls = 0;
    let first = cache
        .get_or_build(&key, &options, || {
            calls += 1;
            LayerContents::from_dir(&tree, &DirOptions::default())
        })
        .unwrap();
    assert_eq!(cache.stats().builds, 1);

    // A new process would open a new cache over the same store.
    let cache = LayerCache::open(store.clone()).unwrap();
    let started = std::time::Instant::now();
    let second = cache
        .get_or_build(&key, &options, || {
            calls += 1;
            LayerContents::from_dir(&tree, &DirOptions::default())
        })
        .unwrap();
    let elapsed = started.elapsed();
    eprintln!("warm-cache layer lookup took {elapsed:?}");
    assert_eq!(calls, 1, "contents were read again on a hit");
    assert_eq!(cache.stats().builds, 0, "a hit compressed something");
    assert_eq!(cache.stats().hits, 1);
    assert_eq!(first, second);

    // Different compression = different key; a deleted blob = a miss, rebuilt.
    let zstd = BuildOptions::new(EPOCH, Compression::Zstd { level: 3 });
    let third = cache
        .get_or_build(&key, &zstd, || {
            LayerContents::from_dir(&tree, &DirOptions::default())
        })
        .unwrap();
    assert_ne!(third.digest, first.digest);
    assert_eq!(third.diff_id, first.diff_id);
    std::fs::remove_file(&first.blob).unwrap();
    let rebuilt = cache
        .get_or_build(&key, &options, || {
            LayerContents::from_dir(&tree, &DirOptions::default())
        })
        .unwrap();
    assert_eq!(rebuilt, first);
    assert_eq!(cache.stats().builds, 2);
}
