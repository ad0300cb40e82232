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

/// Issue 24: a node whose driver is older than its GPU is a no, with the branch to install.
#[test]
fn check_of_a_gpu_newer_than_the_driver_says_no_and_what_to_install() {
    let work = tempfile::tempdir().unwrap();
    let (_, built) = layouts(work.path());
    let (code, stdout, _) = run(&["check", &built, "--driver", "550.54.15", "--gpu", "B200"]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("B200 (sm_100) needs driver 570.133.20 or later (R570 branch)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("hint: install the R570 driver branch (570.133.20 or newer)"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&[
        "--json",
        "check",
        &built,
        "--driver",
        "550.54.15",
        "--gpu",
        "H100",
    ]);
    assert_eq!(code, Some(0), "{stdout}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["gpu_drivers"][0]["min_branch"], "R520", "{answer}");
    assert_eq!(answer["gpu_drivers"][0]["gpu"], "H100 (sm_90)", "{answer}");
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

/// The verification table (`verify`, and after `build`) fits 100 columns whatever the
/// details (issue 24: a real report made 220-column lines). The report below is what the
/// probe prints on a GPU node, with details as long as probe/probe.py writes them: the
/// loaded-libraries summary, the arch list, a torch path, a failure listing directories.
#[test]
fn the_verification_table_fits_100_columns() {
    let work = tempfile::tempdir().unwrap();
    let store = cudastack::cache::BlobStore::open(work.path().join("cache")).unwrap();
    let dir = work.path().join("layout");
    let layer = crate::registry_support::random_layer(&store, "payload", 3, 1 << 10);
    let image = crate::registry_support::image_of(&[layer], "table");
    oci::layout::write(&image, &dir, "latest").unwrap();
    let site = "/usr/local/lib/python3.11/site-packages";
    let libraries = format!(
        "libcublas: libcublas.so.12, libcublasLt.so.12, libcudart: libcudart.so.12, \
         libcudnn: libcudnn.so.9, libcudnn_graph.so.9, libcudnn_ops.so.9, libnccl: \
         libnccl.so.2, libnvrtc: libnvrtc.so.12 (from {site}/nvidia/cublas/lib)"
    );
    let checks = [
        ("static.python", "static", "pass", "Python 3.11.10 (/usr/local/bin/python3)".to_string()),
        ("static.torch", "static", "pass", format!("torch 2.4.1+cu121 from {site}/torch")),
        ("static.arch_list", "static", "pass",
         "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_90 compute_120".to_string()),
        ("static.loaded_libraries", "static", "pass", libraries),
        ("static.ld_library_path", "static", "pass",
         format!("{site}/nvidia/cudnn/lib:{site}/nvidia/cublas/lib:{site}/nvidia/cuda_runtime/lib:/usr/local/nvidia/lib64")),
        ("driver.version", "driver", "pass", "driver 550.54.15 (floor 530.30.02)".to_string()),
        ("ops.loaded_libraries", "ops", "fail", format!(
            "libcudnn is loaded from 2 directories: /usr/lib/x86_64-linux-gnu (libcudnn.so.8, \
             libcudnn_cnn_infer.so.8); {site}/nvidia/cudnn/lib (libcudnn.so.9, libcudnn_ops.so.9)")),
        ("train.mlp", "train", "pass", "loss 2.3026 -> 0.0113 in 200 steps on cuda:0".to_string()),
    ];
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|(id, level, status, detail)| {
            serde_json::json!({"id": id, "level": level, "status": status, "seconds": 1.25,
                               "detail": detail})
        })
        .collect();
    let report = serde_json::json!({
        "schema": "cudastack.verify.report/v1", "probe_version": "1",
        "started": "2026-11-29T23:00:00Z", "seconds": 42.0, "hostname": "gpu-node-1",
        "levels": ["static", "driver", "device", "ops", "train"], "expect": {},
        "torch": "2.4.1+cu121", "driver": {"version": "550.54.15", "cuda": "12.4"},
        "gpus": [{"index": 0, "name": "NVIDIA GH200 480GB Grace Hopper Superchip with HBM3e",
                  "compute_capability": "9.0", "memory_bytes": 150_000_000_000u64,
                  "kernels": "sass:sm_90"}],
        "checks": checks, "counts": {"pass": 7, "fail": 1, "skip": 0},
    });
    let log = work.path().join("job.log");
    std::fs::write(&log, format!("cudastack-report-v1 {report}\n")).unwrap();
    let output = cudastack()
        .arg("verify")
        .arg(&dir)
        .arg("--from-log")
        .arg(&log)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "a failed check exits 1\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in stdout.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns:\n{line}\n\nin:\n{stdout}",
            line.chars().count()
        );
    }
    // Wrapped, not cut: every word of every detail is still there.
    let words: String = stdout.split_whitespace().collect();
    for word in [
        "/usr/local/nvidia/lib64",
        "libnvrtc.so.12",
        "compute_120",
        "HBM3e",
    ] {
        assert!(words.contains(word), "{word} missing:\n{stdout}");
    }
    assert!(stdout.contains("report stored as"), "{stdout}");
}
