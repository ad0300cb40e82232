//! `cudastack place`, `job` and `admission` against a real registry: the image is read from
//! it and pinned to the digest it serves, its verified matrix recorded the way a cluster
//! run records it (`verify REF --from-log LOG`, a log in the probe's format written by
//! hand: no GPU here), and what is emitted admits exactly that matrix. An image verified
//! on nothing, or whose verifications no given key signed, is refused with what to do; an
//! image with the start guard keeps it in front of the launcher.

use crate::cli_verify_registry::{cudastack, gpu_report, job_log, text};
use crate::cluster_placement::documents;
use crate::registry_support::{self, random_layer, Registry};

use cudastack::cache::BlobStore;
use cudastack::registry::{push_image, ClientOptions, PushOptions, Reference, RegistryClient};

fn run(args: &[&str]) -> std::process::Output {
    cudastack().args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn place_job_and_admission_follow_the_verified_matrix_read_from_the_registry() {
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let store = BlobStore::open(work.path().join("cache")).unwrap();
    let image = cudastack::oci::Image::new(1_700_000_000)
        .with_layer(random_layer(&store, "payload", 7, 1 << 20), "payload")
        .with_label(cudastack::labels::DRIVER_FLOOR, "550.54.15")
        .with_label("io.cudastack.runtime.shm-size", "17179869184")
        .with_entrypoint(cudastack::probe::guard::guarded_entrypoint(&[
            "python".into(),
            "-u".into(),
        ]))
        .with_cmd(vec!["train.py".into(), "--epochs=3".into()])
        .with_working_dir("/workspace");
    let reference: Reference = format!("{}/team/train:1.0", registry.host())
        .parse()
        .unwrap();
    let client = RegistryClient::new(&reference, ClientOptions::default()).unwrap();
    let pushed = push_image(&client, &image, &reference, &PushOptions::default())
        .await
        .unwrap();
    let plain = reference.to_string();

    // Verified on nothing yet: nothing to admit.
    let output = run(&["place", &plain]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("verified on no GPU"),
        "{}",
        text(&output)
    );

    let log = work.path().join("h100.log");
    let by_digest = reference.with_digest(pushed.manifest_digest).to_string();
    std::fs::write(
        &log,
        job_log(
            &format!("cudastack-image-v1 {by_digest}"),
            &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None),
        ),
    )
    .unwrap();
    let pinned = reference.pinned(pushed.manifest_digest).to_string();
    let output = cudastack()
        .args(["verify", &pinned, "--from-log"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let verified = reference.with_tag("1.0-verified").unwrap().to_string();

    // Node affinity: the verified product, the floor as driver terms.
    let output = run(&["place", &verified]);
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("- NVIDIA-H100-80GB-HBM3"), "{stdout}");
    assert!(!stdout.contains("A100"), "{stdout}");
    assert!(stdout.contains("nvidia.com/cuda.driver.rev"), "{stdout}");

    // The team's job: the image by the digest the registry serves for the verified tag,
    // its entrypoint through torchrun on 2 x 8 GPUs, its /dev/shm, its working directory.
    let output = run(&[
        "job",
        &verified,
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--namespace",
        "ml",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let docs = documents(&String::from_utf8_lossy(&output.stdout));
    let job = docs.iter().find(|d| d["kind"] == "Job").unwrap();
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let image = container["image"].as_str().unwrap();
    assert!(
        image.starts_with(&format!("{}/team/train@sha256:", registry.host())),
        "{image}"
    );
    assert_ne!(
        image, by_digest,
        "the verified tag names the verified config's digest"
    );
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // The start guard checks each node once, in front of torchrun.
    let guard = cudastack::probe::guard::guard_prefix();
    assert_eq!(
        command[..guard.len()],
        guard.iter().map(String::as_str).collect::<Vec<_>>()[..]
    );
    assert_eq!(
        &command[guard.len()..guard.len() + 3],
        ["python", "-m", "torch.distributed.run"]
    );
    assert_eq!(&command[command.len() - 2..], ["train.py", "--epochs=3"]);
    assert_eq!(container["workingDir"], "/workspace");
    assert_eq!(
        job["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"],
        "16Gi"
    );
    assert!(docs.iter().any(|d| d["kind"] == "Service"));

    // Slurm: the site's features for the H100 and the drivers at the floor; the team's
    // entrypoint by digest through pyxis. Without the site's map there is nothing to say.
    let site = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/slurm/site-features.yaml"
    );
    let output = run(&[
        "place",
        &verified,
        "--for",
        "slurm",
        "--site-features",
        site,
        "--gpus",
        "8",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("#SBATCH --constraint=\"h100&(driver-550|driver-560)\""),
        "{stdout}"
    );
    assert!(stdout.contains("#SBATCH --gres=gpu:h100:8"), "{stdout}");
    let output = run(&[
        "job",
        &verified,
        "--for",
        "sbatch",
        "--site-features",
        site,
        "--nodes",
        "2",
    ]);
    assert!(output.status.success(), "{}", text(&output));
    let script = String::from_utf8_lossy(&output.stdout);
    assert!(
        script.contains(image.rsplit_once('@').unwrap().1),
        "{script}"
    );
    assert!(script.contains("train.py"), "{script}");
    let output = run(&["job", &verified, "--for", "sbatch"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("--site-features"),
        "{}",
        text(&output)
    );

    // Admission: the verified digest under the H100's label value.
    let output = run(&["admission", &verified]);
    assert!(output.status.success(), "{}", text(&output));
    let docs = documents(&String::from_utf8_lossy(&output.stdout));
    let params = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let digest = image.rsplit_once('@').unwrap().1;
    assert_eq!(params["data"]["NVIDIA-H100-80GB-HBM3"], digest);

    // With a key, only signed verifications count: this one signed nothing.
    let key = work.path().join("k");
    let output = cudastack()
        .args(["key", "generate", "--output-prefix"])
        .arg(&key)
        .env("COSIGN_PASSWORD", "pw")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let public = format!("{}.pub", key.display());
    let output = run(&["place", &verified, "--require-signed-by", &public]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("no verification of"),
        "{}",
        text(&output)
    );

    // A layout is not where nodes pull from.
    let output = run(&["place", "oci:/nonexistent"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
}
