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

seconds() { # command...: its wall seconds
    local started
    started=$(date +%s.%N)
    "$@" >>"$work/log" 2>&1
    echo "$(date +%s.%N) - $started" | bc
}

scripts/downloads-only.sh "$warm" "$work/cache-seq"
scripts/downloads-only.sh "$warm" "$work/cache-early"

build=$(seconds "$bin" build "$recipe" --no-verify --layout "$work/seq" --cache-dir "$work/cache-seq")
id=$(scripts/layout-image-id.sh "$work/seq")
docker rmi -f "$id" >/dev/null 2>&1 || true
verify=$(seconds "$bin" verify "$work/seq" --cache-dir "$work/cache-seq")
docker rmi -f "$id" >/dev/null 2>&1 || true
early=$(seconds "$bin" build "$recipe" --layout "$work/early" --cache-dir "$work/cache-early")
docker rmi -f "$(scripts/layout-image-id.sh "$work/early")" >/dev/null 2>&1 || true

echo "| | wall |"
echo "|---|---|"
echo "| build --no-verify, then verify (sequential) | $build s + $verify s = $(echo "$build + $verify" | bc) s |"
echo "| build (early loads) | $early s |"
