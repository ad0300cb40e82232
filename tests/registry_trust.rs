//! What a registry reference may make the client do (issue 16), against real peers on
//! 127.0.0.1: a pinned digest is a promise checked before anything is uploaded, and a
//! registry that does not answer at all fails at once instead of after 45 s of silence.

use crate::registry_support;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::oci;
use cudastack::registry::{
    push_image, ClientOptions, PushOptions, Reference, RegistryClient, RegistryError,
};
use registry_support::*;

macro_rules! require_registry {
    () => {
        if let Some(reason) = skip_reason() {
            reason.report();
            return;
        }
    };
}

fn cudastack(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .env("CUDASTACK_LOG", "warn")
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
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

/// Issue 16: a port nothing listens on was retried silently for 45 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_refusing_connections_fails_at_once() {
    let port = free_port();
    let reference: Reference = format!("127.0.0.1:{port}/stack/img:v1").parse().unwrap();
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let started = Instant::now();
    let error = client.get_manifest(&reference).await.unwrap_err();
    let elapsed = started.elapsed();
    let text = full_chain(&error);
    eprintln!("failed in {elapsed:?}:\n{text}");
    assert!(
        elapsed < Duration::from_secs(3),
        "took {elapsed:?}:\n{text}"
    );
    assert!(
        matches!(error, RegistryError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(!error.is_transient());
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && text.contains("hint:"),
        "{text}"
    );
    assert!(text.to_lowercase().contains("connection refused"), "{text}");
}

/// The same through the binary: exit 2 within seconds, the registry named, no retry lines.
#[test]
fn pull_from_a_port_nothing_listens_on_fails_fast_and_says_why() {
    let port = free_port();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let cache = work.path().join("cache");
    let started = Instant::now();
    let (code, _, stderr) = cudastack(&[
        "pull",
        &format!("127.0.0.1:{port}/stack/img:v1"),
        "--layout",
        layout.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ]);
    let elapsed = started.elapsed();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        elapsed < Duration::from_secs(5),
        "took {elapsed:?}:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "Cannot connect to the registry `127.0.0.1:{port}`"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("retrying"), "{stderr}");
}

/// A registry that answered once and then goes away (a restart) is retried, and every
/// retry is a line on stderr saying what and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_answered_before_is_retried_across_a_restart() {
    require_registry!();
    let registry = Registry::start(None);
    let reference: Reference = format!("{}/stack/img:v1", registry.host()).parse().unwrap();
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    assert!(matches!(
        client.get_manifest(&reference).await,
        Err(RegistryError::ManifestNotFound { .. })
    ));
    registry.kill();
    let restart = registry.clone();
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1200));
        restart.spawn();
    });
    let result = client.get_manifest(&reference).await;
    restarter.join().unwrap();
    assert!(
        matches!(result, Err(RegistryError::ManifestNotFound { .. })),
        "{result:?}"
    );
}

/// 503s are retried with a line on stderr per retry, naming the request and the status.
#[test]
fn every_retry_is_a_line_on_stderr() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let registry = Registry::start(None);
    let failures = Arc::new(AtomicU32::new(0));
    let hook_failures = failures.clone();
    let proxy = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            if head.target.contains("/manifests/")
                && hook_failures.fetch_add(1, Ordering::SeqCst) < 2
            {
                return Action::Respond {
                    status: 503,
                    headers: Vec::new(),
                    body: Vec::new(),
                };
            }
            Action::Forward
        }),
    );
    let work = tempfile::tempdir().unwrap();
    let (code, _, stderr) = cudastack(&[
        "pull",
        &format!("{}/stack/missing:v1", proxy.host()),
        "--layout",
        work.path().join("layout").to_str().unwrap(),
        "--cache-dir",
        work.path().join("cache").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    let retries: Vec<&str> = stderr.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retries.len(), 2, "{stderr}");
    assert!(
        retries[0].contains("GET")
            && retries[0].contains("/manifests/v1")
            && retries[0].contains("503"),
        "{stderr}"
    );
    assert!(
        stderr.contains("does not exist in the registry"),
        "{stderr}"
    );
}

fn layout_with_image(dir: &std::path::Path) -> (std::path::PathBuf, Digest, oci::Image) {
    let store = BlobStore::open(dir.join("cache")).unwrap();
    let layer = random_layer(&store, "pinned", 5, 256 << 10);
    let image = image_of(&[layer], "pinned");
    let layout = dir.join("layout");
    let digest = oci::layout::write(&image, &layout, "latest").unwrap();
    (layout, digest, image)
}

/// Issue 16: `push repo:tag@sha256:WRONG` ignored the pin and printed
/// `repo:tag@sha256:WRONG@sha256:REAL`. Now it is refused before the first request, naming
/// Expected and Found; the right pin pushes and prints one well-formed reference.
#[test]
fn push_refuses_a_pinned_digest_the_image_does_not_have() {
    require_registry!();
    let registry = Registry::start(None);
    let proxy = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let work = tempfile::tempdir().unwrap();
    let (layout, digest, _) = layout_with_image(work.path());
    let wrong = Digest::of_bytes(b"not this image");
    let cache = work.path().join("push-cache");
    let push = |reference: &str| {
        cudastack(&[
            "push",
            layout.to_str().unwrap(),
            reference,
            "--cache-dir",
            cache.to_str().unwrap(),
        ])
    };
    let (code, stdout, stderr) = push(&format!("{}/stack/pinned:v1@{wrong}", proxy.host()));
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!("Expected: {wrong}"))
            && stderr.contains(&format!("Found:    {digest}")),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(
        proxy.requests(),
        Vec::<String>::new(),
        "nothing may be sent"
    );
    assert_eq!(proxy.upload_bytes.load(Ordering::SeqCst), 0);

    let (code, stdout, stderr) = push(&format!("{}/stack/pinned:v1@{digest}", proxy.host()));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        format!("{}/stack/pinned:v1@{digest}", proxy.host())
    );
    let printed: Reference = stdout.trim_end().parse().unwrap();
    assert_eq!(printed.digest(), Some(&digest));
    assert_eq!(printed.tag(), Some("v1"));
}

/// The library refuses it too, for an image value (the digest is known up front).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_image_refuses_a_wrong_pin_before_any_request() {
    let port = free_port(); // nothing listens: any request would fail differently
    let work = tempfile::tempdir().unwrap();
    let (_, digest, image) = layout_with_image(work.path());
    let wrong = Digest::of_bytes(b"not this image");
    let reference: Reference = format!("127.0.0.1:{port}/stack/pinned:v1@{wrong}")
        .parse()
        .unwrap();
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let error = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap_err();
    match error {
        RegistryError::PinnedDigestMismatch {
            expected, found, ..
        } => {
            assert_eq!(expected, wrong);
            assert_eq!(found, digest);
        }
        other => panic!("{other:?}"),
    }
}
