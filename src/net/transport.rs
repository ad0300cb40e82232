//! [`Transport`]: a reqwest client, a retry policy and the origins that have answered it;
//! sends a request again while the rule says the failure may pass.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use reqwest::{Method, RequestBuilder, Response, Url};

use super::retry::{is_transient, redacted, retry_after, Failure, RetryPolicy};

/// A request that failed without an answer to use.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{method} `{}` failed{}", redacted(url), attempts_note(*attempts))]
    Failed {
        method: Method,
        url: Url,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    /// No connection to an origin that has never answered: not retried.
    #[error("Cannot connect to `{}`", redacted(url))]
    Unreachable {
        url: Url,
        #[source]
        source: reqwest::Error,
    },
}

/// ` (after N attempts)` when there was more than one, for error messages.
pub fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

impl NetError {
    pub fn url(&self) -> &Url {
        match self {
            NetError::Failed { url, .. } | NetError::Unreachable { url, .. } => url,
        }
    }

    pub fn attempts(&self) -> u32 {
        match self {
            NetError::Failed { attempts, .. } => *attempts,
            NetError::Unreachable { .. } => 1,
        }
    }

    pub fn into_source(self) -> reqwest::Error {
        match self {
            NetError::Failed { source, .. } | NetError::Unreachable { source, .. } => source,
        }
    }
}

/// An answer: its status may still be a failure (the caller decides what it means),
/// including a transient one when the attempts ran out.
#[derive(Debug)]
pub struct Sent {
    pub response: Response,
    /// Attempts made, the answered one included.
    pub attempts: u32,
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

/// A client that retries by the rule. Cheap to clone: clones share connections and the
/// set of origins that have answered.
#[derive(Debug, Clone)]
pub struct Transport {
    client: reqwest::Client,
    retry: RetryPolicy,
    /// `scheme://host:port` of every origin that has answered: a later failure to connect
    /// there is a restart, worth waiting for; before, it is a wrong address.
    answered: Arc<Mutex<HashSet<String>>>,
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

impl Transport {
    pub fn new(client: reqwest::Client, retry: RetryPolicy) -> Self {
        Transport {
            client,
            retry,
            answered: Arc::default(),
        }
    }

    /// The client to build requests with (for [`Transport::send`]'s factory).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Whether `url`'s origin has answered this transport.
    pub fn has_answered(&self, url: &Url) -> bool {
        self.answered.lock().unwrap().contains(&origin(url))
    }

    fn note_answer(&self, url: &Url) {
        self.answered.lock().unwrap().insert(origin(url));
    }

    /// Send the request `request` builds (once per attempt, so a body is made anew each
    /// time) with this transport's policy. Only for requests that may be sent twice.
    pub async fn send<E, F, Fut>(&self, method: &Method, url: &Url, request: F) -> Result<Sent, E>
    where
        E: From<NetError>,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<RequestBuilder, E>>,
    {
        self.send_with(&self.retry, method, url, request).await
    }

    /// [`Transport::send`] under `policy` ([`RetryPolicy::once`] for a request that must
    /// not be repeated).
    pub async fn send_with<E, F, Fut>(
        &self,
        policy: &RetryPolicy,
        method: &Method,
        url: &Url,
        mut request: F,
    ) -> Result<Sent, E>
    where
        E: From<NetError>,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<RequestBuilder, E>>,
    {
        let mut attempts = policy.attempts(format_args!("{method} `{}`", redacted(url)));
        loop {
            let attempt = attempts.start();
            match request().await?.send().await {
                Ok(response) => {
                    self.note_answer(url);
                    let status = response.status();
                    if is_transient(Failure::Status(status))
                        && attempts
                            .retry(format!("HTTP {status}"), retry_after(response.headers()))
                            .await
                    {
                        continue;
                    }
                    return Ok(Sent {
                        response,
                        attempts: attempt,
                    });
                }
                Err(source) => {
                    // Messages name the URL, masked; the error's own copy would not be.
                    let source = source.without_url();
                    let failure = Failure::of_error(&source, self.has_answered(url));
                    if failure
                        == (Failure::Connect {
                            answered_before: false,
                        })
                    {
                        return Err(NetError::Unreachable {
                            url: url.clone(),
                            source,
                        }
                        .into());
                    }
                    if is_transient(failure)
                        && attempts
                            .retry(super::retry::error_chain(&source), None)
                            .await
                    {
                        continue;
                    }
                    return Err(NetError::Failed {
                        method: method.clone(),
                        url: url.clone(),
                        attempts: attempt,
                        source,
                    }
                    .into());
                }
            }
        }
    }
}
