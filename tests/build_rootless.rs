//! Rootless builds (issue 24, docs/rootless.md): the same recipe built by root and, as a
//! user without root, in mmdebstrap's unshare and fakechroot modes; the base layers must
//! be the same bytes. The recipe is the stand-in stack of tests/build_audit.rs (gcc-made
//! nvidia-* libraries in a local mirror), so the Debian base is the only real download.
//!
//! Needs root (to make the user `cudastack-rootless` with /etc/subuid and /etc/subgid
//! ranges, and for the root build), mmdebstrap, fakechroot, fakeroot, newuidmap, gcc and
//! the Debian mirror. Three bases are built: minutes.

use crate::e2e_support;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e_support::stand_in::{cuda_12_4_wheels, Target};

pub const USER: &str = "cudastack-rootless";

/// The user the rootless builds run as, with 65536 subordinate uids and gids.
pub fn ensure_user() {
    let exists = Command::new("id")
        .arg(USER)
        .output()
        .unwrap()
        .status
        .success();
    if !exists {
        let made = Command::new("useradd")
            .args(["--create-home", USER])
            .status()
            .unwrap();
        assert!(made.success(), "useradd {USER} failed");
    }
    let has_range = |file: &str| {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|line| line.starts_with(&format!("{USER}:")))
    };
    if !has_range("/etc/subuid") || !has_range("/etc/subgid") {
        let added = Command::new("usermod")
            .args([
                "--add-subuids",
                "300000-365535",
                "--add-subgids",
                "300000-365535",
                USER,
            ])
            .status()
            .unwrap();
        assert!(added.success(), "usermod --add-subuids failed");
    }
}

/// A work directory the user may read and write, with a copy of the binary in it.
pub fn user_work_dir() -> (tempfile::TempDir, PathBuf) {
    let work = tempfile::Builder::new()
        .prefix("cudastack-rootless-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let binary = work.path().join("cudastack");
    std::fs::copy(env!("CARGO_BIN_EXE_cudastack"), &binary).unwrap();
    (work, binary)
}

pub fn chown_to_user(path: &Path) {
    let status = Command::new("chown")
        .args(["-R", &format!("{USER}:{USER}")])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// `COMMAND` as the user, with a clean environment of their own.
pub fn as_user(program: &Path) -> Command {
    let mut command = Command::new("runuser");
    command
        .args(["-u", USER, "--", "env", "-i"])
        .arg(format!("HOME=/home/{USER}"))
        .arg(format!("USER={USER}"))
        .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("TMPDIR=/tmp")
        .arg(program);
    command
}

/// The layer digests of the image in `layout` (one platform).
pub fn layer_digests(layout: &Path) -> Vec<String> {
    let read_json = |path: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    };
    let index = read_json(layout.join("index.json"));
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest = read_json(blob(layout, manifest_digest));
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|layer| layer["digest"].as_str().unwrap().to_string())
        .collect()
}

pub fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// Each entry of a gzip layer: (kind, mode, uid, gid, size, sha256 of content or link).
fn listing(path: &Path) -> BTreeMap<String, String> {
    let file = std::fs::File::open(path).unwrap();
    let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(file));
    let mut entries = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header().clone();
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let link = entry
            .link_name()
            .unwrap()
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        let digest = cudastack::digest::Digest::of_bytes(&content);
        entries.insert(
            name,
            format!(
                "{:?} {:o} {}:{} {} {} {link}",
                header.entry_type(),
                header.mode().unwrap(),
                header.uid().unwrap(),
                header.gid().unwrap(),
                content.len(),
                &digest.hex()[..12]
            ),
        );
    }
    entries
}

/// The entries in which two layers differ, one line each.
pub fn differences(left: &Path, right: &Path) -> Vec<String> {
    let (left, right) = (listing(left), listing(right));
    let mut lines = Vec::new();
    for (name, l) in &left {
        match right.get(name) {
            Some(r) if r == l => {}
            Some(r) => lines.push(format!("{name}: root {l} | rootless {r}")),
            None => lines.push(format!("{name}: only in the root build")),
        }
    }
    for name in right.keys().filter(|n| !left.contains_key(*n)) {
        lines.push(format!("{name}: only in the rootless build"));
    }
    lines
}

/// The stand-in stack (gcc-made nvidia-* wheels in `work/mirror`), its recipe
/// `work/rootless.yaml` and the lock beside it; returns the recipe's path.
pub fn locked_stand_in(work: &Path) -> PathBuf {
    cuda_12_4_wheels(Target::X86_64, &work.join("libs"), &work.join("mirror"));
    let recipe = work.join("rootless.yaml");
    std::fs::write(&recipe, "name: rootless\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    e2e_support::stand_in::lock(&recipe, &work.join("mirror"));
    recipe
}

/// `cudastack build` of `recipe` with `command`, in mode `what` (its own cache and layout).
fn build(command: &mut Command, what: &str, recipe: &Path, work: &Path) -> PathBuf {
    let layout = work.join(format!("layout-{what}"));
    let started = std::time::Instant::now();
    command.args(["build", "--no-verify"]);
    // Root builds with `auto`, which an older build of cudastack (CUDASTACK_TEST_BIN) takes.
    if what != "root" {
        command.args(["--build-mode", what]);
    }
    let output = command
        .arg("--mirror")
        .arg(work.join("mirror"))
        .arg("--layout")
        .arg(&layout)
        .arg("--cache-dir")
        .arg(work.join(format!("cache-{what}")))
        .arg(recipe)
        .output()
        .unwrap();
    eprintln!("{what} build: {:?}", started.elapsed());
    assert!(
        output.status.success(),
        "the {what} build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    layout
}

#[test]
fn rootless_builds_give_the_root_builds_base_layer() {
    // newuidmap has no option that succeeds; the unshare build says so when it is missing.
    let tools: [(&str, &[&str]); 3] = [
        ("gcc", &["--version"]),
        ("fakechroot", &["--version"]),
        ("fakeroot", &["--version"]),
    ];
    if let Some(reason) = e2e_support::skip_reason(&tools) {
        reason.report();
        return;
    }
    ensure_user();
    let (work, binary) = user_work_dir();
    let work = work.path();
    let recipe = locked_stand_in(work);
    chown_to_user(work);
    // `CUDASTACK_TEST_BIN`: the root build by another build of cudastack (one from before
    // rootless builds existed, to show the root path kept its bytes).
    let root_binary = std::env::var_os("CUDASTACK_TEST_BIN").map_or(binary.clone(), PathBuf::from);
    let root = build(&mut Command::new(root_binary), "root", &recipe, work);
    let root_layers = layer_digests(&root);
    let mut report = Vec::new();
    for mode in ["unshare", "fakechroot"] {
        let layout = build(&mut as_user(&binary), mode, &recipe, work);
        let layers = layer_digests(&layout);
        eprintln!("{mode}: base {} (root {})", layers[0], root_layers[0]);
        for (index, (ours, theirs)) in layers.iter().zip(&root_layers).enumerate() {
            if ours != theirs {
                let diff = differences(&blob(&root, theirs), &blob(&layout, ours));
                report.push(format!(
                    "{mode}: layer {index} differs in {} entries:\n  {}",
                    diff.len(),
                    diff.join("\n  ")
                ));
            }
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// A mode asked for that cannot work here fails before mmdebstrap runs, saying why and
/// what to do: `--build-mode root` as the user.
#[test]
fn a_build_mode_that_cannot_work_here_says_why() {
    let tools: [(&str, &[&str]); 1] = [("gcc", &["--version"])];
    if let Some(reason) = e2e_support::skip_reason(&tools) {
        reason.report();
        return;
    }
    ensure_user();
    let (work, binary) = user_work_dir();
    let work = work.path();
    let recipe = locked_stand_in(work);
    chown_to_user(work);
    let output = as_user(&binary)
        .args(["build", "--no-verify", "--build-mode", "root", "--mirror"])
        .arg(work.join("mirror"))
        .arg("--cache-dir")
        .arg(work.join("cache"))
        .arg("--layout")
        .arg(work.join("layout"))
        .arg(&recipe)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--build-mode root does not work here")
            && stderr.contains("not root")
            && stderr.contains("hint:"),
        "{stderr}"
    );
}
