//! What `--help` says (issue 24): every command shows examples that are real commands, the
//! defaults shown are what happens, and commands that name the same thing name it alike.

use std::path::Path;
use std::process::{Command, Output};

use cudastack::oci;

use crate::registry_support::{image_of, random_layer, skip_reason, Registry};

fn cudastack() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    command.env("NO_COLOR", "1");
    command
}

fn run(args: &[&str]) -> Output {
    cudastack().args(args).output().unwrap()
}

/// stdout of `cudastack ARGS --help`, which must succeed.
fn help(path: &[&str]) -> String {
    let output = cudastack().args(path).arg("--help").output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{path:?} --help: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The names in the "Commands:" section of a help text (without clap's `help`).
fn subcommands(help: &str) -> Vec<String> {
    let Some((_, section)) = help.split_once("Commands:\n") else {
        return Vec::new();
    };
    section
        .lines()
        .take_while(|line| !line.trim().is_empty())
        // A command's line is indented by two spaces; a wrapped description, further.
        .filter(|line| line.starts_with("  ") && !line[2..].starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Every command path: `[]` (cudastack itself), `["validate"]`, ..., `["matrix", "refresh"]`.
fn command_paths() -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    let mut next = 0;
    while next < paths.len() {
        let path = paths[next].clone();
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        for name in subcommands(&help(&words)) {
            let mut child = path.clone();
            child.push(name);
            paths.push(child);
        }
        next += 1;
    }
    paths
}

/// The command lines of the "Examples:" section (its `#` lines say what they do).
fn examples(help: &str) -> Vec<String> {
    let Some((_, section)) = help.split_once("\nExamples:\n") else {
        return Vec::new();
    };
    section
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_command_help_has_examples_of_itself() {
    let paths = command_paths();
    let top: Vec<String> = subcommands(&help(&[]));
    assert!(top.len() >= 14, "{top:?}");
    assert!(
        paths.iter().any(|p| p == &["matrix", "refresh"]),
        "{paths:?}"
    );
    for path in &paths {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&words);
        let lines = examples(&text);
        assert!(
            (1..=4).contains(&lines.len()),
            "`cudastack {}` --help has {} examples:\n{text}",
            path.join(" "),
            lines.len()
        );
        for line in &lines {
            let mut words = line.split_whitespace().filter(|w| !w.starts_with('-'));
            assert_eq!(words.next(), Some("cudastack"), "`{line}`");
            let subcommand = words.next().unwrap_or_default();
            assert!(
                top.iter().any(|t| t == subcommand),
                "`{line}`: no such command"
            );
            // An example of `cudastack matrix refresh` runs `cudastack matrix refresh`.
            for (expected, found) in path.iter().zip(line.split_whitespace().skip(1)) {
                assert_eq!(expected, found, "`{line}` in the help of {path:?}");
            }
        }
    }
}

/// The examples that need only the repository run as written (through `sh`, as a person
/// would paste them) and give an answer: exit 0, or 1 for a negative one, never an error.
#[test]
fn the_examples_that_need_only_the_repository_run_as_written() {
    let binary = env!("CARGO_BIN_EXE_cudastack");
    // What an example writes (`solve --write FILE`) goes to a scratch directory, not the checkout.
    let scratch = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for command in ["validate", "matrix", "solve", "explain"] {
        for line in examples(&help(&[command])) {
            if line.contains("--file") {
                continue; // reads a log of the reader's own
            }
            let shell = line.replacen("cudastack", binary, 1).replace(
                "--write ",
                &format!("--write {}/", scratch.path().display()),
            );
            let output = Command::new("sh")
                .arg("-c")
                .arg(&shell)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                matches!(output.status.code(), Some(0 | 1)) && !stderr.contains("error:"),
                "`{line}` exited {:?}:\n{stderr}",
                output.status.code()
            );
            ran += 1;
        }
    }
    assert!(ran >= 6, "{ran} examples ran");
}

/// The default of `pull --platform` is this machine's platform, found when the command
/// runs; the help says so and names it, instead of a clap `[default: ...]`.
#[test]
fn pull_help_says_the_platform_default_is_this_machines() {
    let text = help(&["pull"]);
    let here = cudastack::recipe::Platform::host_or_amd64();
    let expected = match cudastack::recipe::Platform::host() {
        Some(_) => format!("default: this machine's platform ({here} here)"),
        None => format!("default: {here} (this machine's architecture"),
    };
    // clap may wrap the sentence: compare with the whitespace collapsed.
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&expected), "no `{expected}` in:\n{text}");
    assert!(!text.contains("[default: linux/"), "{text}");
    for command in ["check", "inspect", "verify"] {
        let flat = help(&[command])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(flat.contains(&expected), "`{command} --help`:\n{flat}");
    }
}

/// `--ref` names the image of a layout in every command; `--ref-name` (push's and pull's
/// old name) still works but is not shown.
#[test]
fn push_pull_and_the_others_name_the_layout_image_with_ref() {
    for command in ["push", "pull", "load", "inspect", "check", "verify"] {
        let text = help(&[command]);
        assert!(text.contains("--ref <REF>"), "`{command} --help`:\n{text}");
        assert!(!text.contains("--ref-name"), "`{command} --help`:\n{text}");
    }
}

#[test]
fn push_and_pull_take_ref_and_the_old_ref_name() {
    if let Some(reason) = skip_reason() {
        reason.report();
        return;
    }
    let registry = Registry::start(None);
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let store = cudastack::cache::BlobStore::open(&cache).unwrap();
    let source = work.path().join("source");
    let image = image_of(&[random_layer(&store, "ref", 5, 64 << 10)], "ref");
    let digest = oci::layout::write(&image, &source, "v1").unwrap();
    let target = work.path().join("target");
    let host = registry.host();
    let with_cache = |args: &[&str]| {
        let output = cudastack()
            .args(args)
            .env("CUDASTACK_CACHE_DIR", &cache)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let source_text = source.to_str().unwrap();
    let target_text = target.to_str().unwrap();
    for (flag, tag) in [("--ref", "new"), ("--ref-name", "old")] {
        let reference = format!("{host}/names:{tag}");
        with_cache(&["push", source_text, &reference, flag, "v1"]);
        let name = format!("pulled-{tag}");
        with_cache(&["pull", &reference, "--layout", target_text, flag, &name]);
        assert_eq!(
            oci::layout::resolve(Path::new(&target), &name)
                .unwrap()
                .manifest_digest,
            digest,
            "{flag}"
        );
    }
    // A ref the layout does not hold is an error that names it, whichever spelling.
    let output = run(&[
        "push",
        source_text,
        &format!("{host}/names:x"),
        "--ref",
        "nope",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("nope"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
