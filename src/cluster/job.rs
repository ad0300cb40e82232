//! The team's training job, as the cluster generators emit it: the image by digest, its
//! own entrypoint (not the probe), on the nodes its verified matrix admits
//! ([`Placement`]), one process per GPU.
//!
//! On one GPU the entrypoint runs as written. On several, a Python entrypoint
//! (`python train.py …`, `python -m pkg …`) is started through `torch.distributed.run`
//! (torchrun), one process per GPU; across nodes with a static rendezvous on the first
//! node, which the Kubernetes and Slurm generators name in their own terms (the indexed
//! pod 0 behind a headless Service; the first node of the allocation). Any other entrypoint
//! runs once per node with the rendezvous in the environment torchrun itself reads
//! (`MASTER_ADDR`, `MASTER_PORT`, `NNODES`, `NODE_RANK`, `NPROC_PER_NODE`).

use super::placement::Placement;
use super::{is_dns_label, slug, ClusterError, PinnedImage};
use crate::recipe::RuntimeSpec;

/// The port of the rendezvous on the first node (torchrun's default).
pub const RENDEZVOUS_PORT: u16 = 29500;

/// What a training job runs and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainingJob {
    /// An RFC 1123 label: the Kubernetes Job and Service name, the Slurm job name.
    pub name: String,
    pub image: PinnedImage,
    /// The image's entrypoint followed by its command (the config's Entrypoint + Cmd),
    /// without the start guard.
    pub command: Vec<String>,
    /// The start guard's words when the image has one (`runtime: { guard: true }`):
    /// they go in front of what each node runs, so the guard checks the node once and the
    /// launcher (torchrun) behind it sees the team's command.
    pub start_guard: Vec<String>,
    /// The image's working directory, when its config sets one.
    pub working_dir: Option<String>,
    /// Nodes (pods) the job spans, at least 1.
    pub nodes: u32,
    /// GPUs each node gives the job, at least 1.
    pub gpus_per_node: u32,
    /// What the image asks of the runtime: /dev/shm size, ulimits.
    pub needs: RuntimeSpec,
    pub placement: Placement,
}

/// How the entrypoint is started on each node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// One process: the entrypoint as written.
    AsWritten,
    /// `python -m torch.distributed.run …` in front of the script or module.
    Torchrun,
    /// The entrypoint as written, once per node, with the rendezvous in its environment.
    Environment,
}

impl TrainingJob {
    /// `<repository>-<first 8 digest hex digits>`: stable for one image, distinct across
    /// digests, a valid job name.
    pub fn default_name(image: &PinnedImage) -> String {
        let repository = image.path().rsplit('/').next().unwrap_or("train");
        let base = match slug(repository, 30) {
            base if base.is_empty() || !base.as_bytes()[0].is_ascii_lowercase() => {
                format!("train-{base}")
            }
            base => base,
        };
        format!(
            "{}-{}",
            base.trim_end_matches('-'),
            &image.digest.hex()[..8]
        )
    }

    /// The fields every generator needs valid.
    pub fn validate(&self) -> Result<(), ClusterError> {
        let invalid = |field, value: String, rule| ClusterError::Invalid { field, value, rule };
        if !is_dns_label(&self.name) || self.name.len() > 48 {
            return Err(invalid("job name", self.name.clone(), "an RFC 1123 label of at most 48 characters (lowercase letters, digits, `-`): pods are named after it with a suffix"));
        }
        if self.nodes == 0 {
            return Err(invalid(
                "nodes",
                "0".into(),
                "a job runs on at least one node",
            ));
        }
        if self.gpus_per_node == 0 {
            return Err(invalid(
                "GPUs per node",
                "0".into(),
                "a training job asks for at least one GPU per node",
            ));
        }
        if self.command.is_empty() {
            return Err(invalid("command", String::new(), "the image has no entrypoint or command: set `entrypoint:` in the recipe, or give the command after `--`"));
        }
        Ok(())
    }

    /// Whether the job has more than one process.
    pub fn distributed(&self) -> bool {
        self.nodes > 1 || self.gpus_per_node > 1
    }

    /// How the entrypoint starts: torchrun for a Python entrypoint with more than one
    /// process.
    pub fn launch(&self) -> Launch {
        if !self.distributed() {
            Launch::AsWritten
        } else if python_target(&self.command).is_some() {
            Launch::Torchrun
        } else {
            Launch::Environment
        }
    }

    /// The command each node runs. `node_rank` and `master_addr` are the scheduler's own
    /// spelling of the node's index and the first node's address (`$(JOB_COMPLETION_INDEX)`,
    /// `$SLURM_NODEID`), kept as given for the runtime to expand.
    pub fn node_command(&self, node_rank: &str, master_addr: &str) -> Vec<String> {
        let mut command = self.start_guard.clone();
        command.extend(self.launcher(node_rank, master_addr));
        command
    }

    /// What runs behind the guard: torchrun and the team's command, or the command.
    fn launcher(&self, node_rank: &str, master_addr: &str) -> Vec<String> {
        match (self.launch(), python_target(&self.command)) {
            (Launch::Torchrun, Some((python, target))) => {
                let mut command = vec![
                    python.to_string(),
                    "-m".to_string(),
                    "torch.distributed.run".to_string(),
                    format!("--nnodes={}", self.nodes),
                    format!("--nproc-per-node={}", self.gpus_per_node),
                ];
                if self.nodes == 1 {
                    command.push("--standalone".to_string());
                } else {
                    command.extend([
                        format!("--node-rank={node_rank}"),
                        format!("--master-addr={master_addr}"),
                        format!("--master-port={RENDEZVOUS_PORT}"),
                    ]);
                }
                command.extend(target.iter().cloned());
                command
            }
            _ => self.command.clone(),
        }
    }

    /// The rendezvous variables for [`Launch::Environment`] (empty otherwise), with the
    /// same placeholders as [`Self::node_command`].
    pub fn rendezvous_env(&self, node_rank: &str, master_addr: &str) -> Vec<(String, String)> {
        if self.launch() != Launch::Environment {
            return Vec::new();
        }
        [
            ("MASTER_ADDR", master_addr.to_string()),
            ("MASTER_PORT", RENDEZVOUS_PORT.to_string()),
            ("NNODES", self.nodes.to_string()),
            ("NODE_RANK", node_rank.to_string()),
            ("NPROC_PER_NODE", self.gpus_per_node.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// For `python[3[.X]] [-u …] SCRIPT ARGS` or `python -m MODULE ARGS`: the interpreter and
/// what torchrun takes in its place (`SCRIPT ARGS`, `-m MODULE ARGS`). Interpreter options
/// other than `-u` make it None: torchrun would not pass them on.
fn python_target(command: &[String]) -> Option<(&str, &[String])> {
    let (python, rest) = command.split_first()?;
    let base = python.rsplit('/').next().unwrap_or(python);
    let is_python = base == "python"
        || base == "python3"
        || base
            .strip_prefix("python3.")
            .is_some_and(|minor| !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit()));
    if !is_python {
        return None;
    }
    let rest = match rest.first().map(String::as_str) {
        Some("-u") => &rest[1..],
        _ => rest,
    };
    match rest.first().map(String::as_str) {
        Some("-m") if rest.len() >= 2 => Some((python, rest)),
        Some(script) if !script.starts_with('-') => Some((python, rest)),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::placement::tests::{claims, row};
    use crate::verify::check::Lineage;

    pub(crate) fn job(command: &[&str], nodes: u32, gpus: u32) -> TrainingJob {
        let placement = Placement::new(
            &claims(Some("550.54.15"), Lineage::Unrecorded),
            &[row("NVIDIA H100 80GB HBM3", "9.0")],
        )
        .unwrap();
        TrainingJob {
            name: "train".into(),
            image: "ghcr.io/acme/train@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860".parse().unwrap(),
            command: command.iter().map(|s| s.to_string()).collect(),
            working_dir: Some("/app".into()),
            start_guard: Vec::new(),
            nodes,
            gpus_per_node: gpus,
            needs: RuntimeSpec::default(),
            placement,
        }
    }

    #[test]
    fn one_gpu_runs_the_entrypoint_as_written() {
        let job = job(&["python", "train.py", "--epochs", "3"], 1, 1);
        assert_eq!(job.launch(), Launch::AsWritten);
        assert_eq!(job.node_command("R", "M"), job.command);
        assert!(job.rendezvous_env("R", "M").is_empty());
    }

    #[test]
    fn python_entrypoints_start_through_torchrun() {
        let single = job(
            &["/usr/bin/python3", "-u", "train.py", "--lr", "1e-4"],
            1,
            8,
        );
        assert_eq!(
            single.node_command("R", "M").join(" "),
            "/usr/bin/python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=8 --standalone train.py --lr 1e-4"
        );
        let multi = job(&["python3.11", "-m", "trainer.main"], 4, 8);
        assert_eq!(
            multi.node_command("$(RANK)", "train-0.train").join(" "),
            "python3.11 -m torch.distributed.run --nnodes=4 --nproc-per-node=8 --node-rank=$(RANK) --master-addr=train-0.train --master-port=29500 -m trainer.main"
        );
    }

    #[test]
    fn the_start_guard_runs_once_in_front_of_torchrun() {
        let mut job = job(&["python", "train.py"], 2, 8);
        job.start_guard = crate::probe::guard::guard_prefix();
        let command = job.node_command("R", "M");
        assert_eq!(command[..5], crate::probe::guard::guard_prefix()[..]);
        assert_eq!(command[5..8], ["python", "-m", "torch.distributed.run"]);
    }

    #[test]
    fn other_entrypoints_get_the_rendezvous_in_their_environment() {
        for command in [&["/app/run.sh"][..], &["python", "-c", "print(1)"][..]] {
            let job = job(command, 2, 4);
            assert_eq!(job.launch(), Launch::Environment);
            assert_eq!(job.node_command("R", "M"), job.command);
            let env = job.rendezvous_env("R", "M");
            assert!(env.contains(&("NODE_RANK".into(), "R".into())), "{env:?}");
            assert!(env.contains(&("MASTER_ADDR".into(), "M".into())), "{env:?}");
        }
    }

    #[test]
    fn default_names_are_valid_labels_named_after_the_image() {
        let image: PinnedImage = format!("ghcr.io/acme/My_Trainer.v2@sha256:{}", "ab".repeat(32))
            .to_lowercase()
            .parse()
            .unwrap();
        let name = TrainingJob::default_name(&image);
        assert_eq!(name, "my-trainer-v2-abababab");
        let digits: PinnedImage = format!("ghcr.io/acme/2024@sha256:{}", "0".repeat(64))
            .parse()
            .unwrap();
        assert!(is_dns_label(&TrainingJob::default_name(&digits)));
    }

    #[test]
    fn invalid_jobs_are_refused() {
        let mut bad = job(&["python", "train.py"], 0, 1);
        assert!(bad.validate().unwrap_err().to_string().contains("nodes"));
        bad.nodes = 1;
        bad.command.clear();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("entrypoint"));
        bad.command = vec!["x".into()];
        bad.name = "Train".into();
        assert!(bad.validate().unwrap_err().to_string().contains("job name"));
    }
}
