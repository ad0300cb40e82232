//! Beyond one machine: what cudastack hands to the engines clusters already run, so an
//! image built and verified here is published, re-verified and pulled there without a
//! home-made scheduler.
//!
//! It sits after the outputs in the pipeline: it reads recipes and built images and writes
//! text other systems execute: GitHub Actions workflows ([`workflows`]), a Kubernetes Job
//! that runs the probe on a GPU node ([`k8s`]), sbatch scripts for Slurm with enroot/pyxis
//! or Apptainer ([`slurm`]), and the checks that an image is runnable by those runtimes
//! ([`readiness`]). It never talks to a cluster itself: the cluster's own tools (kubectl,
//! sbatch, the Actions runner) run what it writes, and the pod or job log comes back to
//! `cudastack verify --from-log`. Every generator is a pure function of its input, so the
//! same input gives the same bytes and the committed workflow files can be compared with
//! the generator's output in a test.

pub mod admission;
pub mod dra;
pub mod job;
pub mod k8s;
pub mod placed;
pub mod placement;
pub mod readiness;
pub mod site_features;
pub mod slurm;
pub mod training;
pub mod workflows;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::digest::Digest;
use slurm::Runtime;

/// What a cluster generator refuses, with the field and the rule it breaks.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("image `{reference}` is not pinned by digest: expected REPOSITORY@sha256:<64 hex digits>, e.g. ghcr.io/acme/torch@sha256:…\n  hint: push the image (`cudastack push`) and use the digest it prints, so the cluster runs exactly the bytes that were built")]
    NotPinned { reference: String },
    #[error("invalid {field} `{value}`: {rule}")]
    Invalid {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("failed to read recipe directory `{path}`")]
    ReadDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the image cannot be placed: {why}\n  hint: {hint}")]
    Unplaceable { why: String, hint: String },
    /// Reading the image from its registry failed.
    #[error(transparent)]
    Read(Box<crate::pipeline::PipelineError>),
    #[error(transparent)]
    Recipe(#[from] crate::recipe::RecipeError),
    #[error("failed to render YAML for {what}")]
    Yaml {
        what: &'static str,
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// What `cudastack verify REF --emit TARGET` writes: `k8s-job`, `sbatch` (enroot +
/// pyxis) or `sbatch-apptainer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    K8sJob,
    Sbatch(Runtime),
}

impl FromStr for Emit {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "k8s-job" | "k8s" | "kubernetes" => Ok(Emit::K8sJob),
            "sbatch" | "sbatch-pyxis" | "sbatch-enroot" => Ok(Emit::Sbatch(Runtime::Pyxis)),
            "sbatch-apptainer" | "sbatch-singularity" => Ok(Emit::Sbatch(Runtime::Apptainer)),
            other => Err(format!(
                "unknown emit target `{other}`: expected k8s-job, sbatch (enroot + pyxis) or sbatch-apptainer"
            )),
        }
    }
}

/// The knobs `--emit` exposes; everything else takes the generators' defaults. Slurm's
/// partition, account and time limit need no flags here: `sbatch --partition=… FILE`
/// overrides the script's `#SBATCH` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmitOptions {
    /// Kubernetes: a value of the node label `nvidia.com/gpu.product`
    /// (`NVIDIA-A100-SXM4-80GB`). Slurm: the site's GRES type (`a100`).
    pub gpu_type: Option<String>,
    /// GPUs to ask for (default 1).
    pub gpus: Option<u32>,
    /// Kubernetes namespace (default `default`).
    pub namespace: Option<String>,
    /// Slurm: a squashfs/SIF made on the login node, for nodes without registry access.
    pub local_image: Option<PathBuf>,
    /// Kubernetes: Secrets the kubelet pulls a private image with (`imagePullSecrets`).
    pub image_pull_secrets: Vec<String>,
    /// What the image asks of the runtime (its `io.cudastack.runtime.*` labels,
    /// [`crate::recipe::RuntimeSpec::from_labels`]): /dev/shm size and ulimits.
    pub needs: crate::recipe::RuntimeSpec,
}

/// Render the verification job for `target`: one entry point for the CLI.
pub fn emit(
    target: Emit,
    image: PinnedImage,
    options: &EmitOptions,
) -> Result<String, ClusterError> {
    match target {
        Emit::K8sJob => {
            let mut spec = k8s::JobSpec::probe(image, options.gpu_type.clone());
            if let Some(gpus) = options.gpus {
                spec.gpu_count = gpus;
            }
            if let Some(namespace) = &options.namespace {
                spec.namespace = namespace.clone();
            }
            spec.image_pull_secrets = options.image_pull_secrets.clone();
            spec.needs = options.needs.clone();
            k8s::job_manifest(&spec)
        }
        Emit::Sbatch(_) if !options.image_pull_secrets.is_empty() => Err(ClusterError::Invalid {
            field: "image pull Secret",
            value: options.image_pull_secrets.join(", "),
            rule: "only a Kubernetes Job (--emit k8s-job) pulls with a Secret; on Slurm, enroot and Apptainer read the registry credentials of the user who runs the job",
        }),
        Emit::Sbatch(runtime) => {
            let mut spec = slurm::SbatchSpec::probe(image, runtime);
            spec.gpu_type = options.gpu_type.clone();
            if let Some(gpus) = options.gpus {
                spec.gpus = gpus;
            }
            spec.local_image = options.local_image.clone();
            spec.needs = options.needs.clone();
            slurm::sbatch_script(&spec)
        }
    }
}

/// An image reference pinned by digest: `REPOSITORY@sha256:HEX`, where REPOSITORY may
/// start with a registry host (`ghcr.io/acme/torch`). A tag before the digest
/// (`repo:tag@sha256:…`) is accepted and kept for display, but the digest is what runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedImage {
    /// `ghcr.io/acme/torch` (no tag, no digest).
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Digest,
}

impl PinnedImage {
    /// The registry host if the first path component names one (has a `.` or `:`, or is
    /// `localhost`), as Docker decides it; None means Docker Hub.
    pub fn registry(&self) -> Option<&str> {
        let (first, _) = self.repository.split_once('/')?;
        (first.contains('.') || first.contains(':') || first == "localhost").then_some(first)
    }

    /// The repository path inside the registry (`acme/torch`).
    pub fn path(&self) -> &str {
        match self.registry() {
            Some(host) => &self.repository[host.len() + 1..],
            None => &self.repository,
        }
    }

    /// `repository:tag@sha256:…` with the tag when there is one: the name `cudastack verify
    /// --from-log` records the job's report under (`tag-verified`).
    pub fn named(&self) -> String {
        match &self.tag {
            Some(tag) => format!("{}:{tag}@{}", self.repository, self.digest),
            None => self.by_digest(),
        }
    }

    /// The line a job prints before the probe runs, naming the image it runs
    /// (`cudastack-image-v1 repository@sha256:…`; see [`crate::verify::IMAGE_PREFIX`]).
    pub fn log_line(&self) -> String {
        format!("{}{}", crate::verify::IMAGE_PREFIX, self.by_digest())
    }

    /// `repository@sha256:…` without the tag: the form every runtime resolves the same.
    pub fn by_digest(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

impl fmt::Display for PinnedImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.by_digest())
    }
}

impl FromStr for PinnedImage {
    type Err = ClusterError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let not_pinned = || ClusterError::NotPinned {
            reference: text.to_string(),
        };
        let (name, digest) = text.rsplit_once('@').ok_or_else(not_pinned)?;
        let digest: Digest = digest.parse().map_err(|_| not_pinned())?;
        // A `:` after the last `/` separates a tag; one before it is a registry port.
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match name[last_slash..].find(':') {
            Some(colon) => (
                &name[..last_slash + colon],
                Some(name[last_slash + colon + 1..].to_string()),
            ),
            None => (name, None),
        };
        let valid_path = |s: &str| {
            !s.is_empty()
                && s.split('/').all(|part| {
                    !part.is_empty()
                        && part.bytes().all(|b| {
                            b.is_ascii_lowercase()
                                || b.is_ascii_digit()
                                || matches!(b, b'.' | b'_' | b'-')
                        })
                })
        };
        let image = PinnedImage {
            repository: repository.to_string(),
            tag,
            digest,
        };
        let host_ok = image.registry().is_none_or(|host| {
            host.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
        });
        if !host_ok || !valid_path(image.path()) {
            return Err(ClusterError::Invalid {
                field: "image repository",
                value: repository.to_string(),
                rule: "lowercase letters, digits, `.`, `_`, `-` in `/`-separated components, optionally after a registry host",
            });
        }
        Ok(image)
    }
}

/// Serialise `value` as block YAML in field order. Long strings stay on one line (no
/// folded `>-` scalars), so a reader sees a digest or a shell command as written.
pub(crate) fn to_yaml<T: serde::Serialize>(
    value: &T,
    what: &'static str,
) -> Result<String, ClusterError> {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.prefer_block_scalars = false;
    serde_saphyr::to_string_with_options(value, options)
        .map_err(|source| ClusterError::Yaml { what, source })
}

/// `true` for a valid RFC 1123 DNS label (Kubernetes namespaces, container names):
/// at most 63 lowercase alphanumerics or `-`, starting and ending alphanumeric.
pub(crate) fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// Lowercase `text` and replace every run of other characters by one `-`, trimmed to
/// `max` characters: `RTX 4090` -> `rtx-4090`.
pub(crate) fn slug(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.truncate(max);
    out.trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860";

    #[test]
    fn pinned_references_parse_into_parts() {
        let image: PinnedImage = format!("ghcr.io/acme/torch@sha256:{HEX}").parse().unwrap();
        assert_eq!(image.registry(), Some("ghcr.io"));
        assert_eq!(image.path(), "acme/torch");
        assert_eq!(image.tag, None);
        assert_eq!(
            image.to_string(),
            format!("ghcr.io/acme/torch@sha256:{HEX}")
        );

        let with_port: PinnedImage = format!("localhost:5000/torch:2.4.1@sha256:{HEX}")
            .parse()
            .unwrap();
        assert_eq!(with_port.registry(), Some("localhost:5000"));
        assert_eq!(with_port.path(), "torch");
        assert_eq!(with_port.tag.as_deref(), Some("2.4.1"));
        assert_eq!(
            with_port.by_digest(),
            format!("localhost:5000/torch@sha256:{HEX}")
        );

        let hub: PinnedImage = format!("library/busybox@sha256:{HEX}").parse().unwrap();
        assert_eq!(hub.registry(), None);
        assert_eq!(hub.path(), "library/busybox");
    }

    #[test]
    fn tags_and_bad_repositories_are_refused() {
        for text in [
            "ghcr.io/acme/torch:2.4.1",
            "ghcr.io/acme/torch@sha256:abc",
            "ghcr.io/acme/torch@md5:00",
        ] {
            let error = text.parse::<PinnedImage>().unwrap_err();
            assert!(matches!(error, ClusterError::NotPinned { .. }), "{text}");
            assert!(error.to_string().contains("REPOSITORY@sha256"), "{error}");
        }
        for text in [
            format!("ghcr.io/Acme/torch@sha256:{HEX}"),
            format!("@sha256:{HEX}"),
            format!("ghcr.io//torch@sha256:{HEX}"),
        ] {
            assert!(
                matches!(
                    text.parse::<PinnedImage>(),
                    Err(ClusterError::Invalid { .. })
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn emit_targets() {
        let image: PinnedImage = format!("ghcr.io/acme/torch@sha256:{HEX}").parse().unwrap();
        let options = EmitOptions {
            gpu_type: Some("a100".into()),
            gpus: Some(2),
            ..Default::default()
        };
        let job = emit("k8s-job".parse().unwrap(), image.clone(), &options).unwrap();
        assert!(
            job.contains("nvidia.com/gpu: 2") && job.contains("- a100"),
            "{job}"
        );
        let pyxis = emit("sbatch".parse().unwrap(), image.clone(), &options).unwrap();
        assert!(
            pyxis.contains("#SBATCH --gres=gpu:a100:2") && pyxis.contains("--container-image=")
        );
        let apptainer = emit("sbatch-apptainer".parse().unwrap(), image, &options).unwrap();
        assert!(apptainer.contains("apptainer exec --nv"));
        assert!("docker-compose"
            .parse::<Emit>()
            .unwrap_err()
            .contains("k8s-job"));
    }

    #[test]
    fn slugs_and_dns_labels() {
        assert_eq!(slug("RTX 4090", 63), "rtx-4090");
        assert_eq!(slug("  A100 (80GB) ", 63), "a100-80gb");
        assert_eq!(slug("torch2.4.1-cu121-py3.11", 10), "torch2-4-1");
        assert!(is_dns_label("gpu-operator"));
        assert!(!is_dns_label("-x"));
        assert!(!is_dns_label("Upper"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
