#!/usr/bin/env bash
# A build whose image goes into Docker (the verification's static probe), side by side:
#
#   sequential: `build RECIPE --no-verify`, then `verify LAYOUT` (the build, then the load
#               and the probe, one after the other: what `build` did before its early loads);
#   build:      `build RECIPE`, which loads its lower layers while it builds the upper ones.
#
# Each from a fresh cache holding only the downloads (scripts/downloads-only.sh), and with
# none of the image's layers in Docker.
#
# Usage: scripts/bench-early-load.sh [CUDASTACK] [RECIPE]
#        (default target/debug/cudastack and recipes/torch2.4.1-cu121-py3.11.yaml)
# Env:   WARM_CACHE (default ~/.cache/cudastack: it must hold the recipe's downloads),
#        BENCH_DIR (scratch on WARM_CACHE's filesystem, default /tmp/cudastack-bench-early-load).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/cudastack}
recipe=${2:-recipes/torch2.4.1-cu121-py3.11.yaml}
warm=${WARM_CACHE:-$HOME/.cache/cudastack}
work=${BENCH_DIR:-/tmp/cudastack-bench-early-load}
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The image's config digest: its Docker ID.
image_id() { # layout
    python3 - "$1" <<'PY'
import json, sys
layout = sys.argv[1]
entries = json.load(open(f"{layout}/index.json"))["manifests"]
entry = next(e for e in entries
             if e.get("annotations", {}).get("org.opencontainers.image.ref.name") == "latest")
manifest = json.load(open(f"{layout}/blobs/sha256/" + entry["digest"].split(":")[1]))
print(manifest["config"]["digest"])
PY
}

seconds() { # command...: its wall seconds
    local started
    started=$(date +%s.%N)
    "$@" >>"$work/log" 2>&1
    echo "$(date +%s.%N) - $started" | bc
}

scripts/downloads-only.sh "$warm" "$work/cache-seq"
scripts/downloads-only.sh "$warm" "$work/cache-early"

build=$(seconds "$bin" build "$recipe" --no-verify --layout "$work/seq" --cache-dir "$work/cache-seq")
id=$(image_id "$work/seq")
docker rmi -f "$id" >/dev/null 2>&1 || true
verify=$(seconds "$bin" verify "$work/seq" --cache-dir "$work/cache-seq")
docker rmi -f "$id" >/dev/null 2>&1 || true
early=$(seconds "$bin" build "$recipe" --layout "$work/early" --cache-dir "$work/cache-early")
docker rmi -f "$(image_id "$work/early")" >/dev/null 2>&1 || true

echo "| | wall |"
echo "|---|---|"
echo "| build --no-verify, then verify (sequential) | $build s + $verify s = $(echo "$build + $verify" | bc) s |"
echo "| build (early loads) | $early s |"
