//! Peak memory while fetching a 600 MB artifact from a local fixture server stays under
//! 64 MiB: the body is streamed to disk and hashed on the way, never buffered.
//!
//! Ignored by default (it writes 600 MB to the temp dir); run it with
//! `cargo test --release --test suite fetch_memory:: -- --ignored --nocapture`, or under
//! `/usr/bin/time -v` for an outside view. The test reads its own VmHWM (peak resident set)
//! from /proc, which also counts the fixture server thread (it streams from disk too).

use crate::fetch_support;

use std::io::Write;
use std::sync::Arc;

use cudastack::cache::BlobStore;
use cudastack::digest::Hasher;
use cudastack::fetch::download::{Downloader, FetchItem};
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::progress::NoReporter;
use fetch_support::{Body, Faults, FixtureServer};

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes and downloads a 600 MB file; run explicitly to measure memory"]
async fn fetching_600_mb_stays_under_64_mib() {
    const SIZE: usize = 600 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big.whl");
    let mut hasher = Hasher::new();
    {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&source).unwrap());
        let mut block = vec![0u8; 1 << 20];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..SIZE / block.len() {
            for byte in block.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *byte = state as u8;
            }
            hasher.update(&block);
            file.write_all(&block).unwrap();
        }
    }
    let (digest, size) = hasher.finish();
    let server = FixtureServer::start();
    server.add(
        "/big.whl",
        "application/octet-stream",
        Body::File(source),
        Faults::default(),
    );
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let before = peak_rss_kib();
    let started = std::time::Instant::now();
    let downloader = Downloader::new(
        HttpClient::with_defaults().unwrap(),
        store,
        Arc::new(NoReporter),
    );
    let path = downloader
        .fetch(&FetchItem {
            name: "big".into(),
            url: server.url("/big.whl").parse().unwrap(),
            sha256: digest,
            size: Some(size),
        })
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(std::fs::metadata(path).unwrap().len(), SIZE as u64);
    let peak = peak_rss_kib().expect("/proc/self/status has VmHWM");
    eprintln!(
        "fetched {} MiB in {:.1} s; peak RSS {} KiB ({:.1} MiB), before the download {:?} KiB",
        SIZE >> 20,
        elapsed.as_secs_f64(),
        peak,
        peak as f64 / 1024.0,
        before
    );
    assert!(peak < 64 * 1024, "peak RSS {peak} KiB exceeds 64 MiB");
}
