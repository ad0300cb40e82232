//! `cudastack doctor` on this machine and on planted hosts.
//!
//! A planted host is a temp directory laid out like a root filesystem: a real
//! `/proc/driver/nvidia/version` text, real ELF libraries built here with gcc and
//! `-Wl,-soname` (a driver library exporting the CUDA driver API entry points doctor
//! dlopens, cuDNN copies with their SONAME chains), a real ld.so.cache written by
//! `ldconfig -r`, symlinks, and the real `python3` with a planted `torch` package on
//! `PYTHONPATH`. Each test plants one problem and checks doctor finds it.

use crate::gate;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use cudastack::doctor::{diagnose, DoctorOptions, DoctorReport, Layer, LayerStatus, Severity};
use cudastack::host::HostRoot;

/// Build a shared library from C source with a SONAME; cached per (source, soname, defines).
fn build_library(source: &str, soname: &str, defines: &[&str], out: &Path) {
    static BUILD_DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = BUILD_DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let key = format!("{:x}", {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (source, soname, defines).hash(&mut h);
        h.finish()
    });
    let built = dir.path().join(format!("{key}.so"));
    // Tests run in parallel and share this cache: build under a lock and rename into
    // place, so no test ever copies a library gcc is still writing (a truncated libcuda
    // made `driver.libcuda_load_failed` appear at random and the Docker tests wait).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if !built.exists() {
        let c = dir.path().join(format!("{key}.c"));
        std::fs::write(&c, source).unwrap();
        let partial = dir.path().join(format!("{key}.so.partial"));
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&partial)
            .arg(&c)
            .arg(format!("-Wl,-soname,{soname}"))
            .args(defines.iter().map(|d| format!("-D{d}")))
            .status()
            .expect("gcc runs (scripts/setup.sh installs it)");
        assert!(status.success(), "gcc failed for {soname}");
        std::fs::rename(&partial, &built).unwrap();
    }
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::copy(&built, out).unwrap();
}

const EMPTY_LIBRARY: &str = "int cudastack_planted_library_marker = 1;\n";

/// A driver library with the CUDA driver API entry points doctor calls. The values are
/// compile-time defines so each test plants the driver it needs.
const DRIVER_LIBRARY: &str = r#"
#include <stdio.h>
#include <stddef.h>
#ifndef INIT_RESULT
#define INIT_RESULT 0
#endif
int cuInit(unsigned int flags) { (void)flags; return INIT_RESULT; }
int cuDriverGetVersion(int *v) { *v = DRIVER_CUDA; return 0; }
int cuDeviceGetCount(int *c) { *c = 1; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int d) { (void)d; snprintf(name, len, "%s", GPU_NAME); return 0; }
int cuDeviceGetAttribute(int *v, int attribute, int d) {
    (void)d;
    if (attribute == 75) { *v = CC_MAJOR; return 0; }
    if (attribute == 76) { *v = CC_MINOR; return 0; }
    return 1;
}
int cuDeviceTotalMem_v2(size_t *bytes, int d) { (void)d; *bytes = (size_t)81920 << 20; return 0; }
"#;

struct Plant {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
}

impl Plant {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut env = BTreeMap::new();
        env.insert(
            "PATH".to_string(),
            "/usr/local/bin:/usr/bin:/bin".to_string(),
        );
        env.insert("HOME".to_string(), "/root".to_string());
        Plant { dir, env }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn at(&self, host_path: &str) -> PathBuf {
        self.root().join(host_path.trim_start_matches('/'))
    }
    fn write(&self, host_path: &str, text: &str) {
        let path = self.at(host_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    fn link(&self, host_path: &str, target: &str) {
        let path = self.at(host_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }
    fn mkdir(&self, host_path: &str) {
        std::fs::create_dir_all(self.at(host_path)).unwrap();
    }
    /// A library file `dir/stem.so.VERSION` with SONAME `stem.so.MAJOR` and the link
    /// `dir/stem.so.MAJOR -> stem.so.VERSION`, as packages and tarballs lay them out.
    fn library(&self, dir: &str, stem: &str, version: &str) {
        let major = version.split('.').next().unwrap();
        let soname = format!("{stem}.so.{major}");
        let file = format!("{stem}.so.{version}");
        build_library(
            EMPTY_LIBRARY,
            &soname,
            &[],
            &self.at(&format!("{dir}/{file}")),
        );
        self.link(&format!("{dir}/{soname}"), &file);
    }
    /// A planted NVIDIA driver: kernel module text, libcuda.so.VERSION (+ libcuda.so.1).
    fn driver(&self, kernel: &str, library: &str, cuda: i32, gpu: &str, cc: (u32, u32)) {
        self.write(
            "/proc/driver/nvidia/version",
            &format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kernel}  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"),
        );
        self.driver_library("/usr/lib/x86_64-linux-gnu", library, cuda, gpu, cc, 0);
        self.mkdir("/dev");
        self.write("/dev/nvidia0", "");
    }
    fn driver_library(
        &self,
        dir: &str,
        version: &str,
        cuda: i32,
        gpu: &str,
        cc: (u32, u32),
        init: i32,
    ) {
        let defines = [
            format!("DRIVER_CUDA={cuda}"),
            format!("GPU_NAME=\"{gpu}\""),
            format!("CC_MAJOR={}", cc.0),
            format!("CC_MINOR={}", cc.1),
            format!("INIT_RESULT={init}"),
        ];
        let defines: Vec<&str> = defines.iter().map(String::as_str).collect();
        let file = format!("libcuda.so.{version}");
        build_library(
            DRIVER_LIBRARY,
            "libcuda.so.1",
            &defines,
            &self.at(&format!("{dir}/{file}")),
        );
        self.link(&format!("{dir}/libcuda.so.1"), &file);
    }
    fn toolkit(&self, version: &str) {
        let dir = format!(
            "/usr/local/cuda-{}",
            version.rsplit_once('.').map_or(version, |(a, _)| a)
        );
        self.write(
            &format!("{dir}/version.json"),
            &format!("{{\n   \"cuda\" : {{\n      \"name\" : \"CUDA SDK\",\n      \"version\" : \"{version}\"\n   }}\n}}\n"),
        );
        self.write(&format!("{dir}/bin/nvcc"), "#!/bin/sh\nexit 0\n");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            self.at(&format!("{dir}/bin/nvcc")),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        self.library(
            &format!("{dir}/lib64"),
            "libcudart",
            &format!("{}.{}", version.split('.').next().unwrap(), "0.0"),
        );
    }
    /// Write ld.so.conf and, when ldconfig can chroot (root), a real ld.so.cache.
    fn ld_so_conf(&self, dirs: &[&str]) -> bool {
        self.write("/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n");
        self.write(
            "/etc/ld.so.conf.d/planted.conf",
            &format!("{}\n", dirs.join("\n")),
        );
        Command::new("ldconfig")
            .arg("-r")
            .arg(self.root())
            .arg("-X")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
            && self.at("/etc/ld.so.cache").exists()
    }
    fn env(&mut self, name: &str, value: &str) {
        self.env.insert(name.to_string(), value.to_string());
    }
    fn host(&self) -> HostRoot {
        HostRoot::planted(self.root(), self.env.clone())
    }
    fn diagnose(&self, keep_going: bool) -> DoctorReport {
        diagnose(
            &self.host(),
            &DoctorOptions {
                keep_going,
                python_timeout: Duration::from_secs(60),
                gpu_image: None,
            },
        )
    }
}

fn ids(report: &DoctorReport) -> Vec<String> {
    report.findings().map(|f| f.id.clone()).collect()
}

fn assert_finding<'a>(
    report: &'a DoctorReport,
    id: &str,
    severity: Severity,
) -> &'a cudastack::doctor::Finding {
    let finding = report
        .finding(id)
        .unwrap_or_else(|| panic!("no finding {id}; found {:?}", ids(report)));
    assert_eq!(finding.severity, severity, "{id}: {finding:?}");
    assert!(
        finding.severity <= Severity::Info || finding.fix.is_some(),
        "{id} has no fix"
    );
    finding
}

#[test]
fn this_machine_funnel_is_honest() {
    let binary = env!("CARGO_BIN_EXE_cudastack");
    let output = Command::new(binary)
        .args(["doctor", "--json", "--keep-going", "--python-timeout", "60"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    assert_eq!(json["schema"], "cudastack.doctor/v1");
    assert_eq!(json["layers"].as_array().unwrap().len(), 4);
    let all_ids: Vec<String> = json["layers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["findings"].as_array().unwrap().iter())
        .map(|f| f["id"].as_str().unwrap().to_string())
        .collect();
    if Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!("this machine has an NVIDIA driver: checking it is reported");
        assert!(
            all_ids.contains(&"driver.kernel_module".to_string()),
            "{all_ids:?}"
        );
    } else if !std::fs::read_dir("/sys/bus/pci/devices")
        .unwrap()
        .filter_map(Result::ok)
        .any(|d| {
            std::fs::read_to_string(d.path().join("vendor")).is_ok_and(|v| v.trim() == "0x10de")
        })
    {
        // No GPU here: a build host, not a broken one. The hardware layer says so, the
        // layers that need a GPU are not checked, and doctor exits 0.
        assert_eq!(json["stopped_at"], serde_json::Value::Null, "{json}");
        assert!(all_ids.contains(&"host.no_gpu".to_string()), "{all_ids:?}");
        for layer in &json["layers"].as_array().unwrap()[1..] {
            assert_eq!(layer["status"], "not_checked", "{layer}");
        }
        assert_eq!(json["recommendation"]["status"], "not_possible");
        assert_eq!(output.status.code(), Some(0));
    } else {
        // A GPU without a driver: the funnel stops at the hardware layer; exit status 1.
        assert_eq!(json["stopped_at"], "hardware");
        assert!(
            all_ids.contains(&"driver.no_kernel_module".to_string()),
            "{all_ids:?}"
        );
        assert_eq!(output.status.code(), Some(1));
    }
    // Docker present or not: the answer must match what the socket does: in the
    // container runtime layer, or, on a host without a GPU, in the build host's report.
    let socket = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"));
    let reachable = std::os::unix::net::UnixStream::connect(&socket).is_ok();
    eprintln!("docker socket {} reachable: {reachable}", socket.display());
    if all_ids.contains(&"host.no_gpu".to_string()) {
        let docker = json["build_host"]["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == "build.docker")
            .unwrap_or_else(|| panic!("no build.docker: {json}"));
        assert_eq!(docker["severity"] == "ok", reachable, "{docker}");
    } else if reachable {
        assert!(
            all_ids.contains(&"docker.reachable".to_string()),
            "{all_ids:?}"
        );
    } else {
        assert!(
            all_ids.contains(&"docker.unreachable".to_string()),
            "{all_ids:?}"
        );
    }
    // Without --keep-going nothing above the first broken layer is examined.
    let output = Command::new(binary)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    if let Some(stopped) = json["stopped_at"].as_str() {
        let layers = json["layers"].as_array().unwrap();
        let position = layers.iter().position(|l| l["layer"] == stopped).unwrap();
        for layer in &layers[position + 1..] {
            assert_eq!(layer["status"], "not_checked", "{layer}");
        }
    }
}

#[test]
fn planted_healthy_driver_is_read_through_libcuda_and_solved_for() {
    let plant = Plant::new();
    plant.driver(
        "535.104.05",
        "535.104.05",
        12020,
        "NVIDIA A100-SXM4-80GB",
        (8, 0),
    );
    let report = plant.diagnose(true);
    let hardware = report.layer(Layer::Hardware);
    assert_eq!(hardware.status, LayerStatus::Ok, "{:#?}", hardware.findings);
    assert_finding(&report, "driver.kernel_module", Severity::Ok);
    let libcuda = assert_finding(&report, "driver.libcuda", Severity::Ok);
    assert!(
        libcuda.summary.contains("CUDA <= 12.2"),
        "{}",
        libcuda.summary
    );
    assert_eq!(report.host.gpus.len(), 1);
    assert_eq!(report.host.gpus[0].name, "NVIDIA A100-SXM4-80GB");
    assert_eq!(report.host.gpus[0].source, "libcuda");
    assert_eq!(report.host.gpus[0].cc.unwrap().to_string(), "8.0");
    assert_eq!(report.host.gpus[0].memory_mib, Some(81920));
    assert_eq!(
        report.host.driver.as_ref().unwrap().to_string(),
        "535.104.05"
    );
    assert_eq!(
        report.recommendation.status, "picked",
        "{:?}",
        report.recommendation
    );
    let best = report.recommendation.best.as_ref().unwrap();
    // A 535 driver natively supports CUDA <= 12.2; minor-version compat may allow more
    // within 12.x, never 13. The newest torch that runs comes first (issue 24: today
    // 2.7.1+cu118), so the best answer's CUDA may be 11.x.
    assert!(best.cuda.major <= 12, "{best:?}");
    assert!(!best.minor_compat, "{best:?}");
}

#[test]
fn planted_driver_library_mismatch() {
    let plant = Plant::new();
    plant.driver("535.104.05", "535.129.03", 12020, "NVIDIA A10", (8, 6));
    let report = plant.diagnose(false);
    let finding = assert_finding(&report, "driver.library_mismatch", Severity::Error);
    assert!(
        finding.summary.contains("535.104.05") && finding.summary.contains("535.129.03"),
        "{}",
        finding.summary
    );
    assert_eq!(report.stopped_at, Some(Layer::Hardware));
    assert_eq!(
        report.layer(Layer::ContainerRuntime).status,
        LayerStatus::NotChecked
    );
}

#[test]
fn planted_stub_libcuda_first_on_the_path() {
    let mut plant = Plant::new();
    plant.driver("550.54.15", "550.54.15", 12040, "NVIDIA L4", (8, 9));
    // The toolkit's stub (cuInit returns CUDA_ERROR_STUB_LIBRARY) first on LD_LIBRARY_PATH.
    plant.driver_library(
        "/usr/local/cuda-12.4/lib64/stubs",
        "550.54.15",
        12040,
        "stub",
        (0, 0),
        34,
    );
    plant.env("LD_LIBRARY_PATH", "/usr/local/cuda-12.4/lib64/stubs");
    let report = plant.diagnose(false);
    let finding = assert_finding(&report, "driver.cuinit_failed", Severity::Error);
    assert!(
        finding
            .evidence
            .iter()
            .any(|e| e.contains("CUDA_ERROR_STUB_LIBRARY")),
        "{finding:?}"
    );
    assert!(finding.fix.as_ref().unwrap().contains("stubs"));
}

/// A PCI device in sysfs's layout: its vendor and class files.
fn plant_pci_device(plant: &Plant, address: &str, vendor: &str, class: &str) {
    plant.write(
        &format!("/sys/bus/pci/devices/{address}/vendor"),
        &format!("{vendor}\n"),
    );
    plant.write(
        &format!("/sys/bus/pci/devices/{address}/class"),
        &format!("{class}\n"),
    );
}

#[test]
fn a_host_without_an_nvidia_gpu_is_a_build_host_not_a_broken_one() {
    let plant = Plant::new();
    plant_pci_device(&plant, "0000:00:02.0", "0x8086", "0x030000");
    plant_pci_device(&plant, "0000:00:1f.0", "0x8086", "0x060100");
    let report = plant.diagnose(false);
    assert_finding(&report, "host.no_gpu", Severity::Info);
    assert_eq!(report.stopped_at, None, "{:?}", ids(&report));
    for layer in &report.layers[1..] {
        assert_eq!(layer.status, LayerStatus::NotChecked, "{layer:?}");
    }
    assert!(report.finding("driver.no_kernel_module").is_none());

    // An NVIDIA controller without its driver is a GPU host that is broken.
    plant_pci_device(&plant, "0000:3b:00.0", "0x10de", "0x030200");
    let report = plant.diagnose(false);
    assert_finding(&report, "driver.no_kernel_module", Severity::Error);
    assert_eq!(report.stopped_at, Some(Layer::Hardware));
    assert!(report.finding("host.no_gpu").is_none());
}

#[test]
fn planted_nouveau_and_no_nvidia_module() {
    let plant = Plant::new();
    plant.write("/proc/modules", "nouveau 2306048 1 - Live 0x0000000000000000\nmxm_wmi 16384 1 nouveau, Live 0x0000000000000000\n");
    let report = plant.diagnose(false);
    assert_finding(&report, "driver.nouveau", Severity::Error);
    assert_finding(&report, "driver.no_kernel_module", Severity::Error);
    assert_finding(&report, "driver.no_libcuda", Severity::Error);
    assert_eq!(report.recommendation.status, "not_possible");
}

#[test]
fn planted_wsl_with_a_linux_driver_inside() {
    let plant = Plant::new();
    plant.write("/proc/version", "Linux version 5.15.153.1-microsoft-standard-WSL2 (root@941d701f84f1) (gcc (GCC) 11.2.0) #1 SMP\n");
    plant.driver_library(
        "/usr/lib/wsl/lib",
        "1.1",
        12060,
        "NVIDIA GeForce RTX 4090",
        (8, 9),
        0,
    );
    plant.driver_library(
        "/usr/lib/x86_64-linux-gnu",
        "550.54.14",
        12040,
        "NVIDIA GeForce RTX 4090",
        (8, 9),
        0,
    );
    let report = plant.diagnose(false);
    let finding = assert_finding(&report, "wsl.linux_driver_installed", Severity::Error);
    assert!(
        finding
            .evidence
            .iter()
            .any(|e| e.contains("/usr/lib/x86_64-linux-gnu/libcuda.so")),
        "{finding:?}"
    );
    assert_finding(&report, "wsl.passthrough", Severity::Ok);
    // No kernel module is expected under WSL.
    assert!(report.finding("driver.no_kernel_module").is_none());
}

#[test]
fn planted_dangling_cuda_link() {
    let plant = Plant::new();
    plant.toolkit("12.1.105");
    plant.link("/usr/local/cuda", "/usr/local/cuda-11.8");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.cuda_link_dangling", Severity::Error);
    assert!(
        finding.summary.contains("/usr/local/cuda-11.8"),
        "{}",
        finding.summary
    );
    assert!(
        finding
            .fix
            .as_ref()
            .unwrap()
            .contains("ln -sfn /usr/local/cuda-12.1"),
        "{finding:?}"
    );
    assert_eq!(report.layer(Layer::HostStack).status, LayerStatus::Broken);
}

#[test]
fn planted_ld_library_path_with_two_cuda_versions() {
    let mut plant = Plant::new();
    plant.toolkit("11.8.89");
    plant.toolkit("12.1.105");
    plant.link("/usr/local/cuda", "/usr/local/cuda-12.1");
    plant.env(
        "LD_LIBRARY_PATH",
        "/usr/local/cuda/lib64:/usr/local/cuda-11.8/lib64:/opt/gone/lib",
    );
    plant.env("PATH", "/usr/local/cuda-11.8/bin:/usr/bin:/bin");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.ld_library_path_mixed", Severity::Warning);
    assert!(
        finding.summary.contains("11.8") && finding.summary.contains("12.1"),
        "{}",
        finding.summary
    );
    assert_eq!(
        finding.evidence[0],
        "1. /usr/local/cuda/lib64 (CUDA 12.1.105)"
    );
    assert_eq!(
        finding.evidence[1],
        "2. /usr/local/cuda-11.8/lib64 (CUDA 11.8.89)"
    );
    assert_eq!(finding.evidence[2], "3. /opt/gone/lib (missing)");
    assert_finding(&report, "stack.ld_library_path_missing_dir", Severity::Info);
    // nvcc from 11.8 while /usr/local/cuda is 12.1.
    let nvcc = assert_finding(&report, "stack.nvcc", Severity::Warning);
    assert!(nvcc.summary.contains("cuda-11.8"), "{}", nvcc.summary);
}

#[test]
fn planted_two_libcudnn_versions_on_the_loader_path() {
    let mut plant = Plant::new();
    plant.library("/opt/cudnn-8.9.7/lib", "libcudnn", "8.9.7");
    plant.library("/usr/local/cudnn-8.2.4/lib64", "libcudnn", "8.2.4");
    let cached = plant.ld_so_conf(&["/usr/local/cudnn-8.2.4/lib64"]);
    plant.env("LD_LIBRARY_PATH", "/opt/cudnn-8.9.7/lib");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.library_versions", Severity::Error);
    assert!(
        finding.summary.contains("libcudnn.so.8"),
        "{}",
        finding.summary
    );
    assert!(
        finding.evidence[0].contains("/opt/cudnn-8.9.7/lib/libcudnn.so.8")
            && finding.evidence[0].contains("(8.9.7) [LD_LIBRARY_PATH]"),
        "{:?}",
        finding.evidence
    );
    let source = if cached {
        "[ld.so.cache]"
    } else {
        "[ld.so.conf]"
    };
    if !cached {
        eprintln!(
            "ldconfig -r could not build a cache here (needs root): checked through ld.so.conf"
        );
    }
    assert!(
        finding.evidence[1].contains("(8.2.4)") && finding.evidence[1].ends_with(source),
        "{:?}",
        finding.evidence
    );
    // Both are partial cuDNN 8 sets (only libcudnn.so.8).
    assert_finding(&report, "stack.cudnn_partial", Severity::Error);
}

#[test]
fn planted_stale_libcudnn_in_the_system_directory() {
    let mut plant = Plant::new();
    plant.library("/usr/lib/x86_64-linux-gnu", "libcudnn", "8.2.4");
    plant.library("/usr/local/cuda-12.1/lib64", "libcudnn", "8.9.7");
    for sub in [
        "libcudnn_adv_infer",
        "libcudnn_adv_train",
        "libcudnn_cnn_infer",
        "libcudnn_cnn_train",
        "libcudnn_ops_infer",
        "libcudnn_ops_train",
    ] {
        plant.library("/usr/local/cuda-12.1/lib64", sub, "8.9.7");
        plant.library("/usr/lib/x86_64-linux-gnu", sub, "8.2.4");
    }
    plant.env("LD_LIBRARY_PATH", "/usr/local/cuda-12.1/lib64");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.stale_system_copy", Severity::Error);
    assert!(
        finding.summary.contains("8.2.4") && finding.summary.contains("8.9.7"),
        "{}",
        finding.summary
    );
    assert!(finding
        .fix
        .as_ref()
        .unwrap()
        .contains("/usr/lib/x86_64-linux-gnu"));
    assert!(
        finding
            .evidence
            .iter()
            .any(|e| e.ends_with("libcudnn.so.8.2.4 belongs to no dpkg package (copied by hand)")),
        "{finding:?}"
    );
    // Complete sets: no partial finding.
    assert!(
        report.finding("stack.cudnn_partial").is_none(),
        "{:?}",
        ids(&report)
    );
}

#[test]
fn planted_conda_env_with_its_own_runtime() {
    let mut plant = Plant::new();
    plant.library("/root/miniconda3/envs/train/lib", "libcudart", "11.8.89");
    plant.library("/root/miniconda3/envs/train/lib", "libcudnn", "8.9.2");
    plant.mkdir("/root/miniconda3/lib");
    plant.env("CONDA_PREFIX", "/root/miniconda3/envs/train");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.conda_env", Severity::Info);
    assert!(
        finding
            .summary
            .contains("/root/miniconda3/envs/train (active)"),
        "{}",
        finding.summary
    );
    assert_eq!(finding.evidence[0], "libcudart 11.8.89, libcudnn 8.9.2");
}

/// The interpreter itself (not a shim), so it runs with a planted environment.
fn real_python() -> Option<PathBuf> {
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    path.is_file().then_some(path)
}

/// A `torch` package with the attributes the probe reads, on PYTHONPATH.
fn plant_torch(
    plant: &mut Plant,
    version: &str,
    cuda: Option<&str>,
    cudnn: Option<u32>,
    archs: &[&str],
) -> bool {
    plant_torch_loading(plant, version, cuda, cudnn, archs, &[])
}

/// The same, and its import maps `load` (host paths) into the process with ctypes, as a real
/// torch maps its cuDNN.
fn plant_torch_loading(
    plant: &mut Plant,
    version: &str,
    cuda: Option<&str>,
    cudnn: Option<u32>,
    archs: &[&str],
    load: &[&str],
) -> bool {
    let Some(python) = real_python() else {
        gate::skip("python3", "no python3 on this machine");
        return false;
    };
    plant.link("/usr/bin/python3", python.to_str().unwrap());
    let cuda = cuda.map_or("None".to_string(), |c| format!("'{c}'"));
    let cudnn = cudnn.map_or("None".to_string(), |c| c.to_string());
    let loads: String = load
        .iter()
        .map(|host_path| {
            format!(
                "ctypes.CDLL({:?})\n",
                plant.at(host_path).display().to_string()
            )
        })
        .collect();
    plant.write(
        "/opt/site/torch/__init__.py",
        &format!(
            "import ctypes\n{loads}__version__ = '{version}'\nclass version:\n    cuda = {cuda}\nclass backends:\n    class cudnn:\n        @staticmethod\n        def version():\n            return {cudnn}\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n    @staticmethod\n    def get_arch_list():\n        return {archs:?}\n"
        ),
    );
    let site = plant.at("/opt/site");
    plant.env("PYTHONPATH", site.to_str().unwrap());
    plant.env("PATH", "/usr/bin:/bin");
    true
}

#[test]
fn planted_cpu_only_torch_on_a_gpu_host() {
    let mut plant = Plant::new();
    plant.driver(
        "550.54.15",
        "550.54.15",
        12040,
        "NVIDIA H100 80GB HBM3",
        (9, 0),
    );
    if !plant_torch(&mut plant, "2.4.1+cpu", None, None, &[]) {
        return;
    }
    let report = plant.diagnose(true);
    assert_eq!(report.host.torch.as_deref(), Some("2.4.1+cpu"));
    assert_finding(&report, "python.torch_cpu_only", Severity::Error);
}

#[test]
fn planted_cu124_torch_on_a_470_driver_without_sm80_kernels() {
    let mut plant = Plant::new();
    plant.driver(
        "470.82.01",
        "470.82.01",
        11040,
        "NVIDIA A100-SXM4-80GB",
        (8, 0),
    );
    if !plant_torch(
        &mut plant,
        "2.5.1+cu124",
        Some("12.4"),
        Some(90100),
        &["sm_50", "sm_60", "sm_70", "sm_75"],
    ) {
        return;
    }
    let report = plant.diagnose(true);
    let above = assert_finding(&report, "python.torch_cuda_above_driver", Severity::Error);
    assert!(
        above.summary.contains("CUDA 12.4") && above.summary.contains("CUDA <= 11.4"),
        "{}",
        above.summary
    );
    assert!(
        above.fix.as_ref().unwrap().contains("550.54.14"),
        "{above:?}"
    );
    assert_finding(&report, "python.torch_no_kernels", Severity::Error);
    assert_finding(&report, "python.cuda_unavailable", Severity::Error);
}

#[test]
fn planted_torch_mapping_a_system_cudnn_and_a_second_copy() {
    let mut plant = Plant::new();
    plant.driver(
        "550.54.15",
        "550.54.15",
        12040,
        "NVIDIA H100 80GB HBM3",
        (9, 0),
    );
    plant.library("/usr/lib/x86_64-linux-gnu", "libcudnn", "9.0.0");
    plant.library("/opt/other/lib", "libcudnn", "9.1.0");
    if !plant_torch_loading(
        &mut plant,
        "2.4.1",
        Some("12.1"),
        Some(90100),
        &["sm_80", "sm_90"],
        &[
            "/usr/lib/x86_64-linux-gnu/libcudnn.so.9",
            "/opt/other/lib/libcudnn.so.9.1.0",
        ],
    ) {
        return;
    }
    let report = plant.diagnose(true);
    let two = assert_finding(&report, "python.cudnn_two_copies", Severity::Error);
    assert_eq!(two.evidence.len(), 2, "{two:?}");
    let outside = assert_finding(&report, "python.cudnn_outside_env", Severity::Warning);
    assert!(
        outside
            .evidence
            .iter()
            .any(|e| e.ends_with("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.0.0")),
        "{outside:?}"
    );
}

#[test]
fn cli_root_and_json_shape() {
    let plant = Plant::new();
    plant.link("/usr/local/cuda", "/usr/local/cuda-12.4");
    let output = Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(["doctor", "--json", "--keep-going", "--root"])
        .arg(plant.root())
        .env("PATH", "/nonexistent")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("CONDA_PREFIX")
        .env("DOCKER_HOST", "unix:///var/run/planted-docker.sock")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["root"], plant.root().display().to_string());
    assert_eq!(json["stopped_at"], "hardware");
    let layer = |name: &str| {
        json["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["layer"] == name)
            .unwrap()
            .clone()
    };
    let runtime = layer("container_runtime");
    assert_eq!(runtime["findings"][0]["id"], "docker.unreachable");
    assert_eq!(runtime["findings"][0]["severity"], "error");
    let stack = layer("host_stack");
    assert!(stack["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == "stack.cuda_link_dangling"));
    assert_eq!(layer("python")["findings"][0]["id"], "python.not_found");
    for finding in json["layers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["findings"].as_array().unwrap())
    {
        for key in ["id", "severity", "summary", "evidence"] {
            assert!(finding.get(key).is_some(), "{key} missing in {finding}");
        }
    }
}

/// Serve one `GET /info` on a planted Docker socket the way dockerd answers an HTTP/1.0
/// request (headers, JSON body, close).
fn serve_docker_info(socket: &Path, body: &'static str) -> std::thread::JoinHandle<String> {
    use std::io::{Read, Write};
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
    // Never block a test forever: a doctor that does not connect within 30 s fails it.
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return format!("no connection: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        let mut request = [0u8; 1024];
        let n = stream.read(&mut request).unwrap();
        let request = String::from_utf8_lossy(&request[..n]).into_owned();
        write!(
            stream,
            "HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nServer: Docker/20.10.24+dfsg1 (linux)\r\n\r\n{body}\n"
        )
        .unwrap();
        request
    })
}

#[test]
fn planted_docker_with_the_nvidia_runtime() {
    let plant = Plant::new();
    plant.driver("550.54.15", "550.54.15", 12040, "NVIDIA L40S", (8, 9));
    let server = serve_docker_info(
        &plant.at("/var/run/docker.sock"),
        r#"{"ID":"7TRN:IPZB","Containers":0,"ServerVersion":"20.10.24+dfsg1","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}},"DefaultRuntime":"runc","OperatingSystem":"Debian GNU/Linux 12 (bookworm)"}"#,
    );
    let report = plant.diagnose(false);
    let request = server.join().unwrap();
    assert!(
        request.starts_with("GET /info HTTP/1.0\r\n"),
        "{request}\n{:?}",
        ids(&report)
    );
    assert_finding(&report, "docker.reachable", Severity::Ok);
    let runtime = assert_finding(&report, "docker.nvidia_runtime", Severity::Ok);
    assert!(
        runtime.summary.contains("nvidia runtime is registered"),
        "{runtime:?}"
    );
    assert_eq!(
        report.layer(Layer::ContainerRuntime).status,
        LayerStatus::Ok
    );
}

#[test]
fn planted_docker_without_gpu_support_and_a_stale_socket() {
    let plant = Plant::new();
    plant.driver("550.54.15", "550.54.15", 12040, "NVIDIA L40S", (8, 9));
    let server = serve_docker_info(
        &plant.at("/var/run/docker.sock"),
        r#"{"ServerVersion":"20.10.24+dfsg1","Runtimes":{"runc":{"path":"runc"}},"DefaultRuntime":"runc"}"#,
    );
    let report = plant.diagnose(false);
    let request = server.join().unwrap();
    assert!(
        request.starts_with("GET /info"),
        "{request}\n{:?}",
        ids(&report)
    );
    let finding = assert_finding(&report, "docker.no_nvidia_runtime", Severity::Error);
    assert!(finding
        .fix
        .as_ref()
        .unwrap()
        .contains("nvidia-ctk runtime configure"));
    assert_eq!(report.stopped_at, Some(Layer::ContainerRuntime));
    assert_eq!(
        report.layer(Layer::HostStack).status,
        LayerStatus::NotChecked
    );

    // The listener is gone, its socket file stays: a daemon that died.
    let report = plant.diagnose(false);
    let finding = assert_finding(&report, "docker.unreachable", Severity::Error);
    assert!(finding.summary.contains("no daemon answers"), "{finding:?}");

    // A CDI spec is another way for GPUs to reach containers.
    let plant = Plant::new();
    plant.write(
        "/etc/cdi/nvidia.yaml",
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n",
    );
    let server = serve_docker_info(
        &plant.at("/var/run/docker.sock"),
        r#"{"ServerVersion":"25.0.3","Runtimes":{"runc":{"path":"runc"}},"DefaultRuntime":"runc"}"#,
    );
    let report = plant.diagnose(true);
    server.join().unwrap();
    let runtime = assert_finding(&report, "docker.nvidia_runtime", Severity::Ok);
    assert!(runtime.summary.contains("CDI"), "{runtime:?}");
}

#[test]
fn planted_nvml_reports_the_version_mismatch() {
    let plant = Plant::new();
    // The libraries agree by name; NVML itself refuses (NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    // as it does when the loaded module is older than what /proc shows after a reinstall.
    plant.driver("535.183.01", "535.183.01", 12020, "NVIDIA A10", (8, 6));
    build_library(
        "int nvmlInit_v2(void) { return 18; }\nint nvmlShutdown(void) { return 0; }\n",
        "libnvidia-ml.so.1",
        &[],
        &plant.at("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01"),
    );
    plant.link(
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libnvidia-ml.so.535.183.01",
    );
    let report = plant.diagnose(false);
    let finding = assert_finding(&report, "driver.library_mismatch", Severity::Error);
    assert!(
        finding.evidence[0].contains("NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
        "{finding:?}"
    );

    // A healthy NVML gives the driver version.
    let plant = Plant::new();
    plant.driver("535.183.01", "535.183.01", 12020, "NVIDIA A10", (8, 6));
    build_library(
        "#include <stdio.h>\nint nvmlInit_v2(void) { return 0; }\nint nvmlShutdown(void) { return 0; }\nint nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, \"535.183.01\"); return 0; }\n",
        "libnvidia-ml.so.1",
        &[],
        &plant.at("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01"),
    );
    plant.link(
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libnvidia-ml.so.535.183.01",
    );
    let report = plant.diagnose(false);
    assert!(
        report.finding("driver.library_mismatch").is_none(),
        "{:?}",
        ids(&report)
    );
    let nvml = cudastack::host::driver::detect(&plant.host()).nvml;
    assert!(
        matches!(&nvml, cudastack::host::driver::NvmlProbe::Ok { driver_version: Some(v), .. } if v == "535.183.01"),
        "{nvml:?}"
    );
}

#[test]
fn planted_packaged_old_cuda_runtime_is_a_warning() {
    let mut plant = Plant::new();
    // Debian's nvidia-cuda-toolkit puts an older runtime in the system directory; a newer
    // toolkit sits on LD_LIBRARY_PATH.
    plant.library("/usr/lib/x86_64-linux-gnu", "libcudart", "12.0.146");
    plant.library("/usr/local/cuda-12.4/lib64", "libcudart", "12.4.127");
    plant.write(
        "/var/lib/dpkg/info/libcudart12:amd64.list",
        "/.\n/usr\n/usr/lib\n/usr/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu/libcudart.so.12.0.146\n/usr/lib/x86_64-linux-gnu/libcudart.so.12\n",
    );
    plant.env("LD_LIBRARY_PATH", "/usr/local/cuda-12.4/lib64");
    let report = plant.diagnose(true);
    let finding = assert_finding(&report, "stack.stale_system_copy", Severity::Warning);
    assert!(
        finding
            .evidence
            .iter()
            .any(|e| e.ends_with("is installed by the package libcudart12:amd64")),
        "{finding:?}"
    );
    assert_ne!(report.layer(Layer::HostStack).status, LayerStatus::Broken);
}

/// Issue 16: `doctor --root /nonexistent` read as a host with no driver ("no driver",
/// exit 1). A root that is not a directory is an error naming the path, exit 2, and no
/// diagnosis is printed.
#[test]
fn cli_root_that_is_not_a_directory_is_an_error() {
    let work = tempfile::tempdir().unwrap();
    let missing = work.path().join("no-such-host");
    let file = work.path().join("a-file");
    std::fs::write(&file, "not a root\n").unwrap();
    for (root, what) in [(&missing, "does not exist"), (&file, "is not a directory")] {
        for json in [false, true] {
            let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
            if json {
                command.arg("--json");
            }
            let output = command
                .args(["doctor", "--root"])
                .arg(root)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{stderr}");
            assert!(
                stderr.contains(&format!("the host root `{}` {what}", root.display())),
                "{stderr}"
            );
            assert!(stderr.contains("hint:"), "{stderr}");
            assert!(
                output.stdout.is_empty(),
                "{}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
    }
}

#[test]
fn planted_host_accepts_a_directory_only() {
    let work = tempfile::tempdir().unwrap();
    assert!(cudastack::doctor::planted_host(work.path(), BTreeMap::new()).is_ok());
    let missing = work.path().join("missing");
    assert!(matches!(
        cudastack::doctor::planted_host(&missing, BTreeMap::new()),
        Err(cudastack::doctor::DoctorError::RootMissing { path }) if path == missing
    ));
}
