//! The verification Job validates against the Kubernetes API schema (strict: unknown
//! fields are errors) for the oldest and newest Kubernetes versions the validator ships
//! that the GPU Operator still supports, with and without a GPU type.
//!
//! The validator is `kubernetes-validate` from PyPI (bundled OpenAPI schemas, no cluster
//! needed; scripts/setup.sh installs it). Without it the test says why and stops. A
//! manifest with a misspelt field must fail, so a validator that accepts anything cannot
//! pass this test.

use crate::gate;

use std::path::Path;
use std::process::Command;

use cudastack::cluster::k8s::{job_manifest, JobSpec};

const VERSIONS: [&str; 2] = ["1.28.0", "1.30.0"];

fn validator_missing() -> Option<String> {
    match Command::new("kubernetes-validate").arg("--version").output() {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "`kubernetes-validate --version` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Some(format!(
            "`kubernetes-validate` is not installed ({error}); `pip install kubernetes-validate` (scripts/setup.sh does)"
        )),
    }
}

fn validate(file: &Path, version: &str) -> (bool, String) {
    let output = Command::new("kubernetes-validate")
        .args(["-k", version, "--strict"])
        .arg(file)
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn verification_jobs_validate_against_the_kubernetes_schema() {
    if let Some(reason) = validator_missing() {
        gate::skip("kubernetes-validate", reason);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = "ghcr.io/acme/torch:2.4.1-cuda12.1@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860".parse().unwrap();
    let mut specs = [
        JobSpec::probe(image, Some("NVIDIA-H100-80GB-HBM3".into())),
        JobSpec::probe(
            "localhost:5000/torch@sha256:0000000000000000000000000000000000000000000000000000000000000000"
                .parse()
                .unwrap(),
            None,
        ),
    ];
    specs[1].gpu_count = 8;
    specs[1].namespace = "gpu-verify".into();
    specs[1].image_pull_secrets = vec!["regcred".into(), "ghcr.pull-token".into()];
    for (index, spec) in specs.iter().enumerate() {
        let yaml = job_manifest(spec).unwrap();
        let file = dir.path().join(format!("job-{index}.yaml"));
        std::fs::write(&file, &yaml).unwrap();
        for version in VERSIONS {
            let (ok, log) = validate(&file, version);
            assert!(ok, "Kubernetes {version} rejects:\n{yaml}\n{log}");
            assert!(log.contains("passed"), "{log}");
        }
    }

    // The negative control: the same manifest with one field misspelt is rejected.
    let yaml = job_manifest(&specs[0])
        .unwrap()
        .replace("backoffLimit", "backofLimit");
    let file = dir.path().join("misspelt.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (ok, log) = validate(&file, VERSIONS[1]);
    assert!(!ok, "a misspelt field must not validate:\n{log}");
    assert!(log.contains("backofLimit"), "{log}");
}
