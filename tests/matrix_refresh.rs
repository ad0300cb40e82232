//! `cudastack matrix refresh` end to end against a local PEP 691 index on 127.0.0.1 that
//! serves small but real wheels (zip files with METADATA and a libtorch_python.so holding
//! an arch list), so the whole path runs: JSON listing, PEP 658 metadata where the index
//! offers it, HTTP range reads of the wheel where it does not, the cuda-toolkit
//! metapackage, and the streamed arch scan. A second test re-derives real rows from PyPI
//! and compares them with the committed data file.

use crate::fetch_support;

use fetch_support::gate;

use std::io::Write;

use assert_cmd::Command;
use fetch_support::FixtureServer;
use sha2::{Digest as _, Sha256};

fn wheel(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut buffer = std::io::Cursor::new(Vec::new());
    {
        let mut zip = zip::ZipWriter::new(&mut buffer);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, bytes) in files {
            zip.start_file(*name, options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }
    buffer.into_inner()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn file_entry(
    server: &FixtureServer,
    path: &str,
    filename: &str,
    bytes: &[u8],
    metadata: Option<&[u8]>,
) -> serde_json::Value {
    let mut entry = serde_json::json!({
        "filename": filename,
        "url": server.url(path),
        "hashes": { "sha256": sha256(bytes) },
        "size": bytes.len(),
        "upload-time": "2024-09-04T19:32:31.123Z",
    });
    if let Some(metadata) = metadata {
        entry["core-metadata"] = serde_json::json!({ "sha256": sha256(metadata) });
    }
    entry
}

const TORCH_241: &str = "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\nRequires-Dist: filelock\nRequires-Dist: nvidia-cuda-runtime-cu12==12.1.105; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: nvidia-cublas-cu12==12.1.3.1; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\nREADME\n";
const TORCH_2110: &str = "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\nRequires-Dist: cuda-toolkit[cublas,cudart]==13.0.2; platform_system == \"Linux\"\nRequires-Dist: nvidia-cudnn-cu13==9.19.0.56; platform_system == \"Linux\"\n\n";
const TOOLKIT: &str = "Metadata-Version: 2.1\nName: cuda-toolkit\nVersion: 13.0.2\nRequires-Dist: nvidia-cuda-runtime==13.0.96.*; extra == \"cudart\"\nRequires-Dist: nvidia-cublas==13.1.0.3.*; extra == \"cublas\"\n\n";

#[test]
fn refresh_against_a_local_index_derives_every_field() {
    let server = FixtureServer::start();
    // A compressible library body around the arch string, so the scan crosses chunks.
    let mut library = vec![0x7fu8, b'E', b'L', b'F'];
    library.extend(std::iter::repeat_n(b"padding ".as_slice(), 300_000).flatten());
    library.extend_from_slice(b"\0sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90\0");
    library.extend(std::iter::repeat_n(b"trailer ".as_slice(), 1000).flatten());

    let w241_311 = wheel(&[
        ("torch/__init__.py", b""),
        ("torch/lib/libtorch_python.so", &library),
        ("torch-2.4.1.dist-info/METADATA", TORCH_241.as_bytes()),
    ]);
    let w241_312 = wheel(&[("torch-2.4.1.dist-info/METADATA", TORCH_241.as_bytes())]);
    let w2110 = wheel(&[
        (
            "torch/lib/libtorch_python.so",
            b"x sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120 y",
        ),
        ("torch-2.11.0.dist-info/METADATA", TORCH_2110.as_bytes()),
    ]);
    let toolkit = wheel(&[("cuda_toolkit-13.0.2.dist-info/METADATA", TOOLKIT.as_bytes())]);

    let files = [
        (
            "/files/torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl",
            &w241_311,
        ),
        (
            "/files/torch-2.4.1-cp312-cp312-manylinux1_x86_64.whl",
            &w241_312,
        ),
        (
            "/files/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            &w2110,
        ),
        ("/files/cuda_toolkit-13.0.2-py2.py3-none-any.whl", &toolkit),
    ];
    for (path, bytes) in files {
        server.add_bytes(path, "application/octet-stream", bytes.clone());
    }
    server.add_bytes(
        "/files/cuda_toolkit-13.0.2-py2.py3-none-any.whl.metadata",
        "text/plain",
        TOOLKIT.as_bytes().to_vec(),
    );
    let torch_page = serde_json::json!({
        "meta": { "api-version": "1.1" },
        "name": "torch",
        "files": [
            file_entry(&server, files[0].0, "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl", &w241_311, None),
            file_entry(&server, files[1].0, "torch-2.4.1-cp312-cp312-manylinux1_x86_64.whl", &w241_312, None),
            file_entry(&server, files[2].0, "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", &w2110, None),
            // Not linux x86_64, and a pre-release: neither becomes a row.
            { "filename": "torch-2.4.1-cp311-none-macosx_11_0_arm64.whl", "url": server.url("/nope.whl"), "hashes": {} },
            { "filename": "torch-2.12.0rc1-cp311-cp311-manylinux_2_28_x86_64.whl", "url": server.url("/nope2.whl"), "hashes": {} },
        ],
    });
    let toolkit_page = serde_json::json!({
        "meta": { "api-version": "1.1" },
        "name": "cuda-toolkit",
        "files": [file_entry(&server, files[3].0, "cuda_toolkit-13.0.2-py2.py3-none-any.whl", &toolkit, Some(TOOLKIT.as_bytes()))],
    });
    server.add_bytes(
        "/simple/torch/",
        "application/vnd.pypi.simple.v1+json",
        torch_page.to_string().into_bytes(),
    );
    server.add_bytes(
        "/simple/cuda-toolkit/",
        "application/vnd.pypi.simple.v1+json",
        toolkit_page.to_string().into_bytes(),
    );

    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("torch-pypi.json");
    let run = |output: &std::path::Path| {
        Command::cargo_bin("cudastack")
            .unwrap()
            .args([
                "matrix",
                "refresh",
                "--index",
                &server.url("/simple/"),
                "--output",
                output.to_str().unwrap(),
            ])
            .assert()
            .success();
    };
    run(&output);
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    let releases = data["releases"].as_array().unwrap();
    assert_eq!(releases.len(), 2, "{data:#}");

    let newest = &releases[0];
    assert_eq!(newest["torch"], "2.11.0");
    assert_eq!(newest["cuda"], "13.0");
    assert_eq!(newest["variant"], "cu130");
    assert_eq!(newest["cuda_runtime"], "13.0.96");
    assert_eq!(newest["cudnn"], "9.19.0.56");
    assert_eq!(newest["glibc"], "2.28");
    assert_eq!(newest["ptx"], true);
    assert_eq!(
        newest["arch_list"],
        serde_json::json!(["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"])
    );

    let older = &releases[1];
    assert_eq!(older["torch"], "2.4.1");
    assert_eq!(older["cuda"], "12.1");
    assert_eq!(older["cuda_runtime"], "12.1.105");
    assert_eq!(older["cudnn"], "9.1.0.70");
    assert_eq!(older["python"], serde_json::json!(["3.11", "3.12"]));
    assert_eq!(older["glibc"], "2.5");
    assert_eq!(
        older["arch_list"],
        serde_json::json!(["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"])
    );
    assert_eq!(older["pins"]["nvidia-cublas-cu12"], "12.1.3.1");
    assert!(older["source"]
        .as_str()
        .unwrap()
        .contains(&sha256(&w241_311)));

    let requests: Vec<String> = server
        .log()
        .iter()
        .map(|r| {
            format!(
                "GET {}{}",
                r.path,
                r.range
                    .as_ref()
                    .map(|range| format!(" Range: {range}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    // No .metadata for torch: METADATA and the library came through range reads, and the
    // 2.4.1 wheel was never downloaded whole.
    assert!(
        requests
            .iter()
            .any(|r| r
                .starts_with("GET /files/torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl Range:")),
        "{requests:#?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r == "GET /files/torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl"),
        "{requests:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r == "GET /files/cuda_toolkit-13.0.2-py2.py3-none-any.whl.metadata"),
        "{requests:#?}"
    );

    // A second refresh is byte-identical and reuses the scanned arch lists (no new range
    // reads of libtorch).
    let before = std::fs::read(&output).unwrap();
    let scans_before = requests.len();
    run(&output);
    assert_eq!(std::fs::read(&output).unwrap(), before);
    let new_requests: Vec<String> = server
        .log()
        .into_iter()
        .skip(scans_before)
        .map(|r| format!("{} {:?}", r.path, r.range))
        .collect();
    let range_reads = new_requests.iter().filter(|r| r.contains("Some(")).count();
    // Only the METADATA range reads (end of central directory, directory, member) remain.
    assert!(range_reads <= 2 * 3, "{new_requests:#?}");
}

/// Re-derive a few rows from PyPI itself and compare with the committed data file: the
/// embedded matrix is what PyPI says, not what someone typed.
#[test]
fn committed_rows_match_pypi() {
    if gate::switch("CUDASTACK_OFFLINE_TESTS", |_| true, "this test reads PyPI") {
        return;
    }
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../data/torch-pypi.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("t.json");
    // The newest releases only (each arch scan range-reads ~10 MB of libtorch_python.so).
    let since = "2.14.1";
    Command::cargo_bin("cudastack")
        .unwrap()
        .args([
            "matrix",
            "refresh",
            "--since",
            since,
            "--output",
            output.to_str().unwrap(),
        ])
        .assert()
        .success();
    let fresh: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    let fresh_rows = fresh["releases"].as_array().unwrap();
    assert!(fresh_rows.len() >= 2);
    for row in fresh_rows {
        let version = row["torch"].as_str().unwrap();
        let Some(old) = committed["releases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["torch"] == version)
        else {
            eprintln!(
                "torch {version} is newer than the committed data: run `cudastack matrix refresh`"
            );
            continue;
        };
        for field in [
            "cuda",
            "cuda_runtime",
            "cudnn",
            "pins",
            "python",
            "glibc",
            "variant",
            "arch_list",
            "ptx",
        ] {
            assert_eq!(
                row[field], old[field],
                "torch {version}: `{field}` differs from PyPI"
            );
        }
    }
}

const TORCH_299: &str = "Metadata-Version: 2.1\nName: torch\nVersion: 2.99.0\nRequires-Dist: nvidia-cuda-runtime-cu12==12.4.127; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\n";

/// A local index with one torch release no embedded matrix has (2.99.0, CUDA 12.4).
pub(crate) fn index_with_torch_2_99() -> FixtureServer {
    let server = FixtureServer::start();
    let name = "torch-2.99.0-cp311-cp311-manylinux_2_28_x86_64.whl";
    let path = format!("/files/{name}");
    let bytes = wheel(&[
        (
            "torch/lib/libtorch_python.so",
            b"\0sm_80 sm_86 sm_90 compute_90\0",
        ),
        ("torch-2.99.0.dist-info/METADATA", TORCH_299.as_bytes()),
    ]);
    server.add_bytes(&path, "application/octet-stream", bytes.clone());
    server.add_bytes(
        &format!("{path}.metadata"),
        "text/plain",
        TORCH_299.as_bytes().to_vec(),
    );
    let page = serde_json::json!({
        "meta": { "api-version": "1.1" },
        "name": "torch",
        "files": [file_entry(&server, &path, name, &bytes, Some(TORCH_299.as_bytes()))],
    });
    server.add_bytes(
        "/simple/torch/",
        "application/vnd.pypi.simple.v1+json",
        page.to_string().into_bytes(),
    );
    server
}

/// `cudastack ARGS` with the cache at `cache`: (exit code, stdout, stderr).
fn with_cache(cache: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    // Run in the cache directory, so nothing can land in this checkout's data/ (what
    // `matrix refresh` without `--output` once wrote to).
    let output = Command::cargo_bin("cudastack")
        .unwrap()
        .current_dir(cache)
        .env("CUDASTACK_CACHE_DIR", cache)
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

const SOLVE_2_99: &[&str] = &[
    "solve",
    "--json",
    "--torch",
    "2.99.0",
    "--driver",
    "550.54.15",
    "--gpu",
    "RTX 3090",
];

/// Issue 24: a refresh by a user of an installed binary goes to the cache, and every
/// command reads it from there.
#[test]
fn a_refresh_lives_in_the_cache_and_solve_uses_it() {
    let server = index_with_torch_2_99();
    let cache = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = with_cache(
        cache.path(),
        &["matrix", "refresh", "--index", &server.url("/simple/")],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let file = cache.path().join("matrix").join("torch-pypi.json");
    assert!(stdout.contains(&file.display().to_string()), "{stdout}");
    assert!(stdout.contains("now use it"), "{stdout}");
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(data["releases"][0]["torch"], "2.99.0");
    let generated = data["generated"].as_str().unwrap().to_string();

    let (code, stdout, stderr) = with_cache(cache.path(), SOLVE_2_99);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let solution: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(solution["candidates"][0]["torch_build"], "2.99.0+cu124");
    assert_eq!(solution["candidates"][0]["accepted"], true);
    assert_eq!(solution["matrix"]["source"], "refreshed");
    assert_eq!(solution["matrix"]["generated"], generated.as_str());
    assert!(stderr.contains("matrix: refreshed"), "{stderr}");

    let (code, stdout, _) = with_cache(cache.path(), &["matrix", "--torch", "2.99.0"]);
    assert_eq!(code, 0);
    let header = stdout.lines().next().unwrap();
    assert_eq!(
        header,
        format!(
            "matrix: refreshed {generated} from 127.0.0.1, {}",
            file.display()
        )
    );
    assert!(stdout.contains("2.99.0"), "{stdout}");

    // Another cache: the embedded matrix, which has no torch 2.99.0.
    let empty = tempfile::tempdir().unwrap();
    let (code, stdout, _) = with_cache(empty.path(), SOLVE_2_99);
    assert_eq!(code, 1, "{stdout}");
    let solution: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(solution["matrix"]["source"], "embedded");
}

#[test]
fn a_corrupt_refreshed_matrix_is_an_error_that_names_the_file_and_the_fix() {
    let cache = tempfile::tempdir().unwrap();
    let file = cache.path().join("matrix").join("torch-pypi.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    for text in ["{\"releases\": [", "{\"unrelated\": true}"] {
        std::fs::write(&file, text).unwrap();
        for args in [
            SOLVE_2_99,
            &["validate", "recipes/torch2.4.1-cu121-py3.11.yaml"][..],
            &["matrix"][..],
        ] {
            let output = Command::cargo_bin("cudastack")
                .unwrap()
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("CUDASTACK_CACHE_DIR", cache.path())
                .args(args)
                .output()
                .unwrap();
            let stderr = String::from_utf8(output.stderr).unwrap();
            assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
            for fragment in [
                format!(
                    "the refreshed matrix `{}` is not a valid cudastack torch matrix",
                    file.display()
                ),
                "run `cudastack matrix refresh` again".to_string(),
                format!("delete `{}`", file.display()),
            ] {
                assert!(stderr.contains(&fragment), "{args:?}: {stderr}");
            }
        }
    }
}

#[test]
fn a_refreshed_matrix_older_than_the_embedded_one_is_ignored_with_a_note() {
    let cache = tempfile::tempdir().unwrap();
    let file = cache.path().join("matrix").join("torch-pypi.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mut old: serde_json::Value =
        serde_json::from_str(include_str!("../data/torch-pypi.json")).unwrap();
    old["generated"] = "2020-01-01".into();
    std::fs::write(&file, old.to_string()).unwrap();
    let (code, stdout, stderr) = with_cache(cache.path(), &["matrix"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with("matrix: embedded, generated "),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "not using the refreshed matrix `{}` (generated 2020-01-01)",
            file.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("is newer"), "{stderr}");
}
