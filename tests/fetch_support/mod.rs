//! A small HTTP/1.1 fixture server on 127.0.0.1 for fetch and lock tests.
//!
//! Serves files from memory or disk (streamed), honours `Range` (`a-b`, `a-`, `-n`), logs
//! every request with its Range header, and can misbehave per route: fail N times with a
//! status, cut the connection after N body bytes, serve the wrong bytes, or ignore ranges.
//! Plain std threads so it needs no async runtime and no extra dependency.
#![allow(dead_code)]

pub(crate) use crate::gate;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum Body {
    Bytes(Arc<Vec<u8>>),
    File(PathBuf),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::File(p) => std::fs::metadata(p).unwrap().len(),
        }
    }
}

#[derive(Clone, Default)]
pub struct Faults {
    /// Answer this status to the first `fail_times` requests.
    pub fail_status: Option<u16>,
    pub fail_times: usize,
    /// Close the connection after this many body bytes, for the first `cut_times` responses.
    pub cut_after: Option<u64>,
    pub cut_times: usize,
    /// Serve these bytes instead of the real body (same length claims nothing).
    pub wrong_body: Option<Arc<Vec<u8>>>,
    /// Answer 200 with the whole body even when a Range is asked for.
    pub ignore_range: bool,
    /// Wait this long before sending the body (to observe parallelism).
    pub delay_ms: u64,
    /// Only delay the first `delay_times` responses (0 = all of them).
    pub delay_times: usize,
    /// Claim this total file size in `Content-Range` (a lying index).
    pub lie_total: Option<u64>,
    /// Write these bytes as the whole response (status line, headers and body), whatever
    /// was asked: arbitrary server answers.
    pub raw_response: Option<Arc<Vec<u8>>>,
}

#[derive(Clone)]
pub struct Route {
    pub body: Body,
    pub content_type: String,
    pub faults: Faults,
}

#[derive(Debug, Clone)]
pub struct LoggedRequest {
    pub path: String,
    pub range: Option<String>,
    pub accept: Option<String>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    hits: HashMap<String, usize>,
    log: Vec<LoggedRequest>,
    active: usize,
    max_active: usize,
}

#[derive(Clone)]
pub struct FixtureServer {
    pub base: String,
    state: Arc<Mutex<State>>,
}

impl FixtureServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let server_state = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let state = server_state.clone();
                std::thread::spawn(move || {
                    let _ = handle(stream, &state);
                });
            }
        });
        FixtureServer { base, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn add(&self, path: &str, content_type: &str, body: Body, faults: Faults) {
        self.state.lock().unwrap().routes.insert(
            path.to_string(),
            Route {
                body,
                content_type: content_type.to_string(),
                faults,
            },
        );
    }

    pub fn add_bytes(&self, path: &str, content_type: &str, bytes: Vec<u8>) {
        self.add(
            path,
            content_type,
            Body::Bytes(Arc::new(bytes)),
            Faults::default(),
        );
    }

    pub fn set_faults(&self, path: &str, faults: Faults) {
        let mut state = self.state.lock().unwrap();
        state.routes.get_mut(path).unwrap().faults = faults;
        state.hits.remove(path);
    }

    pub fn log(&self) -> Vec<LoggedRequest> {
        self.state.lock().unwrap().log.clone()
    }

    /// The most requests that were being answered at the same moment.
    pub fn max_concurrent(&self) -> usize {
        self.state.lock().unwrap().max_active
    }

    pub fn requests_for(&self, path: &str) -> Vec<LoggedRequest> {
        self.log().into_iter().filter(|r| r.path == path).collect()
    }
}

fn parse_range(value: &str, len: u64) -> Option<(u64, u64)> {
    let spec = value.trim().strip_prefix("bytes=")?;
    let (start, end) = spec.split_once('-')?;
    if start.is_empty() {
        let n: u64 = end.parse().ok()?;
        let n = n.min(len);
        return Some((len - n, len.checked_sub(1)?));
    }
    let start: u64 = start.parse().ok()?;
    let end: u64 = if end.is_empty() {
        len.checked_sub(1)?
    } else {
        end.parse::<u64>().ok()?.min(len.checked_sub(1)?)
    };
    (start <= end && start < len).then_some((start, end))
}

fn handle(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    let method = request_line
        .split_whitespace()
        .next()
        .unwrap_or("GET")
        .to_string();
    let mut range = None;
    let mut accept = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((key, value)) = line.split_once(':') {
            match key.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(value.trim().to_string()),
                "accept" => accept = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    let (route, hit) = {
        let mut state = state.lock().unwrap();
        state.log.push(LoggedRequest {
            path: path.clone(),
            range: range.clone(),
            accept,
        });
        let hit = {
            let counter = state.hits.entry(path.clone()).or_insert(0);
            *counter += 1;
            *counter
        };
        (state.routes.get(&path).cloned(), hit)
    };
    let Some(route) = route else {
        write!(
            writer,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"
        )?;
        return Ok(());
    };
    let faults = &route.faults;
    if let Some(raw) = &faults.raw_response {
        writer.write_all(raw)?;
        writer.flush()?;
        let _ = writer.shutdown(std::net::Shutdown::Both);
        return Ok(());
    }
    if let Some(status) = faults.fail_status {
        if hit <= faults.fail_times {
            write!(writer, "HTTP/1.1 {status} Fixture Failure\r\nContent-Length: 4\r\nConnection: close\r\n\r\nfail")?;
            return Ok(());
        }
    }
    let body = match &faults.wrong_body {
        Some(wrong) => Body::Bytes(wrong.clone()),
        None => route.body.clone(),
    };
    let len = body.len();
    let ranged = range
        .as_deref()
        .filter(|_| !faults.ignore_range)
        .map(|r| parse_range(r, len));
    let (status, start, end) = match ranged {
        Some(Some((start, end))) => ("206 Partial Content", start, end),
        Some(None) => {
            write!(writer, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            return Ok(());
        }
        None => ("200 OK", 0, len.saturating_sub(1)),
    };
    let count = if len == 0 { 0 } else { end - start + 1 };
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {count}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n",
        route.content_type
    );
    if status.starts_with("206") {
        let total = faults.lie_total.unwrap_or(len);
        head.push_str(&format!("Content-Range: bytes {start}-{end}/{total}\r\n"));
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes())?;
    if faults.delay_ms > 0 && (faults.delay_times == 0 || hit <= faults.delay_times) {
        {
            let mut state = state.lock().unwrap();
            state.active += 1;
            state.max_active = state.max_active.max(state.active);
        }
        std::thread::sleep(std::time::Duration::from_millis(faults.delay_ms));
        state.lock().unwrap().active -= 1;
    }
    if method == "HEAD" {
        return Ok(());
    }
    let limit = match faults.cut_after {
        Some(cut) if hit <= faults.cut_times => cut.min(count),
        _ => count,
    };
    match body {
        Body::Bytes(bytes) => {
            writer.write_all(&bytes[start as usize..(start + limit) as usize])?;
        }
        Body::File(path) => {
            let mut file = std::fs::File::open(path)?;
            file.seek(SeekFrom::Start(start))?;
            std::io::copy(&mut file.take(limit), &mut writer)?;
        }
    }
    writer.flush()?;
    if limit < count {
        // Abort mid-body: the client sees a truncated response.
        let _ = writer.shutdown(std::net::Shutdown::Both);
    }
    Ok(())
}

/// A real wheel (zip) holding `<name>/__init__.py` and `<dist>-<version>.dist-info/METADATA`
/// with the given extra header lines (`Requires-Dist: ...`). Entries are deflated.
pub fn wheel_bytes(name: &str, version: &str, headers: &[&str]) -> (Vec<u8>, String) {
    use zip::write::SimpleFileOptions;
    let dist = name.replace('-', "_");
    let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for header in headers {
        metadata.push_str(header);
        metadata.push('\n');
    }
    metadata.push_str("\nA long description that is not a header.\n");
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    writer
        .start_file(format!("{dist}/__init__.py"), options)
        .unwrap();
    writer.write_all(b"VALUE = 1\n").unwrap();
    writer
        .start_file(format!("{dist}-{version}.dist-info/METADATA"), options)
        .unwrap();
    writer.write_all(metadata.as_bytes()).unwrap();
    writer
        .start_file(format!("{dist}-{version}.dist-info/WHEEL"), options)
        .unwrap();
    writer.write_all(b"Wheel-Version: 1.0\n").unwrap();
    (writer.finish().unwrap().into_inner(), metadata)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    cudastack::digest::Digest::of_bytes(bytes).hex()
}

/// Build a tiny shared library with gcc (`-shared -Wl,-soname,<soname>`). `None` (with a
/// printed reason) when gcc is missing.
pub fn gcc_shared_library(dir: &std::path::Path, soname: &str, file: &str) -> Option<Vec<u8>> {
    let source = dir.join("lib.c");
    std::fs::write(
        &source,
        "int cudastack_fixture_version(void) { return 90100; }\n",
    )
    .unwrap();
    let output = dir.join(file);
    let status = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&output)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(&source)
        .status();
    match status {
        Ok(status) if status.success() => Some(std::fs::read(output).unwrap()),
        _ => {
            gate::skip("gcc", "gcc is not available to build a fixture ELF library");
            None
        }
    }
}

/// An NVIDIA-style redist `.tar.xz`: `<top>/lib/<real>` plus the symlink chain
/// `<link1> -> <real>`, `<link0> -> <link1>`, and a LICENSE. Headers are written by hand so
/// the symlinks stay symlinks.
pub fn redist_tar_xz(top: &str, library: &[u8], real: &str, chain: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    dir.set_mtime(0);
    builder
        .append_data(&mut dir.clone(), format!("{top}/"), std::io::empty())
        .unwrap();
    builder
        .append_data(&mut dir, format!("{top}/lib/"), std::io::empty())
        .unwrap();
    let mut license = tar::Header::new_gnu();
    license.set_mode(0o644);
    license.set_size(7);
    license.set_mtime(0);
    builder
        .append_data(&mut license, format!("{top}/LICENSE"), &b"license"[..])
        .unwrap();
    let mut file = tar::Header::new_gnu();
    file.set_mode(0o755);
    file.set_size(library.len() as u64);
    file.set_mtime(0);
    builder
        .append_data(&mut file, format!("{top}/lib/{real}"), library)
        .unwrap();
    for (link, target) in chain {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        header.set_mtime(0);
        builder
            .append_link(&mut header, format!("{top}/lib/{link}"), target)
            .unwrap();
    }
    let tar_bytes = builder.into_inner().unwrap();
    let mut encoder = liblzma::write::XzEncoder::new(Vec::new(), 6);
    encoder.write_all(&tar_bytes).unwrap();
    encoder.finish().unwrap()
}

/// A client for tests against the fixture server: `max_attempts` tries, backoffs in
/// milliseconds, so retry tests take no time.
pub fn client(max_attempts: u32) -> cudastack::fetch::http::HttpClient {
    use cudastack::fetch::http::{HttpClient, HttpConfig, RetryPolicy};
    use std::time::Duration;
    HttpClient::new(HttpConfig {
        retry: RetryPolicy {
            max_attempts,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
        },
        read_timeout: Duration::from_secs(5),
        ..HttpConfig::default()
    })
    .unwrap()
}

/// `len` bytes of a fixed, non-repeating-looking pattern.
pub fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}
