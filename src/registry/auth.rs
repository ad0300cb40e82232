//! Credentials and the registry auth handshake.
//!
//! Where credentials come from, in order: explicit ones (`--username` + `--password-stdin`,
//! or `CUDASTACK_REGISTRY_USERNAME` / `CUDASTACK_REGISTRY_PASSWORD`, resolved by the CLI),
//! then the Docker config (`$DOCKER_CONFIG/config.json` or `~/.docker/config.json`):
//! `credHelpers[registry]`, then `credsStore`, then the base64 `auths[registry].auth`.
//! Helpers are run as `docker-credential-NAME get` with the registry on stdin, as Docker
//! does. Nothing found means anonymous.
//!
//! Secrets live in [`Secret`], whose `Debug` is redacted and which has no `Display`: a
//! password or token cannot reach a log line or an error message by accident.
//! [`Challenge`] parses `WWW-Authenticate` (RFC 7235 auth-params, as the distribution token
//! spec uses them: `Bearer realm="…",service="…",scope="…"`).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;

use super::RegistryError;
use crate::reference::DOCKER_HUB;

/// A password or token. Never printed: `Debug` shows `<redacted>`, there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The secret itself, to put into a request header. Keep the result out of logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What the client presents to a registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    #[default]
    Anonymous,
    /// A username and password (or a personal access token used as one).
    Basic { username: String, password: Secret },
    /// An OAuth2 refresh token (Docker's `identitytoken`), exchanged at the token realm.
    IdentityToken(Secret),
}

impl Credentials {
    pub fn basic(username: impl Into<String>, password: Secret) -> Self {
        Credentials::Basic {
            username: username.into(),
            password,
        }
    }

    /// The username, for error messages (never the password).
    pub fn username(&self) -> Option<&str> {
        match self {
            Credentials::Basic { username, .. } => Some(username),
            _ => None,
        }
    }

    /// The `Authorization: Basic …` value, if these are basic credentials.
    pub(crate) fn basic_header(&self) -> Option<String> {
        match self {
            Credentials::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{username}:{}", password.expose()))
            )),
            _ => None,
        }
    }
}

/// The Docker config file this process would use.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

#[derive(Debug, Default, serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The keys a registry may be stored under in a Docker config (Docker Hub has several).
fn config_keys(registry: &str) -> Vec<String> {
    if registry == DOCKER_HUB {
        vec![
            "https://index.docker.io/v1/".to_string(),
            "index.docker.io".to_string(),
            "docker.io".to_string(),
            "registry-1.docker.io".to_string(),
        ]
    } else {
        vec![registry.to_string()]
    }
}

/// `https://host:port/v1/` -> `host:port`, as Docker matches `auths` keys.
fn normalise_key(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// Credentials for `registry` from the Docker config at `path` (anonymous when the file
/// does not exist or names nothing for this registry).
pub fn from_docker_config(path: &Path, registry: &str) -> Result<Credentials, RegistryError> {
    from_docker_config_with_helpers(path, registry, None)
}

/// [`from_docker_config`], looking for credential helpers in `helper_dir` (else `PATH`).
fn from_docker_config_with_helpers(
    path: &Path,
    registry: &str,
    helper_dir: Option<&Path>,
) -> Result<Credentials, RegistryError> {
    let bytes = match fs_err::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::Anonymous),
        Err(source) => {
            return Err(RegistryError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let config: DockerConfig =
        serde_json::from_slice(&bytes).map_err(|source| RegistryError::DockerConfig {
            path: path.to_path_buf(),
            detail: source.to_string(),
        })?;
    let keys = config_keys(registry);
    let helper = keys
        .iter()
        .find_map(|key| config.cred_helpers.get(key))
        .or(config.creds_store.as_ref());
    if let Some(helper) = helper {
        let server = if registry == DOCKER_HUB {
            "https://index.docker.io/v1/"
        } else {
            registry
        };
        if let Some(credentials) = run_credential_helper(helper, server, helper_dir)? {
            return Ok(credentials);
        }
    }
    let entry = config.auths.iter().find_map(|(key, entry)| {
        keys.iter()
            .any(|wanted| normalise_key(key) == normalise_key(wanted))
            .then_some(entry)
    });
    let Some(entry) = entry else {
        return Ok(Credentials::Anonymous);
    };
    if let Some(token) = entry.identity_token.as_deref().filter(|t| !t.is_empty()) {
        return Ok(Credentials::IdentityToken(Secret::new(token)));
    }
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let bad = |detail: &str| RegistryError::DockerConfig {
            path: path.to_path_buf(),
            detail: format!("the `auth` entry for `{registry}` {detail}"),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad("is not base64"))?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad("is not UTF-8"))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| bad("is not `username:password`"))?;
        return Ok(Credentials::basic(username, Secret::new(password)));
    }
    match (&entry.username, &entry.password) {
        (Some(username), Some(password)) => Ok(Credentials::basic(
            username.clone(),
            Secret::new(password.clone()),
        )),
        _ => Ok(Credentials::Anonymous),
    }
}

#[derive(serde::Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username")]
    username: String,
    #[serde(rename = "Secret")]
    secret: String,
}

/// Ask `docker-credential-HELPER get` for `server`. `None` when it has nothing for it.
fn run_credential_helper(
    helper: &str,
    server: &str,
    helper_dir: Option<&Path>,
) -> Result<Option<Credentials>, RegistryError> {
    let name = format!("docker-credential-{helper}");
    let program = match helper_dir {
        Some(dir) => dir.join(&name).display().to_string(),
        None => name,
    };
    let failed = |detail: String| RegistryError::CredentialHelper {
        helper: program.clone(),
        detail,
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot run it: {e}")))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(server.as_bytes())
        .map_err(|e| failed(format!("cannot write to it: {e}")))?;
    let output = child
        .wait_with_output()
        .map_err(|e| failed(format!("it did not finish: {e}")))?;
    if !output.status.success() {
        let stdout = String::from_utf8_lossy(&output.stdout);
        // Docker's helpers say this (on stdout) for a registry they hold nothing for.
        if stdout.contains("credentials not found") {
            return Ok(None);
        }
        return Err(failed(format!(
            "it exited with {} (its stderr: {})",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    // The answer holds the secret: on a parse failure, say so without quoting it.
    let answer: HelperAnswer = serde_json::from_slice(&output.stdout)
        .map_err(|_| failed("its answer is not the JSON {Username, Secret}".to_string()))?;
    Ok(Some(if answer.username == "<token>" {
        Credentials::IdentityToken(Secret::new(answer.secret))
    } else {
        Credentials::basic(answer.username, Secret::new(answer.secret))
    }))
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// Parse the header value. `None` for schemes the client cannot answer.
    pub fn parse(value: &str) -> Option<Challenge> {
        let value = value.trim();
        let (scheme, params) = value.split_once(' ').unwrap_or((value, ""));
        let params = parse_auth_params(params);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => Some(Challenge::Basic),
            "bearer" => Some(Challenge::Bearer {
                realm: params.get("realm")?.clone(),
                service: params.get("service").cloned(),
                scope: params.get("scope").cloned(),
            }),
            _ => None,
        }
    }
}

/// `a="x, y",b=z` -> {a: "x, y", b: "z"}; keys lowercased.
fn parse_auth_params(text: &str) -> BTreeMap<String, String> {
    let mut params = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() || chars.next() != Some('=') {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted() {
        let credentials = Credentials::basic("alice", Secret::new("hunter2"));
        let debug = format!("{credentials:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("alice"));
        assert_eq!(
            credentials.basic_header().unwrap(),
            "Basic YWxpY2U6aHVudGVyMg=="
        );
    }

    #[test]
    fn challenges_parse() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".to_string(),
                service: Some("registry.docker.io".to_string()),
                scope: Some("repository:library/ubuntu:pull,push".to_string()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
        assert_eq!(Challenge::parse("Bearer service=x"), None);
    }

    #[test]
    fn docker_config_auths_and_hub_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "bob:s3cr:et" in base64: a password may contain ':'.
        std::fs::write(
            &path,
            r#"{"auths":{"https://index.docker.io/v1/":{"auth":"Ym9iOnMzY3I6ZXQ="},
                "http://127.0.0.1:5000":{"auth":"Ym9iOnMzY3I6ZXQ="},
                "ghcr.io":{"identitytoken":"refresh"}}}"#,
        )
        .unwrap();
        let hub = from_docker_config(&path, "docker.io").unwrap();
        assert_eq!(hub, Credentials::basic("bob", Secret::new("s3cr:et")));
        let local = from_docker_config(&path, "127.0.0.1:5000").unwrap();
        assert_eq!(local.username(), Some("bob"));
        assert!(matches!(
            from_docker_config(&path, "ghcr.io").unwrap(),
            Credentials::IdentityToken(_)
        ));
        assert_eq!(
            from_docker_config(&path, "quay.io").unwrap(),
            Credentials::Anonymous
        );
        assert_eq!(
            from_docker_config(&dir.path().join("none.json"), "quay.io").unwrap(),
            Credentials::Anonymous
        );
        std::fs::write(&path, r#"{"auths":{"quay.io":{"auth":"!!"}}}"#).unwrap();
        let error = from_docker_config(&path, "quay.io")
            .unwrap_err()
            .to_string();
        assert!(error.contains("not base64"), "{error}");
    }

    #[test]
    fn credential_helpers_are_run() {
        let dir = tempfile::tempdir().unwrap();
        let helper = dir.path().join("docker-credential-cudastacktest");
        std::fs::write(
            &helper,
            "#!/bin/sh\nread server\nif [ \"$server\" = reg.example ]; then echo '{\"ServerURL\":\"reg.example\",\"Username\":\"carol\",\"Secret\":\"pw\"}'; else echo 'credentials not found in native keychain'; exit 1; fi\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"credHelpers":{"reg.example":"cudastacktest","other.example":"cudastacktest"}}"#,
        )
        .unwrap();
        let helpers = Some(dir.path());
        assert_eq!(
            from_docker_config_with_helpers(&path, "reg.example", helpers).unwrap(),
            Credentials::basic("carol", Secret::new("pw"))
        );
        assert_eq!(
            from_docker_config_with_helpers(&path, "other.example", helpers).unwrap(),
            Credentials::Anonymous
        );
    }
}
