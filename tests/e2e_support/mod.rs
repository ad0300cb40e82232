//! What the tests that run `cudastack build` for real share: when they can run, and the
//! cache they share across runs (so a second run is the warm-cache case).
#![allow(dead_code)]

pub(crate) use crate::gate;
pub mod stand_in;

use std::path::{Path, PathBuf};
use std::process::Command;

fn have(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Why a real build cannot run here, or None. `tools` are extra programs to require
/// (each with arguments that succeed when it works, e.g. `docker info`). The caller
/// reports it through the gate (`skip.report()`) and returns.
pub fn skip_reason(tools: &[(&str, &[&str])]) -> Option<gate::Skip> {
    if std::env::var_os("CUDASTACK_SKIP_E2E").is_some() {
        return Some(gate::Skip::switch(
            "CUDASTACK_SKIP_E2E",
            "it switches off the real builds",
        ));
    }
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some(gate::Skip::missing(
            "root",
            "not root: these builds run in root mode and chroot into the image (the rootless modes are tests/build_rootless.rs)",
        ));
    }
    for (program, args) in [("mmdebstrap", &["--version"][..])].iter().chain(tools) {
        if !have(program, args) {
            return Some(gate::Skip::missing(program, format!("`{program}` is not available (scripts/test.sh installs and starts what this test needs)")));
        }
    }
    None
}

pub fn cache_dir() -> PathBuf {
    std::env::var_os("CUDASTACK_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-cache"))
}

/// Held by a test from before it builds a large image (a torch stack: ~5 GB unpacked) until
/// it has removed it from Docker (or its private cache), so that one such image is on the
/// disk at a time beyond the shared e2e cache. A load
/// through the API costs twice the image while it runs (the daemon keeps the archive in its
/// own temporary directory while it registers the layers: /var/lib/docker held 10 GB for
/// one 5 GB image here), and two of these tests at once on top of the e2e cache filled the
/// disk of a CI run (stop 29: 19 tests failed, the ones that wrote while it was full).
pub fn large_image_slot() -> std::fs::File {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("large-docker-image.lock");
    cudastack::atomic_file::lock(&path).expect("the large-image lock file opens")
}

/// `unshare … chroot ROOT`: the command to which the program to run in the unpacked image
/// `root` and its arguments are added. A private mount namespace gets /proc (the probes
/// read /proc/self/maps), which vanishes with the process.
pub fn in_image_chroot(root: &Path) -> Command {
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--fork",
            "sh",
            "-c",
            "mount -t proc proc \"$0/proc\" && exec chroot \"$0\" \"$@\"",
        ])
        .arg(root);
    command
}

/// A command's stdout and stderr together, for assertion messages.
pub fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
