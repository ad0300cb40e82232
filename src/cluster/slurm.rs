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
//! Host Python settings must not leak into the container (a PYTHONPATH from an
//! environment module, packages in ~/.local shadowing the image's torch): the script
//! clears them, pyxis runs without the home mount, Apptainer with `--cleanenv --no-home`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::k8s::probe_command;
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
    if spec.runtime != Runtime::Pyxis || spec.local_image.is_some() {
        return;
    }
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
}
