//! The auth layer on the retrying [`Transport`]: one registry's scheme (learnt from its
//! `GET /v2/` challenge, and again from a 401), basic credentials, bearer tokens per scope
//! (fetched once for parallel requests, renewed before they expire), credentials only to
//! the registry's own origin and never in clear to another host. Every request of
//! [`super::RegistryClient`] goes through it; the client above knows manifests and blobs,
//! not how a request is authorised. Also the reading of a registry's answers that both
//! layers share: a body read within a limit, and a failure status as an error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::auth::{Challenge, Credentials, Secret};
use super::client::ClientOptions;
use super::RegistryError;
use crate::net::{RetryPolicy, Sent, Transport};
use crate::reference::Reference;

#[derive(Debug, Clone)]
enum Scheme {
    /// Not asked yet.
    Unknown,
    Anonymous,
    Basic,
    Bearer {
        realm: Url,
        service: Option<String>,
    },
}

#[derive(Debug)]
struct AuthState {
    scheme: Scheme,
    /// Bearer tokens by scope set (space-joined), with their expiry.
    tokens: HashMap<String, (Secret, Instant)>,
}

/// A request body that can be produced again for a retry.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Empty,
    Bytes(Bytes),
    /// `len` bytes of `path` from `offset`, streamed; each byte read adds to `counter`.
    File {
        path: PathBuf,
        offset: u64,
        len: u64,
        counter: Option<Arc<AtomicU64>>,
    },
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Bytes(bytes) => bytes.len() as u64,
            Body::File { len, .. } => *len,
        }
    }

    async fn open(&self) -> Result<reqwest::Body, RegistryError> {
        Ok(match self {
            Body::Empty => reqwest::Body::from(Bytes::new()),
            Body::Bytes(bytes) => reqwest::Body::from(bytes.clone()),
            Body::File {
                path,
                offset,
                len,
                counter,
            } => {
                let io = |source| RegistryError::Io {
                    path: path.clone(),
                    source,
                };
                let mut file = tokio::fs::File::open(path).await.map_err(io)?;
                file.seek(std::io::SeekFrom::Start(*offset))
                    .await
                    .map_err(io)?;
                let counter = counter.clone();
                let stream =
                    tokio_util::io::ReaderStream::with_capacity(file.take(*len), 256 * 1024).map(
                        move |chunk| {
                            if let (Ok(bytes), Some(counter)) = (&chunk, &counter) {
                                counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                            }
                            chunk
                        },
                    );
                reqwest::Body::wrap_stream(stream)
            }
        })
    }
}

/// One registry reached through the transport, with its auth state (see the module docs).
#[derive(Debug)]
pub(crate) struct AuthorizedTransport {
    transport: Transport,
    registry: String,
    base: Url,
    credentials: Credentials,
    auth: Mutex<AuthState>,
    /// Held while a token is fetched, so parallel uploads needing the same scope wait
    /// for one token instead of each asking the token service.
    token_fetch: tokio::sync::Mutex<()>,
}

impl AuthorizedTransport {
    /// The auth layer for the registry of `reference` (no request is made yet).
    pub(crate) fn new(
        reference: &Reference,
        options: ClientOptions,
    ) -> Result<Self, RegistryError> {
        let insecure = reference.is_localhost()
            || options
                .insecure_registries
                .iter()
                .any(|host| host == reference.registry());
        let scheme = if insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{}/", reference.api_host())).map_err(|e| {
            RegistryError::Protocol {
                registry: reference.registry().to_string(),
                what: "a host name",
                detail: e.to_string(),
            }
        })?;
        let http = crate::net::client_builder()
            .user_agent(format!("cudastack/{}", env!("CARGO_PKG_VERSION")))
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            .build()
            .map_err(RegistryError::Client)?;
        Ok(Self {
            transport: Transport::new(http, options.retry),
            registry: reference.registry().to_string(),
            base,
            credentials: options.credentials,
            auth: Mutex::new(AuthState {
                scheme: Scheme::Unknown,
                tokens: HashMap::new(),
            }),
            token_fetch: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn registry(&self) -> &str {
        &self.registry
    }

    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        self.transport.retry_policy()
    }

    /// `BASE/v2/PATH`.
    pub(crate) fn url(&self, path: &str) -> Url {
        self.base
            .join(&format!("v2/{path}"))
            .expect("registry paths are valid URL paths")
    }

    /// Resolve a `Location` header (absolute or relative) against the registry.
    pub(crate) fn location(&self, response: &Response) -> Result<Url, RegistryError> {
        let value = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| RegistryError::Protocol {
                registry: self.registry.clone(),
                what: "an upload response",
                detail: format!(
                    "no Location header ({} {})",
                    response.status(),
                    response.url()
                ),
            })?;
        response
            .url()
            .join(value)
            .map_err(|e| RegistryError::Protocol {
                registry: self.registry.clone(),
                what: "an upload Location",
                detail: format!("`{value}`: {e}"),
            })
    }
    /// Learn how the registry wants to be authenticated (`GET /v2/`), once.
    async fn discover(&self) -> Result<(), RegistryError> {
        if !matches!(self.auth.lock().unwrap().scheme, Scheme::Unknown) {
            return Ok(());
        }
        let url = self.url("");
        let Sent { response, .. } = self
            .transport
            .send(&Method::GET, &url, || {
                std::future::ready(Ok(self.transport.client().get(url.clone())))
            })
            .await
            .map_err(|error| self.named(error))?;
        let scheme = match response.status() {
            status if status.is_success() => Scheme::Anonymous,
            StatusCode::UNAUTHORIZED => self.scheme_from(&response)?,
            status => {
                return Err(RegistryError::Status {
                    method: Method::GET,
                    url,
                    status,
                    detail: "the registry API root should answer 200 or 401".to_string(),
                    attempts: 1,
                })
            }
        };
        self.auth.lock().unwrap().scheme = scheme;
        Ok(())
    }

    fn scheme_from(&self, response: &Response) -> Result<Scheme, RegistryError> {
        let challenge = response
            .headers()
            .get_all(reqwest::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(Challenge::parse);
        match challenge {
            Some(Challenge::Basic) => Ok(Scheme::Basic),
            Some(Challenge::Bearer { realm, service, .. }) => {
                let realm = response
                    .url()
                    .join(&realm)
                    .map_err(|e| RegistryError::Protocol {
                        registry: self.registry.clone(),
                        what: "a token realm",
                        detail: format!("`{realm}`: {e}"),
                    })?;
                Ok(Scheme::Bearer { realm, service })
            }
            None => Err(RegistryError::Protocol {
                registry: self.registry.clone(),
                what: "401 Unauthorized",
                detail: "without a Basic or Bearer WWW-Authenticate challenge".to_string(),
            }),
        }
    }

    /// Whether credentials may go to `url`: over https anywhere; over plain http only to
    /// this machine or to the registry's own host (which the user chose to reach over
    /// http). A registry's challenge names the token service, so a hostile registry could
    /// otherwise collect the password in clear from any host it names.
    fn may_carry_credentials(&self, url: &Url) -> bool {
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(name)) => name == "localhost",
            None => false,
        };
        url.scheme() == "https" || loopback || url.host_str() == self.base.host_str()
    }

    /// The Authorization header for a request needing `scopes`.
    async fn authorization(&self, scopes: &[String]) -> Result<Option<String>, RegistryError> {
        let scheme = self.auth.lock().unwrap().scheme.clone();
        match scheme {
            Scheme::Unknown | Scheme::Anonymous => Ok(None),
            Scheme::Basic => match self.credentials.basic_header() {
                Some(header) => Ok(Some(header)),
                None => Err(RegistryError::AuthRequired {
                    registry: self.registry.clone(),
                }),
            },
            Scheme::Bearer { realm, service } => {
                let key = scopes.join(" ");
                let cached = || {
                    let auth = self.auth.lock().unwrap();
                    auth.tokens
                        .get(&key)
                        .filter(|(_, expiry)| Instant::now() < *expiry)
                        .map(|(token, _)| format!("Bearer {}", token.expose()))
                };
                if let Some(header) = cached() {
                    return Ok(Some(header));
                }
                let _fetching = self.token_fetch.lock().await;
                if let Some(header) = cached() {
                    return Ok(Some(header));
                }
                let (token, lifetime) =
                    self.fetch_token(&realm, service.as_deref(), scopes).await?;
                let header = format!("Bearer {}", token.expose());
                // Renew a little early, so a token never expires mid-request.
                let expiry = Instant::now() + lifetime.saturating_sub(Duration::from_secs(10));
                self.auth
                    .lock()
                    .unwrap()
                    .tokens
                    .insert(key, (token, expiry));
                Ok(Some(header))
            }
        }
    }

    /// The distribution token flow (docs: "Token Authentication Specification").
    async fn fetch_token(
        &self,
        realm: &Url,
        service: Option<&str>,
        scopes: &[String],
    ) -> Result<(Secret, Duration), RegistryError> {
        let failed = |detail: String| RegistryError::Token {
            realm: realm.to_string(),
            detail,
        };
        if self.credentials != Credentials::Anonymous && !self.may_carry_credentials(realm) {
            return Err(failed(
                "it is plain http on another machine than the registry, and cudastack sends credentials over plain http only to this machine or to the registry's own host\n  hint: the registry's token service must be https (or the registry must name one on its own host)"
                    .to_string(),
            ));
        }
        let method = if matches!(self.credentials, Credentials::IdentityToken(_)) {
            Method::POST
        } else {
            Method::GET
        };
        let response = self
            .transport
            .send(&method, realm, || {
                std::future::ready(Ok::<_, RegistryError>(
                    self.token_request(realm, service, scopes),
                ))
            })
            .await
            .map_err(|error| match error {
                RegistryError::Transport { source, .. }
                | RegistryError::Unreachable { source, .. } => {
                    failed(format!("the request failed: {source}"))
                }
                other => other,
            })?
            .response;
        let status = response.status();
        if (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
            && self.credentials == Credentials::Anonymous
        {
            return Err(RegistryError::AuthRequired {
                registry: self.registry.clone(),
            });
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(RegistryError::Unauthorized {
                registry: self.registry.clone(),
                username: self.credentials.username().map(str::to_string),
                detail: format!("the token service `{realm}` answered {status}"),
            });
        }
        if !status.is_success() {
            return Err(failed(format!("HTTP {status}")));
        }
        read_token(response).await.map_err(failed)
    }

    /// The request for a token: an OAuth2 refresh-token grant (as Docker does for an
    /// `identitytoken`), else a GET with the service and scopes in the query, with basic
    /// credentials when there are some.
    fn token_request(
        &self,
        realm: &Url,
        service: Option<&str>,
        scopes: &[String],
    ) -> reqwest::RequestBuilder {
        let mut url = realm.clone();
        if let Credentials::IdentityToken(refresh) = &self.credentials {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "refresh_token")
                .append_pair("refresh_token", refresh.expose())
                .append_pair("client_id", "cudastack");
            if let Some(service) = service {
                form.append_pair("service", service);
            }
            for scope in scopes {
                form.append_pair("scope", scope);
            }
            return self
                .transport
                .client()
                .post(url)
                .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(form.finish());
        }
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            for scope in scopes {
                query.append_pair("scope", scope);
            }
        }
        let mut request = self.transport.client().get(url);
        if let Some(header) = self.credentials.basic_header() {
            request = request.header(AUTHORIZATION, header);
        }
        request
    }

    /// Send once with auth (for the steps of an upload session, which must not be sent
    /// twice: push resumes them on its own terms).
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &Url,
        scopes: &[String],
        headers: HeaderMap,
        body: &Body,
    ) -> Result<Response, RegistryError> {
        let once = RetryPolicy::once();
        let sent = self.exchange(&once, method, url, scopes, headers, body);
        Ok(sent.await?.response)
    }

    /// Send with auth, retried by the transport's rule (idempotent requests only; each
    /// retry said on stderr). The response may still have a failure status: the caller
    /// decides what it means. Returns it with the number of attempts made.
    pub(crate) async fn request(
        &self,
        method: Method,
        url: &Url,
        scopes: &[String],
        headers: HeaderMap,
        body: &Body,
    ) -> Result<(Response, u32), RegistryError> {
        let sent = self.exchange(self.retry_policy(), method, url, scopes, headers, body);
        let Sent { response, attempts } = sent.await?;
        Ok((response, attempts))
    }

    /// The auth layer: send with the Authorization the registry's scheme asks for, through
    /// the transport under `policy`; on 401 re-learn the challenge (a token for the scope
    /// the registry names) and send once more.
    async fn exchange(
        &self,
        policy: &RetryPolicy,
        method: Method,
        url: &Url,
        scopes: &[String],
        headers: HeaderMap,
        body: &Body,
    ) -> Result<Sent, RegistryError> {
        // The scheme first, with its own retries: learnt per attempt, a registry that
        // does not answer was tried max_attempts² times.
        self.discover().await?;
        // Credentials go only to the registry's own origin: an upload `Location` on another
        // host, or over http from an https registry, is sent without them (Docker's client
        // too sends them only to the host that asked), and its 401 teaches nothing.
        let own_origin = url.origin() == self.base.origin();
        let mut scopes = scopes.to_vec();
        for round in 0..2 {
            let authorization = match own_origin {
                true => self.authorization(&scopes).await?,
                false => None,
            };
            let sent = self
                .transport
                .send_with(policy, &method, url, || {
                    self.build(&method, url, &headers, authorization.as_deref(), body)
                })
                .await
                .map_err(|error| self.named(error))?;
            if sent.response.status() != StatusCode::UNAUTHORIZED || !own_origin {
                return Ok(sent);
            }
            let response = sent.response;
            let previous = self.auth.lock().unwrap().scheme.clone();
            let scheme = self.scheme_from(&response)?;
            let challenge = response
                .headers()
                .get_all(reqwest::header::WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(Challenge::parse);
            // A second 401, or Basic credentials refused: the credentials are wrong.
            if round == 1 || matches!((&scheme, &previous), (Scheme::Basic, Scheme::Basic)) {
                return Err(match self.credentials {
                    Credentials::Anonymous => RegistryError::AuthRequired {
                        registry: self.registry.clone(),
                    },
                    _ => RegistryError::Unauthorized {
                        registry: self.registry.clone(),
                        username: self.credentials.username().map(str::to_string),
                        detail: format!(
                            "{method} `{url}` answered 401 Unauthorized{}",
                            registry_detail(response).await
                        ),
                    },
                });
            }
            // The registry names the scope it wants (e.g. for a mount source): ask for it.
            if let Some(Challenge::Bearer {
                scope: Some(wanted),
                ..
            }) = challenge
            {
                for part in wanted.split(' ') {
                    if !scopes.iter().any(|s| s == part) {
                        scopes.push(part.to_string());
                    }
                }
            }
            let mut auth = self.auth.lock().unwrap();
            auth.tokens.remove(&scopes.join(" "));
            auth.scheme = scheme;
        }
        unreachable!("the loop returns in its second round")
    }

    /// One attempt's request: its headers, the Authorization, and its body made anew.
    async fn build(
        &self,
        method: &Method,
        url: &Url,
        headers: &HeaderMap,
        authorization: Option<&str>,
        body: &Body,
    ) -> Result<RequestBuilder, RegistryError> {
        let mut request = self
            .transport
            .client()
            .request(method.clone(), url.clone())
            .headers(headers.clone());
        if let Some(value) = authorization {
            let mut value = HeaderValue::from_str(value).map_err(|_| RegistryError::Protocol {
                registry: self.registry.clone(),
                what: "a token",
                detail: "it is not a valid header value".to_string(),
            })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        // Every request that may carry a body says how long it is (some registries
        // refuse a bodiless POST without `Content-Length: 0`).
        if ![Method::GET, Method::HEAD, Method::DELETE].contains(method) {
            request = request
                .header(reqwest::header::CONTENT_LENGTH, body.len())
                .body(body.open().await?);
        }
        Ok(request)
    }

    /// A transport error naming this registry as the user wrote it (`docker.io`, not
    /// the API host it is reached at).
    fn named(&self, error: RegistryError) -> RegistryError {
        match error {
            RegistryError::Unreachable { url, source, .. } => RegistryError::Unreachable {
                registry: self.registry.clone(),
                url,
                source,
            },
            other => other,
        }
    }
}

/// A registry's error document is read up to this size; the rest is not waited for.
const MAX_ERROR_DOCUMENT: u64 = 64 << 10;
/// A token service's answer is read up to this size (real tokens are a few KiB).
const MAX_TOKEN_ANSWER: u64 = 1 << 20;
/// The longest a token is kept, whatever its service says.
const MAX_TOKEN_LIFETIME_SECS: u64 = 24 * 60 * 60;

/// The distribution error document's first `code: message`, for error messages.
async fn registry_detail(response: Response) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorEntry>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorEntry {
        code: Option<String>,
        message: Option<String>,
    }
    // A registry's error document is small; one that never ends is cut, not held.
    let url = response.url().clone();
    let Ok(bytes) = read_limited(response, &url, MAX_ERROR_DOCUMENT, || {
        RegistryError::Protocol {
            registry: url.host_str().unwrap_or_default().to_string(),
            what: "an error document",
            detail: format!("it is larger than {MAX_ERROR_DOCUMENT} bytes"),
        }
    })
    .await
    else {
        return String::new();
    };
    match serde_json::from_slice::<Errors>(&bytes) {
        Ok(errors) => errors
            .errors
            .first()
            .map(|e| {
                // The registry's words: one line, escaped, cut.
                let said = format!(
                    "{} {}",
                    e.code.as_deref().unwrap_or_default(),
                    e.message.as_deref().unwrap_or_default()
                );
                format!(": {}", crate::printable::short(said.trim()))
                    .trim_end()
                    .to_string()
            })
            .unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// A failure status as an error, with the registry's own explanation when it gives one.
pub(crate) async fn status_error(
    method: Method,
    url: &Url,
    response: Response,
    attempts: u32,
) -> RegistryError {
    let status = response.status();
    let detail = registry_detail(response)
        .await
        .trim_start_matches(": ")
        .to_string();
    RegistryError::Status {
        method,
        url: url.clone(),
        status,
        detail,
        attempts,
    }
}

/// The token (and its lifetime) a token service answered, or what is wrong with the answer.
async fn read_token(response: reqwest::Response) -> Result<(Secret, Duration), String> {
    #[derive(serde::Deserialize)]
    struct TokenAnswer {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<u64>,
    }
    let url = response.url().clone();
    let bytes = read_limited(response, &url, MAX_TOKEN_ANSWER, || {
        RegistryError::Protocol {
            registry: url.host_str().unwrap_or_default().to_string(),
            what: "a token answer",
            detail: String::new(),
        }
    })
    .await
    .map_err(|_| format!("the answer is larger than {MAX_TOKEN_ANSWER} bytes, or was cut"))?;
    let answer: TokenAnswer = serde_json::from_slice(&bytes)
        .map_err(|_| "the answer is not the JSON {token, expires_in}".to_string())?;
    let token = answer
        .token
        .or(answer.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| "the answer has no token".to_string())?;
    // The spec's default lifetime is 60 s. A lifetime past a day is taken as a day: a
    // token service's number must not overflow the clock (it panicked at u64::MAX).
    let lifetime = Duration::from_secs(
        answer
            .expires_in
            .unwrap_or(60)
            .clamp(60, MAX_TOKEN_LIFETIME_SECS),
    );
    Ok((Secret::new(token), lifetime))
}

/// Read a body of at most `max` bytes.
pub(crate) async fn read_limited(
    response: Response,
    url: &Url,
    max: u64,
    too_large: impl FnOnce() -> RegistryError,
) -> Result<Bytes, RegistryError> {
    if response.content_length().is_some_and(|len| len > max) {
        return Err(too_large());
    }
    // Sized once from the declared length (at most `max`): growing by doubling would hold
    // up to twice a large body.
    let mut body = Vec::with_capacity(response.content_length().unwrap_or(0) as usize);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| RegistryError::Transport {
            method: Method::GET,
            url: url.clone(),
            attempts: 1,
            source,
        })?;
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}
