//! Runs the built `cudastack-probe` binary on this machine.
//!
//! THIS MACHINE HAS NO GPU AND NO NVIDIA DRIVER: the GPU paths (cuDriverGetVersion against a
//! real driver, device enumeration, cuBLAS SGEMM, cuDNN convolutions) cannot be exercised
//! here. What is tested: the static level against a planted CUDA library directory (tiny
//! stand-in libcudart/libcublas/libcublasLt/libcudnn built with gcc, with the real SONAMEs and
//! the version entry points the probe calls), the report line and schema, the skip reasons
//! when libcuda.so.1 is absent, exit codes, and, with a planted stand-in libcuda.so.1 that
//! lacks symbols, that a cudarc panic fails one check and the probe still reports.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

const PREFIX: &str = "cudastack-report-v1 ";
const NO_DRIVER: &str = "no NVIDIA driver (libcuda.so.1 not found)";

struct Planted {
    root: PathBuf,
    lib: PathBuf,
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn gcc_so(dir: &Path, file: &str, soname: &str, source: &str) {
    gcc_so_needing(dir, file, soname, source, &[]);
}

/// `gcc_so` with DT_NEEDED entries on the libraries `needed`.
fn gcc_so_needing(dir: &Path, file: &str, soname: &str, source: &str, needed: &[&Path]) {
    let c = dir.join(format!("{file}.c"));
    std::fs::write(&c, source).unwrap();
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(file))
        .arg(&c)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-Wl,--no-as-needed")
        .args(needed)
        .status()
        .expect("gcc is installed");
    assert!(status.success(), "gcc failed for {file}");
    std::fs::remove_file(c).unwrap();
    if file != soname {
        std::os::unix::fs::symlink(file, dir.join(soname)).unwrap();
    }
}

/// /tmp/X/cuda-12.1/targets/x86_64-linux/{lib,include} with stand-ins for the stack's libraries.
fn plant(name: &str) -> Planted {
    let root = std::env::temp_dir().join(format!(
        "cudastack-probe-test-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    let target = root.join("cuda-12.1/targets/x86_64-linux");
    let lib = target.join("lib");
    let include = target.join("include");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&include).unwrap();
    gcc_so(
        &lib,
        "libcudart.so.12.1.105",
        "libcudart.so.12",
        "int cudaRuntimeGetVersion(int *v) { *v = 12010; return 0; }\n",
    );
    gcc_so(
        &lib,
        "libcublasLt.so.12.1.3.1",
        "libcublasLt.so.12",
        "int cublasLtGetVersion(void) { return 120103; }\n",
    );
    gcc_so(&lib, "libcublas.so.12.1.3.1", "libcublas.so.12",
        "int cublasGetProperty(int t, int *v) { static const int p[3] = {12, 1, 3}; if (t < 0 || t > 2) return 7; *v = p[t]; return 0; }\n");
    gcc_so(
        &lib,
        "libcudnn.so.9.1.0",
        "libcudnn.so.9",
        "unsigned long cudnnGetVersion(void) { return 90100; }\n",
    );
    std::fs::write(
        include.join("cudnn_version.h"),
        "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n",
    )
    .unwrap();
    Planted { root, lib }
}

fn local_python() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn expect_for(planted: &Planted) -> Value {
    let mut expect = json!({
        "recipe": "cuda12.1-cudnn9-test",
        "cuda": "12.1",
        "cuda_runtime": "12.1.105",
        "cudnn": "9.1.0.70",
        "driver_floor": "530.30.02",
        "minor_version_compat": false,
        "sm": [],
        "cuda_lib_dir": planted.lib.display().to_string(),
    });
    if let Some(python) = local_python() {
        expect["python"] = json!(python);
    }
    expect
}

struct Run {
    code: i32,
    report: Value,
    stderr: String,
}

fn run_probe(planted: &Planted, expect: &Value, ld_library_path: &str, extra: &[&str]) -> Run {
    let expect_path = planted.root.join("expect.json");
    std::fs::write(&expect_path, serde_json::to_vec(expect).unwrap()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack-probe"))
        .arg("--expect")
        .arg(&expect_path)
        .args(extra)
        .env("LD_LIBRARY_PATH", ld_library_path)
        .env_remove("CUDA_HOME")
        .output()
        .expect("the probe runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let last = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no stdout; stderr:\n{stderr}"));
    let json = last
        .strip_prefix(PREFIX)
        .unwrap_or_else(|| panic!("last line is not the report: {last}"));
    let report: Value = serde_json::from_str(json).expect("the report line parses");
    Run {
        code: output.status.code().unwrap_or(-1),
        report,
        stderr,
    }
}

fn check<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id}"))
}

fn libcuda_present() -> bool {
    // The GPU path: only on a machine with a driver (not this one).
    Command::new("sh")
        .args(["-c", "ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn without_a_driver_the_gpu_levels_skip_and_the_probe_exits_0() {
    let planted = plant("nodriver");
    let expect = expect_for(&planted);
    let run = run_probe(&planted, &expect, &planted.lib.display().to_string(), &[]);
    let report = &run.report;
    assert_eq!(report["schema"], "cudastack.verify.report/v1");
    assert_eq!(
        report["levels"],
        json!(["static", "driver", "device", "ops", "train"])
    );
    assert_eq!(report["expect"], expect);
    assert!(report["probe_version"]
        .as_str()
        .unwrap()
        .starts_with("rust-"));
    for id in [
        "static.cuda_libraries",
        "static.dlopen",
        "static.cudart",
        "static.cudnn",
        "static.cublas",
        "static.cudnn_header",
        "static.loaded_libraries",
        "static.ld_library_path",
    ] {
        assert_eq!(
            check(report, id)["status"],
            "pass",
            "{id}: {}\n{}",
            check(report, id),
            run.stderr
        );
    }
    let loaded = &check(report, "static.loaded_libraries")["data"];
    let dir = planted.lib.display().to_string();
    assert_eq!(loaded["libcudart"][&dir], json!(["libcudart.so.12.1.105"]));
    assert_eq!(loaded["libcudnn"][&dir], json!(["libcudnn.so.9.1.0"]));
    assert_eq!(check(report, "static.cudnn")["data"]["cudnn"], 90100);
    assert_eq!(check(report, "static.cublas")["data"]["cublas"], "12.1.3");
    assert_eq!(check(report, "train.mlp")["status"], "skip");
    assert_eq!(
        check(report, "train.mlp")["detail"],
        "no torch in this image"
    );
    if libcuda_present() {
        eprintln!("libcuda.so.1 is present: the no-driver assertions do not apply on this machine");
        return;
    }
    // No GPU here: every driver/device/ops check is a skip that names the reason.
    for id in [
        "driver.version",
        "driver.cuda",
        "device.count",
        "device.kernels",
        "ops.matmul",
        "ops.conv",
        "ops.conv_benchmark",
        "ops.loaded_libraries",
    ] {
        let c = check(report, id);
        assert_eq!(c["status"], "skip", "{id}: {c}");
        assert!(
            c["detail"].as_str().unwrap().contains(NO_DRIVER),
            "{id}: {c}"
        );
    }
    assert_eq!(check(report, "driver.version")["detail"], NO_DRIVER);
    assert_eq!(report["driver"], Value::Null);
    assert_eq!(report["gpus"], json!([]));
    assert_eq!(report["counts"]["fail"], 0, "{}", run.stderr);
    assert_eq!(
        run.code, 0,
        "skips are not failures (probe.py's rule); stderr:\n{}",
        run.stderr
    );
}

#[test]
fn a_second_cudnn_copy_and_a_wrong_version_fail_with_exit_1() {
    let planted = plant("doubled");
    let other = planted.root.join("other");
    std::fs::create_dir_all(&other).unwrap();
    gcc_so(
        &other,
        "libcudnn.so.9.2.0",
        "libcudnn.so.9",
        "unsigned long cudnnGetVersion(void) { return 90200; }\n",
    );
    // The other copy comes first on the path: the loader picks it.
    let path = format!("{}:{}", other.display(), planted.lib.display());
    let run = run_probe(
        &planted,
        &expect_for(&planted),
        &path,
        &["--level", "static"],
    );
    assert_eq!(run.report["levels"], json!(["static"]));
    assert_eq!(
        check(&run.report, "static.ld_library_path")["status"],
        "fail"
    );
    let loaded = check(&run.report, "static.loaded_libraries");
    assert_eq!(loaded["status"], "fail");
    assert!(
        loaded["detail"]
            .as_str()
            .unwrap()
            .contains("not the image's CUDA library directory"),
        "{loaded}"
    );
    let cudnn = check(&run.report, "static.cudnn");
    assert_eq!(cudnn["status"], "fail");
    assert!(
        cudnn["detail"].as_str().unwrap().contains("90200"),
        "{cudnn}"
    );
    assert!(run.report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["level"] == "static"));
    assert_eq!(run.code, 1);
}

#[test]
fn a_cudarc_panic_on_a_missing_symbol_fails_one_check_only() {
    // A stand-in libcuda.so.1 with the version entry points but without cuDeviceGetCount:
    // cudarc panics when it resolves that symbol; the probe must fail device.count, skip
    // what depends on it, and still print the report.
    let planted = plant("panic");
    let fake = planted.root.join("driver");
    std::fs::create_dir_all(&fake).unwrap();
    gcc_so(&fake, "libcuda.so.1", "libcuda.so.1",
        "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }\nint cuInit(unsigned f) { return 0; }\n");
    gcc_so(&fake, "libnvidia-ml.so.1", "libnvidia-ml.so.1",
        "#include <string.h>\nint nvmlInit_v2(void) { return 0; }\nint nvmlShutdown(void) { return 0; }\n\
         int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, \"550.54.15\", n); return 0; }\n");
    let path = format!("{}:{}", planted.lib.display(), fake.display());
    let run = run_probe(&planted, &expect_for(&planted), &path, &[]);
    let report = &run.report;
    assert_eq!(
        check(report, "driver.version")["status"],
        "pass",
        "{}",
        run.stderr
    );
    assert_eq!(
        check(report, "driver.cuda")["status"],
        "pass",
        "{}",
        check(report, "driver.cuda")
    );
    assert_eq!(
        report["driver"],
        json!({"version": "550.54.15", "cuda": "12.4"})
    );
    let count = check(report, "device.count");
    assert_eq!(count["status"], "fail");
    assert!(
        count["detail"].as_str().unwrap().starts_with("panic: "),
        "{count}"
    );
    assert!(
        count["detail"]
            .as_str()
            .unwrap()
            .contains("cuDeviceGetCount"),
        "{count}"
    );
    for id in [
        "device.kernels",
        "ops.matmul",
        "ops.conv",
        "ops.conv_benchmark",
        "ops.loaded_libraries",
    ] {
        assert_eq!(check(report, id)["status"], "skip", "{id}");
    }
    assert_eq!(run.code, 1);
}

#[test]
fn a_broken_expect_file_is_a_probe_error() {
    let planted = plant("broken");
    let path = planted.root.join("broken.json");
    std::fs::write(&path, "{not json").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack-probe"))
        .arg("--expect")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack-probe"))
        .args(["--level", "gpu"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// A library whose dependency is missing: static.dlopen fails with the loader's own words
/// (which file it could not find), not libloading's bare "dlopen failed".
#[test]
fn a_library_with_a_missing_dependency_names_it() {
    let planted = plant("missing-dependency");
    // libcudnn.so.9 rebuilt to need a library that is nowhere.
    let gone = planted.root.join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    gcc_so(
        &gone,
        "libcudnn_gone.so.9",
        "libcudnn_gone.so.9",
        "int gone(void) { return 1; }\n",
    );
    std::fs::remove_file(planted.lib.join("libcudnn.so.9")).unwrap();
    std::fs::remove_file(planted.lib.join("libcudnn.so.9.1.0")).unwrap();
    gcc_so_needing(
        &planted.lib,
        "libcudnn.so.9.1.0",
        "libcudnn.so.9",
        "unsigned long cudnnGetVersion(void) { return 90100; }\n",
        &[&gone.join("libcudnn_gone.so.9")],
    );
    std::fs::remove_dir_all(&gone).unwrap();

    let run = run_probe(
        &planted,
        &expect_for(&planted),
        &planted.lib.display().to_string(),
        &["--level", "static"],
    );
    let dlopen = check(&run.report, "static.dlopen");
    assert_eq!(dlopen["status"], "fail", "{}", run.stderr);
    let detail = dlopen["detail"].as_str().unwrap();
    assert!(
        detail.contains("libcudnn_gone.so.9: cannot open shared object file"),
        "{detail}"
    );
    assert_eq!(run.code, 1);
    let _ = std::fs::remove_dir_all(&planted.root);
}
