//! `cudastack promote REF --require-gpu CLASS` against a real registry (issue 24): a
//! verified image gets its plain tag only when every required GPU class passed; a class
//! with no verification, or whose newest report failed, refuses and tags nothing. The
//! verifications are recorded the way a cluster run is (`verify REF --from-log LOG`, logs in
//! the probe's format written by hand: no GPU here).

use std::process::Output;

use crate::cli_verify_registry::{cudastack, gpu_report, job_log, text, Fixture};
use crate::registry_support::{Action, Proxy};
use cudastack::labels;

/// Record a log of `gpu` (failing `fail`) on the fixture's image; its exit code.
fn record(fixture: &Fixture, name: &str, gpu: &str, cc: &str, fail: Option<&str>) -> Option<i32> {
    let image = fixture.reference.pinned(fixture.digest).to_string();
    let by_digest = fixture.reference.with_digest(fixture.digest).to_string();
    let log = fixture.write_log(
        name,
        &job_log(
            &format!("cudastack-image-v1 {by_digest}"),
            &gpu_report(gpu, cc, fail),
        ),
    );
    let output = cudastack()
        .args(["verify", &image, "--from-log"])
        .arg(&log)
        .output()
        .unwrap();
    output.status.code()
}

fn promote(args: &[&str]) -> Output {
    cudastack().arg("promote").args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn promote_tags_only_what_passed_on_every_required_class() {
    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let client = fixture.client();
    let plain = fixture.reference.clone();
    let verified = plain.with_tag("2.4.1-verified").unwrap();
    let plain_digest = || async { client.get_manifest(&plain).await.unwrap().digest };

    // Nothing recorded yet: no verified image to promote.
    let output = promote(&[&plain.to_string(), "--require-gpu", "h100"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("no verified image"),
        "{}",
        text(&output)
    );

    assert_eq!(
        record(&fixture, "h100.log", "NVIDIA H100 80GB HBM3", "9.0", None),
        Some(0)
    );
    assert_eq!(
        record(
            &fixture,
            "a100.log",
            "NVIDIA A100-SXM4-80GB",
            "8.0",
            Some("train.mlp")
        ),
        Some(1),
        "a failed report exits 1"
    );
    let verified_digest = client.get_manifest(&verified).await.unwrap().digest;

    // A100 failed, B200 was never run: refused with both, and nothing tagged.
    let output = promote(&[
        &verified.to_string(),
        "--require-gpu",
        "h100,a100",
        "--require-gpu",
        "B200",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "a refusal exits 1\n{}",
        text(&output)
    );
    assert!(
        stderr.contains("2 required GPU classes have no passing verification"),
        "{stderr}"
    );
    assert!(
        stderr.contains("A100 (sm_80): FAILED on 2026-11-30T10:00:00Z: train.mlp"),
        "{stderr}"
    );
    assert!(stderr.contains("B200 (sm_100): missing"), "{stderr}");
    assert!(!stderr.contains("H100"), "H100 passed:\n{stderr}");
    assert_eq!(plain_digest().await, fixture.digest, "nothing was tagged");

    // A mistyped class is an error that says what is close.
    let output = promote(&[&verified.to_string(), "--require-gpu", "H10"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));

    // --dry-run says what it would do and tags nothing.
    let output = promote(&[&verified.to_string(), "--require-gpu", "h100", "--dry-run"]);
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("dry run: would tag")
            && stdout.contains(&format!("{plain}@{verified_digest}")),
        "{stdout}"
    );
    assert_eq!(plain_digest().await, fixture.digest);

    // H100 alone: promoted; the plain tag now names the verified manifest, byte for byte.
    let output = promote(&[&plain.to_string(), "--require-gpu", "9.0"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("{plain}@{verified_digest}")
    );
    assert_eq!(plain_digest().await, verified_digest);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("passed on NVIDIA H100 80GB HBM3"),
        "{}",
        text(&output)
    );

    // A multi-platform tag is not replaced by one platform's image.
    let index = serde_json::json!({"schemaVersion": 2,
        "mediaType": cudastack::registry::OCI_INDEX,
        "manifests": [{"mediaType": cudastack::registry::OCI_MANIFEST,
                       "digest": fixture.digest.to_string(), "size": 1,
                       "platform": {"architecture": "amd64", "os": "linux"}}]});
    let multi = plain.with_tag("multi").unwrap();
    let index_digest = client
        .put_manifest(
            &multi,
            cudastack::registry::OCI_INDEX,
            serde_json::to_vec(&index).unwrap().into(),
        )
        .await
        .unwrap();
    let output = promote(&[
        &verified.to_string(),
        "--require-gpu",
        "h100",
        "--to",
        "multi",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("multi-platform image index"),
        "{}",
        text(&output)
    );
    assert_eq!(
        client.get_manifest(&multi).await.unwrap().digest,
        index_digest
    );
}

/// The generated publish workflow verifies each GPU type in its own job, and each pushes its
/// own verified copy (`TAG-verified-gpu-…`): `promote --verified` reads them all, refuses
/// while a required class is missing from them, and else merges their matrices into one
/// verified image tagged TAG and TAG-verified.
#[tokio::test(flavor = "multi_thread")]
async fn promote_merges_the_verified_copies_each_gpu_job_pushed() {
    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let client = fixture.client();
    let plain = fixture.reference.clone();
    let bytes = client.get_manifest(&plain).await.unwrap();
    // Two tags of the same build, so each recording makes a verified copy of its own.
    let per_gpu = |gpu: &str| plain.with_tag(&format!("2.4.1-gpu-{gpu}")).unwrap();
    for (gpu, name, cc) in [
        ("h100", "NVIDIA H100 80GB HBM3", "9.0"),
        ("a100", "NVIDIA A100-SXM4-80GB", "8.0"),
    ] {
        client
            .put_manifest(&per_gpu(gpu), &bytes.media_type, bytes.bytes.clone())
            .await
            .unwrap();
        let log = fixture.write_log(
            &format!("{gpu}.log"),
            &job_log(
                &format!("cudastack-image-v1 {}", plain.with_digest(fixture.digest)),
                &gpu_report(name, cc, None),
            ),
        );
        let output = cudastack()
            .args([
                "verify",
                &per_gpu(gpu).pinned(fixture.digest).to_string(),
                "--from-log",
            ])
            .arg(&log)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output));
    }
    let verified = |gpu: &str| {
        per_gpu(gpu)
            .with_tag(&format!("2.4.1-gpu-{gpu}-verified"))
            .unwrap()
    };
    let by_digest = plain.with_digest(fixture.digest).to_string();

    // A verified copy in another repository cannot be promoted here: an error, nothing tagged.
    let elsewhere = format!("{}/other/repo:2.4.1-verified", plain.registry());
    let output = promote(&[
        &by_digest,
        "--to",
        "2.4.1",
        "--verified",
        &elsewhere,
        "--require-gpu",
        "h100",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("not in the repository"),
        "{}",
        text(&output)
    );

    // Only the H100 copy given: A100 is missing, nothing tagged.
    let output = promote(&[
        &by_digest,
        "--to",
        "2.4.1",
        "--verified",
        &verified("h100").to_string(),
        "--require-gpu",
        "h100,a100",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        text(&output).contains("A100 (sm_80): missing"),
        "{}",
        text(&output)
    );
    assert_eq!(
        client.get_manifest(&plain).await.unwrap().digest,
        fixture.digest
    );

    // Both: one verified image with both rows, tagged 2.4.1 and 2.4.1-verified.
    let output = promote(&[
        &by_digest,
        "--to",
        "2.4.1",
        "--verified",
        &verified("h100").to_string(),
        "--verified",
        &verified("a100").to_string(),
        "--require-gpu",
        "h100,a100",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let promoted = client.get_manifest(&plain).await.unwrap();
    let also = client
        .get_manifest(&plain.with_tag("2.4.1-verified").unwrap())
        .await
        .unwrap();
    assert_eq!(promoted.digest, also.digest);
    assert_ne!(promoted.digest, fixture.digest);
    let manifest: serde_json::Value = serde_json::from_slice(&promoted.bytes).unwrap();
    let original: serde_json::Value = serde_json::from_slice(&bytes.bytes).unwrap();
    assert_eq!(
        manifest["layers"], original["layers"],
        "same layers, new config"
    );
    let config_digest: cudastack::digest::Digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let config = client
        .get_blob_bytes(plain.repository(), &config_digest, 1 << 20)
        .await
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(
        config["config"]["Labels"][labels::VERIFIED_MATRIX]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let gpus: Vec<&str> = rows.iter().map(|r| r["gpu"].as_str().unwrap()).collect();
    assert_eq!(gpus, ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]);
}

/// A registry can list more reports of an image than the referrer budget reads (here 80
/// passing copies ahead of the real ones), and so hide a failed run past the budget. Promote
/// refuses while any report is unread, tags nothing, and says why; the same registry without
/// the padding promotes, so the refusal is the budget's.
#[tokio::test(flavor = "multi_thread")]
async fn promote_refuses_while_a_report_is_past_the_referrer_budget() {
    use cudastack::digest::Digest;
    use cudastack::registry::referrers::list_referrers;
    use cudastack::verify::REPORT_ARTIFACT_TYPE;
    use std::collections::HashMap;
    use std::sync::Arc;

    let Some(fixture) = Fixture::start().await else {
        return;
    };
    let client = fixture.client();
    let plain = fixture.reference.clone();
    assert_eq!(
        record(&fixture, "h100.log", "NVIDIA H100 80GB HBM3", "9.0", None),
        Some(0)
    );
    let verified = plain.with_tag("2.4.1-verified").unwrap();
    let verified_digest = client.get_manifest(&verified).await.unwrap().digest;
    let mut real = HashMap::new();
    for subject in [fixture.digest, verified_digest] {
        let entries = list_referrers(&client, &plain, &subject).await.unwrap();
        real.insert(subject.to_string(), entries);
    }

    let repo = plain.repository().to_string();
    let report = serde_json::to_vec(&gpu_report("NVIDIA H100 80GB HBM3", "9.0", None)).unwrap();
    let report_digest = Digest::of_bytes(&report);
    let mut bodies = HashMap::from([(format!("/v2/{repo}/blobs/{report_digest}"), report.clone())]);
    let mut padding = Vec::new();
    for i in 0..80 {
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": cudastack::registry::OCI_MANIFEST,
            "artifactType": REPORT_ARTIFACT_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": Digest::of_bytes(b"{}").to_string(), "size": 2},
            "layers": [{"mediaType": REPORT_ARTIFACT_TYPE,
                        "digest": report_digest.to_string(), "size": report.len()}],
            "annotations": {"copy": i.to_string()},
        }))
        .unwrap();
        let digest = Digest::of_bytes(&manifest);
        padding.push(serde_json::json!({
            "mediaType": cudastack::registry::OCI_MANIFEST, "digest": digest.to_string(),
            "size": manifest.len(), "artifactType": REPORT_ARTIFACT_TYPE,
        }));
        bodies.insert(format!("/v2/{repo}/manifests/{digest}"), manifest);
    }
    let hostile = Proxy::start(
        fixture.registry.port,
        Arc::new(move |head| {
            let path = head.target.split('?').next().unwrap_or_default();
            if head.method != "GET" {
                return Action::Forward;
            }
            if let Some((_, subject)) = path.split_once("/referrers/") {
                let mut manifests = padding.clone();
                manifests.extend(real.get(subject).cloned().unwrap_or_default());
                let index = serde_json::json!({"schemaVersion": 2,
                    "mediaType": cudastack::registry::OCI_INDEX, "manifests": manifests});
                return Action::Respond {
                    status: 200,
                    headers: vec![("Content-Type".into(), cudastack::registry::OCI_INDEX.into())],
                    body: serde_json::to_vec(&index).unwrap(),
                };
            }
            match bodies.get(path) {
                Some(body) => Action::Respond {
                    status: 200,
                    headers: vec![(
                        "Content-Type".into(),
                        cudastack::registry::OCI_MANIFEST.into(),
                    )],
                    body: body.clone(),
                },
                None => Action::Forward,
            }
        }),
    );

    let through_hostile = format!("{}/{repo}:2.4.1-verified", hostile.host());
    let output = promote(&[&through_hostile, "--require-gpu", "h100"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("were not read")
            && text(&output).contains("one of them may be a failed run"),
        "{}",
        text(&output)
    );
    assert_eq!(
        client.get_manifest(&plain).await.unwrap().digest,
        fixture.digest,
        "nothing was tagged"
    );

    let output = promote(&[&verified.to_string(), "--require-gpu", "h100"]);
    assert!(output.status.success(), "{}", text(&output));
}
