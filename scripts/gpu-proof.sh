#!/usr/bin/env bash
# Run every level of both verification probes natively on a machine with an NVIDIA GPU,
# PyTorch and its pip CUDA libraries, but no Docker (the lent GPU machine): probe.py
# against the host's torch, the train check's margin over 20 seeds, and the Rust probe
# (target/probe, from scripts/build-probe.sh) against the CUDA libraries of the host's
# torch. Reports and logs go to $OUT (default target/gpu-proof); a summary to stdout.
#
#   scripts/gpu-proof.sh            # needs python3 with torch; nvidia-smi if present
#
# Without a GPU it still runs: the GPU levels then skip with the reason.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${OUT:-target/gpu-proof}"
mkdir -p "$out"
python="${PYTHON:-python3}"

{ nvidia-smi || echo "no nvidia-smi"; } >"$out/nvidia-smi.txt" 2>&1
head -12 "$out/nvidia-smi.txt"

# 1. probe.py, every level, against the host's torch (versions reported, not compared).
"$python" probe/probe.py --level all --expect /nonexistent >"$out/probe-py.out" 2>"$out/probe-py.err"
echo "probe.py exit $?"
cat "$out/probe-py.err"

# 2. How far train.mlp stays from its bound on this device.
"$python" scripts/probe_train_margin.py probe/probe.py >"$out/train-margin.json" 2>"$out/train-margin.err"
echo "train margin: $(cat "$out/train-margin.json")"

# 3. The Rust probe against torch's CUDA libraries. It expects one CUDA library directory,
# as in an image: the pip wheels' libraries are linked (hard links where possible, so
# /proc/self/maps names this directory) into one.
cuda_line="$("$python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)"
probe="target/probe/cudastack-probe-cuda${cuda_line%%.*}-$(uname -m)"
if [ -z "$cuda_line" ] || [ ! -x "$probe" ]; then
  echo "no Rust probe run: torch's CUDA is '${cuda_line:-none}', $probe is missing (scripts/build-probe.sh)"
  exit 0
fi
lib_dir="$PWD/$out/cuda-lib"
rm -rf "$lib_dir"
mkdir -p "$lib_dir"
"$python" - "$lib_dir" <<'EOF'
import glob, os, shutil, sys
import nvidia  # the namespace package of NVIDIA's pip wheels (nvidia-cublas-cu12, ...)
target = sys.argv[1]
for root in nvidia.__path__:
    for path in glob.glob(os.path.join(root, "*", "lib", "lib*.so*")):
        name = os.path.join(target, os.path.basename(path))
        source = os.path.realpath(path)
        if os.path.exists(name) or not os.path.isfile(source):
            continue
        try:
            os.link(source, name)
        except OSError:
            shutil.copy2(source, name)
EOF
printf '{"cuda": "%s", "cuda_lib_dir": "%s"}\n' "$cuda_line" "$lib_dir" >"$out/expect-rust.json"
LD_LIBRARY_PATH="$lib_dir" "$probe" --level all --expect "$out/expect-rust.json" \
  >"$out/probe-rust.out" 2>"$out/probe-rust.err"
echo "$probe exit $?"
cat "$out/probe-rust.err"
