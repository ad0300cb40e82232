//! RemoteZip against the fixture server: a multi-megabyte deflated entry streamed through
//! `entry_reader`, zip64 extra fields, and corruption caught by the CRC-32 check.

use crate::fetch_support;

use std::io::{Read, Write};
use std::time::Duration;

use cudastack::fetch::http::{HttpClient, HttpConfig, RetryPolicy};
use cudastack::fetch::remote_zip::{RemoteZip, RemoteZipError};
use fetch_support::FixtureServer;
use zip::write::SimpleFileOptions;

fn client() -> HttpClient {
    HttpClient::new(HttpConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
        },
        ..HttpConfig::default()
    })
    .unwrap()
}

/// 3 MB of compressible-but-not-trivial bytes containing a marker string near the end,
/// like the CUDA arch list inside libtorch_python.so.
fn library_bytes() -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8 & 0x3f)
        .collect();
    let marker = b"sm_50;sm_60;sm_70;sm_75;sm_80;sm_86;sm_90";
    bytes[2_900_000..2_900_000 + marker.len()].copy_from_slice(marker);
    bytes
}

fn archive(large_file: bool) -> (Vec<u8>, Vec<u8>) {
    let library = library_bytes();
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(large_file);
    writer
        .start_file("torch/lib/libtorch_python.so", options)
        .unwrap();
    writer.write_all(&library).unwrap();
    let stored = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    writer
        .start_file("torch-9.9.dist-info/METADATA", stored)
        .unwrap();
    writer.write_all(b"Name: torch\nVersion: 9.9\n").unwrap();
    (writer.finish().unwrap().into_inner(), library)
}

async fn stream(zip: &RemoteZip, name: &str) -> std::io::Result<Vec<u8>> {
    let mut reader = zip.entry_reader(name).await.unwrap();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        reader.read_to_end(&mut out).map(|_| out)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_a_large_entry_and_reads_stored_ones() {
    for large_file in [false, true] {
        let server = FixtureServer::start();
        let (bytes, library) = archive(large_file);
        server.add_bytes("/torch.whl", "application/octet-stream", bytes);
        let zip = RemoteZip::open(&client(), server.url("/torch.whl").parse().unwrap())
            .await
            .unwrap();
        let entry = zip.entry("torch/lib/libtorch_python.so").unwrap();
        assert_eq!(entry.uncompressed_size, library.len() as u64);
        assert!(entry.compressed_size < entry.uncompressed_size);
        let streamed = stream(&zip, "torch/lib/libtorch_python.so").await.unwrap();
        assert!(streamed == library, "large_file={large_file}");
        assert_eq!(
            zip.read_entry("torch-9.9.dist-info/METADATA")
                .await
                .unwrap(),
            b"Name: torch\nVersion: 9.9\n"
        );
        // Everything went through range requests: tail, header, body.
        assert!(server.log().iter().all(|r| r.range.is_some()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_entry_data_fails_the_crc_check() {
    let server = FixtureServer::start();
    let (mut bytes, _) = archive(false);
    // Flip one byte inside the stored METADATA entry's data.
    let position = bytes.windows(11).position(|w| w == b"Name: torch").unwrap();
    bytes[position] = b'n';
    server.add_bytes("/torch.whl", "application/octet-stream", bytes);
    let zip = RemoteZip::open(&client(), server.url("/torch.whl").parse().unwrap())
        .await
        .unwrap();
    let error = zip
        .read_entry("torch-9.9.dist-info/METADATA")
        .await
        .unwrap_err();
    assert!(
        matches!(error, RemoteZipError::CorruptEntry { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("CRC-32"), "{error}");
}

#[tokio::test]
async fn not_a_zip_is_a_clear_error() {
    let server = FixtureServer::start();
    server.add_bytes("/x.whl", "application/octet-stream", vec![b'x'; 5000]);
    let error = RemoteZip::open(&client(), server.url("/x.whl").parse().unwrap())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("/x.whl") && message.contains("end-of-central-directory"),
        "{message}"
    );
}

/// Python's http.server, a plain static file server that ignores byte ranges (it answers
/// `Range` with the whole file), serving `dir` on a free port of 127.0.0.1; stopped on drop.
struct StaticServer {
    child: std::process::Child,
    port: u16,
}

impl StaticServer {
    fn start(dir: &std::path::Path) -> Option<StaticServer> {
        use std::io::BufRead;
        let mut child = std::process::Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        // "Serving HTTP on 127.0.0.1 port 41233 (http://127.0.0.1:41233/) ..."
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take()?)
            .read_line(&mut line)
            .ok()?;
        let port = line
            .split(" port ")
            .nth(1)?
            .split(' ')
            .next()?
            .parse()
            .ok()?;
        Some(StaticServer { child, port })
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private index served by a plain static file server: its wheels have no `.metadata`
/// file and the server ignores byte ranges, so METADATA comes from the wheel downloaded
/// whole (as pip reads it), checked against the index's sha256 and bounded by its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_ranges_gives_metadata_from_the_whole_wheel() {
    use cudastack::fetch::index::DistFile;
    use cudastack::fetch::metadata::{wheel_metadata, MetadataError};
    let dir = tempfile::tempdir().unwrap();
    // Larger than the tail a range read asks for first (128 KiB): the server's whole-file
    // answer must be told apart by its headers, not by its size.
    let bytes = {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let stored =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        writer
            .start_file("torch/lib/libtorch_python.so", stored)
            .unwrap();
        writer.write_all(&library_bytes()).unwrap();
        writer
            .start_file("torch-9.9.dist-info/METADATA", stored)
            .unwrap();
        writer.write_all(b"Name: torch\nVersion: 9.9\n").unwrap();
        writer.finish().unwrap().into_inner()
    };
    assert!(bytes.len() > 1 << 20);
    std::fs::write(dir.path().join("torch-9.9-py3-none-any.whl"), &bytes).unwrap();
    let Some(server) = StaticServer::start(dir.path()) else {
        crate::gate::skip("python3", "python3 -m http.server did not start");
        return;
    };
    let file = |sha256, size| DistFile {
        filename: "torch-9.9-py3-none-any.whl".parse().unwrap(),
        url: format!(
            "http://127.0.0.1:{}/torch-9.9-py3-none-any.whl",
            server.port
        )
        .parse()
        .unwrap(),
        sha256,
        size,
        requires_python: None,
        yanked: false,
        yanked_reason: None,
        upload_time: None,
        core_metadata: Default::default(),
    };
    let real = cudastack::digest::Digest::of_bytes(&bytes);
    let text = wheel_metadata(&client(), &file(Some(real), None))
        .await
        .unwrap();
    assert_eq!(text, "Name: torch\nVersion: 9.9\n");
    let text = wheel_metadata(&client(), &file(None, Some(bytes.len() as u64)))
        .await
        .unwrap();
    assert_eq!(text, "Name: torch\nVersion: 9.9\n");
    // An index whose hash is not the file's: refused, as the download of the wheel would be.
    let other = cudastack::digest::Digest::of_bytes(b"another wheel");
    let error = wheel_metadata(&client(), &file(Some(other), None))
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::WheelMismatch { .. }),
        "{error}"
    );
    // A file longer than the index said: not read past what was announced.
    let error = wheel_metadata(&client(), &file(None, Some(1000)))
        .await
        .unwrap_err();
    assert!(
        matches!(error, MetadataError::WheelTooLarge { limit: 1000, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("ignores byte-range requests"),
        "{error}"
    );
}
