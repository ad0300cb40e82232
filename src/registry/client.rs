//! The distribution API client: one registry and its auth state (challenges, basic
//! credentials, bearer tokens per scope) layered on the retrying [`Transport`], and the
//! small generic calls (manifests, blobs) the other stages use.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::auth::{Challenge, Credentials, Secret};
use super::RegistryError;
use crate::cache::BlobStore;
use crate::digest::Digest;
use crate::net::{range_headers, Piece, ResumableBody, RetryPolicy, Sent, Transport};
use crate::reference::Reference;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// The OCI 1.1 empty descriptor's media type (`{}`), the config of artifact manifests.
/// A manifest or index is read up to this size (distribution's own limit on a PUT).
pub const MAX_MANIFEST: u64 = 4 << 20;
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub credentials: Credentials,
    /// Registries (host[:port]) to talk to over plain http. localhost always may.
    pub insecure_registries: Vec<String>,
    pub retry: RetryPolicy,
    pub connect_timeout: Duration,
    /// Longest silence while reading a response.
    pub read_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            credentials: Credentials::Anonymous,
            insecure_registries: Vec::new(),
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(120),
        }
    }
}

/// An OS/architecture pair (`linux/amd64`, `linux/arm64/v8`) to pick from an index.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

/// linux and this machine's architecture (amd64 on x86_64, arm64 on aarch64): the image
/// of a multi-platform index this machine can run.
impl Default for Platform {
    fn default() -> Self {
        crate::platform::Platform::host_or_amd64().into()
    }
}

/// The index entry of one of the platforms cudastack builds (`linux/amd64`, no variant).
impl From<crate::platform::Platform> for Platform {
    fn from(platform: crate::platform::Platform) -> Self {
        Platform {
            os: "linux".to_string(),
            architecture: platform.oci_architecture().to_string(),
            variant: None,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

impl FromStr for Platform {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.split('/').collect();
        match parts.as_slice() {
            [os, architecture] | [os, architecture, _]
                if !os.is_empty() && !architecture.is_empty() =>
            {
                Ok(Platform {
                    os: os.to_string(),
                    architecture: architecture.to_string(),
                    variant: parts.get(2).map(|v| v.to_string()),
                })
            }
            _ => Err(format!(
                "`{text}` is not a platform of the form os/architecture[/variant]"
            )),
        }
    }
}

/// A manifest (or index) as the registry holds it: raw bytes, media type and digest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
}

impl Manifest {
    pub fn is_index(&self) -> bool {
        self.media_type == OCI_INDEX || self.media_type == DOCKER_MANIFEST_LIST
    }
}

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

/// A client for one registry. Cheap to share (`Arc`); safe to use from parallel tasks.
#[derive(Debug)]
pub struct RegistryClient {
    transport: Transport,
    registry: String,
    base: Url,
    credentials: Credentials,
    auth: Mutex<AuthState>,
    /// Held while a token is fetched, so parallel uploads needing the same scope wait
    /// for one token instead of each asking the token service.
    token_fetch: tokio::sync::Mutex<()>,
}

/// `repository:NAME:ACTIONS` scopes for the token service.
pub(crate) fn scope(repository: &str, actions: &str) -> String {
    format!("repository:{repository}:{actions}")
}

impl RegistryClient {
    /// A client for the registry of `reference` (no request is made yet).
    pub fn new(reference: &Reference, options: ClientOptions) -> Result<Self, RegistryError> {
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

    pub fn registry(&self) -> &str {
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

    /// Does `repository` hold the blob? (HEAD; 404 is `false`.)
    pub async fn has_blob(&self, repository: &str, digest: &Digest) -> Result<bool, RegistryError> {
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let (response, attempts) = self
            .request(Method::HEAD, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        match response.status() {
            status if status.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(status_error(Method::HEAD, &url, response, attempts).await),
        }
    }

    /// Upload a small blob held in memory (a config, an artifact payload) if missing.
    pub async fn put_blob_bytes(
        &self,
        repository: &str,
        bytes: Bytes,
    ) -> Result<Digest, RegistryError> {
        Ok(self.put_blob_bytes_counted(repository, bytes).await?.0)
    }

    /// [`Self::put_blob_bytes`], also saying how many bytes went up (0 when the registry
    /// had the blob).
    pub async fn put_blob_bytes_counted(
        &self,
        repository: &str,
        bytes: Bytes,
    ) -> Result<(Digest, u64), RegistryError> {
        let digest = Digest::of_bytes(&bytes);
        if self.has_blob(repository, &digest).await? {
            return Ok((digest, 0));
        }
        let size = bytes.len() as u64;
        let scopes = [scope(repository, "pull,push")];
        let url = self.url(&format!("{repository}/blobs/uploads/"));
        let (response, attempts) = self
            .request(Method::POST, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        if response.status() != StatusCode::ACCEPTED {
            return Err(status_error(Method::POST, &url, response, attempts).await);
        }
        let mut put_url = self.location(&response)?;
        put_url
            .query_pairs_mut()
            .append_pair("digest", &digest.to_string());
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let (response, attempts) = self
            .request(Method::PUT, &put_url, &scopes, headers, &Body::Bytes(bytes))
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(status_error(Method::PUT, &put_url, response, attempts).await);
        }
        Ok((digest, size))
    }

    /// PUT a manifest (or index) as raw bytes under `reference`'s tag (or its digest).
    /// Returns the digest of the bytes, checked against what the registry says it stored.
    pub async fn put_manifest(
        &self,
        reference: &Reference,
        media_type: &str,
        bytes: Bytes,
    ) -> Result<Digest, RegistryError> {
        let digest = Digest::of_bytes(&bytes);
        super::push::check_pinned(reference, &digest)?;
        let target = match (reference.tag(), reference.digest()) {
            (Some(tag), _) => tag.to_string(),
            (None, Some(_)) | (None, None) => digest.to_string(),
        };
        let url = self.url(&format!("{}/manifests/{target}", reference.repository()));
        let scopes = [scope(reference.repository(), "pull,push")];
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(media_type).map_err(|_| RegistryError::UnsupportedMediaType {
                reference: reference.to_string(),
                media_type: media_type.to_string(),
            })?,
        );
        let (response, attempts) = self
            .request(Method::PUT, &url, &scopes, headers, &Body::Bytes(bytes))
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::PUT, &url, response, attempts).await);
        }
        if let Some(stored) = header_digest(&response) {
            if stored != digest {
                return Err(RegistryError::DigestMismatch {
                    what: format!("the manifest `{reference}` as stored by the registry"),
                    expected: digest,
                    found: stored,
                });
            }
        }
        Ok(digest)
    }

    /// GET a manifest or index (any of the OCI and Docker v2 types), digest-checked.
    pub async fn get_manifest(&self, reference: &Reference) -> Result<Manifest, RegistryError> {
        self.get_manifest_limited(reference, MAX_MANIFEST).await
    }

    /// [`Self::get_manifest`], reading at most `max` bytes (at most [`MAX_MANIFEST`]): a
    /// referrer's manifest is read up to the size its index entry gives.
    pub async fn get_manifest_limited(
        &self,
        reference: &Reference,
        max: u64,
    ) -> Result<Manifest, RegistryError> {
        let max = max.min(MAX_MANIFEST);
        let url = self.url(&format!(
            "{}/manifests/{}",
            reference.repository(),
            reference.manifest_target()
        ));
        let scopes = [scope(reference.repository(), "pull")];
        let mut headers = HeaderMap::new();
        headers.insert(
            ACCEPT,
            HeaderValue::from_str(&MANIFEST_TYPES.join(", ")).expect("media types are ASCII"),
        );
        let (response, attempts) = self
            .request(Method::GET, &url, &scopes, headers, &Body::Empty)
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Err(RegistryError::ManifestNotFound {
                reference: reference.to_string(),
            });
        }
        if !response.status().is_success() {
            return Err(status_error(Method::GET, &url, response, attempts).await);
        }
        let header_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let stored = header_digest(&response);
        let bytes = read_limited(response, &url, max, || RegistryError::ManifestTooLarge {
            reference: reference.to_string(),
            max,
        })
        .await?;
        let digest = Digest::of_bytes(&bytes);
        for expected in [reference.digest().copied(), stored].into_iter().flatten() {
            if expected != digest {
                return Err(RegistryError::DigestMismatch {
                    what: format!("the manifest of `{reference}`"),
                    expected,
                    found: digest,
                });
            }
        }
        let media_type = manifest_media_type(reference, &bytes, header_type)?;
        Ok(Manifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// The image manifest of `reference` for `platform`: an index is resolved to its entry.
    pub async fn get_image_manifest(
        &self,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<Manifest, RegistryError> {
        let manifest = self.get_manifest(reference).await?;
        if !manifest.is_index() {
            return Ok(manifest);
        }
        let index: oci_spec::image::ImageIndex =
            serde_json::from_slice(&manifest.bytes).map_err(|e| RegistryError::Document {
                path: reference.to_string(),
                what: "an image index",
                detail: e.to_string(),
            })?;
        let mut available = Vec::new();
        for entry in index.manifests() {
            let Some(p) = entry.platform() else { continue };
            let os = p.os().to_string();
            let architecture = p.architecture().to_string();
            let variant = p.variant().clone();
            available.push(format!(
                "{os}/{architecture}{}",
                variant
                    .as_deref()
                    .map(|v| format!("/{v}"))
                    .unwrap_or_default()
            ));
            if os == platform.os
                && architecture == platform.architecture
                && (platform.variant.is_none() || platform.variant == variant)
            {
                let digest: Digest = entry.digest().to_string().parse().map_err(
                    |e: crate::digest::DigestError| RegistryError::Document {
                        path: reference.to_string(),
                        what: "an image index",
                        detail: e.to_string(),
                    },
                )?;
                let child = self.get_manifest(&reference.with_digest(digest)).await?;
                if child.is_index() {
                    return Err(RegistryError::UnsupportedMediaType {
                        reference: reference.with_digest(digest).to_string(),
                        media_type: format!("{} nested in an index", child.media_type),
                    });
                }
                return Ok(child);
            }
        }
        Err(RegistryError::NoPlatform {
            reference: reference.to_string(),
            platform: platform.to_string(),
            available: if available.is_empty() {
                "no platform entries".to_string()
            } else {
                available.join(", ")
            },
        })
    }

    /// GET a blob into memory, refusing more than `max` bytes; digest-checked. For small
    /// blobs only (configs): layers go through [`RegistryClient::download_blob`].
    pub async fn get_blob_bytes(
        &self,
        repository: &str,
        digest: &Digest,
        max: u64,
    ) -> Result<Bytes, RegistryError> {
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let (response, attempts) = self
            .request(Method::GET, &url, &scopes, HeaderMap::new(), &Body::Empty)
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::GET, &url, response, attempts).await);
        }
        let bytes = read_limited(response, &url, max, || RegistryError::TooLarge {
            repository: repository.to_string(),
            digest: *digest,
            max,
        })
        .await?;
        let found = Digest::of_bytes(&bytes);
        if found != *digest {
            return Err(RegistryError::DigestMismatch {
                what: format!("blob `{url}`"),
                expected: *digest,
                found,
            });
        }
        Ok(bytes)
    }

    /// Stream a blob of `size` bytes (as its manifest gives) into `store`: never written
    /// past `size` ([`RegistryError::TooLarge`]), continued from where it stopped when cut
    /// ([`ResumableBody`]), committed only when its digest is `digest` and it is exactly
    /// `size` long. `what` names it in errors.
    pub(crate) async fn download_blob(
        &self,
        repository: &str,
        digest: &Digest,
        size: u64,
        store: &BlobStore,
        what: &str,
    ) -> Result<(), RegistryError> {
        let max = size;
        let too_large = || RegistryError::TooLarge {
            repository: repository.to_string(),
            digest: *digest,
            max,
        };
        let url = self.url(&format!("{repository}/blobs/{digest}"));
        let scopes = [scope(repository, "pull")];
        let tmp = store.tmp_dir();
        let io = |source| RegistryError::Io {
            path: tmp.clone(),
            source,
        };
        let mut pending = store.begin()?;
        let mut found = 0u64;
        let mut body = ResumableBody::new(&url, 0, self.retry_policy(), |from| {
            self.open_blob(&url, &scopes, from, max, too_large)
        });
        while let Some(piece) = body.next().await? {
            match piece {
                // Dropping the old temp file deletes it.
                Piece::Restart => (pending, found) = (store.begin()?, 0),
                Piece::Bytes(chunk) => {
                    found += chunk.len() as u64;
                    if found > max {
                        return Err(too_large());
                    }
                    pending.write_all(&chunk).map_err(io)?;
                }
            }
        }
        pending.flush().map_err(io)?;
        pending.commit(Some(digest), what)?;
        if found != size {
            return Err(RegistryError::Document {
                path: what.to_string(),
                what: "the size its manifest gives",
                detail: format!("{found} bytes, the manifest says {size}"),
            });
        }
        Ok(())
    }

    /// The GET of a blob from byte `from`, refused when it says it is larger than `max`.
    async fn open_blob(
        &self,
        url: &Url,
        scopes: &[String],
        from: u64,
        max: u64,
        too_large: impl FnOnce() -> RegistryError,
    ) -> Result<Option<Response>, RegistryError> {
        let (response, attempts) = self
            .request(Method::GET, url, scopes, range_headers(from), &Body::Empty)
            .await?;
        if !response.status().is_success() {
            return Err(status_error(Method::GET, url, response, attempts).await);
        }
        if response
            .content_length()
            .is_some_and(|len| from.saturating_add(len) > max)
        {
            return Err(too_large());
        }
        Ok(Some(response))
    }
}

/// The `Docker-Content-Digest` header, when present and sha256.
pub(crate) fn header_digest(response: &Response) -> Option<Digest> {
    response
        .headers()
        .get("docker-content-digest")?
        .to_str()
        .ok()?
        .parse()
        .ok()
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

/// The manifest types cudastack reads, in the order of its `Accept` header.
const MANIFEST_TYPES: [&str; 4] = [
    OCI_MANIFEST,
    OCI_INDEX,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
];

/// A manifest's media type: its own `mediaType`, else the `Content-Type` the registry sent,
/// else OCI's; one cudastack cannot read is an error.
fn manifest_media_type(
    reference: &Reference,
    bytes: &[u8],
    header_type: Option<String>,
) -> Result<String, RegistryError> {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
    }
    // A manifest is a JSON object: anything else (a body cut short, an HTML page) is named
    // here, with the reference, rather than by a later parser without context.
    let body_type = serde_json::from_slice::<Typed>(bytes)
        .map_err(|e| RegistryError::Document {
            path: reference.to_string(),
            what: "a manifest",
            detail: e.to_string(),
        })?
        .media_type;
    let media_type = body_type
        .or(header_type)
        .unwrap_or_else(|| OCI_MANIFEST.to_string());
    if !MANIFEST_TYPES.contains(&media_type.as_str()) {
        return Err(RegistryError::UnsupportedMediaType {
            reference: reference.to_string(),
            media_type,
        });
    }
    Ok(media_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body cut short is an error naming the reference, not a bare parser message.
    #[test]
    fn a_manifest_that_is_not_json_names_its_reference() {
        let reference: Reference = "127.0.0.1:5000/team/img:1".parse().unwrap();
        let error = manifest_media_type(&reference, br#"{"schemaVe"#, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("team/img:1") && error.contains("manifest"),
            "{error}"
        );
        assert_eq!(
            manifest_media_type(&reference, b"{}", None).unwrap(),
            OCI_MANIFEST
        );
    }

    #[test]
    fn platforms_parse() {
        assert_eq!(
            Platform::from_str("linux/amd64").unwrap(),
            Platform::default()
        );
        let arm: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(arm.variant.as_deref(), Some("v8"));
        assert_eq!(arm.to_string(), "linux/arm64/v8");
        assert!(Platform::from_str("linux").is_err());
    }

    #[test]
    fn http_only_for_localhost_and_listed_hosts() {
        let client = |text: &str, insecure: &[&str]| {
            RegistryClient::new(
                &text.parse().unwrap(),
                ClientOptions {
                    insecure_registries: insecure.iter().map(|s| s.to_string()).collect(),
                    ..ClientOptions::default()
                },
            )
            .unwrap()
        };
        assert_eq!(
            client("127.0.0.1:5000/a", &[]).url("").as_str(),
            "http://127.0.0.1:5000/v2/"
        );
        assert_eq!(
            client("localhost/a", &[]).url("a/blobs/x").as_str(),
            "http://localhost/v2/a/blobs/x"
        );
        assert_eq!(client("reg.lan:5000/a", &[]).url("").scheme(), "https");
        // A host name that starts with `127.` is not this machine.
        assert_eq!(
            client("127.evil.example:5000/a", &[]).url("").as_str(),
            "https://127.evil.example:5000/v2/"
        );
        assert_eq!(
            client("[::1]:5000/a", &[]).url("").as_str(),
            "http://[::1]:5000/v2/"
        );
        assert_eq!(
            client("reg.lan:5000/a", &["reg.lan:5000"]).url("").scheme(),
            "http"
        );
        assert_eq!(
            client("ubuntu", &[]).url("").as_str(),
            "https://registry-1.docker.io/v2/"
        );
    }
}
