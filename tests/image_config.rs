//! The image config's build-time checks, and what the image tests share. The image a
//! recipe's config gives (env, workdir, user, entrypoint, cmd, expose, labels), its user
//! layer, and pip extending it within its constraints are proven on the real training image
//! of tests/training_image.rs, which builds and loads one torch image for all of them.

use crate::e2e_support::output_text as text;

use std::path::Path;
use std::process::{Command, Output};

const SHIPPED: &str = "recipes/torch2.4.1-cu121-py3.11";

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

/// `docker build` of `dockerfile` as `tag`, from a directory of its own. Where this host
/// reaches PyPI through a TLS-inspecting proxy whose CA it names in PIP_CERT (as a site
/// behind one does), that CA goes into the context and `{pip_cert}` in the Dockerfile
/// becomes `PIP_CERT=/tmp/host-ca.pem`; elsewhere it is nothing.
pub(crate) fn docker_build(dockerfile: &str, tag: &str) -> Output {
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
