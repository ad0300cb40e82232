//! Issue 21: the outputs do not wait for what they do not need. `build --load` alone
//! writes uncompressed layers (Docker stores them uncompressed anyway), an explicit
//! `--compression gzip` stays gzip, and the same recipe with the same compression gives
//! the same digest. `build --push` uploads each layer while the build goes on and pushes
//! the manifest only after the build (and its verification); a registry that fails an
//! upload fails the build with its answer, and no manifest goes up.
//!
//! The real builds use a stand-in CUDA stack on real Debian packages (root, mmdebstrap;
//! Docker for `--load`); the uploads go to Debian's real `docker-registry` on 127.0.0.1,
//! behind a proxy that counts requests or fails them.

use crate::e2e_support::{self, output_text, stand_in};
use crate::registry_support::{self, image_of, random_layer, Action, Proxy, Registry};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use cudastack::cache::BlobStore;
use cudastack::fetch::http::RetryPolicy;
use cudastack::fetch::progress::{NoReporter, Reporter};
use cudastack::layer::{BuildOptions, Compression, Entry, LayerContents, LayerPath};
use cudastack::pipeline::early_push::EarlyUploads;
use cudastack::pipeline::{PipelineError, PushSettings, PushTarget};
use cudastack::registry::{
    push_image, BlobOutcome, ClientOptions, PushOptions, Reference, RegistryClient,
};
use cudastack::stack::BuildProgress;

const OCI_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const LOAD_TAG: &str = "localhost/cudastack-test-publish:1";

/// A stand-in CUDA 12.4 recipe on bookworm, locked, in `work` (its wheels in `work/mirror`).
pub(crate) fn locked_stand_in(work: &Path, name: &str, extra: &str) -> PathBuf {
    stand_in::cuda_12_4_wheels(
        stand_in::Target::X86_64,
        &work.join("libs"),
        &work.join("mirror"),
    );
    let recipe = work.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\n{extra}")).unwrap();
    stand_in::lock(&recipe, &work.join("mirror"));
    recipe
}

/// `cudastack build --no-verify --json` of `recipe` into `layout` with `cache`, plus `args`.
pub(crate) fn build(recipe: &Path, layout: &Path, cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--mirror"])
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .arg(recipe)
        .output()
        .unwrap()
}

/// The `--json` report of a build that succeeded.
pub(crate) fn report(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", output_text(output));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: not the --json report:\n{}", output_text(output)))
}

/// The layout's one image: its layers' media types and its config's diff_ids.
fn layers_of(layout: &Path) -> (Vec<String>, Vec<String>) {
    let read = |path: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let blob = |digest: &serde_json::Value| {
        layout
            .join("blobs")
            .join(digest.as_str().unwrap().replace(':', "/"))
    };
    let index = read(layout.join("index.json"));
    let manifest = read(blob(&index["manifests"][0]["digest"]));
    let config = read(blob(&manifest["config"]["digest"]));
    let media_types = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap().to_string())
        .collect();
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    (media_types, diff_ids)
}

struct RemoveLoadedImage;
impl Drop for RemoveLoadedImage {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", LOAD_TAG])
            .output();
    }
}

#[test]
fn load_alone_builds_uncompressed_layers_that_docker_runs_and_gzip_stays_gzip() {
    if let Some(skip) = e2e_support::skip_reason(&[("docker", &["info"])]) {
        skip.report();
        return;
    }
    let _cleanup = RemoveLoadedImage;
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_stand_in(work.path(), "publish", &format!("tags: [\"{LOAD_TAG}\"]\n"));
    let cache = e2e_support::cache_dir();

    let loaded = build(
        &recipe,
        &work.path().join("load"),
        &cache,
        &["--load", "--json"],
    );
    let loaded_report = report(&loaded);
    let (media_types, diff_ids) = layers_of(&work.path().join("load"));
    assert!(
        !media_types.is_empty() && media_types.iter().all(|m| m == OCI_TAR),
        "{media_types:?}"
    );
    assert!(loaded_report["load"]["image_id"].is_string());
    let run = Command::new("docker")
        .args(["run", "--rm", LOAD_TAG, "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "ran",
        "{}",
        output_text(&run)
    );
    // The human summary says why the layers are uncompressed and how to get a layout to push.
    let human = build(&recipe, &work.path().join("human"), &cache, &["--load"]);
    let stderr = String::from_utf8_lossy(&human.stderr);
    assert!(human.status.success(), "{stderr}");
    assert!(
        stderr.contains("uncompressed (Docker stores layers uncompressed"),
        "{stderr}"
    );
    assert!(stderr.contains("`--compression gzip`"), "{stderr}");

    // Asked for gzip, `--load` gets gzip: the same tars, compressed.
    let gzip = build(
        &recipe,
        &work.path().join("gzip"),
        &cache,
        &["--compression", "gzip", "--load", "--json"],
    );
    report(&gzip);
    let (gzip_types, gzip_diff_ids) = layers_of(&work.path().join("gzip"));
    assert!(
        gzip_types.iter().all(|m| m == OCI_TAR_GZIP),
        "{gzip_types:?}"
    );
    assert_eq!(
        gzip_diff_ids, diff_ids,
        "the same tars under either compression"
    );
    // Without `--load` the default is gzip, as before.
    let plain = report(&build(
        &recipe,
        &work.path().join("plain"),
        &cache,
        &["--json"],
    ));
    assert_eq!(plain["manifest_digest"], report(&gzip)["manifest_digest"]);
}

#[test]
fn the_same_recipe_uncompressed_gives_the_same_digest_from_a_cold_cache() {
    if let Some(skip) = e2e_support::skip_reason(&[]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_stand_in(work.path(), "publish-repro", "");
    let warm = report(&build(
        &recipe,
        &work.path().join("a"),
        &e2e_support::cache_dir(),
        &["--compression", "none", "--json"],
    ));
    let cold = report(&build(
        &recipe,
        &work.path().join("b"),
        &work.path().join("cold-cache"),
        &["--compression", "none", "--json"],
    ));
    assert_eq!(warm["manifest_digest"], cold["manifest_digest"]);
    assert!(layers_of(&work.path().join("b"))
        .0
        .iter()
        .all(|m| m == OCI_TAR));
}

/// Layers that each say when they are ready, as the build does.
struct Silent;
impl BuildProgress for Silent {
    fn stage(&self, _: &str, _: &str) {}
    fn downloads(&self) -> Arc<dyn Reporter> {
        Arc::new(NoReporter)
    }
}

fn target(host: &str, repository: &str, cache: &Path) -> PushTarget {
    PushTarget {
        reference: format!("{host}/{repository}").parse().unwrap(),
        client: ClientOptions {
            retry: RetryPolicy {
                max_attempts: 2,
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(50),
            },
            ..ClientOptions::default()
        },
        settings: PushSettings::defaults(cache.to_path_buf()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_layers_go_up_at_once_and_blobs_the_registry_has_are_not_sent() {
    if let Some(skip) = registry_support::skip_reason() {
        skip.report();
        return;
    }
    let registry = Registry::start(None);
    let proxy = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let base = random_layer(&store, "base", 41, 3 << 20);
    let app = random_layer(&store, "app", 42, 1 << 20);
    // The registry has `base` already (another image pushed it).
    let other: Reference = format!("{}/team/image:old", proxy.host()).parse().unwrap();
    let client = RegistryClient::new(&other, ClientOptions::default()).unwrap();
    push_image(
        &client,
        &image_of(std::slice::from_ref(&base), "old"),
        &other,
        &PushOptions::default(),
    )
    .await
    .unwrap();
    let before = proxy
        .upload_bytes
        .load(std::sync::atomic::Ordering::Relaxed);

    let target = target(&proxy.host(), "team/image:new", work.path());
    let early = EarlyUploads::start(&target).unwrap();
    let progress = early.progress(&Silent);
    progress.layer_ready("base", &base);
    progress.layer_ready("app", &app);
    // The upload starts while "the build" goes on: no finish() needed for bytes to flow.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while proxy
        .upload_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
        - before
        < app.size
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let early_bytes = proxy
        .upload_bytes
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    assert_eq!(early_bytes, app.size, "sent before the build finished");
    drop(progress);
    let sent = early.finish().await.unwrap();
    let outcome = |digest| {
        sent.blobs
            .iter()
            .find(|b| b.digest == digest)
            .unwrap()
            .outcome
    };
    assert_eq!(
        outcome(base.digest),
        BlobOutcome::Present,
        "HEAD found it: not sent"
    );
    assert_eq!(outcome(app.digest), BlobOutcome::Uploaded);
    assert_eq!(sent.bytes, app.size);
    assert_eq!(
        proxy
            .upload_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            - before,
        app.size
    );
    // A HEAD for `base`, an upload for `app` only, and no manifest but the old image's.
    let requests = proxy.requests();
    let manifests = requests
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains("/manifests/"))
        .count();
    assert_eq!(manifests, 1, "{requests:?}");
    assert!(requests
        .iter()
        .any(|r| r.starts_with("HEAD ") && r.ends_with(&format!("/blobs/{}", base.digest))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_failing_or_dropping_an_early_upload_is_the_error_naming_the_layer() {
    if let Some(skip) = registry_support::skip_reason() {
        skip.report();
        return;
    }
    let registry = Registry::start(None);
    for (how, action) in [("500", 500u16), ("drop", 0u16)] {
        let proxy = Proxy::start(
            registry.port,
            Arc::new(move |head| {
                if head.is_blob_upload() && (head.method == "PUT" || head.method == "PATCH") {
                    return match action {
                        0 => Action::Drop,
                        status => Action::Respond {
                            status,
                            headers: vec![("Content-Type".into(), "application/json".into())],
                            body: br#"{"errors":[{"code":"UNKNOWN","message":"injected storage failure"}]}"#.to_vec(),
                        },
                    };
                }
                Action::Forward
            }),
        );
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path().join("cache")).unwrap();
        let layer = random_layer(&store, how, 50 + u64::from(action), 512 << 10);
        let target = target(&proxy.host(), "team/failing:1", work.path());
        let early = EarlyUploads::start(&target).unwrap();
        early.progress(&Silent).layer_ready("python", &layer);
        let error = early.finish().await.unwrap_err();
        assert!(
            matches!(error, PipelineError::EarlyUpload { .. }),
            "{error:?}"
        );
        let chain = error_chain(&error);
        assert!(chain.contains("Failed to upload layer `python` while the image was building, so no manifest was pushed"), "{chain}");
        assert!(chain.contains(&layer.digest.to_string()), "{chain}");
        if action == 500 {
            assert!(
                chain.contains("HTTP 500") && chain.contains("injected storage failure"),
                "{chain}"
            );
        }
        assert!(
            !proxy.requests().iter().any(|r| r.contains("/manifests/")),
            "{:?}",
            proxy.requests()
        );
    }
}

#[test]
fn push_of_a_layout_with_uncompressed_layers_works_and_warns_in_one_line() {
    if let Some(skip) = registry_support::skip_reason() {
        skip.report();
        return;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let contents = LayerContents::from_entries([Entry::file_bytes(
        LayerPath::parse("data.bin").unwrap(),
        0o644,
        vec![7u8; 256 << 10],
    )])
    .unwrap();
    let layer = cudastack::layer::build(
        &store,
        &contents,
        &BuildOptions::new(1_700_000_000, Compression::None),
    )
    .unwrap();
    let layout = work.path().join("layout");
    let digest = cudastack::oci::layout::write(
        &image_of(std::slice::from_ref(&layer), "plain"),
        &layout,
        "latest",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .arg("push")
        .arg(&layout)
        .arg(format!("{}/team/plain:1", registry.host()))
        .arg("--cache-dir")
        .arg(work.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Pushed as it is: the digest the layout (and any verification report) names.
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(&digest.to_string()),
        "{}",
        output_text(&output)
    );
    let warnings: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("1 of the image's layers")
            && warnings[0].contains("uncompressed")
            && warnings[0].contains("`--compression gzip`"),
        "{stderr}"
    );
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(&format!("\n  Caused by: {cause}"));
        source = cause.source();
    }
    chain
}

#[test]
fn build_push_uploads_layers_while_building_then_the_manifest() {
    if let Some(skip) = e2e_support::skip_reason(&[]) {
        skip.report();
        return;
    }
    if let Some(skip) = registry_support::skip_reason() {
        skip.report();
        return;
    }
    let registry = Registry::start(None);
    let proxy = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_stand_in(work.path(), "publish-push", "");
    let cache = e2e_support::cache_dir();
    let reference = format!("{}/team/publish-push:1", proxy.host());
    let pushed = report(&build(
        &recipe,
        &work.path().join("layout"),
        &cache,
        &["--push", &reference, "--json"],
    ));
    let push = &pushed["push"];
    assert_eq!(push["manifest_digest"], pushed["manifest_digest"]);
    let layers = pushed["layers"].as_array().unwrap().len();
    // Every layer went up while the build went on (a fresh registry has none of them);
    // the push stage then sent only the config and the manifest.
    assert_eq!(push["uploaded_while_building"], layers, "{push}");
    let sizes: u64 = pushed["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    let bytes = push["bytes_uploaded"].as_u64().unwrap();
    assert!(bytes > sizes, "the layers and the config: {push}");
    assert_eq!(
        bytes,
        proxy
            .upload_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        "the report counts what went on the wire"
    );
    // The image's manifest goes up after every blob of the image; only its referrers (the
    // SBOM and provenance, artifacts whose subject is that manifest) come after it.
    let requests = proxy.requests();
    let manifest = requests
        .iter()
        .position(|r| r.starts_with("PUT ") && r.ends_with("/manifests/1"))
        .unwrap();
    let image_blobs: Vec<String> = pushed["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().replace(':', "%3A"))
        .collect();
    assert!(
        !requests[manifest..]
            .iter()
            .any(|r| r.contains("/blobs/uploads/") && image_blobs.iter().any(|d| r.contains(d))),
        "{requests:?}"
    );
    assert!(
        requests[..manifest]
            .iter()
            .all(|r| !r.contains("/manifests/")),
        "{requests:?}"
    );

    // A registry that answers 500 to uploads fails the build with its answer: no manifest.
    let failing = Proxy::start(
        registry.port,
        Arc::new(|head| {
            if head.is_blob_upload() && head.method != "POST" {
                return Action::Respond {
                    status: 500,
                    headers: vec![],
                    body: b"injected storage failure".to_vec(),
                };
            }
            Action::Forward
        }),
    );
    let output = build(
        &recipe,
        &work.path().join("failing"),
        &cache,
        &["--push", &format!("{}/team/failing:1", failing.host())],
    );
    let all = output_text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(
        all.contains("while the image was building, so no manifest was pushed"),
        "{all}"
    );
    assert!(all.contains("500"), "{all}");
    assert!(
        !failing.requests().iter().any(|r| r.contains("/manifests/")),
        "{:?}",
        failing.requests()
    );

    // A reference pinned to a digest: nothing goes up before the push stage has compared the
    // built manifest with it (here another digest: refused, not one blob sent).
    let pinned = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let wrong = format!("sha256:{}", "0".repeat(64));
    let output = build(
        &recipe,
        &work.path().join("pinned"),
        &cache,
        &[
            "--push",
            &format!("{}/team/pinned:1@{wrong}", pinned.host()),
        ],
    );
    let all = output_text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(
        !pinned
            .requests()
            .iter()
            .any(|r| r.contains("/blobs/uploads/")),
        "{:?}\n{all}",
        pinned.requests()
    );
}
