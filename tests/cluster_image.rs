//! An image from `cudastack build` with default settings is one the cluster runtimes can
//! run: NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES set, gzip layers, a layer
//! count far below Docker's 125 (`cluster::readiness`). Apptainer, when installed, builds
//! a SIF from the OCI layout and runs the image's Python in it.
//!
//! The stack is built for real from a local mirror (the air-gapped source) of small
//! CUDA-shaped wheels made here: real gcc-built ELF libraries with SONAMEs, packed as
//! nvidia-* wheels with valid RECORDs (NVIDIA's real libraries are far too large for a
//! test; the build and its audit only read ELF headers). Needs root and mmdebstrap for
//! the Debian base (cached across runs, shared with the other build tests); otherwise it
//! says why and stops. enroot and Apptainer are not packaged in Debian, so those imports
//! are skipped here with a printed reason.

mod e2e_support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::cluster::readiness::{self, MAX_LAYERS};
use sha2::{Digest as _, Sha256};

fn gcc_lib(dir: &Path, soname: &str, needed: &[&str]) -> Vec<u8> {
    let source = dir.join(format!("{soname}.c"));
    let symbol = soname.replace(['.', '-'], "_");
    std::fs::write(&source, format!("int {symbol}(void) {{ return 42; }}\n")).unwrap();
    let out = dir.join(soname);
    let mut command = Command::new("gcc");
    command
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-Wl,--no-as-needed");
    for name in needed {
        command.arg(dir.join(name));
    }
    assert!(
        command.status().unwrap().success(),
        "gcc failed for {soname}"
    );
    std::fs::read(out).unwrap()
}

fn write_wheel(dir: &Path, project: &str, version: &str, files: &[(&str, Vec<u8>)]) {
    let dist = project.replace('-', "_");
    let dist_info = format!("{dist}-{version}.dist-info");
    let mut all: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(n, b)| (n.to_string(), b.clone()))
        .collect();
    all.push((
        format!("{dist_info}/METADATA"),
        format!("Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n\n").into_bytes(),
    ));
    all.push((format!("{dist_info}/WHEEL"), b"Wheel-Version: 1.0\nGenerator: cudastack-test\nRoot-Is-Purelib: false\nTag: py3-none-manylinux2014_x86_64\n".to_vec()));
    let mut record = String::new();
    for (name, bytes) in &all {
        let hash = cudastack::install::record::urlsafe_b64_nopad(&Sha256::digest(bytes));
        record.push_str(&format!("{name},sha256={hash},{}\n", bytes.len()));
    }
    record.push_str(&format!("{dist_info}/RECORD,,\n"));
    all.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let file = std::fs::File::create(dir.join(format!(
        "{dist}-{version}-py3-none-manylinux2014_x86_64.whl"
    )))
    .unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (name, bytes) in &all {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// A CUDA 12.4 + cuDNN 9.1 recipe and its lock against a mirror of stand-in wheels.
fn recipe(root: &Path) -> PathBuf {
    let libs = root.join("libs");
    let mirror = root.join("mirror");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::create_dir_all(&mirror).unwrap();
    let cudart = gcc_lib(&libs, "libcudart.so.12", &[]);
    let lt = gcc_lib(&libs, "libcublasLt.so.12", &[]);
    let cublas = gcc_lib(&libs, "libcublas.so.12", &["libcublasLt.so.12"]);
    let cudnn = gcc_lib(&libs, "libcudnn.so.9", &[]);
    let init = ("nvidia/__init__.py", Vec::new());
    write_wheel(
        &mirror,
        "nvidia-cuda-runtime-cu12",
        "12.4.127",
        &[
            init.clone(),
            ("nvidia/cuda_runtime/lib/libcudart.so.12", cudart),
        ],
    );
    write_wheel(
        &mirror,
        "nvidia-cublas-cu12",
        "12.4.5.8",
        &[
            init.clone(),
            ("nvidia/cublas/lib/libcublas.so.12", cublas),
            ("nvidia/cublas/lib/libcublasLt.so.12", lt),
        ],
    );
    write_wheel(
        &mirror,
        "nvidia-cudnn-cu12",
        "9.1.0.70",
        &[
            init,
            ("nvidia/cudnn/lib/libcudnn.so.9", cudnn),
            (
                "nvidia/cudnn/include/cudnn_version.h",
                b"#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n"
                    .to_vec(),
            ),
        ],
    );
    let recipe = root.join("cluster-ready.yaml");
    std::fs::write(&recipe, "name: cluster-ready\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    let lock = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["lock", "--mirror"])
        .arg(&mirror)
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

#[test]
fn default_build_is_ready_for_enroot_apptainer_and_kubernetes() {
    if let Some(reason) = e2e_support::skip_reason(&[("gcc", &["--version"][..])]) {
        eprintln!("skipped: {reason}");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = recipe(work.path());
    let layout = work.path().join("layout");
    // No --compression flag: the default is what clusters get.
    let build = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--layout"])
        .arg(&layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(&recipe)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "build failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let image = cudastack::oci::layout::read(&layout, "latest").unwrap();
    let readiness = readiness::check(&image);
    for finding in &readiness.findings {
        eprintln!(
            "{:<28} {:<4} {}",
            finding.check,
            if finding.ok { "ok" } else { "FAIL" },
            finding.detail
        );
    }
    assert!(readiness.is_ready(), "{readiness:#?}");
    // The same facts, stated directly, so a change in the checker cannot hide them.
    let env = image.runtime_config().env().clone().unwrap_or_default();
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=all".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,utility".to_string()),
        "{env:?}"
    );
    assert!(
        env.iter()
            .any(|e| e.starts_with("NVIDIA_REQUIRE_CUDA=cuda>=")),
        "{env:?}"
    );
    assert!(
        image
            .layers()
            .iter()
            .all(|l| l.media_type.to_string() == "application/vnd.oci.image.layer.v1.tar+gzip"),
        "{:?}",
        image.layers()
    );
    assert!(
        image.layers().len() <= 10 && image.layers().len() < MAX_LAYERS,
        "{} layers",
        image.layers().len()
    );

    match Command::new("apptainer").arg("--version").output() {
        Ok(output) if output.status.success() => {
            let sif = work.path().join("image.sif");
            let built = Command::new("apptainer")
                .args(["build", "--force"])
                .arg(&sif)
                .arg(format!("oci:{}:latest", layout.display()))
                .output()
                .unwrap();
            assert!(
                built.status.success(),
                "apptainer build: {}",
                String::from_utf8_lossy(&built.stderr)
            );
            let run = Command::new("apptainer")
                .args(["exec", "--cleanenv"])
                .arg(&sif)
                .args([
                    "sh",
                    "-c",
                    "echo $NVIDIA_DRIVER_CAPABILITIES; python3 -c 'print(42)'",
                ])
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&run.stdout);
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            assert_eq!(
                stdout.lines().collect::<Vec<_>>(),
                ["compute,utility", "42"]
            );
        }
        _ => eprintln!(
            "skipped the Apptainer import: `apptainer` is not installed (not packaged in Debian)"
        ),
    }
    eprintln!("skipped the enroot import: `enroot` is not installed (not packaged in Debian; it imports from registries, not OCI layouts)");
}
