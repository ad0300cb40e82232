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

use crate::e2e_support;

use e2e_support::gate;

use std::path::{Path, PathBuf};
use std::process::Command;

use cudastack::cluster::readiness::{self, MAX_LAYERS};
use e2e_support::stand_in::{cuda_12_4_wheels, lock, Target};

/// A CUDA 12.4 + cuDNN 9.1 recipe and its lock against a mirror of stand-in wheels.
fn recipe(root: &Path) -> PathBuf {
    let mirror = root.join("mirror");
    cuda_12_4_wheels(Target::X86_64, &root.join("libs"), &mirror);
    let recipe = root.join("cluster-ready.yaml");
    std::fs::write(&recipe, "name: cluster-ready\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\ncudnn: { version: \"9.1.0.70\" }\nsource_date_epoch: 1700000000\n").unwrap();
    lock(&recipe, &mirror);
    recipe
}

#[test]
fn default_build_is_ready_for_enroot_apptainer_and_kubernetes() {
    if let Some(reason) = e2e_support::skip_reason(&[("gcc", &["--version"][..])]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let recipe = recipe(work.path());
    let layout = work.path().join("layout");
    // No --compression flag: the default is what clusters get.
    let build = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--mirror"])
        .arg(work.path().join("mirror"))
        .arg("--layout")
        .arg(&layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(&recipe)
        .env("CUDASTACK_PROBE_DIR", native_probe_dir())
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

    native_probe_runs_in_the_image(&layout, &env, work.path());

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
        _ => gate::not_applicable(
            "the Apptainer import: `apptainer` is not installed (not packaged in Debian)",
        ),
    }
    gate::not_applicable("the enroot import: `enroot` is not installed (not packaged in Debian; it imports from registries, not OCI layouts)");
}

/// The machine this test (and the image it builds) runs on.
fn host_machine() -> cudastack::elf::Machine {
    if cfg!(target_arch = "aarch64") {
        cudastack::elf::Machine::Aarch64
    } else {
        cudastack::elf::Machine::X86_64
    }
}

/// Where scripts/build-probe.sh puts the native probes (the build is pointed there explicitly).
fn native_probe_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/probe")
}

/// This image has no torch: when the native probe is built (scripts/setup.sh), it is baked
/// beside probe.py, and `python3 probe.py` in the image hands over to it. Run in a chroot
/// of the unpacked image with the image's LD_LIBRARY_PATH (no Docker needed, no GPU here:
/// the GPU levels skip with the reason), against the stand-in libraries.
fn native_probe_runs_in_the_image(layout: &Path, env: &[String], work: &Path) {
    let Ok(probe) = std::fs::read(
        native_probe_dir().join(cudastack::probe::native::file_name(12, host_machine()).unwrap()),
    ) else {
        gate::skip(
            "native-probe",
            "the native probe is not built (scripts/setup.sh builds target/probe): not checked",
        );
        return;
    };
    let bundle = work.join("bundle");
    let unpack = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:latest", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        unpack.status.success(),
        "{}",
        String::from_utf8_lossy(&unpack.stderr)
    );
    let root = bundle.join("rootfs");
    let baked = root.join(cudastack::probe::native::NATIVE_PROBE_PATH.trim_start_matches('/'));
    assert_eq!(std::fs::read(&baked).unwrap(), probe, "{}", baked.display());
    let ld_library_path = env
        .iter()
        .find_map(|e| e.strip_prefix("LD_LIBRARY_PATH="))
        .unwrap();
    let output = e2e_support::in_image_chroot(&root)
        .args(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin"])
        .arg(format!("LD_LIBRARY_PATH={ld_library_path}"))
        .args(["python3", cudastack::probe::PROBE_PATH, "--level", "all"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = cudastack::verify::report::Report::from_output(&stdout, "the probe in the image")
        .unwrap_or_else(|e| panic!("{e}\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
    let json = serde_json::to_value(&report).unwrap();
    assert!(
        json["probe_version"].as_str().unwrap().starts_with("rust-"),
        "{json}"
    );
    for check in json["checks"].as_array().unwrap() {
        let (id, status) = (
            check["id"].as_str().unwrap(),
            check["status"].as_str().unwrap(),
        );
        match check["level"].as_str().unwrap() {
            "static" => assert_ne!(status, "fail", "{check}"),
            _ => assert_eq!(status, "skip", "{id} on a machine without a GPU: {check}"),
        }
    }
    assert_eq!(output.status.code(), Some(0), "{stdout}");

    // The same through the real runner: `cudastack verify` loads the image into Docker,
    // runs `python3 probe.py` in a container (no GPU here: static level), which hands over.
    let docker = Command::new("docker").arg("info").output();
    if !docker.map(|o| o.status.success()).unwrap_or(false) {
        gate::skip(
            "docker",
            "no Docker daemon: the container run of the native probe was not checked",
        );
        return;
    }
    // The layout names the image by its default name, which the verify loads it under:
    // it goes again when the test ends, passed or not.
    struct RemoveImage(&'static str);
    impl Drop for RemoveImage {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rmi", "-f", self.0]).output();
        }
    }
    let _loaded = RemoveImage("localhost/cluster-ready:latest");
    let verify = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["--json", "verify"])
        .arg(layout)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    for check in value["report"]["checks"].as_array().unwrap() {
        eprintln!(
            "{:<24} {:<4} {}",
            check["id"].as_str().unwrap(),
            check["status"].as_str().unwrap(),
            check["detail"].as_str().unwrap_or("")
        );
    }
    assert!(
        value["report"]["probe_version"]
            .as_str()
            .unwrap()
            .starts_with("rust-"),
        "{value}"
    );
    assert!(value["report"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["id"] == "static.cudart" && c["status"] == "pass"));
    assert!(value["recorded"]["verified_manifest"].is_null(), "{value}");
}
