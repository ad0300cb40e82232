//! A Kubernetes Job that runs the verification probe on one GPU node of a cluster run with
//! the NVIDIA GPU Operator, so an image is proven on the cluster's own GPUs through the
//! cluster's own scheduler.
//!
//! The Job asks for `nvidia.com/gpu` (the device plugin's resource), pins the node to a
//! GPU type through the `nvidia.com/gpu.product` label that GPU feature discovery sets
//! (values such as `NVIDIA-A100-SXM4-80GB`: see `kubectl get nodes -L
//! nvidia.com/gpu.product`), tolerates the `nvidia.com/gpu` taint GPU pools commonly
//! carry, runs the image by digest so the node runs exactly the bytes that were built,
//! and never retries (`backoffLimit: 0`, `restartPolicy: Never`): a failing probe must
//! fail the Job, not be retried into a pass. The results channel is the pod log: the
//! container first prints `cudastack-image-v1 REPOSITORY@sha256:…` (the image it runs),
//! then the probe's last stdout line is `cudastack-report-v1 <JSON>`, and
//! `cudastack verify IMAGE --from-log LOG` records the report of `kubectl logs job/NAME`
//! on that image.
//!
//! The YAML comes from typed structs serialised in field order, so it is deterministic;
//! the tests validate it against the Kubernetes API schema.

use std::collections::BTreeMap;

use serde::Serialize;

use super::placement::Placement;
use super::{is_dns_label, slug, to_yaml, ClusterError, PinnedImage};
use crate::probe::{PROBE_INTERPRETER, PROBE_PATH};
use crate::recipe::RuntimeSpec;

/// The extended resource the NVIDIA device plugin advertises.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The node label GPU feature discovery (part of the GPU Operator) sets to the product name.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Prefix of the report line the probe prints last on stdout.
pub const REPORT_PREFIX: &str = "cudastack-report-v1 ";

/// The probe command every cudastack image can run: all levels, report on stdout.
pub fn probe_command() -> Vec<String> {
    // The base's interpreter by absolute path, `-I -S`: no script on PATH, `.pth` file or
    // sitecustomize of the image runs before the probe.
    [PROBE_INTERPRETER, "-I", "-S", PROBE_PATH, "--level", "all"]
        .map(String::from)
        .to_vec()
}

/// What the Job runs and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Job name: an RFC 1123 label (pods get it as the `job-name` label, so at most 63).
    pub name: String,
    pub namespace: String,
    /// The image by digest.
    pub image: PinnedImage,
    /// `nvidia.com/gpu` limit, at least 1.
    pub gpu_count: u32,
    /// Value of the node label `nvidia.com/gpu.product` to run on (None: any GPU node).
    pub gpu_type: Option<String>,
    /// The container command (usually [`probe_command`]).
    pub command: Vec<String>,
    /// The Job is killed (and fails) after this many seconds, pull time included.
    pub active_deadline_seconds: u64,
    /// Secrets (type `kubernetes.io/dockerconfigjson`) in the Job's namespace the kubelet
    /// pulls a private image with: the pod's `imagePullSecrets`
    /// (https://kubernetes.io/docs/tasks/configure-pod-container/pull-image-private-registry/).
    pub image_pull_secrets: Vec<String>,
    /// What the run needs from the runtime (the image's `io.cudastack.runtime.*` labels):
    /// a /dev/shm of `shm_size` becomes a memory-backed emptyDir mounted there. Kubernetes
    /// has no per-pod ulimits: those are the node's container runtime's, and the usage
    /// comment names them.
    pub needs: RuntimeSpec,
}

impl JobSpec {
    /// A probe Job for `image` with defaults: one GPU, namespace `default`, 30 minutes
    /// (a cold pull of a 3 GB image plus the probe's training level), named after the
    /// image and GPU type.
    pub fn probe(image: PinnedImage, gpu_type: Option<String>) -> Self {
        JobSpec {
            name: default_job_name(&image, gpu_type.as_deref()),
            namespace: "default".to_string(),
            image,
            gpu_count: 1,
            gpu_type,
            command: probe_command(),
            active_deadline_seconds: 1800,
            image_pull_secrets: Vec::new(),
            needs: RuntimeSpec::default(),
        }
    }
}

/// `cudastack-verify-<repository>-<gpu>-<first 8 digest hex digits>`, shortened to a valid
/// Job name: stable for one image and GPU type, distinct across digests.
pub fn default_job_name(image: &PinnedImage, gpu_type: Option<&str>) -> String {
    let short = &image.digest.hex()[..8];
    let repository = image.path().rsplit('/').next().unwrap_or("image");
    let mut middle = slug(repository, 20);
    if let Some(gpu) = gpu_type {
        let gpu = slug(gpu.trim_start_matches("NVIDIA-"), 16);
        if !gpu.is_empty() {
            middle = format!("{middle}-{gpu}");
        }
    }
    let name = format!("cudastack-verify-{middle}-{short}");
    debug_assert!(is_dns_label(&name), "{name}");
    name
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_`, `.`
/// inside, starting and ending alphanumeric.
pub(super) fn is_label_value(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && text.as_bytes()[0].is_ascii_alphanumeric()
        && text.as_bytes()[text.len() - 1].is_ascii_alphanumeric()
}

/// An RFC 1123 subdomain, the rule for Secret names: at most 253 characters, dot-separated
/// lowercase alphanumerics and `-`, starting and ending alphanumeric
/// (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names).
fn is_dns_subdomain(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
        && text.as_bytes()[0].is_ascii_alphanumeric()
        && text.as_bytes()[text.len() - 1].is_ascii_alphanumeric()
}

// The Kubernetes objects both Jobs are made of (the probe's here, the team's in
// `training`): the fields either one sets, the others left out of the YAML.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Object<'a, S> {
    pub(super) api_version: &'static str,
    pub(super) kind: &'static str,
    pub(super) metadata: Metadata<'a>,
    pub(super) spec: S,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Metadata<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) namespace: Option<&'a str>,
    pub(super) labels: BTreeMap<&'static str, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) annotations: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JobBody<'a> {
    pub(super) backoff_limit: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) active_deadline_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) completions: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) parallelism: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) completion_mode: Option<&'static str>,
    pub(super) template: PodTemplate<'a>,
}

#[derive(Serialize)]
pub(super) struct PodTemplate<'a> {
    pub(super) metadata: Metadata<'a>,
    pub(super) spec: PodSpec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PodSpec<'a> {
    pub(super) restart_policy: &'static str,
    pub(super) automount_service_account_token: bool,
    /// With a headless Service of this name, the pods of an Indexed Job get DNS names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) subdomain: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) affinity: Option<Affinity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) image_pull_secrets: Vec<SecretReference<'a>>,
    pub(super) tolerations: Vec<Toleration>,
    pub(super) containers: Vec<Container>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) volumes: Vec<Volume>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) resource_claims: Vec<PodResourceClaim>,
}

/// A pod's DRA claim made from a ResourceClaimTemplate.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PodResourceClaim {
    pub(super) name: &'static str,
    pub(super) resource_claim_template_name: String,
}

/// The memory-backed /dev/shm (https://kubernetes.io/docs/concepts/storage/volumes/#emptydir).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Volume {
    pub(super) name: &'static str,
    pub(super) empty_dir: EmptyDir,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct EmptyDir {
    pub(super) medium: &'static str,
    pub(super) size_limit: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct VolumeMount {
    pub(super) name: &'static str,
    pub(super) mount_path: &'static str,
}

pub(super) const SHM_VOLUME: &str = "dshm";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Affinity {
    pub(super) node_affinity: NodeAffinity,
}

#[derive(Serialize)]
pub(super) struct NodeAffinity {
    #[serde(rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub(super) required: NodeSelector,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NodeSelector {
    pub(super) node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NodeSelectorTerm {
    pub(super) match_expressions: Vec<Requirement>,
}

#[derive(Serialize, Clone)]
pub(super) struct Requirement {
    pub(super) key: &'static str,
    pub(super) operator: &'static str,
    pub(super) values: Vec<String>,
}

/// A `LocalObjectReference`: a Secret of the pod's namespace, by name.
#[derive(Serialize)]
pub(super) struct SecretReference<'a> {
    pub(super) name: &'a str,
}

#[derive(Serialize)]
pub(super) struct Toleration {
    pub(super) key: &'static str,
    pub(super) operator: &'static str,
    pub(super) effect: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Container {
    pub(super) name: &'static str,
    pub(super) image: String,
    pub(super) image_pull_policy: &'static str,
    pub(super) command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) working_dir: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) env: Vec<EnvVar>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) ports: Vec<ContainerPort>,
    pub(super) resources: Resources,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) volume_mounts: Vec<VolumeMount>,
    /// The report line also lands in the termination message when the probe fails, so
    /// `kubectl describe` shows it.
    pub(super) termination_message_policy: &'static str,
}

#[derive(Serialize)]
pub(super) struct EnvVar {
    pub(super) name: String,
    pub(super) value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ContainerPort {
    pub(super) name: &'static str,
    pub(super) container_port: u16,
}

/// The device plugin's GPUs as a limit, or DRA claims by name.
#[derive(Serialize)]
pub(super) struct Resources {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) limits: BTreeMap<&'static str, u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) claims: Vec<ClaimReference>,
}

#[derive(Serialize)]
pub(super) struct ClaimReference {
    pub(super) name: &'static str,
}

/// Render the Job as YAML (one document, deterministic), after checking every field the
/// API server would reject.
pub fn job_manifest(spec: &JobSpec) -> Result<String, ClusterError> {
    validate(spec)?;
    let body = to_yaml(&job(spec), "the Kubernetes Job")?;
    Ok(format!("{}{body}", usage_comment(spec)))
}

/// The fields the API server checks: RFC 1123 names, a GPU, a label value for the GPU type,
/// a command, a deadline.
fn validate(spec: &JobSpec) -> Result<(), ClusterError> {
    let invalid = |field, value: &str, rule| ClusterError::Invalid {
        field,
        value: value.to_string(),
        rule,
    };
    if !is_dns_label(&spec.name) {
        return Err(invalid("Job name", &spec.name, "an RFC 1123 label: at most 63 lowercase letters, digits or `-`, starting and ending with a letter or digit"));
    }
    if !is_dns_label(&spec.namespace) {
        return Err(invalid(
            "namespace",
            &spec.namespace,
            "an RFC 1123 label: at most 63 lowercase letters, digits or `-`",
        ));
    }
    if spec.gpu_count == 0 {
        return Err(invalid(
            "GPU count",
            "0",
            "the probe needs at least one GPU (`--gpus 1` or more)",
        ));
    }
    if let Some(gpu_type) = &spec.gpu_type {
        if !is_label_value(gpu_type) {
            return Err(invalid("GPU type", gpu_type, "a value of the node label nvidia.com/gpu.product, e.g. NVIDIA-A100-SXM4-80GB (see `kubectl get nodes -L nvidia.com/gpu.product`)"));
        }
    }
    for secret in &spec.image_pull_secrets {
        if !is_dns_subdomain(secret) {
            return Err(invalid("image pull Secret name", secret, "a Secret name is an RFC 1123 subdomain: at most 253 lowercase letters, digits, `-` or `.`, starting and ending with a letter or digit (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names)"));
        }
    }
    if spec.command.is_empty() {
        return Err(invalid("command", "", "the container needs a command"));
    }
    if spec.active_deadline_seconds == 0 {
        return Err(invalid(
            "active deadline",
            "0",
            "a Job deadline must be at least one second",
        ));
    }
    Ok(())
}

/// The labels on the Job and its pod: what made it, the image digest, the GPU type.
fn labels(spec: &JobSpec) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::new();
    labels.insert("app.kubernetes.io/name", "cudastack-verify".to_string());
    labels.insert("app.kubernetes.io/managed-by", "cudastack".to_string());
    labels.insert(
        "io.cudastack/digest",
        spec.image.digest.hex()[..12].to_string(),
    );
    if let Some(gpu_type) = &spec.gpu_type {
        labels.insert("io.cudastack/gpu-type", gpu_type.clone());
    }
    labels
}

/// The Job: no retries, a deadline, one pod running the probe.
fn job(spec: &JobSpec) -> Object<'_, JobBody<'_>> {
    let labels = labels(spec);
    let mut annotations = BTreeMap::new();
    annotations.insert("io.cudastack/image", spec.image.by_digest());
    Object {
        api_version: "batch/v1",
        kind: "Job",
        metadata: Metadata {
            name: Some(&spec.name),
            namespace: Some(&spec.namespace),
            labels: labels.clone(),
            annotations,
        },
        spec: JobBody {
            backoff_limit: 0,
            active_deadline_seconds: Some(spec.active_deadline_seconds),
            completions: None,
            parallelism: None,
            completion_mode: None,
            template: PodTemplate {
                metadata: Metadata {
                    name: None,
                    namespace: None,
                    labels,
                    annotations: BTreeMap::new(),
                },
                spec: pod_spec(spec),
            },
        },
    }
}

/// The pod: never restarted, no service account token, on a node of the GPU type (when
/// one is given), tolerating GPU taints, one probe container with the GPUs as its limit.
fn pod_spec(spec: &JobSpec) -> PodSpec<'_> {
    PodSpec {
        restart_policy: "Never",
        automount_service_account_token: false,
        subdomain: None,
        affinity: spec.gpu_type.as_deref().map(gpu_type_affinity),
        image_pull_secrets: pull_secrets(&spec.image_pull_secrets),
        tolerations: gpu_tolerations(),
        containers: vec![Container {
            name: "probe",
            image: spec.image.by_digest(),
            image_pull_policy: "IfNotPresent",
            command: logged_command(spec),
            working_dir: None,
            env: Vec::new(),
            ports: Vec::new(),
            resources: Resources {
                limits: BTreeMap::from([(GPU_RESOURCE, spec.gpu_count)]),
                claims: Vec::new(),
            },
            volume_mounts: shm_volume(&spec.needs)
                .map(|_| VolumeMount {
                    name: SHM_VOLUME,
                    mount_path: "/dev/shm",
                })
                .into_iter()
                .collect(),
            termination_message_policy: "FallbackToLogsOnError",
        }],
        volumes: shm_volume(&spec.needs).into_iter().collect(),
        resource_claims: Vec::new(),
    }
}

/// The pod's `imagePullSecrets`: Secrets of its namespace, by name.
pub(super) fn pull_secrets(names: &[String]) -> Vec<SecretReference<'_>> {
    names.iter().map(|name| SecretReference { name }).collect()
}

/// GPU node pools commonly carry the `nvidia.com/gpu` taint: tolerate it.
pub(super) fn gpu_tolerations() -> Vec<Toleration> {
    vec![Toleration {
        key: GPU_RESOURCE,
        operator: "Exists",
        effect: "NoSchedule",
    }]
}

/// A /dev/shm of the image's size: an emptyDir in memory (counted against the pod's memory).
pub(super) fn shm_volume(needs: &RuntimeSpec) -> Option<Volume> {
    needs.shm_size.map(|size| Volume {
        name: SHM_VOLUME,
        empty_dir: EmptyDir {
            medium: "Memory",
            size_limit: quantity(size),
        },
    })
}

/// A byte count as a Kubernetes quantity: `16Gi`, `512Mi`, else bytes.
fn quantity(bytes: u64) -> String {
    for (unit, size) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)] {
        if bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The container's command: print the image's log line, then run `spec.command` in its
/// place (`exec`), so the pod log says which image the report is about.
fn logged_command(spec: &JobSpec) -> Vec<String> {
    let mut command: Vec<String> = ["/bin/sh", "-c", r#"echo "$0"; exec "$@""#]
        .map(String::from)
        .to_vec();
    command.push(spec.image.log_line());
    command.extend(spec.command.iter().cloned());
    command
}

/// The node labels GPU feature discovery sets to the driver's version, as integers:
/// `550`, `54`, `15` (a driver without a patch has an empty `rev`).
pub const DRIVER_MAJOR_LABEL: &str = "nvidia.com/cuda.driver.major";
pub const DRIVER_MINOR_LABEL: &str = "nvidia.com/cuda.driver.minor";
pub const DRIVER_REV_LABEL: &str = "nvidia.com/cuda.driver.rev";

/// Node affinity admitting exactly the nodes of `placement`: a verified product (the
/// `nvidia.com/gpu.product` label) with a driver at or above the floor. Terms are ORed and
/// their expressions ANDed, so the floor `a.b.c` is three terms (branch above `a`; branch
/// `a`, minor above `b`; branch `a`, minor `b`, patch at least `c`), each with the products.
/// `Gt`/`Lt` compare the labels as integers (a patch label `05` is 5); a node without the
/// driver labels matches no term: an unknown driver is never admitted.
pub(super) fn placement_affinity(placement: &Placement) -> Affinity {
    let products = Requirement {
        key: GPU_PRODUCT_LABEL,
        operator: "In",
        values: placement.products.iter().map(|p| p.node_label()).collect(),
    };
    let [branch, minor, patch] = placement.driver_floor.parts();
    let above = |key, value: i64| Requirement {
        key,
        operator: "Gt",
        values: vec![value.to_string()],
    };
    let at_least = |key, value: u32| above(key, i64::from(value) - 1);
    let exactly = |key, value: u32| {
        [
            at_least(key, value),
            Requirement {
                key,
                operator: "Lt",
                values: vec![(value + 1).to_string()],
            },
        ]
    };
    let mut terms = vec![
        vec![above(DRIVER_MAJOR_LABEL, branch.into())],
        [
            exactly(DRIVER_MAJOR_LABEL, branch).to_vec(),
            vec![above(DRIVER_MINOR_LABEL, minor.into())],
        ]
        .concat(),
    ];
    let mut last = [
        exactly(DRIVER_MAJOR_LABEL, branch),
        exactly(DRIVER_MINOR_LABEL, minor),
    ]
    .concat();
    if patch > 0 {
        last.push(at_least(DRIVER_REV_LABEL, patch));
    }
    terms.push(last);
    Affinity {
        node_affinity: NodeAffinity {
            required: NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|driver| NodeSelectorTerm {
                        match_expressions: std::iter::once(products.clone())
                            .chain(driver)
                            .collect(),
                    })
                    .collect(),
            },
        },
    }
}

/// The placement as the `affinity:` of a pod spec, for teams that write their own
/// manifests (`cudastack place IMAGE`).
pub fn affinity_yaml(placement: &Placement) -> Result<String, ClusterError> {
    #[derive(Serialize)]
    struct PodSpecPart {
        affinity: Affinity,
    }
    let body = to_yaml(
        &PodSpecPart {
            affinity: placement_affinity(placement),
        },
        "the node affinity",
    )?;
    Ok(format!(
        "# Node affinity generated by cudastack: {}.\n# Paste under the pod spec (spec.template.spec of a Job).\n{body}",
        placement.summary()
    ))
}

fn gpu_type_affinity(gpu_type: &str) -> Affinity {
    Affinity {
        node_affinity: NodeAffinity {
            required: NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: vec![Requirement {
                        key: GPU_PRODUCT_LABEL,
                        operator: "In",
                        values: vec![gpu_type.to_string()],
                    }],
                }],
            },
        },
    }
}

/// The comment above the YAML: how to apply the Job, wait for it and verify its log.
fn usage_comment(spec: &JobSpec) -> String {
    let mut ulimits = String::new();
    if !spec.needs.ulimits.is_empty() {
        let limits: Vec<String> = spec
            .needs
            .ulimits
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        ulimits = format!("# The image asks for ulimits {} (-1: unlimited); Kubernetes has no per-pod\n# ulimits: set them in the nodes' container runtime (containerd's LimitMEMLOCK, ...).\n", limits.join(", "));
    }
    ulimits
        + &format!(
            "# Verification Job generated by cudastack: runs the probe in {image} on {gpus}.\n\
         #   kubectl apply -f THIS_FILE\n\
         #   kubectl wait -n {ns} --for=condition=complete --timeout={deadline}s job/{name}\n\
         #   kubectl logs -n {ns} job/{name} > {name}.log\n\
         #   cudastack verify {named} --from-log {name}.log\n",
            image = spec.image.by_digest(),
            named = spec.image.named(),
            gpus = match &spec.gpu_type {
                Some(gpu_type) => format!("{} x {gpu_type}", spec.gpu_count),
                None => format!("{} GPU(s) of any type", spec.gpu_count),
            },
            ns = spec.namespace,
            name = spec.name,
            deadline = spec.active_deadline_seconds,
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> PinnedImage {
        "ghcr.io/acme/torch:2.4.1@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860"
            .parse()
            .unwrap()
    }

    #[test]
    fn manifest_pins_digest_gpu_type_and_never_retries() {
        let spec = JobSpec::probe(image(), Some("NVIDIA-A100-SXM4-80GB".into()));
        assert_eq!(spec.name, "cudastack-verify-torch-a100-sxm4-80gb-4a5d132a");
        let yaml = job_manifest(&spec).unwrap();
        insta::assert_snapshot!(yaml);
        // Deterministic: the same spec renders the same bytes.
        assert_eq!(yaml, job_manifest(&spec).unwrap());
    }

    /// The image's runtime needs: /dev/shm as a memory emptyDir of its size, the
    /// ulimits named for the node's runtime; nothing of either without them.
    #[test]
    fn runtime_needs_mount_a_memory_dev_shm() {
        let mut spec = JobSpec::probe(image(), None);
        assert!(!job_manifest(&spec).unwrap().contains("volumes"));
        let labels = BTreeMap::from([
            (
                "io.cudastack.runtime.shm-size".to_string(),
                "17179869184".to_string(),
            ),
            (
                "io.cudastack.runtime.ulimit.memlock".to_string(),
                "-1".to_string(),
            ),
        ]);
        spec.needs = RuntimeSpec::from_labels(&labels).unwrap();
        let yaml = job_manifest(&spec).unwrap();
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let pod = &value["spec"]["template"]["spec"];
        assert_eq!(
            pod["volumes"],
            serde_json::json!([{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}])
        );
        assert_eq!(
            pod["containers"][0]["volumeMounts"],
            serde_json::json!([{"name": "dshm", "mountPath": "/dev/shm"}])
        );
        assert!(yaml.contains("ulimits memlock=-1"), "{yaml}");
        assert_eq!(quantity(512 << 20), "512Mi");
        assert_eq!(quantity((1 << 20) + 1), "1048577");
    }

    #[test]
    fn without_a_gpu_type_there_is_no_affinity() {
        let mut spec = JobSpec::probe(image(), None);
        spec.gpu_count = 2;
        let yaml = job_manifest(&spec).unwrap();
        assert!(!yaml.contains("affinity"), "{yaml}");
        assert!(yaml.contains("nvidia.com/gpu: 2"), "{yaml}");
        assert!(yaml.contains("2 GPU(s) of any type"), "{yaml}");
    }

    #[test]
    fn invalid_fields_are_refused_with_the_rule() {
        let mut spec = JobSpec::probe(image(), Some("A100 80GB".into()));
        let error = job_manifest(&spec).unwrap_err().to_string();
        assert!(error.contains("nvidia.com/gpu.product"), "{error}");
        spec.gpu_type = None;
        spec.gpu_count = 0;
        assert!(job_manifest(&spec)
            .unwrap_err()
            .to_string()
            .contains("GPU count"));
        spec.gpu_count = 1;
        spec.name = "Verify_Torch".into();
        assert!(job_manifest(&spec)
            .unwrap_err()
            .to_string()
            .contains("Job name"));
        spec.name = "ok".into();
        spec.namespace = "".into();
        assert!(job_manifest(&spec)
            .unwrap_err()
            .to_string()
            .contains("namespace"));
    }

    #[test]
    fn image_pull_secrets_go_into_the_pod_spec_and_are_validated() {
        let mut spec = JobSpec::probe(image(), None);
        let yaml = job_manifest(&spec).unwrap();
        assert!(!yaml.contains("imagePullSecrets"), "{yaml}");
        spec.image_pull_secrets = vec!["ghcr-pull".into(), "team.registry-creds".into()];
        let yaml = job_manifest(&spec).unwrap();
        assert!(
            yaml.contains(
                "      imagePullSecrets:\n      - name: ghcr-pull\n      - name: team.registry-creds\n"
            ),
            "{yaml}"
        );
        for bad in ["", "Ghcr", "-x", "x-", "a_b", &"a".repeat(254)] {
            spec.image_pull_secrets = vec![bad.to_string()];
            let error = job_manifest(&spec).unwrap_err().to_string();
            assert!(error.contains("image pull Secret name"), "{bad}: {error}");
        }
    }

    #[test]
    fn long_names_are_shortened_to_a_valid_label() {
        let image: PinnedImage = format!(
            "registry.example.com/team/{}@sha256:{}",
            "a-very-long-repository-name-for-torch-images",
            "0".repeat(64)
        )
        .parse()
        .unwrap();
        let name = default_job_name(&image, Some("NVIDIA-GeForce-RTX-4090-Laptop-GPU-Edition"));
        assert!(is_dns_label(&name), "{name}");
    }
}
