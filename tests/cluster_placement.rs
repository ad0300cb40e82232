//! Where a verified image may run, as each scheduler is told: node affinity over GPU
//! feature discovery's labels, a DRA selector over the attributes of NVIDIA's DRA driver,
//! and the admission policy that refuses GPU pods running unverified images.
//!
//! The CEL (DRA selector, admission expressions) runs in a real CEL implementation with
//! Kubernetes' libraries (tests/cel_support); node affinity is matched by the rules the
//! Kubernetes API documents for NodeSelectorRequirement (In, Gt, Lt on label values). The
//! nodes, ResourceSlice devices and pods are written in the formats GFD, the DRA driver and
//! the API server use (tests/fixtures/cluster; no cluster is reachable here), including a
//! node one driver release below the floor and GPUs the image has no verification or no
//! kernels for. Every emitted object validates against the Kubernetes API schemas of
//! 1.32 to 1.35 (`kubernetes-validate --strict`).

use crate::cel_support::{admit, evaluate, Admission};
use crate::gate;

use std::collections::BTreeMap;
use std::process::Command;

use cudastack::cluster::admission::{admission_manifests, AdmissionOptions};
use cudastack::cluster::dra::ResourceApi;
use cudastack::cluster::job::TrainingJob;
use cudastack::cluster::placement::Placement;
use cudastack::cluster::training::{training_manifests, GpuRequest, KubernetesOptions};
use cudastack::cluster::PinnedImage;
use cudastack::verify::check::ImageClaims;
use cudastack::verify::record::VerifiedOn;
use serde_json::{json, Value};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cluster");
const IMAGE: &str =
    "ghcr.io/acme/train@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860";
const OTHER: &str =
    "ghcr.io/acme/other@sha256:0000000000000000000000000000000000000000000000000000000000000001";

fn row(gpu: &str, cc: &str) -> VerifiedOn {
    VerifiedOn {
        gpu: gpu.into(),
        compute_capability: cc.into(),
        count: 8,
        driver: "550.54.15".into(),
        cuda_driver: Some("12.4".into()),
        date: "2026-12-01T00:00:00Z".into(),
        cudastack: env!("CARGO_PKG_VERSION").into(),
        checks: BTreeMap::new(),
        report: "sha256:00".into(),
    }
}

/// Verified on H100 80GB HBM3 and A100-SXM4-80GB; driver floor 550.54.15.
fn placement(rows: &[VerifiedOn]) -> Placement {
    let claims = ImageClaims {
        driver_floor: Some("550.54.15".parse().unwrap()),
        ..ImageClaims::default()
    };
    Placement::new(&claims, rows).unwrap()
}

fn verified_placement() -> Placement {
    placement(&[
        row("NVIDIA H100 80GB HBM3", "9.0"),
        row("NVIDIA A100-SXM4-80GB", "8.0"),
    ])
}

fn training_job(nodes: u32) -> TrainingJob {
    TrainingJob {
        name: "train".into(),
        image: IMAGE.parse().unwrap(),
        command: vec!["python".into(), "train.py".into()],
        working_dir: Some("/app".into()),
        start_guard: Vec::new(),
        nodes,
        gpus_per_node: 8,
        needs: Default::default(),
        placement: verified_placement(),
    }
}

/// The documents of a YAML stream (the leading comment is not one).
pub fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n")
        .filter(|doc| {
            doc.lines()
                .any(|l| !l.starts_with('#') && !l.trim().is_empty())
        })
        .map(|doc| serde_saphyr::from_str(doc).unwrap())
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap()
}

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// A NodeSelectorRequirement against a node's labels, as the API documents it: `Gt`/`Lt`
/// parse the label as an integer and fail to match when it is not one.
fn requirement_matches(requirement: &Value, labels: &Value) -> bool {
    let label = labels
        .get(requirement["key"].as_str().unwrap())
        .and_then(Value::as_str);
    let values: Vec<&str> = requirement["values"]
        .as_array()
        .map(|v| v.iter().map(|s| s.as_str().unwrap()).collect())
        .unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match (requirement["operator"].as_str().unwrap(), label) {
        ("In", Some(label)) => values.contains(&label),
        ("NotIn", label) => label.is_none_or(|l| !values.contains(&l)),
        ("Exists", label) => label.is_some(),
        ("DoesNotExist", label) => label.is_none(),
        ("Gt", Some(label)) => {
            matches!((number(label), number(values[0])), (Some(l), Some(v)) if l > v)
        }
        ("Lt", Some(label)) => {
            matches!((number(label), number(values[0])), (Some(l), Some(v)) if l < v)
        }
        _ => false,
    }
}

/// Terms are ORed, a term's expressions ANDed.
fn affinity_matches(affinity: &Value, labels: &Value) -> bool {
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap()
        .iter()
        .any(|term| {
            term["matchExpressions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| requirement_matches(r, labels))
        })
}

#[test]
fn node_affinity_admits_exactly_the_verified_products_at_or_above_the_floor() {
    let options = KubernetesOptions::default();
    let docs = documents(&training_manifests(&training_job(1), &options).unwrap());
    let affinity = &kind(&docs, "Job")["spec"]["template"]["spec"]["affinity"];
    let nodes = fixture("nodes.yaml");
    for node in nodes.as_array().unwrap() {
        assert_eq!(
            affinity_matches(affinity, &node["labels"]),
            node["expect"].as_bool().unwrap(),
            "node {}: {affinity}",
            node["name"]
        );
    }
}

/// A ResourceSlice device as the selector's `device` variable: its attributes under the
/// driver's domain, each value unwrapped (`{string: x}` -> x; versions stay versions).
fn dra_device(device: &Value, driver: &str) -> Value {
    let mut attributes = serde_json::Map::new();
    for (name, value) in device["attributes"].as_object().unwrap() {
        let (kind, value) = value.as_object().unwrap().iter().next().unwrap();
        let value = if kind == "version" {
            json!({ "version": value })
        } else {
            value.clone()
        };
        attributes.insert(name.clone(), value);
    }
    json!({ "driver": driver, "attributes": { driver: attributes } })
}

#[test]
fn the_dra_selector_admits_exactly_the_verified_devices() {
    let options = KubernetesOptions {
        gpus: GpuRequest::Dra(ResourceApi::V1),
        ..Default::default()
    };
    let docs = documents(&training_manifests(&training_job(2), &options).unwrap());
    let template = kind(&docs, "ResourceClaimTemplate");
    let selector = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
        ["cel"]["expression"]
        .as_str()
        .unwrap();
    let slice = fixture("resourceslice.yaml");
    let driver = slice["spec"]["driver"].as_str().unwrap();
    for device in slice["spec"]["devices"].as_array().unwrap() {
        let admitted = evaluate(selector, &json!({ "device": dra_device(device, driver) }));
        assert_eq!(
            admitted,
            Ok(device["expect"].as_bool().unwrap()),
            "device {}: {selector}",
            device["name"]
        );
    }
    // The version is compared as a version: as a string, "550.100.0" < "550.54.15".
    let newer = json!({"name": "x", "attributes": {
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "550.100.0"}}});
    assert_eq!(
        evaluate(selector, &json!({ "device": dra_device(&newer, driver) })),
        Ok(true)
    );
    // The verified product's name with another capability (a report or a driver that
    // disagrees) is not what was verified; a device without the attribute matches nothing.
    let mut other_cc = newer.clone();
    other_cc["attributes"]["cudaComputeCapability"] = json!({"version": "9.0.1"});
    assert_eq!(
        evaluate(
            selector,
            &json!({ "device": dra_device(&other_cc, driver) })
        ),
        Ok(false)
    );
    let mut no_cc = newer.clone();
    no_cc["attributes"]
        .as_object_mut()
        .unwrap()
        .remove("cudaComputeCapability");
    assert!(evaluate(selector, &json!({ "device": dra_device(&no_cc, driver) })).is_err());
    // A device of another driver is not the NVIDIA GPU the image was verified on.
    let mut other = dra_device(&slice["spec"]["devices"][0], driver);
    other["driver"] = json!("gpu.example.com");
    assert_eq!(evaluate(selector, &json!({ "device": other })), Ok(false));
}

/// A pod as the API server receives it from the Job controller: the Job's pod template.
fn pod_of(job: &Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "train-0-x", "namespace": "ml" },
        "spec": job["spec"]["template"]["spec"].clone(),
    })
}

#[test]
fn the_admission_policy_refuses_unverified_unpinned_and_unnamed_gpu_pods() {
    let images: Vec<(PinnedImage, Placement)> = vec![
        (IMAGE.parse().unwrap(), verified_placement()),
        (
            OTHER.parse().unwrap(),
            placement(&[row("NVIDIA A100-SXM4-80GB", "8.0")]),
        ),
    ];
    let docs = documents(&admission_manifests(&images, &AdmissionOptions::default()).unwrap());
    let policy = kind(&docs, "ValidatingAdmissionPolicy");
    let params = kind(&docs, "ConfigMap");
    let job = kind(
        &documents(&training_manifests(&training_job(1), &KubernetesOptions::default()).unwrap()),
        "Job",
    )
    .clone();
    let good = pod_of(&job);
    let admit = |pod: &Value| admit(policy, pod, params).unwrap();
    assert_eq!(admit(&good), Admission::Admitted);

    let mut by_tag = good.clone();
    by_tag["spec"]["containers"][0]["image"] = json!("ghcr.io/acme/train:latest");
    assert!(matches!(admit(&by_tag), Admission::Refused(m) if m.contains("by digest")));

    let mut unverified = good.clone();
    unverified["spec"]["containers"][0]["image"] =
        json!(format!("ghcr.io/acme/train@sha256:{}", "f".repeat(64)));
    assert!(matches!(admit(&unverified), Admission::Refused(m) if m.contains("not verified")));

    // OTHER was verified on A100 only: its pod placed on H100 or A100 is refused, on A100
    // by nodeSelector admitted.
    let mut other = good.clone();
    other["spec"]["containers"][0]["image"] = json!(OTHER);
    assert!(matches!(admit(&other), Admission::Refused(m) if m.contains("not verified")));
    let mut on_a100 = other.clone();
    on_a100["spec"].as_object_mut().unwrap().remove("affinity");
    on_a100["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"});
    assert_eq!(admit(&on_a100), Admission::Admitted);

    // A pod on an unverified product (same capability as H100), or naming none.
    let mut on_h200 = on_a100.clone();
    on_h200["spec"]["containers"][0]["image"] = json!(IMAGE);
    on_h200["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-H200"});
    assert!(matches!(admit(&on_h200), Admission::Refused(m) if m.contains("not verified")));
    let mut anywhere = good.clone();
    anywhere["spec"].as_object_mut().unwrap().remove("affinity");
    assert!(
        matches!(admit(&anywhere), Admission::Refused(m) if m.contains("must name the GPU product"))
    );
    // An affinity term without a product requirement admits any product.
    let mut loose = good.clone();
    loose["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array_mut()
        .unwrap()
        .push(json!({"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}));
    assert!(
        matches!(admit(&loose), Admission::Refused(m) if m.contains("must name the GPU product"))
    );

    // A pod that asks for no GPU is not the policy's.
    let mut cpu = good.clone();
    cpu["spec"]["containers"][0]["resources"] = json!({});
    cpu["spec"]["containers"][0]["image"] = json!("busybox:latest");
    assert_eq!(admit(&cpu), Admission::NotMatched);
}

fn validator_missing() -> Option<String> {
    match Command::new("kubernetes-validate")
        .arg("--version")
        .output()
    {
        Ok(output) if output.status.success() => None,
        Ok(output) => Some(format!(
            "`kubernetes-validate --version` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Some(format!(
            "`kubernetes-validate` is not installed ({error}); scripts/setup.sh installs it"
        )),
    }
}

/// Validate `yaml` (a stream) with `kubernetes-validate --strict` for Kubernetes `version`.
fn validate(yaml: &str, version: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).unwrap();
    let output = Command::new("kubernetes-validate")
        .args(["-k", version, "--strict"])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // A kind the validator has no schema for is only a WARN with exit 0: not a pass.
    if output.status.success() && !text.contains("ERROR") && !text.contains("WARN") {
        Ok(())
    } else {
        Err(text)
    }
}

#[test]
fn every_emitted_object_validates_against_kubernetes_1_32_to_1_35() {
    if let Some(reason) = validator_missing() {
        gate::skip("kubernetes-validate", reason);
        return;
    }
    let images = vec![(IMAGE.parse().unwrap(), verified_placement())];
    let admission = admission_manifests(&images, &AdmissionOptions::default()).unwrap();
    // One stream per version: the validator's start (seconds) dominates its run.
    for (version, api) in [
        ("1.32.0", ResourceApi::V1beta1),
        ("1.33.0", ResourceApi::V1beta2),
        ("1.34.0", ResourceApi::V1),
        ("1.35.0", ResourceApi::V1),
    ] {
        let mut stream = vec![admission.clone()];
        let mut job = training_job(2);
        job.needs.shm_size = Some(16 << 30);
        for gpus in [GpuRequest::DevicePlugin, GpuRequest::Dra(api)] {
            for nodes in [1, 2] {
                job.nodes = nodes;
                let options = KubernetesOptions {
                    namespace: "ml".into(),
                    image_pull_secrets: vec!["registry-creds".into()],
                    gpus,
                };
                stream.push(training_manifests(&job, &options).unwrap());
            }
        }
        let yaml = stream.join("---\n");
        validate(&yaml, version).unwrap_or_else(|e| panic!("{version}: {e}\n{yaml}"));
    }
    // The validator is strict: a misspelt field fails, so a pass above means something.
    let misspelt = training_manifests(&training_job(1), &KubernetesOptions::default())
        .unwrap()
        .replace("backoffLimit", "backofLimit");
    assert!(validate(&misspelt, "1.34.0").is_err());
    let unserved = training_manifests(
        &training_job(1),
        &KubernetesOptions {
            gpus: GpuRequest::Dra(ResourceApi::V1),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        validate(&unserved, "1.32.0").is_err(),
        "resource.k8s.io/v1 is not served by 1.32"
    );
}
