//! Recording verification results and answering "will it run here?" from the config only.
//!
//! The verified path needs a report from a real GPU run, which this machine cannot produce:
//! `gpu_report` below is the report the probe prints on a GPU, written by hand in the
//! probe's format (a stand-in for the GPU, as the project rules allow), and the tests
//! check what cudastack does with it. The probe itself runs for real in tests/build_e2e.rs.

use crate::registry_support;
use cudastack::labels;

use registry_support::gate;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cudastack::cache::BlobStore;
use cudastack::oci::layout;
use cudastack::verify::record::record_in_layout;
use cudastack::verify::report::{Report, Verdict};
use registry_support::{random_layer, Action, Proxy, Registry};

const REQUIRE: &str = "cuda>=12.1";

/// A small real image with the labels and env a cudastack build writes.
pub(crate) fn write_image(dir: &Path, store: &BlobStore) -> cudastack::digest::Digest {
    let layer = random_layer(store, "payload", 7, 3 << 20);
    let image = cudastack::oci::Image::new(1_700_000_000)
        .with_layer(layer, "payload")
        .with_env("NVIDIA_REQUIRE_CUDA", REQUIRE)
        .with_label("io.cudastack.recipe", "torch2.4.1-cu121-py3.11")
        .with_label("io.cudastack.driver-floor", "530.30.02")
        .with_label(
            "io.cudastack.torch.sm",
            "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
        )
        .with_label("io.cudastack.torch", "2.4.1+cu121");
    layout::write(&image, dir, "latest").unwrap();
    layout::write(&image, dir, "localhost/torch:2.4.1-cu121").unwrap()
}

pub(crate) fn report(levels: &str, gpu: bool) -> Report {
    let gpu_checks = [
        ("driver.version", "driver"),
        ("driver.cuda", "driver"),
        ("device.count", "device"),
        ("device.kernels", "device"),
        ("ops.matmul", "ops"),
        ("ops.conv", "ops"),
        ("ops.conv_benchmark", "ops"),
        ("ops.loaded_libraries", "ops"),
        ("train.mlp", "train"),
    ];
    let mut checks = vec![
        serde_json::json!({"id": "static.torch", "level": "static", "status": "pass", "seconds": 3.1, "detail": "torch 2.4.1+cu121"}),
    ];
    for (id, level) in gpu_checks {
        checks.push(serde_json::json!({"id": id, "level": level,
            "status": if gpu { "pass" } else { "skip" }, "seconds": 0.5,
            "detail": if gpu { "ok" } else { "no NVIDIA driver visible in the container" }}));
    }
    let value = serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-29T23:00:00Z", "seconds": 42.0, "hostname": "gpu-node-1",
        "levels": levels.split(',').collect::<Vec<_>>(), "expect": {}, "torch": "2.4.1+cu121",
        "driver": if gpu { serde_json::json!({"version": "550.54.15", "cuda": "12.4"}) } else { serde_json::Value::Null },
        "gpus": if gpu { serde_json::json!([{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0",
            "memory_bytes": 150_000_000_000u64, "kernels": "sass:sm_90"}]) } else { serde_json::json!([]) },
        "checks": checks,
        "counts": {"pass": if gpu { 10 } else { 1 }, "fail": 0, "skip": if gpu { 0 } else { 9 }},
    });
    Report::from_json(value.to_string().as_bytes()).unwrap()
}

fn labels(dir: &Path, ref_name: &str) -> serde_json::Map<String, serde_json::Value> {
    let resolved = layout::resolve(dir, ref_name).unwrap();
    serde_json::to_value(resolved.config.config().as_ref().unwrap().labels())
        .unwrap()
        .as_object()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_partial_report_is_stored_but_never_labels() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    let before = write_image(&dir, &store);
    let partial = report("static,driver,device,ops,train", false);
    let recorded = record_in_layout(&dir, "latest", &partial).unwrap();
    assert!(matches!(recorded.verdict, Verdict::Partial { .. }));
    assert_eq!(recorded.verified_manifest, None);
    assert_eq!(
        layout::resolve(&dir, "latest").unwrap().manifest_digest,
        before
    );
    assert!(!labels(&dir, "latest")
        .keys()
        .any(|k| k.contains("verified")));
    let refs = layout::list_refs(&dir).unwrap();
    assert!(
        refs.contains(&"latest.verify-report".to_string()),
        "{refs:?}"
    );
    assert!(!refs
        .iter()
        .any(|r| r.contains("-verified") || r == "verified"));
    // A report claiming every check passed but requested without the GPU levels is no proof.
    let static_only = report("static", true);
    assert!(record_in_layout(&dir, "latest", &static_only)
        .unwrap()
        .verified_manifest
        .is_none());
}

#[test]
fn a_verified_report_labels_a_new_config_with_the_same_layers() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    let before = write_image(&dir, &store);
    let layers_before = layout::read(&dir, "latest").unwrap().layers().to_vec();
    let recorded = record_in_layout(
        &dir,
        "latest",
        &report("static,driver,device,ops,train", true),
    )
    .unwrap();
    assert_eq!(recorded.verdict, Verdict::Verified);
    let verified = recorded.verified_manifest.unwrap();
    assert_ne!(verified, before);
    assert_eq!(
        recorded.verified_refs,
        vec![
            "latest",
            "localhost/torch:2.4.1-cu121",
            "localhost/torch:2.4.1-cu121-verified",
            "verified"
        ]
    );
    for name in &recorded.verified_refs {
        assert_eq!(
            layout::resolve(&dir, name).unwrap().manifest_digest,
            verified
        );
    }
    // The verified image as a value (what `build --load` loads after verifying) is the one
    // the layout now names, read back whole, with the same names.
    let value = recorded.verified_image.unwrap();
    let read_back = layout::LayoutImage::open(&dir, "latest").unwrap();
    assert_eq!(value.image.manifest, read_back.image.manifest);
    assert_eq!(value.image.config, read_back.image.config);
    let blobs = |image: &layout::LayoutImage| -> Vec<_> {
        image
            .image
            .layers
            .iter()
            .map(|l| (l.digest, l.diff_id, l.blob.clone()))
            .collect()
    };
    assert_eq!(blobs(&value), blobs(&read_back));
    assert_eq!(value.other_names, read_back.other_names);
    let after = layout::read(&dir, "verified").unwrap();
    assert_eq!(
        after.layers().iter().map(|l| l.digest).collect::<Vec<_>>(),
        layers_before.iter().map(|l| l.digest).collect::<Vec<_>>()
    );
    let labels = labels(&dir, "verified");
    assert_eq!(labels[labels::VERIFIED], "2026-11-29T23:00:00Z");
    let matrix: serde_json::Value =
        serde_json::from_str(labels[labels::VERIFIED_MATRIX].as_str().unwrap()).unwrap();
    assert_eq!(matrix[0]["gpu"], "NVIDIA H200");
    assert_eq!(matrix[0]["driver"], "550.54.15");
    assert_eq!(matrix[0]["checks"].as_object().unwrap().len(), 10);
    // skopeo, a real peer, reads the verified image and its labels from the layout.
    if let Some(text) = skopeo_inspect(&dir, "verified", &[]) {
        assert!(text.contains("io.cudastack.verified.matrix"), "{text}");
    }
}

/// `latest-linux-amd64` (torch.sm `amd64_sm`), `latest-linux-arm64` (sm_90 only) and an
/// image index over both as `latest`: what `build` writes for two platforms.
fn two_platform_layout(dir: &Path, store: &BlobStore, amd64_sm: &str) {
    use oci_spec::image::{Arch, Os, Platform};
    let mut children = Vec::new();
    for (arch, seed, sm) in [(Arch::Amd64, 11, amd64_sm), (Arch::ARM64, 12, "sm_90")] {
        let image = cudastack::oci::Image::new(1_700_000_000)
            .with_platform(arch.clone(), Os::Linux)
            .with_layer(random_layer(store, "payload", seed, 1 << 20), "payload")
            .with_env("NVIDIA_REQUIRE_CUDA", REQUIRE)
            .with_label("io.cudastack.driver-floor", "530.30.02")
            .with_label("io.cudastack.torch.sm", sm);
        layout::write(&image, dir, &format!("latest-linux-{arch}")).unwrap();
        let mut platform = Platform::default();
        platform.set_architecture(arch);
        platform.set_os(Os::Linux);
        children.push((image.documents().unwrap().manifest_descriptor(), platform));
    }
    layout::write_index(dir, &children, "latest").unwrap();
}

/// `check` of a multi-platform image answers for the platform asked (a login node on
/// x86_64 asking about GH200 arm64 nodes), by default for this machine's.
#[test]
fn check_answers_for_the_platform_asked() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    two_platform_layout(&dir, &store, "sm_75 sm_80 sm_90");
    let image = dir.to_str().unwrap();
    let t4 = ["check", image, "--driver", "550.54.15", "--gpu", "T4"];
    let host = cudastack(&t4);
    assert!(
        host.status.success(),
        "{}",
        String::from_utf8_lossy(&host.stdout)
    );
    let arm64 = cudastack(&[&t4[..], &["--platform", "linux/arm64"]].concat());
    assert_eq!(arm64.status.code(), Some(1));
    let text = String::from_utf8_lossy(&arm64.stdout);
    assert!(
        text.contains("sm_75") && text.contains("no kernels"),
        "{text}"
    );
}

/// A two-platform layout (what `build` writes for `platforms: [linux/amd64, linux/arm64]`):
/// verifying the host's (amd64) image replaces it inside the index, leaves the arm64 image
/// alone, and the index refs move to the new index.
#[test]
fn a_verified_platform_image_replaces_itself_inside_the_index() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    two_platform_layout(&dir, &store, "sm_80 sm_90");
    let amd64_before = layout::resolve(&dir, "latest").unwrap().manifest_digest;
    assert_eq!(
        amd64_before,
        layout::resolve(&dir, "latest-linux-amd64")
            .unwrap()
            .manifest_digest
    );

    let recorded = record_in_layout(
        &dir,
        "latest",
        &report("static,driver,device,ops,train", true),
    )
    .unwrap();
    let verified = recorded.verified_manifest.unwrap();
    assert_ne!(verified, amd64_before);
    // The arm64 image has not run anywhere: no `verified` index may offer it.
    assert!(
        !layout::list_refs(&dir)
            .unwrap()
            .contains(&"verified".to_string()),
        "{:?}",
        layout::list_refs(&dir).unwrap()
    );
    let name = "latest";
    let images = layout::index_images(&dir, name)
        .unwrap()
        .expect("still an index");
    let digests: Vec<_> = images
        .iter()
        .map(|(d, p)| {
            (
                p.architecture().to_string(),
                cudastack::oci::digest_of(d).unwrap(),
            )
        })
        .collect();
    assert_eq!(digests[0], ("amd64".to_string(), verified), "{name}");
    assert_eq!(digests[1].0, "arm64");
    assert_eq!(
        digests[1].1,
        layout::resolve(&dir, "latest-linux-arm64")
            .unwrap()
            .manifest_digest
    );
    assert!(labels(&dir, name).contains_key(labels::VERIFIED), "{name}");
    assert_eq!(
        layout::resolve(&dir, "latest-linux-amd64-verified")
            .unwrap()
            .manifest_digest,
        verified
    );
    // The report was stored for the image it proves, under its platform ref.
    assert!(cudastack::verify::record::stored_report(&dir, "latest")
        .unwrap()
        .is_some());
    assert!(layout::list_refs(&dir)
        .unwrap()
        .contains(&"latest-linux-amd64.verify-report".to_string()));

    // Verified on an arm64 node too (its report recorded here by platform ref): now every
    // platform is verified, and `verified` names an index of both verified images.
    let arm64 = record_in_layout(
        &dir,
        "latest-linux-arm64",
        &report("static,driver,device,ops,train", true),
    )
    .unwrap()
    .verified_manifest
    .unwrap();
    let both = layout::index_images(&dir, "verified")
        .unwrap()
        .expect("an index of both platforms");
    let digests: Vec<_> = both
        .iter()
        .map(|(d, _)| cudastack::oci::digest_of(d).unwrap())
        .collect();
    assert_eq!(digests, [verified, arm64]);
    let refs = layout::list_refs(&dir).unwrap();
    assert!(
        !refs.iter().any(|r| r.contains("verified-verified")),
        "{refs:?}"
    );
    assert!(
        refs.contains(&"latest-linux-arm64.verify-report".to_string()),
        "{refs:?}"
    );
    // skopeo, a real peer, reads the new index per platform.
    if let Some(text) = skopeo_inspect(&dir, "latest", &["--override-arch", "amd64"]) {
        assert!(text.contains("io.cudastack.verified"), "{text}");
    }
}

/// Pushing a two-platform image sends each platform's report as a referrer of that
/// platform's manifest (the subject a registry's referrers API answers for).
#[test]
fn each_platform_report_refers_to_its_own_manifest_when_pushed() {
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    two_platform_layout(&dir, &store, "sm_80 sm_90");
    // What `build` records on an x86_64 host without a GPU: the amd64 image's report.
    record_in_layout(
        &dir,
        "latest-linux-amd64",
        &report("static,driver,device,ops,train", false),
    )
    .unwrap();
    let registry = Registry::start(None);
    let target = format!("{}/cudastack/two:1", registry.host());
    let pushed = cudastack(&[
        "--quiet",
        "push",
        dir.to_str().unwrap(),
        &target,
        "--cache-dir",
        work.path().join("cache").to_str().unwrap(),
    ]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let reference: cudastack::registry::Reference = target.parse().unwrap();
    let client = cudastack::registry::RegistryClient::new(&reference, Default::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let referrers_of = |name: &str| {
        let digest = layout::resolve(&dir, name).unwrap().manifest_digest;
        runtime
            .block_on(cudastack::registry::referrers::list_referrers(
                &client, &reference, &digest,
            ))
            .unwrap()
    };
    let amd64 = referrers_of("latest-linux-amd64");
    assert_eq!(amd64.len(), 1, "{amd64:?}");
    assert_eq!(
        amd64[0]["artifactType"],
        cudastack::verify::REPORT_ARTIFACT_TYPE
    );
    assert!(referrers_of("latest-linux-arm64").is_empty());
}

/// `skopeo inspect [ARGS] oci:DIR:REF` (a real peer reading the layout); None, saying so,
/// when skopeo is not installed.
fn skopeo_inspect(dir: &Path, ref_name: &str, args: &[&str]) -> Option<String> {
    if !registry_support::have("skopeo") {
        gate::skip("skopeo", "skopeo check skipped: skopeo is not installed");
        return None;
    }
    let out = Command::new("skopeo")
        .arg("inspect")
        .args(args)
        .arg(format!("oci:{}:{ref_name}", dir.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn cudastack(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn check_and_inspect_read_only_the_config_from_a_registry() {
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    write_image(&dir, &store);
    let layer = layout::read(&dir, "latest").unwrap().layers()[0].clone();
    // A static-only report in the layout travels with the push as a referrer.
    record_in_layout(
        &dir,
        "latest",
        &report("static,driver,device,ops,train", false),
    )
    .unwrap();
    let registry = Registry::start(None);
    let pushed = cudastack(&[
        "--quiet",
        "push",
        dir.to_str().unwrap(),
        &format!("{}/cudastack/torch:2.4.1", registry.host()),
        "--cache-dir",
        work.path().join("cache").to_str().unwrap(),
    ]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );

    let reference: cudastack::registry::Reference =
        format!("{}/cudastack/torch:2.4.1", registry.host())
            .parse()
            .unwrap();
    let client = cudastack::registry::RegistryClient::new(&reference, Default::default()).unwrap();
    let manifest = layout::resolve(&dir, "latest").unwrap().manifest_digest;
    let referrers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(cudastack::registry::referrers::list_referrers(
            &client, &reference, &manifest,
        ))
        .unwrap();
    assert_eq!(referrers.len(), 1, "{referrers:?}");
    assert_eq!(
        referrers[0]["artifactType"],
        cudastack::verify::REPORT_ARTIFACT_TYPE
    );

    // Every read goes through a proxy that logs the requests.
    let proxy = Proxy::start(registry.port, Arc::new(|_| Action::Forward));
    let image = format!("{}/cudastack/torch:2.4.1", proxy.host());
    let old_driver = cudastack(&["--json", "check", &image, "--driver", "470.82.01"]);
    assert_eq!(
        old_driver.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&old_driver.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&old_driver.stdout).unwrap();
    assert_eq!(answer["fits"], "no");
    let text = answer.to_string();
    assert!(
        text.contains("supports CUDA up to 11.4") && text.contains("cuda>=12.1"),
        "{text}"
    );
    assert!(answer["bytes_read"].as_u64().unwrap() < 10_000, "{answer}");

    let blackwell = cudastack(&[
        "check",
        &image,
        "--driver",
        "570.124.06",
        "--gpu",
        "RTX 5090",
    ]);
    assert_eq!(blackwell.status.code(), Some(1));
    let text = String::from_utf8_lossy(&blackwell.stdout);
    assert!(
        text.contains("no kernel image is available") && text.contains("no:"),
        "{text}"
    );

    let fits = cudastack(&["check", &image, "--driver", "550.54.15", "--gpu", "A100"]);
    assert_eq!(
        fits.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&fits.stdout)
    );
    assert!(String::from_utf8_lossy(&fits.stdout).contains("yes:"));

    let inspect = cudastack(&["--json", "inspect", &image]);
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(value["declared"]["driver_floor"], "530.30.02");

    // A Kubernetes Job for the image, pinned to the digest the tag names now.
    let job = cudastack(&[
        "verify",
        &image,
        "--emit",
        "k8s-job",
        "--gpu-type",
        "NVIDIA-H200",
    ]);
    assert!(
        job.status.success(),
        "{}",
        String::from_utf8_lossy(&job.stderr)
    );
    let yaml = String::from_utf8_lossy(&job.stdout);
    assert!(yaml.contains(&format!("@{manifest}")), "{yaml}");
    assert!(
        yaml.contains("/opt/cudastack/probe/probe.py") && yaml.contains("NVIDIA-H200"),
        "{yaml}"
    );

    // Only manifests and the config were fetched: never the 3 MiB layer.
    let requests = proxy.requests();
    assert!(!requests.is_empty());
    let layer_hex = layer.digest.hex().to_string();
    assert!(
        requests.iter().all(|r| !r.contains(&layer_hex)),
        "a layer was fetched: {requests:#?}"
    );
    assert!(
        requests.iter().any(|r| r.contains("/blobs/sha256:")),
        "{requests:#?}"
    );
}

/// On this GPU-less machine `--detect` finds no driver and says so; the answer is "unknown",
/// never a made-up yes. Given a driver by hand, the same layout answers from its config.
#[test]
fn check_detect_on_a_machine_without_a_driver() {
    if std::path::Path::new("/proc/driver/nvidia/version").exists() {
        gate::not_applicable("this machine has an NVIDIA driver; the test is about one without");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    write_image(&dir, &store);
    let detect = cudastack(&["--json", "check", dir.to_str().unwrap(), "--detect"]);
    // Unknown is not yes: its own exit status (issue 16).
    assert_eq!(detect.status.code(), Some(3));
    let answer: serde_json::Value = serde_json::from_slice(&detect.stdout).unwrap();
    assert_eq!(answer["fits"], "unknown", "{answer}");
    assert!(String::from_utf8_lossy(&detect.stderr).contains("no NVIDIA driver"));
    let given = cudastack(&[
        "check",
        dir.to_str().unwrap(),
        "--driver",
        "535.104.05",
        "--cc",
        "8.0",
    ]);
    assert_eq!(given.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&given.stdout).contains("runs the build's sm_80 kernels"));
}

/// A container whose image has no probe: the runner says the probe produced no report
/// (with the container's output), and an untagged image it loaded is not left behind.
#[test]
fn an_image_without_the_probe_is_a_clear_error_and_leaves_nothing() {
    use cudastack::layer::{self, BuildOptions, Compression, Entry, LayerContents, LayerPath};
    if !std::path::Path::new("/bin/busybox").exists()
        || !Command::new("docker")
            .arg("info")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        gate::skip(
            "docker",
            "needs /bin/busybox (busybox-static) and a running Docker daemon",
        );
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let p = |s: &str| LayerPath::parse(s).unwrap();
    let contents = LayerContents::from_entries([
        Entry::file_bytes(
            p("bin/busybox"),
            0o755,
            std::fs::read("/bin/busybox").unwrap(),
        ),
        Entry::symlink(p("bin/sh"), "busybox"),
        Entry::symlink(p("bin/python3"), "busybox"),
        // The probe runs the base's interpreter by absolute path.
        Entry::symlink(p("usr/bin/python3"), "/bin/busybox"),
        Entry::file_bytes(
            p("etc/marker"),
            0o644,
            format!("verify-noprobe {}\n", std::process::id()).into_bytes(),
        ),
    ])
    .unwrap();
    let layer = layer::build(
        &store,
        &contents,
        &BuildOptions::new(1_700_000_000, Compression::Gzip { level: 1 }),
    )
    .unwrap();
    let image = cudastack::oci::Image::new(1_700_000_000)
        .with_layer(layer, "busybox")
        .with_env("PATH", "/bin");
    let dir = work.path().join("layout");
    layout::write(&image, &dir, "latest").unwrap();
    let id = image.documents().unwrap().config.digest.to_string();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine = rt.block_on(cudastack::engine::Engine::connect()).unwrap();
    let settings = cudastack::verify::runner::VerifySettings {
        gpus: cudastack::verify::runner::GpuChoice::Exactly(cudastack::engine::GpuRequest::None),
        timeout: std::time::Duration::from_secs(120),
        ..Default::default()
    };
    let error = rt
        .block_on(cudastack::verify::runner::verify_layout(
            &engine, &dir, "latest", &settings,
        ))
        .unwrap_err()
        .to_string();
    assert!(error.contains("produced no report"), "{error}");
    assert!(
        !rt.block_on(engine.image_exists(&id)).unwrap(),
        "the untagged image {id} was left in the daemon"
    );
}

/// An image index written by another tool may leave out the children's `platform`: each
/// child then takes the platform its own config names, so rewriting the index (verifying
/// one of its images) never relabels the arm64 image amd64.
#[test]
fn an_index_without_child_platforms_keeps_each_images_own_platform() {
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    two_platform_layout(&dir, &store, "sm_80 sm_90");
    // Strip the platforms out of the index `latest` names, as such a tool would write it.
    let index_path = dir.join("index.json");
    let mut top: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    // index.json's entry for the ref `latest`.
    let latest = |top: &serde_json::Value| {
        top["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "latest")
            .unwrap()
    };
    let at = latest(&top);
    let entry = &mut top["manifests"][at];
    let blob = |digest: &str| {
        dir.join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob(entry["digest"].as_str().unwrap())).unwrap())
            .unwrap();
    for child in index["manifests"].as_array_mut().unwrap() {
        child.as_object_mut().unwrap().remove("platform");
    }
    let bytes = serde_json::to_vec(&index).unwrap();
    let digest = cudastack::digest::Digest::of_bytes(&bytes).to_string();
    std::fs::write(blob(&digest), &bytes).unwrap();
    entry["digest"] = digest.into();
    entry["size"] = bytes.len().into();
    std::fs::write(&index_path, serde_json::to_vec(&top).unwrap()).unwrap();

    let architectures = |name: &str| -> Vec<String> {
        layout::index_images(&dir, name)
            .unwrap()
            .expect("an index")
            .iter()
            .map(|(_, p)| p.architecture().to_string())
            .collect()
    };
    assert_eq!(architectures("latest"), ["amd64", "arm64"]);
    record_in_layout(
        &dir,
        "latest-linux-amd64",
        &report("static,driver,device,ops,train", true),
    )
    .unwrap();
    // The rewritten index names both platforms, as cudastack's own indexes do.
    assert_eq!(architectures("latest"), ["amd64", "arm64"]);
    let top: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let entry = &top["manifests"][latest(&top)];
    let rewritten: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob(entry["digest"].as_str().unwrap())).unwrap())
            .unwrap();
    assert_eq!(
        rewritten["manifests"][1]["platform"]["architecture"],
        "arm64"
    );
}
