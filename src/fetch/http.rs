//! The one HTTP client every fetch goes through.
//!
//! It owns what every source shares: a user agent, timeouts, a bounded semaphore so no
//! more than N bodies stream at once, and an index's basic credentials, added to each
//! request on top of the retrying [`crate::net::Transport`] (which decides what is
//! transient). Index pages and metadata are
//! small and are read whole ([`HttpClient::get_bytes`] says so in its name); artifacts are
//! streamed by the downloader ([`crate::fetch::download`]) and never held in memory.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_RANGE, RANGE};
use reqwest::{Method, Response, StatusCode, Url};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::fetch::credentials::{IndexAuth, IndexCredentials};
use crate::net::{attempts_note, is_transient, Failure, NetError, Transport};
// The transport's vocabulary, under the names fetch's callers have always used.
pub use crate::net::{error_chain, redacted, ContentRange, Redacted, RetryPolicy};

/// Errors from the HTTP layer. Every variant names the URL, with any user name and
/// password in it masked ([`redacted`]).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("Failed to build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("Not found (404): `{}`", redacted(url))]
    NotFound { url: Url },
    #[error("Failed to fetch `{}`: HTTP {status}{}", redacted(url), attempts_note(*attempts))]
    Status {
        url: Url,
        status: StatusCode,
        attempts: u32,
    },
    /// 401 or 403 from one of the recipe's named indexes.
    #[error("{}", unauthorized_message(auth, url, *status))]
    Unauthorized {
        url: Url,
        status: StatusCode,
        auth: Box<IndexAuth>,
    },
    #[error("Failed to fetch `{}`{}", redacted(url), attempts_note(*attempts))]
    Transport {
        url: Url,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "Server for `{}` ignored a byte-range request (answered {status} without `Content-Range`)",
        redacted(url)
    )]
    RangeUnsupported { url: Url, status: StatusCode },
    #[error(
        "Server for `{}` sent a malformed `Content-Range` header: `{value}`",
        redacted(url)
    )]
    BadContentRange { url: Url, value: String },
    #[error(
        "`{}` sent more than {limit} bytes, more than cudastack reads for it; refusing the rest",
        redacted(url)
    )]
    TooLarge { url: Url, limit: u64 },
    #[error("`{}` is not a valid URL", redacted_text(url))]
    BadUrl {
        url: String,
        #[source]
        source: url::ParseError,
    },
}

/// What a 401/403 of a named index means: no credentials were found (say the three ways
/// to give them) or the ones sent were refused (say where they came from, never what).
fn unauthorized_message(auth: &IndexAuth, url: &Url, status: StatusCode) -> String {
    let name = &auth.spec.name;
    match auth.origin() {
        None => format!(
            "Index `{name}` answered HTTP {status} for `{}`: it needs credentials, and cudastack found none for it\n  hint: {}",
            redacted(url),
            auth.ways_to_authenticate()
        ),
        Some(origin) => format!(
            "Index `{name}` refused the credentials from {origin} (HTTP {status} for `{}`)\n  hint: check the user name and password given there (cudastack never prints them), and that this user may read the index",
            redacted(url)
        ),
    }
}

/// Text that failed to parse as a URL, with anything between `://` and an `@` masked.
pub(crate) fn redacted_text(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://****@{}", &rest[at + 1..]),
                None => text.to_string(),
            }
        }
        None => text.to_string(),
    }
}

impl HttpError {
    /// The URL the failed request was for.
    pub fn url(&self) -> Option<&Url> {
        match self {
            HttpError::Client(_) | HttpError::BadUrl { .. } => None,
            HttpError::NotFound { url }
            | HttpError::Status { url, .. }
            | HttpError::Unauthorized { url, .. }
            | HttpError::Transport { url, .. }
            | HttpError::RangeUnsupported { url, .. }
            | HttpError::BadContentRange { url, .. }
            | HttpError::TooLarge { url, .. } => Some(url),
        }
    }
}

/// The most a document read whole (an index page, a manifest, a METADATA file) may be.
/// PyPI's JSON page for torch, the largest listing cudastack reads, is a few MB.
pub const MAX_DOCUMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Parse a URL at the edge, with an error that names it.
pub fn parse_url(url: &str) -> Result<Url, HttpError> {
    Url::parse(url).map_err(|source| HttpError::BadUrl {
        url: url.to_string(),
        source,
    })
}

/// Settings for [`HttpClient::new`].
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub user_agent: String,
    pub connect_timeout: Duration,
    /// Longest silence while reading a response (not a limit on the whole transfer:
    /// a 3 GB wheel may legitimately take many minutes).
    pub read_timeout: Duration,
    pub retry: RetryPolicy,
    /// How many response bodies may stream at the same time.
    pub max_parallel: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            user_agent: format!(
                "cudastack/{} (+https://github.com/cudastack/cudastack)",
                env!("CARGO_PKG_VERSION")
            ),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            max_parallel: 4,
        }
    }
}

/// A byte range to request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=start-end`, both inclusive.
    Inclusive { start: u64, end: u64 },
    /// `bytes=start-`: from `start` to the end.
    From(u64),
    /// `bytes=-n`: the last `n` bytes.
    Suffix(u64),
}

impl ByteRange {
    fn header(&self) -> String {
        match self {
            ByteRange::Inclusive { start, end } => format!("bytes={start}-{end}"),
            ByteRange::From(start) => format!("bytes={start}-"),
            ByteRange::Suffix(n) => format!("bytes=-{n}"),
        }
    }
}

/// The bytes of a ranged response plus where they sit in the whole file.
#[derive(Debug, Clone)]
pub struct RangeBytes {
    pub range: ContentRange,
    pub bytes: Bytes,
}

/// A cheaply clonable HTTP client with retries and a bound on parallel transfers, and the
/// credentials of the recipe's private indexes, if any.
#[derive(Debug, Clone)]
pub struct HttpClient {
    transport: Transport,
    permits: Arc<Semaphore>,
    credentials: Arc<IndexCredentials>,
}

impl HttpClient {
    pub fn new(config: HttpConfig) -> Result<Self, HttpError> {
        let client = crate::net::client_builder()
            .user_agent(config.user_agent)
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(HttpError::Client)?;
        Ok(HttpClient {
            transport: Transport::new(client, config.retry),
            permits: Arc::new(Semaphore::new(config.max_parallel.max(1))),
            credentials: Arc::default(),
        })
    }

    /// The same client (sharing its connections and transfer slots) that sends
    /// `credentials` to their indexes and names them when one answers 401 or 403.
    pub fn with_credentials(&self, credentials: IndexCredentials) -> Self {
        HttpClient {
            credentials: Arc::new(credentials),
            ..self.clone()
        }
    }

    /// A client with [`HttpConfig::default`].
    pub fn with_defaults() -> Result<Self, HttpError> {
        Self::new(HttpConfig::default())
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        self.transport.retry_policy()
    }

    /// Wait for a transfer slot. Hold the permit for as long as the body streams.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Send a GET with retries and return the response once its status is a success.
    /// 404 is [`HttpError::NotFound`] at once; what the transport's rule calls transient
    /// is retried first ([`crate::net`]). The body is not read.
    pub async fn get(&self, url: &Url, headers: HeaderMap) -> Result<Response, HttpError> {
        // Credentials go only to their index's origin; reqwest drops them on a redirect
        // that leaves it (`redirect::remove_sensitive_headers`).
        let auth = self.credentials.for_url(url);
        let sent = self
            .transport
            .send(&Method::GET, url, || {
                let mut request = self
                    .transport
                    .client()
                    .get(url.clone())
                    .headers(headers.clone());
                if let Some(credentials) = auth.and_then(IndexAuth::credentials) {
                    request =
                        request.basic_auth(&credentials.username, Some(&credentials.password));
                }
                std::future::ready(Ok::<_, HttpError>(request))
            })
            .await?;
        let status = sent.response.status();
        if status.is_success() {
            return Ok(sent.response);
        }
        if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
            return Err(HttpError::NotFound { url: url.clone() });
        }
        if let Some(auth) =
            auth.filter(|_| status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
        {
            return Err(HttpError::Unauthorized {
                url: url.clone(),
                status,
                auth: Box::new(auth.clone()),
            });
        }
        Err(HttpError::Status {
            url: url.clone(),
            status,
            attempts: sent.attempts,
        })
    }

    /// GET a small document (index page, metadata, manifest) and hold it in memory.
    /// Body read failures are retried like request failures.
    pub async fn get_bytes(&self, url: &Url, accept: Option<&str>) -> Result<Bytes, HttpError> {
        let mut headers = HeaderMap::new();
        if let Some(accept) = accept {
            headers.insert(
                ACCEPT,
                HeaderValue::from_str(accept).expect("accept header is ASCII"),
            );
        }
        Ok(self
            .get_bytes_limited(url, headers, MAX_DOCUMENT_BYTES)
            .await?
            .1)
    }

    /// Like [`HttpClient::get_bytes`], also returning the response headers. At most
    /// [`MAX_DOCUMENT_BYTES`] are read.
    pub async fn get_bytes_with_headers(
        &self,
        url: &Url,
        headers: HeaderMap,
    ) -> Result<(HeaderMap, Bytes), HttpError> {
        self.get_bytes_limited(url, headers, MAX_DOCUMENT_BYTES)
            .await
    }

    /// GET a body into memory, refusing it ([`HttpError::TooLarge`]) as soon as it passes
    /// `limit` bytes, whatever `Content-Length` says: a hostile server cannot make cudastack
    /// allocate more than `limit`.
    pub async fn get_bytes_limited(
        &self,
        url: &Url,
        headers: HeaderMap,
        limit: u64,
    ) -> Result<(HeaderMap, Bytes), HttpError> {
        self.get_bytes_checked(url, headers, limit, |_| Ok(()))
            .await
    }

    /// [`Self::get_bytes_limited`], with `check` looking at each answer's status and
    /// headers before its body is read (a range request refuses a whole file by its answer,
    /// before its size).
    async fn get_bytes_checked(
        &self,
        url: &Url,
        headers: HeaderMap,
        limit: u64,
        check: impl Fn(&Response) -> Result<(), HttpError>,
    ) -> Result<(HeaderMap, Bytes), HttpError> {
        let too_large = || HttpError::TooLarge {
            url: url.clone(),
            limit,
        };
        // A document is read again whole when its body is cut: it may come compressed,
        // so a byte range of it would mean nothing.
        let mut attempts = self
            .retry_policy()
            .attempts(format_args!("GET `{}`", redacted(url)));
        loop {
            attempts.start();
            let mut response = self.get(url, headers.clone()).await?;
            check(&response)?;
            let response_headers = response.headers().clone();
            if response
                .content_length()
                .is_some_and(|length| length > limit)
            {
                return Err(too_large());
            }
            // Grow with what arrives, never with what a header claims.
            let mut body = Vec::new();
            let source = loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        if body.len() as u64 + chunk.len() as u64 > limit {
                            return Err(too_large());
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(None) => return Ok((response_headers, Bytes::from(body))),
                    Err(error) => break error.without_url(),
                }
            };
            if !(is_transient(Failure::of_error(&source, true))
                && attempts.retry(error_chain(&source), None).await)
            {
                return Err(HttpError::Transport {
                    url: url.clone(),
                    attempts: attempts.made(),
                    source,
                });
            }
        }
    }

    /// GET one byte range (small: a zip's central directory, one METADATA entry).
    /// Fails with [`HttpError::RangeUnsupported`] when the server answers with the whole
    /// file instead.
    pub async fn get_range(&self, url: &Url, range: ByteRange) -> Result<RangeBytes, HttpError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            RANGE,
            HeaderValue::from_str(&range.header()).expect("range header is ASCII"),
        );
        // Ask for the identity encoding: a compressed body would make the offsets meaningless.
        headers.insert(
            reqwest::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        // A range answer is exactly as long as the range asked for; never read more.
        let limit = match range {
            ByteRange::Inclusive { start, end } => end.saturating_sub(start).saturating_add(1),
            ByteRange::Suffix(n) => n,
            ByteRange::From(_) => MAX_DOCUMENT_BYTES,
        }
        .min(MAX_DOCUMENT_BYTES);
        // A server that ignores `Range` answers with the whole file: said by its answer,
        // before a body of any size is read.
        let whole_file = |response: &Response| match response.headers().get(CONTENT_RANGE) {
            Some(_) => Ok(()),
            None => Err(HttpError::RangeUnsupported {
                url: url.clone(),
                status: response.status(),
            }),
        };
        let (response_headers, bytes) = self
            .get_bytes_checked(url, headers, limit, whole_file)
            .await?;
        let value = response_headers
            .get(CONTENT_RANGE)
            .ok_or_else(|| HttpError::RangeUnsupported {
                url: url.clone(),
                status: StatusCode::OK,
            })?
            .to_str()
            .unwrap_or_default()
            .to_string();
        let range = ContentRange::parse(&value).ok_or_else(|| HttpError::BadContentRange {
            url: url.clone(),
            value: value.clone(),
        })?;
        // The answer must be the bytes it claims to be, inside the file it claims to have.
        if range.end < range.start
            || range.end - range.start + 1 != bytes.len() as u64
            || range.total.is_some_and(|total| range.end >= total)
        {
            return Err(HttpError::BadContentRange {
                url: url.clone(),
                value,
            });
        }
        Ok(RangeBytes { range, bytes })
    }
}

impl From<NetError> for HttpError {
    fn from(error: NetError) -> Self {
        HttpError::Transport {
            url: error.url().clone(),
            attempts: error.attempts(),
            source: error.into_source(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials() {
        let url = Url::parse("https://bob:s3cret@mirror.example/debian/pool/a.deb").unwrap();
        assert_eq!(
            redacted(&url).to_string(),
            "https://****:****@mirror.example/debian/pool/a.deb"
        );
        let token = Url::parse("https://tok3n@mirror.example/x").unwrap();
        assert_eq!(
            redacted(&token).to_string(),
            "https://****@mirror.example/x"
        );
        let plain = Url::parse("https://pypi.org/simple/").unwrap();
        assert_eq!(redacted(&plain).to_string(), "https://pypi.org/simple/");
        for error in [
            HttpError::NotFound { url: url.clone() },
            HttpError::Status {
                url: url.clone(),
                status: StatusCode::BAD_GATEWAY,
                attempts: 3,
            },
            HttpError::TooLarge {
                url: url.clone(),
                limit: 1,
            },
            HttpError::BadUrl {
                url: "https://bob:s3cret@mirror example/x".into(),
                source: url::ParseError::InvalidDomainCharacter,
            },
        ] {
            let text = error.to_string();
            assert!(!text.contains("s3cret") && !text.contains("bob"), "{text}");
            assert!(text.contains("mirror"), "{text}");
        }
    }
}
