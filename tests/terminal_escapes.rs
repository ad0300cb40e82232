//! An image's labels are its author's text, and `inspect` and `check` print them to a
//! person's terminal (issue 32): an escape sequence, a carriage return, a newline or a
//! bidi control in a label must reach the terminal escaped, never as it is; `--json`
//! stays exact JSON with the label as it was.

use std::path::Path;
use std::process::Command;

use cudastack::oci::{self, Image};

/// What a hostile label tries: retitle the window (OSC), clear the screen (CSI), return
/// to the start of the line, print a fake answer on a line of its own, reverse text.
const HOSTILE: &str =
    "12.1\u{1b}]0;pwned\u{7}\u{1b}[2J\ryes: fake runs on this node\n\u{202E}gnp.exe";

fn hostile_layout(dir: &Path) -> String {
    let verified = serde_json::json!([{
        "gpu": format!("H100{HOSTILE}"),
        "compute_capability": "9.0",
        "count": 1,
        "driver": "550.54.15",
        "cuda_driver": "12.4",
        "date": HOSTILE,
        "cudastack": "0.1.0",
        "checks": {"cuda_init": 0.1},
        "report": "sha256:00",
    }]);
    let image = Image::new(1_700_000_000)
        .with_env("NVIDIA_REQUIRE_CUDA", &format!("cuda>=12.1 {HOSTILE}"))
        .with_label("io.cudastack.recipe", HOSTILE)
        .with_label("io.cudastack.cuda", HOSTILE)
        .with_label("io.cudastack.torch", HOSTILE)
        .with_label("io.cudastack.driver-floor", "530.30.02")
        .with_label("io.cudastack.torch.sm", "sm_80 sm_90")
        .with_label("io.cudastack.verified.matrix", &verified.to_string());
    let layout = dir.join("hostile");
    oci::layout::write(&image, &layout, "latest").unwrap();
    layout.display().to_string()
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

/// Nothing that acts on a terminal, and no line the label made up.
fn assert_terminal_safe(text: &str) {
    for bad in ['\u{1b}', '\r', '\u{7}', '\u{202E}'] {
        assert!(!text.contains(bad), "{bad:?} printed raw:\n{text:?}");
    }
    assert!(
        !text.lines().any(|line| line.starts_with("yes: fake")),
        "a label printed a line of its own:\n{text}"
    );
}

#[test]
fn inspect_escapes_what_an_image_says() {
    let work = tempfile::tempdir().unwrap();
    let layout = hostile_layout(work.path());
    let (code, stdout, stderr) = run(&["inspect", &layout]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_terminal_safe(&stdout);
    assert_terminal_safe(&stderr);
    assert!(stdout.contains("\\u{1b}]0;pwned"), "{stdout}");
}

#[test]
fn check_escapes_what_an_image_says() {
    let work = tempfile::tempdir().unwrap();
    let layout = hostile_layout(work.path());
    let (code, stdout, stderr) = run(&["check", &layout, "--driver", "550.54.15", "--cc", "9.0"]);
    assert!(code.is_some_and(|c| c != 2), "{stdout}{stderr}");
    assert_terminal_safe(&stdout);
    assert_terminal_safe(&stderr);
}

#[test]
fn json_keeps_the_label_exact() {
    let work = tempfile::tempdir().unwrap();
    let layout = hostile_layout(work.path());
    let (code, stdout, stderr) = run(&["--json", "inspect", &layout]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    // serde escapes the controls; the value reads back as the image has it.
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");
    let document: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(document["labels"]["io.cudastack.recipe"], HOSTILE);
}
