//! Issue 16, fetch side: hostile locks, indexes and servers against the downloader, the HTTP
//! client and the remote zip reader, with a real fixture server on 127.0.0.1.
//!
//! - `file://` URLs only under `--mirror` directories, only regular files, never more than
//!   the locked size (no `/etc/shadow` hash oracle, no `/dev/zero` filling the disk);
//! - the locked size enforced on HTTP too (stop at size + 1), and no partial or temp file
//!   left behind by a failed download;
//! - refused connections fail at once; every retry is one line on stderr;
//! - a server that lies in `Content-Range` or a zip whose central directory claims huge
//!   sizes is an error, never a panic or a huge allocation; property tests over arbitrary
//!   server answers and zip bytes.

use crate::fetch_support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::fetch::download::{DownloadError, Downloader, FetchItem};
use cudastack::fetch::http::{HttpClient, HttpError};
use cudastack::fetch::index::DistFile;
use cudastack::fetch::metadata::{wheel_metadata_by_range, MetadataError};
use cudastack::fetch::progress::NoReporter;
use cudastack::fetch::remote_zip::{RemoteZip, RemoteZipError};
use fetch_support::{client, payload, Body, Faults, FixtureServer};
use zip::write::SimpleFileOptions;

/// Everything left in the store's `tmp/` (partials, temp blobs).
fn tmp_entries(store: &BlobStore) -> Vec<String> {
    match std::fs::read_dir(store.tmp_dir()) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn local_item(path: &std::path::Path, bytes: &[u8]) -> FetchItem {
    FetchItem {
        name: "local".into(),
        url: url::Url::from_file_path(path).unwrap(),
        sha256: Digest::of_bytes(bytes),
        size: Some(bytes.len() as u64),
    }
}

// ---- file:// URLs -------------------------------------------------------------------

/// A lock naming `file:///etc/passwd` used to copy it into the cache and print its hash.
#[tokio::test]
async fn local_files_outside_every_mirror_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let downloader = Downloader::new(client(1), store.clone(), Arc::new(NoReporter));
    for path in ["/etc/passwd", "/dev/zero", "/proc/self/environ"] {
        let item = FetchItem {
            name: "hostile".into(),
            url: url::Url::from_file_path(path).unwrap(),
            sha256: Digest::of_bytes(b"anything"),
            size: Some(10),
        };
        let error = downloader.fetch(&item).await.unwrap_err();
        assert!(
            matches!(error, DownloadError::LocalNotAllowed { .. }),
            "{path}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains("--mirror") && !message.contains("Found"),
            "{message}"
        );
    }
    assert!(tmp_entries(&store).is_empty());

    // With a mirror: `..` and symlinks that lead out of it are refused too.
    let mirror = dir.path().join("mirror");
    std::fs::create_dir(&mirror).unwrap();
    let outside = dir.path().join("secret");
    std::fs::write(&outside, b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, mirror.join("link.whl")).unwrap();
    let downloader = downloader.mirrors(vec![mirror.clone()]);
    for path in [mirror.join("link.whl"), mirror.join("../secret")] {
        let mut item = local_item(&path, b"secret");
        item.url = url::Url::parse(&format!("file://{}", path.display())).unwrap();
        let error = downloader.fetch(&item).await.unwrap_err();
        assert!(
            matches!(error, DownloadError::LocalNotAllowed { .. }),
            "{}: {error}",
            path.display()
        );
    }
    // A directory (or device, FIFO) in the mirror is not a file to copy.
    std::fs::create_dir(mirror.join("dir.whl")).unwrap();
    let error = downloader
        .fetch(&local_item(&mirror.join("dir.whl"), b""))
        .await
        .unwrap_err();
    assert!(matches!(error, DownloadError::NotAFile { .. }), "{error}");
    assert!(tmp_entries(&store).is_empty());
}

#[tokio::test]
async fn local_files_are_read_only_up_to_the_locked_size() {
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("mirror");
    std::fs::create_dir(&mirror).unwrap();
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let downloader = Downloader::new(client(1), store.clone(), Arc::new(NoReporter))
        .mirrors(vec![mirror.clone()]);
    let bytes = payload(3 << 20);
    let file = mirror.join("big-1.0-py3-none-any.whl");
    std::fs::write(&file, &bytes).unwrap();
    // The lock claims 1000 bytes: reading stops at 1001 and fails.
    let mut item = local_item(&file, &bytes[..1000]);
    item.size = Some(1000);
    let error = downloader.fetch(&item).await.unwrap_err();
    assert!(
        matches!(
            error,
            DownloadError::TooLarge {
                expected: 1000,
                found: 1001,
                ..
            }
        ),
        "{error}"
    );
    // Too few bytes: a clear size error, not only a hash mismatch.
    let mut item = local_item(&file, &bytes);
    item.size = Some(bytes.len() as u64 + 5);
    let error = downloader.fetch(&item).await.unwrap_err();
    assert!(matches!(error, DownloadError::TooSmall { .. }), "{error}");
    assert!(tmp_entries(&store).is_empty(), "{:?}", tmp_entries(&store));
    // The honest item is copied.
    let path = downloader.fetch(&local_item(&file, &bytes)).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), bytes);
}

// ---- HTTP sizes and leftovers -------------------------------------------------------

#[tokio::test]
async fn http_bodies_longer_or_shorter_than_locked_fail_and_leave_nothing() {
    let server = FixtureServer::start();
    let bytes = payload(500_000);
    server.add_bytes("/big.whl", "application/octet-stream", bytes.clone());
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(2), store.clone(), Arc::new(NoReporter));
    let long = FetchItem {
        name: "big".into(),
        url: server.url("/big.whl").parse().unwrap(),
        sha256: Digest::of_bytes(&bytes[..1000]),
        size: Some(1000),
    };
    let error = downloader.fetch(&long).await.unwrap_err();
    assert!(
        matches!(error, DownloadError::TooLarge { expected: 1000, .. }),
        "{error}"
    );
    assert!(tmp_entries(&store).is_empty(), "{:?}", tmp_entries(&store));
    let short = FetchItem {
        size: Some(bytes.len() as u64 + 1),
        sha256: Digest::of_bytes(b"more"),
        ..long.clone()
    };
    let error = downloader.fetch(&short).await.unwrap_err();
    assert!(matches!(error, DownloadError::TooSmall { .. }), "{error}");
    assert!(tmp_entries(&store).is_empty(), "{:?}", tmp_entries(&store));
}

/// Before issue 16 every failed download left an (often empty) `tmp/partial-*`.
#[tokio::test]
async fn failed_downloads_leave_no_partial_file() {
    let server = FixtureServer::start();
    let bytes = payload(10_000);
    server.add(
        "/forbidden.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            fail_status: Some(403),
            fail_times: 100,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let downloader = Downloader::new(client(2), store.clone(), Arc::new(NoReporter));
    for path in ["/forbidden.whl", "/missing.whl"] {
        let item = FetchItem {
            name: path.into(),
            url: server.url(path).parse().unwrap(),
            sha256: Digest::of_bytes(&bytes),
            size: Some(bytes.len() as u64),
        };
        downloader.fetch(&item).await.unwrap_err();
        assert!(
            tmp_entries(&store).is_empty(),
            "{path}: {:?}",
            tmp_entries(&store)
        );
    }
}

/// An interrupted transfer keeps its partial (bounded by the locked size) to resume; a
/// later run that finds the bytes wrong deletes it.
#[tokio::test]
async fn interrupted_partials_are_kept_bounded_and_dropped_when_wrong() {
    let server = FixtureServer::start();
    let bytes = payload(300_000);
    server.add(
        "/cut.whl",
        "application/octet-stream",
        Body::Bytes(Arc::new(bytes.clone())),
        Faults {
            cut_after: Some(100_000),
            cut_times: 1,
            ..Faults::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let item = FetchItem {
        name: "cut".into(),
        url: server.url("/cut.whl").parse().unwrap(),
        sha256: Digest::of_bytes(&bytes),
        size: Some(bytes.len() as u64),
    };
    let once = Downloader::new(client(1), store.clone(), Arc::new(NoReporter));
    let error = once.fetch(&item).await.unwrap_err();
    assert!(
        matches!(error, DownloadError::Interrupted { .. }),
        "{error}"
    );
    let partial = store.partial_path(&item.sha256);
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept <= bytes.len() as u64, "{kept}");
    // A partial longer than the lock's size is not trusted: start over.
    std::fs::write(&partial, payload(400_000)).unwrap();
    let path = once.fetch(&item).await.unwrap();
    assert_eq!(std::fs::read(path).unwrap(), bytes);
    assert!(tmp_entries(&store).is_empty());
    // A partial whose bytes are wrong: the finished file mismatches and nothing is kept.
    let other = FetchItem {
        sha256: Digest::of_bytes(b"not these bytes"),
        ..item.clone()
    };
    std::fs::write(store.partial_path(&other.sha256), &bytes[..1000]).unwrap();
    once.fetch(&other).await.unwrap_err();
    assert!(tmp_entries(&store).is_empty(), "{:?}", tmp_entries(&store));
}

// ---- retries --------------------------------------------------------------------------

/// A refused connection used to be retried silently for 45 s.
#[tokio::test]
async fn refused_connections_fail_at_once() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url: url::Url = format!("http://127.0.0.1:{port}/x.whl").parse().unwrap();
    // The default policy: 5 attempts, backoff from 500 ms.
    let client = HttpClient::with_defaults().unwrap();
    let started = Instant::now();
    let error = client.get_bytes(&url, None).await.unwrap_err();
    let elapsed = started.elapsed();
    eprintln!("refused connection failed after {elapsed:?}");
    assert!(
        matches!(error, HttpError::Transport { attempts: 1, .. }),
        "{error}"
    );
    assert!(elapsed < Duration::from_millis(400), "{elapsed:?}");
}

/// A writer the test can read back: what the subscriber printed.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_retry_is_one_line_at_warn_level() {
    let server = FixtureServer::start();
    server.add(
        "/flaky.json",
        "application/json",
        Body::Bytes(Arc::new(b"{}".to_vec())),
        Faults {
            fail_status: Some(503),
            fail_times: 2,
            ..Faults::default()
        },
    );
    let captured = Captured::default();
    let writer = captured.clone();
    // The CLI's default filter is `warn`: these lines reach stderr unless `--quiet`.
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let url: url::Url = server.url("/flaky.json").parse().unwrap();
    client(3).get_bytes(&url, None).await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(url.as_str())
            && lines[0].contains("attempt 2 of 3")
            && lines[0].contains("503"),
        "{text}"
    );
}

// ---- remote zip -----------------------------------------------------------------------

fn wheel_with_metadata(metadata: &[u8]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(1));
    writer.start_file("pkg/__init__.py", options).unwrap();
    writer.write_all(b"VALUE = 1\n").unwrap();
    writer
        .start_file("pkg-1.0.dist-info/METADATA", options)
        .unwrap();
    writer.write_all(metadata).unwrap();
    writer.finish().unwrap().into_inner()
}

fn dist_file(server: &FixtureServer, path: &str) -> DistFile {
    DistFile {
        filename: "pkg-1.0-py3-none-any.whl".parse().unwrap(),
        url: server.url(path).parse().unwrap(),
        sha256: None,
        size: None,
        requires_python: None,
        yanked: false,
        yanked_reason: None,
        upload_time: None,
        core_metadata: Default::default(),
    }
}

/// Offset of the central directory record of `name` in `zip`.
fn central_record(zip: &[u8], name: &str) -> usize {
    let needle = name.as_bytes();
    (0..zip.len() - needle.len())
        .rev()
        .find(|&at| {
            at >= 46
                && &zip[at..at + needle.len()] == needle
                && zip[at - 46..at - 42] == [0x50, 0x4b, 0x01, 0x02]
        })
        .map(|at| at - 46)
        .expect("central record")
}

/// Issue 16: an index lying in Content-Range panicked the remote zip reader.
#[tokio::test]
async fn lying_content_range_is_an_error() {
    let server = FixtureServer::start();
    let zip = wheel_with_metadata(b"Name: pkg\nVersion: 1.0\n");
    for lie in [
        0u64,
        10,
        zip.len() as u64 - 1,
        zip.len() as u64 + 1,
        1 << 40,
        u64::MAX,
    ] {
        let path = format!("/lie-{lie}.whl");
        server.add(
            &path,
            "application/octet-stream",
            Body::Bytes(Arc::new(zip.clone())),
            Faults {
                lie_total: Some(lie),
                ..Faults::default()
            },
        );
        let result = RemoteZip::open(&client(1), server.url(&path).parse().unwrap()).await;
        assert!(result.is_err(), "total {lie} was believed");
    }
}

/// A central directory claiming a 4 GB METADATA used to allocate it ("capacity overflow").
#[tokio::test]
async fn huge_claimed_metadata_sizes_are_refused_before_allocating() {
    let server = FixtureServer::start();
    let mut zip = wheel_with_metadata(b"Name: pkg\nVersion: 1.0\n");
    let record = central_record(&zip, "pkg-1.0.dist-info/METADATA");
    // Uncompressed size 0xFFFF_FFF0, compressed size too.
    zip[record + 20..record + 24].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    zip[record + 24..record + 28].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    server.add_bytes("/claims.whl", "application/octet-stream", zip);
    let error = wheel_metadata_by_range(&client(1), &dist_file(&server, "/claims.whl"))
        .await
        .unwrap_err();
    assert!(matches!(error, MetadataError::TooLarge { .. }), "{error}");
    let zip_reader = RemoteZip::open(&client(1), server.url("/claims.whl").parse().unwrap())
        .await
        .unwrap();
    let error = zip_reader
        .read_entry("pkg-1.0.dist-info/METADATA")
        .await
        .unwrap_err();
    assert!(
        matches!(error, RemoteZipError::EntryTooLarge { .. }),
        "{error}"
    );
}

/// A METADATA that inflates far past what its central directory admits (a zip bomb whose
/// record lies) stops at the recorded size; one that admits it is refused unread.
#[tokio::test]
async fn metadata_bombs_are_cut_off() {
    let server = FixtureServer::start();
    let mut bomb = b"Name: pkg\nVersion: 1.0\n".to_vec();
    bomb.resize(40 << 20, b'x');
    let honest = wheel_with_metadata(&bomb);
    eprintln!(
        "a {} kB wheel whose METADATA inflates to {} MB",
        honest.len() >> 10,
        bomb.len() >> 20
    );
    server.add_bytes("/honest.whl", "application/octet-stream", honest.clone());
    let error = wheel_metadata_by_range(&client(1), &dist_file(&server, "/honest.whl"))
        .await
        .unwrap_err();
    assert!(matches!(error, MetadataError::TooLarge { .. }), "{error}");
    // The same bomb, its record claiming 1000 bytes.
    let mut lying = honest;
    let record = central_record(&lying, "pkg-1.0.dist-info/METADATA");
    lying[record + 24..record + 28].copy_from_slice(&1000u32.to_le_bytes());
    server.add_bytes("/lying.whl", "application/octet-stream", lying);
    let error = wheel_metadata_by_range(&client(1), &dist_file(&server, "/lying.whl"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("more than the 1000 bytes"),
        "{error}"
    );
}

/// A `.metadata` file (PEP 658) larger than the cap is refused while it streams in.
#[tokio::test]
async fn oversized_core_metadata_files_are_refused() {
    let server = FixtureServer::start();
    let mut big = b"Name: pkg\nVersion: 1.0\n".to_vec();
    big.resize(9 << 20, b'x');
    server.add_bytes("/pkg-1.0-py3-none-any.whl.metadata", "text/plain", big);
    let mut file = dist_file(&server, "/pkg-1.0-py3-none-any.whl");
    file.core_metadata = cudastack::fetch::index::CoreMetadata::Present { sha256: None };
    let error = cudastack::fetch::metadata::wheel_metadata(&client(1), &file)
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::Http(HttpError::TooLarge { .. })),
        "{error}"
    );
}

// ---- property tests -------------------------------------------------------------------

/// One server for all cases of the property tests (each test uses its own paths).
fn shared_server() -> &'static FixtureServer {
    static SERVER: std::sync::OnceLock<FixtureServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(FixtureServer::start)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Open the zip at `path` and read every entry; any error is fine, a panic is not.
async fn read_everything(client: &HttpClient, server: &FixtureServer, path: &str) {
    let Ok(zip) = RemoteZip::open(client, server.url(path).parse().unwrap()).await else {
        return;
    };
    for entry in zip.entries().to_vec() {
        let _ = zip.read_entry(&entry.name).await;
    }
    let _ = wheel_metadata_by_range(client, &dist_file(server, path)).await;
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// A valid wheel with bytes overwritten anywhere (sizes, offsets, counts, names,
    /// signatures): the reader errors or reads, never panics or allocates what a field says.
    #[test]
    fn mutated_zips_never_panic(
        edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 1..12),
        tail_edits in proptest::collection::vec((0usize..120, proptest::prelude::any::<u8>()), 0..8),
    ) {
        let server = shared_server();
        let mut zip = wheel_with_metadata(b"Name: pkg\nVersion: 1.0\nRequires-Dist: a\n");
        for (index, byte) in edits {
            let at = index.index(zip.len());
            zip[at] = byte;
        }
        // Bias toward the central directory and end record, where the sizes live.
        let len = zip.len();
        for (back, byte) in tail_edits {
            zip[len - 1 - back.min(len - 1)] = byte;
        }
        server.add_bytes("/m.whl", "application/octet-stream", zip);
        runtime().block_on(read_everything(&client(1), server, "/m.whl"));
    }

    /// Arbitrary bytes served as a wheel.
    #[test]
    fn arbitrary_zip_bytes_never_panic(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        eocd in proptest::prelude::any::<bool>(),
    ) {
        let mut bytes = bytes;
        if eocd && bytes.len() >= 22 {
            let at = bytes.len() - 22;
            bytes[at..at + 4].copy_from_slice(&[0x50, 0x4b, 0x05, 0x06]);
        }
        let server = shared_server();
        server.add_bytes("/a.whl", "application/octet-stream", bytes);
        runtime().block_on(read_everything(&client(1), server, "/a.whl"));
    }

    /// Arbitrary answers from the server: any status, any Content-Range and Content-Length,
    /// any body, and the total of a real zip misreported.
    #[test]
    fn arbitrary_server_answers_never_panic(
        status in proptest::sample::select(vec![200u16, 206, 301, 404, 416, 500]),
        start in proptest::prelude::any::<u64>(),
        end in proptest::prelude::any::<u64>(),
        total in proptest::prelude::any::<u64>(),
        small in 0u64..2000,
        length in proptest::option::of(0u64..5000),
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
        lie in proptest::option::of(0u64..4000),
    ) {
        let server = shared_server();
        let (start, end, total) = if small % 2 == 0 { (start, end, total) } else { (small / 2, small, small + 100) };
        let mut raw = format!("HTTP/1.1 {status} X\r\nContent-Range: bytes {start}-{end}/{total}\r\n");
        if let Some(length) = length {
            raw.push_str(&format!("Content-Length: {length}\r\n"));
        }
        raw.push_str("Connection: close\r\n\r\n");
        let mut raw = raw.into_bytes();
        raw.extend_from_slice(&body);
        server.add("/raw.whl", "application/octet-stream", Body::Bytes(Arc::new(Vec::new())), Faults {
            raw_response: Some(Arc::new(raw)),
            ..Faults::default()
        });
        let zip = wheel_with_metadata(b"Name: pkg\nVersion: 1.0\n");
        server.add("/lie.whl", "application/octet-stream", Body::Bytes(Arc::new(zip)), Faults {
            lie_total: lie,
            ..Faults::default()
        });
        let rt = runtime();
        rt.block_on(async {
            let client = client(1);
            read_everything(&client, server, "/raw.whl").await;
            read_everything(&client, server, "/lie.whl").await;
        });
    }
}
