#!/usr/bin/env python3
"""cudastack verification probe: proves a CUDA/cuDNN/PyTorch stack inside its container.

Baked into every image cudastack builds at /opt/cudastack/probe/probe.py, beside
/usr/share/cudastack/expect.json (what the recipe and lock say the image holds). Run as

    python3 -I -S /opt/cudastack/probe/probe.py [--level static|driver|device|ops|train|all]

`-I -S` (issue 32): nothing of the image runs before the probe (no `.pth` file, no
sitecustomize, no PYTHONPATH); the probe puts the site directories on sys.path itself.

Checks run in levels; each level needs the ones before it. A check that cannot run (no
GPU visible, no header in a runtime image) is `skip` with the reason, never `pass`.
Human-readable lines go to stderr; the LAST line of stdout is

    cudastack-report-v1 [nonce=HEX ]{one-line JSON report}

where HEX is the run's nonce, when the host that started the probe gave one in
CUDASTACK_REPORT_NONCE: the host accepts exactly one report carrying it. The probe takes
the variable out of its environment before it imports anything of the image's.

so a container log or a Kubernetes pod log carries the report (docs/verify.md describes the
schema). Exit status: 0 when nothing failed, 1 when a check failed, 2 on a probe error.

Standard library only, Python >= 3.8; torch is imported by the checks that need it.
"""

import os
import sys

# Issue 32: the nonce leaves the environment first, before any module of the image's is
# imported (torch later can still find it in this process's memory: docs/verify.md says so).
NONCE_ENV = "CUDASTACK_REPORT_NONCE"
NONCE = os.environ.pop(NONCE_ENV, None)

import argparse
import ctypes
import datetime
import glob
import importlib
import json
import math
import platform
import re
import socket
import time
import traceback

PROBE_VERSION = "1"
REPORT_SCHEMA = "cudastack.verify.report/v1"
REPORT_PREFIX = "cudastack-report-v1 "
EXPECT_PATH = "/usr/share/cudastack/expect.json"
NATIVE_PROBE = "cudastack-probe"
LEVELS = ["static", "driver", "device", "ops", "train"]

# Library families whose copies must be unique in a process: the loader race DESIGN.md is about.
LIBRARY_FAMILIES = {
    "libcudart": re.compile(r"^libcudart\.so"),
    "libcudnn": re.compile(r"^libcudnn(_[a-z_]+)?\.so"),
    "libcublas": re.compile(r"^libcublas(Lt)?\.so"),
    "libnccl": re.compile(r"^libnccl\.so"),
}


class Skip(Exception):
    """The check could not run here; the message says why."""


class Fail(Exception):
    """The check ran and found the stack wrong; the message says what."""


class Probe:
    def __init__(self, expect, levels):
        self.expect = expect
        self.levels = levels
        self.checks = []
        self.gpus = []
        self.driver = None
        self.torch = None
        # Why the remaining GPU levels cannot run, once a level finds that out.
        self.gpu_unavailable = None
        # Where the ops and train levels put their tensors: always the GPU when this script
        # runs (no flag changes it, so no report can claim a CPU run). Only tests set "cpu",
        # to rehearse the same code with the image's real torch where no GPU exists.
        self.device = "cuda"
        # The seed of train.mlp's data and weights; scripts/probe_train_margin.py sweeps it
        # to measure how far a correct stack stays from the check's bound.
        self.seed = 0

    def synchronize(self):
        if self.device != "cpu":
            for index in range(self.torch.cuda.device_count()):
                self.torch.cuda.synchronize(index)

    def run(self, check_id, level, function):
        started = time.monotonic()
        status, detail, data = "pass", "", None
        try:
            result = function()
            if isinstance(result, tuple):
                detail, data = result
            else:
                detail = result or ""
        except Skip as reason:
            status, detail = "skip", str(reason)
        except Fail as reason:
            status, detail = "fail", str(reason)
        except Exception as error:  # a crash inside a check is a failure of that check
            status = "fail"
            detail = "%s: %s" % (type(error).__name__, error)
            data = {"traceback": traceback.format_exc(limit=6)}
        seconds = round(time.monotonic() - started, 3)
        entry = {
            "id": check_id,
            "level": level,
            "status": status,
            "seconds": seconds,
            "detail": detail,
        }
        if data is not None:
            entry["data"] = data
        self.checks.append(entry)
        sys.stderr.write("%-5s %-28s %7.2fs  %s\n" % (status, check_id, seconds, detail))
        sys.stderr.flush()
        return status

    def skip_level(self, level, ids):
        # The first check that found the GPU missing says why in full; the rest point at it.
        cause = next((c for c in self.checks if c["detail"] == self.gpu_unavailable), None)
        reason = "not run: %s" % (("see " + cause["id"]) if cause else self.gpu_unavailable)
        for check_id in ids:
            self.run(check_id, level, lambda: _raise(Skip(reason)))


def _raise(error):
    raise error


def add_site_directories():
    """Under `python3 -S`, put the site directories on sys.path as plain entries: the
    packages import, and no `.pth` file of theirs runs (site.addsitedir would run them)."""
    if not sys.flags.no_site:
        return
    import site  # with -S, importing site computes paths and runs nothing

    for directory in site.getsitepackages():
        if os.path.isdir(directory) and directory not in sys.path:
            sys.path.append(directory)


def report_line(report):
    nonce = "nonce=%s " % NONCE if NONCE else ""
    return REPORT_PREFIX + nonce + json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n"


# ---------------------------------------------------------------- helpers


def version_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", text))


def cudnn_version_number(text):
    """9.1.0.70 -> 90100 (cuDNN 9: M*10000+m*100+p), 8.9.2.26 -> 8902 (cuDNN 8: M*1000+m*100+p)."""
    parts = version_tuple(text) + (0, 0, 0)
    major, minor, patch = parts[0], parts[1], parts[2]
    if major >= 9:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def mapped_libraries():
    """Real paths of the shared objects mapped into this process, from /proc/self/maps."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/"):
                path = fields[5].strip()
                if ".so" in os.path.basename(path):
                    paths.add(path)
    return sorted(paths)


def library_copies():
    """{family: {directory: [file names]}} for the library families that must be unique."""
    families = {}
    for path in mapped_libraries():
        name = os.path.basename(path)
        for family, pattern in LIBRARY_FAMILIES.items():
            if pattern.match(name):
                families.setdefault(family, {}).setdefault(os.path.dirname(path), []).append(name)
    return families


def check_loaded_libraries(expect):
    """Exactly one directory and one version per library family, from the expected place."""
    families = library_copies()
    problems = []
    wanted = expect.get("cuda_lib_dir")
    for family, directories in sorted(families.items()):
        if len(directories) > 1:
            problems.append(
                "%s is loaded from %d directories: %s"
                % (family, len(directories), "; ".join(
                    "%s (%s)" % (d, ", ".join(sorted(n))) for d, n in sorted(directories.items())))
            )
        if wanted and family in ("libcudart", "libcudnn"):
            for directory in directories:
                if os.path.realpath(directory) != os.path.realpath(wanted):
                    problems.append("%s loaded from %s, not the image's CUDA library directory %s"
                                    % (family, directory, wanted))
    runtime = expect.get("cuda_runtime")
    for directory, names in families.get("libcudart", {}).items():
        for name in names:
            if runtime and not name.endswith(".so." + runtime) and re.search(r"\.so\.\d+\.\d+\.\d+$", name):
                problems.append("libcudart loaded is %s, the lock says %s" % (name, runtime))
    cudnn = expect.get("cudnn")
    if cudnn:
        release = ".".join(str(p) for p in version_tuple(cudnn)[:3])
        for directory, names in families.get("libcudnn", {}).items():
            for name in names:
                found = re.search(r"\.so\.(\d+\.\d+\.\d+)$", name)
                if found and found.group(1) != release:
                    problems.append("%s/%s is cuDNN %s, the lock says %s" % (directory, name, found.group(1), release))
    data = {family: {d: sorted(n) for d, n in dirs.items()} for family, dirs in families.items()}
    if problems:
        raise Fail("; ".join(problems))
    if "libcudart" not in families:
        raise Fail("libcudart is not loaded after importing torch (a CPU-only build?)")
    summary = ", ".join("%s: %s" % (f, ", ".join(sorted(n for names in d.values() for n in names)))
                        for f, d in sorted(families.items()))
    return summary, data


def has_kernels(arch_flags, major, minor):
    """Same-major rule: a cubin for sm_Xy runs on X.z with z >= y (a family cubin, sm_100f, too; an
    arch-specific one, sm_90a, only on its own arch); PTX (compute_XY) JITs forward."""
    sass = []
    ptx = []
    for flag in arch_flags:
        found = re.match(r"(sm|compute)_(\d+)(\d)([af]?)$", flag)
        if not found:
            continue
        kind, arch_major, arch_minor, suffix = found.group(1), int(found.group(2)), int(found.group(3)), found.group(4)
        if kind == "sm" and arch_major == major and arch_minor <= minor and (suffix in ("", "f") or (arch_major, arch_minor) == (major, minor)):
            sass.append(flag)
        if kind == "compute" and not suffix and (arch_major, arch_minor) <= (major, minor):
            ptx.append(flag)
    # By number: as strings, compute_90 would sort above compute_100.
    if sass:
        return "sass", max(sass, key=version_tuple)
    if ptx:
        return "ptx", max(ptx, key=version_tuple)
    return None, None


# ---------------------------------------------------------------- levels


def static_level(probe):
    expect = probe.expect

    def python_version():
        found = "%d.%d" % sys.version_info[:2]
        wanted = expect.get("python")
        if wanted and found != wanted:
            raise Fail("python3 is %s, the recipe says %s" % (found, wanted))
        return "Python %s (%s)" % (platform.python_version(), sys.executable)

    probe.run("static.python", "static", python_version)

    def torch_import():
        try:
            import torch  # noqa: F401
        except Exception as error:
            if not expect.get("torch"):
                raise Skip("the image has no torch (the recipe names none)")
            raise Fail("import torch failed: %s: %s" % (type(error).__name__, error))
        probe.torch = torch
        found = torch.__version__.split("+")[0]
        wanted = expect.get("torch")
        if wanted and found != wanted:
            raise Fail("torch is %s, the lock says %s" % (torch.__version__, wanted))
        return "torch %s from %s" % (torch.__version__, os.path.dirname(torch.__file__)), {
            "version": torch.__version__}

    if probe.run("static.torch", "static", torch_import) != "pass" and probe.torch is None:
        probe.gpu_unavailable = "torch could not be imported"
        return
    torch = probe.torch

    def torch_cuda():
        found = torch.version.cuda
        if not found:
            raise Fail("this torch is a CPU-only build (torch.version.cuda is None)")
        wanted = expect.get("cuda")
        if wanted and found != wanted:
            raise Fail("torch was built for CUDA %s, the image holds CUDA %s" % (found, wanted))
        return "torch.version.cuda = %s" % found, {"cuda": found}

    probe.run("static.torch_cuda", "static", torch_cuda)

    def cudnn_version():
        found = torch.backends.cudnn.version()
        if found is None:
            raise Fail("torch.backends.cudnn.version() is None: cuDNN could not be loaded")
        wanted = expect.get("cudnn")
        if wanted and found != cudnn_version_number(wanted):
            raise Fail("torch loads cuDNN %d, the lock says %s (%d)" % (found, wanted, cudnn_version_number(wanted)))
        return "torch.backends.cudnn.version() = %d" % found, {"cudnn": found}

    probe.run("static.cudnn", "static", cudnn_version)

    def arch_list():
        flags = torch._C._cuda_getArchFlags().split()
        wanted = expect.get("sm")
        if wanted:
            missing = sorted(set(wanted) - set(flags))
            if missing:
                raise Fail("the build lacks %s that the matrix records (it has %s)" % (", ".join(missing), " ".join(flags)))
        return " ".join(flags), {"arch_flags": flags}

    probe.run("static.arch_list", "static", arch_list)

    def cudnn_header():
        home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        candidates = sorted(set(glob.glob(os.path.join(home, "include", "cudnn_version.h"))
                                + glob.glob(os.path.join(home, "targets", "*", "include", "cudnn_version.h"))))
        if not candidates:
            raise Skip("no cudnn_version.h under %s (runtime images carry no headers)" % home)
        text = open(candidates[0]).read()
        parts = [re.search(r"#define\s+CUDNN_%s\s+(\d+)" % key, text) for key in ("MAJOR", "MINOR", "PATCHLEVEL")]
        if not all(parts):
            raise Fail("%s has no CUDNN_MAJOR/MINOR/PATCHLEVEL" % candidates[0])
        header = ".".join(p.group(1) for p in parts)
        wanted = expect.get("cudnn")
        if wanted and header != ".".join(str(p) for p in version_tuple(wanted)[:3]):
            raise Fail("%s says cuDNN %s, the lock says %s" % (candidates[0], header, wanted))
        return "%s: %s" % (candidates[0], header)

    probe.run("static.cudnn_header", "static", cudnn_header)
    probe.run("static.loaded_libraries", "static", lambda: check_loaded_libraries(expect))

    def ld_library_path():
        entries = [e for e in os.environ.get("LD_LIBRARY_PATH", "").split(":") if e]
        holders = {}
        for entry in entries:
            for family, pattern in LIBRARY_FAMILIES.items():
                if family not in ("libcudart", "libcudnn"):
                    continue
                if os.path.isdir(entry) and any(pattern.match(n) for n in os.listdir(entry)):
                    holders.setdefault(family, []).append(entry)
        doubled = {f: d for f, d in holders.items() if len(set(map(os.path.realpath, d))) > 1}
        if doubled:
            raise Fail("LD_LIBRARY_PATH has several directories with the same libraries: %s"
                       % "; ".join("%s in %s" % (f, ", ".join(d)) for f, d in sorted(doubled.items())))
        missing = [e for e in entries if not os.path.isdir(e)]
        note = " (absent until the NVIDIA runtime mounts it: %s)" % ", ".join(missing) if missing else ""
        return "%s%s" % (":".join(entries) or "(empty)", note), {"entries": entries}

    probe.run("static.ld_library_path", "static", ld_library_path)

    def extensions():
        # The packages cudastack compiled from their sdists (`build:`, issue 20): they import,
        # against this image's torch and CUDA libraries.
        loaded = []
        for module in expect["extensions"]:
            try:
                imported = importlib.import_module(module)
            except Exception as error:
                raise Fail("import %s failed: %s: %s" % (module, type(error).__name__, error))
            loaded.append("%s (%s)" % (module, os.path.dirname(imported.__file__ or "")))
        return "imported " + ", ".join(loaded), {"modules": expect["extensions"]}

    if expect.get("extensions"):
        probe.run("static.extensions", "static", extensions)


def nvml_driver_version():
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    buffer = ctypes.create_string_buffer(96)
    result = nvml.nvmlSystemGetDriverVersion(buffer, 96)
    nvml.nvmlShutdown()
    return buffer.value.decode() if result == 0 else None


def proc_driver_version():
    try:
        text = open("/proc/driver/nvidia/version").read()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    return found.group(1) if found else None


def cuda_driver_version():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return "%d.%d" % (version.value // 1000, (version.value % 1000) // 10)


def cuda_device_count():
    """(cuInit's result, cuDeviceGetCount) through the driver API, before torch touches CUDA."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, 0
    code = cuda.cuInit(0)
    if code != 0:
        return code, 0
    count = ctypes.c_int(0)
    code = cuda.cuDeviceGetCount(ctypes.byref(count))
    return code, count.value


def driver_level(probe):
    expect = probe.expect
    if probe.gpu_unavailable:
        probe.skip_level("driver", ["driver.version", "driver.cuda"])
        return

    def driver_version():
        found = nvml_driver_version() or proc_driver_version()
        if not found:
            probe.gpu_unavailable = ("no NVIDIA driver visible in the container (no libnvidia-ml.so.1, no "
                                     "/proc/driver/nvidia/version): run it with GPUs through the NVIDIA runtime")
            raise Skip(probe.gpu_unavailable)
        probe.driver = {"version": found}
        floor = expect.get("driver_floor")
        if floor and version_tuple(found) < version_tuple(floor):
            raise Fail("driver %s is older than the recipe's floor %s" % (found, floor))
        return "driver %s (floor %s)" % (found, floor or "none")

    if probe.run("driver.version", "driver", driver_version) == "skip":
        probe.skip_level("driver", ["driver.cuda"])
        return

    def driver_cuda():
        found = cuda_driver_version()
        if not found:
            raise Fail("libcuda.so.1 is not loadable or cuDriverGetVersion failed although a driver is present")
        probe.driver["cuda"] = found
        wanted = expect.get("cuda")
        if wanted:
            have, need = version_tuple(found), version_tuple(wanted)
            if have[0] < need[0] or (have < need and not expect.get("minor_version_compat")):
                raise Fail("the driver supports CUDA up to %s, the image's runtime is %s" % (found, wanted))
        return "driver supports CUDA %s (image runtime %s)" % (found, wanted or "?")

    if probe.run("driver.cuda", "driver", driver_cuda) == "fail":
        probe.gpu_unavailable = "the driver does not support this image's CUDA runtime"


def device_level(probe):
    if probe.gpu_unavailable:
        probe.skip_level("device", ["device.count", "device.kernels"])
        return
    torch = probe.torch

    def device_count():
        # Zero GPUs behind a visible driver (NVIDIA_VISIBLE_DEVICES=none or void, a MIG GPU
        # without instances) is a GPU missing, not a broken stack: skip, as without a driver.
        code, count = cuda_device_count()
        if code == 100 or (code == 0 and count == 0):
            probe.gpu_unavailable = ("the driver is visible but no GPU is (cuInit: CUDA_ERROR_NO_DEVICE): "
                                     "give the container GPUs (--gpus, NVIDIA_VISIBLE_DEVICES)")
            raise Skip(probe.gpu_unavailable)
        if code not in (None, 0):
            probe.gpu_unavailable = "cuInit failed"
            raise Fail("cuInit returned CUDA error %d (804: this GPU or driver does not support the forward "
                       "compatibility libcuda loaded; 999: unknown, see the kernel log)" % code)
        if not torch.cuda.is_available():
            probe.gpu_unavailable = "torch.cuda.is_available() is False although the driver is visible"
            raise Fail(probe.gpu_unavailable)
        count = torch.cuda.device_count()
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            probe.gpus.append({
                "index": index,
                "name": props.name,
                "compute_capability": "%d.%d" % (props.major, props.minor),
                "memory_bytes": int(props.total_memory),
                "uuid": str(getattr(props, "uuid", "")) or None,
            })
        return "%d GPU(s): %s" % (count, ", ".join(
            "%s (sm_%s)" % (g["name"], g["compute_capability"].replace(".", "")) for g in probe.gpus))

    if probe.run("device.count", "device", device_count) != "pass":
        # A crash inside the check leaves no reason behind: point at the check.
        probe.gpu_unavailable = probe.gpu_unavailable or "device.count did not pass"
        probe.skip_level("device", ["device.kernels"])
        return

    def kernels():
        flags = torch._C._cuda_getArchFlags().split()
        missing = []
        for gpu in probe.gpus:
            major, minor = (int(p) for p in gpu["compute_capability"].split("."))
            kind, arch = has_kernels(flags, major, minor)
            gpu["kernels"] = "%s:%s" % (kind, arch) if kind else "none"
            if not kind:
                missing.append("%s is sm_%d%d and this build has kernels only for %s"
                               % (gpu["name"], major, minor, " ".join(flags)))
        if missing:
            probe.gpu_unavailable = "no kernels for this GPU in this build"
            raise Fail("; ".join(missing))
        return ", ".join("%s -> %s" % (g["name"], g["kernels"]) for g in probe.gpus)

    probe.run("device.kernels", "device", kernels)


def ops_level(probe):
    if probe.gpu_unavailable:
        probe.skip_level("ops", ["ops.matmul", "ops.conv", "ops.conv_benchmark", "ops.loaded_libraries"])
        return
    torch = probe.torch

    def matmul():
        # This variable makes cuBLAS use TF32 whatever allow_tf32 says (error ~3e-4).
        override = os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "")
        if override not in ("", "0"):
            raise Fail("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=%s forces TF32 matmuls: unset it to check fp32" % override)
        torch.backends.cuda.matmul.allow_tf32 = False
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(4096, 4096, generator=generator)
        b = torch.randn(4096, 4096, generator=generator)
        reference = (a.double() @ b.double())
        # Every GPU, against the one reference: a broken GPU 3 of 8 must not pass.
        devices = [probe.device] if probe.device == "cpu" else ["cuda:%d" % i for i in range(len(probe.gpus))]
        results = []
        for device in devices:
            da, db = a.to(device), b.to(device)
            product = da @ db  # warm-up: cuBLAS's handle and the first kernel load are not timed
            probe.synchronize()
            started = time.monotonic()
            for _ in range(5):
                product = da @ db
            probe.synchronize()
            seconds = (time.monotonic() - started) / 5
            error = float(torch.linalg.norm(product.cpu().double() - reference) / torch.linalg.norm(reference))
            results.append({"device": device, "relative_error": error,
                            "tflops_fp32": round(2 * 4096 ** 3 / seconds / 1e12, 2)})
        bad = [r for r in results if not math.isfinite(r["relative_error"]) or r["relative_error"] > 1e-5]
        if bad:
            raise Fail("4096x4096 fp32 matmul differs from the CPU reference: %s" % ", ".join(
                "%s relative error %.3g > 1e-5" % (r["device"], r["relative_error"]) for r in bad))
        worst = max(results, key=lambda r: r["relative_error"])
        return "%d device(s), worst relative error %.2g, %s TFLOP/s fp32" % (
            len(results), worst["relative_error"], "/".join("%.1f" % r["tflops_fp32"] for r in results)), {
            "relative_error": worst["relative_error"], "tflops_fp32": results[0]["tflops_fp32"],
            "devices": results}

    probe.run("ops.matmul", "ops", matmul)

    def conv(benchmark):
        def run():
            torch.backends.cudnn.enabled = True
            torch.backends.cudnn.benchmark = benchmark
            torch.backends.cudnn.allow_tf32 = False
            generator = torch.Generator().manual_seed(1)
            x = torch.randn(8, 32, 56, 56, generator=generator)
            conv = torch.nn.Conv2d(32, 64, 3, padding=1)
            x_cpu = x.clone().requires_grad_(True)
            out_cpu = conv(x_cpu)
            out_cpu.square().mean().backward()
            gpu_conv = torch.nn.Conv2d(32, 64, 3, padding=1).to(probe.device)
            gpu_conv.load_state_dict(conv.state_dict())
            x_gpu = x.to(probe.device).requires_grad_(True)
            out_gpu = gpu_conv(x_gpu)
            out_gpu.square().mean().backward()
            probe.synchronize()
            forward = float((out_gpu.cpu() - out_cpu).abs().max() / out_cpu.abs().max())
            grad = float((x_gpu.grad.cpu() - x_cpu.grad).abs().max() / x_cpu.grad.abs().max())
            weight = float((gpu_conv.weight.grad.cpu() - conv.weight.grad).abs().max() / conv.weight.grad.abs().max())
            worst = max(forward, grad, weight)
            if not math.isfinite(worst) or worst > 1e-3:
                raise Fail("cuDNN convolution (benchmark=%s) differs from the CPU: forward %.2g, input grad %.2g, "
                           "weight grad %.2g (bound 1e-3)" % (benchmark, forward, grad, weight))
            return "forward+backward through cuDNN %d, max relative error %.2g" % (torch.backends.cudnn.version(), worst), {
                "forward": forward, "input_grad": grad, "weight_grad": weight}
        return run

    probe.run("ops.conv", "ops", conv(False))
    probe.run("ops.conv_benchmark", "ops", conv(True))
    # cuDNN 9 loads its engine libraries lazily: check the copies again after real work.
    probe.run("ops.loaded_libraries", "ops", lambda: check_loaded_libraries(probe.expect))


def train_level(probe):
    if probe.gpu_unavailable:
        probe.skip_level("train", ["train.mlp"])
        return
    torch = probe.torch

    def mlp():
        # The data come from the CPU generator, so every device trains on the same numbers
        # (CUDA's generator draws others). truth / 8 keeps x @ truth ~ N(0, 1), where tanh is
        # smooth and the network learns it well within 5 epochs: over 20 seeds the last
        # epoch's loss is at most 0.24x the first (scripts/probe_train_margin.py). With
        # unscaled truth tanh saturates and the worst seed reached 0.53x: a correct GPU
        # could have failed the 0.5x bound, depending on what CUDA's generator drew.
        generator = torch.Generator().manual_seed(probe.seed)
        x = torch.randn(8192, 64, generator=generator)
        truth = torch.randn(64, 1, generator=generator) / 8
        y = torch.tanh(x @ truth) + 0.05 * torch.randn(8192, 1, generator=generator)
        x, y = x.to(probe.device), y.to(probe.device)
        torch.manual_seed(probe.seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(probe.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(5):
            epoch = 0.0
            for batch in range(0, 8192, 512):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[batch:batch + 512]), y[batch:batch + 512])
                loss.backward()
                optimizer.step()
                epoch += loss.item()
            losses.append(epoch / 16)
        if not all(math.isfinite(l) for l in losses) or losses[-1] > 0.5 * losses[0]:
            raise Fail("loss did not go down: %s" % ", ".join("%.4f" % l for l in losses))
        return "loss %s over 5 epochs" % " -> ".join("%.4f" % l for l in losses), {"losses": losses}

    probe.run("train.mlp", "train", mlp)


def main():
    parser = argparse.ArgumentParser(description="cudastack verification probe")
    parser.add_argument("--level", default="all", choices=LEVELS + ["all"],
                        help="run the levels up to this one (default: all)")
    parser.add_argument("--expect", default=EXPECT_PATH, help="expectations file (default: %(default)s)")
    args = parser.parse_args()
    levels = LEVELS if args.level == "all" else LEVELS[: LEVELS.index(args.level) + 1]
    try:
        with open(args.expect) as handle:
            expect = json.load(handle)
    except OSError:
        expect = {}
    except ValueError as error:
        # A probe error (2), not a failed check (1).
        print("cudastack-probe: %s is not valid JSON: %s" % (args.expect, error), file=sys.stderr)
        return 2
    # An image without torch carries the native probe (probe/rust: the driver API, cuBLAS
    # and cuDNN through cudarc) beside this file when its glibc can run it; every runner
    # starts this script, which hands over so the GPU levels run without torch.
    native = os.path.join(os.path.dirname(os.path.abspath(__file__)), NATIVE_PROBE)
    if not expect.get("torch") and os.access(native, os.X_OK):
        sys.stdout.flush()
        environment = dict(os.environ)
        if NONCE:
            # The native probe prints the report, so it carries the nonce (and drops it too).
            environment[NONCE_ENV] = NONCE
        try:
            os.execve(native, [native, "--level", args.level, "--expect", args.expect], environment)
        except OSError as error:
            # Not runnable here (another architecture, a missing loader): this probe's
            # static level still reports, and says why the GPU levels did not run.
            print(f"cudastack-probe: cannot run {native}: {error}; using probe.py", file=sys.stderr)
    add_site_directories()
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    probe = Probe(expect, levels)
    clock = time.monotonic()
    try:
        for level, function in zip(LEVELS, [static_level, driver_level, device_level, ops_level, train_level]):
            if level not in levels:
                break
            function(probe)
    except Exception:
        traceback.print_exc()
        return 2
    counts = {status: sum(1 for c in probe.checks if c["status"] == status) for status in ("pass", "fail", "skip")}
    report = {
        "schema": REPORT_SCHEMA,
        "probe_version": PROBE_VERSION,
        "started": started.isoformat().replace("+00:00", "Z"),
        "seconds": round(time.monotonic() - clock, 3),
        "hostname": socket.gethostname(),
        "levels": levels,
        "expect": expect,
        "torch": getattr(probe.torch, "__version__", None),
        "driver": probe.driver,
        "gpus": probe.gpus,
        "checks": probe.checks,
        "counts": counts,
    }
    sys.stderr.write("%d passed, %d failed, %d skipped\n" % (counts["pass"], counts["fail"], counts["skip"]))
    sys.stdout.write(report_line(report))
    sys.stdout.flush()
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
