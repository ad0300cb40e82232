//! Downloads into the blob store against a local fixture server: hash mismatch, resume of
//! an interrupted transfer, retries on 5xx, 404, servers that ignore Range, mirrors
//! (file:// URLs) and offline mode.

use crate::fetch_support;

use std::sync::Arc;
use std::time::Duration;

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::fetch::download::{DownloadError, Downloader, FetchItem};
use cudastack::fetch::http::{HttpClient, HttpConfig, HttpError, RetryPolicy};
use cudastack::fetch::progress::{NoReporter, Reporter};
use fetch_support::{client, payload, Body, Faults, FixtureServer};

fn item(server: &FixtureServer, path: &str, bytes: &[u8]) -> FetchItem {
    FetchItem {
        name: path.trim_start_matches('/').to_string(),
        url: server.url(path).parse().unwrap(),
        sha256: Digest::of_bytes(bytes),
        size: Some(bytes.len() as u64),
    }
}

fn tmp_entries(store: &BlobStore) -> usize {
    std::fs::read_dir(store.tmp_dir()).unwrap().count()
}

#[tokio::test]
async fn wrong_bytes_fail_with_expected_and_found_and_leave_nothing() {
    let server = FixtureServer::start();
    let good = payload(100_000);
    let wrong = payload(100_001)[1..].to_vec();
    server.add(
        "/pkg.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(good.clone())),
        Faults {
            wrong_body: Some(Arc::new(wrong.clone())),
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(3), store.clone(), Arc::new(NoReporter));
    let wanted = item(&server, "/pkg.whl", &good);
    let error = downloader.fetch(&wanted).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&format!("Expected: {}", Digest::of_bytes(&good))),
        "{message}"
    );
    assert!(
        message.contains(&format!("Found:    {}", Digest::of_bytes(&wrong))),
        "{message}"
    );
    assert!(message.contains(&server.url("/pkg.whl")), "{message}");
    assert!(!store.contains(&wanted.sha256));
    assert_eq!(
        std::fs::read_dir(dir.path().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(tmp_entries(&store), 0, "the partial file must be removed");
}

#[tokio::test]
async fn interrupted_download_resumes_on_rerun_with_a_range_request() {
    let server = FixtureServer::start();
    let bytes = payload(3_000_000);
    server.add(
        "/big.tar.xz",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            cut_after: Some(1_000_000),
            cut_times: 1,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let wanted = item(&server, "/big.tar.xz", &bytes);

    // First run: one attempt only, so the cut connection ends the run.
    let first = Downloader::new(client(1), store.clone(), Arc::new(NoReporter));
    let error = first.fetch(&wanted).await.unwrap_err();
    assert!(
        matches!(error, DownloadError::Interrupted { .. }),
        "{error}"
    );
    let partial = store.partial_path(&wanted.sha256);
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept <= 1_000_000, "partial holds {kept} bytes");
    assert!(!store.contains(&wanted.sha256));

    // Rerun: continues from the partial file.
    let second = Downloader::new(client(1), store.clone(), Arc::new(NoReporter));
    let path = second.fetch(&wanted).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let requests = server.requests_for("/big.tar.xz");
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].range, None);
    assert_eq!(
        requests[1].range.as_deref(),
        Some(format!("bytes={kept}-").as_str())
    );
    assert!(!partial.exists());
}

#[tokio::test]
async fn cut_connection_is_resumed_within_one_run() {
    let server = FixtureServer::start();
    let bytes = payload(2_000_000);
    server.add(
        "/x.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            cut_after: Some(500_000),
            cut_times: 2,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(4), store.clone(), Arc::new(NoReporter));
    let path = downloader
        .fetch(&item(&server, "/x.whl", &bytes))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let requests = server.requests_for("/x.whl");
    assert_eq!(requests.len(), 3);
    assert!(requests[1].range.as_deref().unwrap().starts_with("bytes="));
    assert!(requests[2].range.is_some());
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff() {
    let server = FixtureServer::start();
    let bytes = payload(10_000);
    server.add(
        "/flaky.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            fail_status: Some(503),
            fail_times: 2,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(3), store.clone(), Arc::new(NoReporter));
    let path = downloader
        .fetch(&item(&server, "/flaky.whl", &bytes))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), bytes);
    assert_eq!(server.requests_for("/flaky.whl").len(), 3);

    // A persistent 500 gives up after max_attempts and says so.
    server.set_faults(
        "/flaky.whl",
        Faults {
            fail_status: Some(500),
            fail_times: 100,
            ..Faults::default()
        },
    );
    let other = payload(10_001);
    let mut wanted = item(&server, "/flaky.whl", &other);
    wanted.size = None;
    let error = downloader.fetch(&wanted).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("HTTP 500") && message.contains("after 3 attempts"),
        "{message}"
    );
    assert!(message.contains(&server.url("/flaky.whl")), "{message}");
}

#[tokio::test]
async fn stalled_responses_and_429_are_retried() {
    let server = FixtureServer::start();
    let bytes = payload(30_000);
    server.add(
        "/stall.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            delay_ms: 1500,
            delay_times: 1,
            ..Faults::default()
        },
    );
    server.add(
        "/busy.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            fail_status: Some(429),
            fail_times: 1,
            ..Faults::default()
        },
    );
    let impatient = HttpClient::new(HttpConfig {
        read_timeout: Duration::from_millis(500),
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        },
        ..HttpConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(impatient, store, Arc::new(NoReporter));
    let path = downloader
        .fetch(&item(&server, "/stall.whl", &bytes))
        .await
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), bytes);
    assert_eq!(
        server.requests_for("/stall.whl").len(),
        2,
        "the stalled response timed out once"
    );
    // A cached digest needs no request at all, whatever the URL.
    downloader
        .fetch(&item(&server, "/busy.whl", &bytes))
        .await
        .unwrap();
    assert!(server.requests_for("/busy.whl").is_empty());
    // With an empty cache, 429 is retried.
    let dir = tempfile::tempdir().unwrap();
    let fresh = Downloader::new(
        client(3),
        BlobStore::open(dir.path()).unwrap(),
        Arc::new(NoReporter),
    );
    fresh
        .fetch(&item(&server, "/busy.whl", &bytes))
        .await
        .unwrap();
    assert_eq!(
        server.requests_for("/busy.whl").len(),
        2,
        "429 once, then success"
    );
}

#[tokio::test]
async fn not_found_names_the_url_and_leaves_nothing() {
    let server = FixtureServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(3), store.clone(), Arc::new(NoReporter));
    let wanted = item(&server, "/missing.whl", b"x");
    let error = downloader.fetch(&wanted).await.unwrap_err();
    assert!(
        matches!(error, DownloadError::Http(HttpError::NotFound { .. })),
        "{error}"
    );
    assert!(error.to_string().contains(&server.url("/missing.whl")));
    assert_eq!(
        server.requests_for("/missing.whl").len(),
        1,
        "404 is not retried"
    );
    assert!(!store.contains(&wanted.sha256));
}

#[tokio::test]
async fn server_ignoring_range_restarts_from_zero() {
    let server = FixtureServer::start();
    let bytes = payload(200_000);
    server.add(
        "/norange.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            ignore_range: true,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let wanted = item(&server, "/norange.whl", &bytes);
    // A stale partial from an earlier run.
    std::fs::write(store.partial_path(&wanted.sha256), &bytes[..1000]).unwrap();
    let downloader = Downloader::new(client(2), store.clone(), Arc::new(NoReporter));
    let path = downloader.fetch(&wanted).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), bytes);
    assert_eq!(
        server.requests_for("/norange.whl")[0].range.as_deref(),
        Some("bytes=1000-")
    );
}

#[tokio::test]
async fn parallel_fetch_then_offline_from_warm_cache() {
    let server = FixtureServer::start();
    let mut items = Vec::new();
    for i in 0..6 {
        let bytes = payload(50_000 + i);
        let path = format!("/f{i}.whl");
        server.add_bytes(&path, "application/octet-stream", bytes.clone());
        items.push(item(&server, &path, &bytes));
    }
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(2), store.clone(), Arc::new(NoReporter));
    let paths = downloader.fetch_all(&items).await.unwrap();
    assert_eq!(paths.len(), 6);
    for (path, item) in paths.iter().zip(&items) {
        assert_eq!(path, &store.path(&item.sha256));
    }
    let before = server.log().len();

    let offline = Downloader::new(client(2), store.clone(), Arc::new(NoReporter)).offline(true);
    assert_eq!(offline.fetch_all(&items).await.unwrap(), paths);
    assert_eq!(server.log().len(), before, "offline mode makes no request");

    let mut more = items.clone();
    more.push(FetchItem {
        name: "cudnn 9.1.0.70".into(),
        url: server.url("/cudnn.tar.xz").parse().unwrap(),
        sha256: Digest::of_bytes(b"not cached"),
        size: Some(10),
    });
    let error = offline.fetch_all(&more).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("1 artifact(s) are not in the cache"),
        "{message}"
    );
    assert!(message.contains("cudnn 9.1.0.70"), "{message}");
    assert!(
        message.contains(&Digest::of_bytes(b"not cached").to_string()),
        "{message}"
    );
    assert!(message.contains("/cudnn.tar.xz"), "{message}");
    assert_eq!(server.log().len(), before);
}

/// name, announced total, bytes reported, finished.
type Transfer = (String, Option<u64>, u64, bool);

/// Counts reported bytes per transfer.
#[derive(Default)]
struct Counting {
    totals: std::sync::Mutex<Vec<Transfer>>,
}

impl Reporter for Counting {
    fn start(&self, name: &str, total: Option<u64>) -> usize {
        let mut totals = self.totals.lock().unwrap();
        totals.push((name.to_string(), total, 0, false));
        totals.len() - 1
    }
    fn advance(&self, id: usize, bytes: u64) {
        self.totals.lock().unwrap()[id].2 += bytes;
    }
    fn finish(&self, id: usize) {
        self.totals.lock().unwrap()[id].3 = true;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_downloads_are_bounded_and_reported() {
    let server = FixtureServer::start();
    let mut items = Vec::new();
    for i in 0..6 {
        let bytes = payload(20_000 + i);
        let path = format!("/slow{i}.whl");
        server.add(
            &path,
            "application/octet-stream",
            Body::Bytes(Arc::new(bytes.clone())),
            Faults {
                delay_ms: 300,
                ..Faults::default()
            },
        );
        items.push(item(&server, &path, &bytes));
    }
    let client = HttpClient::new(HttpConfig {
        max_parallel: 2,
        ..HttpConfig::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let reporter = Arc::new(Counting::default());
    let downloader = Downloader::new(client, store, reporter.clone());
    downloader.fetch_all(&items).await.unwrap();
    assert_eq!(
        server.max_concurrent(),
        2,
        "two transfers at a time, and they overlapped"
    );
    let totals = reporter.totals.lock().unwrap().clone();
    assert_eq!(totals.len(), 6);
    for (name, total, reported, finished) in totals {
        assert_eq!(Some(reported), total, "{name}");
        assert!(finished, "{name}");
    }
}

#[tokio::test]
async fn mirror_files_are_copied_and_checked() {
    let mirror = tempfile::tempdir().unwrap();
    let file = mirror.path().join("pkg-1.0-py3-none-any.whl");
    std::fs::write(&file, b"wheel bytes").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(1), store.clone(), Arc::new(NoReporter))
        .mirrors(vec![mirror.path().to_path_buf()]);
    let url = url::Url::from_file_path(&file).unwrap();
    let good = FetchItem {
        name: "pkg".into(),
        url: url.clone(),
        sha256: Digest::of_bytes(b"wheel bytes"),
        size: None,
    };
    let path = downloader.fetch(&good).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"wheel bytes");
    let bad = FetchItem {
        sha256: Digest::of_bytes(b"other"),
        ..good
    };
    let error = downloader.fetch(&bad).await.unwrap_err();
    assert!(error.to_string().contains("Expected"), "{error}");
    assert_eq!(tmp_entries(&store), 0);
}
