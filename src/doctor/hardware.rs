//! Layer 1 of the funnel: are there GPUs, is the driver loaded, does the library that
//! programs load (`libcuda.so.1`) agree with the kernel module, and what CUDA does it
//! support. Also the two host situations that break everything above: `nouveau` bound to
//! the GPU, and WSL2 with a Linux driver installed inside it.

use super::{Finding, Severity};
use crate::host::driver::{CuResult, DriverReport, LibcudaProbe, NvidiaSmiProbe, NvmlProbe, Wsl};
use crate::host::HostRoot;
use crate::matrix::Matrix;

/// The hardware checks in report order: WSL2, nouveau, the kernel module, libcuda, the
/// kernel module against the user-space libraries, the GPUs, the CUDA ceiling.
pub fn check(_host: &HostRoot, report: &DriverReport, matrix: &Matrix) -> Vec<Finding> {
    if report.no_gpu_hardware() {
        return vec![no_gpu_finding()];
    }
    let mut findings = Vec::new();
    if let Some(wsl) = &report.wsl {
        findings.extend(wsl_findings(wsl));
    }
    findings.extend(nouveau_finding(report));
    findings.extend(kernel_module_finding(report));
    findings.push(libcuda_finding(&report.libcuda));
    findings.extend(version_mismatch_findings(report));
    findings.extend(gpu_findings(report, matrix));
    findings.extend(cuda_ceiling_finding(report));
    findings
}

/// WSL2: the driver is the Windows one, seen through /usr/lib/wsl/lib; no kernel module.
fn wsl_findings(wsl: &Wsl) -> Vec<Finding> {
    let mut findings = Vec::new();
    if !wsl.linux_driver_libraries.is_empty() {
        findings.push(
            Finding::new(
                "wsl.linux_driver_installed",
                Severity::Error,
                "a Linux NVIDIA driver is installed inside WSL2; its libcuda shadows the Windows driver's passthrough library and breaks CUDA",
            )
            .evidences(wsl.linux_driver_libraries.iter().map(|p| format!("found {}", p.display())))
            .fix("remove the Linux driver packages inside WSL (`sudo apt purge 'nvidia-driver-*' 'libnvidia-compute-*'`), keep only the Windows driver, then `wsl --shutdown`"),
        );
    }
    if !wsl.passthrough_libcuda {
        findings.push(
            Finding::new(
                "wsl.no_passthrough",
                Severity::Error,
                "WSL2 without /usr/lib/wsl/lib/libcuda.so.1: the Windows NVIDIA driver does not expose CUDA to this distribution",
            )
            .evidence("/proc/version names Microsoft (WSL)")
            .fix("install a current NVIDIA driver on Windows (it provides WSL CUDA support), run `wsl --update` and `wsl --shutdown`"),
        );
    } else {
        findings.push(
            Finding::new(
                "wsl.passthrough",
                Severity::Ok,
                "WSL2: the driver comes from Windows through /usr/lib/wsl/lib",
            )
            .evidence("/usr/lib/wsl/lib/libcuda.so.1 present"),
        );
    }
    findings
}

fn nouveau_finding(report: &DriverReport) -> Option<Finding> {
    report.nouveau_loaded.then(|| {
        Finding::new(
            "driver.nouveau",
            Severity::Error,
            "the open-source nouveau driver is loaded; the NVIDIA kernel module cannot bind the GPU while it is",
        )
        .evidence("nouveau in /proc/modules or /sys/module/nouveau")
        .fix("blacklist nouveau (`echo 'blacklist nouveau\\noptions nouveau modeset=0' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf`), `sudo update-initramfs -u`, reboot, then install the NVIDIA driver")
    })
}

/// A host without an NVIDIA GPU builds images; it is not broken.
fn no_gpu_finding() -> Finding {
    Finding::new(
        "host.no_gpu",
        Severity::Info,
        "no NVIDIA GPU on this host (no NVIDIA controller on the PCI bus, no driver): it can build images, and verification needs a GPU host",
    )
    .evidence("/sys/bus/pci/devices: no device of vendor 0x10de, class 0x03")
    .evidence("/proc/driver/nvidia/version: absent")
    .fix("`cudastack doctor --build-host` checks what a build needs; verify on a GPU host, or emit its job with `cudastack verify IMAGE --emit k8s-job`")
}

/// The kernel module (WSL2 has none, and needs none).
fn kernel_module_finding(report: &DriverReport) -> Option<Finding> {
    match &report.kernel_module {
        Some(module) => Some(
            Finding::new(
                "driver.kernel_module",
                Severity::Ok,
                format!(
                    "NVIDIA kernel module {}{} loaded",
                    module.version,
                    if module.open { " (open)" } else { "" }
                ),
            )
            .evidence(format!("/proc/driver/nvidia/version: {}", module.line)),
        ),
        None if report.wsl.is_none() => Some(
            Finding::new(
                "driver.no_kernel_module",
                Severity::Error,
                "no NVIDIA kernel module is loaded (/proc/driver/nvidia/version is missing): no GPU is usable on this host",
            )
            .evidence("/proc/driver/nvidia/version: absent")
            .evidences(device_nodes_evidence(report))
            .fix("if this machine has an NVIDIA GPU, install the driver (`sudo apt install nvidia-driver-<branch>` or NVIDIA's .run) and reboot; check `lspci | grep -i nvidia` and `dmesg | grep -i nvrm` (Secure Boot can refuse the module). Images can still be built here; verification needs a GPU host"),
        ),
        None => None,
    }
}

/// The library programs load.
fn libcuda_finding(libcuda: &LibcudaProbe) -> Finding {
    match libcuda {
        LibcudaProbe::NotFound { searched } => Finding::new(
            "driver.no_libcuda",
            Severity::Error,
            "libcuda.so.1 (the driver library every CUDA program loads) is not on the loader path",
        )
        .evidence(format!("searched LD_LIBRARY_PATH, ld.so.cache and {searched} directories in all"))
        .fix("install the driver's user-space libraries (same version as the kernel module); on WSL2 add /usr/lib/wsl/lib to the loader path"),
        LibcudaProbe::NotLoadable { path, reason } => Finding::new(
            "driver.libcuda_not_loaded",
            Severity::Info,
            format!("{path} was not loaded: {reason}; the driver and GPUs were read from /proc and nvidia-smi"),
        )
        .fix("to check that CUDA programs can load and initialise the driver, run a cudastack built with glibc (`cargo install --locked`) or `nvidia-smi`"),
        LibcudaProbe::LoadFailed { path, error } => {
            Finding::new("driver.libcuda_load_failed", Severity::Error, format!("{path} could not be loaded"))
                .evidence(error.clone())
                .fix("reinstall the driver's user-space libraries so they match the kernel module")
        }
        LibcudaProbe::Loaded { path, init, cuda_version, device_count } => {
            if init.ok() {
                Finding::new(
                    "driver.libcuda",
                    Severity::Ok,
                    format!(
                        "{path}: cuInit succeeded, CUDA <= {}, {} device(s)",
                        cuda_version.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
                        device_count.unwrap_or(0)
                    ),
                )
            } else {
                cuinit_failed_finding(path, init)
            }
        }
    }
}

/// cuInit failed: what each well-known result means and what to do.
fn cuinit_failed_finding(path: &str, init: &CuResult) -> Finding {
    let (summary, fix) = match init.name {
        "CUDA_ERROR_STUB_LIBRARY" => (
            format!("{path} is the toolkit's stub libcuda (for linking only), and it comes before the real driver library"),
            "remove the toolkit's lib64/stubs directory from LD_LIBRARY_PATH and ld.so.conf".to_string(),
        ),
        "CUDA_ERROR_NO_DEVICE" => (
            format!("{path} loaded but sees no CUDA device"),
            "check CUDA_VISIBLE_DEVICES, the /dev/nvidia* permissions, and `nvidia-smi`; in a container, start it with --gpus all".to_string(),
        ),
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" | "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE" => (
            format!("{path} does not match the kernel module (a cuda-compat or stray libcuda on the path?)"),
            "remove cuda-compat / copied libcuda.so files from the loader path; the driver's own library must be used".to_string(),
        ),
        _ => (
            format!("{path} loaded but cuInit failed"),
            "check `dmesg | grep -i nvrm` and `nvidia-smi`; reinstall the driver and reboot".to_string(),
        ),
    };
    Finding::new("driver.cuinit_failed", Severity::Error, summary)
        .evidence(format!("cuInit(0) = {} ({})", init.code, init.name))
        .fix(fix)
}

/// Kernel module vs user-space libraries (what nvidia-smi reports as a mismatch), then what
/// NVML and nvidia-smi say; one `driver.library_mismatch` is enough.
fn version_mismatch_findings(report: &DriverReport) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some(module) = &report.kernel_module {
        for library in &report.user_space_libraries {
            if library.version != module.version {
                findings.push(
                    Finding::new(
                        "driver.library_mismatch",
                        Severity::Error,
                        format!(
                            "driver/library version mismatch: kernel module {} but {} is {}",
                            module.version, library.soname, library.version
                        ),
                    )
                    .evidence(format!("/proc/driver/nvidia/version: {}", module.line))
                    .evidence(format!("{} -> {}", library.path.display(), library.file.display()))
                    .fix("the libraries were upgraded without reloading the module: reboot (or unload and reload the nvidia modules); hold the driver packages to stop unattended upgrades from splitting them"),
                );
            }
        }
    }
    if !has_library_mismatch(&findings) {
        findings.extend(nvml_finding(&report.nvml));
    }
    findings.extend(nvidia_smi_finding(report, has_library_mismatch(&findings)));
    findings
}

fn has_library_mismatch(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.id == "driver.library_mismatch")
}

fn nvml_finding(nvml: &NvmlProbe) -> Option<Finding> {
    let NvmlProbe::InitFailed { path, code, name } = nvml else {
        return None;
    };
    let mismatch = nvml.version_mismatch();
    Some(
        Finding::new(
            if mismatch {
                "driver.library_mismatch"
            } else {
                "driver.nvml_failed"
            },
            if mismatch {
                Severity::Error
            } else {
                Severity::Warning
            },
            if mismatch {
                "Failed to initialize NVML: Driver/library version mismatch".to_string()
            } else {
                format!("NVML could not be initialised ({name})")
            },
        )
        .evidence(format!("{path}: nvmlInit_v2() = {code} ({name})"))
        .fix(if mismatch {
            "reboot (or reload the nvidia modules) so the kernel module matches the libraries"
        } else {
            "check `dmesg | grep -i nvrm`; reinstall the driver and reboot"
        }),
    )
}

/// A failed nvidia-smi; its mismatch message only when no mismatch was reported yet.
fn nvidia_smi_finding(report: &DriverReport, mismatch_reported: bool) -> Option<Finding> {
    let NvidiaSmiProbe::Failed { path, output } = &report.nvidia_smi else {
        return None;
    };
    let mismatch = output.contains("Driver/library version mismatch");
    if mismatch && !mismatch_reported {
        Some(
            Finding::new(
                "driver.library_mismatch",
                Severity::Error,
                "nvidia-smi: Driver/library version mismatch",
            )
            .evidence(format!("{}: {output}", path.display()))
            .fix(
                "reboot (or reload the nvidia modules) so the kernel module matches the libraries",
            ),
        )
    } else if !mismatch {
        Some(
            Finding::new(
                "driver.nvidia_smi_failed",
                if report.kernel_module.is_some() {
                    Severity::Warning
                } else {
                    Severity::Info
                },
                "nvidia-smi failed",
            )
            .evidence(format!("{}: {output}", path.display()))
            .fix("run `cudastack explain` on its output"),
        )
    } else {
        None
    }
}

/// The GPUs and their compute capabilities.
fn gpu_findings(report: &DriverReport, matrix: &Matrix) -> Vec<Finding> {
    if report.gpus.is_empty() {
        if report.kernel_module.is_some() || report.wsl.is_some() {
            return vec![
                Finding::new("gpu.none", Severity::Error, "the driver is installed but no GPU is visible")
                    .evidences(device_nodes_evidence(report))
                    .fix("check `nvidia-smi -L`, CUDA_VISIBLE_DEVICES, and `dmesg` for Xid / 'fallen off the bus' errors"),
            ];
        }
        return Vec::new();
    }
    let mut findings = Vec::new();
    for gpu in &report.gpus {
        let known = matrix.gpu(&gpu.name);
        let cc = gpu.cc.or(known.map(|k| k.cc));
        let mut finding = Finding::new(
            "gpu.found",
            Severity::Ok,
            format!(
                "GPU {}: {}{}{}",
                gpu.index,
                gpu.name,
                cc.map(|c| format!(", compute capability {c}"))
                    .unwrap_or_default(),
                gpu.memory_mib
                    .map(|m| format!(", {} MiB", m))
                    .unwrap_or_default()
            ),
        )
        .evidence(format!("source: {}", gpu.source));
        if cc.is_none() {
            finding.severity = Severity::Warning;
            finding = finding.fix("its compute capability is unknown (not reported and not in the matrix): pass it to `cudastack solve --cc X.Y`");
        }
        findings.push(finding);
    }
    findings
}

/// The newest CUDA runtime the driver supports.
fn cuda_ceiling_finding(report: &DriverReport) -> Option<Finding> {
    match (&report.driver_version, report.cuda_ceiling) {
        (Some(driver), Some(ceiling)) => Some(
            Finding::new(
                "driver.cuda_ceiling",
                Severity::Ok,
                format!("driver {driver} supports CUDA <= {ceiling} (the newest runtime a program may bring)"),
            ),
        ),
        (Some(driver), None) => Some(
            Finding::new(
                "driver.cuda_ceiling",
                Severity::Warning,
                format!("driver {driver} is older than every CUDA release in the matrix"),
            )
            .fix("upgrade the driver"),
        ),
        _ => None,
    }
}

fn device_nodes_evidence(report: &DriverReport) -> Vec<String> {
    if report.device_nodes.is_empty() {
        vec!["/dev/nvidia[0-9]*: none".into()]
    } else {
        vec![format!(
            "device nodes: {}",
            report
                .device_nodes
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        )]
    }
}
