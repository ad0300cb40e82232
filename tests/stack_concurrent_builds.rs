//! Several `cudastack build` processes sharing one cache at once (issue 16, "Trust": four
//! builds sharing a cache failed three times out of four, on the staging renames, the
//! shared `.merged` tree and `ldconfig` over it). Four builds of one recipe (two of them
//! into the same layout) and two of another run together; all must succeed, agree on the
//! manifest digest, and leave no scratch tree behind.
//!
//! The stack is the stand-in one of `tests/build_audit.rs` (real ELF libraries made with
//! gcc, packed as nvidia-* wheels in a local mirror), with a fresh nonce in each run so
//! every layer but the Debian base is new and really built concurrently; the base is
//! staged once (under its lock) and shared across runs in the e2e cache. The two recipes
//! share their wheels (so their toolkit, cuDNN and Python layers) and differ in the config
//! layer.
//!
//! The builds start at once ([`STAGGER`] is zero): every stage overlaps, the fetch stage's
//! wheel links included (they are renamed into place; a remove-then-create raced with
//! `File exists` when two builds met).
//!
//! Needs root and mmdebstrap for the Debian base; otherwise it says why and stops.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use e2e_support::stand_in::{gcc_lib, write_wheel, Target};

const STAGGER: std::time::Duration = std::time::Duration::from_millis(0);

/// A mirror of stand-in nvidia-* wheels whose libraries carry `nonce` in a symbol name.
fn mirror(root: &Path, nonce: &str) -> PathBuf {
    let libs = root.join("libs");
    let mirror = root.join("mirror");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::create_dir_all(&mirror).unwrap();
    let body = |symbol: &str| format!("int {symbol}_{nonce}(void) {{ return 42; }}\n");
    let cudart = gcc_lib(
        Target::X86_64,
        &libs,
        "libcudart.so.12",
        &[],
        &body("cudart"),
    );
    let lt = gcc_lib(
        Target::X86_64,
        &libs,
        "libcublasLt.so.12",
        &[],
        &body("cublaslt"),
    );
    let cublas = gcc_lib(
        Target::X86_64,
        &libs,
        "libcublas.so.12",
        &["libcublasLt.so.12"],
        &body("cublas"),
    );
    let cudnn = gcc_lib(Target::X86_64, &libs, "libcudnn.so.9", &[], &body("cudnn"));
    let wheel = |project: &str, version: &str, files: &[(&str, Vec<u8>)]| {
        write_wheel(&mirror, Target::X86_64, project, version, files)
    };
    wheel(
        "nvidia-cuda-runtime-cu12",
        "12.4.127",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cuda_runtime/lib/libcudart.so.12", cudart),
        ],
    );
    wheel(
        "nvidia-cublas-cu12",
        "12.4.5.8",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cublas/lib/libcublas.so.12", cublas),
            ("nvidia/cublas/lib/libcublasLt.so.12", lt),
        ],
    );
    wheel(
        "nvidia-cudnn-cu12",
        "9.1.0.70",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cudnn/lib/libcudnn.so.9", cudnn),
            (
                "nvidia/cudnn/include/cudnn_version.h",
                b"#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n".to_vec(),
            ),
        ],
    );
    mirror
}

fn recipe(root: &Path, mirror: &Path, name: &str) -> PathBuf {
    let recipe = root.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\n")).unwrap();
    let lock = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["lock", "--mirror"])
        .arg(mirror)
        .arg(&recipe)
        .output()
        .unwrap();
    assert!(
        lock.status.success(),
        "lock failed: {}",
        String::from_utf8_lossy(&lock.stderr)
    );
    recipe
}

fn spawn_build(recipe: &Path, layout: &Path, cache: &Path) -> Child {
    // `CUDASTACK_TEST_BIN`: run another build of cudastack (an older one, to compare).
    let program = std::env::var_os("CUDASTACK_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cudastack")));
    Command::new(program)
        .args(["build", "--no-verify", "--mirror"])
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(cache)
        .arg(recipe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn concurrent_builds_sharing_one_cache_all_succeed_and_agree() {
    if let Some(reason) = e2e_support::skip_reason(&[("gcc", &["--version"])]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cache = e2e_support::cache_dir();
    let nonce = format!(
        "n{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let mirror = mirror(work.path(), &nonce);
    let one = recipe(work.path(), &mirror, "concurrent-one");
    let two = recipe(work.path(), &mirror, "concurrent-two");
    let shared_layout = work.path().join("shared-layout");
    let jobs: Vec<(&str, &Path, PathBuf)> = vec![
        ("one#1", &one, shared_layout.clone()),
        ("one#2", &one, shared_layout.clone()),
        ("one#3", &one, work.path().join("layout-3")),
        ("one#4", &one, work.path().join("layout-4")),
        ("two#1", &two, work.path().join("layout-5")),
        ("two#2", &two, work.path().join("layout-6")),
    ];
    let started = std::time::Instant::now();
    let children: Vec<(&str, Child)> = jobs
        .iter()
        .map(|(name, recipe, layout)| {
            let child = spawn_build(recipe, layout, &cache);
            // `CUDASTACK_TEST_STAGGER_MS`: a longer gap, to run the builds one after another.
            let gap = std::env::var("CUDASTACK_TEST_STAGGER_MS")
                .ok()
                .and_then(|ms| ms.parse().ok())
                .map_or(STAGGER, std::time::Duration::from_millis);
            std::thread::sleep(gap);
            (*name, child)
        })
        .collect();
    let mut digests = Vec::new();
    let mut failures = Vec::new();
    for (name, child) in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        if !output.status.success() {
            failures.push(format!(
                "{name}: {}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        digests.push((name, stdout.lines().next().unwrap_or_default().to_string()));
    }
    eprintln!("6 concurrent builds took {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} of 6 builds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let of = |prefix: &str| -> std::collections::BTreeSet<&str> {
        digests
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, digest)| digest.as_str())
            .collect()
    };
    assert_eq!(
        of("one").len(),
        1,
        "builds of one recipe disagree: {digests:?}"
    );
    assert_eq!(
        of("two").len(),
        1,
        "builds of one recipe disagree: {digests:?}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(cache.join("staging"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".merged") || name.contains(".audit-"))
        .collect();
    assert!(leftovers.is_empty(), "scratch trees left: {leftovers:?}");

    // A no-op rebuild (every layer and the audit cached; each cached blob checked against
    // its integrity record) stays quick.
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let output = spawn_build(&one, &work.path().join("layout-3"), &cache)
            .wait_with_output()
            .unwrap();
        times.push(started.elapsed());
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let again = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(of("one").contains(again.as_str()), "{again} vs {digests:?}");
    }
    times.sort();
    eprintln!("no-op rebuild: min {:?}, median {:?}", times[0], times[2]);
}
