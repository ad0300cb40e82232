//! Real peers for the registry tests: Debian's `docker-registry` (distribution 2.8) started
//! per test on a free 127.0.0.1 port with its own storage and config, an HTTP proxy that
//! can count, refuse, answer for, or cut off requests in front of it, and small real
//! images (layers of random bytes built with `cudastack::layer`).
//!
//! A missing binary makes the test print why it is skipped (CI installs it).

#![allow(dead_code)]

pub(crate) use crate::gate;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudastack::cache::BlobStore;
use cudastack::layer::{self, BuildOptions, Compression, Entry, LayerContents, LayerPath};
use cudastack::oci::Image;

pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";

/// Why the registry tests cannot run here, if they cannot (the caller reports it through
/// the gate: `skip.report()`).
pub fn skip_reason() -> Option<gate::Skip> {
    if Path::new(REGISTRY_BINARY).is_file() {
        None
    } else {
        Some(gate::Skip::missing(
            "registry",
            format!("{REGISTRY_BINARY} is missing (apt-get install docker-registry)"),
        ))
    }
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, up: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let connected = TcpStream::connect(("127.0.0.1", port)).is_ok();
        if connected == up {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "port {port} did not come {}",
        if up { "up" } else { "down" }
    );
}

/// A `docker-registry` process with its own storage; killed on drop.
pub struct Registry {
    pub port: u16,
    pub dir: tempfile::TempDir,
    config: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Registry {
    /// Start a registry; with `htpasswd` = (user, password) it demands basic auth.
    pub fn start(htpasswd: Option<(&str, &str)>) -> Arc<Registry> {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth = match htpasswd {
            Some((user, password)) => {
                let hash = bcrypt::hash(password, 5).unwrap();
                let file = dir.path().join("htpasswd");
                std::fs::write(&file, format!("{user}:{hash}\n")).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: cudastack-test\n    path: {}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        let config = dir.path().join("config.yml");
        // A fixed http.secret: upload-session state tokens stay valid across a restart.
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n  secret: cudastack-registry-test-secret\n{auth}",
                storage.display()
            ),
        )
        .unwrap();
        let registry = Arc::new(Registry {
            port,
            dir,
            config,
            child: Mutex::new(None),
        });
        registry.spawn();
        registry
    }

    /// Start the process (again, after [`Registry::kill`]) on the same port and storage.
    pub fn spawn(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .unwrap();
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&self.config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        *self.child.lock().unwrap() = Some(child);
        wait_for_port(self.port, true);
    }

    /// SIGKILL the registry (as a crash would) and wait until its port is closed.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_for_port(self.port, false);
    }

    /// Start it again on the same port and storage.
    pub fn restart(&self) {
        self.kill();
        self.spawn();
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn content_length(&self) -> u64 {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
    pub fn is_blob_upload(&self) -> bool {
        self.target.contains("/blobs/uploads/")
    }
}

/// What the proxy does with a request.
pub enum Action {
    /// Pass it to the registry.
    Forward,
    /// Pass it on without its Authorization header (the proxy did the auth).
    ForwardWithoutAuth,
    /// Answer it here (after reading its body).
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Close the connection without an answer.
    Drop,
    /// Forward the head and the first N body bytes, then cut both connections (a network
    /// failure in the middle of an upload; the registry stays up).
    ForwardCut(u64),
}

pub type Hook = Arc<dyn Fn(&RequestHead) -> Action + Send + Sync>;

/// An HTTP/1.1 proxy on 127.0.0.1 in front of a registry. It forces `Connection: close`
/// so every request is one connection it can inspect; it counts the body bytes of blob
/// uploads it forwards and logs `METHOD target` of every request.
pub struct Proxy {
    pub port: u16,
    pub upload_bytes: Arc<AtomicU64>,
    pub log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(backend_port: u16, hook: Hook) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let upload_bytes = Arc::new(AtomicU64::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (upload_bytes, log, stop) = (upload_bytes.clone(), log.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (hook, upload_bytes, log) =
                        (hook.clone(), upload_bytes.clone(), log.clone());
                    std::thread::spawn(move || {
                        let _ = handle(stream, backend_port, &hook, upload_bytes, &log);
                    });
                }
            });
        }
        Proxy {
            port,
            upload_bytes,
            log,
            stop,
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn read_head(stream: &mut TcpStream) -> std::io::Result<(RequestHead, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
    };
    let text = String::from_utf8_lossy(&buffer[..end]).to_string();
    let mut lines = text.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_string();
    let target = request_line.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok((
        RequestHead {
            method,
            target,
            headers,
        },
        buffer[end + 4..].to_vec(),
    ))
}

fn handle(
    mut client: TcpStream,
    backend_port: u16,
    hook: &Hook,
    upload_bytes: Arc<AtomicU64>,
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let (head, leftover) = read_head(&mut client)?;
    log.lock()
        .unwrap()
        .push(format!("{} {}", head.method, head.target));
    let mut cut_after = None;
    let strip_auth = match hook(&head) {
        Action::ForwardCut(after) => {
            cut_after = Some(after);
            false
        }
        Action::Forward => false,
        Action::ForwardWithoutAuth => true,
        Action::Drop => {
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        Action::Respond {
            status,
            headers,
            body,
        } => {
            let mut remaining = head.content_length().saturating_sub(leftover.len() as u64);
            let mut sink = [0u8; 65536];
            while remaining > 0 {
                let n = client.read(&mut sink)?;
                if n == 0 {
                    break;
                }
                remaining = remaining.saturating_sub(n as u64);
            }
            let mut response = format!("HTTP/1.1 {status} X\r\n");
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str(&format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ));
            client.write_all(response.as_bytes())?;
            client.write_all(&body)?;
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
    };
    let Ok(mut backend) = TcpStream::connect(("127.0.0.1", backend_port)) else {
        // The registry is down: the client sees the connection close, as with a crash.
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    };
    let mut request = format!("{} {} HTTP/1.1\r\n", head.method, head.target);
    for (name, value) in &head.headers {
        if name.eq_ignore_ascii_case("connection")
            || (strip_auth && name.eq_ignore_ascii_case("authorization"))
        {
            continue;
        }
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    backend.write_all(request.as_bytes())?;
    if let Some(after) = cut_after {
        let mut sent = leftover.len().min(after as usize);
        backend.write_all(&leftover[..sent])?;
        let mut buffer = [0u8; 65536];
        while (sent as u64) < after {
            let want = buffer.len().min(after as usize - sent);
            let n = client.read(&mut buffer[..want])?;
            if n == 0 {
                break;
            }
            backend.write_all(&buffer[..n])?;
            sent += n;
        }
        upload_bytes.fetch_add(sent as u64, Ordering::Relaxed);
        // Give the registry a moment to take in what it got, then cut both sides.
        std::thread::sleep(Duration::from_millis(200));
        let _ = backend.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    }
    backend.write_all(&leftover)?;
    let counts = head.is_blob_upload() && (head.method == "PUT" || head.method == "PATCH");
    if counts {
        upload_bytes.fetch_add(leftover.len() as u64, Ordering::Relaxed);
    }
    let mut client_reader = client.try_clone()?;
    let mut backend_writer = backend.try_clone()?;
    let counter = upload_bytes.clone();
    let uploader = std::thread::spawn(move || {
        let mut buffer = [0u8; 65536];
        loop {
            match client_reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if backend_writer.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                    if counts {
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    });
    let _ = std::io::copy(&mut backend, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = backend.shutdown(Shutdown::Both);
    let _ = uploader.join();
    Ok(())
}

/// Deterministic pseudo-random bytes (xorshift64*): incompressible layer content.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A real gzip layer holding `data/NAME.bin` with `len` random bytes from `seed`.
pub fn random_layer(store: &BlobStore, name: &str, seed: u64, len: usize) -> layer::Layer {
    let contents = LayerContents::from_entries([
        Entry::dir(LayerPath::parse("data").unwrap(), 0o755),
        Entry::file_bytes(
            LayerPath::parse(&format!("data/{name}.bin")).unwrap(),
            0o644,
            random_bytes(seed, len),
        ),
    ])
    .unwrap();
    layer::build(
        store,
        &contents,
        &BuildOptions::new(1_700_000_000, Compression::Gzip { level: 1 }),
    )
    .unwrap()
}

/// An image of the given layers, with a label so two images differ in their config.
pub fn image_of(layers: &[layer::Layer], label: &str) -> Image {
    let mut image = Image::new(1_700_000_000).with_label("io.cudastack.test", label);
    for layer in layers {
        image = image.with_layer(layer.clone(), "test layer");
    }
    image.with_cmd(vec!["/data".to_string()])
}
