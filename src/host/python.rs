//! The Python in use and the torch it imports: the host's `python3` (first on `PATH`) runs
//! a short script that prints one JSON object. Importing torch is the only way to learn
//! what a given environment really loads (its `torch.version.cuda`, the cuDNN it maps, the
//! sm list compiled in), and an import failure is itself evidence (its text goes to
//! `explain`). A missing Python or torch is an observation, not an error.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{CommandOutcome, HostRoot};

/// Printed by the host's Python. Kept to the standard library and torch's public API.
pub const PROBE_SCRIPT: &str = r#"
import json, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "prefix": sys.prefix, "torch": None}
try:
    import torch
except ImportError as e:
    if getattr(e, "name", None) == "torch":
        out["torch"] = None
    else:
        out["torch"] = {"import_error": "%s: %s" % (type(e).__name__, e)}
except Exception as e:
    out["torch"] = {"import_error": "%s: %s" % (type(e).__name__, e)}
else:
    t = {"version": str(getattr(torch, "__version__", "")), "file": getattr(torch, "__file__", None)}
    v = getattr(torch, "version", None)
    t["cuda"] = getattr(v, "cuda", None)
    try:
        t["cudnn"] = torch.backends.cudnn.version()
    except Exception as e:
        t["cudnn"] = None
        t["cudnn_error"] = "%s: %s" % (type(e).__name__, e)
    try:
        t["available"] = bool(torch.cuda.is_available())
    except Exception as e:
        t["available"] = False
        t["cuda_error"] = "%s: %s" % (type(e).__name__, e)
    try:
        t["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        t["arch_list"] = []
    devices = []
    if t["available"]:
        try:
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                devices.append({"name": torch.cuda.get_device_name(i), "cc": "%d.%d" % (major, minor)})
        except Exception as e:
            t["cuda_error"] = "%s: %s" % (type(e).__name__, e)
    t["devices"] = devices
    mapped = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    name = path.rsplit("/", 1)[-1]
                    if name.startswith(("libcudnn", "libcudart", "libcublas", "libcuda.so", "libnccl")):
                        mapped.add(path)
    except OSError:
        pass
    t["mapped"] = sorted(mapped)
    out["torch"] = t
print(json.dumps(out))
"#;

/// What the host's Python reported.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PythonProbe {
    /// No `python3` on the host's `PATH`.
    NotFound,
    /// It ran but did not print the probe's JSON.
    Failed { path: PathBuf, output: String },
    Ok {
        path: PathBuf,
        #[serde(flatten)]
        info: Box<PythonInfo>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonInfo {
    pub python: String,
    pub executable: String,
    /// `sys.prefix`: the environment the interpreter belongs to.
    #[serde(default)]
    pub prefix: String,
    /// `None` when torch is not installed.
    pub torch: Option<TorchInfo>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TorchInfo {
    #[serde(default)]
    pub import_error: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    /// `torch.version.cuda`; `None` for a CPU-only build.
    #[serde(default)]
    pub cuda: Option<String>,
    /// `torch.backends.cudnn.version()`, e.g. 90100.
    #[serde(default)]
    pub cudnn: Option<u32>,
    #[serde(default)]
    pub cudnn_error: Option<String>,
    #[serde(default)]
    pub available: bool,
    #[serde(default)]
    pub cuda_error: Option<String>,
    #[serde(default)]
    pub arch_list: Vec<String>,
    #[serde(default)]
    pub devices: Vec<TorchDevice>,
    /// CUDA libraries mapped into the process after `import torch` (from /proc/self/maps):
    /// the files that actually won the loader's search.
    #[serde(default)]
    pub mapped: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TorchDevice {
    pub name: String,
    pub cc: String,
}

/// Run the probe with the host's `python3` (or `python` when there is no `python3`).
pub fn probe(host: &HostRoot, timeout: Duration) -> PythonProbe {
    let Some(path) = host.which("python3").or_else(|| host.which("python")) else {
        return PythonProbe::NotFound;
    };
    probe_with(host, path, timeout)
}

/// Run the probe with a given interpreter (a host path).
pub fn probe_with(host: &HostRoot, path: PathBuf, timeout: Duration) -> PythonProbe {
    let outcome = host.run(&path, &["-c", PROBE_SCRIPT], timeout);
    let parsed = match &outcome {
        CommandOutcome::Exited { stdout, .. } => stdout
            .lines()
            .rev()
            .find_map(|line| serde_json::from_str::<PythonInfo>(line.trim()).ok()),
        _ => None,
    };
    match parsed {
        Some(info) => PythonProbe::Ok {
            path,
            info: Box::new(info),
        },
        None => PythonProbe::Failed {
            path,
            output: outcome.describe(),
        },
    }
}
