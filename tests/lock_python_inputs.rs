//! The recipe's Python input files (issue 19 part B), each a real file in the format teams
//! keep (tests/fixtures/python-inputs: requirements files with `-r`, `-c`, `--hash` and
//! markers; a pyproject.toml with extras and PEP 735 groups; a uv.lock and the pylock.toml
//! `uv export --format pylock.toml` wrote from it), locked against real PyPI packages
//! (six, idna, tqdm, packaging, iniconfig: small and pure) with the CUDA wheels of a
//! recipe without torch. Where uv is on PATH, the requirements file's pins are compared
//! with `uv pip compile`'s, and the exported pylock is checked with `uv pip install
//! --dry-run`.
//!
//! Hit PyPI; skipped with CUDASTACK_OFFLINE_TESTS=1 (the stack-conflict and staleness
//! tests read no network and always run).

use crate::fetch_support::{sha256_hex, wheel_bytes, FixtureServer};
use crate::gate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::digest::Digest;
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::inputs::lock_request;
use cudastack::lock::pylock::{pylock_path, to_pylock};
use cudastack::lock::python_inputs::{add_to_request, PythonInputs};
use cudastack::lock::{resolve, ArtifactKind, LockError, LockRequest, Lockfile, Target};
use cudastack::matrix::{Matrix, ResolvedRecipe};
use cudastack::recipe::{Platform, Recipe};

const FIXTURES: &str = "tests/fixtures/python-inputs";

/// A recipe without torch: its stack is two small CUDA wheels.
const CUDA_ONLY: &str = "name: job\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\n";
const TORCH: &str = "name: job\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4.1\" }\n";

fn offline() -> bool {
    gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org",
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy of the fixture directory `name` with `recipe.yaml` (`stack` + `extra`) in it.
fn workspace(name: &str, stack: &str, extra: &str) -> (tempfile::TempDir, PathBuf, Recipe) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&Path::new(FIXTURES).join(name), dir.path());
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, format!("{stack}{extra}")).unwrap();
    let recipe = Recipe::load(&path).unwrap();
    (dir, path, recipe)
}

/// The lock request of the recipe at `path` with its inputs added (no Debian packages).
fn request(
    path: &Path,
    recipe: &Recipe,
) -> Result<(HttpClient, cudastack::lock::LockRequest), String> {
    let client = HttpClient::with_defaults().unwrap();
    let resolved = ResolvedRecipe::new(Matrix::embedded(), recipe.clone(), path).unwrap();
    let mut request = lock_request(&resolved, &client, None).unwrap();
    request.system = None;
    add_to_request(&resolved, &mut request).map_err(|e| e.to_string())?;
    Ok((client, request))
}

async fn lock(path: &Path, recipe: &Recipe) -> Result<Lockfile, LockError> {
    let (client, request) = request(path, recipe).unwrap();
    resolve(&client, &request).await
}

/// name -> (version, sha256 hex) of the lock's wheels, the stack's CUDA wheels left out.
fn pins(lock: &Lockfile) -> BTreeMap<String, (String, String)> {
    lock.artifacts
        .iter()
        // The stack's own wheels (the CUDA ones, pip) are not what these inputs asked for.
        .filter(|a| {
            a.kind == ArtifactKind::Wheel && !a.name.starts_with("nvidia-") && a.name != "pip"
        })
        .map(|a| (a.name.clone(), (a.version.clone(), a.sha256.hex())))
        .collect()
}

fn versions(lock: &Lockfile) -> BTreeMap<String, String> {
    pins(lock).into_iter().map(|(n, (v, _))| (n, v)).collect()
}

fn uv() -> Option<String> {
    let candidate = std::env::var("CUDASTACK_UV").unwrap_or_else(|_| "uv".to_string());
    match Command::new(&candidate).arg("--version").output() {
        Ok(out) if out.status.success() => Some(candidate),
        _ => {
            gate::skip(
                "uv",
                format!("the comparison with uv: `{candidate}` not found (pip install uv, or set CUDASTACK_UV)"),
            );
            None
        }
    }
}

const UV_TARGET: [&str; 4] = [
    "--python-platform",
    "x86_64-manylinux_2_28",
    "--python-version",
    "3.11",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requirements_files_with_includes_constraints_hashes_and_markers() {
    if offline() {
        return;
    }
    let (dir, path, recipe) = workspace(
        "requirements",
        CUDA_ONLY,
        "requirements: [requirements.txt]\n",
    );
    let lock = lock(&path, &recipe).await.unwrap();
    let ours = versions(&lock);
    // -r shared/base.txt: idna, packaging; -c: packaging<24 narrows it, iniconfig is not
    // installed; win32 and python<3.11 markers are false for the target.
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        ["idna", "packaging", "six", "tqdm"],
        "{ours:?}"
    );
    assert_eq!(ours["idna"], "3.7");
    assert_eq!(ours["packaging"], "23.2");
    // The locked wheel is one of the files the --hash lines list.
    assert_eq!(
        pins(&lock)["six"].1,
        "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
    );
    assert!(lock.artifact("nvidia-cuda-runtime-cu12").is_some());
    assert!(
        lock.requirements.iter().any(|r| r == "six==1.16.0"),
        "{:?}",
        lock.requirements
    );
    if let Some(uv) = uv() {
        let out = Command::new(uv)
            .current_dir(dir.path())
            .args([
                "pip",
                "compile",
                "requirements.txt",
                "--no-header",
                "--no-annotate",
            ])
            .args([
                "--only-binary",
                ":all:",
                "--index-url",
                "https://pypi.org/simple/",
                "--no-config",
            ])
            .args(UV_TARGET)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: BTreeMap<String, String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once("=="))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        assert_eq!(ours, theirs);
    }
}

/// The lock's digest covers every file read, includes too, by what it asks for; a recipe
/// without inputs keeps the digest every existing lock recorded.
#[test]
fn editing_what_an_input_file_asks_for_makes_the_lock_stale_and_a_comment_does_not() {
    let target = cudastack::lock::Target::new(
        "3.11".parse().unwrap(),
        Platform::LinuxAmd64,
        "2.36".parse().unwrap(),
    )
    .unwrap();
    let (dir, path, recipe) = workspace(
        "requirements",
        CUDA_ONLY,
        "requirements: [requirements.txt]\n",
    );
    let digest = |recipe: &Recipe| {
        PythonInputs::load(recipe, &path, &target)
            .unwrap()
            .lock_digest(recipe)
    };
    let plain = Recipe::parse(CUDA_ONLY, &path).unwrap();
    assert_eq!(digest(&plain), plain.digest(), "old locks stay fresh");
    let first = digest(&recipe);
    assert_ne!(first, recipe.digest());
    assert_eq!(digest(&recipe), first, "reading again changes nothing");
    let inputs = PythonInputs::load(&recipe, &path, &target).unwrap();
    let files: Vec<&str> = inputs.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        files,
        [
            "requirements.txt",
            "shared/base.txt",
            "shared/constraints.txt"
        ]
    );
    // The digest follows what the files ask for: a comment, a blank line, spacing or the
    // order of lines in a file two includes deep leaves the lock fresh (the bytes' digest,
    // which older locks recorded, moves)...
    let constraints = dir.path().join("shared/constraints.txt");
    let bytes_digest = |recipe: &Recipe| {
        PythonInputs::load(recipe, &path, &target)
            .unwrap()
            .byte_digest(recipe)
    };
    let bytes_before = bytes_digest(&recipe);
    std::fs::write(
        &constraints,
        "# Constraints narrow versions and install nothing by themselves.\n\n# reviewed\niniconfig == 2.0.0\npackaging <24\n",
    )
    .unwrap();
    assert_eq!(
        digest(&recipe),
        first,
        "a comment or the order changes no meaning"
    );
    assert_ne!(bytes_digest(&recipe), bytes_before);
    // ...and a changed version makes it stale.
    std::fs::write(&constraints, "packaging<25\niniconfig==2.0.0\n").unwrap();
    assert_ne!(
        digest(&recipe),
        first,
        "a changed constraint is a new input"
    );
    // A missing file says which, and who named it.
    std::fs::remove_file(dir.path().join("shared/base.txt")).unwrap();
    let error = PythonInputs::load(&recipe, &path, &target)
        .unwrap_err()
        .to_string();
    assert!(error.contains("shared/base.txt"), "{error}");
    assert!(
        error.contains("included from requirements.txt:3"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_that_matches_no_file_names_the_line_and_both_hashes() {
    if offline() {
        return;
    }
    let (dir, path, recipe) = workspace("requirements", CUDA_ONLY, "requirements: [wrong.txt]\n");
    // idna's wheel hash written under six.
    std::fs::write(
        dir.path().join("wrong.txt"),
        "# copied from the wrong line\nsix==1.16.0 --hash=sha256:82fee1fc78add43492d3a1898bfa6d8a904cc97d8427f683ed8e798d07761aa0\n",
    )
    .unwrap();
    let error = lock(&path, &recipe).await.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::HashMismatch { .. }), "{message}");
    assert!(
        message.starts_with("wrong.txt:2: no wheel of `six` 1.16.0"),
        "{message}"
    );
    assert!(
        message.contains("Expected: one of sha256:82fee1fc78add43492d3a1898bfa6d8a904cc97d8427f683ed8e798d07761aa0"),
        "{message}"
    );
    assert!(
        message.contains("Found:    sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254 (six-1.16.0-py2.py3-none-any.whl)"),
        "{message}"
    );
}

/// antlr4-python3-runtime 4.9.x is published as sdists only; omegaconf 2.3.0 requires it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_with_only_an_sdist_is_said_plainly() {
    if offline() {
        return;
    }
    for (requirement, via) in [
        ("antlr4-python3-runtime==4.9.3", None),
        ("omegaconf==2.3.0", Some("omegaconf")),
    ] {
        let (dir, path, recipe) =
            workspace("requirements", CUDA_ONLY, "requirements: [sdist.txt]\n");
        std::fs::write(dir.path().join("sdist.txt"), format!("{requirement}\n")).unwrap();
        let error = lock(&path, &recipe).await.unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, LockError::SdistOnly { .. }), "{message}");
        assert!(
            message.starts_with("`antlr4-python3-runtime` 4.9.3 is published only as a source distribution (`antlr4-python3-runtime-4.9.3.tar.gz`), and cudastack installs wheels only"),
            "{message}"
        );
        assert!(message.contains("hint: require a version"), "{message}");
        if let Some(via) = via {
            assert!(message.contains(via), "{message}");
        }
    }
}

#[test]
fn requirements_that_conflict_with_the_stack_name_both_sides() {
    for (file, text, expected) in [
        (
            "requirements.txt",
            "six\n\ntorch==2.5.1\n",
            "requirements.txt:3: `torch==2.5.1` conflicts with the stack: the recipe's torch is 2.4.1 (torch.version in the recipe)",
        ),
        (
            "requirements.txt",
            "nvidia-cudnn-cu12==9.5.0.50\n",
            "requirements.txt:1: `nvidia-cudnn-cu12==9.5.0.50` conflicts with the stack: torch 2.4.1 pins nvidia-cudnn-cu12==9.1.0.70",
        ),
        (
            "requirements.txt",
            "-c pins.txt\n",
            "pins.txt:1: `triton<3` conflicts with the stack: torch 2.4.1 pins triton==3.0.0",
        ),
    ] {
        let (dir, path, recipe) = workspace("requirements", TORCH, &format!("requirements: [{file}]\n"));
        std::fs::write(dir.path().join(file), text).unwrap();
        std::fs::write(dir.path().join("pins.txt"), "triton<3\n").unwrap();
        let error = request(&path, &recipe).expect_err("a conflict");
        assert!(error.starts_with(expected), "{error}");
        assert!(error.contains("hint: drop the version"), "{error}");
    }
    // `packages:` in the recipe are held to the same rule.
    let (_dir, path, recipe) = workspace("requirements", TORCH, "packages: [\"triton==3.1.0\"]\n");
    let error = request(&path, &recipe).expect_err("a conflict");
    assert!(
        error.starts_with("recipe.yaml (packages:): `triton==3.1.0` conflicts with the stack: torch 2.4.1 pins triton==3.0.0"),
        "{error}"
    );
    // What the stack admits passes: a range around torch, a marker-excluded other torch.
    let (dir, path, recipe) = workspace("requirements", TORCH, "requirements: [ok.txt]\n");
    std::fs::write(
        dir.path().join("ok.txt"),
        "torch>=2.4,<2.5\ntorch==2.5.1 ; sys_platform == 'darwin'\nnvidia-cudnn-cu12\n",
    )
    .unwrap();
    request(&path, &recipe).unwrap();
    // An imported lock is checked the same way.
    let (dir, path, recipe) = workspace("uv-project", TORCH, "python_lock: pylock.toml\n");
    let pylock = std::fs::read_to_string(dir.path().join("pylock.toml")).unwrap();
    let with_torch = format!("{pylock}\n[[packages]]\nname = \"torch\"\nversion = \"2.5.1\"\nwheels = [{{ url = \"https://files.pythonhosted.org/packages/torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl\", hashes = {{ sha256 = \"{}\" }} }}]\n", "0".repeat(64));
    std::fs::write(dir.path().join("pylock.toml"), with_torch).unwrap();
    let error = request(&path, &recipe).expect_err("a conflict");
    assert!(
        error.contains("pylock.toml:36 ([[packages]] torch): `torch==2.5.1` conflicts with the stack: the recipe's torch is 2.4.1"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyproject_dependencies_extras_and_groups() {
    if offline() {
        return;
    }
    let (_dir, path, recipe) = workspace(
        "pyproject",
        CUDA_ONLY,
        "pyproject: { path: pyproject.toml, extras: [all], groups: [test] }\n",
    );
    let lock = lock(&path, &recipe).await.unwrap();
    let ours = versions(&lock);
    // [project].dependencies, `all` (which names trainer[train]), group `test` including
    // `lint`; not the `windows` extra, not the project itself.
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        ["idna", "iniconfig", "packaging", "six", "tqdm"],
        "{ours:?}"
    );
    assert_eq!(ours["tqdm"], "4.66.5");
    assert_eq!(ours["packaging"], "24.1");
    assert_eq!(ours["iniconfig"], "2.0.0");
    // Without extras or groups: the dependencies only.
    let (_dir, path, recipe) = workspace(
        "pyproject",
        CUDA_ONLY,
        "pyproject: { path: pyproject.toml }\n",
    );
    let (_, request) = request(&path, &recipe).unwrap();
    let names: Vec<String> = request.requirements.iter().map(|r| r.to_string()).collect();
    assert_eq!(&names[names.len() - 2..], ["idna>=3.6", "six==1.16.0"]);
}

#[test]
fn pyproject_errors_say_what_to_do() {
    for (extra, edit, expected) in [
        ("extras: [gpu]", None, "the extra `gpu`, which `[project.optional-dependencies]` does not define"),
        ("groups: [docs]", None, "the dependency group `docs`, which `[dependency-groups]` does not define"),
        ("", Some(("dependencies = [", "dynamic = [\"dependencies\"]\nx = [")), "are `dynamic`"),
        ("", Some(("\"six==1.16.0\",", "\"six @ https://example.org/six.whl\",")), "pyproject.toml:11 ([project].dependencies): `six @ https://example.org/six.whl` names a URL"),
        ("", Some(("\"six==1.16.0\",", "\"six===\",")), "pyproject.toml:11 ([project].dependencies): `six`... is not a valid PEP 508 requirement"),
        ("groups: [test]", Some(("lint = [", "lint = [{ include-group = \"test\" }, ")), "includes itself"),
    ] {
        let (dir, path, recipe) = workspace(
            "pyproject",
            CUDA_ONLY,
            &format!("pyproject: {{ path: pyproject.toml, {extra} }}\n"),
        );
        if let Some((from, to)) = edit {
            let file = dir.path().join("pyproject.toml");
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(text.contains(from));
            std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
        }
        let error = request(&path, &recipe).expect_err("an error");
        assert!(error.contains(expected), "{extra} {edit:?}: {error}");
        assert!(error.contains("hint: "), "{error}");
    }
}

/// Issue 19 review: a recipe (from a pull request, say) named host files as its inputs and
/// an unparseable line printed them. Every key and include must stay in the recipe's
/// directory; the netrc beside the workspace is never read.
#[test]
fn inputs_outside_the_recipe_directory_are_refused() {
    for (extra, include, expected) in [
        ("requirements: [../netrc]\n", None, "`../netrc` (requirements:) is outside the recipe's directory: its `..` climbs out of it"),
        ("pyproject: { path: ../pyproject.toml }\n", None, "`../pyproject.toml` (pyproject:) is outside"),
        ("python_lock: ../uv.lock\n", None, "`../uv.lock` (python_lock:) is outside"),
        ("requirements: [requirements.txt]\n", Some("-r ../../netrc"), "`../../netrc` (included from requirements.txt:1) is outside the recipe's directory"),
        ("requirements: [requirements.txt]\n", Some("-c NETRC"), "(included from requirements.txt:1) is outside the recipe's directory: it is an absolute path"),
        ("requirements: [requirements.txt]\n", Some("-r link.txt"), "`link.txt` (included from requirements.txt:1) is outside the recipe's directory: it is or passes through a symbolic link"),
    ] {
        let outer = tempfile::tempdir().unwrap();
        let netrc = outer.path().join("netrc");
        std::fs::write(&netrc, "machine h login u password SECRET\n").unwrap();
        let dir = outer.path().join("recipe");
        copy_dir(&Path::new(FIXTURES).join("requirements"), &dir);
        std::os::unix::fs::symlink(&netrc, dir.join("link.txt")).unwrap();
        if let Some(line) = include {
            let file = dir.join("requirements.txt");
            let text = std::fs::read_to_string(&file).unwrap();
            let line = line.replace("NETRC", &netrc.to_string_lossy());
            std::fs::write(&file, format!("{line}\n{text}")).unwrap();
        }
        let path = dir.join("recipe.yaml");
        std::fs::write(&path, format!("{CUDA_ONLY}{extra}")).unwrap();
        let recipe = Recipe::load(&path).unwrap();
        let error = request(&path, &recipe).expect_err("an error");
        assert!(error.contains(expected), "{extra} {include:?}: {error}");
        assert!(error.contains("must not read other files"), "{error}");
        assert!(!error.contains("SECRET"), "{error}");
    }
}

/// `request` on another thread, failed when it takes longer than 20 s: a FIFO opened for
/// reading blocks until a writer comes. On a timeout each of `fifos` is opened for writing,
/// which lets the blocked read end, before the test fails.
fn request_within_20s(path: &Path, recipe: &Recipe, fifos: &[PathBuf]) -> Result<(), String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let (path, recipe) = (path.to_path_buf(), recipe.clone());
    std::thread::spawn(move || {
        let _ = sender.send(request(&path, &recipe).map(|_| ()));
    });
    match receiver.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(result) => result,
        Err(_) => {
            for fifo in fifos {
                let _ = std::fs::OpenOptions::new().write(true).open(fifo);
            }
            panic!("reading the inputs blocked on a FIFO for 20 s");
        }
    }
}

/// Issue 32: a FIFO (or another file that is not a regular one) named as an input, or
/// included by one, used to block `lock` until something wrote to it. It is refused at
/// once, naming the file and what it is.
#[test]
fn a_fifo_as_an_input_is_refused_without_blocking() {
    for (extra, name, include) in [
        ("requirements: [pipe.txt]\n", "pipe.txt", false),
        ("requirements: [requirements.txt]\n", "more.txt", true),
        ("pyproject: { path: pipe.toml }\n", "pipe.toml", false),
        ("python_lock: uv.lock\n", "uv.lock", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(name);
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo {}", fifo.display());
        if include {
            std::fs::write(dir.path().join("requirements.txt"), "six\n-r more.txt\n").unwrap();
        }
        let path = dir.path().join("recipe.yaml");
        std::fs::write(&path, format!("{CUDA_ONLY}{extra}")).unwrap();
        let recipe = Recipe::load(&path).unwrap();
        let error = request_within_20s(&path, &recipe, &[fifo]).expect_err("an error");
        assert!(
            error.contains(&format!("{name}` "))
                && error.contains("a named pipe (FIFO), not a regular file"),
            "{extra}: {error}"
        );
        assert!(error.contains("hint: "), "{error}");
    }
}

/// Issue 32: a requirements file of 200,000 lines (2 MB, under the size cap) used to send
/// as many requests to the indexes; a chain of 300 includes read 300 files. Both are
/// refused with the cap and where it was passed.
#[test]
fn inputs_beyond_the_caps_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..200_000).map(|i| format!("package-{i}\n")).collect();
    std::fs::write(dir.path().join("huge.txt"), lines).unwrap();
    for i in 0..300 {
        std::fs::write(
            dir.path().join(format!("chain-{i}.txt")),
            format!("-r chain-{}.txt\n", i + 1),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("chain-300.txt"), "six\n").unwrap();
    for (input, expected) in [
        ("huge.txt", "huge.txt:10001: more than 10000 requirements"),
        ("chain-0.txt", "more than 256 input files"),
    ] {
        let path = dir.path().join("recipe.yaml");
        std::fs::write(&path, format!("{CUDA_ONLY}requirements: [{input}]\n")).unwrap();
        let recipe = Recipe::load(&path).unwrap();
        let error = request(&path, &recipe).expect_err("an error");
        assert!(error.contains(expected), "{input}: {error}");
        assert!(error.contains("hint: "), "{error}");
    }
}

/// Issue 32: a URL with a password in a requirement of `packages:` or of a pyproject's
/// dependencies was echoed whole by `lock`'s errors. The errors show it masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_in_requirement_urls_are_masked_in_errors() {
    let secret = "s3cret-Tok";
    // The recipe's own `packages:`, well formed and not.
    for package in [
        format!("acme @ https://bob:{secret}@files.example/acme-1.0-py3-none-any.whl"),
        format!("acme @ https://bob:{secret}@files.example/acme.whl ; os_name =="),
        format!("acme @ https://files.example/acme.whl?token={secret}"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recipe.yaml");
        std::fs::write(&path, format!("{CUDA_ONLY}packages: [\"{package}\"]\n")).unwrap();
        let error = match Recipe::load(&path) {
            Err(error) => cudastack::fetch::http::error_chain(&error),
            Ok(recipe) => match request(&path, &recipe) {
                Err(error) => error,
                Ok((client, request)) => {
                    let error = resolve(&client, &request).await.expect_err("an error");
                    cudastack::fetch::http::error_chain(&error)
                }
            },
        };
        assert!(
            !error.contains(secret) && !error.contains("bob"),
            "{package}: {error}"
        );
        assert!(error.contains("acme"), "{package}: {error}");
    }
    // A pyproject's dependency.
    let (dir, path, recipe) = workspace(
        "pyproject",
        CUDA_ONLY,
        "pyproject: { path: pyproject.toml }\n",
    );
    let file = dir.path().join("pyproject.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let url = format!("\"six @ https://bob:{secret}@files.example/six.whl\",");
    std::fs::write(&file, text.replacen("\"six==1.16.0\",", &url, 1)).unwrap();
    let error = request(&path, &recipe).expect_err("an error");
    assert!(
        error.contains("`six @ https://****@files.example/six.whl` names a URL"),
        "{error}"
    );
    assert!(!error.contains(secret) && !error.contains("bob"), "{error}");
}

/// Issue 19 review: `torchlike==2.5.1` in a requirements file (constrained `<=2.5.1`) must
/// lock the `2.5.1+cu118` a PyTorch-style index publishes: PEP 440's `==V` ignores the
/// candidates' local labels, and the resolver's range used to be V alone ("no solution").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_pin_locks_the_local_version_an_index_publishes() {
    let server = FixtureServer::start();
    let mut html = String::from("<!DOCTYPE html><html><body>\n");
    for version in [
        "2.4.1+cu118",
        "2.5.1+cu118",
        "2.5.1.post1+cu118",
        "2.6.0+cu118",
    ] {
        let (bytes, _) = wheel_bytes("torchlike", version, &[]);
        let file = format!("torchlike-{version}-cp311-cp311-linux_x86_64.whl");
        let href = format!("/files/{}", file.replace('+', "%2B"));
        html.push_str(&format!(
            "<a href=\"{href}#sha256={}\">{file}</a><br/>\n",
            sha256_hex(&bytes)
        ));
        server.add_bytes(&href, "application/octet-stream", bytes);
    }
    server.add_bytes("/whl/cu118/torchlike/", "text/html", html.into_bytes());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("requirements.txt"),
        "torchlike==2.5.1\n-c constraints.txt\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("constraints.txt"), "torchlike<=2.5.1\n").unwrap();
    let path = dir.path().join("recipe.yaml");
    std::fs::write(
        &path,
        format!("{CUDA_ONLY}requirements: [requirements.txt]\n"),
    )
    .unwrap();
    let recipe = Recipe::load(&path).unwrap();
    let target = || {
        Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap(),
        )
        .unwrap()
    };
    let inputs = PythonInputs::load(&recipe, &path, &target()).unwrap();
    let client = HttpClient::with_defaults().unwrap();
    let request = LockRequest {
        target: target(),
        requirements: inputs.roots.iter().map(|s| s.requirement.clone()).collect(),
        sources: vec![PackageSource::Index {
            index: SimpleIndex::new(client.clone(), server.url("/whl/cu118/").parse().unwrap()),
            plain_linux: true,
        }],
        constraints: inputs.constraints,
        redist: vec![],
        system: None,
        recipe_digest: Digest::of_bytes(b"exact pin"),
        byte_digest: None,
        as_of: None,
    };
    let lock = resolve(&client, &request).await.unwrap();
    assert_eq!(lock.artifact("torchlike").unwrap().version, "2.5.1+cu118");
}

/// The wheels uv recorded, for the target: colorama is Windows-only, iniconfig a dev group.
const LOCKED: [(&str, &str, &str); 3] = [
    (
        "idna",
        "3.7",
        "82fee1fc78add43492d3a1898bfa6d8a904cc97d8427f683ed8e798d07761aa0",
    ),
    (
        "six",
        "1.16.0",
        "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
    ),
    (
        "tqdm",
        "4.66.5",
        "90279a3770753eafc9194a0364852159802111925aa30eb3f9d85b0e805ac7cd",
    ),
];

fn expected_locked() -> BTreeMap<String, (String, String)> {
    LOCKED
        .iter()
        .map(|(n, v, h)| (n.to_string(), (v.to_string(), h.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uv_lock_and_pylock_are_imported_with_their_hashes() {
    if offline() {
        return;
    }
    for file in ["uv.lock", "pylock.toml"] {
        let (_dir, path, recipe) =
            workspace("uv-project", CUDA_ONLY, &format!("python_lock: {file}\n"));
        let lock = lock(&path, &recipe).await.unwrap();
        assert_eq!(pins(&lock), expected_locked(), "{file}");
    }
    // A file whose hash the lock does not list is refused, naming the lock's entry.
    let (dir, path, recipe) = workspace("uv-project", CUDA_ONLY, "python_lock: pylock.toml\n");
    let file = dir.path().join("pylock.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace(LOCKED[1].2, &"1".repeat(64))).unwrap();
    let message = lock(&path, &recipe).await.unwrap_err().to_string();
    assert!(
        message.starts_with("pylock.toml:22 ([[packages]] six): no wheel of `six` 1.16.0"),
        "{message}"
    );
}

#[test]
fn imported_locks_refuse_what_is_not_from_an_index() {
    for (file, from, to, expected) in [
        ("uv.lock", "version = 1\n", "version = 2\n", "cudastack reads uv.lock version 1"),
        ("uv.lock", "source = { registry = \"https://pypi.org/simple/\" }\nsdist = { url = \"https://files.pythonhosted.org/packages/71", "source = { git = \"https://github.com/benjaminp/six?rev=1.16.0\" }\nsdist = { url = \"https://files.pythonhosted.org/packages/71", "`six` comes from a git source, not an index"),
        ("uv.lock", "source = { virtual = \".\" }", "source = { registry = \"https://pypi.org/simple/\" }", "has no workspace member"),
        ("pylock.toml", "lock-version = \"1.0\"", "lock-version = \"2.0\"", "cudastack reads PEP 751 lock version 1"),
        ("pylock.toml", "hashes = { sha256 = \"8abb", "hashes = { md5 = \"8abb", "has no sha256"),
        ("pylock.toml", "created-by = \"uv\"", "created-by = \"uv\"\nenvironments = [\"sys_platform == 'darwin'\"]", "none of them"),
    ] {
        let (dir, path, recipe) =
            workspace("uv-project", CUDA_ONLY, &format!("python_lock: {file}\n"));
        let target = dir.path().join(file);
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(text.contains(from), "{file}: {from}");
        std::fs::write(&target, text.replacen(from, to, 1)).unwrap();
        let error = request(&path, &recipe).expect_err("an error");
        assert!(error.contains(expected), "{file} {to}: {error}");
        assert!(error.contains("hint: "), "{error}");
    }
}

/// `cudastack lock` writes the wheels as PEP 751 beside the lock; reading it back locks the
/// same files, and uv installs from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exported_pylock_round_trips() {
    if offline() {
        return;
    }
    let (dir, path, recipe) = workspace(
        "requirements",
        CUDA_ONLY,
        "requirements: [requirements.txt]\n",
    );
    let first = lock(&path, &recipe).await.unwrap();
    let exported = pylock_path(
        &path.with_extension("lock"),
        "torch2.4.1-cu121",
        Platform::LinuxAmd64,
    );
    assert_eq!(
        exported.file_name().unwrap(),
        "pylock.torch2-4-1-cu121.toml"
    );
    let text = to_pylock(&first);
    assert_eq!(text, to_pylock(&first), "deterministic");
    std::fs::write(dir.path().join("pylock.job.toml"), &text).unwrap();
    let (_, path2, recipe2) = {
        let path2 = dir.path().join("again.yaml");
        std::fs::write(&path2, format!("{CUDA_ONLY}python_lock: pylock.job.toml\n")).unwrap();
        ((), path2.clone(), Recipe::load(&path2).unwrap())
    };
    let second = lock(&path2, &recipe2).await.unwrap();
    let wheels = |lock: &Lockfile| -> Vec<(String, String, String)> {
        lock.artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Wheel)
            .map(|a| (a.name.clone(), a.version.clone(), a.url.to_string()))
            .collect()
    };
    assert_eq!(wheels(&first), wheels(&second));
    if let Some(uv) = uv() {
        let out = Command::new(uv)
            .current_dir(dir.path())
            .args([
                "pip",
                "install",
                "--dry-run",
                "--no-config",
                "--target",
                "site",
            ])
            .args(["-r", "pylock.job.toml"])
            .args(UV_TARGET)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        for (name, version, _) in wheels(&first) {
            assert!(
                stderr.contains(&format!("{name}=={version}")),
                "{name}: {stderr}"
            );
        }
    }
}

/// A conflict through a dependency is PubGrub's to find; its report names the recipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indirect_stack_conflict_reads_plainly() {
    if offline() {
        return;
    }
    let (dir, path, recipe) = workspace("requirements", TORCH, "requirements: [vision.txt]\n");
    // torchvision 0.20.1 requires torch==2.5.1; the recipe's torch is 2.4.1.
    std::fs::write(dir.path().join("vision.txt"), "torchvision==0.20.1\n").unwrap();
    let error = lock(&path, &recipe).await.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::NoSolution { .. }), "{message}");
    assert!(
        message.contains("Because torchvision 0.20.1 depends on torch 2.5.1"),
        "{message}"
    );
    assert!(
        message.contains("the recipe asks for torch 2.4.1"),
        "{message}"
    );
    assert!(message.contains("the recipe cannot be locked"), "{message}");
    assert!(!message.contains("<root>"), "{message}");
}

/// Whether `cudastack lock` cannot resolve the bookworm base here (it runs apt against the
/// Debian archive); the skip goes through the gate.
fn debian_unreachable() -> bool {
    if offline() {
        return true;
    }
    if cudastack::platform::which("apt-get").is_none() {
        gate::skip(
            "apt-get",
            "`cudastack lock` of a Debian base runs apt-get, which is not installed",
        );
        return true;
    }
    false
}

/// Through the binary: `lock` writes the PEP 751 file beside the lock and names it in
/// `--json`; an edit of an included requirements file makes `build` refuse the lock.
#[test]
fn cli_lock_writes_pylock_and_build_refuses_a_lock_older_than_its_inputs() {
    if debian_unreachable() {
        return;
    }
    let (dir, path, _) = workspace(
        "requirements",
        "name: job.v1\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\n",
        "requirements: [requirements.txt]\n",
    );
    let cudastack = || Command::new(env!("CARGO_BIN_EXE_cudastack"));
    let out = cudastack()
        .args(["lock", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pylock = dir.path().join("pylock.job-v1.toml");
    assert_eq!(written[0]["pylock"], pylock.to_str().unwrap());
    let text = std::fs::read_to_string(&pylock).unwrap();
    assert!(text.starts_with("lock-version = \"1.0\"\n"), "{text}");
    assert!(
        text.contains("name = \"six-1.16.0-py2.py3-none-any.whl\""),
        "{text}"
    );
    assert!(
        !text.contains("\"deb\""),
        "Debian packages stay out of a Python lock"
    );
    let lock_path = path.with_extension("lock");
    let lock = Lockfile::read(&lock_path).unwrap();
    assert_eq!(written[0]["recipe_digest"], lock.recipe_digest.to_string());
    // A lock made before the digest followed the files' meaning recorded their bytes: it is
    // fresh while they are the same, and relocking keeps its digest (`lock --check`: no change).
    let recipe = Recipe::load(&path).unwrap();
    let bytes = PythonInputs::load(&recipe, &path, &lock.target)
        .unwrap()
        .byte_digest(&recipe);
    let text = std::fs::read_to_string(&lock_path).unwrap();
    std::fs::write(
        &lock_path,
        text.replace(&lock.recipe_digest.to_string(), &bytes.to_string()),
    )
    .unwrap();
    let check = cudastack()
        .args(["lock", "--check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "an older lock of the same bytes is unchanged: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let out = cudastack()
        .args(["build", "--no-verify", "--offline"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("is stale"), "{stderr}");
    std::fs::write(&lock_path, text).unwrap();
    // A comment two includes deep asks for nothing new: the lock is still fresh (this
    // build then stops offline, for the wheels it never downloaded).
    let base = dir.path().join("shared/base.txt");
    let original = std::fs::read_to_string(&base).unwrap();
    std::fs::write(&base, original.clone() + "# reviewed\n").unwrap();
    let build = || {
        cudastack()
            .args(["build", "--no-verify", "--offline"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = build();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("is stale"), "{stderr}");
    // A requirement added two includes deep is an edit of the input.
    std::fs::write(&base, original + "idna\n").unwrap();
    let out = build();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "is stale: it was made from another version of the recipe or of a file it reads"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("run `cudastack lock"), "{stderr}");
}
