//! `cudastack verify --native`: the probe run with this host's Python, no Docker.
//!
//! Issue 16: `--require-gpu` was ignored there, so a machine without a GPU "passed" with
//! exit 0. This machine has no GPU, which is the case to prove; on a machine with a GPU
//! the test says so and skips.

use crate::gate::Skip;

use std::path::Path;
use std::process::Command;

/// Why these tests cannot run here, if they cannot: a GPU here is a condition of the host
/// (the case to prove is a machine without one), a missing python3 a missing component.
fn skip_reason() -> Option<Skip> {
    if Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia/version").exists() {
        return Some(Skip::host(
            "this machine has an NVIDIA driver: the probe may see a GPU",
        ));
    }
    match Command::new("python3").arg("--version").output() {
        Ok(output) if output.status.success() => None,
        _ => Some(Skip::missing("python3", "no python3 to run the probe with")),
    }
}

#[test]
fn require_gpu_without_a_gpu_fails_saying_no_gpu_was_seen() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    for level in ["driver", "train"] {
        let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
            .args(["verify", "--native", "--require-gpu", "--level", level])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("--level {level}: {}\n{stderr}", output.status);
        assert!(
            !output.status.success(),
            "--level {level}: exit 0:\n{stderr}"
        );
        assert!(stderr.contains("the probe saw no GPU"), "{stderr}");
        assert!(stderr.contains("hint:"), "{stderr}");
    }
}

#[test]
fn without_require_gpu_no_gpu_is_the_static_level_not_an_error_about_gpus() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["verify", "--native", "--level", "driver"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("the probe saw no GPU"), "{stderr}");
}
