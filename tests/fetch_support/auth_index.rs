//! A private package index on 127.0.0.1 that requires HTTP basic auth, as a company's
//! devpi, Artifactory or GitLab registry does (issue 19): project pages under `/simple/`
//! in PEP 503 HTML or PEP 691 JSON, the files served from another path of the same host
//! (`/packages/`), 401 with `WWW-Authenticate: Basic` to a request without the right
//! credentials, and redirects to another server. Every request is logged with the
//! `Authorization` header it carried, so a test can see where credentials went.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine;

/// The simple API form the project pages are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageFormat {
    /// PEP 503: anchors with `#sha256=` fragments.
    Html,
    /// PEP 691: `application/vnd.pypi.simple.v1+json` with absolute file URLs.
    Json,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
}

#[derive(Clone)]
enum Answer {
    Body {
        content_type: String,
        bytes: Arc<Vec<u8>>,
    },
    Redirect(String),
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Answer>,
    /// project -> (file name, sha256 hex)
    projects: HashMap<String, Vec<(String, String)>>,
    log: Vec<Seen>,
}

/// A simple index requiring `Authorization: Basic base64(user:password)` when `login` is
/// set, or open to anyone (a stand-in for PyPI, or the other host of a redirect).
#[derive(Clone)]
pub struct AuthIndex {
    pub base: String,
    format: PageFormat,
    expected: Option<String>,
    state: Arc<Mutex<State>>,
}

impl AuthIndex {
    pub fn start(format: PageFormat, login: Option<(&str, &str)>) -> Self {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), format, login)
    }

    /// The same index listening on `address` (one of this machine's own, such as its
    /// network interface's, to stand for another host).
    pub fn start_on(
        address: std::net::IpAddr,
        format: PageFormat,
        login: Option<(&str, &str)>,
    ) -> Self {
        let listener = TcpListener::bind((address, 0)).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let expected = login.map(|(user, password)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )
        });
        let server = AuthIndex {
            base,
            format,
            expected,
            state: Arc::new(Mutex::new(State::default())),
        };
        let handler = server.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let handler = handler.clone();
                std::thread::spawn(move || {
                    let _ = handler.handle(stream);
                });
            }
        });
        server
    }

    /// The index URL a recipe names: `<base>/simple`.
    pub fn simple_url(&self) -> String {
        format!("{}/simple", self.base)
    }

    /// The host (`127.0.0.1`), as a netrc `machine` names it.
    pub fn host(&self) -> String {
        "127.0.0.1".to_string()
    }

    /// Publish a wheel of `project` at `/packages/<filename>`, its METADATA beside it (PEP
    /// 658), and list it on the project's page.
    pub fn publish(&self, project: &str, filename: &str, bytes: Vec<u8>, metadata: &str) {
        let sha256 = cudastack::digest::Digest::of_bytes(&bytes).hex();
        let mut state = self.state.lock().unwrap();
        state.routes.insert(
            format!("/packages/{filename}.metadata"),
            Answer::Body {
                content_type: "text/plain".into(),
                bytes: Arc::new(metadata.as_bytes().to_vec()),
            },
        );
        state.routes.insert(
            format!("/packages/{filename}"),
            Answer::Body {
                content_type: "application/octet-stream".into(),
                bytes: Arc::new(bytes),
            },
        );
        state
            .projects
            .entry(project.to_string())
            .or_default()
            .push((filename.to_string(), sha256));
    }

    /// List `href` (a path of this server) as a file of `project`, answered with a redirect
    /// to `target`.
    pub fn publish_redirect(&self, project: &str, filename: &str, sha256: &str, target: &str) {
        let mut state = self.state.lock().unwrap();
        state.routes.insert(
            format!("/redirect/{filename}"),
            Answer::Redirect(target.to_string()),
        );
        state
            .projects
            .entry(project.to_string())
            .or_default()
            .push((format!("redirect:{filename}"), sha256.to_string()));
    }

    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().unwrap().log.clone()
    }

    fn page(&self, project: &str, files: &[(String, String)]) -> (String, Vec<u8>) {
        let href = |name: &str| match name.strip_prefix("redirect:") {
            Some(name) => (name.to_string(), format!("{}/redirect/{name}", self.base)),
            None => (name.to_string(), format!("{}/packages/{name}", self.base)),
        };
        match self.format {
            PageFormat::Html => {
                let mut html = format!("<!DOCTYPE html><html><body><h1>Links for {project}</h1>\n");
                for (name, sha256) in files {
                    let (name, url) = href(name);
                    // Relative links, as devpi and pypiserver write them.
                    let path = url.strip_prefix(&self.base).unwrap();
                    html.push_str(&format!(
                        "<a href=\"{path}#sha256={sha256}\" data-core-metadata=\"true\">{name}</a><br/>\n"
                    ));
                }
                html.push_str("</body></html>\n");
                ("text/html".into(), html.into_bytes())
            }
            PageFormat::Json => {
                let files: Vec<_> = files
                    .iter()
                    .map(|(name, sha256)| {
                        let (name, url) = href(name);
                        serde_json::json!({"filename": name, "url": url, "hashes": {"sha256": sha256}, "core-metadata": true})
                    })
                    .collect();
                let body = serde_json::json!({"meta": {"api-version": "1.1"}, "name": project, "files": files});
                (
                    "application/vnd.pypi.simple.v1+json".into(),
                    body.to_string().into_bytes(),
                )
            }
        }
    }

    fn handle(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        let mut request_line = String::new();
        reader.read_line(&mut request_line)?;
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .to_string();
        let mut authorization = None;
        let mut range = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((key, value)) = line.split_once(':') {
                if key.trim().eq_ignore_ascii_case("authorization") {
                    authorization = Some(value.trim().to_string());
                }
                if key.trim().eq_ignore_ascii_case("range") {
                    range = Some(value.trim().to_string());
                }
            }
        }
        let answer = {
            let mut state = self.state.lock().unwrap();
            state.log.push(Seen {
                path: path.clone(),
                authorization: authorization.clone(),
            });
            let project = path
                .strip_prefix("/simple/")
                .map(|rest| rest.trim_end_matches('/').to_string());
            match project.and_then(|p| state.projects.get(&p).map(|files| (p, files.clone()))) {
                Some((project, files)) => {
                    let (content_type, bytes) = self.page(&project, &files);
                    Some(Answer::Body {
                        content_type,
                        bytes: Arc::new(bytes),
                    })
                }
                None => state.routes.get(&path).cloned(),
            }
        };
        if let Some(expected) = &self.expected {
            if authorization.as_ref() != Some(expected) {
                let body = "401 Unauthorized";
                return write!(
                    writer,
                    "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"fixture\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        }
        match answer {
            None => write!(
                writer,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"
            ),
            Some(Answer::Redirect(target)) => write!(
                writer,
                "HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
            Some(Answer::Body {
                content_type,
                bytes,
            }) => {
                // `bytes=a-b` and `bytes=-n`: how the lock learns a file's size and reads
                // a wheel's tail.
                if let Some((start, end)) = range.as_deref().and_then(|r| byte_range(r, bytes.len())) {
                    write!(
                        writer,
                        "HTTP/1.1 206 Partial Content\r\nContent-Type: {content_type}\r\nContent-Range: bytes {start}-{end}/{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        bytes.len(),
                        end + 1 - start
                    )?;
                    writer.write_all(&bytes[start..=end])?;
                    return writer.flush();
                }
                write!(
                    writer,
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    bytes.len()
                )?;
                writer.write_all(&bytes)?;
                writer.flush()
            }
        }
    }
}

/// The inclusive span a `Range: bytes=...` header asks of a body of `len` bytes.
fn byte_range(value: &str, len: usize) -> Option<(usize, usize)> {
    let (start, end) = value.strip_prefix("bytes=")?.split_once('-')?;
    let last = len.checked_sub(1)?;
    if start.is_empty() {
        let n: usize = end.parse().ok()?;
        return Some((len.saturating_sub(n), last));
    }
    let start: usize = start.parse().ok()?;
    let end = if end.is_empty() {
        last
    } else {
        end.parse::<usize>().ok()?.min(last)
    };
    (start <= end).then_some((start, end))
}
