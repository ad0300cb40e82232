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
