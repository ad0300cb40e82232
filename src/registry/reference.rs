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

    /// The same repository and tag pinned to `digest` (`repo:tag@digest`): what a push
    /// prints, whatever digest the reference carried before.
    pub fn pinned(&self, digest: Digest) -> Self {
        Self {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same reference without its digest (`repo:tag`, or `repo` for `repo@digest`).
    pub fn without_digest(&self) -> Self {
        Self {
            digest: None,
            ..self.clone()
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

/// Whether `registry` (host[:port], as in a reference) is this machine: the name
/// `localhost` (any case), or an IP address that is loopback (`127.0.0.0/8`, `[::1]`,
/// `[::ffff:127.0.0.1]`), with or without a port. Anything else is a host name, however it
/// starts: `127.evil.example` resolves wherever its owner wants, so it gets https and no
/// plain-http credentials (issue 16).
pub fn is_localhost(registry: &str) -> bool {
    if let Some(rest) = registry.strip_prefix('[') {
        // Brackets hold an IPv6 address and nothing else (RFC 3986 IP-literal).
        return rest.split_once(']').is_some_and(|(host, _)| {
            host.parse::<std::net::Ipv6Addr>()
                .is_ok_and(|ip| ip.to_canonical().is_loopback())
        });
    }
    let host = registry.split(':').next().unwrap_or_default();
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
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

/// `host[:port]`: a host name (letters, digits, `-`, `.`), or an IPv6 address in
/// brackets; a port is 1-5 decimal digits below 65536.
fn valid_registry(registry: &str) -> bool {
    let (host_ok, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((host, tail)) = rest.split_once(']') else {
            return false;
        };
        let port = match tail {
            "" => None,
            _ => match tail.strip_prefix(':') {
                Some(port) => Some(port),
                None => return false,
            },
        };
        (host.parse::<std::net::Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        };
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b));
        (host_ok, port)
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok()
    });
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

    /// Issue 16: only loopback addresses and `localhost` are this machine. A name that
    /// merely starts with `127.` is a DNS name anyone can point anywhere.
    #[test]
    fn only_loopback_addresses_and_localhost_are_local() {
        for local in [
            "localhost",
            "localhost:5000",
            "LocalHost:5000",
            "127.0.0.1",
            "127.0.0.1:5000",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:5000",
            "[::ffff:127.0.0.1]:5000",
        ] {
            assert!(is_localhost(local), "{local} is this machine");
        }
        for remote in [
            "127.evil.example",
            "127.evil.example:5000",
            "127.0.0.1.nip.io",
            "127.0.0.1.evil.example:443",
            "localhost.evil.example",
            "127.1",
            "[::2]:5000",
            "[127.0.0.1]",
            "[::1",
            "ghcr.io",
            "10.0.0.1:5000",
            "",
        ] {
            assert!(!is_localhost(remote), "{remote} is not this machine");
        }
        let r = parse("127.evil.example/team/img:v1");
        assert_eq!(r.registry(), "127.evil.example");
        assert!(!r.is_localhost());
        assert!(parse("[::1]:5000/a").is_localhost());
    }

    #[test]
    fn registries_are_a_host_and_a_decimal_port() {
        for bad in [
            "a.b:+1/c",
            "[a]b/c",
            "[::1]x:5000/c",
            "[not-an-address]:5000/c",
            "[]:5000/c",
            "a.b:/c",
        ] {
            assert!(
                matches!(
                    bad.parse::<Reference>(),
                    Err(ReferenceError::Registry { .. })
                ),
                "{bad}: {:?}",
                bad.parse::<Reference>()
            );
        }
    }

    #[test]
    fn pinned_keeps_the_tag_and_replaces_the_digest() {
        let old = Digest::of_bytes(b"old");
        let new = Digest::of_bytes(b"new");
        let r = parse(&format!("ghcr.io/a/b:v1@{old}"));
        assert_eq!(r.pinned(new).to_string(), format!("ghcr.io/a/b:v1@{new}"));
        assert_eq!(r.without_digest().to_string(), "ghcr.io/a/b:v1");
        assert_eq!(
            parse("a/b").pinned(new).to_string(),
            format!("docker.io/a/b@{new}")
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Text made of the characters references are made of (and a few that break
        /// them), so that a good share of the cases parse.
        fn reference_like() -> impl Strategy<Value = String> {
            let registry = prop_oneof![
                4 => Just(String::new()),
                4 => "[a-z0-9]{1,6}\\.[a-z]{2,4}(:[0-9]{1,5})?/",
                1 => "[a-zA-Z0-9.-]{1,12}(:[0-9+]{0,6})?/",
                1 => Just("localhost/".to_string()),
                1 => Just("localhost:5000/".to_string()),
                1 => Just("[::1]:5000/".to_string()),
                1 => "\\[[0-9a-f:.]{0,10}\\](:[0-9]{1,5})?/",
                1 => Just("index.docker.io/".to_string()),
            ];
            let repository = prop_oneof![
                6 => "[a-z0-9]{1,6}([._-][a-z0-9]{1,6}){0,2}(/[a-z0-9]{1,6}(__[a-z0-9]{1,4})?){0,3}",
                1 => "[a-z0-9._-]{1,10}(/[a-z0-9._-]{1,10}){0,3}",
            ];
            let tag = prop_oneof![
                3 => Just(String::new()),
                3 => ":[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}",
                1 => ":[A-Za-z0-9_.-]{0,12}",
            ];
            let digest = prop_oneof![
                4 => Just(String::new()),
                2 => "@sha256:[0-9a-f]{64}",
                1 => "@[a-z0-9]{0,8}:[0-9a-fA-F]{0,66}",
            ];
            (registry, repository, tag, digest).prop_map(|(r, p, t, d)| format!("{r}{p}{t}{d}"))
        }

        fn round_trips(text: &str) -> Result<(), TestCaseError> {
            if let Ok(reference) = text.parse::<Reference>() {
                let printed = reference.to_string();
                let again = printed.parse::<Reference>();
                prop_assert_eq!(
                    again.as_ref(),
                    Ok(&reference),
                    "`{}` printed as `{}`",
                    text,
                    printed
                );
                // Deciding whether it is this machine never panics either.
                let _ = reference.is_localhost();
            }
            Ok(())
        }

        /// The round-trip property means something only if the generated text parses
        /// often: at least a quarter of it does.
        #[test]
        fn reference_shaped_text_mostly_parses() {
            use proptest::strategy::ValueTree;
            let mut runner = proptest::test_runner::TestRunner::deterministic();
            let strategy = reference_like();
            let parsed = (0..400)
                .filter(|_| {
                    let text = strategy.new_tree(&mut runner).unwrap().current();
                    text.parse::<Reference>().is_ok()
                })
                .count();
            assert!(parsed >= 100, "{parsed} of 400 parse");
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            /// Any string at all: an answer, never a panic.
            #[test]
            fn arbitrary_strings_never_panic(text in any::<String>()) {
                round_trips(&text)?;
            }

            /// Printable ASCII, where the separators `/ : @ [ ]` are common.
            #[test]
            fn ascii_noise_never_panics(text in "[ -~]{0,80}") {
                round_trips(&text)?;
            }

            /// Reference-shaped text: what parses prints back to the same reference.
            #[test]
            fn parsed_references_print_back_to_themselves(text in reference_like()) {
                round_trips(&text)?;
            }
        }
    }
}
