//! Exit codes and printing of the real binary (issue 16): a closed pipe is a quiet exit,
//! never a panic; `check` says unknown with its own exit status, never yes.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use cudastack::oci::{self, Image};

fn cudastack() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

/// Run `args` with stdout a pipe whose read end is closed before the command writes
/// anything (as `| head` does once it has its lines): (exit code, stderr).
fn with_stdout_closed(args: &[&str]) -> (Option<i32>, String) {
    let mut child = cudastack()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end at once: the command is still parsing its arguments.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    (status.code(), stderr)
}

fn assert_quiet_exit(args: &[&str]) {
    let (code, stderr) = with_stdout_closed(args);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{args:?} complained about the closed pipe:\n{stderr}"
    );
    assert_ne!(code, Some(101), "{args:?} panicked:\n{stderr}");
    // 128 + SIGPIPE, what a shell reports for `yes | head`: not success under pipefail.
    assert_eq!(code, Some(141), "{args:?}:\n{stderr}");
}

#[test]
fn solve_into_a_closed_pipe_exits_quietly() {
    assert_quiet_exit(&["solve", "--driver", "535.104.05", "--gpu", "RTX 3090"]);
    assert_quiet_exit(&[
        "--json",
        "solve",
        "--driver",
        "535.104.05",
        "--gpu",
        "RTX 3090",
    ]);
}

#[test]
fn other_printing_commands_into_a_closed_pipe_exit_quietly() {
    assert_quiet_exit(&["matrix", "--table", "gpus"]);
    assert_quiet_exit(&["matrix"]);
    assert_quiet_exit(&[
        "explain",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    ]);
    assert_quiet_exit(&["validate", "recipes/torch2.4.1-cu121-py3.11.yaml"]);
}

/// clap prints help itself; a closed pipe must not make it panic either.
#[test]
fn help_into_a_closed_pipe_does_not_panic() {
    let (code, stderr) = with_stdout_closed(&["--help"]);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(code, Some(101), "{stderr}");
}

/// A layout holding an image whose config declares nothing cudastack checks (no labels,
/// no NVIDIA_REQUIRE_CUDA), and one cudastack built.
fn layouts(dir: &Path) -> (String, String) {
    let bare = Image::new(1_700_000_000).with_cmd(vec!["/bin/true".to_string()]);
    let bare_dir = dir.join("bare");
    oci::layout::write(&bare, &bare_dir, "latest").unwrap();
    let built = Image::new(1_700_000_000)
        .with_env("NVIDIA_REQUIRE_CUDA", "cuda>=12.1")
        .with_label("io.cudastack.driver-floor", "530.30.02")
        .with_label(
            "io.cudastack.torch.sm",
            "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
        );
    let built_dir = dir.join("built");
    oci::layout::write(&built, &built_dir, "latest").unwrap();
    (
        bare_dir.display().to_string(),
        built_dir.display().to_string(),
    )
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let output = cudastack().args(args).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Issue 16: an image that declares nothing was "yes" with exit 0 for any node.
#[test]
fn check_of_an_image_that_declares_nothing_is_unknown_with_exit_3() {
    let work = tempfile::tempdir().unwrap();
    let (bare, _) = layouts(work.path());
    let (code, stdout, stderr) = run(&["check", &bare, "--driver", "550.54.15", "--cc", "8.0"]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("unknown: the image declares nothing to check"),
        "{stdout}"
    );
    assert!(!stdout.contains("yes"), "{stdout}");
    let (code, stdout, _) = run(&[
        "--json",
        "check",
        &bare,
        "--driver",
        "550.54.15",
        "--cc",
        "8.0",
    ]);
    assert_eq!(code, Some(3));
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["fits"], "unknown", "{answer}");
    assert!(answer["unknown_because"].as_str().is_some(), "{answer}");
}

/// No node facts (and half of them) is unknown, exit 3; yes is 0, no is 1.
#[test]
fn check_exit_codes_are_yes_0_no_1_error_2_unknown_3() {
    let work = tempfile::tempdir().unwrap();
    let (_, built) = layouts(work.path());
    let (code, stdout, stderr) = run(&["check", &built]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(
        stdout.contains("unknown: nothing is known about the node"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&["check", &built, "--driver", "550.54.15"]);
    assert_eq!(code, Some(3), "{stdout}");
    let (code, stdout, _) = run(&["check", &built, "--driver", "550.54.15", "--cc", "8.0"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("yes:"), "{stdout}");
    let (code, stdout, _) = run(&["check", &built, "--driver", "470.82.01", "--cc", "8.0"]);
    assert_eq!(code, Some(1), "{stdout}");
    let missing = work.path().join("missing");
    let (code, _, stderr) = run(&["check", missing.to_str().unwrap(), "--driver", "550.54.15"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, help, _) = run(&["check", "--help"]);
    assert_eq!(code, Some(0));
    assert!(
        help.contains("0 yes")
            && help.contains("1 no")
            && help.contains("2 error")
            && help.contains("3 unknown"),
        "{help}"
    );
}
