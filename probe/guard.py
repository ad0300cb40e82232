"""cudastack start-time guard: refuses to start an image on a node it cannot run on.

Baked into images whose recipe sets `runtime: { guard: true }` at /opt/cudastack/guard.py;
the image's entrypoint becomes

    /usr/bin/python3 -I -S /opt/cudastack/guard.py -- ENTRYPOINT... [CMD...]

`-I -S`: nothing of the image's site-packages runs before the guard. It reads the node's
driver and GPUs (NVML, libnvidia-ml.so.1, when the container has it; the driver alone from
/proc/driver/nvidia/version otherwise), compares them with what the build wrote into
CUDASTACK_GUARD_EXPECT (the driver floor, NVIDIA_REQUIRE_CUDA and the CUDA lines' drivers,
the kernel coverage the audit found), and then

- yes: replaces itself with the command (os.execvp: same PID, signals reach the command);
- no: prints `cudastack check`'s findings (what, why, hint) on stderr and exits 1;
- unknown (no driver visible, or no GPU to compare): says what is missing and exits 3.

CUDASTACK_GUARD=skip starts the command without any check, for a deliberate run without
GPUs. CUDASTACK_GUARD_TEST_ROOT, for tests only: /proc is read below that directory and
NVML is looked up in LD_LIBRARY_PATH's directories only (not the host's loader cache). It
is harmless: whoever can set a variable of the container can set CUDASTACK_GUARD=skip.

The texts of a no are `cudastack check`'s (src/verify/check.rs): tests/guard_start.rs runs
this file on planted hosts and asserts each line equals check's finding for the same node.

Standard library only, Python >= 3.8.
"""

import os
import sys

EXIT_NO = 1
EXIT_UNKNOWN = 3
SKIP_HINT = "for a deliberate run without GPUs, set CUDASTACK_GUARD=skip"


def version(text):
    """`550.54.15` -> (550, 54, 15); None when it is not a dotted number."""
    parts = text.split(".")
    if not text or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts) + (0,) * (3 - len(parts))


def arch(text):
    """`sm_90a` -> ((9, 0), "a"): the capability and the variant suffix."""
    digits = text.split("_", 1)[-1]
    suffix = digits[-1] if digits[-1:].isalpha() else ""
    digits = digits[: len(digits) - len(suffix)]
    return (int(digits[:-1]), int(digits[-1])), suffix


def sass_runs_on(target, cc):
    """version.rs GpuArch::sass_runs_on: `a` code runs on its GPU only."""
    (major, minor), suffix = arch(target)
    if suffix == "a":
        return (major, minor) == cc
    return major == cc[0] and minor <= cc[1]


def ptx_jits_for(target, cc):
    """version.rs GpuArch::ptx_jits_for."""
    (major, minor), suffix = arch(target)
    if suffix == "a":
        return (major, minor) == cc
    if suffix == "f":
        return major == cc[0] and minor <= cc[1]
    return (major, minor) <= cc


def has_code_for(group, cc, jit):
    """audit::kernels CoverageGroup::reach is Sass or Ptx (not PtxTooNew, not None)."""
    if any(sass_runs_on(target, cc) for target in group["sass"]):
        return True
    for ptx in group["ptx"]:
        isa = ptx.get("isa")
        readable = jit is None or (isa is not None and version(isa) <= jit)
        if readable and ptx_jits_for(ptx["arch"], cc):
            return True
    return False


def nvml_library():
    import ctypes

    if "CUDASTACK_GUARD_TEST_ROOT" not in os.environ:
        return ctypes.CDLL("libnvidia-ml.so.1")
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        path = os.path.join(directory, "libnvidia-ml.so.1")
        if directory and os.path.exists(path):
            return ctypes.CDLL(path)
    raise OSError("libnvidia-ml.so.1 is not in LD_LIBRARY_PATH")


def nvml_node():
    """(driver text, [(name, (major, minor))]) from NVML, or None when it is not there."""
    import ctypes

    try:
        nvml = nvml_library()
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        text = ctypes.create_string_buffer(96)
        driver = text.value.decode() if nvml.nvmlSystemGetDriverVersion(text, 96) == 0 else None
        count = ctypes.c_uint(0)
        gpus = []
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
            for index in range(count.value):
                gpus.append(nvml_gpu(nvml, index))
        return driver, [gpu for gpu in gpus if gpu]
    finally:
        nvml.nvmlShutdown()


def nvml_gpu(nvml, index):
    import ctypes

    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
        return None
    name = ctypes.create_string_buffer(96)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if nvml.nvmlDeviceGetName(handle, name, 96) != 0:
        return None
    if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
        return None
    return name.value.decode(errors="replace"), (major.value, minor.value)


def proc_driver():
    """The kernel module's version: `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...`."""
    root = os.environ.get("CUDASTACK_GUARD_TEST_ROOT", "")
    try:
        with open(root + "/proc/driver/nvidia/version") as file:
            first = file.readline()
    except OSError:
        return None
    words = first.split("Kernel Module", 1)[-1].split()
    return next((word for word in words if version(word) and version(word)[0] >= 100), None)


def ceiling(expect, driver):
    """The newest CUDA line the driver supports and the newest PTX ISA it reads (matrix::cuda_ceiling)."""
    lines = [line for line in expect["cuda_lines"] if version(line["min_driver"]) <= version(driver)]
    if not lines:
        return None
    return max(lines, key=lambda line: version(line["cuda"]))


def minor_compat_hint(need, top, driver):
    """check.rs minor_version_compat_hint: the rebuild that minor-version compatibility allows."""
    floor = need.get("minor_compat_driver")
    major = version(need["cuda"])[0]
    if not floor or version(top)[0] != major or version(driver) < version(floor):
        return ""
    return (", or build it again with `minor_version_compat: true` and `driver_floor: \"%s\"` (CUDA %d.x minor-version compatibility runs it from driver %s; PTX newer than the driver cannot be JIT-compiled)"
            % (driver, major, floor))


def driver_findings(expect, driver):
    """check.rs check_driver: NVIDIA_REQUIRE_CUDA and the driver floor."""
    findings = []
    subject = "driver " + driver
    need = expect.get("require_cuda")
    line = ceiling(expect, driver)
    if need and line and version(line["cuda"]) < version(need["cuda"]):
        cuda, top = need["cuda"], line["cuda"]
        upgrade = need.get("min_driver") or "one that supports CUDA " + cuda
        findings.append((subject,
                         "supports CUDA up to %s; the image requires CUDA >= %s (NVIDIA_REQUIRE_CUDA), so the NVIDIA runtime refuses to start it (`requirement error: unsatisfied condition: cuda>=%s`)" % (top, cuda, cuda),
                         "upgrade the driver to %s or newer, or use an image built for CUDA %s or older%s" % (upgrade, top, minor_compat_hint(need, top, driver))))
    elif need and not line:
        findings.append((subject,
                         "is older than every driver the matrix knows; the image requires CUDA >= " + need["cuda"],
                         "upgrade the driver"))
    floor = expect.get("floor")
    if floor and version(driver) < version(floor):
        findings.append((subject, "is below the recipe's driver floor " + floor,
                         "upgrade the driver to %s or newer" % floor))
    return findings


def gpu_findings(expect, name, cc, jit):
    """check.rs check_kernels (the audit's coverage groups), else check_gpu (torch's arch list, else CUDA's)."""
    rule = expect.get("gpu_rule", {})
    sm = "sm_%d%d" % cc
    findings = []
    for group in rule.get("kernels", []):
        if not has_code_for(group, cc, jit):
            jit_text = "; this driver JIT-compiles PTX ISA %d.%d at most" % jit[:2] if jit else ""
            findings.append(("%s (%s)" % (name, sm),
                             "has no kernels in %s (SASS %s; PTX %s%s): the first launch fails with `no kernel image is available for execution on the device`" % (group["names"], group["sass_text"], group["ptx_text"], jit_text),
                             'use an image built for this GPU: add "%s" to the recipe\'s `gpus:` and build again, and the audit names the library to upgrade' % name))
    if "torch_sm" in rule and not any(sass_runs_on(target, cc) for target in rule["torch_sm"]):
        findings.append(("%s (%s)" % (name, sm),
                         "has no kernels in this build (%s): torch fails with `no kernel image is available for execution on the device`" % " ".join(rule["torch_sm"]),
                         "use a torch build whose arch list covers this GPU (`cudastack solve --gpu NAME`)"))
    if "cuda_archs" in rule and not any(sass_runs_on(target, cc) for target in rule["cuda_archs"]):
        findings.append(("%s (%s)" % (name, sm),
                         "is not among the archs CUDA %s generates code for (%s): its cuBLAS/cuDNN carry no kernels for this GPU" % (rule["cuda"], " ".join(rule["cuda_archs"])),
                         "use an image of a CUDA release that targets this GPU (`cudastack check` of a recipe names it: error[gpu-arch-too-new] / error[gpu-arch-removed])"))
    return findings


def unknown_because(expect, driver, gpus, nvml_found):
    """What kept the guard from comparing (check.rs unknown_because), said for a container."""
    if not driver and not gpus:
        return ("no NVIDIA driver is visible in this container (libnvidia-ml.so.1 does not load, "
                "no /proc/driver/nvidia/version), so the image's driver floor %s and its kernels cannot "
                "be compared with the node" % expect.get("floor"),
                "start it with GPUs (docker run --gpus all, CDI, apptainer --nv, a Kubernetes "
                "nvidia.com/gpu limit); " + SKIP_HINT)
    if not driver:
        return ("NVML lists the GPUs but not the driver version, so the image's driver floor %s cannot be "
                "compared" % expect.get("floor"), SKIP_HINT)
    if not gpus and expect.get("gpu_rule"):
        where = "NVML lists no GPU" if nvml_found else "libnvidia-ml.so.1 does not load in this container"
        return ("the driver is %s, but %s, so the GPUs cannot be compared with the image's kernels" % (driver, where),
                "start it with the NVIDIA runtime's `utility` capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility, "
                "as the image sets) and at least one GPU; " + SKIP_HINT)
    return None


class JsonContext:
    """What json's C scanner reads of a decoder: the defaults of json.loads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = None


def parse_json(text):
    """json.loads by the C scanner alone: `import json` imports `re` and compiles its
    patterns, which more than doubles the guard's time on the way to a good start."""
    try:
        import _json
    except ImportError:
        import json

        return json.loads(text)
    value, end = _json.make_scanner(JsonContext())(text, 0)
    if text[end:].strip():
        raise ValueError("extra data after the JSON document")
    return value


def say(lines):
    sys.stderr.write("".join(line + "\n" for line in lines))
    sys.stderr.flush()


def answer(expect):
    """(exit status, lines): 0 with no lines is a yes."""
    found = nvml_node()
    driver, gpus = found if found else (None, [])
    driver = driver or proc_driver()
    if driver and not (version(driver) and version(driver)[0] >= 100):
        driver = None  # not a driver version as version.rs DriverVersion reads one
    findings = driver_findings(expect, driver) if driver else []
    line = ceiling(expect, driver) if driver else None
    jit = version(line["ptx_isa"]) if line and line.get("ptx_isa") else None
    for name, cc in gpus:
        findings += gpu_findings(expect, name, cc, jit)
    if findings:
        lines = ["cudastack guard: no: this image will not run on this node"]
        for subject, what, hint in findings:
            lines += ["NO  %s %s" % (subject, what), "    hint: " + hint]
        return EXIT_NO, lines
    unknown = unknown_because(expect, driver, gpus, found is not None)
    if unknown:
        return EXIT_UNKNOWN, ["cudastack guard: unknown: " + unknown[0], "    hint: " + unknown[1]]
    return 0, []


def command(argv):
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        say(["cudastack guard: nothing to start: the image has no entrypoint and no command"])
        sys.exit(2)
    return argv


def main():
    argv = command(sys.argv[1:])
    if os.environ.get("CUDASTACK_GUARD") != "skip":
        text = os.environ.get("CUDASTACK_GUARD_EXPECT")
        if not text:
            say(["cudastack guard: unknown: CUDASTACK_GUARD_EXPECT, what the build says the image needs, is not set",
                 "    hint: keep the image's environment (the build writes it); " + SKIP_HINT])
            sys.exit(EXIT_UNKNOWN)
        try:
            status, lines = answer(parse_json(text))
        except (ValueError, StopIteration, LookupError, TypeError) as error:
            status, lines = EXIT_UNKNOWN, [
                "cudastack guard: unknown: CUDASTACK_GUARD_EXPECT does not read as the build writes it (%s: %s)" % (type(error).__name__, error),
                "    hint: keep the image's environment (the build writes it); " + SKIP_HINT]
        if status:
            say(lines)
            sys.exit(status)
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        say(["cudastack guard: cannot start `%s`: %s" % (argv[0], error.strerror)])
        sys.exit(127 if isinstance(error, FileNotFoundError) else 126)


if __name__ == "__main__":
    main()
