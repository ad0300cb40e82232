//! Serves a directory over HTTP/1.1 on 127.0.0.1 (a random port), GET and HEAD.
//!
//! tests/fetch_support's FixtureServer serves routes registered in advance; an archive is
//! a directory that changes under the test (publish, a file removed after locking), so
//! this server looks each request up on disk at the moment it arrives: a missing file is a
//! 404 from then on. Keep-alive and apt's pipelined requests are answered in order on the
//! same connection. No Range: apt and the fetcher ask for whole files from a fresh cache.
//! Dropping the handle stops accepting connections.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A request the server answered: method, path as asked (query stripped) and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRequest {
    pub method: String,
    pub path: String,
    pub status: u16,
}

pub struct DirServer {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<ServedRequest>>>,
    accept: Option<JoinHandle<()>>,
}

impl DirServer {
    /// Serve `root` (which may change or vanish while served) until dropped.
    pub fn serve(root: &Path) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (root, accept_stop, accept_log) = (root.to_path_buf(), stop.clone(), log.clone());
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accept_stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (root, log) = (root.clone(), accept_log.clone());
                std::thread::spawn(move || {
                    let _ = serve_connection(stream, &root, &log);
                });
            }
        });
        Ok(Self {
            address,
            stop,
            log,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<ServedRequest> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The requests whose path ends with `suffix` (e.g. a .deb's file name).
    pub fn requests_for(&self, suffix: &str) -> Vec<ServedRequest> {
        let mut all = self.requests();
        all.retain(|r| r.path.ends_with(suffix));
        all
    }
}

impl Drop for DirServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag; it then drops the listener.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Answer requests on one connection until the client closes it, asks to, or is idle.
fn serve_connection(
    stream: TcpStream,
    root: &Path,
    log: &Mutex<Vec<ServedRequest>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut close = false;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                close |= name.trim().eq_ignore_ascii_case("connection")
                    && value.trim().eq_ignore_ascii_case("close");
            }
        }
        let mut words = request_line.split_whitespace();
        let method = words.next().unwrap_or_default().to_string();
        let target = words.next().unwrap_or("/");
        let path = target.split(['?', '#']).next().unwrap_or("/").to_string();
        let status = respond(&mut writer, root, &method, &path)?;
        log.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ServedRequest {
                method,
                path,
                status,
            });
        if close {
            return Ok(());
        }
    }
}

fn respond(writer: &mut TcpStream, root: &Path, method: &str, path: &str) -> std::io::Result<u16> {
    if method != "GET" && method != "HEAD" {
        return status_only(writer, 405, "Method Not Allowed");
    }
    let file = local_path(root, path).and_then(|p| {
        let file = std::fs::File::open(&p).ok()?;
        let meta = file.metadata().ok()?;
        meta.is_file().then_some((file, meta.len()))
    });
    let Some((mut file, length)) = file else {
        return status_only(writer, 404, "Not Found");
    };
    write!(
        writer,
        "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )?;
    if method == "GET" {
        std::io::copy(&mut file, writer)?;
    }
    writer.flush()?;
    Ok(200)
}

fn status_only(writer: &mut TcpStream, status: u16, reason: &str) -> std::io::Result<u16> {
    write!(
        writer,
        "HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n\r\n"
    )?;
    writer.flush()?;
    Ok(status)
}

/// The file under `root` that the URL path names, or None when it would leave `root`.
/// Percent-escapes are decoded (apt writes a version's epoch colon as `%3a`).
fn local_path(root: &Path, url_path: &str) -> Option<PathBuf> {
    let decoded = percent_decode(url_path)?;
    let relative = Path::new(decoded.trim_start_matches('/'));
    let normal = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    normal.then(|| root.join(relative))
}

/// `%XX` escapes decoded; None for a malformed escape or bytes that are not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
