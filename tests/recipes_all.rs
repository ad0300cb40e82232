//! The shipped recipes (recipes/*.yaml) and their locks: every recipe validates against the
//! embedded matrix, every lock is fresh for its recipe and pins what the recipe asks for,
//! and re-locking reproduces the committed locks (against real PyPI, skipping with a
//! printed reason when PyPI is unreachable).
//!
//! The cu118 recipe locks through PyTorch's `download.pytorch.org/whl/cu118` index, which is
//! not reachable from the machines these locks are made on. Its lock is made against a
//! fixture of that index's format (PEP 503 HTML, `#sha256=` fragments, `linux_x86_64`
//! wheels with `+cu118` local versions) served on 127.0.0.1, holding a stand-in torch
//! wheel whose METADATA carries the real wheel's requirements; everything else comes from
//! real PyPI. Its torch artifact therefore points at `http://127.0.0.1:0/...` (the port is
//! normalised to 0, where nothing listens) so that lock can never be mistaken for a real
//! one or built from. `CUDASTACK_BLESS_RECIPE_LOCKS=1 cargo test --test suite recipes_all::`
//! rewrites it.

use crate::fetch_support;

use fetch_support::gate;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cudastack::fetch::http::{HttpClient, HttpConfig, RetryPolicy};
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::inputs::{lock_path, lock_request_for, platform_lock_path, root_requirements};
use cudastack::lock::lockfile::DebLayer;
use cudastack::lock::{resolve, ArtifactKind, LockError, Lockfile};
use cudastack::matrix::{Matrix, ResolvedRecipe};
use cudastack::recipe::{Platform, Recipe, TorchIndex};
use fetch_support::{sha256_hex, wheel_bytes, FixtureServer};

/// The recipe whose lock is made against the cu118 index fixture.
const FIXTURE_RECIPE: &str = "torch2.1.2-cu118-py3.11";
/// Where fixture-served artifacts point in the committed lock: port 0, nothing listens.
const FIXTURE_ORIGIN: &str = "http://127.0.0.1:0";

fn recipes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes")
}

/// Every recipe file, sorted.
fn recipe_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(recipes_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
}

fn client() -> HttpClient {
    HttpClient::new(HttpConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
        },
        ..HttpConfig::default()
    })
    .unwrap()
}

#[test]
fn the_recipe_set_covers_the_well_trodden_stacks() {
    let names: Vec<String> = recipe_paths()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    // torch era -> CUDA line of its PyPI default (issue 9), plus the conservative cu118 one.
    for expected in [
        "cu118",
        "2.1.2-cu121",
        "2.3.1-cu121",
        "2.4.1-cu121",
        "2.5.1-cu124",
        "2.6.0-cu124",
        "2.7.1-cu126",
        "2.8.0-cu128",
        "2.10.0-cu128",
        "2.11.0-cu130",
        "2.13.0-cu130",
        "2.15.0-cu132",
    ] {
        assert!(
            names.iter().any(|n| n.contains(expected)),
            "no recipe for {expected} in {names:?}"
        );
    }
    assert!(names.iter().any(|n| n.ends_with("-devel")));
    assert!(names.iter().any(|n| n.contains("py3.12")));
    // linux/arm64 (SBSA) where PyPI has aarch64 CUDA wheels (torch >= 2.11).
    assert!(recipe_paths().iter().any(|path| Recipe::load(path)
        .unwrap()
        .platforms()
        .contains(&Platform::LinuxArm64)));
}

#[test]
fn every_recipe_validates_and_is_named_after_its_file() {
    let matrix = Matrix::embedded();
    let paths = recipe_paths();
    assert!(
        paths.len() >= 14,
        "expected the full recipe set, found {paths:?}"
    );
    for path in &paths {
        let resolved = ResolvedRecipe::load(path, matrix)
            .unwrap_or_else(|error| panic!("{} is invalid: {error:#?}", path.display()));
        let recipe = resolved.recipe();
        assert_eq!(
            path.file_stem().unwrap().to_string_lossy(),
            recipe.name,
            "{}: the file name is the recipe name",
            path.display()
        );
        // The name scheme: torch<version>-cu<MAJOR><MINOR>-py<python>[-devel].
        let torch = recipe
            .torch
            .as_ref()
            .expect("every shipped recipe names torch");
        let cuda = recipe.cuda.version;
        let stem = format!(
            "torch{}-cu{}{}-py{}",
            torch.version, cuda.major, cuda.minor, recipe.python
        );
        assert!(
            recipe.name == stem || recipe.name == format!("{stem}-devel"),
            "{} does not follow the name scheme {stem}[-devel]",
            recipe.name
        );
        assert!(
            recipe.source_date_epoch.is_some(),
            "{}: recipes pin source_date_epoch",
            recipe.name
        );
    }
}

#[test]
fn the_cli_validates_every_recipe() {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .arg("--json")
        .arg("validate")
        .args(recipe_paths())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cudastack validate failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every lock file in recipes/ belongs to a recipe and one of its platforms.
#[test]
fn no_lock_is_orphaned() {
    let mut expected: Vec<PathBuf> = recipe_paths()
        .iter()
        .flat_map(|path| {
            let recipe = Recipe::load(path).unwrap();
            recipe
                .platforms()
                .into_iter()
                .map(|platform| platform_lock_path(path, platform))
                .collect::<Vec<_>>()
        })
        .collect();
    expected.sort();
    let mut found: Vec<PathBuf> = std::fs::read_dir(recipes_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "lock"))
        .collect();
    found.sort();
    assert_eq!(found, expected);
}

#[test]
fn every_lock_is_fresh_and_pins_what_its_recipe_asks_for() {
    for path in recipe_paths() {
        let resolved = ResolvedRecipe::load(&path, Matrix::embedded()).unwrap();
        for &platform in resolved.platforms() {
            check_lock(&resolved, platform);
        }
    }
}

fn check_lock(resolved: &ResolvedRecipe, platform: Platform) {
    let (path, recipe) = (resolved.path(), resolved.recipe());
    let lock_file = platform_lock_path(path, platform);
    let lock = Lockfile::read(&lock_file)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cudastack lock`)", lock_file.display()));
    let name = &format!("{} ({platform})", recipe.name);
    assert_eq!(lock.target.arch, platform, "{name}");
    assert!(
            !lock.is_stale(&recipe.digest()),
            "{name}: the lock was made for another recipe digest ({}, recipe is {}): run `cudastack lock {}`",
            lock.recipe_digest,
            recipe.digest(),
            path.display()
        );
    // The lock's target is the recipe's Python on its base's glibc.
    assert_eq!(
        lock.target.python.to_string(),
        recipe.python.to_string(),
        "{name}"
    );
    assert_eq!(Some(lock.target.glibc), resolved.base_glibc(), "{name}");
    // The root requirements are exactly what the recipe asks for.
    assert_eq!(
        lock.requirements,
        root_requirements(resolved).unwrap(),
        "{name}"
    );
    let fixture = recipe.name == FIXTURE_RECIPE;
    assert!(!lock.artifacts.is_empty(), "{name}");
    check_debs(name, recipe, platform, &lock);
    for artifact in lock
        .artifacts
        .iter()
        .filter(|a| a.kind != ArtifactKind::Deb)
    {
        assert_eq!(
            artifact.kind,
            ArtifactKind::Wheel,
            "{name}: {}",
            artifact.name
        );
        assert!(artifact.size > 0, "{name}: {} has no size", artifact.name);
        assert!(
            artifact
                .url
                .to_string()
                .ends_with(&artifact.filename.replace('+', "%2B"))
                || artifact
                    .url
                    .to_string()
                    .ends_with(artifact.filename.as_str()),
            "{name}: {} does not name {}",
            artifact.url,
            artifact.filename
        );
        let from_fixture = artifact
            .url
            .to_string()
            .starts_with(&format!("{FIXTURE_ORIGIN}/"));
        if fixture && artifact.name == "torch" {
            assert!(
                from_fixture,
                "{name}: torch comes from the cu118 index fixture"
            );
        } else {
            assert!(
                artifact
                    .url
                    .to_string()
                    .starts_with("https://files.pythonhosted.org/"),
                "{name}: {} is not a PyPI file URL",
                artifact.url
            );
        }
        // A sha256 digest that is not the empty file's.
        assert_ne!(
            artifact.sha256.hex(),
            sha256_hex(b""),
            "{name}: {}",
            artifact.name
        );
    }
    let torch = lock
        .artifact("torch")
        .unwrap_or_else(|| panic!("{name}: no torch in the lock"));
    // The tags as `build` renders them from this lock are image references (issue 16).
    let cudnn = lock
        .artifacts
        .iter()
        .find(|a| a.name.starts_with("nvidia-cudnn"))
        .map(|a| a.version.as_str());
    let values = recipe.tag_values("127.0.0.1:5000", Some(&torch.version), cudnn);
    let tags = recipe
        .render_tags(&values)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(tags.len(), recipe.tags.len(), "{name}");
    let wanted = recipe.torch.as_ref().unwrap();
    let build = resolved.torch_build().unwrap();
    // Every platform-specific wheel is for this platform's architecture.
    for artifact in lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel)
    {
        let arch = platform.wheel_arch();
        assert!(
            artifact.filename.ends_with("-any.whl")
                || artifact.filename.ends_with(&format!("_{arch}.whl")),
            "{name}: {} is not for {arch}",
            artifact.filename
        );
    }
    let expected_version = match &wanted.index {
        TorchIndex::Pypi => wanted.version.to_string(),
        TorchIndex::Variant { variant, .. } => format!("{}+{variant}", wanted.version),
    };
    assert_eq!(torch.version, expected_version, "{name}: torch pin");
    // cuDNN as a wheel: torch pins the exact one the recipe names.
    if let Some(cudnn) = recipe.cudnn.as_ref() {
        let wheel = format!("nvidia-cudnn-cu{}", recipe.cuda.version.major);
        match lock.artifact(&wheel) {
            Some(found) => assert_eq!(found.version, cudnn.version.to_string(), "{name}"),
            // PyTorch's cu118 wheels of the 2.1 era bundle cuDNN in torch/lib.
            None => assert!(fixture, "{name}: no {wheel} in the lock"),
        }
    }
    // The CUDA runtime wheel is the build's exact runtime, where the matrix knows it.
    if let Some(runtime) = build.cuda_runtime.as_deref() {
        let wheel = if recipe.cuda.version.major >= 13 {
            "nvidia-cuda-runtime".to_string()
        } else {
            format!("nvidia-cuda-runtime-cu{}", recipe.cuda.version.major)
        };
        let found = lock
            .artifact(&wheel)
            .unwrap_or_else(|| panic!("{name}: no {wheel}"));
        assert_eq!(found.version, runtime, "{name}: {wheel}");
    }
    // Devel recipes carry nvcc of the same release as the runtime.
    if recipe.name.ends_with("-devel") {
        assert!(
            lock.artifacts
                .iter()
                .any(|a| a.name.starts_with("nvidia-cuda-nvcc")),
            "{name}: a devel lock has nvcc"
        );
    }
}

/// The base's packages are locked (issue 18): the minbase set with python3 of the recipe's
/// Python, every one from the distribution's archive with its sha256, suite and component,
/// for this platform's architecture, and a snapshot-archive fallback for Debian's.
fn check_debs(name: &str, recipe: &Recipe, platform: Platform, lock: &Lockfile) {
    let debs: Vec<_> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Deb)
        .collect();
    let names: Vec<&str> = debs.iter().map(|a| a.name.as_str()).collect();
    for essential in [
        "libc6",
        "dpkg",
        "apt",
        "python3",
        "ca-certificates",
        "base-files",
    ] {
        assert!(
            names.contains(&essential),
            "{name}: no {essential} in the lock's debs"
        );
    }
    let python3 = debs.iter().find(|a| a.name == "python3").unwrap();
    assert!(
        python3.version.starts_with(&format!("{}.", recipe.python)),
        "{name}: python3 {} is not Python {}",
        python3.version,
        recipe.python
    );
    let (distro, _) = recipe.base.distro().unwrap();
    for deb in &debs {
        let arch = deb.platform.as_deref().unwrap();
        assert!(
            arch == "all" || arch == platform.to_debian(),
            "{name}: {} is {arch}",
            deb.name
        );
        assert!(
            deb.suite.is_some() && deb.component.is_some(),
            "{name}: {}",
            deb.name
        );
        assert_eq!(deb.layer, Some(DebLayer::Base), "{name}: {}", deb.name);
        assert!(
            deb.url.to_string().starts_with(&deb.source),
            "{name}: {}",
            deb.url
        );
        assert!(deb.url.to_string().ends_with(".deb"), "{name}: {}", deb.url);
        if distro == "debian" {
            let fallback = deb.fallback_url.as_ref().map(|u| u.as_str()).unwrap_or("");
            assert!(
                fallback.starts_with("https://snapshot.debian.org/archive/"),
                "{name}: {} has no snapshot fallback",
                deb.name
            );
        }
    }
}

/// Relock `recipe`'s wheels as of its committed lock's own moment (issue 40), with
/// `sources` replacing the recipe's own (None: as the recipe says): index files uploaded
/// after the lock was made are not candidates, so what upstream publishes next cannot
/// change the answer. The Debian/Ubuntu packages are the committed lock's: the archives
/// drop superseded versions, the snapshot services that keep them are not reachable from
/// the machines this suite runs on, and `lock --as-of` against a snapshot is tested on a
/// fixture archive (`lock_as_of`). Whether the archives moved is the relock workflow's
/// question (`lock --upgrade`), never a landing test's.
#[allow(clippy::result_large_err)] // LockError names its URLs, as in the library
fn relock(
    resolved: &ResolvedRecipe,
    sources: Option<Vec<PackageSource>>,
    platform: Platform,
) -> Result<Lockfile, LockError> {
    let recipe = resolved.recipe();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = client();
    let committed = Lockfile::read(&platform_lock_path(
        &recipes_dir().join(format!("{}.yaml", recipe.name)),
        platform,
    ))
    .unwrap();
    // Blessing the fixture lock moves it to today's PyPI; checking it uses its own moment.
    let as_of = if std::env::var_os("CUDASTACK_BLESS_RECIPE_LOCKS").is_some() {
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap()
    } else {
        committed
            .as_of
            .unwrap_or_else(|| panic!("{}: the committed lock records no `as_of`", recipe.name))
    };
    let mut request = lock_request_for(resolved, &client, None, platform).unwrap();
    if let Some(sources) = sources {
        request.sources = sources;
    }
    request.system = None;
    request.as_of(as_of, None).unwrap();
    let mut fresh = runtime.block_on(resolve(&client, &request))?;
    fresh.artifacts.extend(
        committed
            .artifacts
            .iter()
            .filter(|a| a.kind.is_deb())
            .cloned(),
    );
    fresh.canonicalize();
    Ok(fresh)
}

/// Why real PyPI cannot be used here, or None.
fn pypi_unreachable() -> Option<String> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = client();
    let pypi = SimpleIndex::pypi(client);
    let name = "filelock".parse().unwrap();
    match runtime.block_on(pypi.project(&name)) {
        Ok(_) => None,
        Err(error) => Some(format!("PyPI is unreachable: {error}")),
    }
}

#[test]
fn relocking_against_real_pypi_reproduces_the_committed_locks() {
    if let Some(reason) = pypi_unreachable() {
        gate::skip("network", reason);
        return;
    }
    for (name, platform) in [
        ("torch2.4.1-cu121-py3.11", Platform::LinuxAmd64),
        ("torch2.15.0-cu132-py3.12", Platform::LinuxAmd64),
        ("torch2.11.0-cu130-py3.11", Platform::LinuxArm64),
    ] {
        let path = recipes_dir().join(format!("{name}.yaml"));
        let resolved = ResolvedRecipe::load(&path, Matrix::embedded()).unwrap();
        assert!(
            resolved.platforms().contains(&platform),
            "{name}: {platform}"
        );
        let fresh = relock(&resolved, None, platform).unwrap();
        let committed = std::fs::read_to_string(platform_lock_path(&path, platform)).unwrap();
        assert_eq!(
            fresh.to_json(),
            committed,
            "{name} ({platform}): relocked as of the lock's own moment, PyPI answers otherwise: a locked file was deleted or yanked, or the resolver changed; run `cudastack lock {}`, review the diff and commit it",
            path.display()
        );
    }
}

/// The Requires-Dist of PyTorch's `torch-2.1.2+cu118` wheels: the 2.1-era cu118 builds are
/// the large wheels that bundle CUDA 11.8 and cuDNN 8.7 in torch/lib, so nothing nvidia-*
/// is required (PyTorch's builder added the nvidia-*-cu11 pins from 2.2 on).
const TORCH_212_CU118_REQUIRES: &[&str] = &[
    "Requires-Python: >=3.8.0",
    "Requires-Dist: filelock",
    "Requires-Dist: typing-extensions",
    "Requires-Dist: sympy",
    "Requires-Dist: networkx",
    "Requires-Dist: jinja2",
    "Requires-Dist: fsspec",
    "Requires-Dist: triton (==2.1.0) ; platform_system == \"Linux\" and platform_machine == \"x86_64\"",
    "Provides-Extra: dynamo",
    "Requires-Dist: jinja2 ; extra == 'dynamo'",
    "Provides-Extra: opt-einsum",
    "Requires-Dist: opt-einsum (>=3.3) ; extra == 'opt-einsum'",
];

/// Serve the cu118 index fixture: `/whl/cu118/torch/` listing stand-in torch wheels for
/// the Python versions of the 2.1 era, with the `data-upload-time` PyTorch's index adds
/// (the lock is relocked as of its own moment) (anything else is a 404, as on PyTorch's index for
/// projects it does not carry, so the resolver falls through to PyPI).
fn cu118_index_fixture() -> FixtureServer {
    let server = FixtureServer::start();
    let mut html =
        String::from("<!DOCTYPE html>\n<html>\n  <body>\n    <h1>Links for torch</h1>\n");
    for python in ["cp38", "cp39", "cp310", "cp311"] {
        let filename = format!("torch-2.1.2+cu118-{python}-{python}-linux_x86_64.whl");
        let (bytes, _) = wheel_bytes("torch", "2.1.2+cu118", TORCH_212_CU118_REQUIRES);
        let path = format!("/whl/cu118/files/{}", filename.replace('+', "%2B"));
        html.push_str(&format!(
            "    <a href=\"{path}#sha256={}\" data-requires-python=\"&gt;=3.8.0\" data-upload-time=\"2023-12-14T22:44:39Z\">{filename}</a><br/>\n",
            sha256_hex(&bytes)
        ));
        server.add_bytes(&path, "application/octet-stream", bytes);
    }
    html.push_str("  </body>\n</html>\n");
    server.add_bytes("/whl/cu118/torch/", "text/html", html.into_bytes());
    server
}

#[test]
fn the_cu118_lock_reproduces_against_the_index_fixture() {
    let path = recipes_dir().join(format!("{FIXTURE_RECIPE}.yaml"));
    let resolved = ResolvedRecipe::load(&path, Matrix::embedded()).unwrap();
    let recipe = resolved.recipe();
    assert_eq!(
        recipe.torch.as_ref().unwrap().index.variant(),
        Some("cu118")
    );
    if let Some(reason) = pypi_unreachable() {
        gate::skip(
            "network",
            format!("{reason} (the cu118 lock takes torch's dependencies from PyPI)"),
        );
        return;
    }
    let server = cu118_index_fixture();
    let client = client();
    let sources = vec![
        PackageSource::Index {
            index: SimpleIndex::new(client.clone(), server.url("/whl/cu118/").parse().unwrap()),
            plain_linux: true,
        },
        PackageSource::pypi(client),
    ];
    let mut lock = relock(&resolved, Some(sources), Platform::LinuxAmd64).unwrap();
    // The recipe's digest is that of the real recipe (index: cu118), not of a rewritten one.
    assert_eq!(lock.recipe_digest, recipe.digest());
    for artifact in &mut lock.artifacts {
        artifact.url = artifact
            .url
            .to_string()
            .replace(&server.base, FIXTURE_ORIGIN)
            .parse()
            .unwrap();
        artifact.source = artifact.source.replace(&server.base, FIXTURE_ORIGIN);
    }
    let torch = lock.artifact("torch").unwrap();
    assert_eq!(
        torch.filename,
        "torch-2.1.2+cu118-cp311-cp311-linux_x86_64.whl"
    );
    assert_eq!(torch.source, format!("{FIXTURE_ORIGIN}/whl/cu118/"));
    assert_eq!(lock.artifact("triton").unwrap().version, "2.1.0");
    let lock_file = lock_path(&path);
    if std::env::var_os("CUDASTACK_BLESS_RECIPE_LOCKS").is_some() {
        lock.write(&lock_file).unwrap();
        eprintln!("wrote {}", lock_file.display());
        return;
    }
    let committed = std::fs::read_to_string(&lock_file).unwrap();
    assert_eq!(
        lock.to_json(),
        committed,
        "{FIXTURE_RECIPE}: the fixture lock changed (upstream PyPI moved?); rerun with CUDASTACK_BLESS_RECIPE_LOCKS=1 and commit"
    );
}
