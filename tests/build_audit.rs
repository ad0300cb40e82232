//! `cudastack build` refuses images whose static audit fails, with the audit's message.
//!
//! A small CUDA-shaped stack is built from a local mirror (air-gapped source) of wheels
//! made here: real ELF shared libraries compiled with gcc (with SONAMEs and NEEDED
//! entries), packed as nvidia-* wheels with valid RECORDs. NVIDIA's real libraries are far
//! too large for a test, and the audit only reads ELF headers, so these stand in for them.
//! The clean stack builds; each planted defect (a missing NEEDED, a second copy of a SONAME,
//! a cuDNN header that disagrees with its library) fails the build naming the defect.
//!
//! Needs root and mmdebstrap for the Debian base (cached across runs); otherwise it says
//! why and stops.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compile a shared library with gcc.
fn gcc_lib(dir: &Path, file: &str, soname: &str, needed: &[&str], symbol: &str) -> Vec<u8> {
    let source = dir.join(format!("{file}.c"));
    std::fs::write(&source, format!("int {symbol}(void) {{ return 42; }}\n")).unwrap();
    let out = dir.join(file);
    let mut command = Command::new("gcc");
    command
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&source)
        .arg(format!("-Wl,-soname,{soname}"))
        // Before the libraries, so every one of them becomes a DT_NEEDED entry.
        .arg("-Wl,--no-as-needed");
    // Link against stub libraries by name so DT_NEEDED carries exactly these entries.
    for name in needed {
        let stub = dir.join(name);
        if !stub.exists() {
            let stub_source = dir.join(format!("{name}.c"));
            std::fs::write(&stub_source, "int stub_symbol(void) { return 0; }\n").unwrap();
            assert!(Command::new("gcc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&stub)
                .arg(&stub_source)
                .arg(format!("-Wl,-soname,{name}"))
                .status()
                .unwrap()
                .success());
        }
        command.arg(&stub);
    }
    assert!(command.status().unwrap().success(), "gcc failed for {file}");
    std::fs::read(out).unwrap()
}

/// Write a wheel whose RECORD is valid (the shared stand-in writer, for x86_64).
fn write_wheel(dir: &Path, project: &str, version: &str, files: &[(&str, Vec<u8>)]) {
    e2e_support::stand_in::write_wheel(
        dir,
        e2e_support::stand_in::Target::X86_64,
        project,
        version,
        files,
    );
}

const CUDNN_HEADER: &str = "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n";

#[derive(Default)]
struct Defects {
    missing_needed: bool,
    duplicate_soname: bool,
    header_mismatch: bool,
}

/// Make a mirror and a recipe for a stack with the given defects; returns the recipe path.
fn stack(root: &Path, name: &str, defects: &Defects) -> PathBuf {
    let libs = root.join("libs");
    let mirror = root.join("mirror");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::create_dir_all(&mirror).unwrap();
    let cudart = gcc_lib(
        &libs,
        "libcudart.so.12",
        "libcudart.so.12",
        &[],
        "cudart_fn",
    );
    let lt = gcc_lib(
        &libs,
        "libcublasLt.so.12",
        "libcublasLt.so.12",
        &[],
        "cublaslt_fn",
    );
    let cublas_needs: Vec<&str> = if defects.missing_needed {
        vec!["libcublasLt.so.12", "libnotthere.so.1"]
    } else {
        vec!["libcublasLt.so.12"]
    };
    let cublas = gcc_lib(
        &libs,
        "libcublas.so.12",
        "libcublas.so.12",
        &cublas_needs,
        "cublas_fn",
    );
    let cudnn = gcc_lib(&libs, "libcudnn.so.9", "libcudnn.so.9", &[], "cudnn_fn");
    write_wheel(
        &mirror,
        "nvidia-cuda-runtime-cu12",
        "12.4.127",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cuda_runtime/lib/libcudart.so.12", cudart.clone()),
        ],
    );
    write_wheel(
        &mirror,
        "nvidia-cublas-cu12",
        "12.4.5.8",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cublas/lib/libcublas.so.12", cublas),
            ("nvidia/cublas/lib/libcublasLt.so.12", lt),
        ],
    );
    let header = CUDNN_HEADER.replace("{minor}", if defects.header_mismatch { "0" } else { "1" });
    write_wheel(
        &mirror,
        "nvidia-cudnn-cu12",
        "9.1.0.70",
        &[
            ("nvidia/__init__.py", vec![]),
            ("nvidia/cudnn/lib/libcudnn.so.9", cudnn),
            ("nvidia/cudnn/include/cudnn_version.h", header.into_bytes()),
        ],
    );
    let mut packages = String::new();
    if defects.duplicate_soname {
        // A second, different copy of libcudart.so.12 inside a Python package.
        let other = gcc_lib(
            &libs,
            "dupe-libcudart.so.12",
            "libcudart.so.12",
            &[],
            "other_cudart_fn",
        );
        // And the extension module that loads it through RUNPATH=$ORIGIN, as vendoring
        // packages ship them: that makes the second copy one the loader really reaches.
        let ext_source = libs.join("vendored_ext.c");
        std::fs::write(&ext_source, "int vendored_ext_fn(void) { return 1; }\n").unwrap();
        let ext = libs.join("_ext.so");
        assert!(Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&ext)
            .arg(&ext_source)
            .arg("-Wl,--no-as-needed")
            .arg(libs.join("libcudart.so.12"))
            .args(["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"])
            .status()
            .unwrap()
            .success());
        write_wheel(
            &mirror,
            "vendored-cudart",
            "1.0",
            &[
                ("vendored_cudart/__init__.py", vec![]),
                ("vendored_cudart/_ext.so", std::fs::read(&ext).unwrap()),
                ("vendored_cudart/libcudart.so.12", other),
            ],
        );
        packages = "packages: [\"vendored-cudart==1.0\"]\n".into();
    }
    let recipe = root.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\n{packages}source_date_epoch: 1700000000\n")).unwrap();
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

fn build(recipe: &Path, layout: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["build", "--no-verify", "--mirror"])
        .arg(recipe.parent().unwrap().join("mirror"))
        .arg("--layout")
        .arg(layout)
        .arg("--cache-dir")
        .arg(e2e_support::cache_dir())
        .arg(recipe)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn audit_failures_fail_the_build_with_the_right_message() {
    if let Some(reason) = e2e_support::skip_reason(&[]) {
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();

    let clean = stack(
        &work.path().join("clean"),
        "audit-clean",
        &Defects::default(),
    );
    let (ok, log) = build(&clean, &work.path().join("clean-layout"));
    assert!(ok, "the clean stack must build:\n{log}");
    // The chain is complete and the layout names one image.
    assert!(work.path().join("clean-layout/index.json").exists());

    let cases: [(&str, Defects, &[&str]); 3] = [
        (
            "audit-missing-needed",
            Defects {
                missing_needed: true,
                ..Default::default()
            },
            &["unresolved-needed", "libnotthere.so.1", "libcublas.so.12"],
        ),
        (
            "audit-duplicate-soname",
            Defects {
                duplicate_soname: true,
                ..Default::default()
            },
            &["duplicate-soname", "libcudart.so.12", "vendored_cudart"],
        ),
        (
            "audit-header-mismatch",
            Defects {
                header_mismatch: true,
                ..Default::default()
            },
            &["cudnn", "9.0.0", "9.1.0"],
        ),
    ];
    for (name, defects, fragments) in cases {
        let recipe = stack(&work.path().join(name), name, &defects);
        let layout = work.path().join(format!("{name}-layout"));
        let (ok, log) = build(&recipe, &layout);
        assert!(!ok, "{name}: the build should have failed:\n{log}");
        assert!(
            log.contains("static audit of the assembled image failed"),
            "{name}:\n{log}"
        );
        for fragment in fragments {
            assert!(
                log.contains(fragment),
                "{name}: expected `{fragment}` in:\n{log}"
            );
        }
        assert!(
            !layout.join("index.json").exists(),
            "{name}: a failed build must not write the layout"
        );
    }
}
