//! Issue 19, part A: the image config a recipe gives (env, workdir, user, entrypoint, cmd,
//! expose, labels), the user's own layer, and pip with a constraints file so that an image
//! built `FROM` a cudastack image can `pip install` but cannot replace the stack.
//!
//! The real test locks the first shipped recipe (torch 2.4.1 + CUDA 12.1, its .debs kept
//! from the shipped lock) with a training image's config into a temporary directory,
//! builds it twice (same digest), loads it, checks the config in `docker inspect` and in
//! `docker run`, then `docker build`s two Dockerfiles `FROM` it: `pip install six==1.16.0`
//! succeeds, `pip install torch==2.5.1` fails with pip's own constraint conflict; the static
//! probe passes in the derived image. Needs root, mmdebstrap, Docker and PyPI (the lock
//! resolves there; the build's wheels come from the warm cache, CUDASTACK_TEST_CACHE).

use crate::e2e_support;
use crate::e2e_support::output_text as text;
use crate::gate;

use std::path::Path;
use std::process::{Command, Output};

const SHIPPED: &str = "recipes/torch2.4.1-cu121-py3.11";
const NAME: &str = "cudastack-image-config-test";
const TAG: &str = "localhost/cudastack-image-config-test:2.4.1";
const WITH_SIX: &str = "cudastack-image-config-test-six:test";
const WITH_TORCH: &str = "cudastack-image-config-test-torch:test";

/// The shipped recipe with a training image's config, named and tagged for this test.
fn training_recipe() -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{SHIPPED}.yaml")),
    )
    .unwrap();
    let mut recipe: Vec<String> = shipped
        .lines()
        .filter(|l| !l.starts_with("name:") && !l.starts_with("tags:"))
        .map(str::to_string)
        .collect();
    recipe.push(format!("name: {NAME}"));
    recipe.push("tags: [\"{registry}/cudastack-image-config-test:{torch}\"]".into());
    recipe.push(
        r#"env: { OMP_NUM_THREADS: 4, PATH: "$PATH:/home/trainer/.local/bin" }
workdir: /workspace
user: { name: trainer, uid: 1000 }
entrypoint: [python3]
cmd: [-c, "print('ready')"]
expose: ["29500", 8080/tcp]
labels: { com.example.team: ml }"#
            .into(),
    );
    recipe.join("\n") + "\n"
}

fn cudastack(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// A lock made before pip was a root requirement makes the build stop at once, saying to
/// lock again (the shipped locks until the lead relocks them; any user's old lock).
#[test]
fn a_lock_without_pip_fails_the_build_saying_to_lock_again() {
    let work = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for ext in ["yaml", "lock"] {
        std::fs::copy(
            root.join(format!("{SHIPPED}.{ext}")),
            work.path().join(format!("old.{ext}")),
        )
        .unwrap();
    }
    let lock = std::fs::read_to_string(work.path().join("old.lock")).unwrap();
    if lock.contains("\"name\": \"pip\"") {
        // Relocked with pip: the check is exercised with the entry taken out.
        let mut value: serde_json::Value = serde_json::from_str(&lock).unwrap();
        value["artifacts"]
            .as_array_mut()
            .unwrap()
            .retain(|a| a["name"] != "pip");
        std::fs::write(work.path().join("old.lock"), value.to_string()).unwrap();
    }
    let cache = work.path().join("cache");
    let output = cudastack(
        &["build", "old.yaml", "--cache-dir", cache.to_str().unwrap()],
        work.path(),
    );
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(all.contains("lock file `old.lock` has no `pip`"), "{all}");
    assert!(
        all.contains("hint: run `cudastack lock old.yaml` again"),
        "{all}"
    );
}

struct RemoveImages;
impl Drop for RemoveImages {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", TAG, WITH_SIX, WITH_TORCH])
            .output();
        // The steps a failed `docker build` completed stay as untagged images; they carry
        // the image's labels.
        let _ = Command::new("docker")
            .args(["image", "prune", "-f", "--filter"])
            .arg(format!("label=io.cudastack.recipe={NAME}"))
            .output();
    }
}

pub fn pypi_reachable() -> bool {
    Command::new("curl")
        .args([
            "-sSf",
            "-m",
            "20",
            "-o",
            "/dev/null",
            "https://pypi.org/simple/six/",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

/// `docker build` of `dockerfile` as `tag`, from a directory of its own. Where this host
/// reaches PyPI through a TLS-inspecting proxy whose CA it names in PIP_CERT (as a site
/// behind one does), that CA goes into the context and `{pip_cert}` in the Dockerfile
/// becomes `PIP_CERT=/tmp/host-ca.pem`; elsewhere it is nothing.
fn docker_build(dockerfile: &str, tag: &str) -> Output {
    let context = tempfile::tempdir().unwrap();
    let (copy, pip_cert) = match std::env::var_os("PIP_CERT") {
        Some(ca) if Path::new(&ca).is_file() => {
            std::fs::copy(&ca, context.path().join("host-ca.pem")).unwrap();
            (
                "COPY host-ca.pem /tmp/host-ca.pem\n",
                "PIP_CERT=/tmp/host-ca.pem ",
            )
        }
        _ => ("", ""),
    };
    let dockerfile = dockerfile
        .replacen("\nUSER root\n", &format!("\nUSER root\n{copy}"), 1)
        .replace("{pip_cert}", pip_cert);
    std::fs::write(context.path().join("Dockerfile"), dockerfile).unwrap();
    Command::new("docker")
        .args(["build", "--no-cache", "--force-rm", "-t", tag])
        .arg(context.path())
        .output()
        .unwrap()
}

#[test]
fn a_training_image_runs_as_its_user_and_extends_with_pip_within_its_constraints() {
    if let Some(reason) = e2e_support::skip_reason(&[("docker", &["info"][..])]) {
        reason.report();
        return;
    }
    if !pypi_reachable() {
        gate::Skip::missing(
            "PyPI",
            "https://pypi.org is not reachable: the lock resolves pip there",
        )
        .report();
        return;
    }
    // Declared first, so it is released after the images are removed.
    let _slot = e2e_support::large_image_slot();
    let _cleanup = RemoveImages;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    std::fs::write(dir.join("train.yaml"), training_recipe()).unwrap();
    // The shipped lock's .debs are kept (lock re-resolves the wheels only), so the base
    // comes from the warm cache.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{SHIPPED}.lock")),
        dir.join("train.lock"),
    )
    .unwrap();
    let locked = cudastack(&["lock", "train.yaml"], dir);
    assert!(locked.status.success(), "lock failed:\n{}", text(&locked));
    let lock = std::fs::read_to_string(dir.join("train.lock")).unwrap();
    assert!(lock.contains("\"name\": \"pip\""), "pip is locked");

    let cache = e2e_support::cache_dir();
    let build = |layout: &str| {
        let started = std::time::Instant::now();
        let output = cudastack(
            &[
                "build",
                "train.yaml",
                "--load",
                // gzip: the torch layers the other e2e tests share (tests/build_e2e.rs).
                "--compression",
                "gzip",
                "--layout",
                layout,
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            dir,
        );
        let log = text(&output);
        assert!(output.status.success(), "build failed:\n{log}");
        eprintln!(
            "build into {layout}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let digest = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        (digest, log)
    };
    let (digest, log) = build("layout-a");
    assert!(log.contains("user "), "the user layer is built:\n{log}");
    for check in [
        "static.torch",
        "static.loaded_libraries",
        "static.ld_library_path",
    ] {
        assert!(
            log.lines().any(|l| l.contains(check) && l.contains("pass")),
            "{check} did not pass:\n{log}"
        );
    }
    let (again, log) = build("layout-b");
    assert_eq!(digest, again, "two builds of one recipe differ:\n{log}");

    check_config();
    check_runs_as_the_user();
    check_pip_extends_within_the_constraints();
}

/// Entrypoint, Cmd, Env, ExposedPorts, Labels, User and WorkingDir in `docker inspect`.
fn check_config() {
    let inspect = docker(&["image", "inspect", "--format", "{{json .Config}}", TAG]);
    assert!(inspect.status.success(), "{}", text(&inspect));
    let config: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(config["User"], "1000:1000", "{config}");
    assert_eq!(config["WorkingDir"], "/workspace", "{config}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["python3"]));
    assert_eq!(config["Cmd"], serde_json::json!(["-c", "print('ready')"]));
    assert_eq!(
        config["ExposedPorts"],
        serde_json::json!({"29500/tcp": {}, "8080/tcp": {}})
    );
    assert_eq!(config["Labels"]["com.example.team"], "ml");
    assert_eq!(config["Labels"]["io.cudastack.recipe"], NAME);
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for expected in [
        "OMP_NUM_THREADS=4",
        "PIP_CONSTRAINT=/etc/pip/constraints.txt",
        "PIP_BREAK_SYSTEM_PACKAGES=1",
        "PATH=/usr/local/cuda-12.1/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/trainer/.local/bin",
    ] {
        assert!(env.contains(&expected), "{expected} not in {env:?}");
    }
}

fn check_runs_as_the_user() {
    let run = |entrypoint: &str, args: &[&str]| {
        let mut all = vec!["run", "--rm", "--entrypoint", entrypoint, TAG];
        all.extend(args);
        let output = docker(&all);
        assert!(output.status.success(), "{entrypoint}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(
        run("id", &[]),
        "uid=1000(trainer) gid=1000(trainer) groups=1000(trainer)"
    );
    assert_eq!(run("pwd", &[]), "/workspace");
    assert_eq!(
        run(
            "sh",
            &["-c", "echo $HOME; stat -c %u:%g /home/trainer /workspace"]
        ),
        "/home/trainer\n1000:1000\n1000:1000"
    );
    // The default command through the entrypoint.
    let ready = docker(&["run", "--rm", TAG]);
    assert_eq!(
        String::from_utf8_lossy(&ready.stdout).trim(),
        "ready",
        "{}",
        text(&ready)
    );
    let constraints = run("cat", &["/etc/pip/constraints.txt"]);
    assert!(
        constraints.lines().any(|l| l == "torch==2.4.1"),
        "{constraints}"
    );
    assert!(
        constraints.lines().any(|l| l.starts_with("pip==")),
        "{constraints}"
    );
}

fn check_pip_extends_within_the_constraints() {
    // The supported way to extend: install as root into the image's site, back to the user.
    let six = docker_build(
        &format!(
            "FROM {TAG}\nUSER root\nRUN {{pip_cert}}pip install six==1.16.0\nUSER 1000:1000\n"
        ),
        WITH_SIX,
    );
    assert!(
        six.status.success(),
        "pip install six failed:\n{}",
        text(&six)
    );
    let imports = docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        WITH_SIX,
        "-c",
        "import six, torch; print(six.__version__, torch.__version__, six.__file__)",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&imports.stdout).trim(),
        "1.16.0 2.4.1+cu121 /usr/local/lib/python3.11/dist-packages/six.py",
        "{}",
        text(&imports)
    );
    // The static probe in the derived image: still the one stack it was.
    let probe = docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        WITH_SIX,
        "/opt/cudastack/probe/probe.py",
        "--level",
        "static",
    ]);
    let stdout = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success(),
        "the static probe failed in the derived image:\n{}",
        text(&probe)
    );
    let report =
        cudastack::verify::report::Report::from_output(&stdout, "the derived image").unwrap();
    for check in &report.checks {
        assert_ne!(
            check.status,
            cudastack::verify::report::Status::Fail,
            "{}: {}",
            check.id,
            check.detail
        );
    }
    assert!(report
        .checks
        .iter()
        .any(|c| c.id == "static.loaded_libraries"));

    // Another torch: pip's own resolver refuses it against the constraints.
    let torch = docker_build(
        &format!("FROM {TAG}\nUSER root\nRUN {{pip_cert}}pip install torch==2.5.1\n"),
        WITH_TORCH,
    );
    let output = text(&torch);
    assert!(!torch.status.success(), "pip replaced torch:\n{output}");
    assert!(
        output.contains("The user requested (constraint) torch==2.4.1"),
        "{output}"
    );
    assert!(
        output.contains("ResolutionImpossible") || output.contains("conflicting dependencies"),
        "{output}"
    );
}
