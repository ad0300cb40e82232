//! A small HTTP/1.1 file server on 127.0.0.1 for tests that stand in for sources this
//! machine cannot reach (NVIDIA's servers, PyTorch's indexes) or that must misbehave on
//! purpose. It serves fixed bytes per path, honours `Range` (`bytes=a-b`, `bytes=a-`,
//! `bytes=-n`), and records every request line with its Range header so tests can prove
//! range reads happened. It is real HTTP over a real socket: the client code under test
//! runs unchanged.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

#[derive(Clone)]
pub struct Route {
    pub content_type: String,
    pub body: Arc<Vec<u8>>,
}

pub struct FixtureServer {
    pub base: String,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl FixtureServer {
    pub fn start() -> FixtureServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let (routes_for_thread, requests_for_thread) = (routes.clone(), requests.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (routes, requests) = (routes_for_thread.clone(), requests_for_thread.clone());
                thread::spawn(move || serve(stream, &routes, &requests));
            }
        });
        FixtureServer {
            base,
            routes,
            requests,
        }
    }

    pub fn add(&self, path: &str, content_type: &str, body: Vec<u8>) {
        self.routes.lock().unwrap().insert(
            path.to_string(),
            Route {
                content_type: content_type.to_string(),
                body: Arc::new(body),
            },
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, routes: &Mutex<HashMap<String, Route>>, requests: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut range = None;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("range") {
                    range = Some(value.trim().to_string());
                }
            }
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts
            .next()
            .unwrap_or("/")
            .split('?')
            .next()
            .unwrap_or("/")
            .to_string();
        requests.lock().unwrap().push(format!(
            "{method} {path}{}",
            range
                .as_ref()
                .map(|r| format!(" Range: {r}"))
                .unwrap_or_default()
        ));
        let route = routes.lock().unwrap().get(&path).cloned();
        let Some(route) = route else {
            let _ = writer.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        };
        let total = route.body.len() as u64;
        let (status, start, end) = match range.as_deref().and_then(|r| parse_range(r, total)) {
            Some((start, end)) => ("206 Partial Content", start, end),
            None => ("200 OK", 0, total.saturating_sub(1)),
        };
        let slice: &[u8] = if total == 0 {
            &[]
        } else {
            &route.body[start as usize..=end as usize]
        };
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n", route.content_type, slice.len());
        if status.starts_with("206") {
            head.push_str(&format!("Content-Range: bytes {start}-{end}/{total}\r\n"));
        }
        head.push_str("\r\n");
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method != "HEAD" && writer.write_all(slice).is_err() {
            return;
        }
    }
}

fn parse_range(value: &str, total: u64) -> Option<(u64, u64)> {
    let spec = value.strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    if total == 0 {
        return None;
    }
    if first.is_empty() {
        let suffix: u64 = last.parse().ok()?;
        return Some((total.saturating_sub(suffix), total - 1));
    }
    let start: u64 = first.parse().ok()?;
    let end = if last.is_empty() {
        total - 1
    } else {
        last.parse::<u64>().ok()?.min(total - 1)
    };
    (start <= end).then_some((start, end))
}
