//! The Docker Engine output: load an image into a local daemon, tag it, and run
//! containers in it (the verify stage runs its probe through [`Engine::run`]).
//!
//! Position in the pipeline: after `oci` (which writes the OCI layout), beside the
//! daemonless `registry` output. Everything goes through the Engine API with bollard,
//! never the docker CLI. [`Engine::connect`] honours `DOCKER_HOST` (else the default
//! socket) and negotiates the API version, so Docker 20.10 (API 1.41) and newer work.
//!
//! Loading ([`load`]) takes an image as stored ([`crate::oci::StoredImage`], read from a
//! layout by [`crate::oci::layout::Layout`], never by parsing the layout here) and streams a
//! docker-archive of its stored bytes, produced on the fly, into the request body; the
//! daemon's image ID is the config digest, so an image the daemon already has is only
//! (re)tagged. Running ([`run`]) creates, starts, waits, collects the
//! output, copies a result file out and always removes the container, on timeout,
//! on every error path and on SIGINT, SIGTERM or SIGHUP; containers left by a run that
//! died (SIGKILL) are removed by [`Engine::reap_orphans`].
//!
//! What this module must not do: build or change images (that is `oci`), read an OCI
//! layout's files itself, or read the whole archive into memory. Depends on `oci`,
//! `reference` (tags), `layer` and `digest`; the verify stage and the binary use it.

mod image;
pub mod load;
pub mod run;

use std::time::Duration;

use bollard::Docker;

pub use image::DaemonImage;
pub use load::{LoadReport, StepsSent};
pub use run::{GpuRequest, RunOutcome, RunSpec};

use crate::digest::Digest;
use crate::oci::OciError;
use crate::reference::{escape, split_name_and_tag, Reference, ReferenceProblem};

/// The timeout for ordinary requests (inspect, tag, create, remove). Long requests (load,
/// wait) get their own; bollard's default of 120 s for everything kills large loads
/// (CRATES.md pitfall 3).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting and negotiating the API version may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Errors from talking to the Docker Engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "no Docker daemon is reachable at `{host}`\n  hint: start dockerd (or set DOCKER_HOST to \
         a running one); the OCI layout output (images/NAME) works without a daemon"
    )]
    Unreachable {
        host: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("Docker Engine request failed: {what}")]
    Api {
        what: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("`docker load` of `{layout}` failed: {message}")]
    LoadFailed { layout: String, message: String },
    #[error(
        "the daemon loaded `{layout}` but has no image with the expected ID\n  Expected: {expected}\n  \
         Daemon said: {said}"
    )]
    LoadMismatch {
        layout: String,
        expected: Digest,
        said: String,
    },
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error("image `{image}` is not in the Docker daemon\n  hint: load it first: cudastack load images/NAME")]
    NoSuchImage { image: String },
    #[error(
        "the Docker daemon's answer for image `{image}` is not one cudastack can read: {what}"
    )]
    Unreadable { image: String, what: String },
    #[error(
        "the Docker daemon cannot give this container a GPU: {detail}\n  hint: install the NVIDIA \
         driver and the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker), \
         restart dockerd, and check `docker info` lists the `nvidia` runtime"
    )]
    GpuUnavailable { detail: String },
    #[error("container for `{image}` failed: {what}")]
    Container {
        image: String,
        what: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("copying `{path}` out of the container failed: {problem}")]
    CopyOut { path: String, problem: String },
    #[error("interrupted by {signal}; what it had started in the daemon was removed")]
    Interrupted { signal: &'static str },
    #[error(
        "`{}` is not a valid image tag: {problem}\n  hint: {}",
        escape(.tag),
        problem.hint()
    )]
    InvalidTag {
        tag: String,
        problem: ReferenceProblem,
    },
}

/// A connection to a Docker daemon, with the API version negotiated.
#[derive(Debug, Clone)]
pub struct Engine {
    docker: Docker,
    host: String,
    /// The most compressed bytes one load request sends (see `load::LOAD_STEP_BYTES`).
    load_step_bytes: u64,
}

/// What the daemon says about itself (`docker info` + `docker version`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineInfo {
    /// The address connected to (`unix:///var/run/docker.sock`, `tcp://...`).
    pub host: String,
    /// The daemon's version, e.g. `20.10.24+dfsg1`.
    pub server_version: String,
    /// The newest API version the daemon speaks, e.g. `1.41`.
    pub server_api_version: String,
    /// The API version this client uses after negotiation.
    pub api_version: String,
    pub operating_system: Option<String>,
    pub architecture: Option<String>,
    /// Registered runtimes, sorted (`runc`, `nvidia`, ...).
    pub runtimes: Vec<String>,
    pub default_runtime: Option<String>,
    /// Whether the `nvidia` runtime is registered (NVIDIA Container Toolkit).
    pub nvidia_runtime: bool,
    /// CDI spec directories, when the daemon reports them (Docker >= 25).
    pub cdi_spec_dirs: Vec<String>,
    /// The daemon stores images in containerd (Docker >= 24 with the containerd image
    /// store) rather than in its classic layer store.
    pub containerd_image_store: bool,
}

impl Engine {
    /// Connect via `DOCKER_HOST`, or the default socket, and negotiate the API version.
    pub async fn connect() -> Result<Self, EngineError> {
        let host = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string());
        Self::connect_to(&host).await
    }

    /// Connect to `host` (`unix://PATH`, `tcp://HOST:PORT`, `http://...`).
    pub async fn connect_to(host: &str) -> Result<Self, EngineError> {
        let unreachable = |source| EngineError::Unreachable {
            host: host.to_string(),
            source,
        };
        let docker = Docker::connect_with_host(host)
            .map_err(unreachable)?
            .with_timeout(CONNECT_TIMEOUT);
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        Ok(Self {
            docker: docker.with_timeout(REQUEST_TIMEOUT),
            host: host.to_string(),
            load_step_bytes: load::LOAD_STEP_BYTES,
        })
    }

    /// This engine, loading images in steps of at most `bytes` of layer blobs each (a
    /// test loads a small image in steps this way).
    pub fn with_load_step_bytes(mut self, bytes: u64) -> Self {
        self.load_step_bytes = bytes;
        self
    }

    /// The address this engine talks to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The bollard client (API version negotiated), for callers that need more.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// A client for requests that may take `timeout` (the timeout is per client).
    fn with_timeout(&self, timeout: Duration) -> Docker {
        self.docker.clone().with_timeout(timeout)
    }

    /// Server and API versions, runtimes (is `nvidia` there?), CDI spec directories.
    pub async fn info(&self) -> Result<EngineInfo, EngineError> {
        let api = |what: &str| {
            let what = what.to_string();
            move |source| EngineError::Api { what, source }
        };
        let version = self.docker.version().await.map_err(api("GET /version"))?;
        let info = self.docker.info().await.map_err(api("GET /info"))?;
        let mut runtimes: Vec<String> = info
            .runtimes
            .as_ref()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        runtimes.sort();
        let client = self.docker.client_version();
        Ok(EngineInfo {
            host: self.host.clone(),
            server_version: version
                .version
                .or(info.server_version)
                .unwrap_or_else(|| "unknown".to_string()),
            server_api_version: version.api_version.unwrap_or_else(|| "unknown".to_string()),
            api_version: format!("{}.{}", client.major_version, client.minor_version),
            operating_system: info.operating_system,
            architecture: info.architecture,
            nvidia_runtime: runtimes.iter().any(|r| r == "nvidia"),
            runtimes,
            default_runtime: info.default_runtime,
            cdi_spec_dirs: info.cdi_spec_dirs.unwrap_or_default(),
            containerd_image_store: info.driver_status.unwrap_or_default().iter().any(|pair| {
                pair.iter()
                    .any(|v| v.starts_with("io.containerd.snapshotter"))
            }),
        })
    }
}

/// The HTTP status of a daemon error, if it is one.
pub(crate) fn status_of(error: &bollard::errors::Error) -> Option<u16> {
    match error {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The daemon's message of an error response (or the error's text).
pub(crate) fn message_of(error: &bollard::errors::Error) -> String {
    match error {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        bollard::errors::Error::DockerStreamError { error } => error.clone(),
        other => other.to_string(),
    }
}

/// Split `name[:tag]` into repository and tag as written (no tag means `latest`), once
/// [`Reference::parse_docker_name`] accepts it: the crate's one reference grammar, which
/// refuses whatever the daemon's parser (distribution/reference `ParseNormalizedNamed`,
/// Docker 20.10) refuses.
///
/// Why this is strict: Docker's load creates the image *before* it parses the archive's
/// RepoTags, so a tag it rejects (`torch/Cu121:x`) failed the load after the image was in
/// the daemon, left there untagged. Every tag is checked here, before a byte
/// is sent.
pub fn split_tag(reference: &str) -> Result<(&str, &str), EngineError> {
    Reference::parse_docker_name(reference).map_err(|error| EngineError::InvalidTag {
        tag: reference.to_string(),
        problem: error.problem,
    })?;
    let (repository, tag) = split_name_and_tag(reference);
    Ok((repository, tag.unwrap_or("latest")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_at_the_last_colon_after_the_last_slash() {
        assert_eq!(split_tag("busybox").unwrap(), ("busybox", "latest"));
        assert_eq!(split_tag("busybox:1.36").unwrap(), ("busybox", "1.36"));
        assert_eq!(
            split_tag("localhost:5000/cudastack/torch:2.4.1-cu121").unwrap(),
            ("localhost:5000/cudastack/torch", "2.4.1-cu121")
        );
        assert_eq!(
            split_tag("localhost:5000/torch").unwrap(),
            ("localhost:5000/torch", "latest")
        );
        assert_eq!(
            split_tag("Registry.Example/a__b.c-d--e/f:v1.0-rc_1").unwrap(),
            ("Registry.Example/a__b.c-d--e/f", "v1.0-rc_1")
        );
        // An uppercase first part is a repository to Docker 20.10, which refuses it
        // (measured: `POST /images/ID/tag?repo=Mirror/torch` answers 500 "repository name
        // must be lowercase"; Docker 23 would read `Mirror` as a host).
        assert!(split_tag("Mirror/torch:x").is_err());
        assert_eq!(split_tag(&"g".repeat(64)).unwrap().1, "latest");
        for bad in ["", ":x", "x:", "a@sha256:00"] {
            assert!(split_tag(bad).is_err(), "{bad}");
        }
    }

    /// The daemon created the image, then refused these tags, leaving the image
    /// untagged. Each is refused here, with the part at fault named.
    #[test]
    fn tags_the_daemon_refuses_are_refused_before_loading() {
        let hex = "0123456789abcdef".repeat(4);
        let long_tag = format!("x:{}", "t".repeat(129));
        let long_name = format!("{}:t", "n".repeat(256));
        for (bad, names) in [
            ("cudastack/Torch:1", "`Torch`"),
            ("localhost:5000/a/B:1", "`B`"),
            ("torch:-x", "`-x`"),
            ("torch:.x", "`.x`"),
            ("torch:a+b", "`a+b`"),
            ("a//b:1", "empty part"),
            ("a/:1", "empty part"),
            ("-a:1", "`-a`"),
            ("a-:1", "`a-`"),
            ("a..b:1", "`a..b`"),
            ("a___b:1", "`a___b`"),
            ("a b:1", "`a b`"),
            ("héllo:1", "`héllo`"),
            ("host.example:50x0/a:1", "port"),
            ("bad_host.example/a:1", "registry host"),
            ("-host.example/a:1", "registry host"),
            (hex.as_str(), "image ID"),
            (long_tag.as_str(), "128"),
            (long_name.as_str(), "255"),
            ("[::1]:5000/a:1", "IPv6"),
            ("a:1\n", "`a:1\\n`"),
        ] {
            let error = split_tag(bad).unwrap_err().to_string();
            assert!(error.contains(names), "{bad}: {error}");
            assert!(error.contains("hint:"), "{error}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_host_says_so_and_names_the_layout_output() {
        let dir = tempfile::tempdir().unwrap();
        let host = format!("unix://{}", dir.path().join("no.sock").display());
        let error = Engine::connect_to(&host).await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, EngineError::Unreachable { .. }), "{text}");
        assert!(text.contains(&host), "{text}");
        assert!(text.contains("OCI layout"), "{text}");
        // A TCP port nobody listens on fails fast too.
        let error = Engine::connect_to("tcp://127.0.0.1:1").await.unwrap_err();
        assert!(matches!(error, EngineError::Unreachable { .. }), "{error}");
    }
}
