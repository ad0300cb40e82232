//! OCI distribution client: push and pull images with no daemon.
//!
//! Position in the pipeline: an output (beside `oci::layout` and the Docker engine) and,
//! for `pull`, an input that fills the blob cache and writes an OCI layout. It speaks the
//! distribution HTTP API directly over reqwest:
//!
//! ```text
//! Reference ──RegistryClient (auth: anonymous | basic | bearer token per scope, over
//!              net::Transport's retries; http only for localhost / --insecure-registry)
//!   push: HEAD blob ─ present? ─ mount from another repo ─ upload (monolithic PUT streamed
//!         from the file; chunked PATCH for big blobs; resume from the session's Range)
//!         ─ manifest PUT (raw bytes: the digest is the one computed locally)
//!   pull: manifest (index -> platform) ─ config ─ layers, every digest verified ─ BlobStore
//!         ─ OCI layout
//! ```
//! Push takes an image as stored ([`crate::oci::StoredImage`]: from a layout through
//! [`crate::oci::layout::Layout`], or a value serialised once), and pull writes its layout
//! through [`crate::oci::layout::LayoutWriter`]: this module never parses or writes a
//! layout's `index.json` itself. The module must not build images or decide tags; it moves
//! bytes whose digests are already known, and checks them. It never holds a layer in
//! memory. Depends on `oci`, `reference`, `cache`, `canonical`, `digest` and `net` (the
//! retrying transport its auth is layered on).

// Errors carry the URL they are about (as in crate::fetch); they are not on a hot path.
#![allow(clippy::result_large_err)]

pub mod auth;
mod authorized;
mod client;
pub mod pull;
pub mod push;
pub mod referrers;

use std::path::PathBuf;

use reqwest::{Method, StatusCode, Url};

use crate::digest::Digest;
use crate::net::{attempts_note, is_transient, Failure, NetError, ReadError};

/// The reference grammar lives at the vocabulary level ([`crate::reference`]; recipes name
/// tags with it too); these paths are kept for callers that name it here.
pub use crate::reference;
pub use crate::reference::{split_name_and_tag, Reference, ReferenceError, ReferenceProblem};
pub use auth::{Credentials, Secret};
pub use client::{
    ClientOptions, Manifest, Platform, RegistryClient, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST,
    OCI_EMPTY, OCI_INDEX, OCI_MANIFEST,
};
pub use pull::{pull, PullReport};
pub use push::{
    push_blob_file, push_image, push_layout, BlobOutcome, BlobReport, PushHistory, PushOptions,
    PushReport,
};

/// Errors from talking to registries. Every variant names the registry, URL, blob or file
/// involved; none ever contains a password or token.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("Failed to build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("{method} `{url}` failed{}", attempts_note(*attempts))]
    Transport {
        method: Method,
        url: Url,
        attempts: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error("Cannot connect to the registry `{registry}` (`{url}`): it has not answered once, so this is not retried\n  hint: {}", unreachable_hint(registry, url))]
    Unreachable {
        registry: String,
        url: Url,
        #[source]
        source: reqwest::Error,
    },
    #[error("{method} `{url}`: HTTP {status}{}{}", detail_note(detail), attempts_note(*attempts))]
    Status {
        method: Method,
        url: Url,
        status: StatusCode,
        detail: String,
        attempts: u32,
    },
    #[error("Authentication to `{registry}` failed{}: {detail}\n  hint: check the username and password (or token), e.g. with `docker login {registry}`", user_note(username.as_deref()))]
    Unauthorized {
        registry: String,
        username: Option<String>,
        detail: String,
    },
    #[error("`{registry}` requires credentials and none were found\n  hint: pass --username and --password-stdin, set CUDASTACK_REGISTRY_USERNAME/PASSWORD, or run `docker login {registry}`")]
    AuthRequired { registry: String },
    #[error("The token service `{realm}` did not issue a token: {detail}")]
    Token { realm: String, detail: String },
    #[error("The registry `{registry}` answered {what} that cannot be used: {detail}")]
    Protocol {
        registry: String,
        what: &'static str,
        detail: String,
    },
    #[error("Failed to upload blob {digest} ({size} bytes) to `{repository}`")]
    BlobUpload {
        repository: String,
        digest: Digest,
        size: u64,
        #[source]
        source: Box<RegistryError>,
    },
    #[error("{what} does not match its digest\n  Expected: {expected}\n  Found:    {found}")]
    DigestMismatch {
        what: String,
        expected: Digest,
        found: Digest,
    },
    #[error("`{reference}` pins a digest that is not the image's: nothing was pushed\n  Expected: {expected}\n  Found:    {found}\n  hint: push to the reference without `@{expected}`, or pin the digest the image has")]
    PinnedDigestMismatch {
        reference: String,
        expected: Digest,
        found: Digest,
    },
    #[error("Blob {digest} in `{repository}` is larger than the {max} bytes allowed for it")]
    TooLarge {
        repository: String,
        digest: Digest,
        max: u64,
    },
    #[error("The manifest of `{reference}` is larger than the {max} bytes allowed for a manifest")]
    ManifestTooLarge { reference: String, max: u64 },
    #[error("`{reference}` does not exist in the registry (manifest unknown)")]
    ManifestNotFound { reference: String },
    #[error("`{reference}` has no image for {platform} (it has: {available})")]
    NoPlatform {
        reference: String,
        platform: String,
        available: String,
    },
    #[error("`{reference}` is a {media_type}, which cudastack cannot use here")]
    UnsupportedMediaType {
        reference: String,
        media_type: String,
    },
    #[error("I/O error on `{path}`")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The Docker config `{path}` is unusable: {detail}")]
    DockerConfig { path: PathBuf, detail: String },
    #[error("The credential helper `{helper}` failed: {detail}")]
    CredentialHelper { helper: String, detail: String },
    #[error("`{path}` is not {what}: {detail}")]
    Document {
        path: String,
        what: &'static str,
        detail: String,
    },
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
}

fn unreachable_hint(registry: &str, url: &Url) -> String {
    if url.scheme() == "https" {
        format!("check the host and port, and that a registry runs there; one that speaks plain http needs --insecure-registry {registry} (only localhost gets http without it)")
    } else {
        "check the host and port, and that the registry is started".to_string()
    }
}

fn detail_note(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

fn user_note(username: Option<&str>) -> String {
    username
        .map(|user| format!(" for user `{user}`"))
        .unwrap_or_default()
}

impl RegistryError {
    /// Worth another try, by the transport's rule ([`crate::net`])?
    pub fn is_transient(&self) -> bool {
        match self {
            // A registry that never answered fails earlier, as `Unreachable`; one that
            // answered before and now refuses is likely restarting: retry it.
            RegistryError::Transport { source, .. } => {
                is_transient(Failure::of_error(source, true))
            }
            RegistryError::Status { status, .. } => is_transient(Failure::Status(*status)),
            _ => false,
        }
    }
}

/// The registry as its API host, for errors of the transport below the client (which
/// names them as the user wrote it).
fn host_of(url: &Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => url.to_string(),
    }
}

impl From<NetError> for RegistryError {
    fn from(error: NetError) -> Self {
        match error {
            NetError::Failed {
                method,
                url,
                attempts,
                source,
            } => RegistryError::Transport {
                method,
                url,
                attempts,
                source,
            },
            NetError::Unreachable { url, source } => RegistryError::Unreachable {
                registry: host_of(&url),
                url,
                source,
            },
        }
    }
}

impl From<ReadError> for RegistryError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Cut {
                url,
                attempts,
                source,
                ..
            } => RegistryError::Transport {
                method: Method::GET,
                url,
                attempts,
                source,
            },
            ReadError::WrongRange {
                url,
                asked,
                status,
                answered,
            } => RegistryError::Protocol {
                registry: host_of(&url),
                what: "a resumed blob read",
                detail: format!("asked for bytes {asked}-, got {status} `{answered}`"),
            },
        }
    }
}
