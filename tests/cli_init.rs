//! `cudastack init`: a new project's recipe, commented, that validates, with the files it
//! names; what a project already has is kept, and a recipe is never replaced. The real
//! binary in temporary directories; `--detect` on this machine reads its real (absent) GPU.

use std::path::Path;
use std::process::Command;

use crate::gate;

fn cudastack(args: &[&str], dir: &Path) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn init_writes_a_training_recipe_that_validates_and_never_replaces_one() {
    let work = tempfile::tempdir().unwrap();
    let (code, out) = cudastack(
        &[
            "init",
            "Acme Train",
            "--driver",
            "550.54.15",
            "--gpu",
            "H100",
        ],
        work.path(),
    );
    assert_eq!(code, 0, "{out}");
    let project = work.path().join("Acme Train");
    let recipe = std::fs::read_to_string(project.join("cudastack.yaml")).unwrap();
    for line in [
        "name: acme-train",
        "gpus: [\"H100\"]",
        "requirements: [requirements.txt]",
        "  - { src: ., dst: /workspace, exclude: [images/, .git/, .venv/, \"**/__pycache__\", .env, \".env.*\", .netrc, \"*.key\", \"*.pem\"] }",
        "user: { name: trainer, uid: 1000 }",
        "entrypoint: [python, /workspace/train.py]",
        "# ca_certificates: [certs/corp-root.pem]",
    ] {
        assert!(recipe.lines().any(|l| l == line), "{line}:\n{recipe}");
    }
    for file in ["requirements.txt", "train.py", ".dockerignore"] {
        assert!(project.join(file).is_file(), "{file}: {out}");
    }
    let (code, out) = cudastack(&["validate", "cudastack.yaml"], &project);
    assert_eq!(code, 0, "{out}");
    // The driver floor the stack picked runs on the nodes' driver.
    let floor = recipe
        .lines()
        .find_map(|l| l.strip_prefix("driver_floor: "))
        .unwrap()
        .trim_matches('"');
    let floor: cudastack::version::DriverVersion = floor.parse().unwrap();
    let nodes: cudastack::version::DriverVersion = "550.54.15".parse().unwrap();
    assert!(floor <= nodes, "{floor}");
    // Never replaced: the second init refuses and leaves the recipe as it was.
    let (code, out) = cudastack(
        &["init", "Acme Train", "--driver", "470.57.02"],
        work.path(),
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("never replaces a recipe"), "{out}");
    assert_eq!(
        std::fs::read_to_string(project.join("cudastack.yaml")).unwrap(),
        recipe
    );
}

#[test]
fn init_keeps_the_files_a_project_has() {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("requirements.txt"), "six==1.16.0\n").unwrap();
    std::fs::write(work.path().join("train.py"), "print('ours')\n").unwrap();
    let (code, out) = cudastack(&["init", "--name", "ours", "--gpu", "A100"], work.path());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("kept   ./requirements.txt"), "{out}");
    assert!(
        out.contains("next:  cudastack lock ./cudastack.yaml"),
        "{out}"
    );
    assert!(out.contains("wrote  ./cudastack.yaml"), "{out}");
    // No driver given: the note says what the stack needs.
    assert!(out.contains("no --driver given"), "{out}");
    assert_eq!(
        std::fs::read_to_string(work.path().join("requirements.txt")).unwrap(),
        "six==1.16.0\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.path().join("train.py")).unwrap(),
        "print('ours')\n"
    );
    let (code, out) = cudastack(&["validate", "cudastack.yaml"], work.path());
    assert_eq!(code, 0, "{out}");
    // A name that is not an image name is refused before anything is written.
    let other = tempfile::tempdir().unwrap();
    let (code, out) = cudastack(&["init", "--name", "Bad Name"], other.path());
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("cannot name an image"), "{out}");
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
}

/// This machine has no NVIDIA driver: `--detect` says so and the project is still made
/// (for the newest stack, with the note of the driver it needs).
#[test]
fn init_detect_on_a_machine_without_a_gpu_says_so() {
    let work = tempfile::tempdir().unwrap();
    let (code, out) = cudastack(&["init", "--detect"], work.path());
    assert_eq!(code, 0, "{out}");
    if cudastack::host::driver::detect(&cudastack::host::HostRoot::live())
        .driver_version
        .is_none()
    {
        assert!(out.contains("--detect: no NVIDIA driver"), "{out}");
    }
    let (code, out) = cudastack(&["validate", "cudastack.yaml"], work.path());
    assert_eq!(code, 0, "{out}");
}

/// README's promise for a new project: `init`, then `lock`, on a host that reaches only
/// PyPI and Debian's archive (this one: PyTorch's index is not reachable here). The stack
/// `init` picks is PyPI's, so the lock succeeds.
#[test]
fn an_initialised_project_locks_from_pypi_and_debian() {
    if gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org and deb.debian.org",
    ) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (code, out) = cudastack(
        &[
            "init",
            "--name",
            "acme",
            "--driver",
            "535.104.05",
            "--gpu",
            "H100",
        ],
        work.path(),
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = cudastack(&["lock", "cudastack.yaml"], work.path());
    assert_eq!(code, 0, "{out}");
    let lock = std::fs::read_to_string(work.path().join("cudastack.lock")).unwrap();
    assert!(
        lock.contains("files.pythonhosted.org"),
        "the wheels come from PyPI"
    );
    assert!(
        !lock.contains("download.pytorch.org"),
        "nothing from PyTorch's index"
    );
}
