//! `cudastack-probe`: the verification probe for images WITHOUT torch (CUDA + cuDNN only).
//!
//! The Rust counterpart of probe/probe.py: the same levels, check ids where they apply, the
//! same report (schema `cudastack.verify.report/v1`, the last stdout line prefixed by
//! `cudastack-report-v1 `), the same expectations file (/usr/share/cudastack/expect.json)
//! and the same exit codes (0 nothing failed, skips included; 1 a check failed; 2 probe error).
//!
//! ```text
//! cudastack-probe [--level static|driver|device|ops|train|all] [--expect FILE] [--quiet]
//! ```
//!
//! Levels: static (the library directory's cudart/cuBLAS/cuDNN versions, dlopen by SONAME,
//! runtime-reported versions, cudnn_version.h, one copy per library family in
//! /proc/self/maps, LD_LIBRARY_PATH), driver (libcuda.so.1 present, driver version >= the
//! recipe's floor, cuDriverGetVersion >= the image's CUDA), device (GPUs, compute
//! capabilities, kernels for each), ops (cuBLAS SGEMM in pedantic math and cuDNN forward
//! convolutions against CPU references, then the library copies again), train (always skip:
//! no torch in this image). No libcuda.so.1 means every driver/device/ops check is `skip`
//! with "no NVIDIA driver (libcuda.so.1 not found)", never `fail`.
//!
//! # Build (its own crate, not a member of the main package)
//!
//! ```text
//! cargo build --release --manifest-path probe/rust/Cargo.toml                                   # CUDA 12 images (default)
//! cargo build --release --manifest-path probe/rust/Cargo.toml --no-default-features --features cuda13  # CUDA 13 images
//! ```
//!
//! One binary per CUDA major. cudarc's dynamic loading (`get_lib_name_candidates`) tries, for
//! each library, `lib<x>.so`, `lib<x>.so.<MAJOR>` with MAJOR fixed at compile time by the
//! `cuda-1xxx0` feature, then cudarc's own fixed fallback list `.so.12`, `.so.11`, `.so.10`, `.so.9`, `.so.1`.
//! A CUDA 12 build therefore cannot find `libcublas.so.13` (only a dev `libcublas.so` link
//! would save it); a CUDA 13 build would find `.so.12` by name, but its bindings are the
//! CUDA 13 ones (and cuDNN 8's `libcudnn.so.8` is in no list at all). So build per major:
//! feature `cuda12` (cudarc `cuda-12000`) or `cuda13` (cudarc `cuda-13000`); the binary says
//! which in `probe_version` (`rust-0.1.0+cuda12`). cuDNN 9 (`libcudnn.so.9`) loads in both.
//! The probe dlopens each library by its SONAME itself first, so cudarc's later lookups
//! resolve to the copy the loader picked from the image (the one static.loaded_libraries checks).
//!
//! # glibc
//!
//! A plain `cargo build` links against the build machine's glibc symbol versions: built on
//! Debian 12 (glibc 2.36) it needs GLIBC_2.34 (`__libc_start_main@GLIBC_2.34` and friends),
//! so it does not start on Ubuntu 20.04 (2.31) or UBI 8 (2.28) images. scripts/setup.sh
//! therefore builds it with `cargo zigbuild --target x86_64-unknown-linux-gnu.2.17` (zig as
//! the linker against glibc 2.17 stubs) when it can install cargo-zigbuild. cudastack's
//! `verify::glibc::required_glibc` reads the binary's `.gnu.version_r` and `can_run_on`
//! compares it with the image's glibc before the binary is baked in.

mod gpu;
mod libs;
mod reference;
mod report;

#[cfg(all(feature = "cuda12", feature = "cuda13"))]
compile_error!("enable exactly one of the features `cuda12` (default) and `cuda13`: use --no-default-features --features cuda13");
#[cfg(not(any(feature = "cuda12", feature = "cuda13")))]
compile_error!("enable one of the features `cuda12` or `cuda13`");

use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use serde_json::{json, Value};

use crate::reference::ConvShape;
use crate::report::{
    fail, pass, pass_with, skip, Checks, Outcome, ReportFacts, EXPECT_PATH, LEVELS,
};

/// The CUDA major this binary's cudarc bindings and library names are for.
pub const CUDA_MAJOR: u32 = if cfg!(feature = "cuda13") { 13 } else { 12 };
pub const NO_DRIVER: &str = "no NVIDIA driver (libcuda.so.1 not found)";
pub const NO_TORCH: &str = "no torch in this image";

fn probe_version() -> String {
    format!("rust-{}+cuda{CUDA_MAJOR}", env!("CARGO_PKG_VERSION"))
}

struct Args {
    levels: Vec<String>,
    expect: String,
    quiet: bool,
}

const USAGE: &str =
    "usage: cudastack-probe [--level static|driver|device|ops|train|all] [--expect FILE] [--quiet]";

fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut level = "all".to_string();
    let mut expect = EXPECT_PATH.to_string();
    let mut quiet = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| iter.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        match flag {
            "--level" => level = value("--level")?,
            "--expect" => expect = value("--expect")?,
            "--quiet" => quiet = true,
            "-h" | "--help" => return Ok(None),
            "--version" => {
                println!("cudastack-probe {}", probe_version());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let levels = if level == "all" {
        LEVELS.to_vec()
    } else {
        let index = LEVELS.iter().position(|l| *l == level).ok_or(format!(
            "unknown level `{level}` (static, driver, device, ops, train, all)"
        ))?;
        LEVELS[..=index].to_vec()
    };
    Ok(Some(Args {
        levels: levels.into_iter().map(String::from).collect(),
        expect,
        quiet,
    }))
}

/// What the levels learn and hand on.
#[derive(Default)]
struct State {
    expect: Value,
    lib_dir: String,
    sonames: Vec<String>,
    /// The stack's libraries, dlopened by SONAME and kept open.
    loaded: Vec<(String, Library)>,
    libcuda: Option<Library>,
    /// Why the remaining GPU levels cannot run, once a level finds that out.
    gpu_unavailable: Option<String>,
    driver: Option<Value>,
    gpus: Vec<gpu::Gpu>,
    kernels: Vec<Option<String>>,
}

impl State {
    fn expect_str(&self, key: &str) -> Option<&str> {
        self.expect
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }
    fn cuda_major(&self) -> Option<u64> {
        self.expect_str("cuda")
            .and_then(|c| libs::version_tuple(c).first().copied())
    }
    fn library(&self, base: &str) -> Option<&Library> {
        self.loaded
            .iter()
            .find(|(name, _)| name.split_once(".so").map(|(b, _)| b) == Some(base))
            .map(|(_, lib)| lib)
    }
}

fn list_dir(dir: &str) -> Option<Vec<String>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Some(names)
}

fn loaded_libraries(state: &State) -> Outcome {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| report::Stop::Fail(format!("/proc/self/maps: {e}")))?;
    let copies = libs::library_copies(&libs::mapped_libraries(&maps));
    match libs::check_loaded_libraries(&copies, &state.expect) {
        Ok((summary, data)) => pass_with(summary, data),
        Err(problems) => fail(problems),
    }
}

fn static_level(checks: &mut Checks, state: &mut State) {
    checks.run("static.python", "static", || {
        let output = std::process::Command::new("python3")
            .args(["-c", "import sys, platform; print('%d.%d' % sys.version_info[:2], platform.python_version(), sys.executable)"])
            .output();
        let Ok(output) = output else {
            return skip("no python3 on PATH (this image is checked by the Rust probe)");
        };
        let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let mut words = text.split_whitespace();
        let (Some(found), Some(full)) = (words.next(), words.next()) else {
            return fail(format!("python3 did not report its version: {}", String::from_utf8_lossy(&output.stderr).trim()));
        };
        let executable = words.next().unwrap_or("python3");
        if let Some(wanted) = state.expect_str("python") {
            if found != wanted {
                return fail(format!("python3 is {found}, the recipe says {wanted}"));
            }
        }
        pass(format!("Python {full} ({executable})"))
    });

    checks.run("static.torch", "static", || match state.expect_str("torch") {
        None => skip("the image has no torch (the recipe names none)"),
        Some(torch) => skip(format!(
            "the recipe names torch {torch}: this Rust probe checks images without torch; probe.py checks torch"
        )),
    });

    state.lib_dir = state
        .expect_str("cuda_lib_dir")
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "{}/lib64",
                std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into())
            )
        });
    let lib_dir = state.lib_dir.clone();
    let mut scanned = libs::LibraryDir::default();
    checks.run("static.cuda_libraries", "static", || {
        let Some(names) = list_dir(&lib_dir) else {
            return fail(format!(
                "the image's CUDA library directory {lib_dir} does not exist"
            ));
        };
        scanned = libs::scan_library_dir(&names);
        match libs::check_library_dir(&lib_dir, &scanned, &state.expect) {
            Ok((summary, data)) => pass_with(summary, data),
            Err(problems) => fail(problems),
        }
    });
    state.sonames = libs::sonames_to_load(&scanned);

    // dlopen by SONAME through the normal search (LD_LIBRARY_PATH, ld.so.cache), as any
    // program in the image would; RTLD_GLOBAL so cudarc's later lookups resolve to these.
    let mut opened = Vec::new();
    let sonames = state.sonames.clone();
    checks.run("static.dlopen", "static", || {
        if sonames.is_empty() {
            return fail(format!(
                "no CUDA library SONAMEs (libcudart.so.N ...) in {lib_dir}"
            ));
        }
        let mut errors = Vec::new();
        for name in &sonames {
            match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_GLOBAL) } {
                Ok(lib) => opened.push((name.clone(), lib)),
                // The loader's own words (a missing dependency, a GLIBC version): libloading's
                // Display says only "dlopen failed".
                Err(e) => errors.push(match std::error::Error::source(&e) {
                    Some(why) => why.to_string(),
                    None => format!("{name}: {e}"),
                }),
            }
        }
        if !errors.is_empty() {
            return fail(format!(
                "dlopen failed (is {lib_dir} on the loader's path?): {}",
                errors.join("; ")
            ));
        }
        pass_with(
            format!("loaded {}", sonames.join(", ")),
            json!({"sonames": sonames}),
        )
    });
    state.loaded = opened;

    checks.run("static.cudart", "static", || {
        let Some(lib) = state.library("libcudart") else {
            return fail("libcudart is not loaded (see static.dlopen)");
        };
        let get: libloading::os::unix::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            unsafe { lib.get(b"cudaRuntimeGetVersion\0") }
                .map_err(|e| report::Stop::Fail(format!("cudaRuntimeGetVersion: {e}")))?;
        let mut version = 0;
        let status = unsafe { get(&mut version) };
        if status != 0 {
            return fail(format!("cudaRuntimeGetVersion returned {status}"));
        }
        let found = format!("{}.{}", version / 1000, (version % 1000) / 10);
        if let Some(wanted) = state.expect_str("cuda") {
            if libs::version_tuple(&found).get(..2) != libs::version_tuple(wanted).get(..2) {
                return fail(format!(
                    "libcudart is CUDA {found}, the image's CUDA is {wanted}"
                ));
            }
        }
        pass_with(
            format!("cudaRuntimeGetVersion = {version} (CUDA {found})"),
            json!({"cuda": found}),
        )
    });

    checks.run("static.cudnn", "static", || {
        let Some(lib) = state.library("libcudnn") else {
            return fail("libcudnn is not loaded (see static.dlopen)");
        };
        let get: libloading::os::unix::Symbol<unsafe extern "C" fn() -> usize> =
            unsafe { lib.get(b"cudnnGetVersion\0") }
                .map_err(|e| report::Stop::Fail(format!("cudnnGetVersion: {e}")))?;
        let found = unsafe { get() } as u64;
        if let Some(wanted) = state.expect_str("cudnn") {
            let number = libs::cudnn_version_number(wanted);
            if found != number {
                return fail(format!(
                    "the image loads cuDNN {found}, the lock says {wanted} ({number})"
                ));
            }
        }
        pass_with(
            format!("cudnnGetVersion() = {found}"),
            json!({"cudnn": found}),
        )
    });

    checks.run("static.cublas", "static", || {
        let Some(lib) = state.library("libcublas") else {
            return fail("libcublas is not loaded (see static.dlopen)");
        };
        let get: libloading::os::unix::Symbol<unsafe extern "C" fn(i32, *mut i32) -> i32> =
            unsafe { lib.get(b"cublasGetProperty\0") }
                .map_err(|e| report::Stop::Fail(format!("cublasGetProperty: {e}")))?;
        let mut parts = [0i32; 3];
        for (property, slot) in parts.iter_mut().enumerate() {
            let status = unsafe { get(property as i32, slot) };
            if status != 0 {
                return fail(format!("cublasGetProperty({property}) returned {status}"));
            }
        }
        let version = format!("{}.{}.{}", parts[0], parts[1], parts[2]);
        if let Some(major) = state.cuda_major() {
            if parts[0] as u64 != major {
                return fail(format!(
                    "cuBLAS is {version}, the image's CUDA major is {major}"
                ));
            }
        }
        pass_with(format!("cuBLAS {version}"), json!({"cublas": version}))
    });

    checks.run("static.arch_list", "static", || {
        skip(format!("{NO_TORCH}: no build arch list; device.kernels checks each GPU against the CUDA libraries"))
    });

    checks.run("static.cudnn_header", "static", || {
        let home = std::env::var("CUDA_HOME").unwrap_or_else(|_| "/usr/local/cuda".into());
        let mut candidates: Vec<String> = vec![format!("{home}/include/cudnn_version.h")];
        // The toolkit home of `<home>/targets/<arch>-linux/lib` (any arch), and CUDA_HOME.
        let lib_home = Path::new(&lib_dir)
            .parent()
            .filter(|p| {
                p.parent()
                    .and_then(|t| t.file_name())
                    .is_some_and(|t| t == "targets")
            })
            .and_then(|p| p.parent()?.parent())
            .map(|p| p.display().to_string());
        for root in [Some(home.clone()), lib_home].into_iter().flatten() {
            for target in list_dir(&format!("{root}/targets")).unwrap_or_default() {
                candidates.push(format!("{root}/targets/{target}/include/cudnn_version.h"));
            }
        }
        if let Some(parent) = Path::new(&lib_dir).parent() {
            candidates.push(format!("{}/include/cudnn_version.h", parent.display()));
        }
        candidates.sort();
        candidates.dedup();
        let Some(header) = candidates.iter().find(|c| Path::new(c).is_file()) else {
            return skip(format!(
                "no cudnn_version.h under {home} (runtime images carry no headers)"
            ));
        };
        let text = std::fs::read_to_string(header)
            .map_err(|e| report::Stop::Fail(format!("{header}: {e}")))?;
        let Some(found) = libs::cudnn_header_version(&text) else {
            return fail(format!("{header} has no CUDNN_MAJOR/MINOR/PATCHLEVEL"));
        };
        if let Some(wanted) = state.expect_str("cudnn") {
            if found != libs::release3(wanted) {
                return fail(format!(
                    "{header} says cuDNN {found}, the lock says {wanted}"
                ));
            }
        }
        pass(format!("{header}: {found}"))
    });

    checks.run("static.loaded_libraries", "static", || {
        loaded_libraries(state)
    });

    checks.run("static.ld_library_path", "static", || {
        let entries: Vec<String> = std::env::var("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        let canonical = |d: &str| {
            std::fs::canonicalize(d)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| d.to_string())
        };
        let doubled = libs::ld_library_path_doubles(&entries, &list_dir, &canonical);
        if !doubled.is_empty() {
            let list: Vec<String> = doubled
                .iter()
                .map(|(f, d)| format!("{f} in {}", d.join(", ")))
                .collect();
            return fail(format!(
                "LD_LIBRARY_PATH has several directories with the same libraries: {}",
                list.join("; ")
            ));
        }
        let missing: Vec<&str> = entries
            .iter()
            .filter(|e| !Path::new(e).is_dir())
            .map(String::as_str)
            .collect();
        let note = if missing.is_empty() {
            String::new()
        } else {
            format!(
                " (absent until the NVIDIA runtime mounts it: {})",
                missing.join(", ")
            )
        };
        let shown = if entries.is_empty() {
            "(empty)".to_string()
        } else {
            entries.join(":")
        };
        pass_with(format!("{shown}{note}"), json!({"entries": entries}))
    });
}

fn nvml_driver_version() -> Option<String> {
    unsafe {
        let nvml = Library::open(Some("libnvidia-ml.so.1"), RTLD_NOW).ok()?;
        let init: libloading::os::unix::Symbol<unsafe extern "C" fn() -> i32> =
            nvml.get(b"nvmlInit_v2\0").ok()?;
        let version: libloading::os::unix::Symbol<unsafe extern "C" fn(*mut u8, u32) -> i32> =
            nvml.get(b"nvmlSystemGetDriverVersion\0").ok()?;
        let shutdown: libloading::os::unix::Symbol<unsafe extern "C" fn() -> i32> =
            nvml.get(b"nvmlShutdown\0").ok()?;
        if init() != 0 {
            return None;
        }
        let mut buffer = [0u8; 96];
        let result = version(buffer.as_mut_ptr(), buffer.len() as u32);
        shutdown();
        if result != 0 {
            return None;
        }
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        Some(String::from_utf8_lossy(&buffer[..end]).into_owned()).filter(|v| !v.is_empty())
    }
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 ...` -> 550.54.15.
fn proc_driver_version(text: &str) -> Option<String> {
    let (_, rest) = text.split_once("Kernel Module")?;
    let mut words = rest.split_whitespace().peekable();
    if words.peek() == Some(&"for") {
        words.next();
        words.next();
    }
    let word = words.next()?;
    let looks = word.contains('.')
        && word
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    looks.then(|| word.to_string())
}

fn driver_level(checks: &mut Checks, state: &mut State) {
    if let Some(reason) = state.gpu_unavailable.clone() {
        checks.skip_all("driver", &["driver.version", "driver.cuda"], &reason);
        return;
    }
    // Presence first: cudarc panics when it cannot load the library.
    match unsafe { Library::open(Some("libcuda.so.1"), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(lib) => state.libcuda = Some(lib),
        Err(_) => {
            state.gpu_unavailable = Some(NO_DRIVER.to_string());
            checks.run("driver.version", "driver", || skip(NO_DRIVER));
            checks.skip_all("driver", &["driver.cuda"], NO_DRIVER);
            return;
        }
    }
    let mut found_driver = None;
    let status = checks.run("driver.version", "driver", || {
        let proc_text = std::fs::read_to_string("/proc/driver/nvidia/version").unwrap_or_default();
        let Some(found) = nvml_driver_version().or_else(|| proc_driver_version(&proc_text)) else {
            return skip(
                "libcuda.so.1 is present but no NVIDIA kernel driver is visible (no libnvidia-ml.so.1, no \
                 /proc/driver/nvidia/version): run it with GPUs through the NVIDIA runtime",
            );
        };
        found_driver = Some(found.clone());
        let floor = state.expect_str("driver_floor");
        if let Some(floor) = floor {
            if libs::version_tuple(&found) < libs::version_tuple(floor) {
                return fail(format!("driver {found} is older than the recipe's floor {floor}"));
            }
        }
        pass(format!("driver {found} (floor {})", floor.unwrap_or("none")))
    });
    if status == "skip" {
        let reason = checks
            .entries
            .last()
            .and_then(|c| c["detail"].as_str())
            .unwrap_or_default()
            .to_string();
        state.gpu_unavailable = Some(reason.clone());
        checks.skip_all("driver", &["driver.cuda"], &reason);
        return;
    }
    state.driver = found_driver.map(|v| json!({"version": v}));
    let mut cuda_version = None;
    let status = checks.run("driver.cuda", "driver", || {
        let found = gpu::driver_cuda_version().map_err(report::Stop::Fail)?;
        cuda_version = Some(found.clone());
        let wanted = state.expect_str("cuda");
        if let Some(wanted) = wanted {
            let (have, need) = (libs::version_tuple(&found), libs::version_tuple(wanted));
            let compat = state
                .expect
                .get("minor_version_compat")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if have.first() < need.first() || (have < need && !compat) {
                return fail(format!(
                    "the driver supports CUDA up to {found}, the image's runtime is {wanted}"
                ));
            }
        }
        pass(format!(
            "driver supports CUDA {found} (image runtime {})",
            wanted.unwrap_or("?")
        ))
    });
    if let (Some(driver), Some(cuda)) = (state.driver.as_mut(), cuda_version) {
        driver["cuda"] = json!(cuda);
    }
    if status == "fail" {
        state.gpu_unavailable =
            Some("the driver does not support this image's CUDA runtime".to_string());
    }
}

fn device_level(checks: &mut Checks, state: &mut State) {
    if let Some(reason) = state.gpu_unavailable.clone() {
        checks.skip_all("device", &["device.count", "device.kernels"], &reason);
        return;
    }
    let mut gpus = Vec::new();
    let status = checks.run("device.count", "device", || {
        let found = gpu::devices().map_err(report::Stop::Fail)?;
        if found.is_empty() {
            return fail("cuDeviceGetCount is 0 although the driver is visible");
        }
        let names: Vec<String> = found
            .iter()
            .map(|g| format!("{} (sm_{}{})", g.name, g.major, g.minor))
            .collect();
        gpus = found;
        pass(format!("{} GPU(s): {}", gpus.len(), names.join(", ")))
    });
    state.gpus = gpus;
    state.kernels = vec![None; state.gpus.len()];
    if status != "pass" {
        state.gpu_unavailable = Some("no usable GPU (see device.count)".to_string());
        checks.skip_all(
            "device",
            &["device.kernels"],
            "no usable GPU (see device.count)",
        );
        return;
    }
    let mut kernels = vec![None; state.gpus.len()];
    let status = checks.run("device.kernels", "device", || {
        let sm = string_list(&state.expect, "sm");
        let mut missing = Vec::new();
        let mut lines = Vec::new();
        for (slot, g) in kernels.iter_mut().zip(&state.gpus) {
            let (kind, verdict) = gpu_kernels(&state.expect, &g.name, g.major, g.minor);
            *slot = kind;
            match verdict {
                Ok(line) => lines.push(line),
                Err(why) => missing.push(why),
            }
        }
        if !missing.is_empty() {
            return fail(missing.join("; "));
        }
        let note = if sm.is_empty() {
            " (expect.json has no sm list: no torch build; the ops level proves the cuBLAS/cuDNN kernels run)"
        } else {
            ""
        };
        pass(format!("{}{note}", lines.join(", ")))
    });
    state.kernels = kernels;
    if status == "fail" {
        state.gpu_unavailable = Some("no kernels for this GPU in this stack".to_string());
    }
}

/// The strings of the array `key` of expect.json (empty when absent).
fn string_list(expect: &Value, key: &str) -> Vec<String> {
    expect
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// device.kernels for one GPU (sm_`major``minor`): the kernels it gets (`sass:sm_90`,
/// `none`, or unknown) and the line for the report, or why it has none. Against the torch
/// build's arch list when the image has torch; otherwise against the archs the image's CUDA
/// toolkit targets (expect.json's `cuda_archs`, from cudastack's matrix), so a GPU newer than
/// the toolkit (sm_100 under CUDA 12.4) is named here, not found out by a failing GEMM; for
/// an expect.json without that list, the CUDA major's oldest arch.
fn gpu_kernels(
    expect: &Value,
    name: &str,
    major: u32,
    minor: u32,
) -> (Option<String>, Result<String, String>) {
    let sm = string_list(expect, "sm");
    let cuda_archs = string_list(expect, "cuda_archs");
    let cuda = expect.get("cuda").and_then(Value::as_str).unwrap_or("?");
    for (archs, whose) in [(&sm, None), (&cuda_archs, Some(cuda))] {
        if archs.is_empty() {
            continue;
        }
        return match (libs::has_kernels(archs, major, minor), whose) {
            (Some((kind, arch)), None) => (Some(format!("{kind}:{arch}")), Ok(format!("{name} -> {kind}:{arch}"))),
            (Some((kind, arch)), Some(cuda)) => (
                Some(format!("{kind}:{arch}")),
                Ok(format!("{name} -> {kind}:{arch} (CUDA {cuda})")),
            ),
            (None, None) => (
                Some("none".to_string()),
                Err(format!("{name} is sm_{major}{minor} and this build has kernels only for {}", archs.join(" "))),
            ),
            (None, Some(cuda)) => (
                Some("none".to_string()),
                Err(format!(
                    "{name} is sm_{major}{minor}, and CUDA {cuda} generates code only for {}: its cuBLAS/cuDNN carry no kernels for this GPU",
                    archs.join(" ")
                )),
            ),
        };
    }
    let cuda_major = libs::version_tuple(cuda)
        .first()
        .copied()
        .unwrap_or(CUDA_MAJOR as u64);
    match libs::oldest_cc_for_cuda(cuda_major) {
        Some(oldest) if (major, minor) < oldest => (
            None,
            Err(format!(
                "{name} is sm_{major}{minor}, and CUDA {cuda_major}'s cuBLAS/cuDNN have kernels only for sm_{}{} and newer",
                oldest.0, oldest.1
            )),
        ),
        _ => (None, Ok(format!("{name} (sm_{major}{minor}) is within CUDA {cuda_major}'s arch range"))),
    }
}

/// The convolution the ops level runs: probe.py's shape (8x32x56x56, 64 filters 3x3, pad 1).
pub const CONV: ConvShape = ConvShape {
    n: 8,
    c: 32,
    h: 56,
    w: 56,
    k: 64,
    r: 3,
    s: 3,
    pad: 1,
};
/// The SGEMM size.
pub const GEMM_N: usize = 2048;

fn ops_level(checks: &mut Checks, state: &mut State) {
    let ids = [
        "ops.matmul",
        "ops.conv",
        "ops.conv_benchmark",
        "ops.loaded_libraries",
    ];
    if let Some(reason) = state.gpu_unavailable.clone() {
        checks.skip_all("ops", &ids, &reason);
        return;
    }
    checks.run("ops.matmul", "ops", || {
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return fail(format!(
                "cuBLAS is not loadable under the names this CUDA {CUDA_MAJOR} build of the probe looks for \
                 (libcublas.so, libcublas.so.{CUDA_MAJOR}, then cudarc's fixed fallbacks .so.12 ... .so.9, .so.1)"
            ));
        }
        let (error, tflops) = gpu::sgemm(GEMM_N).map_err(report::Stop::Fail)?;
        if !error.is_finite() || error > 1e-5 {
            return fail(format!("{GEMM_N}x{GEMM_N} fp32 SGEMM (pedantic math) differs from the CPU reference: relative error {error:.3e} > 1e-5"));
        }
        pass_with(
            format!("{GEMM_N}x{GEMM_N} SGEMM, relative error {error:.2e}, {tflops:.1} TFLOP/s fp32 (pedantic math)"),
            json!({"relative_error": error, "tflops_fp32": (tflops * 100.0).round() / 100.0, "n": GEMM_N}),
        )
    });
    for (id, benchmark) in [("ops.conv", false), ("ops.conv_benchmark", true)] {
        checks.run(id, "ops", || {
            if !unsafe { cudarc::cudnn::sys::is_culib_present() } {
                return fail(format!(
                    "cuDNN is not loadable under the names this CUDA {CUDA_MAJOR} build of the probe looks for (libcudnn.so, libcudnn.so.9)"
                ));
            }
            let run = gpu::conv_forward(CONV, benchmark).map_err(report::Stop::Fail)?;
            if !run.error.is_finite() || run.error > 1e-3 {
                return fail(format!(
                    "cuDNN convolution forward ({}, benchmark={benchmark}) differs from the CPU: max relative error {:.2e} (bound 1e-3)",
                    run.algo, run.error
                ));
            }
            pass_with(
                format!("forward through cuDNN {} ({}), max relative error {:.2e}", run.cudnn_version, run.algo, run.error),
                json!({"forward": run.error, "algo": run.algo, "math": run.math, "milliseconds": run.milliseconds}),
            )
        });
    }
    // cuDNN 9 loads its engine libraries lazily: check the copies again after real work.
    checks.run("ops.loaded_libraries", "ops", || loaded_libraries(state));
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// One level's checks.
type LevelFn = fn(&mut Checks, &mut State);

fn real_main() -> i32 {
    // Issue 32: the nonce leaves the environment before any library of the image's loads.
    let nonce = std::env::var(report::NONCE_ENV).ok();
    std::env::remove_var(report::NONCE_ENV);
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(message) => {
            eprintln!("cudastack-probe: {message}\n{USAGE}");
            return 2;
        }
    };
    // Like probe.py: a missing expectations file is an empty one; a broken one is a probe error.
    let expect = match std::fs::read(&args.expect) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(value) if value.is_object() => value,
            Ok(_) => {
                eprintln!("cudastack-probe: {} is not a JSON object", args.expect);
                return 2;
            }
            Err(e) => {
                eprintln!("cudastack-probe: {} is not valid JSON: {e}", args.expect);
                return 2;
            }
        },
        Err(_) => json!({}),
    };
    // A panic inside a check becomes that check's failure (its message in the detail);
    // keep the default hook's backtrace noise off stderr.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("cudastack-probe: panic inside a check: {info}")
    }));

    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let clock = Instant::now();
    let mut checks = Checks {
        quiet: args.quiet,
        ..Default::default()
    };
    let mut state = State {
        expect,
        ..Default::default()
    };
    let levels: [(&str, LevelFn); 4] = [
        ("static", static_level),
        ("driver", driver_level),
        ("device", device_level),
        ("ops", ops_level),
    ];
    for (level, function) in levels {
        if !args.levels.iter().any(|l| l == level) {
            break;
        }
        function(&mut checks, &mut state);
    }
    if args.levels.iter().any(|l| l == "train") {
        checks.run("train.mlp", "train", || skip(NO_TORCH));
    }
    let gpus = state
        .gpus
        .iter()
        .zip(state.kernels.iter().cloned().chain(std::iter::repeat(None)))
        .map(|(g, k)| gpu::gpu_json(g, k))
        .collect();
    let facts = ReportFacts {
        probe_version: probe_version(),
        started: report::rfc3339(started_unix),
        seconds: (clock.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        hostname: hostname(),
        levels: args.levels.clone(),
        expect: state.expect.clone(),
        driver: state.driver.clone(),
        gpus,
    };
    let value = report::report(facts, &checks);
    eprintln!(
        "{} passed, {} failed, {} skipped",
        checks.count("pass"),
        checks.count("fail"),
        checks.count("skip")
    );
    println!("{}", report::report_line(&value, nonce.as_deref()));
    report::exit_code(&checks)
}

fn main() {
    std::process::exit(real_main());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// expect.json of a torch-free CUDA 12.4 and a CUDA 12.8 image, as cudastack writes
    /// `cuda_archs` for them (src/verify/expect.rs in the main crate checks the lists).
    fn cuda_only(cuda: &str, archs: &str) -> Value {
        json!({"cuda": cuda, "sm": [], "cuda_archs": archs.split(' ').collect::<Vec<_>>()})
    }

    #[test]
    fn gpu_kernels_against_the_toolkits_archs() {
        let v124 = cuda_only(
            "12.4",
            "sm_50 sm_52 sm_60 sm_61 sm_70 sm_72 sm_75 sm_80 sm_86 sm_87 sm_89 sm_90",
        );
        let (slot, verdict) = gpu_kernels(&v124, "NVIDIA H200", 9, 0);
        assert_eq!(slot.as_deref(), Some("sass:sm_90"));
        assert_eq!(verdict.unwrap(), "NVIDIA H200 -> sass:sm_90 (CUDA 12.4)");
        // A Blackwell GPU under a toolkit that predates it: no kernels, said before any launch.
        let (slot, verdict) = gpu_kernels(&v124, "NVIDIA B200", 10, 0);
        assert_eq!(slot.as_deref(), Some("none"));
        let why = verdict.unwrap_err();
        assert!(
            why.contains("NVIDIA B200 is sm_100, and CUDA 12.4 generates code only for sm_50"),
            "{why}"
        );
        // Same-major rule: a 10.3 GPU runs sm_100 code from CUDA 12.8.
        let v128 = cuda_only("12.8", "sm_75 sm_80 sm_86 sm_87 sm_89 sm_90 sm_100 sm_120");
        assert_eq!(
            gpu_kernels(&v128, "B300", 10, 3).0.as_deref(),
            Some("sass:sm_100")
        );
        // Too old for the toolkit's range.
        assert!(gpu_kernels(&v128, "V100", 7, 0).1.is_err());
    }

    #[test]
    fn gpu_kernels_against_a_torch_build_and_an_old_expect_file() {
        let torch =
            json!({"cuda": "12.1", "sm": ["sm_80", "sm_90"], "cuda_archs": ["sm_50", "sm_120"]});
        // The torch build's list wins over the toolkit's.
        assert_eq!(
            gpu_kernels(&torch, "A10", 8, 6).0.as_deref(),
            Some("sass:sm_80")
        );
        assert!(gpu_kernels(&torch, "RTX 5090", 12, 0)
            .1
            .unwrap_err()
            .contains("this build has kernels only for sm_80 sm_90"));
        // expect.json from before `cuda_archs`: the CUDA major's oldest arch only.
        let old = json!({"cuda": "13.0", "sm": []});
        assert!(gpu_kernels(&old, "V100", 7, 0)
            .1
            .unwrap_err()
            .contains("sm_75 and newer"));
        assert_eq!(gpu_kernels(&old, "H200", 9, 0).0, None);
    }

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments() {
        let a = parse_args(&args(&["--level", "device", "--expect=/tmp/e.json"]))
            .unwrap()
            .unwrap();
        assert_eq!(a.levels, args(&["static", "driver", "device"]));
        assert_eq!(a.expect, "/tmp/e.json");
        let a = parse_args(&[]).unwrap().unwrap();
        assert_eq!(a.levels.len(), 5);
        assert_eq!(a.expect, EXPECT_PATH);
        assert!(parse_args(&args(&["--level", "gpu"])).is_err());
        assert!(parse_args(&args(&["--expect"])).is_err());
        assert!(parse_args(&args(&["--help"])).unwrap().is_none());
    }

    #[test]
    fn proc_version_parses() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n";
        assert_eq!(proc_driver_version(text).as_deref(), Some("550.54.15"));
        let open =
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build\n";
        assert_eq!(proc_driver_version(open).as_deref(), Some("560.35.03"));
        assert_eq!(proc_driver_version("nothing"), None);
    }
}
