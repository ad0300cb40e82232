//! Lock and fetch against local fixture servers speaking the real formats: a PyTorch-style
//! PEP 503 HTML index (`linux_x86_64` wheels, `#sha256=` fragments), a PyPI-like HTML
//! index (requires-python, yanked files, PEP 658 metadata for some files and range reads
//! for the rest), NVIDIA redist manifests whose .tar.xz archives hold gcc-built ELF
//! libraries behind real symlink chains, and a mirror directory.

use crate::fetch_support;

use std::io::Read;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use cudastack::cache::BlobStore;
use cudastack::digest::Digest;
use cudastack::fetch::download::{Downloader, FetchItem};
use cudastack::fetch::http::{HttpClient, HttpConfig, RetryPolicy};
use cudastack::fetch::index::SimpleIndex;
use cudastack::fetch::mirror::MirrorDir;
use cudastack::fetch::progress::NoReporter;
use cudastack::fetch::redist::RedistRequest;
use cudastack::fetch::remote_zip::RemoteZip;
use cudastack::fetch::source::PackageSource;
use cudastack::lock::{resolve, ArtifactKind, LockError, LockRequest, Lockfile, Target};
use cudastack::platform::Platform;
use fetch_support::{gcc_shared_library, redist_tar_xz, sha256_hex, wheel_bytes, FixtureServer};
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

struct Wheel {
    filename: String,
    bytes: Vec<u8>,
    metadata: String,
    attributes: String,
    serve_metadata: bool,
}

fn wheel(name: &str, version: &str, tag: &str, headers: &[&str]) -> Wheel {
    let (bytes, metadata) = wheel_bytes(name, version, headers);
    Wheel {
        filename: format!("{}-{version}-{tag}.whl", name.replace('-', "_")),
        bytes,
        metadata,
        attributes: String::new(),
        serve_metadata: false,
    }
}

/// Publish `wheels` of one project as a PEP 503 page under `index` (files under /files/).
fn publish(server: &FixtureServer, index: &str, project: &str, wheels: &[Wheel]) {
    let mut html = format!("<!DOCTYPE html><html><body><h1>Links for {project}</h1>\n");
    for wheel in wheels {
        let file_path = format!("/files/{}", wheel.filename.replace('+', "%2B"));
        server.add_bytes(&file_path, "application/octet-stream", wheel.bytes.clone());
        let mut attributes = wheel.attributes.clone();
        if wheel.serve_metadata {
            server.add_bytes(
                &format!("{file_path}.metadata"),
                "text/plain",
                wheel.metadata.clone().into_bytes(),
            );
            attributes.push_str(&format!(
                " data-dist-info-metadata=\"sha256={}\"",
                sha256_hex(wheel.metadata.as_bytes())
            ));
        }
        html.push_str(&format!(
            "<a href=\"{file_path}#sha256={}\"{attributes}>{}</a><br/>\n",
            sha256_hex(&wheel.bytes),
            wheel.filename
        ));
    }
    html.push_str("</body></html>\n");
    server.add_bytes(
        &format!("{index}{project}/"),
        "text/html",
        html.into_bytes(),
    );
}

fn populate(server: &FixtureServer) {
    let mut alpha = wheel(
        "alpha",
        "1.0",
        "py3-none-any",
        &[
            "Requires-Dist: beta>=1.0",
            "Requires-Dist: gamma[fast]; python_version >= \"3.8\"",
            "Requires-Dist: delta; sys_platform == \"win32\"",
        ],
    );
    alpha.serve_metadata = true;
    publish(
        server,
        "/simple/",
        "alpha",
        &[alpha, wheel("alpha", "0.9", "py3-none-any", &[])],
    );

    let mut beta_new = wheel("beta", "2.0", "py3-none-any", &[]);
    beta_new.attributes = " data-requires-python=\"&gt;=3.12\"".into();
    let mut beta_yanked = wheel("beta", "1.2", "py3-none-any", &[]);
    beta_yanked.attributes = " data-yanked=\"broken\"".into();
    publish(
        server,
        "/simple/",
        "beta",
        &[
            wheel("beta", "1.0", "py3-none-any", &[]),
            wheel("beta", "1.1", "cp312-cp312-manylinux_2_17_x86_64", &[]),
            beta_yanked,
            beta_new,
        ],
    );
    publish(
        server,
        "/simple/",
        "gamma",
        &[wheel(
            "gamma",
            "1.0",
            "py3-none-any",
            &[
                "Provides-Extra: fast",
                "Requires-Dist: epsilon>=2; extra == \"fast\"",
            ],
        )],
    );
    publish(
        server,
        "/simple/",
        "epsilon",
        &[
            wheel("epsilon", "2.0", "py3-none-any", &[]),
            wheel("epsilon", "3.0rc1", "py3-none-any", &[]),
        ],
    );
    publish(
        server,
        "/simple/",
        "winonly",
        &[wheel("winonly", "1.0", "cp311-cp311-win_amd64", &[])],
    );
    // The PyTorch-style index: local versions, linux_x86_64 wheels.
    let torchlike = [
        wheel(
            "torchlike",
            "1.0+cu124",
            "cp311-cp311-linux_x86_64",
            &["Requires-Dist: beta"],
        ),
        wheel("torchlike", "1.0+cu124", "cp312-cp312-linux_x86_64", &[]),
    ];
    publish(server, "/whl/cu124/", "torchlike", &torchlike);
    // PyPI-like index has only an incompatible build.
    publish(
        server,
        "/simple/",
        "torchlike",
        &[wheel("torchlike", "1.0", "cp311-cp311-linux_x86_64", &[])],
    );
}

fn target() -> Target {
    Target::new(
        "3.11".parse().unwrap(),
        Platform::LinuxAmd64,
        "2.28".parse().unwrap(),
    )
    .unwrap()
}

fn index(
    client: &HttpClient,
    server: &FixtureServer,
    path: &str,
    plain_linux: bool,
) -> PackageSource {
    PackageSource::Index {
        index: SimpleIndex::new(client.clone(), server.url(path).parse().unwrap()),
        plain_linux,
    }
}

fn requirements(list: &[&str]) -> Vec<Requirement> {
    list.iter()
        .map(|r| Requirement::from_str(r).unwrap())
        .collect()
}

/// Serve CUDA and cuDNN redist manifests and archives. `None` without gcc.
fn publish_redist(server: &FixtureServer, dir: &std::path::Path) -> Option<()> {
    let cudart = gcc_shared_library(dir, "libcudart.so.12", "libcudart.so.12.4.127")?;
    let cudnn = gcc_shared_library(dir, "libcudnn.so.9", "libcudnn.so.9.1.0")?;
    let cudart_archive = redist_tar_xz(
        "cuda_cudart-linux-x86_64-12.4.127-archive",
        &cudart,
        "libcudart.so.12.4.127",
        &[
            ("libcudart.so.12", "libcudart.so.12.4.127"),
            ("libcudart.so", "libcudart.so.12"),
        ],
    );
    let cudnn_archive = redist_tar_xz(
        "cudnn-linux-x86_64-9.1.0.70_cuda12-archive",
        &cudnn,
        "libcudnn.so.9.1.0",
        &[
            ("libcudnn.so.9", "libcudnn.so.9.1.0"),
            ("libcudnn.so", "libcudnn.so.9"),
        ],
    );
    let cudart_path = "cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz";
    server.add_bytes(
        &format!("/compute/cuda/redist/{cudart_path}"),
        "application/x-xz",
        cudart_archive.clone(),
    );
    let cuda_manifest = format!(
        r#"{{"release_date":"2024-04-15","release_label":"12.4.1","release_product":"cuda",
        "cuda_cudart":{{"name":"CUDA Runtime (cudart)","license":"CUDA Toolkit","license_path":"cuda_cudart/LICENSE.txt","version":"12.4.127",
          "linux-x86_64":{{"relative_path":"{cudart_path}","sha256":"{}","md5":"0","size":"{}"}}}}}}"#,
        sha256_hex(&cudart_archive),
        cudart_archive.len()
    );
    server.add_bytes(
        "/compute/cuda/redist/redistrib_12.4.1.json",
        "application/json",
        cuda_manifest.into_bytes(),
    );
    let cudnn_path = "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz";
    server.add_bytes(
        &format!("/compute/cudnn/redist/{cudnn_path}"),
        "application/x-xz",
        cudnn_archive.clone(),
    );
    let cudnn_manifest = format!(
        r#"{{"release_date":"2024-04-15","release_label":"9.1.0","release_product":"cudnn",
        "cudnn":{{"name":"NVIDIA CUDA Deep Neural Network library","license":"cudnn","version":"9.1.0.70",
          "linux-x86_64":{{"cuda12":{{"relative_path":"{cudnn_path}","sha256":"{}","md5":"0","size":"{}"}},
                          "cuda11":{{"relative_path":"cudnn/linux-x86_64/none.tar.xz","sha256":"{}","md5":"0","size":"1"}}}},
          "cuda_variant":["11","12"]}}}}"#,
        sha256_hex(&cudnn_archive),
        cudnn_archive.len(),
        sha256_hex(b"none"),
    );
    server.add_bytes(
        "/compute/cudnn/redist/redistrib_9.1.0.json",
        "application/json",
        cudnn_manifest.into_bytes(),
    );
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_fixture_indexes_and_redist_then_fetches_everything() {
    let server = FixtureServer::start();
    populate(&server);
    let dir = tempfile::tempdir().unwrap();
    let with_redist = publish_redist(&server, dir.path()).is_some();
    let client = client();
    let mut redist = Vec::new();
    if with_redist {
        redist.push(RedistRequest {
            manifest_url: server
                .url("/compute/cuda/redist/redistrib_12.4.1.json")
                .parse()
                .unwrap(),
            components: vec!["cuda_cudart".into()],
            platform: "linux-x86_64".into(),
            cuda_variant: None,
        });
        redist.push(RedistRequest {
            manifest_url: server
                .url("/compute/cudnn/redist/redistrib_9.1.0.json")
                .parse()
                .unwrap(),
            components: vec!["cudnn".into()],
            platform: "linux-x86_64".into(),
            cuda_variant: Some("cuda12".into()),
        });
    }
    let request = LockRequest {
        target: target(),
        requirements: requirements(&["alpha", "torchlike==1.0+cu124"]),
        sources: vec![
            index(&client, &server, "/whl/cu124/", true),
            index(&client, &server, "/simple/", false),
        ],
        constraints: Default::default(),
        redist,
        system: None,
        recipe_digest: Digest::of_bytes(b"fixture recipe"),
        byte_digest: None,
        as_of: None,
    };
    let lock = resolve(&client, &request).await.unwrap();
    let wheels: Vec<(String, String)> = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel)
        .map(|a| (a.name.clone(), a.version.clone()))
        .collect();
    assert_eq!(
        wheels,
        [
            ("alpha".to_string(), "1.0".to_string()),
            ("beta".into(), "1.0".into()),
            ("epsilon".into(), "2.0".into()),
            ("gamma".into(), "1.0".into()),
            ("torchlike".into(), "1.0+cu124".into()),
        ]
    );
    let torchlike = lock.artifact("torchlike").unwrap();
    assert_eq!(
        torchlike.filename,
        "torchlike-1.0+cu124-cp311-cp311-linux_x86_64.whl"
    );
    assert_eq!(torchlike.source, server.url("/whl/cu124/"));
    let epsilon = lock.artifact("epsilon").unwrap();
    assert_eq!(epsilon.required_by, ["gamma[fast]"]);
    assert_eq!(epsilon.source, server.url("/simple/"));
    let beta = lock.artifact("beta").unwrap();
    assert_eq!(beta.required_by, ["alpha", "torchlike"]);
    assert!(lock
        .artifact("alpha")
        .unwrap()
        .requires
        .contains(&"gamma[fast]".to_string()));
    assert!(
        lock.artifact("delta").is_none(),
        "win32-only dependency excluded"
    );
    // HTML indexes carry no sizes: they were learned with range requests.
    assert!(beta.size > 100);

    // Resolution read alpha's PEP 658 file and range-read the others.
    let log = server.log();
    assert!(log
        .iter()
        .any(|r| r.path == "/files/alpha-1.0-py3-none-any.whl.metadata"));
    assert!(log
        .iter()
        .any(|r| r.path == "/files/beta-1.0-py3-none-any.whl"
            && r.range.as_deref().is_some_and(|r| r.starts_with("bytes=-"))));
    assert!(
        !log.iter()
            .any(|r| r.path == "/files/alpha-1.0-py3-none-any.whl" && r.range.is_none()),
        "no full wheel download while locking"
    );
    assert!(log.iter().any(|r| r.path == "/simple/alpha/"
        && r.accept
            .as_deref()
            .is_some_and(|a| a.contains("application/vnd.pypi.simple.v1+json"))));

    // The lock file round-trips byte for byte.
    let lock_path = dir.path().join("fixture.lock");
    lock.write(&lock_path).unwrap();
    let read = Lockfile::read(&lock_path).unwrap();
    assert_eq!(read, lock);
    assert!(!read.is_stale(&Digest::of_bytes(b"fixture recipe")));
    assert!(read.is_stale(&Digest::of_bytes(b"edited recipe")));

    // Fetch every artifact by hash.
    let store = BlobStore::open(dir.path().join("cache")).unwrap();
    let downloader = Downloader::new(client.clone(), store.clone(), Arc::new(NoReporter));
    let items: Vec<FetchItem> = read.fetch_items(std::path::Path::new(""));
    let paths = downloader.fetch_all(&items).await.unwrap();
    assert_eq!(paths.len(), lock.artifacts.len());

    if !with_redist {
        return;
    }
    let cudnn = lock.artifact("cudnn").unwrap();
    assert_eq!(cudnn.version, "9.1.0.70");
    assert_eq!(cudnn.variant.as_deref(), Some("cuda12"));
    assert_eq!(cudnn.platform.as_deref(), Some("linux-x86_64"));
    let blob = store.path(&cudnn.sha256);
    let mut archive = tar::Archive::new(liblzma::read::XzDecoder::new(
        std::fs::File::open(blob).unwrap(),
    ));
    let mut links = Vec::new();
    let mut elf = false;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if entry.header().entry_type().is_symlink() {
            links.push((
                path,
                entry
                    .link_name()
                    .unwrap()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            ));
        } else if path.ends_with("libcudnn.so.9.1.0") {
            let mut magic = [0u8; 4];
            entry.read_exact(&mut magic).unwrap();
            elf = magic == *b"\x7fELF";
        }
    }
    assert!(elf, "the archive holds a real ELF library");
    assert_eq!(
        links,
        [
            (
                "cudnn-linux-x86_64-9.1.0.70_cuda12-archive/lib/libcudnn.so.9".to_string(),
                "libcudnn.so.9.1.0".to_string()
            ),
            (
                "cudnn-linux-x86_64-9.1.0.70_cuda12-archive/lib/libcudnn.so".to_string(),
                "libcudnn.so.9".to_string()
            ),
        ]
    );
    assert_eq!(lock.artifact("cuda_cudart").unwrap().version, "12.4.127");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_linux_wheels_are_refused_on_pypi_like_indexes() {
    let server = FixtureServer::start();
    populate(&server);
    let client = client();
    let request = LockRequest {
        target: target(),
        requirements: requirements(&["torchlike"]),
        sources: vec![index(&client, &server, "/simple/", false)],
        constraints: Default::default(),
        redist: vec![],
        system: None,
        recipe_digest: Digest::of_bytes(b"x"),
        byte_digest: None,
        as_of: None,
    };
    let error = resolve(&client, &request).await.unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, LockError::NoCompatibleWheel { .. }),
        "{message}"
    );
    assert!(
        message.contains("`torchlike`")
            && message.contains("CPython 3.11 on manylinux_2_28_x86_64"),
        "{message}"
    );
    assert!(message.contains("cp311-cp311-linux_x86_64"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precise_errors_for_platform_and_missing_packages() {
    let server = FixtureServer::start();
    populate(&server);
    let client = client();
    let lock = |reqs: &[&str]| LockRequest {
        target: target(),
        requirements: requirements(reqs),
        sources: vec![index(&client, &server, "/simple/", false)],
        constraints: Default::default(),
        redist: vec![],
        system: None,
        recipe_digest: Digest::of_bytes(b"x"),
        byte_digest: None,
        as_of: None,
    };
    let error = resolve(&client, &lock(&["winonly"])).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("`winonly`") && message.contains("cp311-cp311-win_amd64"),
        "{message}"
    );

    let error = resolve(&client, &lock(&["nonexistent-pkg"]))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, LockError::PackageNotFound { .. }),
        "{message}"
    );
    assert!(
        message.contains("nonexistent-pkg") && message.contains(&server.url("/simple/")),
        "{message}"
    );

    // Only yanked or too-new versions satisfy: no solution, and the report says why.
    let error = resolve(&client, &lock(&["beta>1.1"])).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("beta"), "{message}");

    // An exact pin may take a yanked file (pip's rule).
    let pinned = resolve(&client, &lock(&["beta==1.2"])).await.unwrap();
    assert_eq!(pinned.artifact("beta").unwrap().version, "1.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_directory_locks_with_file_urls() {
    let mirror = tempfile::tempdir().unwrap();
    for wheel in [
        wheel(
            "alpha",
            "1.0",
            "py3-none-any",
            &["Requires-Dist: beta>=1.0"],
        ),
        wheel("beta", "1.0", "py3-none-any", &[]),
        wheel("beta", "1.1", "cp311-cp311-manylinux2014_x86_64", &[]),
    ] {
        std::fs::write(mirror.path().join(&wheel.filename), &wheel.bytes).unwrap();
    }
    let client = client();
    let source = PackageSource::Mirror(MirrorDir::open(mirror.path()).unwrap());
    let request = LockRequest {
        target: target(),
        requirements: requirements(&["alpha"]),
        sources: vec![source],
        constraints: Default::default(),
        redist: vec![],
        system: None,
        recipe_digest: Digest::of_bytes(b"x"),
        byte_digest: None,
        as_of: None,
    };
    let lock = resolve(&client, &request).await.unwrap();
    let beta = lock.artifact("beta").unwrap();
    assert_eq!(beta.version, "1.1");
    assert_eq!(beta.url.as_url().unwrap().scheme(), "file");
    assert_eq!(
        beta.sha256,
        Digest::of_bytes(&std::fs::read(mirror.path().join(&beta.filename)).unwrap())
    );
}

#[tokio::test]
async fn remote_zip_reads_entries_and_streams_them() {
    let server = FixtureServer::start();
    let (bytes, metadata) = wheel_bytes("zipped", "1.0", &["Requires-Dist: x"]);
    server.add_bytes("/zipped.whl", "application/octet-stream", bytes.clone());
    let client = client();
    let zip = RemoteZip::open(&client, server.url("/zipped.whl").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(zip.size(), bytes.len() as u64);
    assert_eq!(zip.entries().len(), 3);
    let text = zip
        .read_entry("zipped-1.0.dist-info/METADATA")
        .await
        .unwrap();
    assert_eq!(String::from_utf8(text).unwrap(), metadata);
    let mut reader = zip.entry_reader("zipped/__init__.py").await.unwrap();
    let streamed = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        reader.read_to_end(&mut out).map(|_| out)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(streamed, b"VALUE = 1\n");
    let error = zip.read_entry("nope").await.unwrap_err();
    assert!(error.to_string().contains("nope") && error.to_string().contains("/zipped.whl"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrored_redist_manifest_resolves_to_local_archives() {
    let mirror = tempfile::tempdir().unwrap();
    let Some(library) = gcc_shared_library(mirror.path(), "libnvrtc.so.12", "libnvrtc.so.12.4.127")
    else {
        return;
    };
    let archive = redist_tar_xz(
        "cuda_nvrtc-archive",
        &library,
        "libnvrtc.so.12.4.127",
        &[("libnvrtc.so.12", "libnvrtc.so.12.4.127")],
    );
    std::fs::create_dir_all(mirror.path().join("cuda_nvrtc")).unwrap();
    std::fs::write(mirror.path().join("cuda_nvrtc/a.tar.xz"), &archive).unwrap();
    let manifest = format!(
        r#"{{"release_label":"12.4.1","cuda_nvrtc":{{"name":"NVRTC","version":"12.4.127","linux-x86_64":{{"relative_path":"cuda_nvrtc/a.tar.xz","sha256":"{}","md5":"0","size":"{}"}}}}}}"#,
        sha256_hex(&archive),
        archive.len()
    );
    let manifest_path = mirror.path().join("redistrib_12.4.1.json");
    std::fs::write(&manifest_path, manifest).unwrap();
    let client = client();
    let request = LockRequest {
        target: target(),
        requirements: vec![],
        sources: vec![],
        constraints: Default::default(),
        redist: vec![RedistRequest {
            manifest_url: url::Url::from_file_path(&manifest_path).unwrap(),
            components: vec!["cuda_nvrtc".into()],
            platform: "linux-x86_64".into(),
            cuda_variant: None,
        }],
        system: None,
        recipe_digest: Digest::of_bytes(b"x"),
        byte_digest: None,
        as_of: None,
    };
    let lock = resolve(&client, &request).await.unwrap();
    let nvrtc = lock.artifact("cuda_nvrtc").unwrap();
    assert!(
        nvrtc.url.as_url().unwrap().scheme() == "file"
            && nvrtc
                .url
                .as_url()
                .unwrap()
                .path()
                .ends_with("cuda_nvrtc/a.tar.xz"),
        "{}",
        nvrtc.url
    );
    let store = BlobStore::open(mirror.path().join("cache")).unwrap();
    // `file://` URLs are read only under a mirror the user named.
    let downloader = Downloader::new(client, store.clone(), Arc::new(NoReporter))
        .mirrors(vec![mirror.path().to_path_buf()]);
    let item = FetchItem {
        name: "nvrtc".into(),
        url: nvrtc.url.as_url().unwrap().clone(),
        sha256: nvrtc.sha256,
        size: Some(nvrtc.size),
    };
    assert_eq!(
        std::fs::read(downloader.fetch(&item).await.unwrap()).unwrap(),
        archive
    );
}

/// Issue 24: a recipe's `torch: { version: "2.4" }` asked for `torch==2.4` and locked
/// 2.4.0; it is the 2.4 series and locks its newest release that fits, 2.4.1, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_part_torch_version_locks_the_series_newest_release() {
    let mirror = tempfile::tempdir().unwrap();
    for version in ["2.4.0", "2.4.1", "2.5.0"] {
        let wheel = wheel(
            "torch",
            version,
            "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
            &[],
        );
        std::fs::write(mirror.path().join(&wheel.filename), &wheel.bytes).unwrap();
    }
    // Every lock has pip (the image's installer): a stand-in of it in the mirror.
    let pip = wheel("pip", "24.2", "py3-none-any", &[]);
    std::fs::write(mirror.path().join(&pip.filename), &pip.bytes).unwrap();
    let recipe = cudastack::recipe::Recipe::parse(
        "name: series\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4\" }\n",
        std::path::Path::new("series.yaml"),
    )
    .unwrap();
    let client = client();
    let resolved = cudastack::matrix::ResolvedRecipe::new(
        cudastack::matrix::Matrix::embedded(),
        recipe,
        std::path::Path::new("series.yaml"),
    )
    .unwrap();
    let mut request =
        cudastack::lock::inputs::lock_request(&resolved, &client, Some(mirror.path())).unwrap();
    assert_eq!(request.requirements[0].to_string(), "torch==2.4.1");
    // The mirror alone: this test never reaches PyPI.
    request.sources.truncate(1);
    let lock = resolve(&client, &request).await.unwrap();
    assert_eq!(lock.artifact("torch").unwrap().version, "2.4.1");
}

/// The same through `cudastack lock --mirror`: the output names the release the series
/// resolved to, and the lock file records it exactly.
#[test]
fn lock_of_a_torch_series_says_which_release_it_locked() {
    let work = tempfile::tempdir().unwrap();
    let mirror = work.path().join("mirror");
    std::fs::create_dir(&mirror).unwrap();
    for version in ["2.4.0", "2.4.1", "2.5.0"] {
        let wheel = wheel(
            "torch",
            version,
            "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
            &[],
        );
        std::fs::write(mirror.join(&wheel.filename), &wheel.bytes).unwrap();
    }
    let recipe = work.path().join("series.yaml");
    std::fs::write(
        &recipe,
        "name: series\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"530.30.02\"\ncuda: { version: \"12.1\" }\ntorch: { version: \"2.4\" }\n",
    )
    .unwrap();
    let output = assert_cmd::Command::cargo_bin("cudastack")
        .unwrap()
        .arg("lock")
        .arg(&recipe)
        .arg("--mirror")
        .arg(&mirror)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: torch \"2.4\" means the 2.4 series; picked 2.4.1"),
        "{stderr}"
    );
    let lock = Lockfile::read(&work.path().join("series.lock")).unwrap();
    assert_eq!(lock.artifact("torch").unwrap().version, "2.4.1");
}
