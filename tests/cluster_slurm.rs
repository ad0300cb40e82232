//! The generated sbatch scripts are valid bash (and shellcheck-clean when shellcheck is
//! installed), keep every #SBATCH directive before the first command (Slurm stops reading
//! them there), and hand srun exactly the intended arguments: the scripts run under real
//! bash with `srun` on PATH replaced by a recorder, since no Slurm is installed here.

use crate::gate;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use cudastack::cluster::slurm::{sbatch_script, Runtime, SbatchSpec};

const IMAGE: &str = "ghcr.io/acme/torch:2.4.1@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860";

fn specs() -> Vec<(&'static str, SbatchSpec, Vec<&'static str>)> {
    let image = IMAGE.parse().unwrap();
    let mut pyxis = SbatchSpec::probe(image, Runtime::Pyxis);
    pyxis.partition = Some("gpu".into());
    pyxis.gpu_type = Some("a100".into());
    let mut apptainer_local = SbatchSpec::probe(IMAGE.parse().unwrap(), Runtime::Apptainer);
    apptainer_local.local_image = Some("/scratch/my images/torch 2.4.1.sif".into());
    apptainer_local.time = Duration::from_secs(2 * 3600);
    apptainer_local.command = vec!["python3".into(), "-c".into(), "print('it''s $HOME')".into()];
    let mut pyxis_local = SbatchSpec::probe(IMAGE.parse().unwrap(), Runtime::Pyxis);
    pyxis_local.local_image = Some("/scratch/torch.sqsh".into());
    pyxis_local.gpus = 4;
    vec![
        (
            "pyxis",
            pyxis,
            vec![
                "--container-image=docker://ghcr.io#acme/torch@sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860",
                "--no-container-mount-home",
                "/usr/bin/python3",
                "-I",
                "-S",
                "/opt/cudastack/probe/probe.py",
                "--level",
                "all",
            ],
        ),
        (
            "apptainer-local",
            apptainer_local,
            vec![
                "apptainer",
                "exec",
                "--nv",
                "--cleanenv",
                "--no-home",
                "/scratch/my images/torch 2.4.1.sif",
                "python3",
                "-c",
                "print('it''s $HOME')",
            ],
        ),
        (
            "pyxis-local",
            pyxis_local,
            vec![
                "--container-image=/scratch/torch.sqsh",
                "--no-container-mount-home",
                "/usr/bin/python3",
                "-I",
                "-S",
                "/opt/cudastack/probe/probe.py",
                "--level",
                "all",
            ],
        ),
    ]
}

fn directives_come_first(script: &str) {
    let mut commands_started = false;
    for line in script.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            assert!(
                !(commands_started && trimmed.starts_with("#SBATCH")),
                "#SBATCH after the first command is ignored by Slurm:\n{script}"
            );
        } else {
            commands_started = true;
        }
    }
    assert!(commands_started);
}

#[test]
fn scripts_are_valid_bash_and_pass_the_intended_arguments_to_srun() {
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // The recorder: one argument per line, then the Python variables it was given.
    let srun = bin.join("srun");
    std::fs::write(
        &srun,
        "#!/bin/bash\nprintf '%s\\n' \"$@\" > \"$RECORD\"\nprintf 'PYTHONPATH=%s PYTHONNOUSERSITE=%s\\n' \"${PYTHONPATH-unset}\" \"${PYTHONNOUSERSITE-unset}\" > \"$RECORD.env\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake_enroot(&bin, "4.1.0");
    let shellcheck = Command::new("shellcheck").arg("--version").output().is_ok();
    if !shellcheck {
        gate::skip(
            "shellcheck",
            "shellcheck is not installed; the scripts are only checked with bash -n and run",
        );
    }

    for (name, spec, expected) in specs() {
        let script = sbatch_script(&spec).unwrap();
        directives_come_first(&script);
        assert!(
            script.contains("#SBATCH --output=cudastack-verify-%j.out"),
            "{script}"
        );
        let file = work.path().join(format!("{name}.sbatch"));
        std::fs::write(&file, &script).unwrap();

        let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
        assert!(
            syntax.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&syntax.stderr)
        );
        if shellcheck {
            // SC2016: one test command deliberately carries a `$HOME` that must not expand.
            let lint = Command::new("shellcheck")
                .args(["-e", "SC2016"])
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                lint.status.success(),
                "{name}: shellcheck:\n{}\n{script}",
                String::from_utf8_lossy(&lint.stdout)
            );
        }

        let record = work.path().join(format!("{name}.argv"));
        let run = Command::new("bash")
            .arg(&file)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("RECORD", &record)
            .env("PYTHONPATH", "/home/me/.local/leaky")
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let argv = std::fs::read_to_string(&record).unwrap();
        let argv: Vec<&str> = argv.lines().collect();
        assert_eq!(argv, expected, "{name}:\n{script}");
        let env = std::fs::read_to_string(record.with_extension("argv.env")).unwrap();
        assert_eq!(env.trim(), "PYTHONPATH=unset PYTHONNOUSERSITE=1", "{name}");
    }
}

/// An `enroot` on PATH whose `enroot version` prints `version`.
fn fake_enroot(bin: &std::path::Path, version: &str) {
    let enroot = bin.join("enroot");
    std::fs::write(
        &enroot,
        format!("#!/bin/bash\n[ \"$1\" = version ] && echo {version}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&enroot, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The pyxis script stops before srun when the node's enroot cannot pull by digest (3.x or
/// none), saying which version it found and what to do; 4.x and later go on to srun.
#[test]
fn the_pyxis_script_checks_the_enroot_version_before_pulling_by_digest() {
    let (_, spec, _) = specs().remove(0);
    let script = sbatch_script(&spec).unwrap();
    assert!(script.contains("enroot version"), "{script}");
    // A local squashfs is not pulled: no check, and Apptainer has none either.
    for (name, other, _) in specs().into_iter().skip(1) {
        assert!(
            !sbatch_script(&other).unwrap().contains("enroot version"),
            "{name}"
        );
    }
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("pyxis.sbatch");
    std::fs::write(&file, &script).unwrap();
    for (version, passes) in [
        (Some("3.5.0"), false),
        (Some("3.4.1"), false),
        (None, false),
        (Some("4.0.0"), true),
        (Some("4.1.2"), true),
        (Some("10.0"), true),
    ] {
        let bin = work.path().join(format!("bin-{version:?}"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("srun"), "#!/bin/bash\necho srun-ran\n").unwrap();
        std::fs::set_permissions(bin.join("srun"), std::fs::Permissions::from_mode(0o755)).unwrap();
        if let Some(version) = version {
            fake_enroot(&bin, version);
        }
        let run = Command::new("/bin/bash")
            .arg(&file)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.success(), passes, "{version:?}: {stderr}");
        assert_eq!(stdout.contains("srun-ran"), passes, "{version:?}: {stdout}");
        if !passes {
            let found = version.unwrap_or("not found");
            assert!(
                stderr.contains(&format!("enroot {found} on "))
                    && stderr.contains("enroot 4 or later is needed")
                    && stderr.contains("--local-image"),
                "{version:?}: {stderr}"
            );
        }
    }
}

// The team's training sbatch and the site feature map: what Slurm is asked for
// (`--constraint`, GPUs) and what each node's task runs, through fake `srun`, `enroot`,
// `apptainer` and `scontrol` that record their arguments (tests/fixtures/slurm/fake-tool).

use std::path::{Path, PathBuf};

use cudastack::cluster::job::TrainingJob;
use cudastack::cluster::placement::{Placement, VerifiedProduct};
use cudastack::cluster::site_features::{SiteFeatures, SlurmPlacement};
use cudastack::cluster::slurm::training_script;
use cudastack::cluster::ClusterError;

const DIGEST: &str = "sha256:4a5d132a06a77c8331e15845f2e925adc788b00105097ad55409afa3f4fa4860";
const H100: &str = "NVIDIA H100 80GB HBM3";
const A100: &str = "NVIDIA A100-SXM4-80GB";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slurm")
}

fn site() -> SiteFeatures {
    SiteFeatures::load(&fixtures().join("site-features.yaml")).unwrap()
}

fn placement(floor: &str, products: &[&str]) -> Placement {
    let mut products: Vec<VerifiedProduct> = products
        .iter()
        .map(|name| VerifiedProduct {
            name: name.to_string(),
            compute_capability: "9.0".parse().unwrap(),
        })
        .collect();
    products.sort();
    Placement {
        products,
        driver_floor: floor.parse().unwrap(),
    }
}

fn admit(floor: &str, products: &[&str]) -> Result<SlurmPlacement, ClusterError> {
    SlurmPlacement::admit(&placement(floor, products), &site())
}

#[test]
fn two_verified_products_both_mapped_share_one_product_per_job() {
    let admitted = admit("535.104.05", &[H100, A100]).unwrap();
    assert_eq!(
        admitted.constraint,
        "[a100|h100]&(driver-535|driver-550-54-14|driver-550|driver-560)"
    );
    assert_eq!(admitted.gpu_request(8), "--gpus-per-node=8");
    assert!(admitted.notes.is_empty(), "{:?}", admitted.notes);
}

#[test]
fn an_unmapped_verified_product_is_left_out_with_a_note() {
    let admitted = admit("535.104.05", &[H100, "NVIDIA L40S"]).unwrap();
    assert_eq!(
        admitted.constraint,
        "h100&(driver-535|driver-550-54-14|driver-550|driver-560)"
    );
    assert_eq!(admitted.gpu_request(4), "--gres=gpu:h100:4");
    assert_eq!(admitted.products, [H100]);
    assert_eq!(admitted.notes.len(), 1, "{:?}", admitted.notes);
    assert!(
        admitted.notes[0].starts_with("NVIDIA L40S was verified, but the site feature map ")
            && admitted.notes[0].contains("site-features.yaml"),
        "{}",
        admitted.notes[0]
    );
}

#[test]
fn no_mapped_product_is_refused() {
    let error = admit("535.104.05", &["NVIDIA L40S"]).unwrap_err();
    assert!(
        matches!(error, ClusterError::Unplaceable { .. }),
        "{error:?}"
    );
    let error = error.to_string();
    assert!(
        error.contains("none of the GPUs the image was verified on (NVIDIA L40S)")
            && error.contains("it maps: NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB")
            && error.contains("hint: add the verified GPUs under `gpus:`"),
        "{error}"
    );
}

#[test]
fn a_floor_above_every_driver_feature_is_refused() {
    let error = admit("570.86.10", &[H100]).unwrap_err().to_string();
    assert!(
        error.contains("needs driver >= 570.86.10")
            && error.contains("the newest is driver-560 = 560.35.03")
            && error.contains("hint:"),
        "{error}"
    );
}

#[test]
fn a_map_without_driver_features_is_refused() {
    let site = SiteFeatures::parse(
        "gpus: [{product: NVIDIA H100 80GB HBM3, feature: h100}]\n",
        Path::new("site.yaml"),
    )
    .unwrap();
    let error = SlurmPlacement::admit(&placement("535.104.05", &[H100]), &site)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("site.yaml lists no driver features")
            && error.contains("never admitted")
            && error.contains("hint: tag each GPU node"),
        "{error}"
    );
}

#[test]
fn a_driver_exactly_at_the_floor_is_admitted_and_one_release_below_is_not() {
    let admitted = admit("550.54.15", &[H100]).unwrap();
    assert_eq!(admitted.constraint, "h100&(driver-550|driver-560)");
    assert_eq!(admitted.driver_features, ["driver-550", "driver-560"]);
    assert_eq!(admitted.notes.len(), 2, "{:?}", admitted.notes);
    assert!(admitted.notes[1].starts_with(
        "driver feature driver-550-54-14 (550.54.14) is older than the image's floor 550.54.15"
    ));
}

/// An entrypoint argument with a space, quotes and `$`: it must reach the entrypoint as
/// one literal argument, `$SLURM_NODEID` in it unexpanded.
const TRICKY: &str = "it's \"run 1\" on $SLURM_NODEID";

fn training_job(command: &[&str], nodes: u32, gpus: u32) -> TrainingJob {
    TrainingJob {
        name: "train".into(),
        image: format!("ghcr.io/acme/torch:2.4.1@{DIGEST}")
            .parse()
            .unwrap(),
        command: command.iter().map(|s| s.to_string()).collect(),
        working_dir: Some("/work dir".into()),
        start_guard: Vec::new(),
        nodes,
        gpus_per_node: gpus,
        needs: Default::default(),
        placement: placement("550.54.15", &[H100, A100]),
    }
}

/// One call a fake tool recorded.
#[derive(Debug, serde::Deserialize)]
struct Call {
    tool: String,
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
}

/// A directory with the fake tools on PATH, under each name they play.
fn fake_bin(work: &Path) -> PathBuf {
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in [
        "srun",
        "enroot",
        "apptainer",
        "scontrol",
        "python",
        "train-entry",
    ] {
        let path = bin.join(name);
        std::fs::copy(fixtures().join("fake-tool"), &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// Run `script` as the batch shell of a `nodes`-node allocation (hosts gpu-a1, gpu-a2, …)
/// and return every call the fakes recorded, in order.
fn run_batch(work: &Path, name: &str, script: &str, nodes: u32) -> Vec<Call> {
    let file = work.join(format!("{name}.sbatch"));
    std::fs::write(&file, script).unwrap();
    let record = work.join(format!("{name}.jsonl"));
    let hosts: Vec<String> = (1..=nodes).map(|i| format!("gpu-a{i}")).collect();
    let run = Command::new("bash")
        .arg(&file)
        .current_dir(work)
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", fake_bin(work).display()),
        )
        .env("RECORD", &record)
        .env("SLURM_JOB_NODELIST", format!("gpu-a[1-{nodes}]"))
        .env("SLURM_NNODES", nodes.to_string())
        .env("FAKE_HOSTS", hosts.join(" "))
        .env("PYTHONPATH", "/home/me/.local/leaky")
        .env_remove("SLURM_NODEID")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{name}: {}\n{script}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn calls_of<'a>(calls: &'a [Call], tool: &str) -> Vec<&'a Call> {
    calls.iter().filter(|call| call.tool == tool).collect()
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

/// bash -n, and shellcheck with no exclusions wherever it is installed.
fn lint(work: &Path, name: &str, script: &str) {
    directives_come_first(script);
    let file = work.join(format!("{name}.lint.sh"));
    std::fs::write(&file, script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        syntax.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    if Command::new("shellcheck")
        .arg("--version")
        .output()
        .is_err()
    {
        gate::skip("shellcheck", "shellcheck is not installed; the training scripts are only checked with bash -n and run");
        return;
    }
    let check = Command::new("shellcheck").arg(&file).output().unwrap();
    assert!(
        check.status.success(),
        "{name}: shellcheck:\n{}\n{script}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// torchrun's argv on node `rank` of a 2 x 8 job, after the interpreter.
fn torchrun_argv(rank: u32) -> Vec<String> {
    strings(&[
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        &format!("--node-rank={rank}"),
        "--master-addr=gpu-a1",
        "--master-port=29500",
        "train.py",
        "--name",
        TRICKY,
    ])
}

#[test]
fn multi_node_pyxis_training_starts_torchrun_with_each_nodes_rank() {
    let work = tempfile::tempdir().unwrap();
    let job = training_job(&["python", "train.py", "--name", TRICKY], 2, 8);
    let sbatch = training_script(&job, Runtime::Pyxis, &site()).unwrap();
    let script = &sbatch.script;
    lint(work.path(), "pyxis-multi", script);
    for directive in [
        "#SBATCH --job-name=train",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --constraint=[a100|h100]&(driver-550|driver-560)",
    ] {
        assert!(
            script.lines().any(|line| line == directive),
            "{directive}:\n{script}"
        );
    }

    let calls = run_batch(work.path(), "pyxis-multi", script, 2);
    assert_eq!(
        calls_of(&calls, "scontrol")[0].argv,
        ["show", "hostnames", "gpu-a[1-2]"]
    );
    let srun = calls_of(&calls, "srun");
    assert_eq!(srun.len(), 1, "{calls:?}");
    assert_eq!(
        srun[0].argv,
        strings(&[
            "--export=ALL",
            "--kill-on-bad-exit=1",
            &format!("--container-image=docker://ghcr.io#acme/torch@{DIGEST}"),
            "--no-container-mount-home",
            "--container-workdir=/work dir",
            "/bin/sh",
            "-c",
            r#"exec python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --node-rank="$SLURM_NODEID" --master-addr="$CUDASTACK_MASTER_ADDR" --master-port=29500 train.py --name "it's \"run 1\" on \$SLURM_NODEID""#,
        ])
    );
    let python = calls_of(&calls, "python");
    assert_eq!(python.len(), 2, "one task per node: {calls:?}");
    for (rank, call) in python.iter().enumerate() {
        assert_eq!(call.argv, torchrun_argv(rank as u32));
        assert_eq!(
            call.env.get("PYTHONPATH"),
            None,
            "the host's PYTHONPATH leaked"
        );
        assert_eq!(call.env["PYTHONNOUSERSITE"], "1");
    }
}

#[test]
fn multi_node_apptainer_training_expands_the_rank_outside_the_clean_environment() {
    let work = tempfile::tempdir().unwrap();
    let job = training_job(&["python", "train.py", "--name", TRICKY], 2, 8);
    let script = training_script(&job, Runtime::Apptainer, &site())
        .unwrap()
        .script;
    lint(work.path(), "apptainer-multi", &script);
    assert!(!script.contains("enroot"), "{script}");

    let calls = run_batch(work.path(), "apptainer-multi", &script, 2);
    let srun = calls_of(&calls, "srun");
    assert_eq!(
        &srun[0].argv[..4],
        ["--export=ALL", "--kill-on-bad-exit=1", "/bin/sh", "-c"]
    );
    let apptainer = calls_of(&calls, "apptainer");
    assert_eq!(apptainer.len(), 2, "one task per node: {calls:?}");
    for (rank, call) in apptainer.iter().enumerate() {
        let mut expected = strings(&[
            "exec",
            "--nv",
            "--cleanenv",
            "--no-home",
            "--pwd",
            "/work dir",
            &format!("docker://ghcr.io/acme/torch@{DIGEST}"),
            "python",
        ]);
        expected.extend(torchrun_argv(rank as u32));
        assert_eq!(call.argv, expected);
    }
}

/// A non-Python entrypoint runs once per node with torchrun's variables in its
/// environment: exported in the container's shell under pyxis, `--env` under Apptainer.
#[test]
fn other_entrypoints_get_the_rendezvous_in_their_environment_on_each_node() {
    let work = tempfile::tempdir().unwrap();
    let job = training_job(&["train-entry", "--config", "a b.yaml"], 2, 4);

    let pyxis = training_script(&job, Runtime::Pyxis, &site())
        .unwrap()
        .script;
    lint(work.path(), "pyxis-env", &pyxis);
    let calls = run_batch(work.path(), "pyxis-env", &pyxis, 2);
    let entry = calls_of(&calls, "train-entry");
    assert_eq!(entry.len(), 2, "{calls:?}");
    for (rank, call) in entry.iter().enumerate() {
        assert_eq!(call.argv, ["--config", "a b.yaml"]);
        let env: Vec<(&str, &str)> = call
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(k, _)| *k != "SLURM_NODEID" && *k != "PYTHONNOUSERSITE")
            .collect();
        assert_eq!(
            env,
            [
                ("MASTER_ADDR", "gpu-a1"),
                ("MASTER_PORT", "29500"),
                ("NNODES", "2"),
                ("NODE_RANK", rank.to_string().as_str()),
                ("NPROC_PER_NODE", "4"),
            ]
        );
    }

    let apptainer = training_script(&job, Runtime::Apptainer, &site())
        .unwrap()
        .script;
    lint(work.path(), "apptainer-env", &apptainer);
    let calls = run_batch(work.path(), "apptainer-env", &apptainer, 2);
    let runs = calls_of(&calls, "apptainer");
    assert_eq!(runs.len(), 2, "{calls:?}");
    for (rank, call) in runs.iter().enumerate() {
        assert_eq!(
            call.argv,
            strings(&[
                "exec",
                "--nv",
                "--cleanenv",
                "--no-home",
                "--pwd",
                "/work dir",
                "--env",
                "MASTER_ADDR=gpu-a1",
                "--env",
                "MASTER_PORT=29500",
                "--env",
                "NNODES=2",
                "--env",
                &format!("NODE_RANK={rank}"),
                "--env",
                "NPROC_PER_NODE=4",
                &format!("docker://ghcr.io/acme/torch@{DIGEST}"),
                "train-entry",
                "--config",
                "a b.yaml",
            ])
        );
    }
}

/// One node, one GPU: the entrypoint as written, straight from srun (no task shell, no
/// rendezvous), on the one product the map types, asked for by GRES type.
#[test]
fn single_gpu_training_runs_the_entrypoint_as_written() {
    let work = tempfile::tempdir().unwrap();
    let mut job = training_job(&["python", "train.py", "--name", TRICKY], 1, 1);
    job.placement = placement("550.54.15", &[H100]);
    for (name, runtime) in [
        ("pyxis-single", Runtime::Pyxis),
        ("apptainer-single", Runtime::Apptainer),
    ] {
        let script = training_script(&job, runtime, &site()).unwrap().script;
        lint(work.path(), name, &script);
        assert!(script.contains("\n#SBATCH --gres=gpu:h100:1\n"), "{script}");
        assert!(
            script.contains("\n#SBATCH --constraint=h100&(driver-550|driver-560)\n"),
            "{script}"
        );
        assert!(
            !script.contains("scontrol") && !script.contains("/bin/sh -c"),
            "{script}"
        );
        let calls = run_batch(work.path(), name, &script, 1);
        let srun = &calls_of(&calls, "srun")[0].argv;
        let (tool, expected) = match runtime {
            Runtime::Pyxis => ("python", strings(&["train.py", "--name", TRICKY])),
            Runtime::Apptainer => (
                "apptainer",
                strings(&[
                    "exec",
                    "--nv",
                    "--cleanenv",
                    "--no-home",
                    "--pwd",
                    "/work dir",
                    &format!("docker://ghcr.io/acme/torch@{DIGEST}"),
                    "python",
                    "train.py",
                    "--name",
                    TRICKY,
                ]),
            ),
        };
        assert_eq!(srun.last(), expected.last(), "{name}: {srun:?}");
        let runs = calls_of(&calls, tool);
        assert_eq!(runs.len(), 1, "{name}: {calls:?}");
        assert_eq!(runs[0].argv, expected, "{name}");
    }
}
