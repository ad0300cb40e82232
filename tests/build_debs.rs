//! The base comes from locked .debs only (issue 18): a build reads no archive index, so it
//! runs with the network cut off once its .debs are in the cache, and says what is missing
//! when they are not. Real builds (root, mmdebstrap), against a stand-in CUDA stack whose
//! lock pins the real Debian packages (deb.debian.org).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::e2e_support::{self, stand_in::cuda_12_4_wheels, stand_in::Target};

/// A stand-in CUDA 12.4 recipe on bookworm, locked, in `work`.
fn locked_stand_in(work: &Path, name: &str, extra: &str) -> PathBuf {
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &work.join("mirror"));
    let recipe = work.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\n{extra}")).unwrap();
    e2e_support::stand_in::lock(&recipe, &work.join("mirror"));
    recipe
}

/// `cudastack build --no-verify` of `recipe` into `layout` with `cache`, run through
/// `wrap` (e.g. `unshare --net`), or directly.
fn build(recipe: &Path, layout: &Path, cache: &Path, wrap: &[&str]) -> Output {
    let binary = env!("CARGO_BIN_EXE_cudastack");
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    command
        .args(["build", "--no-verify", "--mirror"])
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(cache)
        .arg(recipe)
        .output()
        .unwrap()
}

/// The manifest digest a successful build printed.
fn digest(output: &Output) -> String {
    assert!(
        output.status.success(),
        "build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_build_with_the_network_cut_off_works_from_a_warm_cache_and_says_what_a_cold_one_lacks() {
    if let Some(skip) = e2e_support::skip_reason(&[("unshare", &["--net", "true"])]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = locked_stand_in(work.path(), "offline", "");
    let cache = work.path().join("cache");
    let online = digest(&build(&recipe, &work.path().join("a"), &cache, &[]));

    // Warm blobs, nothing staged: mmdebstrap installs from the local repository alone.
    for dir in ["staging", "layers"] {
        std::fs::remove_dir_all(cache.join(dir)).unwrap();
    }
    let offline = build(
        &recipe,
        &work.path().join("b"),
        &cache,
        &["unshare", "--net"],
    );
    assert_eq!(
        digest(&offline),
        online,
        "the offline build is the same image"
    );

    // A cold cache cannot fetch a .deb: one error names them and the way forward.
    let cold = build(
        &recipe,
        &work.path().join("c"),
        &work.path().join("cold"),
        &["unshare", "--net"],
    );
    let stderr = String::from_utf8_lossy(&cold.stderr);
    assert!(!cold.status.success());
    assert!(
        stderr.contains("locked .debs could not be fetched") && stderr.contains("libc6 2.36"),
        "{stderr}"
    );
    assert!(stderr.contains("--apt-mirror"), "{stderr}");
    assert!(!work.path().join("c").join("index.json").exists());
}

const APT_TAG: &str = "localhost/cudastack-test-apt:1";

struct RemoveAptImage;
impl Drop for RemoveAptImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", APT_TAG]).output();
    }
}

/// The layer digests of the image in `layout` (its one manifest), bottom first.
fn layer_digests(layout: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .replace(':', "/");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("blobs").join(manifest)).unwrap())
            .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// "audit: N ELF files" from a build's summary.
fn audited_elf_files(output: &Output) -> usize {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let after = stderr.split("audit: ").nth(1).unwrap_or_default();
    after
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no audit summary in:\n{stderr}"))
}

#[test]
fn apt_packages_are_a_layer_of_their_own_that_runs_in_docker() {
    if let Some(skip) = e2e_support::skip_reason(&[("docker", &["info"])]) {
        skip.report();
        return;
    }
    let _cleanup = RemoveAptImage;
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let plain = locked_stand_in(work.path(), "plain", "");
    let tools = locked_stand_in(
        work.path(),
        "tools",
        &format!("apt: [git, openssh-client, libgl1]\ntags: [\"{APT_TAG}\"]\n"),
    );
    let plain_build = build(&plain, &work.path().join("plain"), &cache, &[]);
    digest(&plain_build);
    let tools_build = build(&tools, &work.path().join("tools"), &cache, &[]);
    digest(&tools_build);

    // One layer more, and the base layer is the same blob: recipes share it.
    let plain_layers = layer_digests(&work.path().join("plain"));
    let tools_layers = layer_digests(&work.path().join("tools"));
    assert_eq!(tools_layers.len(), plain_layers.len() + 1);
    assert_eq!(tools_layers[0], plain_layers[0], "the base layer is shared");
    // The static audit read the new libraries too (git, ssh, libGL and theirs).
    assert!(audited_elf_files(&tools_build) > audited_elf_files(&plain_build) + 20);

    let loaded = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .arg("load")
        .arg(work.path().join("tools"))
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let run = |script: &str| {
        let output = Command::new("docker")
            .args(["run", "--rm", APT_TAG, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "`{script}`: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert!(run("git --version").starts_with("git version 2."));
    assert!(run("ssh -V").contains("OpenSSH_"));
    // What `import cv2` needs of libgl1: the loader finds and loads libGL.so.1.
    assert!(
        run("python3 -c \"import ctypes; ctypes.CDLL('libGL.so.1'); print('libGL ok')\"")
            .contains("libGL ok")
    );
    // apt in the image reads the real archive again (not the build's local repository).
    assert!(run("cat /etc/apt/sources.list").contains("http://deb.debian.org/debian bookworm main"));
}
