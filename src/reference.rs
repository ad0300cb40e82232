//! Image references: `[registry[:port]/]repository[:tag][@sha256:...]`, parsed once.
//!
//! The grammar and the Docker Hub normalisation follow distribution's `reference` package:
//! the first path component is a registry only when it contains a `.` or a `:`, or is
//! `localhost`; otherwise the registry is `docker.io`, and a one-component repository on
//! Docker Hub lives under `library/` (`ubuntu` is `docker.io/library/ubuntu:latest`).
//!
//! Shared vocabulary, below the pipeline: `recipe` checks the tags a recipe names
//! with it, `engine` and `registry` address images with it. It depends only on `digest`;
//! `registry::Reference` is a re-export of [`Reference`].

use std::fmt;
use std::str::FromStr;

use crate::digest::Digest;

/// The registry Docker Hub references name, and the host its API actually answers on.
pub const DOCKER_HUB: &str = "docker.io";
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// Why a text is not an image reference: the whole text, and the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a valid image reference: {problem}", escape(.reference))]
pub struct ReferenceError {
    /// The text as given.
    pub reference: String,
    pub problem: ReferenceProblem,
}

impl ReferenceError {
    /// What to do about it.
    pub fn hint(&self) -> &'static str {
        self.problem.hint()
    }
}

/// What is wrong with a reference, in the grammar's terms. Every variant names the part
/// as written (control characters escaped, so a message stays on one line). The reasons
/// are `Box<str>` to keep this small: it travels inside every recipe and build error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceProblem {
    #[error("it is empty")]
    Empty,
    #[error(
        "the registry `{}` is not a host name, IPv4 or [IPv6] address with an optional :port: {reason}",
        escape(.registry)
    )]
    Registry { registry: String, reason: Box<str> },
    #[error("the repository `{}`: {reason}", escape(.repository))]
    Repository {
        repository: String,
        reason: Box<str>,
    },
    #[error(
        "the tag `{}` must be 1-128 of [A-Za-z0-9_.-], not starting with `.` or `-`",
        escape(.tag)
    )]
    Tag { tag: String },
    #[error("bad digest: {reason}")]
    BadDigest { reason: String },
    /// A name to give an image ([`Reference::parse_name`]) carries no digest.
    #[error(
        "it names a digest (`@sha256:...`), which is what the image will have, not a name to give it"
    )]
    Digest,
    /// Docker Engine 20.10 (distribution/reference before v2.8) has no IPv6 literals.
    #[error(
        "the registry `{}` is an IPv6 address, which Docker Engine before 23 cannot parse in a tag",
        escape(.registry)
    )]
    Ipv6ForDocker { registry: String },
}

impl ReferenceProblem {
    /// What to do about it, whatever the reference was for.
    pub fn hint(&self) -> &'static str {
        match self {
            ReferenceProblem::Empty => "write a reference such as `ghcr.io/org/torch:2.4.1`",
            ReferenceProblem::Registry { .. } => {
                "give the registry as `host[:port]` (`ghcr.io`, `127.0.0.1:5000`, `[::1]:5000`)"
            }
            ReferenceProblem::Repository { .. } => {
                "write the image name in lowercase letters and digits, with `.`, `_`, `__` or `-` \
                 between them and `/` between path parts (no `..`, no spaces), at most 255 \
                 characters with the registry"
            }
            ReferenceProblem::Tag { .. } => {
                "keep the part after the last `:` to letters, digits, `_`, `.` and `-`, at most \
                 128 characters"
            }
            ReferenceProblem::BadDigest { .. } => {
                "a digest is `sha256:` and 64 lowercase hexadecimal digits"
            }
            ReferenceProblem::Digest => "remove the `@...` part",
            ReferenceProblem::Ipv6ForDocker { .. } => {
                "name the registry `localhost:PORT` or by a host name; Docker Engine 23 and newer \
                 accept [IPv6] addresses"
            }
        }
    }
}

/// Control characters (a newline in a tag) shown as escapes (`\n`), so a message stays
/// one line and cannot rewrite the terminal.
pub(crate) fn escape(text: &str) -> String {
    crate::printable::escape(text).into_owned()
}

/// `text` without its digest, split into the name and the tag: the tag is after the last
/// `:` that comes after the last `/` (a `:` before it is a registry port). The one place
/// this split is made, for the parser and for callers that hand the parts on as written
/// (the Docker Engine's tag request).
pub fn split_name_and_tag(text: &str) -> (&str, Option<&str>) {
    let rest = text.split_once('@').map_or(text, |(rest, _)| rest);
    let after_slash = rest.rfind('/').map_or(0, |slash| slash + 1);
    match rest[after_slash..].rfind(':') {
        Some(colon) => (
            &rest[..after_slash + colon],
            Some(&rest[after_slash + colon + 1..]),
        ),
        None => (rest, None),
    }
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
/// plain-http credentials.
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

/// Why `component` (one `/`-separated part of a repository) is not
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, if it is not.
fn component_problem(component: &str) -> Option<String> {
    if component.is_empty() {
        return Some("the name has an empty part (`//` or a trailing `/`)".to_string());
    }
    let shown = escape(component);
    // The worst problem first: a newline is not "uppercase letters".
    if let Some(c) = component
        .chars()
        .find(|&c| crate::printable::is_unsafe(c) || c.is_whitespace())
    {
        return Some(format!(
            "`{shown}` holds `{}`, a {} character; a name is lowercase letters, digits and \
             separators",
            c.escape_default(),
            if c.is_whitespace() && !c.is_control() {
                "space"
            } else {
                "control"
            }
        ));
    }
    if component.bytes().any(|b| b.is_ascii_uppercase()) {
        return Some(format!(
            "`{shown}` has uppercase letters; repository names must be lowercase"
        ));
    }
    let bytes = component.as_bytes();
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    let mut after_separator = true;
    while i < bytes.len() {
        let b = bytes[i];
        if alphanumeric(b) {
            after_separator = false;
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&c| c == b).count();
        let separator = match b {
            b'.' => run == 1,
            b'_' => run <= 2,
            b'-' => true,
            _ => false,
        };
        if !separator {
            return Some(format!(
                "`{shown}` may hold only lowercase letters, digits and single `.`, `_`, `__` or \
                 `-` separators"
            ));
        }
        if after_separator {
            return Some(format!(
                "`{shown}` must start with a lowercase letter or digit"
            ));
        }
        after_separator = true;
        i += run;
    }
    after_separator.then(|| format!("`{shown}` must end with a lowercase letter or digit"))
}

fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Why `registry` is not `host[:port]`, if it is not: a host name of `.`-separated parts
/// `[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?` (distribution's domainNameComponent, which
/// also covers IPv4), or an IPv6 address in brackets (`[0-9A-Fa-f:]+`, as distribution's
/// ipv6address, and a real address); a port is 1-5 decimal digits below 65536.
fn registry_problem(registry: &str) -> Option<String> {
    let port = if let Some(rest) = registry.strip_prefix('[') {
        let Some((host, tail)) = rest.split_once(']') else {
            return Some("`[` opens an IPv6 address that no `]` closes".to_string());
        };
        if host.is_empty()
            || !host.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
            || host.parse::<std::net::Ipv6Addr>().is_err()
        {
            return Some(format!("`{}` is not an IPv6 address", escape(host)));
        }
        match tail {
            "" => None,
            _ => match tail.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Some("only `:PORT` may follow the `]`".to_string()),
            },
        }
    } else {
        let (host, port) = match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        };
        if host.is_empty() {
            return Some("the host is empty".to_string());
        }
        for label in host.split('.') {
            let bytes = label.as_bytes();
            if bytes.is_empty() {
                return Some(format!(
                    "the registry host `{}` has an empty part between dots",
                    escape(host)
                ));
            }
            if !bytes[0].is_ascii_alphanumeric()
                || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
                || !bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            {
                return Some(format!(
                    "`{}` is not a part of a registry host name (letters and digits, with `-` \
                     only inside)",
                    escape(label)
                ));
            }
        }
        port
    };
    match port {
        Some(port)
            if port.is_empty()
                || port.len() > 5
                || !port.bytes().all(|b| b.is_ascii_digit())
                || port.parse::<u16>().is_err() =>
        {
            Some(format!(
                "the port `{}` is not a number from 0 to 65535",
                escape(port)
            ))
        }
        _ => None,
    }
}

/// The longest name (registry, `/` and repository, as normalised) Docker accepts:
/// distribution/reference's NameTotalLengthMax. Measured on Docker 20.10: a one-part name
/// of 237 characters (`docker.io/library/` + 237 = 255) tags, 238 is refused.
const NAME_TOTAL_LENGTH_MAX: usize = 255;

impl Reference {
    /// A name to give an image (a recipe tag, `load --tag`, an OCI layout ref): the same
    /// grammar, without a digest (the digest is what the image will have).
    pub fn parse_name(text: &str) -> Result<Self, ReferenceError> {
        if text.contains('@') {
            return Err(ReferenceError {
                reference: text.to_string(),
                problem: ReferenceProblem::Digest,
            });
        }
        text.parse()
    }

    /// A name the Docker Engine can tag an image with: [`Self::parse_name`], and no IPv6
    /// registry, which Docker 20.10 refuses (measured: `POST /images/ID/tag` with
    /// `repo=[::1]:5000/a` answers 500 "invalid reference format"; IPv6 literals came with
    /// distribution/reference v2.8, in Docker 23).
    pub fn parse_docker_name(text: &str) -> Result<Self, ReferenceError> {
        let reference = Self::parse_name(text)?;
        if reference.registry.starts_with('[') {
            return Err(ReferenceError {
                reference: text.to_string(),
                problem: ReferenceProblem::Ipv6ForDocker {
                    registry: reference.registry,
                },
            });
        }
        Ok(reference)
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;

    /// The grammar of distribution/reference as the Docker daemon applies it
    /// (`ParseNormalizedNamed`, Docker 20.10): whatever it refuses is refused here, so
    /// a name that passes here can be a Docker tag, an OCI ref and a registry reference.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |problem| ReferenceError {
            reference: text.to_string(),
            problem,
        };
        if text.is_empty() {
            return Err(fail(ReferenceProblem::Empty));
        }
        let digest = match text.split_once('@') {
            Some((_, written)) => Some(parse_digest(written).map_err(fail)?),
            None => None,
        };
        let (name, tag) = split_name_and_tag(text);
        if let Some(tag) = tag {
            if !valid_tag(tag) {
                return Err(fail(ReferenceProblem::Tag {
                    tag: tag.to_string(),
                }));
            }
        }
        let (registry, repository, written_registry) = split_registry(name);
        if let Some(reason) = registry_problem(registry) {
            return Err(fail(ReferenceProblem::Registry {
                registry: registry.to_string(),
                reason: reason.into(),
            }));
        }
        let registry = match registry {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB,
            other => other,
        };
        let repository =
            normalise_repository(registry, repository, written_registry).map_err(|reason| {
                fail(ReferenceProblem::Repository {
                    repository: repository.to_string(),
                    reason: reason.into(),
                })
            })?;
        Ok(Reference {
            registry: registry.to_string(),
            repository,
            tag: tag.map(str::to_string),
            digest,
        })
    }
}

/// The digest after `@`, which must print back as it was written.
fn parse_digest(written: &str) -> Result<Digest, ReferenceProblem> {
    let digest = written
        .parse::<Digest>()
        .map_err(|error| ReferenceProblem::BadDigest {
            reason: escape(&error.to_string()),
        })?;
    // go-digest validates sha256 as lowercase hex; `sha256:ABC...` would print back as
    // another text.
    if digest.to_string() != written {
        return Err(ReferenceProblem::BadDigest {
            reason: format!(
                "`{}` must be written in lowercase hexadecimal",
                escape(written)
            ),
        });
    }
    Ok(digest)
}

/// `name` -> (registry, repository, whether the registry was written). distribution's
/// splitDockerDomain (Docker 20.10): the first part is a registry when it has a `.` or `:`
/// or is `localhost`. (Docker 23 also takes an uppercase first part as a host; 20.10 reads
/// it as a repository and refuses it, and so does this parser.) A bracket can only open an
/// IPv6 registry.
fn split_registry(name: &str) -> (&str, &str, bool) {
    match name.split_once('/') {
        Some((first, remainder))
            if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') =>
        {
            (first, remainder, true)
        }
        _ => (DOCKER_HUB, name, false),
    }
}

/// The repository as Docker normalises it (`ubuntu` on Docker Hub is `library/ubuntu`), or
/// why Docker refuses it.
fn normalise_repository(
    registry: &str,
    repository: &str,
    written_registry: bool,
) -> Result<String, String> {
    if repository.is_empty() {
        return Err("it is empty".to_string());
    }
    if let Some(reason) = repository.split('/').find_map(component_problem) {
        return Err(reason);
    }
    // ParseNormalizedNamed reads 64 hex digits alone as an image ID (and the daemon's
    // tag request refuses such a repository, with or without a tag).
    if !written_registry
        && repository.len() == 64
        && repository
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err("a 64-digit hexadecimal name is read as an image ID".to_string());
    }
    let repository = if registry == DOCKER_HUB && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository.to_string()
    };
    let length = registry.len() + 1 + repository.len();
    if length > NAME_TOTAL_LENGTH_MAX {
        return Err(format!(
            "the name `{registry}/{repository}` is {length} characters; at most \
             {NAME_TOTAL_LENGTH_MAX} are allowed"
        ));
    }
    Ok(repository)
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

    fn problem(text: &str) -> ReferenceProblem {
        match text.parse::<Reference>() {
            Ok(reference) => panic!("{text} parsed as {reference}"),
            Err(error) => {
                assert_eq!(error.reference, text);
                error.problem
            }
        }
    }

    #[test]
    fn precise_errors() {
        assert_eq!(problem(""), ReferenceProblem::Empty);
        assert!(matches!(
            problem("ghcr.io/Org/img"),
            ReferenceProblem::Repository { reason, .. } if reason.contains("lowercase")
        ));
        assert!(matches!(
            problem("img:-bad"),
            ReferenceProblem::Tag { tag } if tag == "-bad"
        ));
        assert!(matches!(
            problem("img@sha256:123"),
            ReferenceProblem::BadDigest { .. }
        ));
        assert!(matches!(
            problem("host:99999/img"),
            ReferenceProblem::Registry { .. }
        ));
        assert!("a//b".parse::<Reference>().is_err());
        assert!("ghcr.io/a-/b".parse::<Reference>().is_err());
        assert!("ghcr.io/a__b/c".parse::<Reference>().is_ok());
        assert!("ghcr.io/a___b/c".parse::<Reference>().is_err());
        // The message names the reference and the part at fault, on one line.
        let error = "ghcr.io/team/Torch\n:1".parse::<Reference>().unwrap_err();
        let text = error.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("`ghcr.io/team/Torch\\n:1`"), "{text}");
    }

    /// One grammar for every edge. Each of these is refused by the Docker 20.10
    /// daemon (measured with `POST /images/ID/tag`), by distribution/reference, or both,
    /// and so here, with the part at fault named.
    #[test]
    fn what_docker_refuses_is_refused() {
        let hex = "0123456789abcdef".repeat(4);
        let long_tag = format!("x:{}", "t".repeat(129));
        // docker.io/library/ + 238 = 256 characters: refused; 237 is the longest.
        let long_name = "n".repeat(238);
        let longest = "n".repeat(237);
        for (bad, names) in [
            ("cudastack/Torch:1", "`Torch`"),
            ("Mirror/torch:x", "`Mirror`"),
            ("LocalHost/a", "`LocalHost`"),
            ("torch:a+b", "`a+b`"),
            ("a//b:1", "empty part"),
            ("-a:1", "`-a`"),
            ("a-:1", "`a-`"),
            ("a..b:1", "`a..b`"),
            ("a b:1", "`a b`"),
            ("h\u{e9}llo:1", "`h\u{e9}llo`"),
            ("a..b:5000/torch:1", "empty part between dots"),
            ("../torch:1", "registry `..`"),
            ("-a.io/torch:1", "`-a`"),
            ("bad_host.example/a:1", "registry host"),
            ("host.example:50x0/a:1", "port `50x0`"),
            ("[::ffff:127.0.0.1]:5000/a", "IPv6"),
            (hex.as_str(), "image ID"),
            (long_tag.as_str(), "128"),
            (long_name.as_str(), "255"),
        ] {
            let error = bad.parse::<Reference>().unwrap_err().to_string();
            assert!(error.contains(names), "{bad}: {error}");
        }
        parse(&longest);
        parse(&format!("docker.io/{hex}"));
        parse(&format!("{hex}/x"));
        parse("Registry.Example.COM/torch:Latest");
    }

    #[test]
    fn names_carry_no_digest_and_docker_names_no_ipv6() {
        let digest = Digest::of_bytes(b"x");
        let pinned = format!("ghcr.io/a/b:v1@{digest}");
        assert_eq!(
            Reference::parse_name(&pinned).unwrap_err().problem,
            ReferenceProblem::Digest
        );
        assert_eq!(
            Reference::parse_name("a@sha256:1").unwrap_err().problem,
            ReferenceProblem::Digest
        );
        assert!(Reference::parse_name("[::1]:5000/a:b").is_ok());
        assert!(matches!(
            Reference::parse_docker_name("[::1]:5000/a:b").unwrap_err().problem,
            ReferenceProblem::Ipv6ForDocker { registry } if registry == "[::1]:5000"
        ));
        assert_eq!(
            Reference::parse_docker_name("localhost:5000/a:b")
                .unwrap()
                .to_string(),
            "localhost:5000/a:b"
        );
        // Uppercase hex digests print back as another text: refused.
        let upper = format!("a@sha256:{}", digest.hex().to_uppercase());
        assert!(matches!(
            problem(&upper),
            ReferenceProblem::BadDigest { .. }
        ));
    }

    #[test]
    fn the_split_is_at_the_last_colon_after_the_last_slash() {
        assert_eq!(split_name_and_tag("busybox"), ("busybox", None));
        assert_eq!(
            split_name_and_tag("localhost:5000/torch"),
            ("localhost:5000/torch", None)
        );
        assert_eq!(
            split_name_and_tag("localhost:5000/a/torch:1@sha256:00"),
            ("localhost:5000/a/torch", Some("1"))
        );
        assert_eq!(split_name_and_tag(":"), ("", Some("")));
    }

    /// Only loopback addresses and `localhost` are this machine. A name that
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
                matches!(problem(bad), ReferenceProblem::Registry { .. }),
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
