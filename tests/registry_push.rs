//! Push and pull against a real registry (Debian's docker-registry, distribution 2.8) on
//! 127.0.0.1, cross-checked with skopeo and, when a daemon is available, `docker pull`.

use crate::oci_support;
use crate::registry_support;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudastack::cache::BlobStore;
use cudastack::fetch::http::RetryPolicy;
use cudastack::oci;
use cudastack::registry::referrers::{list_referrers, push_referrer, ArtifactLayer, Subject};
use cudastack::registry::{
    pull, push_image, push_layout, BlobOutcome, ClientOptions, Platform, PushOptions, Reference,
    RegistryClient, OCI_MANIFEST,
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

fn client(reference: &Reference) -> RegistryClient {
    RegistryClient::new(reference, ClientOptions::default()).unwrap()
}

fn skopeo_digest(reference: &str) -> Option<String> {
    if !have("skopeo") {
        gate::skip(
            "skopeo",
            "skopeo is not installed: its cross-check is skipped",
        );
        return None;
    }
    let output =
        oci_support::run(Command::new("skopeo").args(["inspect", "--tls-verify=false", reference]));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    Some(value["Digest"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_then_skopeo_docker_and_our_pull_agree() {
    require_registry!();
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let base = random_layer(&store, "base", 1, 3 << 20);
    let app = random_layer(&store, "app", 2, 2 << 20);
    let image = image_of(&[base.clone(), app.clone()], "a");
    let layout = work.path().join("layout");
    let digest = oci::layout::write(&image, &layout, "latest").unwrap();

    let reference: Reference = format!("{}/cudastack/test:a", registry.host())
        .parse()
        .unwrap();
    let client = client(&reference);
    let report = push_layout(
        &client,
        &layout,
        "latest",
        &reference,
        &PushOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.manifest_digest, digest);
    assert_eq!(report.blobs.len(), 3);
    assert!(
        report
            .blobs
            .iter()
            .all(|b| b.outcome == BlobOutcome::Uploaded),
        "{report:?}"
    );
    let total: u64 = report.blobs.iter().map(|b| b.size).sum();
    assert_eq!(report.bytes_uploaded, total);

    // Peers see the same manifest digest.
    if let Some(found) = skopeo_digest(&format!("docker://{reference}")) {
        assert_eq!(found, digest.to_string());
    }
    match oci_support::docker() {
        Ok(()) => {
            let _cleanup = oci_support::DockerCleanup(vec![reference.to_string()]);
            oci_support::run(Command::new("docker").args(["pull", &reference.to_string()]));
            let output = oci_support::run(Command::new("docker").args([
                "image",
                "inspect",
                "--format",
                "{{json .RepoDigests}}",
                &reference.to_string(),
            ]));
            let repo_digests = String::from_utf8_lossy(&output.stdout).to_string();
            assert!(
                repo_digests.contains(&format!("cudastack/test@{digest}")),
                "{repo_digests}"
            );
        }
        Err(reason) => gate::skip("docker", format!("docker cross-check skipped: {reason}")),
    }

    // Pushing the same image again (from the value, not the layout) sends no blob.
    let again = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap();
    assert_eq!(again.manifest_digest, digest);
    assert_eq!(again.bytes_uploaded, 0);
    assert!(again
        .blobs
        .iter()
        .all(|b| b.outcome == BlobOutcome::Present));

    // Pull it back into an empty cache and a new layout.
    let store2 = BlobStore::open(work.path().join("cache2")).unwrap();
    let pulled_dir = work.path().join("pulled");
    let pulled = pull(
        &client,
        &reference,
        &Platform::default(),
        &store2,
        &pulled_dir,
        "pulled",
    )
    .await
    .unwrap();
    assert_eq!(pulled.manifest_digest, digest);
    assert_eq!(pulled.bytes_downloaded, base.size + app.size);
    let back = oci::layout::read(&pulled_dir, "pulled").unwrap();
    let digests: Vec<_> = back.layers().iter().map(|l| l.digest).collect();
    assert_eq!(digests, [base.digest, app.digest]);
    if let Some(found) = skopeo_digest(&format!("oci:{}:pulled", pulled_dir.display())) {
        assert_eq!(found, digest.to_string());
    }
    // By digest, into the same cache: nothing is downloaded again.
    let by_digest = pull(
        &client,
        &reference.with_digest(digest),
        &Platform::default(),
        &store2,
        &pulled_dir,
        "by-digest",
    )
    .await
    .unwrap();
    assert_eq!(by_digest.bytes_downloaded, 0);
    assert!(by_digest.blobs.iter().all(|b| b.cached));

    // The generic calls the verify stage uses.
    let manifest = client.get_manifest(&reference).await.unwrap();
    assert_eq!(
        (manifest.digest, manifest.media_type.as_str()),
        (digest, OCI_MANIFEST)
    );
    let config = image.documents().unwrap().config;
    let bytes = client
        .get_blob_bytes("cudastack/test", &config.digest, 1 << 20)
        .await
        .unwrap();
    assert_eq!(&bytes[..], &config.bytes[..]);
    let too_small = client
        .get_blob_bytes("cudastack/test", &config.digest, 10)
        .await
        .unwrap_err();
    assert!(
        too_small.to_string().contains("larger than the 10 bytes"),
        "{too_small}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_image_uploads_only_its_new_layers() {
    require_registry!();
    let registry = Registry::start(None);
    // The proxy counts the blob bytes that really reach the registry.
    let proxy = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let base = random_layer(&store, "base", 11, 3 << 20);
    let cuda = random_layer(&store, "cuda", 12, 2 << 20);
    let first_app = random_layer(&store, "app1", 13, 1 << 20);
    let second_app = random_layer(&store, "app2", 14, 1 << 20);
    let first = image_of(&[base.clone(), cuda.clone(), first_app], "one");
    let second = image_of(&[base.clone(), cuda.clone(), second_app.clone()], "two");

    let one: Reference = format!("{}/stack/one:v1", proxy.host()).parse().unwrap();
    let client = client(&one);
    push_image(&client, &first, &one, &PushOptions::default())
        .await
        .unwrap();

    // Another repository of the same registry: the shared layers are mounted.
    let before = proxy.upload_bytes.load(Ordering::SeqCst);
    let two: Reference = format!("{}/stack/two:v1", proxy.host()).parse().unwrap();
    let options = PushOptions {
        mount_from: vec!["stack/one".to_string()],
        ..PushOptions::default()
    };
    let report = push_image(&client, &second, &two, &options).await.unwrap();
    let outcome = |digest| {
        report
            .blobs
            .iter()
            .find(|b| b.digest == digest)
            .unwrap()
            .outcome
    };
    assert_eq!(outcome(base.digest), BlobOutcome::Mounted);
    assert_eq!(outcome(cuda.digest), BlobOutcome::Mounted);
    assert_eq!(outcome(second_app.digest), BlobOutcome::Uploaded);
    let config_size = second.documents().unwrap().config.size();
    let sent = proxy.upload_bytes.load(Ordering::SeqCst) - before;
    assert_eq!(sent, second_app.size + config_size);
    assert_eq!(report.bytes_uploaded, sent);

    // The same repository: the shared layers are present, nothing but the new layer goes.
    let before = proxy.upload_bytes.load(Ordering::SeqCst);
    let one_v2 = one.with_tag("v2").unwrap();
    let report = push_image(&client, &second, &one_v2, &PushOptions::default())
        .await
        .unwrap();
    let present = report
        .blobs
        .iter()
        .filter(|b| b.outcome == BlobOutcome::Present)
        .count();
    assert_eq!(present, 2, "{report:?}");
    let sent = proxy.upload_bytes.load(Ordering::SeqCst) - before;
    assert_eq!(sent, second_app.size + config_size);
    if let Some(found) = skopeo_digest(&format!("docker://{}/stack/one:v2", registry.host())) {
        assert_eq!(found, second.digest().unwrap().to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_resumes_after_the_registry_is_killed_mid_upload() {
    require_registry!();
    let registry = Registry::start(None);
    // The proxy SIGKILLs the registry when the 4th 1 MiB chunk of the layer starts (so the
    // first 3 MiB are in the registry's upload session on disk), drops that request, and
    // starts the registry again on the same storage a second later.
    let patches = Arc::new(AtomicU32::new(0));
    let hook_registry = registry.clone();
    let hook_patches = patches.clone();
    let proxy = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            if head.method == "PATCH" && hook_patches.fetch_add(1, Ordering::SeqCst) + 1 == 4 {
                hook_registry.kill();
                let restart = hook_registry.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(1));
                    restart.spawn();
                });
                return Action::Drop;
            }
            Action::Forward
        }),
    );
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let big = random_layer(&store, "big", 21, 6 << 20);
    let image = image_of(std::slice::from_ref(&big), "resume");
    let reference: Reference = format!("{}/stack/resume:v1", proxy.host()).parse().unwrap();
    let client = client(&reference);
    let options = PushOptions {
        chunk_size: 1 << 20,
        parallel: 1,
        ..PushOptions::default()
    };
    let report = push_image(&client, &image, &reference, &options)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nregistry log:\n{}", registry.log()));
    let layer = report
        .blobs
        .iter()
        .find(|b| b.digest == big.digest)
        .unwrap();
    assert_eq!(layer.outcome, BlobOutcome::Resumed, "{report:?}");
    assert!(patches.load(Ordering::SeqCst) > 4);
    // Every byte reached the registry exactly once: the first 3 MiB were not sent again.
    let config_size = image.documents().unwrap().config.size();
    assert_eq!(
        proxy.upload_bytes.load(Ordering::SeqCst),
        big.size + config_size
    );
    // The registry holds the image under the digest computed here, and its layer is whole
    // (pull verifies every digest).
    let digest = image.digest().unwrap();
    assert_eq!(
        client.get_manifest(&reference).await.unwrap().digest,
        digest
    );
    let store2 = BlobStore::open(work.path().join("cache2")).unwrap();
    let pulled = pull(
        &client,
        &reference,
        &Platform::default(),
        &store2,
        &work.path().join("pulled"),
        "latest",
    )
    .await
    .unwrap();
    assert_eq!(pulled.manifest_digest, digest);
    drop(proxy);
    registry.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_chunk_still_completes_the_push() {
    require_registry!();
    let registry = Registry::start(None);
    // The 3rd chunk's connection is cut after half of its bytes reached the registry. The
    // session then holds more than its last acknowledged offset; distribution 2.8 refuses
    // to resume such a session, so the client must notice and start the blob over.
    let patches = Arc::new(AtomicU32::new(0));
    let hook_patches = patches.clone();
    let proxy = Proxy::start(
        registry.port,
        Arc::new(move |head| {
            if head.method == "PATCH" && hook_patches.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                return Action::ForwardCut(512 << 10);
            }
            Action::Forward
        }),
    );
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let big = random_layer(&store, "cut", 71, 4 << 20);
    let image = image_of(std::slice::from_ref(&big), "cut");
    let reference: Reference = format!("{}/stack/cut:v1", proxy.host()).parse().unwrap();
    let client = client(&reference);
    let options = PushOptions {
        chunk_size: 1 << 20,
        parallel: 1,
        ..PushOptions::default()
    };
    let report = push_image(&client, &image, &reference, &options)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\nregistry log:\n{}", registry.log()));
    let layer = report
        .blobs
        .iter()
        .find(|b| b.digest == big.digest)
        .unwrap();
    assert_eq!(layer.outcome, BlobOutcome::Uploaded, "{report:?}");
    // 2 MiB acknowledged + 0.5 MiB cut, then the whole blob again.
    let config_size = image.documents().unwrap().config.size();
    assert_eq!(
        proxy.upload_bytes.load(Ordering::SeqCst),
        (2 << 20) + (512 << 10) + big.size + config_size
    );
    let pulled = pull(
        &client,
        &reference,
        &Platform::default(),
        &BlobStore::open(work.path().join("cache2")).unwrap(),
        &work.path().join("pulled"),
        "latest",
    )
    .await
    .unwrap();
    assert_eq!(pulled.manifest_digest, image.digest().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_failing_blob_puts_gets_retries_then_a_precise_error() {
    require_registry!();
    let registry = Registry::start(None);
    let proxy = Proxy::start(
        registry.port,
        Arc::new(|head| {
            if head.method == "PUT" && head.is_blob_upload() {
                return Action::Respond {
                    status: 500,
                    headers: vec![("Content-Type".to_string(), "application/json".to_string())],
                    body:
                        br#"{"errors":[{"code":"UNKNOWN","message":"injected storage failure"}]}"#
                            .to_vec(),
                };
            }
            Action::Forward
        }),
    );
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let layer = random_layer(&store, "l", 31, 256 << 10);
    let image = image_of(std::slice::from_ref(&layer), "fail");
    let reference: Reference = format!("{}/stack/fail:v1", proxy.host()).parse().unwrap();
    let client = RegistryClient::new(
        &reference,
        ClientOptions {
            retry: RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(100),
            },
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let options = PushOptions {
        parallel: 1,
        ..PushOptions::default()
    };
    let error = push_image(&client, &image, &reference, &options)
        .await
        .unwrap_err();
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(&format!("\n  Caused by: {cause}"));
        source = cause.source();
    }
    let first = format!(
        "Failed to upload blob {} ({} bytes)",
        layer.digest, layer.size
    );
    for expected in [
        first.as_str(),
        "stack/fail",
        "PUT `http://127.0.0.1:",
        "HTTP 500 Internal Server Error",
        "injected storage failure",
        "after 3 attempts",
    ] {
        assert!(
            chain.contains(expected),
            "missing {expected:?} in:\n{chain}"
        );
    }
    let puts = proxy
        .requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains("/blobs/uploads/"))
        .count();
    assert_eq!(puts, 3, "{:?}", proxy.requests());
    // No manifest was pushed for an image whose blobs failed.
    assert!(matches!(
        client.get_manifest(&reference).await,
        Err(cudastack::registry::RegistryError::ManifestNotFound { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referrers_use_the_fallback_tag_on_a_registry_without_the_api() {
    require_registry!();
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = image_of(&[random_layer(&store, "x", 41, 64 << 10)], "ref");
    let reference: Reference = format!("{}/stack/verified:v1", registry.host())
        .parse()
        .unwrap();
    let client = client(&reference);
    let pushed = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap();
    let manifest = image.documents().unwrap().manifest;
    let subject = Subject {
        media_type: OCI_MANIFEST.to_string(),
        digest: pushed.manifest_digest,
        size: manifest.size(),
    };
    let kind = "application/vnd.cudastack.verification.v1+json";
    for gpu in ["A100", "RTX 4090"] {
        let report = push_referrer(
            &client,
            &reference,
            &subject,
            kind,
            vec![ArtifactLayer {
                media_type: "application/json".to_string(),
                bytes: format!(r#"{{"gpu":"{gpu}","result":"pass"}}"#).into(),
                annotations: Default::default(),
            }],
            [("io.cudastack.gpu".to_string(), gpu.to_string())].into(),
        )
        .await
        .unwrap();
        assert_eq!(
            report.fallback_tag.as_deref(),
            Some(format!("sha256-{}", pushed.manifest_digest.hex()).as_str())
        );
    }
    let referrers = list_referrers(&client, &reference, &pushed.manifest_digest)
        .await
        .unwrap();
    assert_eq!(referrers.len(), 2, "{referrers:?}");
    assert!(referrers.iter().all(|r| r["artifactType"] == kind));
    let gpus: Vec<_> = referrers
        .iter()
        .map(|r| r["annotations"]["io.cudastack.gpu"].as_str().unwrap())
        .collect();
    assert_eq!(gpus, ["A100", "RTX 4090"]);
    // The image itself is untouched.
    assert_eq!(
        client.get_manifest(&reference).await.unwrap().digest,
        pushed.manifest_digest
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_platform_index_push_and_platform_pull() {
    require_registry!();
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let amd64 = image_of(&[random_layer(&store, "amd", 81, 128 << 10)], "amd64");
    let arm64 = image_of(&[random_layer(&store, "arm", 82, 128 << 10)], "arm64")
        .with_platform(oci_spec::image::Arch::ARM64, oci_spec::image::Os::Linux);
    // A layout holding both images and an index over them named "multi".
    let layout = work.path().join("layout");
    let amd64_digest = oci::layout::write(&amd64, &layout, "amd64").unwrap();
    let arm64_digest = oci::layout::write(&arm64, &layout, "arm64").unwrap();
    let entry = |digest: cudastack::digest::Digest, size: u64, arch: &str| {
        serde_json::json!({"mediaType": OCI_MANIFEST, "digest": digest.to_string(), "size": size,
            "platform": {"os": "linux", "architecture": arch}})
    };
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": cudastack::registry::OCI_INDEX,
    "manifests": [
        entry(amd64_digest, amd64.documents().unwrap().manifest.size(), "amd64"),
        entry(arm64_digest, arm64.documents().unwrap().manifest.size(), "arm64"),
    ]});
    let index_bytes = serde_json::to_vec(&index).unwrap();
    let index_digest = cudastack::digest::Digest::of_bytes(&index_bytes);
    std::fs::write(oci::layout::blob_path(&layout, &index_digest), &index_bytes).unwrap();
    let mut top: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    top["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
        "mediaType": cudastack::registry::OCI_INDEX, "digest": index_digest.to_string(),
        "size": index_bytes.len(), "annotations": {"org.opencontainers.image.ref.name": "multi"}}));
    std::fs::write(layout.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();

    let reference: Reference = format!("{}/stack/multi:v1", registry.host())
        .parse()
        .unwrap();
    let client = client(&reference);
    let report = push_layout(
        &client,
        &layout,
        "multi",
        &reference,
        &PushOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(report.manifest_digest, index_digest);
    assert_eq!(report.blobs.len(), 4);
    let manifest = client.get_manifest(&reference).await.unwrap();
    assert!(manifest.is_index());
    assert_eq!(manifest.digest, index_digest);

    for (platform, expected) in [("linux/amd64", amd64_digest), ("linux/arm64", arm64_digest)] {
        let platform: Platform = platform.parse().unwrap();
        let resolved = client
            .get_image_manifest(&reference, &platform)
            .await
            .unwrap();
        assert_eq!(resolved.digest, expected);
        let pulled = pull(
            &client,
            &reference,
            &platform,
            &store,
            &work.path().join("pulled"),
            &platform.architecture,
        )
        .await
        .unwrap();
        assert_eq!(pulled.manifest_digest, expected);
    }
    let error = client
        .get_image_manifest(&reference, &"linux/s390x".parse().unwrap())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("no image for linux/s390x") && text.contains("linux/amd64, linux/arm64"),
        "{text}"
    );
}
