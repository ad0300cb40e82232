//! The team's training job on Kubernetes: the image's own entrypoint on the nodes its
//! verified matrix admits, by node affinity over GPU feature discovery's labels or, with
//! DRA, by a ResourceClaimTemplate whose selector says the same.
//!
//! One node: a Job with one pod. Several: an Indexed Job (one pod per node, the completion
//! index as the node rank) and a headless Service of the same name, so pod 0 is reachable
//! as `NAME-0.NAME` for torchrun's rendezvous before any pod is ready
//! (`publishNotReadyAddresses`). /dev/shm is a memory emptyDir of the image's
//! `runtime.shm_size`; NCCL needs far more than the container runtime's 64 MiB default.
//! No retries (`backoffLimit: 0`): a failed rank fails the job, and restarting a training
//! run is the team's decision.

use std::collections::BTreeMap;

use serde::Serialize;

use super::dra::{self, ResourceApi};
use super::job::{TrainingJob, RENDEZVOUS_PORT};
use super::k8s::{
    gpu_tolerations, placement_affinity, pull_secrets, shm_volume, ClaimReference, Container,
    ContainerPort, EnvVar, JobBody, Metadata, Object, PodResourceClaim, PodSpec, PodTemplate,
    Resources, VolumeMount, GPU_RESOURCE, SHM_VOLUME,
};
use super::{is_dns_label, to_yaml, ClusterError};

/// How the pods get their GPUs: the device plugin's `nvidia.com/gpu` on nodes chosen by
/// affinity, or a DRA claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRequest {
    DevicePlugin,
    Dra(ResourceApi),
}

/// The Kubernetes settings of the job beyond [`TrainingJob`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesOptions {
    pub namespace: String,
    pub image_pull_secrets: Vec<String>,
    pub gpus: GpuRequest,
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        KubernetesOptions {
            namespace: "default".to_string(),
            image_pull_secrets: Vec::new(),
            gpus: GpuRequest::DevicePlugin,
        }
    }
}

/// The pod's index in an Indexed Job, as the container's command expands it.
const NODE_RANK: &str = "$(JOB_COMPLETION_INDEX)";

/// The manifests, one YAML stream: the ResourceClaimTemplate (DRA), the Service (several
/// nodes) and the Job.
pub fn training_manifests(
    job: &TrainingJob,
    options: &KubernetesOptions,
) -> Result<String, ClusterError> {
    job.validate()?;
    if !is_dns_label(&options.namespace) {
        return Err(ClusterError::Invalid {
            field: "namespace",
            value: options.namespace.clone(),
            rule: "an RFC 1123 label: at most 63 lowercase letters, digits or `-`",
        });
    }
    let mut documents = Vec::new();
    if let GpuRequest::Dra(api) = options.gpus {
        documents.push(dra::claim_template(
            &claim_template_name(job),
            &options.namespace,
            job.gpus_per_node,
            &job.placement,
            api,
        )?);
    }
    if job.nodes > 1 {
        documents.push(to_yaml(&service(job, options), "the Service")?);
    }
    documents.push(to_yaml(&job_object(job, options), "the Job")?);
    Ok(format!(
        "{}---\n{}",
        usage_comment(job, options),
        documents.join("---\n")
    ))
}

fn claim_template_name(job: &TrainingJob) -> String {
    format!("{}-gpus", job.name)
}

/// The pods' host names `NAME-INDEX` resolve under the Service `NAME`.
fn master_address(job: &TrainingJob) -> String {
    format!("{}-0.{}", job.name, job.name)
}

/// The headless Service's spec.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceSpec<'a> {
    #[serde(rename = "clusterIP")]
    cluster_ip: &'static str,
    publish_not_ready_addresses: bool,
    selector: BTreeMap<&'static str, &'a str>,
    ports: Vec<Port>,
}

#[derive(Serialize)]
struct Port {
    name: &'static str,
    port: u16,
}

fn metadata<'a>(
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    job: &TrainingJob,
) -> Metadata<'a> {
    Metadata {
        name,
        namespace,
        labels: labels(job),
        annotations: BTreeMap::new(),
    }
}

fn labels(job: &TrainingJob) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by", "cudastack".to_string()),
        ("app.kubernetes.io/name", "cudastack-train".to_string()),
        (
            "io.cudastack/digest",
            job.image.digest.hex()[..12].to_string(),
        ),
    ])
}

/// The headless Service that gives each pod of the Indexed Job a DNS name.
fn service<'a>(
    job: &'a TrainingJob,
    options: &'a KubernetesOptions,
) -> Object<'a, ServiceSpec<'a>> {
    Object {
        api_version: "v1",
        kind: "Service",
        metadata: metadata(Some(&job.name), Some(&options.namespace), job),
        spec: ServiceSpec {
            cluster_ip: "None",
            publish_not_ready_addresses: true,
            selector: BTreeMap::from([("batch.kubernetes.io/job-name", job.name.as_str())]),
            ports: vec![Port {
                name: "rendezvous",
                port: RENDEZVOUS_PORT,
            }],
        },
    }
}

const CLAIM: &str = "gpus";

fn job_object<'a>(job: &'a TrainingJob, options: &'a KubernetesOptions) -> Object<'a, JobBody<'a>> {
    let multi = job.nodes > 1;
    Object {
        api_version: "batch/v1",
        kind: "Job",
        metadata: metadata(Some(&job.name), Some(&options.namespace), job),
        spec: JobBody {
            backoff_limit: 0,
            active_deadline_seconds: None,
            completions: Some(job.nodes),
            parallelism: Some(job.nodes),
            completion_mode: multi.then_some("Indexed"),
            template: PodTemplate {
                metadata: metadata(None, None, job),
                spec: pod_spec(job, options),
            },
        },
    }
}

fn pod_spec<'a>(job: &'a TrainingJob, options: &'a KubernetesOptions) -> PodSpec<'a> {
    let dra = matches!(options.gpus, GpuRequest::Dra(_));
    let shm = shm_volume(&job.needs);
    PodSpec {
        restart_policy: "Never",
        // The team's code needs no Kubernetes API credentials.
        automount_service_account_token: false,
        subdomain: (job.nodes > 1).then_some(job.name.as_str()),
        // With DRA the claim's selector places the pod; GPU feature discovery's labels may
        // not exist on a DRA cluster.
        affinity: (!dra).then(|| placement_affinity(&job.placement)),
        image_pull_secrets: pull_secrets(&options.image_pull_secrets),
        tolerations: gpu_tolerations(),
        containers: vec![container(job, dra, shm.is_some())],
        volumes: shm.into_iter().collect(),
        resource_claims: if dra {
            vec![PodResourceClaim {
                name: CLAIM,
                resource_claim_template_name: claim_template_name(job),
            }]
        } else {
            Vec::new()
        },
    }
}

fn container(job: &TrainingJob, dra: bool, shm: bool) -> Container {
    let master = master_address(job);
    Container {
        name: "train",
        image: job.image.by_digest(),
        image_pull_policy: "IfNotPresent",
        command: job.node_command(NODE_RANK, &master),
        working_dir: job.working_dir.clone(),
        env: job
            .rendezvous_env(NODE_RANK, &master)
            .into_iter()
            .map(|(name, value)| EnvVar { name, value })
            .collect(),
        ports: if job.nodes > 1 {
            vec![ContainerPort {
                name: "rendezvous",
                container_port: RENDEZVOUS_PORT,
            }]
        } else {
            Vec::new()
        },
        resources: if dra {
            Resources {
                limits: BTreeMap::new(),
                claims: vec![ClaimReference { name: CLAIM }],
            }
        } else {
            Resources {
                limits: BTreeMap::from([(GPU_RESOURCE, job.gpus_per_node)]),
                claims: Vec::new(),
            }
        },
        volume_mounts: if shm {
            vec![VolumeMount {
                name: SHM_VOLUME,
                mount_path: "/dev/shm",
            }]
        } else {
            Vec::new()
        },
        // A failed rank's last lines show in `kubectl describe`.
        termination_message_policy: "FallbackToLogsOnError",
    }
}

fn usage_comment(job: &TrainingJob, options: &KubernetesOptions) -> String {
    format!(
        "# Training job generated by cudastack: {image}\n\
         # on {nodes} node(s) x {gpus} GPU(s), admitted where it was verified: {placement}.\n\
         #   kubectl apply -f THIS_FILE\n\
         #   kubectl logs -n {ns} -f job/{name}\n",
        image = job.image.by_digest(),
        nodes = job.nodes,
        gpus = job.gpus_per_node,
        placement = job.placement.summary(),
        ns = options.namespace,
        name = job.name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::job::tests::job;

    fn parse(yaml: &str) -> Vec<serde_json::Value> {
        yaml.split("\n---\n")
            .skip(1)
            .map(|doc| serde_saphyr::from_str(doc).unwrap())
            .collect()
    }

    #[test]
    fn one_node_is_a_plain_job_with_the_placement_affinity() {
        let yaml = training_manifests(
            &job(&["python", "train.py"], 1, 1),
            &KubernetesOptions::default(),
        )
        .unwrap();
        let docs = parse(&yaml);
        assert_eq!(docs.len(), 1, "{yaml}");
        let pod = &docs[0]["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["command"],
            serde_json::json!(["python", "train.py"])
        );
        let terms = &pod["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert_eq!(terms.as_array().unwrap().len(), 3, "{yaml}");
        assert_eq!(docs[0]["spec"].get("completionMode"), None);
    }

    #[test]
    fn several_nodes_are_an_indexed_job_behind_a_headless_service() {
        let mut job = job(&["python", "train.py"], 2, 8);
        job.needs.shm_size = Some(16 << 30);
        let options = KubernetesOptions {
            namespace: "ml".into(),
            gpus: GpuRequest::Dra(ResourceApi::V1),
            ..Default::default()
        };
        let docs = parse(&training_manifests(&job, &options).unwrap());
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ResourceClaimTemplate", "Service", "Job"]);
        let pod = &docs[2]["spec"]["template"]["spec"];
        assert_eq!(pod["subdomain"], "train");
        assert_eq!(docs[2]["spec"]["completionMode"], "Indexed");
        let command = pod["containers"][0]["command"].as_array().unwrap();
        assert!(command.contains(&serde_json::json!("--node-rank=$(JOB_COMPLETION_INDEX)")));
        assert!(command.contains(&serde_json::json!("--master-addr=train-0.train")));
        assert_eq!(
            pod["resourceClaims"][0]["resourceClaimTemplateName"],
            "train-gpus"
        );
        assert_eq!(pod.get("affinity"), None);
        assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "16Gi");
    }
}
