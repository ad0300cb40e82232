//! A team's training image from one recipe, end to end, on real packages: the one torch
//! image the suite builds beyond the shipped stack's own (tests/build_e2e.rs), so every check
//! that needs a loaded training image runs here.
//!
//! The recipe (written below, beside tests/fixtures/training/) is the shipped torch 2.4.1 +
//! CUDA 12.1 + cuDNN 9.1 stack plus what a team adds: `requirements.txt` (transformers,
//! tokenizers, accelerate from PyPI), `acme-tokenizer` from a private index on 127.0.0.1 that
//! requires basic auth (tests/fetch_support/auth_index.rs; its credentials come from the
//! environment), `apt: [git]`, a `copy:` of the training script, a `trainer` user with uid
//! 1000, a workdir, an entrypoint and a command, env, exposed ports and a label. It locks
//! (PyPI, Debian's archive; the shipped lock's base packages are kept so the base comes from
//! the warm cache), builds with the static verification, loads, and `docker run` runs the
//! script as uid 1000 for a few steps of a tiny GPT-2 on the CPU. The config is what `docker
//! inspect` shows, the user owns its home and workdir, and two Dockerfiles `FROM` the image
//! show pip extending it within its constraints: `pip install six==1.16.0` succeeds (the
//! static probe still passes in that image), `pip install torch==2.5.1` fails with pip's own
//! constraint conflict. A second build of the same recipe gives the same digest. Then a
//! code-only change rebuilds the `copy` layer alone, and a push to a real registry after it
//! uploads that layer alone. The private index's password is in no output: not the lock, not
//! the pylock export, not `--json`, not the logs.
//!
//! One stack under many images (issue 34): the recipe sets no `source_date_epoch` (a new
//! user's), a second team's recipe on the same stack differs in everything a team adds
//! (`apt:`, requirements, code, its own `source_date_epoch`), and the shipped recipe has its
//! own epoch. The three share the stack's seven layers by digest; in Docker the two team
//! images have them as a common prefix of their layer chains, so the second `--load` sends
//! only its own layers; and its push to the registry holding the first uploads only its own.
//!
//! Needs root (mmdebstrap), Docker, Debian's docker-registry, PyPI and Debian's archive.

use crate::e2e_support;
use crate::e2e_support::output_text as text;
use crate::gate;
use crate::image_config;
use crate::index_credentials::auth_index::{AuthIndex, PageFormat};
use crate::registry_support::{self, Registry};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const SHIPPED: &str = "recipes/torch2.4.1-cu121-py3.11";
const NAME: &str = "cudastack-training-test";
const TAG: &str = "localhost/cudastack-training-test:2.4.1";
const WITH_SIX: &str = "cudastack-training-test-six:test";
const WITH_TORCH: &str = "cudastack-training-test-torch:test";
/// The second team's image, on the same stack.
const OTHER_TAG: &str = "localhost/cudastack-training-test-other:1";
/// The layers every image on the stack shares, bottom to top.
const STACK_LAYERS: [&str; 7] = [
    "base",
    "cuda",
    "cuda-math",
    "cudnn",
    "triton",
    "torch",
    "python",
];
const USER: &str = "ci-reader";
const PASSWORD: &str = "s3cret-Pa55-for-acme-index";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training")
}

/// The team's recipe: the shipped stack, and everything the training image adds.
fn recipe(index_url: &str) -> String {
    format!(
        r#"name: cudastack-training-test
base: {{ debian: bookworm }}
python: "3.11"
driver_floor: "530.30.02"
cuda: {{ version: "12.1" }}
cudnn: {{ version: "9.1.0.70" }}
torch: {{ version: "2.4.1" }}
requirements: [requirements.txt]
indexes:
  - {{ name: acme, url: "{index_url}", packages: [acme-tokenizer] }}
apt: [git]
copy:
  - {{ src: train, dst: /workspace/train }}
user: {{ name: trainer, uid: 1000 }}
workdir: /workspace
entrypoint: [python3]
cmd: [/workspace/train/train.py]
env: {{ STEPS: "8", HF_HUB_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false", OMP_NUM_THREADS: 4, PATH: "$PATH:/home/trainer/.local/bin" }}
expose: ["29500", 8080/tcp]
labels: {{ com.example.team: ml }}
tags: ["{{registry}}/cudastack-training-test:{{torch}}"]
"#
    )
}

/// `acme-tokenizer` 0.1.0: a real pure-Python wheel (the team's private package), with
/// its RECORD, as `pip wheel` makes one. Returns the file name, the bytes and the METADATA.
fn acme_wheel() -> (String, Vec<u8>, String) {
    use sha2::{Digest as _, Sha256};
    use std::io::Write as _;
    let module = "__version__ = \"0.1.0\"\n\n\ndef words():\n    \"\"\"The vocabulary of the test's tokenizer.\"\"\"\n    return [\"[UNK]\"] + \"the quick brown fox jumps over a lazy dog again and again\".split()\n";
    let metadata =
        "Metadata-Version: 2.1\nName: acme-tokenizer\nVersion: 0.1.0\nRequires-Python: >=3.8\n\n";
    let info = "acme_tokenizer-0.1.0.dist-info";
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("acme_tokenizer/__init__.py".into(), module.into()),
        (format!("{info}/METADATA"), metadata.into()),
        (
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: cudastack-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".into(),
        ),
    ];
    let mut record = String::new();
    for (name, bytes) in &files {
        let hash = cudastack::install::record::urlsafe_b64_nopad(&Sha256::digest(bytes));
        record.push_str(&format!("{name},sha256={hash},{}\n", bytes.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    files.push((format!("{info}/RECORD"), record.into_bytes()));
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in &files {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    let bytes = zip.finish().unwrap().into_inner();
    (
        "acme_tokenizer-0.1.0-py3-none-any.whl".into(),
        bytes,
        metadata.to_string(),
    )
}

fn cudastack(args: &[&str], dir: &Path) -> Output {
    // The credentials are bound to the index this test's recipe names (issue 32).
    let recipe = cudastack::recipe::Recipe::load(&dir.join("training.yaml")).unwrap();
    let index = recipe.indexes[0].url.to_string();
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(dir)
        .env("CUDASTACK_INDEX_ACME_URL", index)
        .env("CUDASTACK_INDEX_ACME_USERNAME", USER)
        .env("CUDASTACK_INDEX_ACME_PASSWORD", PASSWORD)
        .env("RUST_LOG", "debug")
        .args(args)
        .output()
        .unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

struct RemoveImages;
impl Drop for RemoveImages {
    fn drop(&mut self) {
        remove_images();
    }
}

/// The image, the two built `FROM` it, and the steps a failed `docker build` left as
/// untagged images (they carry the image's labels).
fn remove_images() {
    let _ = Command::new("docker")
        .args(["rmi", "-f", TAG, WITH_SIX, WITH_TORCH, OTHER_TAG])
        .output();
    let _ = Command::new("docker")
        .args(["image", "prune", "-f", "--filter"])
        .arg(format!("label=io.cudastack.recipe={NAME}"))
        .output();
}

/// One build with `extra` arguments: its `--json` report, the whole log, the seconds.
fn build(dir: &Path, layout: &str, extra: &[&str]) -> (serde_json::Value, String, f64) {
    let cache = e2e_support::cache_dir();
    let mut args = vec![
        "build",
        "training.yaml",
        "--json",
        // gzip: the torch layers the other e2e tests share (tests/build_e2e.rs).
        "--compression",
        "gzip",
        "--layout",
        layout,
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend(extra);
    let started = Instant::now();
    let output = cudastack(&args, dir);
    let seconds = started.elapsed().as_secs_f64();
    let log = text(&output);
    assert!(output.status.success(), "build failed:\n{log}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("build --json is not JSON ({e}):\n{log}"));
    (report, log, seconds)
}

/// `name size cached` of every layer of a build report.
fn layers(report: &serde_json::Value) -> Vec<(String, u64, bool)> {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["size"].as_u64().unwrap(),
                l["cached"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_training_image_locks_builds_runs_as_its_user_and_rebuilds_code_alone() {
    if let Some(reason) = e2e_support::skip_reason(&[("docker", &["info"][..])]) {
        reason.report();
        return;
    }
    if let Some(reason) = registry_support::skip_reason() {
        reason.report();
        return;
    }
    if !crate::image_config::pypi_reachable() {
        gate::Skip::missing(
            "PyPI",
            "https://pypi.org is not reachable: the lock resolves there",
        )
        .report();
        return;
    }
    // Declared first, so it is released after the images are removed.
    let _slot = e2e_support::large_image_slot();
    let _cleanup = RemoveImages;
    let index = AuthIndex::start(PageFormat::Html, Some((USER, PASSWORD)));
    let (filename, bytes, metadata) = acme_wheel();
    index.publish("acme-tokenizer", &filename, bytes, &metadata);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    copy_dir(&fixtures(), dir);
    std::fs::write(dir.join("training.yaml"), recipe(&index.simple_url())).unwrap();
    // Bytecode a run left behind is not code: .dockerignore keeps it out of the image.
    std::fs::create_dir_all(dir.join("train/__pycache__")).unwrap();
    std::fs::write(
        dir.join("train/__pycache__/train.cpython-311.pyc"),
        b"stale",
    )
    .unwrap();
    // The shipped lock's Debian packages are kept, so the base comes from the warm cache.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{SHIPPED}.lock")),
        dir.join("training.lock"),
    )
    .unwrap();

    let started = Instant::now();
    let locked = cudastack(&["lock", "training.yaml", "--json"], dir);
    let lock_log = text(&locked);
    assert!(locked.status.success(), "lock failed:\n{lock_log}");
    eprintln!("lock: {:.1} s", started.elapsed().as_secs_f64());
    let lock = std::fs::read_to_string(dir.join("training.lock")).unwrap();
    for name in [
        "transformers",
        "tokenizers",
        "accelerate",
        "acme-tokenizer",
        "pip",
        "git",
    ] {
        assert!(
            lock.contains(&format!("\"name\": \"{name}\"")),
            "{name} is locked"
        );
    }
    assert!(
        lock.contains(&index.simple_url()),
        "acme-tokenizer's index is recorded"
    );

    let (first, first_log, first_seconds) = build(dir, "layout-a", &["--load"]);
    eprintln!("first build (warm stack, new layers): {first_seconds:.1} s");
    for (name, size, cached) in layers(&first) {
        eprintln!(
            "  layer {name:9} {size:>12} bytes{}",
            if cached { ", cached" } else { "" }
        );
    }
    let names: Vec<String> = layers(&first).into_iter().map(|l| l.0).collect();
    assert_eq!(
        names,
        [
            "base",
            "cuda",
            "cuda-math",
            "cudnn",
            "triton",
            "torch",
            "python",
            "apt",
            "user",
            "packages",
            "config",
            "copy"
        ],
        "{first_log}"
    );
    for check in [
        "static.torch",
        "static.loaded_libraries",
        "static.ld_library_path",
    ] {
        assert!(
            first_log
                .lines()
                .any(|l| l.contains(check) && l.contains("pass")),
            "{check} did not pass:\n{first_log}"
        );
    }

    check_training_run();
    check_one_copy_of_each_cuda_library();
    check_config();
    check_runs_as_the_user();
    check_pip_extends_within_the_constraints();
    let other_dir = work.path().join("other");
    let other = check_a_second_team_shares_the_stack(&first, &other_dir);
    check_the_shipped_recipe_shares_the_stack(&first);
    // Done with Docker: its 5 GB copy of the image goes before the registry stores ~3 GB of
    // blobs (the suite's disk peak; RemoveImages still runs at the end).
    remove_images();

    // Push, change the code, rebuild, push again: only the copy layer is new.
    let registry = Registry::start(None);
    let reference = format!("{}/team/training:1", registry.host());
    let (pushed, log, _) = build(dir, "layout-b", &["--no-verify", "--push", &reference]);
    assert!(pushed["push"]["blobs"].is_array(), "{log}");
    assert_eq!(
        pushed["manifest_digest"], first["manifest_digest"],
        "two builds of one recipe differ:\n{log}"
    );
    let train = dir.join("train/train.py");
    let code = std::fs::read_to_string(&train).unwrap();
    std::fs::write(&train, code.replace("STEPS = ", "STEPS = 0 + ")).unwrap();
    let (rebuilt, log, rebuild_seconds) = build(dir, "layout-c", &["--no-verify"]);
    eprintln!("code-only rebuild: {rebuild_seconds:.2} s");
    let rebuilt_layers = layers(&rebuilt);
    for (name, _, cached) in &rebuilt_layers {
        assert_eq!(*cached, name != "copy", "layer {name}:\n{log}");
    }
    let reference_2 = format!("{}/team/training:2", registry.host());
    let (pushed_2, log, _) = build(dir, "layout-d", &["--no-verify", "--push", &reference_2]);
    let uploaded: Vec<u64> = pushed_2["push"]["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["outcome"] != "present" && b["outcome"] != "mounted")
        .map(|b| b["size"].as_u64().unwrap())
        .collect();
    let copy_layer = rebuilt_layers.iter().find(|l| l.0 == "copy").unwrap().1;
    // The copy layer and the image config: nothing of the stack goes again.
    assert_eq!(uploaded.len(), 2, "{log}");
    assert!(uploaded.contains(&copy_layer), "{log}");
    eprintln!(
        "second push uploaded {} bytes in {} blobs",
        uploaded.iter().sum::<u64>(),
        uploaded.len()
    );
    check_the_second_team_pushes_only_its_layers(&other_dir, &other, &registry);

    // The private index's password is nowhere cudastack writes.
    let mut written = vec![lock_log, first_log, log, lock];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml" || e == "lock") {
            written.push(std::fs::read_to_string(&path).unwrap());
        }
    }
    for text in &written {
        assert!(!text.contains(PASSWORD), "the password leaked:\n{text}");
    }
}

fn docker_output(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().unwrap()
}

fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "docker {args:?}:\n{}",
        text(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The image's default command trains as uid 1000 in its workdir and writes its checkpoint.
fn check_training_run() {
    let started = Instant::now();
    let out = docker(&["run", "--rm", "--network", "none", TAG]);
    eprintln!("training run: {:.1} s", started.elapsed().as_secs_f64());
    let result: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("train.py printed no JSON ({e}):\n{out}"));
    eprintln!("train.py: {result}");
    assert_eq!(result["uid"], 1000);
    assert_eq!(result["cwd"], "/workspace");
    assert_eq!(result["acme_tokenizer"], "0.1.0");
    assert_eq!(result["torch"], "2.4.1+cu121");
    let losses: Vec<f64> = result["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 8);
    assert!(losses.last() < losses.first(), "{losses:?}");
    let checkpoint = result["checkpoint"].to_string();
    assert!(checkpoint.contains("config.json"), "{checkpoint}");
    let shell = |script: &str| docker(&["run", "--rm", "--entrypoint", "sh", TAG, "-c", script]);
    assert_eq!(shell("id -un").trim(), "trainer");
    assert!(shell("git --version").starts_with("git version"));
    assert_eq!(
        shell("ls /workspace/train | sort")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["train.py"],
        ".dockerignore keeps __pycache__ out"
    );
}

/// The audit's promise holds in the training image: one file per CUDA library.
fn check_one_copy_of_each_cuda_library() {
    let find = |pattern: &str| {
        docker(&[
            "run",
            "--rm",
            "--user",
            "0",
            "--entrypoint",
            "sh",
            TAG,
            "-c",
            &format!("find / -xdev -name '{pattern}' -type f"),
        ])
    };
    for pattern in ["libcudnn.so.9*", "libcudart.so.12*", "libcublas.so.12*"] {
        assert_eq!(
            find(pattern).lines().count(),
            1,
            "{pattern}: {}",
            find(pattern)
        );
    }
}

/// Entrypoint, Cmd, Env, ExposedPorts, Labels, User and WorkingDir in `docker inspect`.
fn check_config() {
    let inspect = docker(&["image", "inspect", "--format", "{{json .Config}}", TAG]);
    let config: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(config["User"], "1000:1000", "{config}");
    assert_eq!(config["WorkingDir"], "/workspace", "{config}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["python3"]));
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["/workspace/train/train.py"])
    );
    assert_eq!(
        config["ExposedPorts"],
        serde_json::json!({"29500/tcp": {}, "8080/tcp": {}})
    );
    assert_eq!(config["Labels"]["com.example.team"], "ml");
    assert_eq!(config["Labels"]["io.cudastack.recipe"], NAME);
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    for expected in [
        "OMP_NUM_THREADS=4",
        "PIP_CONSTRAINT=/etc/pip/constraints.txt",
        "PIP_BREAK_SYSTEM_PACKAGES=1",
        "PATH=/usr/local/cuda-12.1/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/home/trainer/.local/bin",
    ] {
        assert!(env.contains(&expected), "{expected} not in {env:?}");
    }
}

fn check_runs_as_the_user() {
    let run = |entrypoint: &str, args: &[&str]| {
        let mut all = vec!["run", "--rm", "--entrypoint", entrypoint, TAG];
        all.extend(args);
        docker(&all).trim().to_string()
    };
    assert_eq!(
        run("id", &[]),
        "uid=1000(trainer) gid=1000(trainer) groups=1000(trainer)"
    );
    assert_eq!(run("pwd", &[]), "/workspace");
    assert_eq!(
        run(
            "sh",
            &["-c", "echo $HOME; stat -c %u:%g /home/trainer /workspace"]
        ),
        "/home/trainer\n1000:1000\n1000:1000"
    );
    let constraints = run("cat", &["/etc/pip/constraints.txt"]);
    assert!(
        constraints.lines().any(|l| l == "torch==2.4.1"),
        "{constraints}"
    );
    assert!(
        constraints.lines().any(|l| l.starts_with("pip==")),
        "{constraints}"
    );
}

fn check_pip_extends_within_the_constraints() {
    // The supported way to extend: install as root into the image's site, back to the user.
    let six = image_config::docker_build(
        &format!(
            "FROM {TAG}\nUSER root\nRUN {{pip_cert}}pip install six==1.16.0\nUSER 1000:1000\n"
        ),
        WITH_SIX,
    );
    assert!(
        six.status.success(),
        "pip install six failed:\n{}",
        text(&six)
    );
    let imports = docker_output(&[
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        WITH_SIX,
        "-c",
        "import six, torch; print(six.__version__, torch.__version__, six.__file__)",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&imports.stdout).trim(),
        "1.16.0 2.4.1+cu121 /usr/local/lib/python3.11/dist-packages/six.py",
        "{}",
        text(&imports)
    );
    // The static probe in the derived image: still the one stack it was.
    let probe = docker_output(&[
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        WITH_SIX,
        "/opt/cudastack/probe/probe.py",
        "--level",
        "static",
    ]);
    let stdout = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success(),
        "the static probe failed in the derived image:\n{}",
        text(&probe)
    );
    let report =
        cudastack::verify::report::Report::from_output(&stdout, "the derived image").unwrap();
    for check in &report.checks {
        assert_ne!(
            check.status,
            cudastack::verify::report::Status::Fail,
            "{}: {}",
            check.id,
            check.detail
        );
    }
    assert!(report
        .checks
        .iter()
        .any(|c| c.id == "static.loaded_libraries"));

    // Another torch: pip's own resolver refuses it against the constraints.
    let torch = image_config::docker_build(
        &format!("FROM {TAG}\nUSER root\nRUN {{pip_cert}}pip install torch==2.5.1\n"),
        WITH_TORCH,
    );
    let output = text(&torch);
    assert!(!torch.status.success(), "pip replaced torch:\n{output}");
    assert!(
        output.contains("The user requested (constraint) torch==2.4.1"),
        "{output}"
    );
    assert!(
        output.contains("ResolutionImpossible") || output.contains("conflicting dependencies"),
        "{output}"
    );
}

/// The digests of a build report's layers, by name.
fn layer_digests(report: &serde_json::Value) -> Vec<(String, String)> {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let name = l["name"].as_str().unwrap().to_string();
            (name, l["digest"].as_str().unwrap().to_string())
        })
        .collect()
}

/// The stack's layers of a build report, checked to come first.
fn stack_prefix(report: &serde_json::Value) -> Vec<(String, String)> {
    let layers = layer_digests(report);
    let names: Vec<&str> = layers
        .iter()
        .take(STACK_LAYERS.len())
        .map(|l| l.0.as_str())
        .collect();
    assert_eq!(names, STACK_LAYERS, "the stack's layers come first");
    layers[..STACK_LAYERS.len()].to_vec()
}

/// A second team's recipe on the same stack: other `apt:` packages, requirements, code and
/// `source_date_epoch`, no user. Written in `dir`.
fn other_recipe(dir: &Path) {
    std::fs::create_dir_all(dir.join("serve")).unwrap();
    std::fs::write(
        dir.join("serve/serve.py"),
        "import json, six, torch\nprint(json.dumps({\"six\": six.__version__, \"torch\": torch.__version__}))\n",
    )
    .unwrap();
    std::fs::write(dir.join("requirements.txt"), "six==1.16.0\n").unwrap();
    std::fs::write(
        dir.join("other.yaml"),
        format!(
            r#"name: cudastack-training-test-other
base: {{ debian: bookworm }}
python: "3.11"
driver_floor: "530.30.02"
cuda: {{ version: "12.1" }}
cudnn: {{ version: "9.1.0.70" }}
torch: {{ version: "2.4.1" }}
requirements: [requirements.txt]
apt: [curl]
copy:
  - {{ src: serve, dst: /srv/serve }}
entrypoint: [python3, /srv/serve/serve.py]
tags: ["{OTHER_TAG}"]
source_date_epoch: 1800000000
"#
        ),
    )
    .unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{SHIPPED}.lock")),
        dir.join("other.lock"),
    )
    .unwrap();
}

/// `cudastack ARGS` in `dir`, which must succeed; its `--json` report and its log.
fn cudastack_json(args: &[&str], dir: &Path) -> (serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let log = text(&output);
    assert!(output.status.success(), "cudastack {args:?} failed:\n{log}");
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("cudastack {args:?} --json is not JSON ({e}):\n{log}"));
    (report, log)
}

/// The second team's image shares every stack layer with the first by digest and, in
/// Docker, by chain: its `--load` sends only its own layers. It runs its code. Returns its
/// build report.
fn check_a_second_team_shares_the_stack(
    first: &serde_json::Value,
    dir: &Path,
) -> serde_json::Value {
    other_recipe(dir);
    let cache = e2e_support::cache_dir();
    let cache = cache.to_str().unwrap();
    cudastack_json(&["lock", "other.yaml", "--json"], dir);
    let started = Instant::now();
    let (other, log) = cudastack_json(
        &[
            "build",
            "other.yaml",
            "--json",
            "--compression",
            "gzip",
            "--layout",
            "layout",
            "--cache-dir",
            cache,
            "--load",
        ],
        dir,
    );
    eprintln!(
        "second team's build: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let shared = stack_prefix(first);
    assert_eq!(stack_prefix(&other), shared, "{log}");
    let own = layer_digests(&other)[STACK_LAYERS.len()..].to_vec();
    let names: Vec<&str> = own.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(names, ["apt", "packages", "config", "copy"], "{log}");
    for (name, digest) in &own {
        assert!(
            !layer_digests(first).iter().any(|l| &l.1 == digest),
            "{name} is the second team's own"
        );
    }
    // Docker: the same chain below the team's layers, and only those sent.
    let chain = |tag: &str| -> Vec<String> {
        let json = docker(&[
            "image",
            "inspect",
            "--format",
            "{{json .RootFS.Layers}}",
            tag,
        ]);
        serde_json::from_str(&json).unwrap()
    };
    let (ours, theirs) = (chain(TAG), chain(OTHER_TAG));
    assert_eq!(ours[..STACK_LAYERS.len()], theirs[..STACK_LAYERS.len()]);
    assert_ne!(ours[STACK_LAYERS.len()], theirs[STACK_LAYERS.len()]);
    // The verification loads the image for its probe, and `--load` finds it there (or
    // loads it): neither sends the stack again.
    for load in [&other["verify"]["load"], &other["load"]] {
        eprintln!("second team's load: {load}");
        assert!(
            load["skipped"] == true
                || load["layers_present"].as_u64().unwrap() >= STACK_LAYERS.len() as u64,
            "a load sent the stack again: {load}"
        );
    }
    assert!(
        other["verify"]["load"]["layers_present"].as_u64() >= Some(STACK_LAYERS.len() as u64),
        "the verification's load is the first: {}",
        other["verify"]
    );
    let own_bytes: u64 = other["layers"].as_array().unwrap()[STACK_LAYERS.len()..]
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    eprintln!("second team's own layers: {own_bytes} bytes");
    let out = docker(&["run", "--rm", "--network", "none", OTHER_TAG]);
    assert!(
        out.contains(r#""six": "1.16.0""#) && out.contains("2.4.1+cu121"),
        "{out}"
    );
    assert!(docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "curl",
        OTHER_TAG,
        "--version"
    ])
    .starts_with("curl "));
    other
}

/// The shipped recipe (its own `source_date_epoch`) and the team's (none set) share the
/// stack's layers.
fn check_the_shipped_recipe_shares_the_stack(team: &serde_json::Value) {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let recipe = root.join(format!("{SHIPPED}.yaml"));
    let started = Instant::now();
    let (shipped, log) = cudastack_json(
        &[
            "build",
            recipe.to_str().unwrap(),
            "--json",
            "--compression",
            "gzip",
            "--no-verify",
            "--layout",
            layout.to_str().unwrap(),
            "--cache-dir",
            e2e_support::cache_dir().to_str().unwrap(),
        ],
        root,
    );
    eprintln!(
        "shipped recipe's build: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(stack_prefix(&shipped), stack_prefix(team), "{log}");
}

/// The second team's push to the registry that holds the first team's image uploads only
/// its own layers (and its config); the stack's are mounted or already there.
fn check_the_second_team_pushes_only_its_layers(
    dir: &Path,
    other: &serde_json::Value,
    registry: &Registry,
) {
    let reference = format!("{}/other-team/serve:1", registry.host());
    let cache = e2e_support::cache_dir();
    let (pushed, log) = cudastack_json(
        &[
            "build",
            "other.yaml",
            "--json",
            "--compression",
            "gzip",
            "--no-verify",
            "--layout",
            "layout-push",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--push",
            &reference,
        ],
        dir,
    );
    assert_eq!(pushed["manifest_digest"], other["manifest_digest"], "{log}");
    let blobs = pushed["push"]["blobs"].as_array().unwrap();
    let uploaded: u64 = blobs
        .iter()
        .filter(|b| b["outcome"] != "present" && b["outcome"] != "mounted")
        .map(|b| b["size"].as_u64().unwrap())
        .sum();
    let image: u64 = blobs.iter().map(|b| b["size"].as_u64().unwrap()).sum();
    let stack: Vec<String> = stack_prefix(other).into_iter().map(|l| l.1).collect();
    for blob in blobs {
        if stack.iter().any(|d| blob["digest"] == d.as_str()) {
            assert!(
                blob["outcome"] == "present" || blob["outcome"] == "mounted",
                "a stack layer went again: {blob}\n{log}"
            );
        }
    }
    eprintln!(
        "second team's push: {uploaded} of {image} bytes uploaded ({:.3}%)",
        100.0 * uploaded as f64 / image as f64
    );
    assert!(
        uploaded * 50 < image,
        "more than 2% of the image went again:\n{log}"
    );
}
