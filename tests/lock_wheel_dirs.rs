//! The recipe's `wheels:` directories: real wheels (zips with their METADATA) beside a
//! recipe, locked through the same request `cudastack lock` makes (the local source first,
//! the dependencies from a fixture index standing in for PyPI), fetched the way `build`
//! fetches them, and the lock refused by the binary when a wheel is swapped or added.
//! The image that installs one is built in tests/index_credentials.rs (its stand-in stack
//! build takes a `wheels:` wheel too, so no second image is built for it).
//!
//! No network: the index is a local fixture server, `build` runs `--offline` and stops at
//! the lock.

use crate::fetch_support::{sha256_hex, wheel_bytes, FixtureServer};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cudastack::cache::BlobStore;
use cudastack::fetch::download::Downloader;
use cudastack::fetch::http::HttpClient;
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::progress::NoReporter;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::inputs::lock_request;
use cudastack::lock::python_inputs::add_to_request;
use cudastack::lock::{resolve, ArtifactKind, Location, Lockfile};
use cudastack::matrix::{Matrix, ResolvedRecipe};
use cudastack::recipe::Recipe;

const RECIPE: &str = "name: ops\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\nrequirements: [requirements.txt]\nwheels: [wheelhouse]\n";

const CHOSEN: &str = "acme_ops-1.0-cp311-cp311-linux_x86_64.whl";

/// A recipe directory: `requirements.txt` asks for acme-ops, whose wheels in `wheelhouse/`
/// are 1.0 (for the recipe's CPython), 0.9, and a 2.0 for another CPython; `unused` is
/// offered and asked for by nobody.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let house = dir.path().join("wheelhouse");
    std::fs::create_dir_all(&house).unwrap();
    for (version, file) in [
        ("1.0", CHOSEN),
        ("0.9", "acme_ops-0.9-py3-none-any.whl"),
        ("2.0", "acme_ops-2.0-cp310-cp310-linux_x86_64.whl"),
    ] {
        let (bytes, _) = wheel_bytes("acme-ops", version, &["Requires-Dist: tinydep>=1"]);
        std::fs::write(house.join(file), bytes).unwrap();
    }
    let (bytes, _) = wheel_bytes("unused", "1.0", &[]);
    std::fs::write(house.join("unused-1.0-py3-none-any.whl"), bytes).unwrap();
    std::fs::write(dir.path().join("requirements.txt"), "acme-ops>=0.9\n").unwrap();
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, RECIPE).unwrap();
    (dir, path)
}

/// An index with tinydep (the local wheel's dependency) and an acme-ops 3.0 that must not
/// be taken: the package has wheels in `wheels:`, so it comes from there only.
fn index() -> FixtureServer {
    let server = FixtureServer::start();
    for (name, version) in [("tinydep", "1.2"), ("acme-ops", "3.0")] {
        let (bytes, _) = wheel_bytes(name, version, &[]);
        let file = format!("{}-{version}-py3-none-any.whl", name.replace('-', "_"));
        let href = format!("/files/{file}");
        let html = format!(
            "<html><body><a href=\"{href}#sha256={}\">{file}</a></body></html>",
            sha256_hex(&bytes)
        );
        server.add_bytes(&href, "application/octet-stream", bytes);
        server.add_bytes(&format!("/simple/{name}/"), "text/html", html.into_bytes());
    }
    server
}

/// Lock the recipe at `path` as `cudastack lock` asks (its request, with the recipe's
/// inputs added), the stack's own wheels left out and PyPI replaced by `server`.
async fn lock(path: &Path, server: &FixtureServer) -> Result<Lockfile, String> {
    let recipe = Recipe::load(path).unwrap();
    let resolved =
        ResolvedRecipe::new(Matrix::embedded(), recipe, path).map_err(|e| e.to_string())?;
    let client = HttpClient::with_defaults().unwrap();
    let mut request = lock_request(&resolved, &client, None).unwrap();
    assert!(
        matches!(request.sources[0], PackageSource::Local(_)),
        "`wheels:` is asked first"
    );
    request.sources.truncate(1);
    request.sources.push(PackageSource::Index {
        index: SimpleIndex::new(client.clone(), server.url("/simple/").parse().unwrap()),
        plain_linux: false,
    });
    request.system = None;
    // The stack's CUDA wheels come from PyPI; only the recipe's inputs are locked here.
    request.requirements.clear();
    add_to_request(&resolved, &mut request).map_err(|e| e.to_string())?;
    resolve(&client, &request).await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wheel_of_the_directory_is_locked_by_its_path_and_fetched_hash_checked() {
    let (dir, path) = workspace();
    let server = index();
    let locked = lock(&path, &server).await.unwrap();
    let ops = locked.artifact("acme-ops").unwrap();
    let bytes = std::fs::read(dir.path().join("wheelhouse").join(CHOSEN)).unwrap();
    assert_eq!(ops.kind, ArtifactKind::Wheel);
    assert_eq!(ops.version, "1.0");
    assert_eq!(ops.url, Location::Recipe(format!("wheelhouse/{CHOSEN}")));
    assert_eq!(ops.sha256.hex(), sha256_hex(&bytes));
    assert_eq!(ops.size, bytes.len() as u64);
    assert_eq!(ops.source, "wheels: [wheelhouse]");
    assert_eq!(ops.requires, ["tinydep>=1"]);
    // Its dependency comes from the index; nothing else of the directory is locked.
    let tinydep = locked.artifact("tinydep").unwrap();
    assert!(
        tinydep.url.to_string().starts_with("http://"),
        "{}",
        tinydep.url
    );
    let names: Vec<&str> = locked.artifacts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["acme-ops", "tinydep"]);
    // Written and read back as the same lock, the path relative to the recipe.
    let lock_path = path.with_extension("lock");
    locked.write(&lock_path).unwrap();
    let text = std::fs::read_to_string(&lock_path).unwrap();
    assert!(
        text.contains(&format!("\"url\": \"file:wheelhouse/{CHOSEN}\"")),
        "{text}"
    );
    assert_eq!(Lockfile::read(&lock_path).unwrap(), locked);

    // Fetched as `build` fetches it: copied into the blob store, hash-checked.
    let local = ResolvedRecipe::load(&path, Matrix::embedded())
        .unwrap()
        .local_wheels()
        .clone();
    let fetch = |cache: &Path| {
        let store = BlobStore::open(cache).unwrap();
        let client = HttpClient::with_defaults().unwrap();
        let downloader =
            Downloader::new(client, store, Arc::new(NoReporter)).mirrors(local.directories());
        let item = ops.fetch_item(dir.path());
        async move { downloader.fetch(&item).await }
    };
    let blob = fetch(&dir.path().join("cache")).await.unwrap();
    assert_eq!(std::fs::read(blob).unwrap(), bytes);
    // Other bytes of the same size swapped in after the directory was read (a size that
    // differs is refused by its size first).
    let mut other = bytes.clone();
    other[40] ^= 1;
    std::fs::write(dir.path().join("wheelhouse").join(CHOSEN), &other).unwrap();
    let error = fetch(&dir.path().join("fresh-cache")).await.unwrap_err();
    let chain = cudastack::fetch::http::error_chain(&error);
    assert!(
        chain.contains(&format!("Expected: {}", ops.sha256))
            && chain.contains(&format!("Found:    sha256:{}", sha256_hex(&other))),
        "{chain}"
    );
}

/// The same recipe and wheels in another checkout lock to the same bytes: nothing of where
/// the directory is on this machine enters the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_the_same_in_another_checkout() {
    let (first, path) = workspace();
    let server = index();
    let one = lock(&path, &server).await.unwrap();
    let second = tempfile::tempdir().unwrap();
    let moved = second.path().join("deeper/checkout");
    std::fs::create_dir_all(moved.join("wheelhouse")).unwrap();
    for entry in std::fs::read_dir(first.path().join("wheelhouse")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            moved.join("wheelhouse").join(entry.file_name()),
        )
        .unwrap();
    }
    for file in ["recipe.yaml", "requirements.txt"] {
        std::fs::copy(first.path().join(file), moved.join(file)).unwrap();
    }
    let two = lock(&moved.join("recipe.yaml"), &server).await.unwrap();
    assert_eq!(one.to_json(), two.to_json());
    assert!(!one.to_json().contains(&*first.path().to_string_lossy()));
}

/// A requirement the directory's wheels cannot satisfy is not looked up on the index: the
/// package has wheels there (as with the first index that has a package).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_of_the_directory_is_taken_from_there_only() {
    let (dir, path) = workspace();
    std::fs::write(dir.path().join("requirements.txt"), "acme-ops>=2\n").unwrap();
    let error = lock(&path, &index()).await.unwrap_err();
    assert!(
        error.contains("No wheel of `acme-ops` fits") && error.contains("2.0: only cp310"),
        "{error}"
    );
    assert!(
        !error.contains("3.0"),
        "the index's acme-ops was offered: {error}"
    );
}

fn cudastack(args: &[&str], path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .arg(path)
        .env("CUDASTACK_CACHE_DIR", path.parent().unwrap().join("cache"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Through the binary: a fresh lock is accepted (the build stops later, at the pip this
/// lock left out); a swapped wheel is named with both hashes; a wheel added to the
/// directory makes the lock stale; a broken wheel is refused by `validate` and `lock` in
/// the same words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_a_swapped_or_added_wheel_and_validate_refuses_what_lock_would() {
    let (dir, path) = workspace();
    let locked = lock(&path, &index()).await.unwrap();
    locked.write(&path.with_extension("lock")).unwrap();
    let build = ["build", "--no-verify", "--offline"];
    let (_, output) = cudastack(&build, &path);
    // Past the lock's checks: it stops at the stack's pip, which this lock left out.
    assert!(output.contains("has no `pip`"), "{output}");
    let chosen = dir.path().join("wheelhouse").join(CHOSEN);
    let original = std::fs::read(&chosen).unwrap();
    let (swapped, _) = wheel_bytes("acme-ops", "1.0", &["Requires-Dist: evil"]);
    std::fs::write(&chosen, &swapped).unwrap();
    let (ok, output) = cudastack(&build, &path);
    assert!(!ok);
    assert!(
        output.contains(&format!(
            "`wheelhouse/{CHOSEN}` (wheels:) is not the wheel lock file"
        )),
        "{output}"
    );
    let ops = locked.artifact("acme-ops").unwrap();
    assert!(
        output.contains(&format!(
            "Expected: {}\n  Found:    sha256:{}",
            ops.sha256,
            sha256_hex(&swapped)
        )),
        "{output}"
    );
    std::fs::write(&chosen, &original).unwrap();
    let (bytes, _) = wheel_bytes("acme-ops", "1.1", &[]);
    let added = dir.path().join("wheelhouse/acme_ops-1.1-py3-none-any.whl");
    std::fs::write(&added, bytes).unwrap();
    let (ok, output) = cudastack(&build, &path);
    assert!(!ok);
    assert!(output.contains("is stale"), "{output}");
    assert!(output.contains("`wheels:`"), "{output}");
    // A wheel whose METADATA is another distribution's: refused before anything is locked.
    let (evil, _) = wheel_bytes("evil", "6.6.6", &[]);
    std::fs::write(&added, evil).unwrap();
    let said = "`wheelhouse/acme_ops-1.1-py3-none-any.whl` (wheels:): its METADATA describes another distribution than its file name says\n  Expected: acme-ops 1.1\n  Found:    evil 6.6.6";
    let (ok, output) = cudastack(&["validate"], &path);
    assert!(!ok && output.contains("error[wheels]"), "{output}");
    assert!(output.contains(said), "{output}");
    let (ok, output) = cudastack(&["lock"], &path);
    assert!(!ok && output.contains(said), "{output}");
    let lock_text = std::fs::read_to_string(path.with_extension("lock")).unwrap();
    assert_eq!(
        Lockfile::from_json(&lock_text, &path).unwrap(),
        locked,
        "a refused lock writes nothing"
    );
}
