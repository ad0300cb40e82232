//! sbatch scripts that verify an image on a Slurm compute node, with the two container
//! runtimes HPC sites run: enroot through NVIDIA's pyxis plugin (`srun --container-image`)
//! and Apptainer (`apptainer exec --nv`).
//!
//! The job runs the probe baked into the image; its stdout goes to its own file
//! (`--output`, stderr to `--error`), so the report line `cudastack-report-v1 <JSON>` is
//! the last line of that file, after a line naming the image (`cudastack-image-v1 …`), and
//! `cudastack verify IMAGE --from-log FILE` records it on that image. The image is
//! named by digest. Compute nodes often cannot reach a registry: with
//! [`SbatchSpec::local_image`] the script runs a squashfs (enroot) or SIF (Apptainer) file
//! imported on the login node instead, and the script's comments say how to make it.
//!
//! The team's own job ([`training_script`]) uses the same runtimes: one task per node on
//! the nodes a site's feature map admits for the image's verified placement
//! ([`SlurmPlacement`]: `--constraint` and the GPU request), each running the image's
//! entrypoint by digest, through torchrun with the first node of the allocation as the
//! rendezvous when the job spans several GPUs.
//!
//! Host Python settings must not leak into the container (a PYTHONPATH from an
//! environment module, packages in ~/.local shadowing the image's torch): the script
//! clears them, pyxis runs without the home mount, Apptainer with `--cleanenv --no-home`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::job::TrainingJob;
use super::k8s::probe_command;
use super::site_features::{SiteFeatures, SlurmPlacement};
use super::{ClusterError, PinnedImage};
use crate::recipe::{RuntimeSpec, ULIMITS};

/// Which container runtime the compute nodes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// enroot through the pyxis SPANK plugin: `srun --container-image=...`. Digest
    /// references need enroot >= 4.0 (older versions only parse `:TAG`).
    Pyxis,
    /// `apptainer exec --nv` (Singularity's successor); `--nv` binds the host driver.
    Apptainer,
}

/// What the sbatch job runs and what it asks Slurm for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SbatchSpec {
    pub image: PinnedImage,
    pub runtime: Runtime,
    /// GPUs for the one task, at least 1.
    pub gpus: u32,
    /// A site's GRES type name (`a100`): asks `--gres=gpu:TYPE:N` instead of `--gpus=N`.
    pub gpu_type: Option<String>,
    pub partition: Option<String>,
    pub account: Option<String>,
    /// Wall-clock limit (`--time`), at least one minute.
    pub time: Duration,
    pub job_name: String,
    /// A squashfs (pyxis) or SIF (Apptainer) file made from `image` on the login node, for
    /// compute nodes without registry access.
    pub local_image: Option<PathBuf>,
    /// The container command (usually the probe).
    pub command: Vec<String>,
    /// What the run needs from the runtime (the image's `io.cudastack.runtime.*` labels):
    /// the ulimits are set in the batch shell, whose limits srun passes on (Slurm's
    /// PropagateResourceLimits); /dev/shm is the node's under pyxis and Apptainer, so its
    /// size is checked and a smaller one is warned about.
    pub needs: RuntimeSpec,
}

impl SbatchSpec {
    /// The probe on one GPU for 30 minutes, named `cudastack-verify`.
    pub fn probe(image: PinnedImage, runtime: Runtime) -> Self {
        SbatchSpec {
            image,
            runtime,
            gpus: 1,
            gpu_type: None,
            partition: None,
            account: None,
            time: Duration::from_secs(30 * 60),
            job_name: "cudastack-verify".to_string(),
            local_image: None,
            command: probe_command(),
            needs: RuntimeSpec::default(),
        }
    }
}

/// enroot's URI for an image: `docker://REGISTRY#PATH@sha256:…` (`#` separates the
/// registry; no registry means Docker Hub).
pub fn enroot_uri(image: &PinnedImage) -> String {
    match image.registry() {
        Some(host) => format!("docker://{host}#{}@{}", image.path(), image.digest),
        None => format!("docker://{}@{}", image.path(), image.digest),
    }
}

/// Apptainer's URI for an image: `docker://REGISTRY/PATH@sha256:…`.
pub fn apptainer_uri(image: &PinnedImage) -> String {
    format!("docker://{}", image.by_digest())
}

/// Slurm's `--time`: `[D-]HH:MM:SS`.
fn slurm_time(time: Duration) -> String {
    let seconds = time.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let clock = format!(
        "{:02}:{:02}:{:02}",
        rest / 3600,
        (rest % 3600) / 60,
        rest % 60
    );
    if days > 0 {
        format!("{days}-{clock}")
    } else {
        clock
    }
}

/// Quote one word for bash (single quotes; a `'` inside becomes `'\''`). Plain words
/// stay bare so the script reads naturally.
fn shell_quote(word: &str) -> String {
    // `#` and `~` are special only at the start of a word.
    let plain = !word.is_empty()
        && !word.starts_with(['#', '~'])
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+%#".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn is_slurm_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Render the sbatch script: comments saying how it was made and how to read its result,
/// the `#SBATCH` directives, a clean Python environment, then the one `srun` line.
pub fn sbatch_script(spec: &SbatchSpec) -> Result<String, ClusterError> {
    validate(spec)?;
    let log = format!("{}-%j.out", spec.job_name);
    let mut out = String::new();
    header_comments(&mut out, spec, &log);
    directives(&mut out, spec, &log);
    clean_environment(&mut out);
    enroot_check(&mut out, spec);
    let _ = writeln!(
        out,
        "# The image this job runs, for `cudastack verify --from-log`."
    );
    let _ = writeln!(out, "echo {}", shell_quote(&spec.image.log_line()));
    run_needs(&mut out, &spec.needs);
    srun_line(&mut out, spec);
    Ok(out)
}

/// The image's runtime needs as shell lines: each ulimit set (bash counts byte limits in
/// KiB), a /dev/shm smaller than asked warned about. Nothing when it asks for nothing.
fn run_needs(out: &mut String, needs: &RuntimeSpec) {
    if needs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# What the image asks of the runtime (its io.cudastack.runtime.* labels); srun passes\n# this shell's limits on to the job (PropagateResourceLimits)."
    );
    for (name, value) in &needs.ulimits {
        let Some((_, flag, unit)) = ULIMITS.iter().find(|(known, _, _)| known == name) else {
            continue;
        };
        let amount = match *value {
            -1 => "unlimited".to_string(),
            value => (value as u64).div_ceil(*unit).to_string(),
        };
        let _ = writeln!(
            out,
            "ulimit -{flag} {amount} || echo \"cudastack: warning: could not set ulimit {name}={value} on $(hostname); ask the site to raise the hard limit\" >&2"
        );
    }
    if let Some(size) = needs.shm_size {
        let _ = writeln!(
            out,
            "# /dev/shm is the node's: pyxis and Apptainer share it with the container.\nif [ \"$(df -B1 --output=size /dev/shm | tail -n 1)\" -lt {size} ]; then echo \"cudastack: warning: /dev/shm on $(hostname) is smaller than the {size} bytes the image asks for (NCCL may fail)\" >&2; fi"
        );
    }
}

/// Everything that goes on an `#SBATCH` line is a plain word; the job needs a GPU, a minute
/// and a command.
fn validate(spec: &SbatchSpec) -> Result<(), ClusterError> {
    let invalid = |field, value: &str, rule| ClusterError::Invalid {
        field,
        value: value.to_string(),
        rule,
    };
    const WORD: &str = "letters, digits, `-`, `_` or `.` (it goes on an #SBATCH line)";
    if !is_slurm_word(&spec.job_name) {
        return Err(invalid("job name", &spec.job_name, WORD));
    }
    for (field, value) in [
        ("partition", &spec.partition),
        ("account", &spec.account),
        ("GPU type", &spec.gpu_type),
    ] {
        if let Some(value) = value {
            if !is_slurm_word(value) {
                return Err(invalid(field, value, WORD));
            }
        }
    }
    if spec.gpus == 0 {
        return Err(invalid(
            "GPU count",
            "0",
            "the probe needs at least one GPU",
        ));
    }
    if spec.time < Duration::from_secs(60) {
        return Err(invalid(
            "time limit",
            &format!("{}s", spec.time.as_secs()),
            "Slurm's --time has minute granularity: give at least one minute",
        ));
    }
    if spec.command.is_empty() {
        return Err(invalid("command", "", "the container needs a command"));
    }
    Ok(())
}

fn header_comments(out: &mut String, spec: &SbatchSpec, log: &str) {
    let runtime = match spec.runtime {
        Runtime::Pyxis => "enroot + pyxis",
        Runtime::Apptainer => "Apptainer",
    };
    let _ = writeln!(out, "#!/bin/bash");
    let _ = writeln!(
        out,
        "# Verify {} on a compute node with {runtime}; generated by cudastack.",
        spec.image
    );
    let _ = writeln!(out, "#   sbatch --wait THIS_FILE");
    let _ = writeln!(
        out,
        "#   cudastack verify {} --from-log {}   (%j: the job id sbatch printed)",
        spec.image.named(),
        log
    );
    if let Some(local) = &spec.local_image {
        let local = shell_quote(&local.display().to_string());
        match spec.runtime {
            Runtime::Pyxis => {
                let _ = writeln!(
                    out,
                    "# Made on the login node with: enroot import -o {local} {}",
                    shell_quote(&enroot_uri(&spec.image))
                );
            }
            Runtime::Apptainer => {
                let _ = writeln!(
                    out,
                    "# Made on the login node with: apptainer pull {local} {}",
                    shell_quote(&apptainer_uri(&spec.image))
                );
            }
        }
    }
}

fn directives(out: &mut String, spec: &SbatchSpec, log: &str) {
    let _ = writeln!(out, "#SBATCH --job-name={}", spec.job_name);
    if let Some(partition) = &spec.partition {
        let _ = writeln!(out, "#SBATCH --partition={partition}");
    }
    if let Some(account) = &spec.account {
        let _ = writeln!(out, "#SBATCH --account={account}");
    }
    let _ = writeln!(out, "#SBATCH --nodes=1");
    let _ = writeln!(out, "#SBATCH --ntasks=1");
    match &spec.gpu_type {
        Some(gpu_type) => {
            let _ = writeln!(out, "#SBATCH --gres=gpu:{gpu_type}:{}", spec.gpus);
        }
        None => {
            let _ = writeln!(out, "#SBATCH --gpus={}", spec.gpus);
        }
    }
    let _ = writeln!(out, "#SBATCH --time={}", slurm_time(spec.time));
    let _ = writeln!(
        out,
        "# stdout alone in --output: the probe's report line is that file's last line."
    );
    let _ = writeln!(out, "#SBATCH --output={log}");
    let _ = writeln!(out, "#SBATCH --error={}-%j.err", spec.job_name);
}

fn clean_environment(out: &mut String) {
    let _ = writeln!(out, "set -euo pipefail");
    let _ = writeln!(
        out,
        "# The host's Python settings must not reach the image's Python."
    );
    let _ = writeln!(out, "unset PYTHONPATH PYTHONHOME");
    let _ = writeln!(out, "export PYTHONNOUSERSITE=1");
}

/// The oldest enroot whose image URIs take `@sha256:` digests.
pub const ENROOT_DIGEST_MAJOR: u32 = 4;

/// pyxis pulling by digest: stop with a clear message on a node whose enroot is older than
/// [`ENROOT_DIGEST_MAJOR`] (or missing), instead of an import error from deep inside pyxis.
/// `enroot version` prints the bare version (`3.5.0`). A local squashfs needs no check.
fn enroot_check(out: &mut String, spec: &SbatchSpec) {
    if spec.runtime == Runtime::Pyxis && spec.local_image.is_none() {
        enroot_version_check(out);
    }
}

fn enroot_version_check(out: &mut String) {
    let major = ENROOT_DIGEST_MAJOR;
    let older = (0..major)
        .map(|m| m.to_string())
        .collect::<Vec<_>>()
        .join("");
    let _ = writeln!(
        out,
        "# pyxis pulls the image by digest through enroot, which needs enroot {major} or later."
    );
    let _ = writeln!(
        out,
        "enroot_version=$(enroot version 2>/dev/null || echo 'not found')"
    );
    let _ = writeln!(
        out,
        "case \"${{enroot_version%%.*}}\" in ''|*[!0-9]*|[{older}]) echo \"cudastack: enroot ${{enroot_version}} on $(hostname) cannot pull by digest: enroot {major} or later is needed. Upgrade enroot, or import the image on the login node and emit with --local-image FILE.\" >&2; exit 1;; esac"
    );
}

fn srun_line(out: &mut String, spec: &SbatchSpec) {
    let command: Vec<String> = spec.command.iter().map(|w| shell_quote(w)).collect();
    let command = command.join(" ");
    match spec.runtime {
        Runtime::Pyxis => {
            let image = match &spec.local_image {
                Some(local) => local.display().to_string(),
                None => enroot_uri(&spec.image),
            };
            let _ = writeln!(
                out,
                "srun --container-image={} --no-container-mount-home {command}",
                shell_quote(&image)
            );
        }
        Runtime::Apptainer => {
            let image = match &spec.local_image {
                Some(local) => local.display().to_string(),
                None => apptainer_uri(&spec.image),
            };
            let _ = writeln!(
                out,
                "srun apptainer exec --nv --cleanenv --no-home {} {command}",
                shell_quote(&image)
            );
        }
    }
}

/// What [`training_script`] gives the caller: the script, and what it asks Slurm for, whose
/// notes (verified GPUs the site map leaves out, drivers below the floor) belong on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainingSbatch {
    pub script: String,
    pub placement: SlurmPlacement,
}

/// Where the node command has its node rank and the first node's address. NUL can never
/// be part of an argument, so an entrypoint argument that happens to read `$SLURM_NODEID`
/// stays literal and only these expand.
const NODE_RANK_MARK: &str = "\0node-rank\0";
const MASTER_ADDR_MARK: &str = "\0master-addr\0";
/// The variable the batch shell exports with the first node's hostname.
const MASTER_ADDR_VARIABLE: &str = "CUDASTACK_MASTER_ADDR";

/// The team's training job as an sbatch script: one task per node on the nodes `site`
/// admits for the job's verified placement, each running the image's entrypoint (through
/// torchrun on several GPUs, [`TrainingJob::node_command`]) with pyxis or Apptainer.
/// Partition, account and time limit are left to sbatch's own flags.
pub fn training_script(
    job: &TrainingJob,
    runtime: Runtime,
    site: &SiteFeatures,
) -> Result<TrainingSbatch, ClusterError> {
    job.validate()?;
    validate_training(job)?;
    let placement = SlurmPlacement::admit(&job.placement, site)?;
    let task = TrainingTask::new(job, runtime);
    let mut out = String::new();
    training_header(&mut out, job, runtime, &placement, site);
    training_directives(&mut out, job, &placement);
    clean_environment(&mut out);
    if runtime == Runtime::Pyxis {
        enroot_version_check(&mut out);
    }
    let _ = writeln!(
        out,
        "echo {}",
        shell_quote(&format!("cudastack: image {}", job.image))
    );
    run_needs(&mut out, &job.needs);
    if task.uses(MASTER_ADDR_MARK) {
        master_address(&mut out);
    }
    task.srun_line(&mut out);
    Ok(TrainingSbatch {
        script: out,
        placement,
    })
}

/// What the generic job check leaves to the script: words bash can pass, and a working
/// directory both runtimes take.
fn validate_training(job: &TrainingJob) -> Result<(), ClusterError> {
    if let Some(word) = job.command.iter().find(|word| word.contains('\0')) {
        return Err(ClusterError::Invalid {
            field: "command",
            value: word.replace('\0', "\\0"),
            rule: "an argument cannot hold a NUL byte",
        });
    }
    if let Some(dir) = &job.working_dir {
        if !dir.starts_with('/') || dir.contains(['\0', '\n']) {
            return Err(ClusterError::Invalid {
                field: "working directory",
                value: dir.clone(),
                rule: "an absolute path in the image (pyxis's --container-workdir and Apptainer's --pwd take no other)",
            });
        }
    }
    Ok(())
}

/// A comment line; a line break in `text` (a path from the command line) would end the
/// comment and start a command, so it becomes a space.
fn comment(out: &mut String, text: &str) {
    let _ = writeln!(out, "# {}", text.replace(['\n', '\r'], " "));
}

fn training_header(
    out: &mut String,
    job: &TrainingJob,
    runtime: Runtime,
    placement: &SlurmPlacement,
    site: &SiteFeatures,
) {
    let runtime = match runtime {
        Runtime::Pyxis => "enroot + pyxis",
        Runtime::Apptainer => "Apptainer",
    };
    let _ = writeln!(out, "#!/bin/bash");
    comment(
        out,
        &format!(
            "Train with {} on {} node(s) x {} GPU(s) with {runtime}; generated by cudastack.",
            job.image, job.nodes, job.gpus_per_node
        ),
    );
    comment(out, &format!("Verified on {}.", job.placement.summary()));
    comment(
        out,
        &format!(
            "Admitted by the site feature map {}: {placement}.",
            site.path.display()
        ),
    );
    for note in &placement.notes {
        comment(out, &format!("Note: {note}."));
    }
    comment(
        out,
        "  sbatch --partition=PARTITION --time=HH:MM:SS THIS_FILE",
    );
}

fn training_directives(out: &mut String, job: &TrainingJob, placement: &SlurmPlacement) {
    let _ = writeln!(out, "#SBATCH --job-name={}", job.name);
    let _ = writeln!(out, "#SBATCH --nodes={}", job.nodes);
    comment(
        out,
        "One task per node: torchrun (or the entrypoint) starts one process per GPU itself.",
    );
    let _ = writeln!(out, "#SBATCH --ntasks-per-node=1");
    let _ = writeln!(out, "#SBATCH {}", placement.gpu_request(job.gpus_per_node));
    comment(
        out,
        "Only nodes with a verified GPU (one product for the whole job) and a driver at the floor.",
    );
    let _ = writeln!(out, "#SBATCH --constraint={}", placement.constraint);
    let _ = writeln!(out, "#SBATCH --output={}-%j.out", job.name);
}

/// The first node of the allocation, exported for every task: torchrun's rendezvous runs
/// there. The hostnames are read whole and cut in bash rather than through `head`, whose
/// early exit could kill scontrol with SIGPIPE on a long node list, which `pipefail` turns
/// into a failed job.
fn master_address(out: &mut String) {
    let var = MASTER_ADDR_VARIABLE;
    comment(
        out,
        "The rendezvous runs on the first node of the allocation.",
    );
    let _ = writeln!(
        out,
        "cudastack_hosts=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\")"
    );
    let _ = writeln!(out, "{var}=${{cudastack_hosts%%$'\\n'*}}");
    let _ = writeln!(
        out,
        "if [ -z \"${var}\" ]; then echo \"cudastack: scontrol named no node for SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST\" >&2; exit 1; fi"
    );
    let _ = writeln!(out, "export {var}");
}

/// What srun starts on each node: the runtime's options and the container command, with
/// the node rank and master address still as marks.
struct TrainingTask {
    /// srun's own options and, under pyxis, the container options.
    srun_options: Vec<String>,
    /// The command srun starts (under Apptainer, `apptainer exec …` with the image).
    command: Vec<String>,
    /// Variables the container command needs exported first (pyxis; Apptainer takes
    /// them as `--env` in `command`).
    exports: Vec<(String, String)>,
}

impl TrainingTask {
    fn new(job: &TrainingJob, runtime: Runtime) -> TrainingTask {
        let entrypoint = job.node_command(NODE_RANK_MARK, MASTER_ADDR_MARK);
        let env = job.rendezvous_env(NODE_RANK_MARK, MASTER_ADDR_MARK);
        // --export=ALL: the tasks need this shell's variables (the master address, the
        // cleared Python settings) even when the site sets `sbatch --export=NONE`.
        // --kill-on-bad-exit: one failed rank ends the step instead of leaving the others
        // waiting on it until the time limit.
        let mut srun_options = vec![
            "--export=ALL".to_string(),
            "--kill-on-bad-exit=1".to_string(),
        ];
        match runtime {
            Runtime::Pyxis => {
                srun_options.push(format!("--container-image={}", enroot_uri(&job.image)));
                srun_options.push("--no-container-mount-home".to_string());
                if let Some(dir) = &job.working_dir {
                    srun_options.push(format!("--container-workdir={dir}"));
                }
                TrainingTask {
                    srun_options,
                    command: entrypoint,
                    exports: env,
                }
            }
            Runtime::Apptainer => {
                let mut command: Vec<String> =
                    ["apptainer", "exec", "--nv", "--cleanenv", "--no-home"]
                        .map(String::from)
                        .to_vec();
                if let Some(dir) = &job.working_dir {
                    command.extend(["--pwd".to_string(), dir.clone()]);
                }
                // --cleanenv keeps the host's variables out; --env puts the rendezvous in.
                for (name, value) in env {
                    command.extend(["--env".to_string(), format!("{name}={value}")]);
                }
                command.push(apptainer_uri(&job.image));
                command.extend(entrypoint);
                TrainingTask {
                    srun_options,
                    command,
                    exports: Vec::new(),
                }
            }
        }
    }

    fn uses(&self, mark: &str) -> bool {
        self.command.iter().any(|word| word.contains(mark))
            || self.exports.iter().any(|(_, value)| value.contains(mark))
    }

    /// `srun OPTIONS COMMAND`. A command with marks runs through `/bin/sh -c` in each task
    /// (inside the container under pyxis, on the node under Apptainer, whose --cleanenv
    /// would hide SLURM_NODEID from the container), so the node rank is that task's own.
    fn srun_line(&self, out: &mut String) {
        let mut line = String::from("srun");
        for option in &self.srun_options {
            line.push(' ');
            line.push_str(&shell_quote(option));
        }
        if self.uses(NODE_RANK_MARK) || self.uses(MASTER_ADDR_MARK) {
            comment(
                out,
                "The task's shell expands the node rank and master address, not this one.",
            );
            let _ = writeln!(out, "# shellcheck disable=SC2016");
            let _ = write!(line, " /bin/sh -c {}", shell_quote(&self.task_script()));
        } else {
            if self.command.iter().any(|word| word.contains(['$', '`'])) {
                comment(
                    out,
                    "A `$` in the entrypoint's arguments is theirs, not this shell's.",
                );
                let _ = writeln!(out, "# shellcheck disable=SC2016");
            }
            for word in &self.command {
                line.push(' ');
                line.push_str(&shell_quote(word));
            }
        }
        let _ = writeln!(out, "{line}");
    }

    /// The POSIX sh script each task runs: the exports, then `exec` of the command.
    fn task_script(&self) -> String {
        let mut script = String::new();
        if !self.exports.is_empty() {
            let assignments: Vec<String> = self
                .exports
                .iter()
                .map(|(name, value)| format!("{name}={}", task_word(value)))
                .collect();
            let _ = write!(script, "export {}; ", assignments.join(" "));
        }
        let words: Vec<String> = self.command.iter().map(|word| task_word(word)).collect();
        let _ = write!(script, "exec {}", words.join(" "));
        script
    }
}

/// One word for the task's shell: each mark as the variable the task's environment holds,
/// the rest double-quoted where it is not a plain word. Double quotes, not single: the
/// whole script is single-quoted once more for the batch shell, and single quotes nested
/// in single quotes read as an escaping mistake to shellcheck (SC1003) and to people.
fn task_word(word: &str) -> String {
    let marks = [
        (NODE_RANK_MARK, "\"$SLURM_NODEID\"".to_string()),
        (MASTER_ADDR_MARK, format!("\"${MASTER_ADDR_VARIABLE}\"")),
    ];
    let mut out = String::new();
    let mut rest = word;
    loop {
        let next = marks
            .iter()
            .filter_map(|(mark, expansion)| rest.find(mark).map(|at| (at, *mark, expansion)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, mark, expansion)) = next else {
            break;
        };
        if at > 0 {
            out.push_str(&double_quote(&rest[..at]));
        }
        out.push_str(expansion);
        rest = &rest[at + mark.len()..];
    }
    if !rest.is_empty() || out.is_empty() {
        out.push_str(&double_quote(rest));
    }
    out
}

/// `text` for a POSIX shell: bare when [`shell_quote`] would leave it bare, else in double
/// quotes with the four characters special there (`\`, `"`, `$`, `` ` ``) escaped.
fn double_quote(text: &str) -> String {
    if shell_quote(text) == text {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '\\' | '"' | '$' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> PinnedImage {
        "ghcr.io/acme/torch@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860"
            .parse()
            .unwrap()
    }

    #[test]
    fn pyxis_script_uses_enroot_uri_and_separate_stdout() {
        let mut spec = SbatchSpec::probe(image(), Runtime::Pyxis);
        spec.partition = Some("gpu".into());
        spec.gpu_type = Some("a100".into());
        spec.gpus = 2;
        let script = sbatch_script(&spec).unwrap();
        insta::assert_snapshot!(script);
    }

    #[test]
    fn apptainer_script_from_a_sif_made_on_the_login_node() {
        let mut spec = SbatchSpec::probe(image(), Runtime::Apptainer);
        spec.local_image = Some("/scratch/me/torch 2.4.sif".into());
        spec.time = Duration::from_secs(26 * 3600 + 61);
        spec.account = Some("ml-team".into());
        let script = sbatch_script(&spec).unwrap();
        insta::assert_snapshot!(script);
    }

    /// Ulimits set in the batch shell (bash's units), /dev/shm checked; the script
    /// is still valid bash.
    #[test]
    fn runtime_needs_set_ulimits_and_check_dev_shm() {
        let mut spec = SbatchSpec::probe(image(), Runtime::Pyxis);
        assert!(!sbatch_script(&spec).unwrap().contains("ulimit"));
        spec.needs = crate::recipe::RuntimeSpec::from_labels(
            &[
                ("io.cudastack.runtime.shm-size", "17179869184"),
                ("io.cudastack.runtime.ulimit.memlock", "-1"),
                ("io.cudastack.runtime.ulimit.stack", "67108864"),
                ("io.cudastack.runtime.ulimit.nofile", "1048576"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .unwrap();
        let script = sbatch_script(&spec).unwrap();
        assert!(script.contains("\nulimit -l unlimited || echo"), "{script}");
        assert!(script.contains("\nulimit -s 65536 || echo"), "{script}");
        assert!(script.contains("\nulimit -n 1048576 || echo"), "{script}");
        assert!(script.contains("-lt 17179869184 ]"), "{script}");
        assert!(
            script.find("ulimit -l").unwrap() < script.find("\nsrun").unwrap(),
            "{script}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.sbatch");
        fs_err::write(&path, &script).unwrap();
        let check = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }

    #[test]
    fn uris_and_times() {
        assert_eq!(
            enroot_uri(&image()),
            "docker://ghcr.io#acme/torch@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860"
        );
        let hub: PinnedImage = format!("acme/torch@sha256:{}", "0".repeat(64))
            .parse()
            .unwrap();
        assert_eq!(
            enroot_uri(&hub),
            format!("docker://acme/torch@sha256:{}", "0".repeat(64))
        );
        assert!(apptainer_uri(&image()).starts_with("docker://ghcr.io/acme/torch@sha256:"));
        assert_eq!(slurm_time(Duration::from_secs(90)), "00:01:30");
        assert_eq!(slurm_time(Duration::from_secs(86_400 + 3600)), "1-01:00:00");
    }

    #[test]
    fn shell_words_are_quoted() {
        assert_eq!(shell_quote("--level"), "--level");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(shell_quote("#comment"), "'#comment'");
        assert_eq!(shell_quote("docker://a#b"), "docker://a#b");
    }

    #[test]
    fn invalid_fields_are_refused() {
        let mut spec = SbatchSpec::probe(image(), Runtime::Pyxis);
        spec.partition = Some("gpu;rm".into());
        assert!(sbatch_script(&spec)
            .unwrap_err()
            .to_string()
            .contains("partition"));
        spec.partition = None;
        spec.time = Duration::from_secs(30);
        assert!(sbatch_script(&spec)
            .unwrap_err()
            .to_string()
            .contains("time limit"));
        spec.time = Duration::from_secs(600);
        spec.gpus = 0;
        assert!(sbatch_script(&spec)
            .unwrap_err()
            .to_string()
            .contains("GPU count"));
    }

    fn site() -> SiteFeatures {
        SiteFeatures::parse(
            "gpus:\n  - {product: NVIDIA H100 80GB HBM3, feature: h100, gres: h100}\ndrivers:\n  - {feature: driver-550, version: 550.54.15}\n  - {feature: driver-560, version: 560.35.03}\n",
            std::path::Path::new("/etc/slurm/cudastack-features.yaml"),
        )
        .unwrap()
    }

    #[test]
    fn a_multi_node_training_script_with_pyxis() {
        let job = crate::cluster::job::tests::job(&["python", "train.py", "--name", "run 1"], 2, 8);
        let sbatch = training_script(&job, Runtime::Pyxis, &site()).unwrap();
        assert!(sbatch.placement.notes.is_empty());
        insta::assert_snapshot!(sbatch.script);
    }

    #[test]
    fn one_gpu_runs_the_entrypoint_without_a_task_shell() {
        let job = crate::cluster::job::tests::job(&["python", "train.py"], 1, 1);
        let script = training_script(&job, Runtime::Apptainer, &site())
            .unwrap()
            .script;
        assert!(
            !script.contains("/bin/sh -c") && !script.contains("scontrol"),
            "{script}"
        );
        assert!(script.ends_with("srun --export=ALL --kill-on-bad-exit=1 apptainer exec --nv --cleanenv --no-home --pwd /app docker://ghcr.io/acme/train@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860 python train.py\n"), "{script}");
        assert!(
            script.contains("\n#SBATCH --gres=gpu:h100:1\n#"),
            "{script}"
        );
    }

    #[test]
    fn task_words_expand_only_the_marks() {
        assert_eq!(
            task_word("--node-rank=\0node-rank\0"),
            "--node-rank=\"$SLURM_NODEID\""
        );
        assert_eq!(task_word("\0master-addr\0"), "\"$CUDASTACK_MASTER_ADDR\"");
        assert_eq!(
            task_word("a b\0master-addr\0:\0node-rank\0#"),
            "\"a b\"\"$CUDASTACK_MASTER_ADDR\":\"$SLURM_NODEID\"\"#\""
        );
        assert_eq!(task_word("$SLURM_NODEID"), "\"\\$SLURM_NODEID\"");
        assert_eq!(task_word(r#"it's "a\b" `x`"#), r#""it's \"a\\b\" \`x\`""#);
        assert_eq!(task_word(""), "\"\"");
    }

    #[test]
    fn training_jobs_with_bad_words_are_refused() {
        let mut job = crate::cluster::job::tests::job(&["python", "train.py"], 1, 1);
        job.working_dir = Some("app".into());
        let error = training_script(&job, Runtime::Pyxis, &site()).unwrap_err();
        assert!(error.to_string().contains("working directory"), "{error}");
        job.working_dir = None;
        job.command.push("a\0b".into());
        let error = training_script(&job, Runtime::Pyxis, &site()).unwrap_err();
        assert!(error.to_string().contains("NUL"), "{error}");
    }
}
