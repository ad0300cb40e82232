//! The NVIDIA driver and the GPUs it exposes, read three ways so one broken source does not
//! hide the others:
//! 1. `libcuda.so.1` through `dlopen` ([`libloading`]): `cuInit`, `cuDriverGetVersion` (the
//!    CUDA ceiling, e.g. 12020 = 12.2), and per device its name, compute capability
//!    (attributes 75/76) and memory. Each symbol is looked up before it is called; a missing
//!    library or symbol is an observation, never a panic.
//! 2. `/proc/driver/nvidia/version` (the kernel module's version) and
//!    `/proc/driver/nvidia/gpus/*/information` (one per GPU).
//! 3. `libnvidia-ml.so.1` (`nvmlInit_v2`: error 18 is the "Driver/library version mismatch"
//!    nvidia-smi prints) and `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total`.
//!
//! Also: the user-space library version (`libcuda.so.1 -> libcuda.so.535.104.05`) to catch a
//! kernel module / library mismatch, `nouveau` in `/proc/modules`, WSL2 (`/proc/version`
//! says `microsoft`; the driver comes from Windows through `/usr/lib/wsl/lib`), and the
//! `/dev/nvidia*` device nodes.

use std::ffi::{c_char, c_int, CStr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::stack::{loader_search_path, SearchDir};
use super::{list_dir, CommandOutcome, HostRoot};
use crate::version::{ComputeCapability, CudaVersion, DriverVersion};

/// Everything learned about the driver and GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct DriverReport {
    /// The kernel module, from `/proc/driver/nvidia/version`.
    pub kernel_module: Option<KernelModule>,
    pub libcuda: LibcudaProbe,
    /// The version in the file name `libcuda.so.1` / `libnvidia-ml.so.1` resolve to.
    pub user_space_libraries: Vec<UserSpaceLibrary>,
    pub nvidia_smi: NvidiaSmiProbe,
    /// `nvmlInit_v2` through `libnvidia-ml.so.1` (what nvidia-smi does first).
    pub nvml: NvmlProbe,
    /// GPUs, from the best source that listed any (libcuda, nvidia-smi, /proc).
    pub gpus: Vec<GpuDevice>,
    /// The driver version: kernel module, else nvidia-smi, else libcuda's file name.
    pub driver_version: Option<DriverVersion>,
    /// The newest CUDA the driver supports (`cuDriverGetVersion`, as nvidia-smi prints it).
    pub cuda_ceiling: Option<CudaVersion>,
    pub nouveau_loaded: bool,
    pub wsl: Option<Wsl>,
    pub device_nodes: Vec<PathBuf>,
    /// NVIDIA display and 3D controllers on the PCI bus (`/sys/bus/pci/devices/*`, vendor
    /// 0x10de, class 0x03xxxx), by address; None when sysfs could not be read.
    pub nvidia_pci_devices: Option<Vec<String>>,
}

impl DriverReport {
    /// Whether this host has no NVIDIA GPU at all, as opposed to a GPU without a working
    /// driver: sysfs lists no NVIDIA controller, and no driver, device node, GPU or WSL
    /// passthrough says otherwise. A build host; not a broken one.
    pub fn no_gpu_hardware(&self) -> bool {
        self.nvidia_pci_devices.as_ref().is_some_and(Vec::is_empty)
            && self.kernel_module.is_none()
            && self.wsl.is_none()
            && self.device_nodes.is_empty()
            && self.gpus.is_empty()
            && !self.nouveau_loaded
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct KernelModule {
    pub version: DriverVersion,
    /// The open GPU kernel module (`NVIDIA UNIX Open Kernel Module`).
    pub open: bool,
    pub line: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct UserSpaceLibrary {
    pub soname: String,
    pub path: PathBuf,
    pub file: PathBuf,
    pub version: DriverVersion,
}

/// One GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub cc: Option<ComputeCapability>,
    pub memory_mib: Option<u64>,
    /// `libcuda`, `nvidia-smi` or `proc`.
    pub source: &'static str,
}

/// Whether this build of cudastack can `dlopen` at all. A static musl binary (the released
/// one) cannot: musl's static `dlopen` always fails, so the driver is then read from /proc
/// and nvidia-smi only, and "could not be loaded" would blame a driver that is fine.
pub const CAN_LOAD_LIBRARIES: bool = !cfg!(all(target_env = "musl", target_feature = "crt-static"));

/// Why a library was not loaded by a static build.
pub const STATIC_BUILD: &str =
    "this cudastack is a static binary, which cannot load shared libraries";

/// What loading `libcuda.so.1` gave.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum LibcudaProbe {
    NotFound {
        searched: usize,
    },
    /// Found, not loaded: this build cannot load libraries ([`CAN_LOAD_LIBRARIES`]).
    NotLoadable {
        path: String,
        reason: &'static str,
    },
    LoadFailed {
        path: String,
        error: String,
    },
    /// Loaded; `init` is `cuInit(0)`'s result.
    Loaded {
        path: String,
        init: CuResult,
        cuda_version: Option<CudaVersion>,
        device_count: Option<u32>,
    },
}

/// A `CUresult` with its name from cuda.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CuResult {
    pub code: i32,
    pub name: &'static str,
}

impl CuResult {
    pub fn new(code: i32) -> Self {
        let name = match code {
            0 => "CUDA_SUCCESS",
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            4 => "CUDA_ERROR_DEINITIALIZED",
            34 => "CUDA_ERROR_STUB_LIBRARY",
            46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
            100 => "CUDA_ERROR_NO_DEVICE",
            101 => "CUDA_ERROR_INVALID_DEVICE",
            102 => "CUDA_ERROR_DEVICE_NOT_LICENSED",
            222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            303 => "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
            304 => "CUDA_ERROR_OPERATING_SYSTEM",
            802 => "CUDA_ERROR_SYSTEM_NOT_READY",
            803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
            999 => "CUDA_ERROR_UNKNOWN",
            _ => "CUDA_ERROR_(unlisted)",
        };
        CuResult { code, name }
    }
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

/// What initialising NVML gave.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum NvmlProbe {
    NotFound,
    /// Found, not loaded: this build cannot load libraries ([`CAN_LOAD_LIBRARIES`]).
    NotLoadable {
        path: String,
        reason: &'static str,
    },
    LoadFailed {
        path: String,
        error: String,
    },
    /// `nvmlInit_v2` failed; `code` 18 is `NVML_ERROR_LIB_RM_VERSION_MISMATCH`, the
    /// "Driver/library version mismatch" of nvidia-smi.
    InitFailed {
        path: String,
        code: i32,
        name: &'static str,
    },
    Ok {
        path: String,
        driver_version: Option<String>,
    },
}

impl NvmlProbe {
    pub fn version_mismatch(&self) -> bool {
        matches!(self, NvmlProbe::InitFailed { code: 18, .. })
    }
}

fn nvml_error_name(code: i32) -> &'static str {
    match code {
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        999 => "NVML_ERROR_UNKNOWN",
        _ => "NVML_ERROR_(unlisted)",
    }
}

type NvmlInit = unsafe extern "C" fn() -> c_int;
type NvmlShutdown = unsafe extern "C" fn() -> c_int;
type NvmlSystemGetDriverVersion = unsafe extern "C" fn(*mut c_char, u32) -> c_int;

/// Load `libnvidia-ml.so.1` from the host's loader path and initialise NVML, as nvidia-smi
/// does; a kernel module / library mismatch shows up here as error 18.
fn probe_nvml(host: &HostRoot, search: &[SearchDir]) -> NvmlProbe {
    let found = super::stack::find_library(host, search, "libnvidia-ml.so.1");
    let (target, shown): (PathBuf, String) = match &found {
        Some(path) => (host.path(path), path.display().to_string()),
        None if host.is_live() => (
            PathBuf::from("libnvidia-ml.so.1"),
            "libnvidia-ml.so.1".into(),
        ),
        None => return NvmlProbe::NotFound,
    };
    if !CAN_LOAD_LIBRARIES {
        return match found {
            Some(_) => NvmlProbe::NotLoadable {
                path: shown,
                reason: STATIC_BUILD,
            },
            None => NvmlProbe::NotFound,
        };
    }
    // SAFETY: loading NVML runs its initialisers, as nvidia-smi does.
    let library = match unsafe { libloading::Library::new(&target) } {
        Ok(library) => library,
        Err(_) if found.is_none() => return NvmlProbe::NotFound,
        Err(error) => {
            return NvmlProbe::LoadFailed {
                path: shown,
                error: error.to_string(),
            }
        }
    };
    // SAFETY: signatures from nvml.h.
    unsafe {
        let symbol = |name: &[u8]| library.get::<*const ()>(name).ok().map(|s| *s);
        let Some(init) = symbol(b"nvmlInit_v2\0").or_else(|| symbol(b"nvmlInit\0")) else {
            return NvmlProbe::LoadFailed {
                path: shown,
                error: "no nvmlInit_v2 symbol".into(),
            };
        };
        let init: NvmlInit = std::mem::transmute::<*const (), NvmlInit>(init);
        let code = init();
        if code != 0 {
            return NvmlProbe::InitFailed {
                path: shown,
                code,
                name: nvml_error_name(code),
            };
        }
        let driver_version = symbol(b"nvmlSystemGetDriverVersion\0").and_then(|f| {
            let f: NvmlSystemGetDriverVersion =
                std::mem::transmute::<*const (), NvmlSystemGetDriverVersion>(f);
            let mut buffer = [0 as c_char; 96];
            (f(buffer.as_mut_ptr(), buffer.len() as u32) == 0).then(|| {
                CStr::from_ptr(buffer.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            })
        });
        if let Some(shutdown) = symbol(b"nvmlShutdown\0") {
            let shutdown: NvmlShutdown = std::mem::transmute::<*const (), NvmlShutdown>(shutdown);
            shutdown();
        }
        NvmlProbe::Ok {
            path: shown,
            driver_version,
        }
    }
}

/// What `nvidia-smi` gave.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum NvidiaSmiProbe {
    NotFound,
    Failed { path: PathBuf, output: String },
    Ok { path: PathBuf, gpus: usize },
}

#[derive(Debug, Clone, Serialize)]
pub struct Wsl {
    /// `/usr/lib/wsl/lib/libcuda.so.1`, the Windows driver's passthrough library.
    pub passthrough_libcuda: bool,
    /// `libcuda.so*` files of a Linux driver installed inside WSL (they shadow the
    /// passthrough library and break CUDA).
    pub linux_driver_libraries: Vec<PathBuf>,
}

/// Detect the driver and GPUs of a host.
pub fn detect(host: &HostRoot) -> DriverReport {
    let search = loader_search_path(host);
    let kernel_module = host
        .read_text("/proc/driver/nvidia/version")
        .and_then(|text| parse_proc_version(&text));
    let (libcuda, libcuda_gpus) = probe_libcuda(host, &search);
    let user_space_libraries = user_space_libraries(host, &search);
    let (nvidia_smi, smi_gpus, smi_driver) = probe_nvidia_smi(host);
    let nvml = probe_nvml(host, &search);
    let gpus = merge_gpus(libcuda_gpus, smi_gpus, proc_gpus(host));
    let driver_version = kernel_module
        .as_ref()
        .map(|m| m.version.clone())
        .or(smi_driver)
        .or_else(|| {
            user_space_libraries
                .iter()
                .find(|l| l.soname == "libcuda.so.1")
                .map(|l| l.version.clone())
        });
    let cuda_ceiling = cuda_ceiling(&libcuda, driver_version.as_ref());
    DriverReport {
        kernel_module,
        libcuda,
        user_space_libraries,
        nvidia_smi,
        nvml,
        gpus,
        driver_version,
        cuda_ceiling,
        nouveau_loaded: nouveau_loaded(host),
        wsl: detect_wsl(host),
        device_nodes: nvidia_device_nodes(host),
        nvidia_pci_devices: nvidia_pci_devices(host),
    }
}

/// The PCI addresses of NVIDIA GPUs (vendor 0x10de; class 0x03: display controllers,
/// which is what GPUs, data-centre ones included, are); None without a readable sysfs.
fn nvidia_pci_devices(host: &HostRoot) -> Option<Vec<String>> {
    let dir = Path::new("/sys/bus/pci/devices");
    let resolved = host.resolve(dir)?;
    std::fs::read_dir(host.path(resolved)).ok()?;
    let devices = list_dir(host, dir, |_| true)
        .into_iter()
        .filter(|device| {
            let field = |name: &str| host.read_text(device.join(name)).unwrap_or_default();
            field("vendor").trim() == "0x10de" && field("class").trim().starts_with("0x03")
        })
        .filter_map(|device| device.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    Some(devices)
}

/// The GPUs of the first source that lists any (libcuda, then nvidia-smi, then /proc),
/// with capability and memory gaps filled from nvidia-smi (older drivers lack
/// compute_cap there, /proc has neither).
fn merge_gpus(
    libcuda_gpus: Vec<GpuDevice>,
    smi_gpus: Vec<GpuDevice>,
    proc_gpus: Vec<GpuDevice>,
) -> Vec<GpuDevice> {
    let gpus = [libcuda_gpus, smi_gpus.clone(), proc_gpus]
        .into_iter()
        .find(|list| !list.is_empty())
        .unwrap_or_default();
    gpus.into_iter()
        .map(|mut gpu| {
            if let Some(other) = smi_gpus.iter().find(|g| g.index == gpu.index) {
                gpu.cc = gpu.cc.or(other.cc);
                gpu.memory_mib = gpu.memory_mib.or(other.memory_mib);
            }
            gpu
        })
        .collect()
}

/// The newest CUDA the driver runs: what libcuda says, else the matrix's ceiling for the
/// driver version.
fn cuda_ceiling(
    libcuda: &LibcudaProbe,
    driver_version: Option<&DriverVersion>,
) -> Option<CudaVersion> {
    match libcuda {
        LibcudaProbe::Loaded { cuda_version, .. } => *cuda_version,
        _ => None,
    }
    .or_else(|| driver_version.and_then(|d| crate::matrix::Matrix::embedded().cuda_ceiling(d)))
}

/// `nouveau` in `/proc/modules` or `/sys/module`.
fn nouveau_loaded(host: &HostRoot) -> bool {
    host.read_text("/proc/modules")
        .is_some_and(|text| text.lines().any(|l| l.starts_with("nouveau ")))
        || host.path("/sys/module/nouveau").is_dir()
}

/// `/dev/nvidia0`, `/dev/nvidia1`, ...: the per-GPU device nodes.
fn nvidia_device_nodes(host: &HostRoot) -> Vec<PathBuf> {
    list_dir(host, Path::new("/dev"), |n| {
        let n = n.to_string_lossy();
        n.starts_with("nvidia") && n[6..].bytes().all(|b| b.is_ascii_digit()) && n.len() > 6
    })
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023`
/// or `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build ...`.
pub fn parse_proc_version(text: &str) -> Option<KernelModule> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let version = line.split_whitespace().find_map(|word| {
        word.parse::<DriverVersion>()
            .ok()
            .filter(|_| word.contains('.'))
    })?;
    Some(KernelModule {
        version,
        open: line.contains("Open Kernel Module"),
        line: line.trim().to_string(),
    })
}

/// The `/proc/driver/nvidia/gpus/<pci>/information` files: `Model: \t NVIDIA A100-SXM4-80GB`.
fn proc_gpus(host: &HostRoot) -> Vec<GpuDevice> {
    list_dir(host, Path::new("/proc/driver/nvidia/gpus"), |_| true)
        .iter()
        .enumerate()
        .filter_map(|(index, dir)| {
            let text = host.read_text(dir.join("information"))?;
            let model = text
                .lines()
                .find_map(|l| l.strip_prefix("Model:"))?
                .trim()
                .to_string();
            Some(GpuDevice {
                index: index as u32,
                name: model,
                cc: None,
                memory_mib: None,
                source: "proc",
            })
        })
        .collect()
}

/// Resolve `libcuda.so.1` / `libnvidia-ml.so.1` to their versioned files.
fn user_space_libraries(host: &HostRoot, search: &[SearchDir]) -> Vec<UserSpaceLibrary> {
    ["libcuda.so.1", "libnvidia-ml.so.1"]
        .iter()
        .filter_map(|soname| {
            let path = super::stack::find_library(host, search, soname)?;
            let file = host.resolve(&path)?;
            let name = file.file_name()?.to_string_lossy().into_owned();
            let stem = soname.trim_end_matches(".1");
            let version = name.strip_prefix(stem)?.strip_prefix('.')?.parse().ok()?;
            Some(UserSpaceLibrary {
                soname: soname.to_string(),
                path,
                file,
                version,
            })
        })
        .collect()
}

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;

const ATTRIBUTE_CC_MAJOR: c_int = 75;
const ATTRIBUTE_CC_MINOR: c_int = 76;

/// Load `libcuda.so.1` (found on the host's loader path; on the live system the process's
/// own loader is the last resort) and ask it about the driver and devices.
fn probe_libcuda(host: &HostRoot, search: &[SearchDir]) -> (LibcudaProbe, Vec<GpuDevice>) {
    match open_libcuda(host, search) {
        // SAFETY: the library is the CUDA driver library found as `libcuda.so.1`.
        Ok((library, shown)) => unsafe { query_driver(&library, shown) },
        Err(probe) => (probe, Vec::new()),
    }
}

/// Find and load `libcuda.so.1`, with the path to show for it; what the probe reports
/// when it cannot be loaded. A load through the process's own loader (nothing found on
/// the search path) that fails is "not found", not a failed load.
fn open_libcuda(
    host: &HostRoot,
    search: &[SearchDir],
) -> Result<(libloading::Library, String), LibcudaProbe> {
    let not_found = || LibcudaProbe::NotFound {
        searched: search.len(),
    };
    let found = super::stack::find_library(host, search, "libcuda.so.1");
    let (target, shown): (PathBuf, String) = match &found {
        Some(path) => (host.path(path), path.display().to_string()),
        None if host.is_live() => (PathBuf::from("libcuda.so.1"), "libcuda.so.1".into()),
        None => return Err(not_found()),
    };
    if !CAN_LOAD_LIBRARIES {
        return Err(match found {
            Some(_) => LibcudaProbe::NotLoadable {
                path: shown,
                reason: STATIC_BUILD,
            },
            None => not_found(),
        });
    }
    // SAFETY: loading libcuda runs its initialisers; that is what every CUDA program does.
    match unsafe { libloading::Library::new(&target) } {
        Ok(library) => Ok((library, shown)),
        Err(_) if found.is_none() => Err(not_found()),
        Err(error) => Err(LibcudaProbe::LoadFailed {
            path: shown,
            error: error.to_string(),
        }),
    }
}

/// A driver API entry point looked up by its NUL-terminated name, if the library has it.
type Symbol<'a> = &'a dyn Fn(&[u8]) -> Option<*const ()>;

/// `cuInit(0)`, `cuDriverGetVersion` and, when init succeeded, the devices.
///
/// # Safety
/// `library` must be a CUDA driver library: its symbols are called with cuda.h's signatures.
unsafe fn query_driver(
    library: &libloading::Library,
    shown: String,
) -> (LibcudaProbe, Vec<GpuDevice>) {
    let symbol = |name: &[u8]| library.get::<*const ()>(name).ok().map(|s| *s);
    let Some(init) = symbol(b"cuInit\0") else {
        return (
            LibcudaProbe::LoadFailed {
                path: shown,
                error: "no cuInit symbol: not a CUDA driver library".into(),
            },
            Vec::new(),
        );
    };
    let init: CuInit = std::mem::transmute::<*const (), CuInit>(init);
    let init_result = CuResult::new(init(0));
    let cuda_version = symbol(b"cuDriverGetVersion\0").and_then(|f| {
        let f: CuDriverGetVersion = std::mem::transmute::<*const (), CuDriverGetVersion>(f);
        let mut version: c_int = 0;
        (f(&mut version) == 0 && version > 0).then(|| cuda_version_from_int(version))
    });
    let (device_count, devices) = if init_result.ok() {
        list_devices(&symbol)
    } else {
        (None, Vec::new())
    };
    let probe = LibcudaProbe::Loaded {
        path: shown,
        init: init_result,
        cuda_version,
        device_count,
    };
    (probe, devices)
}

/// `cuDeviceGetCount` and each device (at most 64) after a successful `cuInit`.
///
/// # Safety
/// `symbol` must look up entry points of an initialised CUDA driver library.
unsafe fn list_devices(symbol: Symbol<'_>) -> (Option<u32>, Vec<GpuDevice>) {
    let device_count = symbol(b"cuDeviceGetCount\0").and_then(|f| {
        let f: CuDeviceGetCount = std::mem::transmute::<*const (), CuDeviceGetCount>(f);
        let mut count: c_int = 0;
        (f(&mut count) == 0).then(|| count.max(0) as u32)
    });
    let api = DeviceApi::load(symbol);
    let devices = (0..device_count.unwrap_or(0).min(64) as c_int)
        .filter_map(|ordinal| api.device(ordinal))
        .collect();
    (device_count, devices)
}

/// The per-device entry points of the driver API; each may be missing.
struct DeviceApi {
    get: Option<CuDeviceGet>,
    get_name: Option<CuDeviceGetName>,
    get_attribute: Option<CuDeviceGetAttribute>,
    total_mem: Option<CuDeviceTotalMem>,
}

impl DeviceApi {
    /// # Safety
    /// `symbol` must look up entry points of a CUDA driver library.
    unsafe fn load(symbol: Symbol<'_>) -> Self {
        DeviceApi {
            get: symbol(b"cuDeviceGet\0").map(|f| std::mem::transmute::<*const (), CuDeviceGet>(f)),
            get_name: symbol(b"cuDeviceGetName\0")
                .map(|f| std::mem::transmute::<*const (), CuDeviceGetName>(f)),
            get_attribute: symbol(b"cuDeviceGetAttribute\0")
                .map(|f| std::mem::transmute::<*const (), CuDeviceGetAttribute>(f)),
            total_mem: symbol(b"cuDeviceTotalMem_v2\0")
                .or_else(|| symbol(b"cuDeviceTotalMem\0"))
                .map(|f| std::mem::transmute::<*const (), CuDeviceTotalMem>(f)),
        }
    }

    /// The device with `ordinal`: its name (`GPU N` when unknown), compute capability and
    /// memory; `None` when `cuDeviceGet` refuses the ordinal.
    ///
    /// # Safety
    /// The entry points must come from an initialised CUDA driver library still loaded.
    unsafe fn device(&self, ordinal: c_int) -> Option<GpuDevice> {
        let mut device: c_int = ordinal;
        if let Some(get) = self.get {
            if get(&mut device, ordinal) != 0 {
                return None;
            }
        }
        let name = self
            .get_name
            .and_then(|f| {
                let mut buffer = [0 as c_char; 256];
                (f(buffer.as_mut_ptr(), buffer.len() as c_int, device) == 0).then(|| {
                    CStr::from_ptr(buffer.as_ptr())
                        .to_string_lossy()
                        .into_owned()
                })
            })
            .unwrap_or_else(|| format!("GPU {ordinal}"));
        let attribute = |which: c_int| {
            self.get_attribute.and_then(|f| {
                let mut value: c_int = 0;
                (f(&mut value, which, device) == 0).then_some(value)
            })
        };
        let cc = match (attribute(ATTRIBUTE_CC_MAJOR), attribute(ATTRIBUTE_CC_MINOR)) {
            (Some(major), Some(minor)) if major > 0 && minor >= 0 => {
                Some(ComputeCapability::new(major as u32, minor as u32))
            }
            _ => None,
        };
        let memory_mib = self.total_mem.and_then(|f| {
            let mut bytes: usize = 0;
            (f(&mut bytes, device) == 0).then_some(bytes as u64 >> 20)
        });
        Some(GpuDevice {
            index: ordinal as u32,
            name,
            cc,
            memory_mib,
            source: "libcuda",
        })
    }
}

/// `cuDriverGetVersion`'s integer (and the `found version N` PyTorch prints) as a CUDA
/// version: 12020 -> 12.2, 11040 -> 11.4.
pub fn cuda_version_from_int(value: i32) -> CudaVersion {
    let value = value.max(0) as u32;
    CudaVersion::new(value / 1000, (value % 1000) / 10, None)
}

/// Run nvidia-smi; fall back to a query without `compute_cap` for drivers older than 510.
fn probe_nvidia_smi(host: &HostRoot) -> (NvidiaSmiProbe, Vec<GpuDevice>, Option<DriverVersion>) {
    let Some(path) = host.which("nvidia-smi") else {
        return (NvidiaSmiProbe::NotFound, Vec::new(), None);
    };
    let timeout = Duration::from_secs(30);
    let full = [
        "--query-gpu=index,name,compute_cap,driver_version,memory.total",
        "--format=csv,noheader,nounits",
    ];
    let mut outcome = host.run(&path, &full, timeout);
    let mut with_cc = true;
    if outcome.success_stdout().is_none() && outcome.describe().contains("compute_cap") {
        with_cc = false;
        outcome = host.run(
            &path,
            &[
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader,nounits",
            ],
            timeout,
        );
    }
    let Some(stdout) = outcome.success_stdout() else {
        let output = match &outcome {
            CommandOutcome::Exited { .. } => outcome.describe(),
            other => other.describe(),
        };
        return (NvidiaSmiProbe::Failed { path, output }, Vec::new(), None);
    };
    let (gpus, driver) = parse_nvidia_smi_csv(stdout, with_cc);
    (
        NvidiaSmiProbe::Ok {
            path,
            gpus: gpus.len(),
        },
        gpus,
        driver,
    )
}

/// Parse `0, NVIDIA H100 80GB HBM3, 9.0, 550.54.15, 81559` lines.
pub fn parse_nvidia_smi_csv(text: &str, with_cc: bool) -> (Vec<GpuDevice>, Option<DriverVersion>) {
    let mut driver = None;
    let gpus = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .filter_map(|(position, line)| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let expected = if with_cc { 5 } else { 4 };
            if fields.len() != expected {
                return None;
            }
            let (cc, rest) = if with_cc {
                (fields[2].parse().ok(), &fields[3..])
            } else {
                (None, &fields[2..])
            };
            if driver.is_none() {
                driver = rest[0].parse().ok();
            }
            Some(GpuDevice {
                index: fields[0].parse().unwrap_or(position as u32),
                name: fields[1].to_string(),
                cc,
                memory_mib: rest[1].parse().ok(),
                source: "nvidia-smi",
            })
        })
        .collect();
    (gpus, driver)
}

fn detect_wsl(host: &HostRoot) -> Option<Wsl> {
    let version = host.read_text("/proc/version").unwrap_or_default();
    let lower = version.to_lowercase();
    if !(lower.contains("microsoft") || lower.contains("wsl")) {
        return None;
    }
    let linux_driver_libraries = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/lib/x86_64-linux-gnu",
    ]
    .iter()
    .flat_map(|dir| {
        list_dir(host, Path::new(dir), |n| {
            n.to_string_lossy().starts_with("libcuda.so")
        })
    })
    .collect();
    Some(Wsl {
        passthrough_libcuda: host.path("/usr/lib/wsl/lib/libcuda.so.1").exists(),
        linux_driver_libraries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_version_closed_and_open_modules() {
        let closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        let module = parse_proc_version(closed).unwrap();
        assert_eq!(module.version.to_string(), "535.104.05");
        assert!(!module.open);
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:50:36 UTC 2025\n";
        let module = parse_proc_version(open).unwrap();
        assert_eq!(module.version.to_string(), "570.86.15");
        assert!(module.open);
        assert!(parse_proc_version("GCC version: 12").is_none());
    }

    #[test]
    fn driver_int_to_cuda() {
        assert_eq!(cuda_version_from_int(12020), CudaVersion::new(12, 2, None));
        assert_eq!(cuda_version_from_int(11040), CudaVersion::new(11, 4, None));
        assert_eq!(cuda_version_from_int(13000), CudaVersion::new(13, 0, None));
    }

    #[test]
    fn nvidia_smi_csv() {
        let (gpus, driver) = parse_nvidia_smi_csv(
            "0, NVIDIA H100 80GB HBM3, 9.0, 550.54.15, 81559\n1, NVIDIA H100 80GB HBM3, 9.0, 550.54.15, 81559\n",
            true,
        );
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[0].cc, Some(ComputeCapability::new(9, 0)));
        assert_eq!(gpus[0].memory_mib, Some(81559));
        assert_eq!(driver.unwrap().to_string(), "550.54.15");
        let (gpus, _) = parse_nvidia_smi_csv("0, Tesla V100-SXM2-16GB, 470.82.01, 16160\n", false);
        assert_eq!(gpus[0].cc, None);
        assert_eq!(gpus[0].name, "Tesla V100-SXM2-16GB");
    }
}
