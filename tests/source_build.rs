//! Source builds of the recipe's `build:` packages (issue 20): what `lock` records for
//! them, against a fixture index that serves real gzip-tar sdists and real wheels, and
//! what `lock` says about a package that has no usable wheel.

use crate::fetch_support;

use std::str::FromStr;
use std::time::Duration;

use cudastack::digest::Digest;
use cudastack::fetch::http::{HttpClient, HttpConfig, RetryPolicy};
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::sdist::BuildRequest;
use cudastack::lock::{resolve, resolve_with_builds, ArtifactKind, LockError, LockRequest, Target};
use cudastack::platform::Platform;
use cudastack::recipe::SourceBuild;
use fetch_support::{sha256_hex, wheel_bytes, FixtureServer};
use pep508_rs::Requirement;

fn client() -> HttpClient {
    HttpClient::new(HttpConfig {
        retry: RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
        },
        ..HttpConfig::default()
    })
    .unwrap()
}

/// A real sdist: a gzip tar of `TOP/PKG-INFO`, `TOP/pyproject.toml` (when given) and a
/// setup.py, as setuptools' `sdist` writes them.
fn sdist(name: &str, version: &str, pkg_info: &str, pyproject: Option<&str>) -> Vec<u8> {
    let top = format!("{}-{version}", name.replace('-', "_"));
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    let mut members = vec![
        (format!("{top}/PKG-INFO"), pkg_info.to_string()),
        (
            format!("{top}/setup.py"),
            "from setuptools import setup\nsetup()\n".to_string(),
        ),
    ];
    if let Some(text) = pyproject {
        members.push((format!("{top}/pyproject.toml"), text.to_string()));
    }
    for (path, text) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, text.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

/// One file of a project page: its name and bytes.
struct File {
    filename: String,
    bytes: Vec<u8>,
}

fn wheel(name: &str, version: &str, tag: &str, headers: &[&str]) -> File {
    File {
        filename: format!("{}-{version}-{tag}.whl", name.replace('-', "_")),
        bytes: wheel_bytes(name, version, headers).0,
    }
}

/// Publish `files` of one project as a PEP 503 page under /simple/.
fn publish(server: &FixtureServer, project: &str, files: &[File]) {
    let mut html = String::from("<!DOCTYPE html><html><body>\n");
    for file in files {
        let path = format!("/files/{}", file.filename);
        server.add_bytes(&path, "application/octet-stream", file.bytes.clone());
        html.push_str(&format!(
            "<a href=\"{path}#sha256={}\">{}</a><br/>\n",
            sha256_hex(&file.bytes),
            file.filename
        ));
    }
    html.push_str("</body></html>\n");
    server.add_bytes(
        &format!("/simple/{project}/"),
        "text/html",
        html.into_bytes(),
    );
}

const EXT_PKG_INFO: &str = "Metadata-Version: 2.4\nName: cuda-ext\nVersion: 1.0\nRequires-Python: >=3.8\nRequires-Dist: beta>=1.0\nRequires-Dist: winonly; sys_platform == \"win32\"\nDynamic: home-page\n\nThe description.\n";

fn populate(server: &FixtureServer) -> Vec<u8> {
    let ext = sdist(
        "cuda-ext",
        "1.0",
        EXT_PKG_INFO,
        Some("[build-system]\nrequires = [\"setuptools>=61\", \"wheel\", \"beta\", \"cython>=3\"]\nbuild-backend = \"setuptools.build_meta\"\n"),
    );
    publish(
        server,
        "cuda-ext",
        &[
            File {
                filename: "cuda_ext-1.0.tar.gz".into(),
                bytes: ext.clone(),
            },
            File {
                filename: "cuda_ext-0.9.tar.gz".into(),
                bytes: sdist(
                    "cuda-ext",
                    "0.9",
                    "Metadata-Version: 2.1\nName: cuda-ext\nVersion: 0.9\n",
                    None,
                ),
            },
        ],
    );
    publish(
        server,
        "beta",
        &[
            wheel("beta", "1.0", "py3-none-any", &[]),
            wheel("beta", "2.0", "py3-none-any", &[]),
        ],
    );
    for (name, version) in [
        ("setuptools", "75.1.0"),
        ("wheel", "0.44.0"),
        ("ninja", "1.11.1.1"),
    ] {
        publish(server, name, &[wheel(name, version, "py3-none-any", &[])]);
    }
    publish(
        server,
        "cython",
        &[wheel("cython", "3.0.11", "py3-none-any", &[])],
    );
    // A release with a wheel for another Python only, and its sdist.
    let mut py312 = vec![wheel(
        "fused-op",
        "2.1",
        "cp312-cp312-manylinux_2_17_x86_64",
        &[],
    )];
    py312.push(File {
        filename: "fused_op-2.1.tar.gz".into(),
        bytes: sdist(
            "fused-op",
            "2.1",
            "Metadata-Version: 2.4\nName: fused-op\nVersion: 2.1\n",
            None,
        ),
    });
    publish(server, "fused-op", &py312);
    ext
}

fn request(client: &HttpClient, server: &FixtureServer, roots: &[&str]) -> LockRequest {
    LockRequest {
        target: Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.28".parse().unwrap(),
        )
        .unwrap(),
        requirements: roots
            .iter()
            .map(|r| Requirement::from_str(r).unwrap())
            .collect(),
        constraints: Default::default(),
        sources: vec![PackageSource::Index {
            index: SimpleIndex::new(client.clone(), server.url("/simple/").parse().unwrap()),
            plain_linux: false,
        }],
        redist: Vec::new(),
        system: None,
        recipe_digest: Digest::of_bytes(b"source build recipe"),
    }
}

fn build(entry: &str) -> SourceBuild {
    serde_json::from_str(entry).unwrap()
}

fn builds(entries: &[&str]) -> BuildRequest {
    BuildRequest {
        builds: entries.iter().map(|e| build(e)).collect(),
        toolchain: ["setuptools", "wheel", "ninja"]
            .iter()
            .map(|r| Requirement::from_str(r).unwrap())
            .collect(),
    }
}

/// The sdist is locked by its sha256 with the run requirements its PKG-INFO declares; the
/// toolchain and its `[build-system] requires` are build wheels, except what the image has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_entry_locks_its_sdist_and_what_its_build_needs() {
    let server = FixtureServer::start();
    let ext = populate(&server);
    let client = client();
    let request = request(&client, &server, &["cuda-ext==1.0"]);
    let lock = resolve_with_builds(
        &client,
        &request,
        &builds(&[r#"{"package": "cuda_ext", "version": "1.0"}"#]),
    )
    .await
    .unwrap();
    let kinds: Vec<(ArtifactKind, &str, &str)> = lock
        .artifacts
        .iter()
        .map(|a| (a.kind, a.name.as_str(), a.version.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (ArtifactKind::Wheel, "beta", "2.0"),
            (ArtifactKind::Sdist, "cuda-ext", "1.0"),
            (ArtifactKind::BuildWheel, "cython", "3.0.11"),
            (ArtifactKind::BuildWheel, "ninja", "1.11.1.1"),
            (ArtifactKind::BuildWheel, "setuptools", "75.1.0"),
            (ArtifactKind::BuildWheel, "wheel", "0.44.0"),
        ]
    );
    let sdist = lock.artifact("cuda-ext").unwrap();
    assert_eq!(sdist.sha256, Digest::of_bytes(&ext));
    assert_eq!(sdist.size, ext.len() as u64);
    assert_eq!(&*sdist.filename, "cuda_ext-1.0.tar.gz");
    assert_eq!(sdist.requires, ["beta>=1.0"]);
    assert_eq!(sdist.required_by, ["<root>"]);
    assert_eq!(
        lock.artifact("setuptools").unwrap().required_by,
        ["<build>"]
    );
    // What a lock with these kinds says is what a lock read back says.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.lock");
    lock.write(&path).unwrap();
    assert_eq!(cudastack::lock::Lockfile::read(&path).unwrap(), lock);
}

/// The build's requirements are resolved with the image's versions: `beta` stays at the
/// version the image has even though the builder alone would take 2.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_requirements_take_the_images_versions() {
    let server = FixtureServer::start();
    populate(&server);
    let client = client();
    let request = request(&client, &server, &["cuda-ext==1.0", "beta==1.0"]);
    let lock = resolve_with_builds(
        &client,
        &request,
        &builds(&[r#"{"package": "cuda-ext", "version": "1.0"}"#]),
    )
    .await
    .unwrap();
    let beta: Vec<_> = lock.artifacts.iter().filter(|a| a.name == "beta").collect();
    assert_eq!(beta.len(), 1, "{beta:?}");
    assert_eq!(
        (beta[0].kind, beta[0].version.as_str()),
        (ArtifactKind::Wheel, "1.0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_errors_of_build_entries_say_what_and_what_to_do() {
    let server = FixtureServer::start();
    populate(&server);
    let client = client();
    let lock = |root: &'static str, entry: &'static str| {
        let request = request(&client, &server, &[root]);
        let builds = builds(&[entry]);
        let client = client.clone();
        async move { resolve_with_builds(&client, &request, &builds).await }
    };
    // A release the index has no sdist of.
    let error = lock(
        "cuda-ext==1.1",
        r#"{"package": "cuda-ext", "version": "1.1"}"#,
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::SdistMissing { .. }), "{message}");
    assert!(
        message.contains("has no source distribution of 1.1; its sdists: 1.0, 0.9"),
        "{message}"
    );
    // Metadata 2.1: its Requires-Dist may not be what the build produces.
    let error = lock(
        "cuda-ext==0.9",
        r#"{"package": "cuda-ext", "version": "0.9"}"#,
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::SdistDynamic { .. }), "{message}");
    assert!(
        message.contains("Metadata-Version 2.1, older than 2.2"),
        "{message}"
    );
    assert!(
        message.contains("hint: list its run requirements in the entry"),
        "{message}"
    );
    // ... and with `requires:` it locks, those being the run requirements.
    let locked = lock(
        "cuda-ext==0.9",
        r#"{"package": "cuda-ext", "version": "0.9", "requires": ["beta<2"]}"#,
    )
    .await
    .unwrap();
    assert_eq!(locked.artifact("beta").unwrap().version, "1.0");
    assert_eq!(locked.artifact("cuda-ext").unwrap().requires, ["beta<2"]);
    // A package no source has.
    let error = lock(
        "nothere==1.0",
        r#"{"package": "nothere", "version": "1.0"}"#,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, LockError::PackageNotFound { .. }),
        "{error}"
    );
}

/// The sdist's bytes must be the ones the index lists the sha256 of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdist_whose_bytes_changed_is_refused() {
    let server = FixtureServer::start();
    populate(&server);
    server.add_bytes(
        "/files/cuda_ext-1.0.tar.gz",
        "application/octet-stream",
        sdist("cuda-ext", "1.0", EXT_PKG_INFO, None),
    );
    let client = client();
    let request = request(&client, &server, &["cuda-ext==1.0"]);
    let error = resolve_with_builds(
        &client,
        &request,
        &builds(&[r#"{"package": "cuda-ext", "version": "1.0"}"#]),
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::SdistHash { .. }), "{message}");
    assert!(message.contains("\n  Expected: sha256:"), "{message}");
}

/// Without `build:`, `lock` says why a package has no usable distribution and names the
/// `build:` entry that would compile it: an sdist only, or no wheel for this Python.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_build_lock_points_at_the_field() {
    let server = FixtureServer::start();
    populate(&server);
    let client = client();
    let error = resolve(&client, &request(&client, &server, &["cuda-ext==1.0"]))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, LockError::SdistOnly { .. }), "{message}");
    assert!(
        message.starts_with(
            "`cuda-ext` 1.0 is published only as a source distribution (`cuda_ext-1.0.tar.gz`)"
        ),
        "{message}"
    );
    assert!(
        message
            .contains("hint: add `build: [{package: cuda-ext, version: \"1.0\"}]` to the recipe"),
        "{message}"
    );
    let error = resolve(&client, &request(&client, &server, &["fused-op"]))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, LockError::NoCompatibleWheel { .. }),
        "{message}"
    );
    assert!(
        message.contains("2.1: only cp312-cp312-manylinux_2_17_x86_64"),
        "{message}"
    );
    assert!(
        message.contains("hint: `fused-op` 2.1 also has a source distribution (`fused_op-2.1.tar.gz`): add `build: [{package: fused-op, version: \"2.1\"}]`"),
        "{message}"
    );
}
