//! Image references: `[registry[:port]/]repository[:tag][@sha256:...]`, parsed once.
//!
//! The grammar and the Docker Hub normalisation follow distribution's `reference` package:
//! the first path component is a registry only when it contains a `.` or a `:`, or is
//! `localhost`; otherwise the registry is `docker.io`, and a one-component repository on
//! Docker Hub lives under `library/` (`ubuntu` is `docker.io/library/ubuntu:latest`).

use std::fmt;
use std::str::FromStr;

use crate::digest::{Digest, DigestError};

/// The registry Docker Hub references name, and the host its API actually answers on.
pub const DOCKER_HUB: &str = "docker.io";
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// Errors from parsing a reference; each names the whole reference and the bad part.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReferenceError {
    #[error("an image reference cannot be empty")]
    Empty,
    #[error("`{reference}`: the repository `{repository}` is not valid: {reason}")]
    Repository {
        reference: String,
        repository: String,
        reason: &'static str,
    },
    #[error("`{reference}`: the tag `{tag}` is not valid (1-128 of [A-Za-z0-9_.-], not starting with `.` or `-`)")]
    Tag { reference: String, tag: String },
    #[error("`{reference}`: the registry `{registry}` is not a valid host[:port]")]
    Registry { reference: String, registry: String },
    #[error("`{reference}`: bad digest")]
    Digest {
        reference: String,
        #[source]
        source: DigestError,
    },
}

/// A parsed, normalised image reference. Without a tag or digest it means `:latest`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl Reference {
    /// A reference from parts already known to be valid (e.g. a repository of a parsed
    /// reference with another tag); the parts are checked all the same.
    pub fn new(
        registry: &str,
        repository: &str,
        tag: Option<&str>,
        digest: Option<Digest>,
    ) -> Result<Self, ReferenceError> {
        let mut text = format!("{registry}/{repository}");
        if let Some(tag) = tag {
            text.push(':');
            text.push_str(tag);
        }
        if let Some(digest) = digest {
            text.push('@');
            text.push_str(&digest.to_string());
        }
        text.parse()
    }

    /// The registry as written (`docker.io`, `ghcr.io`, `127.0.0.1:5000`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The host[:port] the distribution API is served on (Docker Hub's differs).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What goes after `/manifests/` in a URL: the digest when there is one (it pins the
    /// content), else the tag, else `latest`.
    pub fn manifest_target(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// The same repository at another digest (the tag is dropped).
    pub fn with_digest(&self, digest: Digest) -> Self {
        Self {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest),
        }
    }

    /// The same repository at another tag (the digest is dropped).
    pub fn with_tag(&self, tag: &str) -> Result<Self, ReferenceError> {
        Self::new(&self.registry, &self.repository, Some(tag), None)
    }

    /// Whether the registry is this machine (plain http is allowed for it).
    pub fn is_localhost(&self) -> bool {
        is_localhost(&self.registry)
    }
}

/// `localhost`, `127.x.x.x` and `[::1]`, with or without a port.
pub fn is_localhost(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        registry.split(':').next().unwrap_or_default()
    };
    host == "localhost" || host == "::1" || host.starts_with("127.")
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

fn valid_component(component: &str) -> bool {
    // [a-z0-9]+ ((\.|_|__|-+)[a-z0-9]+)*
    let bytes = component.as_bytes();
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphanumeric()
        || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
    {
        return false;
    }
    let mut separator = String::new();
    for &b in bytes {
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            if !(separator.is_empty()
                || separator == "."
                || separator == "_"
                || separator == "__"
                || separator.bytes().all(|s| s == b'-'))
            {
                return false;
            }
            separator.clear();
        } else if b == b'.' || b == b'_' || b == b'-' {
            separator.push(b as char);
        } else {
            return false;
        }
    }
    true
}

fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn valid_registry(registry: &str) -> bool {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        match rest.split_once(']') {
            Some((host, tail)) => (host, tail.strip_prefix(':')),
            None => return false,
        }
    } else {
        match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok());
    host_ok && port_ok
}

impl FromStr for Reference {
    type Err = ReferenceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let reference = text.to_string();
        if text.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (
                rest,
                Some(
                    digest
                        .parse::<Digest>()
                        .map_err(|source| ReferenceError::Digest {
                            reference: reference.clone(),
                            source,
                        })?,
                ),
            ),
            None => (text, None),
        };
        // A tag is after the last `:` that comes after the last `/` (a registry port is not).
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
                (&rest[..colon], Some(&rest[colon + 1..]))
            }
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            if !valid_tag(tag) {
                return Err(ReferenceError::Tag {
                    reference,
                    tag: tag.to_string(),
                });
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, remainder))
                if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
            {
                (first.to_string(), remainder.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        if !valid_registry(&registry) {
            return Err(ReferenceError::Registry {
                reference,
                registry,
            });
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let bad_repository = |reason| ReferenceError::Repository {
            reference: reference.clone(),
            repository: repository.clone(),
            reason,
        };
        if repository.is_empty() {
            return Err(bad_repository("it is empty"));
        }
        if repository.len() > 255 {
            return Err(bad_repository("it is longer than 255 characters"));
        }
        if repository.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad_repository("repository names must be lowercase"));
        }
        if !repository.split('/').all(valid_component) {
            return Err(bad_repository(
                "each `/`-separated part must be [a-z0-9] separated by `.`, `_`, `__` or `-`",
            ));
        }
        Ok(Reference {
            registry,
            repository,
            tag: tag.map(str::to_string),
            digest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Reference {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn docker_hub_is_normalised() {
        let r = parse("ubuntu");
        assert_eq!(r.to_string(), "docker.io/library/ubuntu");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.manifest_target(), "latest");
        assert_eq!(
            parse("pytorch/pytorch:2.4.1").to_string(),
            "docker.io/pytorch/pytorch:2.4.1"
        );
        assert_eq!(
            parse("index.docker.io/library/debian:bookworm").to_string(),
            "docker.io/library/debian:bookworm"
        );
    }

    #[test]
    fn registries_ports_tags_and_digests() {
        let digest = Digest::of_bytes(b"x");
        let r = parse(&format!("127.0.0.1:5000/cuda/torch:2.4.1-cu121@{digest}"));
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "cuda/torch");
        assert_eq!(r.tag(), Some("2.4.1-cu121"));
        assert_eq!(r.digest(), Some(&digest));
        assert_eq!(r.manifest_target(), digest.to_string());
        assert!(r.is_localhost());
        let r = parse("localhost/app");
        assert_eq!(r.registry(), "localhost");
        assert!(r.is_localhost());
        let r = parse("ghcr.io/org/team/img");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("ghcr.io", "org/team/img", None)
        );
        assert!(!r.is_localhost());
        assert_eq!(parse("[::1]:5000/a:b").registry(), "[::1]:5000");
        assert_eq!(
            r.with_tag("v1").unwrap().to_string(),
            "ghcr.io/org/team/img:v1"
        );
    }

    #[test]
    fn precise_errors() {
        assert_eq!("".parse::<Reference>(), Err(ReferenceError::Empty));
        assert!(matches!(
            "ghcr.io/Org/img".parse::<Reference>(),
            Err(ReferenceError::Repository { reason, .. }) if reason.contains("lowercase")
        ));
        assert!(matches!(
            "img:-bad".parse::<Reference>(),
            Err(ReferenceError::Tag { tag, .. }) if tag == "-bad"
        ));
        assert!(matches!(
            "img@sha256:123".parse::<Reference>(),
            Err(ReferenceError::Digest { .. })
        ));
        assert!(matches!(
            "host:99999/img".parse::<Reference>(),
            Err(ReferenceError::Registry { .. })
        ));
        assert!("a//b".parse::<Reference>().is_err());
        assert!("ghcr.io/a-/b".parse::<Reference>().is_err());
        assert!("ghcr.io/a__b/c".parse::<Reference>().is_ok());
        assert!("ghcr.io/a___b/c".parse::<Reference>().is_err());
    }
}
