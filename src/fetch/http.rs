//! The one HTTP client every fetch goes through.
//!
//! It owns the policy that every source shares: a user agent, timeouts, retries with
//! exponential backoff on transient failures (5xx, 429, timeouts, connection resets), and a
//! bounded semaphore so no more than N bodies stream at once. Index pages and metadata are
//! small and are read whole ([`HttpClient::get_bytes`] says so in its name); artifacts are
//! streamed by the downloader ([`crate::fetch::download`]) and never held in memory.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_RANGE, RANGE, RETRY_AFTER};
use reqwest::{Response, StatusCode, Url};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::fetch::credentials::{IndexAuth, IndexCredentials};

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

/// A URL as it may be shown: a user name and password in it (a mirror URL given on the
/// command line may carry them) are masked as `****`.
pub struct Redacted<'a>(&'a Url);

pub fn redacted(url: &Url) -> Redacted<'_> {
    Redacted(url)
}

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        if url.username().is_empty() && url.password().is_none() {
            return f.write_str(url.as_str());
        }
        let mut shown = url.clone();
        if !url.username().is_empty() {
            let _ = shown.set_username("****");
        }
        if url.password().is_some() {
            let _ = shown.set_password(Some("****"));
        }
        f.write_str(shown.as_str())
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

fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
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

/// How hard to try before giving up on a request.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total attempts, including the first one.
    pub max_attempts: u32,
    /// Wait before the first retry; doubled for each further retry.
    pub initial_backoff: Duration,
    /// Upper bound on a single wait (also caps `Retry-After`).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based): `initial * 2^(retry-1)`, capped.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
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

/// A parsed `Content-Range: bytes start-end/total` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    pub start: u64,
    pub end: u64,
    /// `None` when the server answered `*` for the total.
    pub total: Option<u64>,
}

impl ContentRange {
    pub fn parse(value: &str) -> Option<ContentRange> {
        let rest = value.trim().strip_prefix("bytes ")?;
        let (span, total) = rest.split_once('/')?;
        let (start, end) = span.split_once('-')?;
        let total = match total.trim() {
            "*" => None,
            t => Some(t.parse().ok()?),
        };
        Some(ContentRange {
            start: start.trim().parse().ok()?,
            end: end.trim().parse().ok()?,
            total,
        })
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
    client: reqwest::Client,
    retry: RetryPolicy,
    permits: Arc<Semaphore>,
    credentials: Arc<IndexCredentials>,
}

/// A reqwest client builder that trusts the system's CA certificates, or, on a system
/// without any (a bare container: `debian:bookworm-slim` has no ca-certificates, and the
/// static release binary is meant to run there), the Mozilla roots compiled into cudastack
/// (webpki-root-certs). Without this, building the client fails with "No CA certificates
/// were loaded from the system" before any request, even to a plain-http index.
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` still choose the system store, as in rustls-native-certs.
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    if rustls_native_certs::load_native_certs().certs.is_empty() {
        let bundled = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der.as_ref()).ok());
        builder.tls_certs_merge(bundled)
    } else {
        builder
    }
}

impl HttpClient {
    pub fn new(config: HttpConfig) -> Result<Self, HttpError> {
        let client = client_builder()
            .user_agent(config.user_agent)
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(HttpError::Client)?;
        Ok(HttpClient {
            client,
            retry: config.retry,
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
        &self.retry
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
    /// 404 is [`HttpError::NotFound`] at once; 5xx, 429, timeouts and connection errors are
    /// retried with backoff. The body is not read.
    pub async fn get(&self, url: &Url, headers: HeaderMap) -> Result<Response, HttpError> {
        // Credentials go only to their index's origin; reqwest drops them on a redirect
        // that leaves it (`redirect::remove_sensitive_headers`).
        let auth = self.credentials.for_url(url);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self.client.get(url.clone()).headers(headers.clone());
            if let Some(credentials) = auth.and_then(IndexAuth::credentials) {
                request = request.basic_auth(&credentials.username, Some(&credentials.password));
            }
            let result = request.send().await;
            let (retry_after, why) = match result {
                Ok(response) => {
                    let status = response.status();
                    if status.is_success() {
                        return Ok(response);
                    }
                    if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
                        return Err(HttpError::NotFound { url: url.clone() });
                    }
                    if let Some(auth) = auth.filter(|_| {
                        status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
                    }) {
                        return Err(HttpError::Unauthorized {
                            url: url.clone(),
                            status,
                            auth: Box::new(auth.clone()),
                        });
                    }
                    if !is_transient_status(status) || attempt >= self.retry.max_attempts {
                        return Err(HttpError::Status {
                            url: url.clone(),
                            status,
                            attempts: attempt,
                        });
                    }
                    (retry_after(response.headers()), format!("HTTP {status}"))
                }
                Err(source) => {
                    // Our messages name the URL, masked; the error's own copy would not be.
                    let source = source.without_url();
                    if !is_transient_error(&source) || attempt >= self.retry.max_attempts {
                        return Err(HttpError::Transport {
                            url: url.clone(),
                            attempts: attempt,
                            source,
                        });
                    }
                    (None, error_chain(&source))
                }
            };
            let wait = retry_after
                .unwrap_or_else(|| self.retry.backoff(attempt))
                .min(self.retry.max_backoff);
            // One line per retry on stderr (warn is shown unless `--quiet`): a slow or
            // failing server is visible, never a silent wait.
            tracing::warn!(
                "retrying `{}` in {wait:?} (attempt {} of {}): {why}",
                redacted(url),
                attempt + 1,
                self.retry.max_attempts
            );
            tokio::time::sleep(wait).await;
        }
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
        let too_large = || HttpError::TooLarge {
            url: url.clone(),
            limit,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut response = self.get(url, headers.clone()).await?;
            let response_headers = response.headers().clone();
            if response
                .content_length()
                .is_some_and(|length| length > limit)
            {
                return Err(too_large());
            }
            // Grow with what arrives, never with what a header claims.
            let mut body = Vec::new();
            let result = loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        if body.len() as u64 + chunk.len() as u64 > limit {
                            return Err(too_large());
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(None) => break Ok(()),
                    Err(error) => break Err(error),
                }
            };
            match result {
                Ok(()) => return Ok((response_headers, Bytes::from(body))),
                Err(source) => {
                    let source = source.without_url();
                    if attempt >= self.retry.max_attempts {
                        return Err(HttpError::Transport {
                            url: url.clone(),
                            attempts: attempt,
                            source,
                        });
                    }
                    let wait = self.retry.backoff(attempt);
                    tracing::warn!(
                        "retrying `{}` in {wait:?} (attempt {} of {}): {}",
                        redacted(url),
                        attempt + 1,
                        self.retry.max_attempts,
                        error_chain(&source)
                    );
                    tokio::time::sleep(wait).await;
                }
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
        let (response_headers, bytes) = self.get_bytes_limited(url, headers, limit).await?;
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

/// 5xx and 429 are worth another try; 4xx other than 408/429 are not.
pub fn is_transient_status(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

/// Timeouts, refused or reset connections and truncated bodies are worth another try.
/// A body cut short surfaces as a decode error wrapping an I/O error, so the whole source
/// chain is inspected.
pub fn is_transient_error(error: &reqwest::Error) -> bool {
    // Nobody listening, or no such host: waiting will not change that (a refused
    // connection used to be retried silently for 45 s).
    !is_refused_or_unresolved(error) && may_pass_on_retry(error)
}

/// Whether the failure is of a kind that can go away: any connection failure (a server
/// that answered before may be restarting), a timeout, a body cut short. Callers that know
/// the server answered before use this; [`is_transient_error`] also refuses to wait for a
/// server that is simply not there.
pub fn may_pass_on_retry(error: &reqwest::Error) -> bool {
    if error.is_timeout() || error.is_connect() || error.is_request() || error.is_body() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io_error) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io_error.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | TimedOut
            ) {
                return true;
            }
        }
        if let Some(inner) = cause.downcast_ref::<reqwest::Error>() {
            if inner.is_body() || inner.is_timeout() {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

/// A connection refused, or a host name that does not resolve.
pub fn is_refused_or_unresolved(error: &reqwest::Error) -> bool {
    if !error.is_connect() {
        return false;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io_error) = cause.downcast_ref::<std::io::Error>() {
            if io_error.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        // hyper-util's resolver error reads `dns error`; getaddrinfo's reads `failed to
        // lookup address information`. Neither has a type or kind of its own to test.
        let text = cause.to_string();
        if text.starts_with("dns error") || text.contains("failed to lookup address") {
            return true;
        }
        source = cause.source();
    }
    false
}

/// An error and its causes on one line, for retry messages.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
        };
        assert_eq!(policy.backoff(1), Duration::from_millis(100));
        assert_eq!(policy.backoff(2), Duration::from_millis(200));
        assert_eq!(policy.backoff(3), Duration::from_millis(400));
        assert_eq!(policy.backoff(4), Duration::from_millis(700));
        assert_eq!(policy.backoff(40), Duration::from_millis(700));
    }

    #[test]
    fn content_range_parses() {
        assert_eq!(
            ContentRange::parse("bytes 10-19/100"),
            Some(ContentRange {
                start: 10,
                end: 19,
                total: Some(100)
            })
        );
        assert_eq!(ContentRange::parse("bytes 0-0/*").unwrap().total, None);
        assert_eq!(ContentRange::parse("items 0-1/2"), None);
        assert_eq!(ContentRange::parse("bytes 5/10"), None);
    }

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

    #[test]
    fn transient_statuses() {
        assert!(is_transient_status(StatusCode::BAD_GATEWAY));
        assert!(is_transient_status(StatusCode::TOO_MANY_REQUESTS));
        assert!(!is_transient_status(StatusCode::FORBIDDEN));
        assert!(!is_transient_status(StatusCode::NOT_FOUND));
    }
}
