//! `cudastack verify REF --from-log LOG` on an image in a registry, as the emitted Job and
//! sbatch headers say (issue 24): against a real registry (Debian's docker-registry) behind
//! a counting proxy, with a small pushed image and a log written as the Job prints it (the
//! image line, the probe's stderr, the report line; the report is the GPU report's format,
//! written by hand: no GPU here). The command run is the one the header prints.

use crate::registry_support;
use cudastack::labels;

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudastack::cache::BlobStore;
use cudastack::registry::referrers::list_referrers;
use cudastack::registry::{
    push_image, ClientOptions, PushOptions, Reference, RegistryClient, RegistryError,
};
use cudastack::verify::record::config_labels;
use registry_support::{random_layer, Action, Proxy, Registry};

pub fn cudastack() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env("DOCKER_CONFIG", "/nonexistent-cudastack-test");
    command
}

pub fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A probe report as a GPU run prints it: every level on `gpu`, all passed unless `fail`.
pub fn gpu_report(gpu: &str, compute_capability: &str, fail: Option<&str>) -> serde_json::Value {
    let ids = [
        ("static.torch", "static"),
        ("driver.version", "driver"),
        ("device.count", "device"),
        ("ops.matmul", "ops"),
        ("train.mlp", "train"),
    ];
    let checks: Vec<serde_json::Value> = ids
        .iter()
        .map(|(id, level)| {
            let failed = fail == Some(*id);
            serde_json::json!({"id": id, "level": level,
                "status": if failed { "fail" } else { "pass" }, "seconds": 0.5,
                "detail": if failed { "loss did not fall" } else { "ok" }})
        })
        .collect();
    let failed = u32::from(fail.is_some());
    serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-30T10:00:00Z", "seconds": 42.0, "hostname": "gpu-node-7",
        "levels": ["static", "driver", "device", "ops", "train"], "expect": {},
        "torch": "2.4.1+cu121", "driver": {"version": "550.54.15", "cuda": "12.4"},
        "gpus": [{"index": 0, "name": gpu, "compute_capability": compute_capability,
                  "memory_bytes": 80_000_000_000u64, "kernels": "sass:sm_90"}],
        "checks": checks, "counts": {"pass": 5 - failed, "fail": failed, "skip": 0},
    })
}

/// The pod log of the Job: the image line the container prints first, the probe's stderr,
/// then its report line.
pub fn job_log(image_line: &str, report: &serde_json::Value) -> String {
    format!("{image_line}\n5 passed, 0 failed, 0 skipped\ncudastack-report-v1 {report}\n")
}

/// A registry with a proxy in front that counts uploads and can answer 500 to the PUT of
/// a `-verified` manifest; and a 3 MiB image pushed as `team/torch:2.4.1` through it.
pub struct Fixture {
    pub registry: Arc<Registry>,
    pub proxy: Proxy,
    pub fail_verified_put: Arc<AtomicBool>,
    pub reference: Reference,
    pub digest: cudastack::digest::Digest,
    pub layer_digest: cudastack::digest::Digest,
    pub work: tempfile::TempDir,
}

impl Fixture {
    pub async fn start() -> Option<Fixture> {
        if let Some(reason) = registry_support::skip_reason() {
            reason.report();
            return None;
        }
        let registry = Registry::start(None);
        let fail_verified_put = Arc::new(AtomicBool::new(false));
        let flag = fail_verified_put.clone();
        let proxy = Proxy::start(
            registry.port,
            Arc::new(move |head| {
                if flag.load(Ordering::SeqCst)
                    && head.method == "PUT"
                    && head.target.contains("/manifests/")
                    && head.target.contains("-verified")
                {
                    Action::Respond {
                        status: 500,
                        headers: Vec::new(),
                        body: b"{\"errors\":[{\"code\":\"UNKNOWN\",\"message\":\"disk full\"}]}"
                            .to_vec(),
                    }
                } else {
                    Action::Forward
                }
            }),
        );
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path().join("cache")).unwrap();
        let layer = random_layer(&store, "payload", 11, 3 << 20);
        let layer_digest = layer.digest;
        let image = cudastack::oci::Image::new(1_700_000_000)
            .with_layer(layer, "payload")
            .with_label("io.cudastack.recipe", "torch2.4.1-cu121-py3.11");
        let reference: Reference = format!("{}/team/torch:2.4.1", proxy.host())
            .parse()
            .unwrap();
        let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
        let pushed = push_image(&client, &image, &reference, &PushOptions::default())
            .await
            .unwrap();
        Some(Fixture {
            registry,
            proxy,
            fail_verified_put,
            reference,
            digest: pushed.manifest_digest,
            layer_digest,
            work,
        })
    }

    pub fn client(&self) -> RegistryClient {
        RegistryClient::new(&self.reference, ClientOptions::default()).unwrap()
    }

    /// The uploads (blob PUT/PATCH targets) the proxy saw since `from`.
    pub fn uploads_since(&self, from: usize) -> Vec<String> {
        self.proxy.requests()[from..]
            .iter()
            .filter(|line| line.contains("/blobs/uploads/") && !line.starts_with("POST"))
            .cloned()
            .collect()
    }

    pub fn write_log(&self, name: &str, log: &str) -> std::path::PathBuf {
        let path = self.work.path().join(name);
        std::fs::write(&path, log).unwrap();
        path
    }
}

/// The `cudastack verify ... --from-log LOG` line of an emitted header, as words, with the
/// log file name replaced by `log`.
fn header_command(emitted: &str, log: &std::path::Path) -> Vec<String> {
    let line = emitted
        .lines()
        .find_map(|line| line.strip_prefix("#   cudastack verify "))
        .unwrap_or_else(|| panic!("no `cudastack verify` line in:\n{emitted}"));
    let line = line.split("   (").next().unwrap();
    let mut words: Vec<String> = std::iter::once("verify")
        .chain(line.split_whitespace())
        .map(String::from)
        .collect();
    let at = words.iter().position(|w| w == "--from-log").unwrap() + 1;
    words[at] = log.display().to_string();
    words
}

fn emit(target: &str, image: &str) -> String {
    let output = cudastack()
        .args(["verify", image, "--emit", target])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    String::from_utf8(output.stdout).unwrap()
}

async fn tag_exists(client: &RegistryClient, reference: &Reference) -> bool {
    match client.get_manifest(reference).await {
        Ok(_) => true,
        Err(RegistryError::ManifestNotFound { .. }) => false,
        Err(error) => panic!("{error}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_command_the_job_header_prints_records_a_registry_image_without_uploading_layers() {
    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let client = fixture.client();
    let verified = fixture.reference.with_tag("2.4.1-verified").unwrap();
    let job = emit("k8s-job", &fixture.reference.to_string());
    let image_line = job
        .lines()
        .find_map(|line| line.trim().strip_prefix("- cudastack-image-v1 "))
        .map(|image| format!("cudastack-image-v1 {image}"))
        .unwrap_or_else(|| panic!("no image line in the Job:\n{job}"));
    assert!(
        image_line.ends_with(&fixture.digest.to_string()),
        "{image_line}"
    );

    // A log of another image is refused, naming both digests; nothing is tagged.
    let other = format!(
        "cudastack-image-v1 {}/team/torch@sha256:{}",
        fixture.proxy.host(),
        "e".repeat(64)
    );
    let log = fixture.write_log(
        "other.log",
        &job_log(&other, &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None)),
    );
    let output = cudastack()
        .args(&header_command(&job, &log)[..])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        stderr.contains(&format!("Expected: {}", fixture.digest))
            && stderr.contains(&format!("Found:    sha256:{}", "e".repeat(64))),
        "{stderr}"
    );
    // A log without the image line (a Job from before) cannot be recorded on a registry.
    let bare = fixture.write_log(
        "bare.log",
        &format!(
            "cudastack-report-v1 {}\n",
            gpu_report("NVIDIA H100 80GB HBM3", "9.0", None)
        ),
    );
    let output = cudastack()
        .args(&header_command(&job, &bare)[..])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cudastack-image-v1"),
        "{}",
        text(&output)
    );
    assert!(!tag_exists(&client, &verified).await);

    // The registry failing the last step (the tag) is a precise error and leaves no tag.
    let log = fixture.write_log(
        "job.log",
        &job_log(
            &image_line,
            &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None),
        ),
    );
    // Uploads are counted over both tries: all that recording a 3 MiB image sends.
    let before = fixture.proxy.requests().len();
    let bytes_before = fixture.proxy.upload_bytes.load(Ordering::SeqCst);
    fixture.fail_verified_put.store(true, Ordering::SeqCst);
    let output = cudastack()
        .args(&header_command(&job, &log)[..])
        .output()
        .unwrap();
    fixture.fail_verified_put.store(false, Ordering::SeqCst);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        stderr.contains("PUT")
            && stderr.contains("HTTP 500")
            && stderr.contains("2.4.1-verified")
            && stderr.contains("disk full"),
        "{stderr}"
    );
    assert!(
        !tag_exists(&client, &verified).await,
        "a failed record left a tag"
    );

    // The command as the header prints it: verified, tagged, only small blobs uploaded.
    let output = cudastack()
        .args(&header_command(&job, &log)[..])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        stdout.contains("verified image sha256:")
            && stdout.contains(&format!("{verified}@sha256:")),
        "{stdout}"
    );
    let uploads = fixture.uploads_since(before);
    let uploaded = fixture.proxy.upload_bytes.load(Ordering::SeqCst) - bytes_before;
    // The artifact's empty config `{}`, the report, the labelled config: nothing else.
    assert_eq!(uploads.len(), 3, "{uploads:?}");
    assert!(
        uploaded < 64 << 10,
        "{uploaded} bytes uploaded: {uploads:?}"
    );
    assert!(
        !uploads
            .iter()
            .any(|u| u.contains(&fixture.layer_digest.to_string())),
        "the layer was uploaded again: {uploads:?}"
    );
    let original = client.get_manifest(&fixture.reference).await.unwrap();
    let tagged = client.get_manifest(&verified).await.unwrap();
    let layers = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes).unwrap()["layers"].clone()
    };
    assert_eq!(
        layers(&tagged.bytes),
        layers(&original.bytes),
        "the same layer descriptors"
    );
    assert_eq!(
        original.digest, fixture.digest,
        "the image itself is untouched"
    );
    let config_digest: cudastack::digest::Digest =
        serde_json::from_slice::<serde_json::Value>(&tagged.bytes).unwrap()["config"]["digest"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let config = client
        .get_blob_bytes("team/torch", &config_digest, 1 << 20)
        .await
        .unwrap();
    let labels = config_labels(&serde_json::from_slice(&config).unwrap());
    assert_eq!(labels[labels::VERIFIED], "2026-11-30T10:00:00Z");
    assert!(
        labels[labels::VERIFIED_MATRIX].contains("NVIDIA H100 80GB HBM3"),
        "{labels:?}"
    );
    assert_eq!(
        labels["io.cudastack.recipe"], "torch2.4.1-cu121-py3.11",
        "the image's labels are kept"
    );
    let referrers = list_referrers(&client, &fixture.reference, &fixture.digest)
        .await
        .unwrap();
    assert!(
        referrers
            .iter()
            .any(|r| r["artifactType"] == cudastack::verify::REPORT_ARTIFACT_TYPE),
        "{referrers:?}"
    );

    // The sbatch header's command works the same; a second GPU type adds a row.
    let script = emit("sbatch", &fixture.reference.to_string());
    let log = fixture.write_log(
        "slurm.out",
        &job_log(
            &image_line,
            &gpu_report("NVIDIA A100-SXM4-80GB", "8.0", None),
        ),
    );
    let output = cudastack()
        .args(&header_command(&script, &log)[..])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let tagged = client.get_manifest(&verified).await.unwrap();
    let config_digest: cudastack::digest::Digest =
        serde_json::from_slice::<serde_json::Value>(&tagged.bytes).unwrap()["config"]["digest"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    let config = client
        .get_blob_bytes("team/torch", &config_digest, 1 << 20)
        .await
        .unwrap();
    let labels = config_labels(&serde_json::from_slice(&config).unwrap());
    assert!(
        labels[labels::VERIFIED_MATRIX].contains("NVIDIA H100 80GB HBM3")
            && labels[labels::VERIFIED_MATRIX].contains("NVIDIA A100-SXM4-80GB"),
        "{labels:?}"
    );
    drop(fixture.registry.clone());
}

/// A multi-platform tag is never replaced by one platform's verified image: recording on
/// `repo:multi@<amd64 digest>` pushes the verified image by digest and leaves both the
/// index tag and the absent `multi-verified` tag as they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_multi_platform_tag_is_not_replaced_by_one_platforms_verified_image() {
    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let client = fixture.client();
    let original = client.get_manifest(&fixture.reference).await.unwrap();
    let index = serde_json::json!({"schemaVersion": 2,
        "mediaType": cudastack::registry::OCI_INDEX,
        "manifests": [{"mediaType": original.media_type, "digest": original.digest.to_string(),
                       "size": original.bytes.len(),
                       "platform": {"architecture": "amd64", "os": "linux"}}]});
    let multi = fixture.reference.with_tag("multi").unwrap();
    let index_digest = client
        .put_manifest(
            &multi,
            cudastack::registry::OCI_INDEX,
            serde_json::to_vec(&index).unwrap().into(),
        )
        .await
        .unwrap();
    let by_digest = fixture.reference.with_digest(fixture.digest);
    let log = fixture.write_log(
        "multi.log",
        &job_log(
            &format!("cudastack-image-v1 {by_digest}"),
            &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None),
        ),
    );
    let output = cudastack()
        .args([
            "verify",
            &multi.pinned(fixture.digest).to_string(),
            "--from-log",
        ])
        .arg(&log)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("multi-platform image index: the verified image is pushed by digest"),
        "{stderr}"
    );
    assert_eq!(
        client.get_manifest(&multi).await.unwrap().digest,
        index_digest
    );
    assert!(
        !tag_exists(
            &client,
            &fixture.reference.with_tag("multi-verified").unwrap()
        )
        .await
    );
}

/// A log recorded on a registry image is not signed there: what is signed must be what was
/// checked here, which needs the image in a layout. Refused before any registry is
/// contacted (nothing listens at the reference's host).
#[test]
fn a_log_recorded_on_a_registry_image_is_not_signed_there() {
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("k");
    let output = cudastack()
        .args(["key", "generate", "--output-prefix"])
        .arg(&key)
        .env("COSIGN_PASSWORD", "pw")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let reference = "127.0.0.1:9/team/torch:2.4.1";
    let log = work.path().join("job.log");
    std::fs::write(
        &log,
        job_log(
            &format!("cudastack-image-v1 {reference}"),
            &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None),
        ),
    )
    .unwrap();
    let output = cudastack()
        .args(["verify", reference, "--from-log"])
        .arg(&log)
        .arg("--sign-key")
        .arg(format!("{}.key", key.display()))
        .env("COSIGN_PASSWORD", "pw")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--sign-key with a registry IMAGE: record the log in a layout"),
        "{}",
        text(&output)
    );
}
