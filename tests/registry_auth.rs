//! Registry authentication against real servers: docker-registry with htpasswd (basic),
//! and a bearer-token flow. For the token flow, the token service and the check of
//! `Authorization: Bearer` are done by the test proxy (registry_support::Proxy) in front
//! of an open docker-registry: docker-registry's own token auth needs a signing
//! certificate chain and a JWT issuer, which this fixture stands in for. The proxy issues
//! opaque tokens per scope, checks each request's repository and action against the
//! token's scopes, and answers 401 with a `WWW-Authenticate: Bearer realm=…,service=…,
//! scope=…` challenge otherwise, as the distribution token spec describes.

use crate::registry_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use assert_cmd::Command;
use base64::Engine as _;
use cudastack::cache::BlobStore;
use cudastack::oci;
use cudastack::registry::{
    pull, push_image, ClientOptions, Credentials, Platform, PushOptions, Reference, RegistryClient,
    RegistryError, Secret,
};
use registry_support::*;

const PASSWORD: &str = "correct-horse-battery";
const WRONG: &str = "wrong-password-123";

macro_rules! require_registry {
    () => {
        if let Some(reason) = skip_reason() {
            reason.report();
            return;
        }
    };
}

fn options(credentials: Credentials) -> ClientOptions {
    ClientOptions {
        credentials,
        ..ClientOptions::default()
    }
}

fn full_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!("\n  Caused by: {cause}"));
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_with_htpasswd() {
    require_registry!();
    let registry = Registry::start(Some(("alice", PASSWORD)));
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = image_of(&[random_layer(&store, "a", 51, 512 << 10)], "basic");
    let reference: Reference = format!("{}/private/app:v1", registry.host())
        .parse()
        .unwrap();

    // Good credentials: push and read back.
    let good = RegistryClient::new(
        &reference,
        options(Credentials::basic("alice", Secret::new(PASSWORD))),
    )
    .unwrap();
    let report = push_image(&good, &image, &reference, &PushOptions::default())
        .await
        .unwrap();
    assert_eq!(report.manifest_digest, image.digest().unwrap());
    assert_eq!(
        good.get_manifest(&reference).await.unwrap().digest,
        report.manifest_digest
    );

    // Wrong password: a clear error naming the user and registry, never the password.
    let wrong_options = options(Credentials::basic("alice", Secret::new(WRONG)));
    assert!(!format!("{wrong_options:?}").contains(WRONG));
    let wrong = RegistryClient::new(&reference, wrong_options).unwrap();
    assert!(!format!("{wrong:?}").contains(WRONG));
    let error = wrong.get_manifest(&reference).await.unwrap_err();
    assert!(
        matches!(error, RegistryError::Unauthorized { .. }),
        "{error:?}"
    );
    let text = full_chain(&error);
    assert!(text.contains("Authentication to `127.0.0.1:"), "{text}");
    assert!(text.contains("for user `alice`"), "{text}");
    assert!(!text.contains(WRONG) && !format!("{error:?}").contains(WRONG));
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("alice:{WRONG}"));
    assert!(!text.contains(&encoded) && !format!("{error:?}").contains(&encoded));

    // No credentials: says that some are needed and how to give them.
    let anonymous = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let error = anonymous.get_manifest(&reference).await.unwrap_err();
    assert!(
        matches!(error, RegistryError::AuthRequired { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("--password-stdin"), "{error}");

    // The CLI: wrong password on stdin -> exit 2, a clear message, no secret on either stream.
    let layout = work.path().join("layout");
    oci::layout::write(&image, &layout, "latest").unwrap();
    let home = work.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let cli = |password_stdin: Option<&str>| {
        let mut command = Command::cargo_bin("cudastack").unwrap();
        command
            .env("HOME", &home)
            .env_remove("DOCKER_CONFIG")
            .env_remove("CUDASTACK_REGISTRY_PASSWORD")
            .env("CUDASTACK_CACHE_DIR", work.path().join("cli-cache"));
        if let Some(password) = password_stdin {
            command.write_stdin(format!("{password}\n"));
        }
        command
    };
    let target = format!("{}/private/cli:v1", registry.host());
    let output = cli(Some(WRONG))
        .args(["push", layout.to_str().unwrap(), &target])
        .args(["--username", "alice", "--password-stdin"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Authentication to"), "{stderr}");
    assert!(
        !stderr.contains(WRONG) && !stdout.contains(WRONG),
        "{stderr}"
    );
    // The right one, from a Docker config as `docker login` writes it.
    std::fs::create_dir_all(home.join(".docker")).unwrap();
    std::fs::write(
        home.join(".docker/config.json"),
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{}"}}}}}}"#,
            registry.host(),
            base64::engine::general_purpose::STANDARD.encode(format!("alice:{PASSWORD}"))
        ),
    )
    .unwrap();
    let output = cli(None)
        .args(["push", layout.to_str().unwrap(), &target, "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["manifest_digest"],
        image.digest().unwrap().to_string()
    );
    // And pull it back with the CLI.
    let pulled = work.path().join("pulled");
    let output = cli(None)
        .args(["pull", &target, "--layout", pulled.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with(&image.digest().unwrap().to_string()),
        "{stdout}"
    );
    assert_eq!(oci::layout::read(&pulled, "v1").unwrap().layers().len(), 1);
}

/// The token fixture's state: tokens issued and the scopes each grants.
#[derive(Default)]
struct TokenService {
    issued: Mutex<HashMap<String, Vec<String>>>,
    requests: AtomicU32,
}

fn bearer_hook(service: Arc<TokenService>, port: Arc<OnceLock<u16>>) -> Hook {
    Arc::new(move |head: &RequestHead| {
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("bob:{PASSWORD}"))
        );
        if let Some(query) = head.target.strip_prefix("/token?") {
            service.requests.fetch_add(1, Ordering::SeqCst);
            if head.header("authorization") != Some(expected.as_str()) {
                return Action::Respond {
                    status: 401,
                    headers: vec![],
                    body: br#"{"details":"incorrect username or password"}"#.to_vec(),
                };
            }
            let scopes: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
                .filter(|(k, _)| k == "scope")
                .map(|(_, v)| v.to_string())
                .collect();
            let mut issued = service.issued.lock().unwrap();
            let token = format!("token-{}", issued.len() + 1);
            issued.insert(token.clone(), scopes);
            return Action::Respond {
                status: 200,
                headers: vec![("Content-Type".to_string(), "application/json".to_string())],
                body: format!(r#"{{"token":"{token}","expires_in":300}}"#).into_bytes(),
            };
        }
        // /v2/<repository>/(blobs|manifests)/... needs a token for that repository and action.
        let path = head.target.split('?').next().unwrap_or_default();
        let repository = path.strip_prefix("/v2/").and_then(|rest| {
            ["/blobs/", "/manifests/"]
                .iter()
                .find_map(|marker| rest.find(marker).map(|i| rest[..i].to_string()))
        });
        let action = if head.method == "GET" || head.method == "HEAD" {
            "pull"
        } else {
            "push"
        };
        let granted = head
            .header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|token| service.issued.lock().unwrap().get(token).cloned());
        let allowed = match (&granted, &repository) {
            (Some(_), None) => true,
            (Some(scopes), Some(repository)) => scopes.iter().any(|scope| {
                scope
                    .strip_prefix(&format!("repository:{repository}:"))
                    .is_some_and(|actions| actions.split(',').any(|a| a == action))
            }),
            (None, _) => false,
        };
        if allowed {
            return Action::ForwardWithoutAuth;
        }
        let mut challenge = format!(
            r#"Bearer realm="http://127.0.0.1:{}/token",service="cudastack-test""#,
            port.get().unwrap()
        );
        if let Some(repository) = repository {
            challenge.push_str(&format!(r#",scope="repository:{repository}:pull,push""#));
        }
        Action::Respond {
            status: 401,
            headers: vec![("WWW-Authenticate".to_string(), challenge)],
            body: br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                .to_vec(),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_flow_with_cached_tokens() {
    require_registry!();
    let registry = Registry::start(None);
    let service = Arc::new(TokenService::default());
    let port = Arc::new(OnceLock::new());
    let proxy = Proxy::start(registry.port, bearer_hook(service.clone(), port.clone()));
    port.set(proxy.port).unwrap();

    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let base = random_layer(&store, "base", 61, 1 << 20);
    let image = image_of(
        &[base.clone(), random_layer(&store, "app", 62, 256 << 10)],
        "bearer",
    );
    let reference: Reference = format!("{}/team/app:v1", proxy.host()).parse().unwrap();
    let client = RegistryClient::new(
        &reference,
        options(Credentials::basic("bob", Secret::new(PASSWORD))),
    )
    .unwrap();
    let report = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap();
    assert_eq!(report.manifest_digest, image.digest().unwrap());
    // One token per scope set (pull; pull,push), reused for every blob and the manifest.
    let after_push = service.requests.load(Ordering::SeqCst);
    assert!(after_push <= 2, "{after_push} token requests");
    let pulled = pull(
        &client,
        &reference,
        &Platform::default(),
        &BlobStore::open(work.path().join("cache2")).unwrap(),
        &work.path().join("pulled"),
        "v1",
    )
    .await
    .unwrap();
    assert_eq!(pulled.manifest_digest, report.manifest_digest);
    assert_eq!(service.requests.load(Ordering::SeqCst), after_push);

    // A mount from another repository needs a token covering both (the challenge says so).
    let other: Reference = format!("{}/team/other:v1", proxy.host()).parse().unwrap();
    let second = image_of(std::slice::from_ref(&base), "bearer-2");
    let mounted = push_image(
        &client,
        &second,
        &other,
        &PushOptions {
            mount_from: vec!["team/app".to_string()],
            ..PushOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        mounted.blobs[0].outcome,
        cudastack::registry::BlobOutcome::Mounted
    );

    // Wrong password at the token service: a clear error, no secret.
    let wrong = RegistryClient::new(
        &reference,
        options(Credentials::basic("bob", Secret::new(WRONG))),
    )
    .unwrap();
    let error = wrong.get_manifest(&reference).await.unwrap_err();
    let text = full_chain(&error);
    assert!(
        matches!(error, RegistryError::Unauthorized { .. }),
        "{text}"
    );
    assert!(
        text.contains("for user `bob`") && text.contains("/token"),
        "{text}"
    );
    assert!(!text.contains(WRONG) && !format!("{error:?}").contains(WRONG));

    // Anonymous: the token service refuses, and the error says credentials are needed.
    let anonymous = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let error = anonymous.get_manifest(&reference).await.unwrap_err();
    assert!(
        matches!(error, RegistryError::AuthRequired { .. }),
        "{error:?}"
    );
}

/// `inspect` (the documents, then the referrers) and `check` reach an authenticated
/// registry with a password given once on stdin: the password is read once per command,
/// however many requests the command makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_commands_read_the_stdin_password_once() {
    require_registry!();
    let registry = Registry::start(Some(("alice", PASSWORD)));
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = image_of(&[random_layer(&store, "s", 52, 64 << 10)], "stdin");
    let reference: Reference = format!("{}/private/inspect:v1", registry.host())
        .parse()
        .unwrap();
    let client = RegistryClient::new(
        &reference,
        options(Credentials::basic("alice", Secret::new(PASSWORD))),
    )
    .unwrap();
    let digest = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap()
        .manifest_digest;
    let home = work.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let cli = |args: &[&str]| {
        Command::cargo_bin("cudastack")
            .unwrap()
            .env("HOME", &home)
            .env_remove("DOCKER_CONFIG")
            .env_remove("CUDASTACK_REGISTRY_PASSWORD")
            .env("CUDASTACK_CACHE_DIR", work.path().join("cli-cache"))
            .args(args)
            .args(["--username", "alice", "--password-stdin"])
            .write_stdin(format!("{PASSWORD}\n"))
            .output()
            .unwrap()
    };
    let target = reference.to_string();
    let output = cli(&["inspect", &target, "--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let inspection: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        inspection["manifest_digest"],
        digest.to_string(),
        "{stderr}"
    );
    // The image declares nothing: `check` answers unknown (3), not an error (2).
    let output = cli(&["check", &target, "--driver", "550.54.14"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}
