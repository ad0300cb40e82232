//! gzip layer bytes (issue 21): the same bytes for every thread count, write size and CPU,
//! and read back as the input by the decompressors layers meet (flate2's `MultiGzDecoder`,
//! `gzip -t` / `gzip -dc`, Python's gzip module, Docker's `docker load`): a layer is one
//! gzip member per 1 MiB block, and each must read past the first member.
//!
//! The CPU test re-runs this test binary on an `#[ignore]`d probe under qemu-user with CPU
//! models that lack SSE4.1, PCLMULQDQ, AVX and AVX-512 (the host's libdeflate picks its
//! CRC-32 code by CPUID at run time) and compares the bytes with the host's. The input is
//! real: the ELF code and data of this test binary (CUDA layers are mostly ELF libraries)
//! and the crate's own Rust sources (text).

use crate::gate;
use crate::oci_support::{docker, have, run, static_show_binary, DockerCleanup};

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cudastack::cache::BlobStore;
use cudastack::canonical::to_canonical_json;
use cudastack::digest::Digest;
use cudastack::layer::{
    self, BuildOptions, CacheKey, Compression, Entry, LayerCache, LayerContents, LayerPath,
};
use cudastack::oci::{docker_archive, layout, Image};

/// The probe's input, outputs and CPU-feature report, named by the parent.
const PROBE_INPUT: &str = "CUDASTACK_GZIP_PROBE_INPUT";
const PROBE_OUTPUT: &str = "CUDASTACK_GZIP_PROBE_OUTPUT";

/// Levels that cover every libdeflate parser gzip 1-9 uses: fastest (1, hash table),
/// greedy (4), lazy (6) and lazy2 (9, on a prefix to keep emulation short).
const LEVELS: [(u32, usize); 4] = [
    (1, usize::MAX),
    (4, usize::MAX),
    (6, usize::MAX),
    (9, 3_000_000),
];

/// About 14 MB of real bytes: 12 MiB of this test binary, then the crate's sources.
fn real_input() -> Vec<u8> {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let mut input = exe[..exe.len().min(12 << 20)].to_vec();
    let mut sources = Vec::new();
    collect_sources(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        &mut sources,
    );
    sources.sort();
    for source in sources {
        input.extend(std::fs::read(source).unwrap());
    }
    assert!(input.len() > 13 << 20, "input of {} bytes", input.len());
    input
}

fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn gzip(level: u32, threads: usize, data: &[u8], write_size: usize) -> Vec<u8> {
    let mut writer = Compression::Gzip { level }
        .writer(Vec::new(), threads)
        .unwrap();
    for piece in data.chunks(write_size.max(1)) {
        writer.write_all(piece).unwrap();
    }
    writer.finish().unwrap()
}

/// Every level of [`LEVELS`], concatenated: what the probe writes on each CPU.
fn all_levels(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (level, limit) in LEVELS {
        out.extend(gzip(level, 2, &input[..input.len().min(limit)], 65536));
    }
    out
}

#[test]
fn bytes_are_identical_for_any_thread_count_and_write_size() {
    let input = real_input();
    let reference = gzip(6, 1, &input, 65536);
    for (threads, write_size) in [
        (2, 1),
        (3, 4095),
        (8, (1 << 20) + 1),
        (8, usize::MAX),
        (1, 7),
    ] {
        assert!(
            gzip(6, threads, &input, write_size) == reference,
            "{threads} threads, writes of {write_size} bytes: other bytes than 1 thread"
        );
    }
    let mut decoded = Vec::new();
    flate2::read::MultiGzDecoder::new(&reference[..])
        .read_to_end(&mut decoded)
        .unwrap();
    assert!(
        decoded == input,
        "MultiGzDecoder did not give the input back"
    );
}

#[test]
fn gzip_and_python_read_every_member() {
    let input = real_input();
    let expected = Digest::of_bytes(&input).hex();
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("layer.tar.gz");
    std::fs::write(&blob, gzip(6, 2, &input, 65536)).unwrap();

    if which("gzip").is_none() {
        return gate::skip("gzip", "gzip is not installed (apt-get install gzip)");
    }
    let test = Command::new("gzip").arg("-t").arg(&blob).output().unwrap();
    assert!(test.status.success(), "gzip -t: {test:?}");
    let decoded = Command::new("gzip").arg("-dc").arg(&blob).output().unwrap();
    assert!(decoded.status.success(), "gzip -dc: {:?}", decoded.status);
    assert_eq!(
        Digest::of_bytes(&decoded.stdout).hex(),
        expected,
        "gzip -dc"
    );

    if which("python3").is_none() {
        return gate::skip(
            "python3",
            "python3 is not installed (apt-get install python3)",
        );
    }
    let python = Command::new("python3")
        .args([
            "-c",
            "import gzip, hashlib, sys\n\
             print(hashlib.sha256(gzip.decompress(open(sys.argv[1], 'rb').read())).hexdigest())",
        ])
        .arg(&blob)
        .output()
        .unwrap();
    assert!(python.status.success(), "python3 gzip: {python:?}");
    assert_eq!(
        String::from_utf8_lossy(&python.stdout).trim(),
        expected,
        "Python's gzip"
    );
}

#[test]
fn docker_reads_every_member_of_a_layer() {
    // Docker 20.10 (Go's compress/gzip, or unpigz) must read past the first member: a
    // 5 MiB file is five members, and a file after it is in the last one.
    if let Err(reason) = docker() {
        return gate::skip("docker", reason);
    }
    let work = tempfile::tempdir().unwrap();
    let show = match static_show_binary(work.path()) {
        Ok(show) => show,
        Err(reason) => return gate::skip("gcc", reason),
    };
    let blob = real_input()[..5 << 20].to_vec();
    let path = |text: &str| LayerPath::parse(text).unwrap();
    let contents = LayerContents::from_entries([
        Entry::file_bytes(path("bin/show"), 0o755, std::fs::read(&show).unwrap()),
        Entry::file_bytes(path("data/blob"), 0o644, blob.clone()),
        Entry::file_bytes(path("zz/last"), 0o644, &b"in the last member\n"[..]),
    ])
    .unwrap();
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let options = BuildOptions::new(1_714_521_600, Compression::default());
    let layer = layer::build(&store, &contents, &options).unwrap();
    let image = Image::new(1_714_521_600)
        .with_layer(layer, "cudastack test: gzip members")
        .with_entrypoint(vec!["/bin/show".to_string()]);
    let tag = format!("cudastack-test/gzip-members:{}", std::process::id());
    let _cleanup = DockerCleanup(vec![tag.clone()]);
    let archive = work.path().join("image.tar");
    let file = std::fs::File::create(&archive).unwrap();
    docker_archive::write(
        &image,
        std::slice::from_ref(&tag),
        std::io::BufWriter::new(file),
    )
    .unwrap();
    run(Command::new("docker").arg("load").arg("-i").arg(&archive));
    let shown = |file: &str| {
        run(Command::new("docker").args(["run", "--rm", "--network", "none", &tag, file])).stdout
    };
    assert_eq!(shown("/zz/last"), b"in the last member\n");
    assert!(
        shown("/data/blob") == blob,
        "docker's /data/blob differs from the layer's"
    );
}

#[test]
fn umoci_unpacks_every_member_of_a_layer() {
    // umoci reads layers with Go's gzip (as skopeo, containerd and Apptainer do).
    if !have("umoci") {
        return gate::skip("umoci", "umoci is not installed (apt-get install umoci)");
    }
    let work = tempfile::tempdir().unwrap();
    let blob = real_input()[..5 << 20].to_vec();
    let path = |text: &str| LayerPath::parse(text).unwrap();
    let contents = LayerContents::from_entries([
        Entry::file_bytes(path("data/blob"), 0o644, blob.clone()),
        Entry::file_bytes(path("zz/last"), 0o644, &b"in the last member\n"[..]),
    ])
    .unwrap();
    let store = BlobStore::open(work.path().join("store")).unwrap();
    let options = BuildOptions::new(1_714_521_600, Compression::default());
    let image = Image::new(1_714_521_600).with_layer(
        layer::build(&store, &contents, &options).unwrap(),
        "cudastack test: gzip members",
    );
    let dir = work.path().join("layout");
    layout::write(&image, &dir, "members").unwrap();
    let bundle = work.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:members", dir.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    assert_eq!(
        std::fs::read(rootfs.join("zz/last")).unwrap(),
        b"in the last member\n"
    );
    assert!(
        std::fs::read(rootfs.join("data/blob")).unwrap() == blob,
        "umoci's data/blob differs"
    );
}

#[test]
fn bytes_are_identical_on_cpus_without_simd() {
    if !cfg!(target_arch = "x86_64") {
        return gate::not_applicable("the CPU models emulated here are x86-64 ones");
    }
    let Some(qemu) = which("qemu-x86_64") else {
        return gate::skip(
            "qemu-user",
            "qemu-x86_64 is not installed (apt-get install qemu-user; scripts/setup.sh)",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let input_path = dir.path().join("input");
    let input = real_input();
    std::fs::write(&input_path, &input).unwrap();
    let native = all_levels(&input);
    // qemu64: SSE2 only; Nehalem: SSE4.2, no PCLMULQDQ; Westmere: PCLMULQDQ, no AVX. The
    // host runs the native side (where this was written: AVX-512 and VPCLMULQDQ).
    for (model, absent) in [
        ("qemu64", ["sse4.1", "pclmulqdq", "avx2"].as_slice()),
        ("Nehalem", ["pclmulqdq", "avx2"].as_slice()),
        ("Westmere", ["avx", "avx2"].as_slice()),
    ] {
        let output = dir.path().join(model);
        let features = run_probe(&qemu, model, &input_path, &output);
        eprintln!("qemu -cpu {model}: {}", features.join(" "));
        for feature in absent {
            assert!(
                !features.iter().any(|f| f == feature),
                "qemu -cpu {model} reported {feature}: the emulated CPU is not the one meant"
            );
        }
        let emulated = std::fs::read(&output).unwrap();
        assert!(
            emulated == native,
            "gzip bytes under qemu -cpu {model} ({} bytes) differ from this CPU's ({} bytes)",
            emulated.len(),
            native.len()
        );
    }
}

/// Run the probe under `qemu -cpu model`; the CPU features it saw.
fn run_probe(qemu: &Path, model: &str, input: &Path, output: &Path) -> Vec<String> {
    let child = Command::new(qemu)
        .args(["-cpu", model])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &gate::test_path(module_path!(), "probe_compress_on_this_cpu"),
            "--test-threads=1",
            "--nocapture",
        ])
        .env(PROBE_INPUT, input)
        .env(PROBE_OUTPUT, output)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&child.stdout).into_owned()
        + &String::from_utf8_lossy(&child.stderr);
    assert!(
        child.status.success(),
        "probe under qemu -cpu {model}:\n{text}"
    );
    let line = text
        .lines()
        // libtest prints the test's name on the same line before the probe's output.
        .find_map(|line| {
            line.split_once("cpu features:")
                .map(|(_, features)| features)
        })
        .unwrap_or_else(|| panic!("probe under qemu -cpu {model} printed no features:\n{text}"));
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
#[ignore = "a probe bytes_are_identical_on_cpus_without_simd runs under qemu-user"]
fn probe_compress_on_this_cpu() {
    let input =
        std::env::var_os(PROBE_INPUT).expect("run by bytes_are_identical_on_cpus_without_simd");
    let output =
        std::env::var_os(PROBE_OUTPUT).expect("run by bytes_are_identical_on_cpus_without_simd");
    let mut seen = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! detect {
            ($($feature:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($feature) { seen.push($feature); })*
            };
        }
        detect!(
            "sse4.1",
            "sse4.2",
            "pclmulqdq",
            "avx",
            "avx2",
            "avx512f",
            "vpclmulqdq"
        );
    }
    println!("cpu features: {}", seen.join(" "));
    let input = std::fs::read(input).unwrap();
    std::fs::write(output, all_levels(&input)).unwrap();
}

#[test]
fn a_layer_cached_by_the_zlib_engine_is_not_reused() {
    // Caches written before libdeflate keyed a layer by its inputs, mtime and level
    // only; an entry there (standing in for the old engine's blob: another layer) must
    // be ignored, so that warm and cold caches give the same digest.
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let cache = LayerCache::open(store.clone()).unwrap();
    let options = BuildOptions::new(1_714_521_600, Compression::Gzip { level: 6 });
    let contents = || {
        LayerContents::from_entries([Entry::file_bytes(
            LayerPath::parse("usr/lib/libexample.so.1").unwrap(),
            0o755,
            real_input()[..3 << 20].to_vec(),
        )])
    };
    let other = BuildOptions::new(1_714_521_600, Compression::Zstd { level: 3 });
    let old_blob = cache
        .get_or_build(
            &CacheKey::new("gzip-bytes/1", &[], &"old"),
            &other,
            contents,
        )
        .unwrap();
    let key = CacheKey::new("gzip-bytes/1", &[], &"layer");
    let old_key = to_canonical_json(&serde_json::json!({
        "key": key.digest(),
        "mtime": options.mtime,
        "compression": options.compression,
    }))
    .unwrap();
    let old_entry = store
        .root()
        .join("layers")
        .join(format!("{}.json", Digest::of_bytes(&old_key).hex()));
    std::fs::write(&old_entry, serde_json::to_vec(&old_blob).unwrap()).unwrap();

    let layer = cache.get_or_build(&key, &options, contents).unwrap();
    assert_eq!(cache.stats().builds, 2, "the old engine's entry was reused");
    assert_ne!(layer.digest, old_blob.digest);
    let cold = LayerCache::open(BlobStore::open(work.path().join("cold")).unwrap()).unwrap();
    assert_eq!(
        cold.get_or_build(&key, &options, contents).unwrap().digest,
        layer.digest,
        "warm and cold caches differ"
    );
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}
