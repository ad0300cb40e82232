//! Credentials for the recipe's private package indexes, found outside the
//! recipe: the environment (`CUDASTACK_INDEX_<NAME>_USERNAME` / `_PASSWORD`, as uv's
//! `UV_INDEX_<NAME>_*`), then a netrc file (`$NETRC`, else `~/.netrc`), then, when the user
//! opts in with `CUDASTACK_KEYRING_PROVIDER=subprocess`, `keyring get URL USERNAME` (as uv
//! and pip do).
//!
//! Each credential is bound to where the user meant it to go, never to what the recipe
//! says (a pull request can change a recipe's `url:` and keep its index name):
//! the environment's and the keyring's to the URL of `CUDASTACK_INDEX_<NAME>_URL` (as
//! Poetry's `POETRY_REPOSITORIES_<NAME>_URL`), a netrc `machine` entry to its host, and a
//! netrc `default` entry only to an index bound by `CUDASTACK_INDEX_<NAME>_URL`. None is
//! sent over plain http to a host other than this machine.
//!
//! The [`crate::fetch::http::HttpClient`] sends them as basic auth only to URLs of the
//! index's origin (scheme, host and port): a real index serves its files from another path
//! of the same host (`/packages/...`), never from another host, and reqwest drops the
//! `Authorization` header on a redirect that leaves the origin. Nothing here prints a
//! password: [`Credentials`] debug-prints it masked, and errors name where the credentials
//! came from, never what they are.

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use url::Url;

/// The variable that opts in to the keyring helper.
pub const KEYRING_PROVIDER_VARIABLE: &str = "CUDASTACK_KEYRING_PROVIDER";

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("Failed to read the netrc file `{}`: {message}", path.display())]
    Netrc { path: PathBuf, message: String },
    #[error("{KEYRING_PROVIDER_VARIABLE}=`{value}` is not a keyring provider\n  hint: set it to `subprocess` (run `keyring get URL USERNAME`) or `disabled`, or unset it")]
    Provider { value: String },
    /// Credentials from the environment with no URL outside the recipe to bind
    /// them to.
    #[error("index `{index}`: {prefix}_{what} set, but {prefix}_URL is not; cudastack sends credentials from the environment only to the URL that variable names, never to the URL a recipe names (a pull request can change it)\n  hint: if these credentials are for `{url}`, set {prefix}_URL={url}")]
    Unbound {
        index: String,
        prefix: String,
        what: &'static str,
        url: String,
    },
    /// The recipe's index is not the one the user bound the credentials to.
    #[error("index `{index}` is `{recipe_url}` in the recipe, but {prefix}_URL is `{bound_url}`; cudastack sends this index's credentials to that URL only\n  hint: if the recipe's URL is the right one, set {prefix}_URL to it; if not (a pull request may have changed it), restore the recipe's `url:`")]
    Mismatch {
        index: String,
        prefix: String,
        recipe_url: String,
        bound_url: String,
    },
    #[error("{prefix}_URL is `{value}`, which is not an http or https URL without user name, password, query or fragment\n  hint: set it to the index's URL as the recipe writes it, such as `https://pypi.internal.example/simple`")]
    BadBinding { prefix: String, value: String },
    /// Basic auth over plain http to another machine is readable on the way.
    #[error("index `{index}` is plain http on another machine (`{url}`): the credentials from {origin} would cross the network readable by anyone on the path, so cudastack does not send them\n  hint: use the index's https URL in the recipe (and in {prefix}_URL), or remove the credentials for it")]
    PlainHttp {
        index: String,
        prefix: String,
        url: String,
        origin: CredentialOrigin,
    },
    #[error("{KEYRING_PROVIDER_VARIABLE}=subprocess, but `keyring` could not be run for index `{index}`\n  hint: install it (`pipx install keyring`) so that it is on PATH, or unset {KEYRING_PROVIDER_VARIABLE}")]
    Keyring {
        index: String,
        #[source]
        source: std::io::Error,
    },
}

/// A user name and password for HTTP basic auth.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"****")
            .finish()
    }
}

/// Where an index's credentials were found (said in errors; never the credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialOrigin {
    Environment { prefix: String },
    Netrc { path: PathBuf },
    Keyring,
}

impl fmt::Display for CredentialOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialOrigin::Environment { prefix } => {
                write!(f, "{prefix}_USERNAME and {prefix}_PASSWORD")
            }
            CredentialOrigin::Netrc { path } => write!(f, "the netrc file `{}`", path.display()),
            CredentialOrigin::Keyring => f.write_str("`keyring get`"),
        }
    }
}

/// A named index as the recipe gives it: its name, the key of its variables (`INTERNAL`
/// for `CUDASTACK_INDEX_INTERNAL_USERNAME`) and its URL.
#[derive(Debug, Clone)]
pub struct IndexSpec {
    pub name: String,
    pub env_key: String,
    pub base: Url,
}

/// One named index and the credentials found for it, if any.
#[derive(Debug, Clone)]
pub struct IndexAuth {
    pub spec: IndexSpec,
    found: Option<(Credentials, CredentialOrigin)>,
}

impl IndexAuth {
    pub fn credentials(&self) -> Option<&Credentials> {
        self.found.as_ref().map(|(credentials, _)| credentials)
    }

    pub fn origin(&self) -> Option<&CredentialOrigin> {
        self.found.as_ref().map(|(_, origin)| origin)
    }

    /// `CUDASTACK_INDEX_<NAME>`, the prefix of this index's variables.
    pub fn variable_prefix(&self) -> String {
        format!("CUDASTACK_INDEX_{}", self.spec.env_key)
    }

    /// The three ways to give credentials, for an error that found none.
    pub fn ways_to_authenticate(&self) -> String {
        let prefix = self.variable_prefix();
        format!(
            "set {prefix}_USERNAME and {prefix}_PASSWORD, with {prefix}_URL={base} (the URL they are for); or add `machine {} login USER password PASSWORD` to ~/.netrc (or the file $NETRC names); or set {KEYRING_PROVIDER_VARIABLE}=subprocess, {prefix}_URL and {prefix}_USERNAME to ask `keyring get {base} USER`",
            self.spec.base.host_str().unwrap_or_default(),
            base = self.spec.base
        )
    }
}

/// Reads one environment variable.
type EnvReader = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where credentials are looked for. [`Lookup::from_process`] reads this process's
/// environment; tests give their own.
pub struct Lookup {
    env: EnvReader,
    netrc: Option<PathBuf>,
    keyring: Option<PathBuf>,
}

impl Lookup {
    /// The process's environment, `$NETRC` or `~/.netrc` (when it exists), and `keyring` on
    /// PATH when `CUDASTACK_KEYRING_PROVIDER=subprocess`.
    pub fn from_process() -> Result<Self, CredentialError> {
        let keyring = match std::env::var(KEYRING_PROVIDER_VARIABLE).ok().as_deref() {
            None | Some("") | Some("disabled") => None,
            Some("subprocess") => Some(PathBuf::from("keyring")),
            Some(other) => {
                return Err(CredentialError::Provider {
                    value: other.to_string(),
                })
            }
        };
        Ok(Lookup {
            env: Box::new(|name| std::env::var(name).ok()),
            netrc: netrc::Netrc::get_file(),
            keyring,
        })
    }

    /// A lookup from explicit parts: variables, a netrc file, a keyring program.
    pub fn new(
        env: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
        netrc: Option<PathBuf>,
        keyring: Option<PathBuf>,
    ) -> Self {
        Lookup {
            env: Box::new(env),
            netrc,
            keyring,
        }
    }

    fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|value| !value.is_empty())
    }

    /// Whether the user bound `spec`'s name to its URL with `<prefix>_URL`. A
    /// binding to another URL is an error: the recipe's index is not the user's.
    fn bound(&self, spec: &IndexSpec, prefix: &str) -> Result<bool, CredentialError> {
        let Some(value) = self.var(&format!("{prefix}_URL")) else {
            return Ok(false);
        };
        let bad = || CredentialError::BadBinding {
            prefix: prefix.to_string(),
            value: crate::fetch::http::redacted_text(&value),
        };
        let bound = Url::parse(&value).map_err(|_| bad())?;
        if !matches!(bound.scheme(), "http" | "https")
            || !bound.username().is_empty()
            || bound.password().is_some()
            || bound.query().is_some()
            || bound.fragment().is_some()
        {
            return Err(bad());
        }
        if !same_index(&bound, &spec.base) {
            return Err(CredentialError::Mismatch {
                index: spec.name.clone(),
                prefix: prefix.to_string(),
                recipe_url: spec.base.to_string(),
                bound_url: bound.to_string(),
            });
        }
        Ok(true)
    }

    /// The first of environment, netrc and keyring that has credentials for `spec`, each
    /// taken only where it is bound to the index (module docs;).
    fn find(
        &self,
        spec: &IndexSpec,
        netrc: Option<&netrc::Netrc>,
    ) -> Result<Option<(Credentials, CredentialOrigin)>, CredentialError> {
        let prefix = format!("CUDASTACK_INDEX_{}", spec.env_key);
        let bound = self.bound(spec, &prefix)?;
        let unbound = |what| CredentialError::Unbound {
            index: spec.name.clone(),
            prefix: prefix.clone(),
            what,
            url: spec.base.to_string(),
        };
        let username = self.var(&format!("{prefix}_USERNAME"));
        if let (Some(username), Some(password)) =
            (username.clone(), self.var(&format!("{prefix}_PASSWORD")))
        {
            if !bound {
                return Err(unbound("USERNAME and _PASSWORD are"));
            }
            let origin = CredentialOrigin::Environment {
                prefix: prefix.clone(),
            };
            return Ok(Some((Credentials { username, password }, origin)));
        }
        if let (Some(netrc), Some(path)) = (netrc, &self.netrc) {
            if let Some(entry) = netrc_entry(netrc, spec, bound) {
                let credentials = Credentials {
                    username: entry.login.clone(),
                    password: entry.password.clone(),
                };
                let origin = CredentialOrigin::Netrc { path: path.clone() };
                return Ok(Some((credentials, origin)));
            }
        }
        match (&self.keyring, username) {
            (Some(_), Some(_)) if !bound => Err(unbound("USERNAME is")),
            (Some(program), Some(username)) => {
                Ok(keyring_get(program, spec, &username)?.map(|password| {
                    (
                        Credentials { username, password },
                        CredentialOrigin::Keyring,
                    )
                }))
            }
            _ => Ok(None),
        }
    }

    fn read_netrc(&self) -> Result<Option<netrc::Netrc>, CredentialError> {
        let Some(path) = &self.netrc else {
            return Ok(None);
        };
        netrc::Netrc::from_file(path)
            .map(Some)
            .map_err(|error| CredentialError::Netrc {
                path: path.clone(),
                message: match error {
                    // The parser's message quotes the token it stopped at, which may be a
                    // password: say where, not what.
                    netrc::Error::Parsing { .. } => {
                        "it is not in netrc syntax (`machine HOST login USER password PASSWORD`)"
                            .to_string()
                    }
                    netrc::Error::Io(error) => error.to_string(),
                },
            })
    }
}

/// The netrc entry for `spec`: the `machine` of its host (the user named that host), else,
/// only for an index the user `bound` by URL, the `default` entry. curl and pip send a
/// `default` entry to every host; sent to whatever host a recipe names, it would go to a
/// pull request's server.
fn netrc_entry<'n>(
    netrc: &'n netrc::Netrc,
    spec: &IndexSpec,
    bound: bool,
) -> Option<&'n netrc::Authenticator> {
    let host = spec.base.host_str().unwrap_or_default();
    // The netrc crate files the `default` entry under the host name `default`.
    let machine = (host != "default").then(|| netrc.hosts.get(host)).flatten();
    machine.or_else(|| {
        let default = netrc.hosts.get("default").filter(|_| bound);
        if default.is_none() && netrc.hosts.contains_key("default") {
            tracing::debug!(index = %spec.name, "the netrc `default` entry is not sent to an index without CUDASTACK_INDEX_<NAME>_URL");
        }
        default
    })
}

/// Whether two index URLs name the same index: the same origin and path, a trailing `/`
/// aside (`.../simple` is `.../simple/`).
fn same_index(a: &Url, b: &Url) -> bool {
    a.origin() == b.origin() && a.path().trim_end_matches('/') == b.path().trim_end_matches('/')
}

/// `keyring get URL USERNAME`: the password on the first line of its output, or `None` when
/// the keyring has none (it exits non-zero).
fn keyring_get(
    program: &PathBuf,
    spec: &IndexSpec,
    username: &str,
) -> Result<Option<String>, CredentialError> {
    let output = Command::new(program)
        .arg("get")
        .arg(spec.base.as_str())
        .arg(username)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|source| CredentialError::Keyring {
            index: spec.name.clone(),
            source,
        })?;
    if !output.status.success() {
        tracing::debug!(index = %spec.name, status = %output.status, "keyring has no password for the index");
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .next()
        .map(str::to_string)
        .filter(|line| !line.is_empty()))
}

/// `localhost`, `127.0.0.0/8` or `::1`: plain http does not leave the machine.
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name == "localhost",
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        None => false,
    }
}

/// Credentials go over plain http only to this machine; to another, an error
/// (not a warning a CI log buries).
fn refuse_plain_http(spec: &IndexSpec, origin: &CredentialOrigin) -> Result<(), CredentialError> {
    if spec.base.scheme() == "http" && !is_loopback(&spec.base) {
        return Err(CredentialError::PlainHttp {
            index: spec.name.clone(),
            prefix: format!("CUDASTACK_INDEX_{}", spec.env_key),
            url: spec.base.to_string(),
            origin: origin.clone(),
        });
    }
    Ok(())
}

/// The recipe's named indexes with what was found for each.
#[derive(Debug, Clone, Default)]
pub struct IndexCredentials {
    indexes: Vec<IndexAuth>,
}

impl IndexCredentials {
    /// Look up credentials for every index in this process's environment.
    pub fn discover(specs: Vec<IndexSpec>) -> Result<Self, CredentialError> {
        if specs.is_empty() {
            return Ok(Self::default());
        }
        Self::discover_with(specs, &Lookup::from_process()?)
    }

    pub fn discover_with(specs: Vec<IndexSpec>, lookup: &Lookup) -> Result<Self, CredentialError> {
        let netrc = lookup.read_netrc()?;
        let mut indexes = Vec::new();
        for spec in specs {
            let found = lookup.find(&spec, netrc.as_ref())?;
            if let Some((_, origin)) = &found {
                refuse_plain_http(&spec, origin)?;
            }
            tracing::debug!(index = %spec.name, from = %found.as_ref().map_or("nowhere".to_string(), |(_, origin)| origin.to_string()), "index credentials");
            indexes.push(IndexAuth { spec, found });
        }
        Ok(IndexCredentials { indexes })
    }

    pub fn is_empty(&self) -> bool {
        self.indexes.is_empty()
    }

    /// The index whose origin `url` is under: same scheme, host and port; of several, the
    /// one whose path is the longest prefix of `url`'s.
    pub fn for_url(&self, url: &Url) -> Option<&IndexAuth> {
        self.indexes
            .iter()
            .filter(|auth| auth.spec.base.origin() == url.origin())
            .max_by_key(|auth| {
                let base = auth.spec.base.path();
                if url.path().starts_with(base) {
                    base.len()
                } else {
                    0
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn spec(name: &str, url: &str) -> IndexSpec {
        IndexSpec {
            name: name.into(),
            env_key: name.to_ascii_uppercase().replace('-', "_"),
            base: url.parse().unwrap(),
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + Send + Sync + 'static {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_environment_comes_before_netrc() {
        let dir = tempfile::tempdir().unwrap();
        let netrc = dir.path().join("netrc");
        std::fs::write(
            &netrc,
            "machine pypi.internal.example login n-user password n-pass\ndefault login d-user password d-pass\n",
        )
        .unwrap();
        let lookup = Lookup::new(
            env(&[
                ("CUDASTACK_INDEX_ACME_INTERNAL_USERNAME", "e-user"),
                ("CUDASTACK_INDEX_ACME_INTERNAL_PASSWORD", "e-pass"),
                // Bound without the trailing `/` the recipe's URL has: the same index.
                (
                    "CUDASTACK_INDEX_ACME_INTERNAL_URL",
                    "https://pypi.internal.example/simple",
                ),
                ("CUDASTACK_INDEX_THIRD_URL", "https://third.example/simple/"),
            ]),
            Some(netrc.clone()),
            None,
        );
        let found = IndexCredentials::discover_with(
            vec![
                spec("acme-internal", "https://pypi.internal.example/simple/"),
                spec("other", "https://pypi.internal.example/other/simple/"),
                spec("third", "https://third.example/simple/"),
                spec("fourth", "https://fourth.example/simple/"),
            ],
            &lookup,
        )
        .unwrap();
        let first = &found.indexes[0];
        assert_eq!(first.credentials().unwrap().username, "e-user");
        assert_eq!(
            first.origin().unwrap().to_string(),
            "CUDASTACK_INDEX_ACME_INTERNAL_USERNAME and CUDASTACK_INDEX_ACME_INTERNAL_PASSWORD"
        );
        // A `machine` entry is bound to its host by the user who wrote it.
        assert_eq!(found.indexes[1].credentials().unwrap().password, "n-pass");
        // The `default` entry only for an index bound by its URL variable.
        assert_eq!(found.indexes[2].credentials().unwrap().username, "d-user");
        assert!(found.indexes[3].credentials().is_none());
        assert!(!format!("{found:?}").contains("pass\""), "{found:?}");
        assert!(!format!("{found:?}").contains("e-pass"));
    }

    /// A recipe names the URL; the environment's credentials go only to the URL
    /// `CUDASTACK_INDEX_<NAME>_URL` names, and their absence or another URL is an error.
    #[test]
    fn environment_credentials_go_only_to_their_bound_url() {
        let credentials = [
            ("CUDASTACK_INDEX_INTERNAL_USERNAME", "e-user"),
            ("CUDASTACK_INDEX_INTERNAL_PASSWORD", "e-s3cret"),
        ];
        let discover = |extra: &[(&'static str, &'static str)], url: &str| {
            let pairs: Vec<_> = credentials.iter().chain(extra).copied().collect();
            IndexCredentials::discover_with(
                vec![spec("internal", url)],
                &Lookup::new(env(&pairs), None, None),
            )
        };
        let error = discover(&[], "https://attacker.example/simple/").unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, CredentialError::Unbound { .. }), "{text}");
        assert!(
            text.contains("CUDASTACK_INDEX_INTERNAL_URL is not")
                && text
                    .contains("set CUDASTACK_INDEX_INTERNAL_URL=https://attacker.example/simple/"),
            "{text}"
        );
        let bound = [(
            "CUDASTACK_INDEX_INTERNAL_URL",
            "https://pypi.internal.example/simple/",
        )];
        for other in [
            "https://attacker.example/simple/",
            "https://pypi.internal.example/other/simple/",
            "https://pypi.internal.example:8443/simple/",
        ] {
            let error = discover(&bound, other).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, CredentialError::Mismatch { .. }), "{text}");
            assert!(
                text.contains(other) && text.contains("https://pypi.internal.example/simple/"),
                "{text}"
            );
            assert!(!text.contains("e-s3cret"), "{text}");
        }
        let found = discover(&bound, "https://pypi.internal.example/simple").unwrap();
        assert_eq!(found.indexes[0].credentials().unwrap().password, "e-s3cret");
        for bad in [
            "ftp://h/simple",
            "https://u:p4ss@h/simple",
            "https://h/simple?x=1",
            "not a url",
        ] {
            let pairs = [("CUDASTACK_INDEX_INTERNAL_URL", bad)];
            let error = IndexCredentials::discover_with(
                vec![spec("internal", "https://h/simple/")],
                &Lookup::new(env(&pairs), None, None),
            )
            .unwrap_err();
            let text = error.to_string();
            assert!(
                matches!(error, CredentialError::BadBinding { .. }),
                "{text}"
            );
            assert!(!text.contains("p4ss"), "{text}");
        }
    }

    /// Any credential for a plain-http index on another machine is refused;
    /// on this machine it is sent.
    #[test]
    fn plain_http_credentials_are_refused_off_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let netrc = dir.path().join("netrc");
        std::fs::write(
            &netrc,
            "machine pypi.internal.example login n-user password n-pass\nmachine 127.0.0.1 login l-user password l-pass\n",
        )
        .unwrap();
        let lookup = Lookup::new(
            env(&[
                ("CUDASTACK_INDEX_ENV_USERNAME", "e-user"),
                ("CUDASTACK_INDEX_ENV_PASSWORD", "e-pass"),
                ("CUDASTACK_INDEX_ENV_URL", "http://10.0.0.5/simple/"),
            ]),
            Some(netrc),
            None,
        );
        for (name, url, from) in [
            (
                "env",
                "http://10.0.0.5/simple/",
                "CUDASTACK_INDEX_ENV_USERNAME",
            ),
            (
                "netrc",
                "http://pypi.internal.example/simple/",
                "the netrc file",
            ),
        ] {
            let error =
                IndexCredentials::discover_with(vec![spec(name, url)], &lookup).unwrap_err();
            let text = error.to_string();
            assert!(matches!(error, CredentialError::PlainHttp { .. }), "{text}");
            assert!(text.contains(url) && text.contains(from), "{text}");
        }
        // Without credentials a plain-http index is only read, and on this machine it may
        // have them.
        let found = IndexCredentials::discover_with(
            vec![
                spec("open", "http://10.0.0.6/simple/"),
                spec("local", "http://127.0.0.1:8080/simple/"),
            ],
            &lookup,
        )
        .unwrap();
        assert!(found.indexes[0].credentials().is_none());
        assert_eq!(found.indexes[1].credentials().unwrap().username, "l-user");
    }

    #[test]
    fn urls_match_by_origin_and_longest_path() {
        let found = IndexCredentials::discover_with(
            vec![
                spec("a", "https://host.example/simple/"),
                spec("b", "https://host.example/team/simple/"),
            ],
            &Lookup::new(env(&[]), None, None),
        )
        .unwrap();
        let name = |url: &str| {
            found
                .for_url(&url.parse().unwrap())
                .map(|auth| auth.spec.name.clone())
        };
        assert_eq!(
            name("https://host.example/team/simple/x/").as_deref(),
            Some("b")
        );
        assert_eq!(name("https://host.example/simple/x/").as_deref(), Some("a"));
        // Files served from another path of the same host still belong to an index.
        assert!(name("https://host.example/packages/x.whl").is_some());
        for other in [
            "http://host.example/simple/x/",
            "https://host.example:8443/simple/x/",
            "https://evil.example/simple/x/",
            "https://host.example.evil.example/simple/",
        ] {
            assert_eq!(name(other), None, "{other}");
        }
    }

    #[test]
    fn plain_http_is_fine_only_on_this_machine() {
        for (url, loopback) in [
            ("http://127.0.0.1:8080/simple/", true),
            ("http://localhost/simple/", true),
            ("http://[::1]/simple/", true),
            ("http://pypi.internal.example/simple/", false),
            ("http://10.0.0.5/simple/", false),
        ] {
            assert_eq!(is_loopback(&url.parse().unwrap()), loopback, "{url}");
        }
    }

    #[test]
    fn a_broken_netrc_is_named_without_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let netrc = dir.path().join("netrc");
        std::fs::write(&netrc, "machine h login u password s3cret extra-token\n").unwrap();
        let lookup = Lookup::new(env(&[]), Some(netrc.clone()), None);
        match IndexCredentials::discover_with(vec![spec("a", "https://h/simple/")], &lookup) {
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains(&netrc.display().to_string()), "{text}");
                assert!(!text.contains("s3cret"), "{text}");
            }
            // The parser may accept unknown tokens; then the entry is used as written.
            Ok(found) => assert_eq!(found.indexes[0].credentials().unwrap().username, "u"),
        }
    }

    #[test]
    fn keyring_is_asked_with_the_url_and_user_name() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("keyring");
        std::fs::write(
            &script,
            "#!/bin/sh\n[ \"$1\" = get ] && [ \"$2\" = https://k.example/simple/ ] && [ \"$3\" = kuser ] && echo k-pass && exit 0\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // Without the URL binding the keyring is not asked (a backend such as
        // Google's answers for any URL of its service, a pull request's among them).
        let unbound = Lookup::new(
            env(&[("CUDASTACK_INDEX_K_USERNAME", "kuser")]),
            None,
            Some(script.clone()),
        );
        let error =
            IndexCredentials::discover_with(vec![spec("k", "https://k.example/simple/")], &unbound)
                .unwrap_err();
        assert!(matches!(error, CredentialError::Unbound { .. }), "{error}");
        let lookup = Lookup::new(
            env(&[
                ("CUDASTACK_INDEX_K_USERNAME", "kuser"),
                ("CUDASTACK_INDEX_K_URL", "https://k.example/simple/"),
            ]),
            None,
            Some(script.clone()),
        );
        let found =
            IndexCredentials::discover_with(vec![spec("k", "https://k.example/simple/")], &lookup)
                .unwrap();
        let auth = &found.indexes[0];
        assert_eq!(auth.credentials().unwrap().password, "k-pass");
        assert_eq!(auth.origin(), Some(&CredentialOrigin::Keyring));
        // Without a user name the keyring is not asked; a keyring without the entry: none.
        let lookup = Lookup::new(env(&[]), None, Some(script.clone()));
        let found =
            IndexCredentials::discover_with(vec![spec("k", "https://k.example/simple/")], &lookup)
                .unwrap();
        assert!(found.indexes[0].credentials().is_none());
        let missing = Lookup::new(
            env(&[
                ("CUDASTACK_INDEX_K_USERNAME", "kuser"),
                ("CUDASTACK_INDEX_K_URL", "https://k.example/simple/"),
            ]),
            None,
            Some(dir.path().join("no-such-keyring")),
        );
        let error =
            IndexCredentials::discover_with(vec![spec("k", "https://k.example/simple/")], &missing)
                .unwrap_err();
        assert!(error.to_string().contains("could not be run"), "{error}");
    }
}
