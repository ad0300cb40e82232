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
