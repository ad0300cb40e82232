//! `cudastack doctor --build-host` (issue 24): can this machine run `cudastack build`, as
//! root or not? Run as root, as the unprivileged user of tests/build_rootless.rs, and with
//! a PATH that has no mmdebstrap (the install hint, exit 1).

use std::path::Path;
use std::process::{Command, Output};

use crate::build_rootless::{as_user, chown_to_user, ensure_user, user_work_dir};

fn doctor_json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn finding<'a>(json: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no finding {id} in {json:#}"))
}

fn doctor(program: &Path) -> Command {
    let mut command = Command::new(program);
    command.args(["doctor", "--build-host", "--json"]);
    command
}

/// Without mmdebstrap on PATH, the build host is broken and says what to install.
#[test]
fn a_path_without_mmdebstrap_gives_the_install_hint() {
    let empty = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let output = doctor(Path::new(env!("CARGO_BIN_EXE_cudastack")))
        .arg("--cache-dir")
        .arg(cache.path())
        .env("PATH", empty.path())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "a host that cannot build exits 1"
    );
    let json = doctor_json(&output);
    assert_eq!(json["schema"], "cudastack.doctor.build-host/v1");
    assert_eq!(json["status"], "broken");
    let mmdebstrap = finding(&json, "build.mmdebstrap");
    assert_eq!(mmdebstrap["severity"], "error");
    assert!(mmdebstrap["fix"]
        .as_str()
        .unwrap()
        .contains("apt-get install mmdebstrap"));
    assert_eq!(finding(&json, "build.cache_writable")["severity"], "ok");
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .ok()
        == Some(0)
}

/// As root: root mode, and `auto` picks it. As the user with subordinate ids: not root,
/// and `auto` picks unshare when user namespaces work here, else fakechroot.
#[test]
fn root_and_an_unprivileged_user_are_told_their_build_modes() {
    if !is_root() {
        crate::gate::skip("root", "making the unprivileged user needs root");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let output = doctor(Path::new(env!("CARGO_BIN_EXE_cudastack")))
        .arg("--cache-dir")
        .arg(cache.path())
        .output()
        .unwrap();
    let json = doctor_json(&output);
    assert_eq!(json["uid"], 0);
    assert_eq!(finding(&json, "build.mode.root")["severity"], "ok");
    if json["status"] != "broken" {
        assert_eq!(json["auto"], "root");
    }

    ensure_user();
    let (work, binary) = user_work_dir();
    chown_to_user(work.path());
    let mut command = as_user(&binary);
    let output = command
        .args(["doctor", "--build-host", "--json", "--cache-dir"])
        .arg(work.path().join("cache"))
        .output()
        .unwrap();
    let json = doctor_json(&output);
    assert_ne!(json["uid"], 0);
    let root = finding(&json, "build.mode.root");
    assert_eq!(root["severity"], "info");
    assert!(root["evidence"][0].as_str().unwrap().contains("not root"));
    assert_eq!(finding(&json, "build.cache_writable")["severity"], "ok");
    let unshare_works = finding(&json, "build.mode.unshare")["severity"] == "ok";
    let fakechroot_works = finding(&json, "build.mode.fakechroot")["severity"] == "ok";
    let expected = if unshare_works {
        "unshare"
    } else if fakechroot_works {
        "fakechroot"
    } else {
        assert_eq!(json["status"], "broken", "{json:#}");
        return;
    };
    assert_eq!(json["auto"], expected, "{json:#}");
}
