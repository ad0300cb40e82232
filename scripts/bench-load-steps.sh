#!/usr/bin/env bash
# Side by side, twice: `cudastack load LAYOUT` (in steps of at most 512 MiB of layers) against
# `docker load` of the same layout as one tar (one request), with the most Docker's spool
# (/var/lib/docker/tmp) held during each. Run as root beside a local dockerd:
#   scripts/bench-load-steps.sh LAYOUT [CUDASTACK]
# e.g. a layout of recipes/torch2.4.1-cu121-py3.11.yaml built with `--no-verify --layout`.
set -euo pipefail
L=${1:?usage: scripts/bench-load-steps.sh LAYOUT [CUDASTACK]}
cudastack=${2:-target/debug/cudastack}
peak() { # max MiB of /var/lib/docker/tmp while $1 runs
  local max=0 s
  while kill -0 "$1" 2>/dev/null; do
    s=$(du -sm /var/lib/docker/tmp 2>/dev/null | cut -f1)
    [ "$s" -gt "$max" ] && max=$s
    sleep 0.5
  done
  echo "$max"
}
id=$("$(dirname "$0")/layout-image-id.sh" "$L")
timed() { # label, command...: wall seconds and the spool's peak
  local label=$1 started pid spool
  shift
  docker rmi -f "$id" >/dev/null 2>&1 || true
  started=$(date +%s.%N)
  "$@" >/dev/null 2>&1 &
  pid=$!
  spool=$(peak "$pid")
  wait "$pid"
  echo "$label: $(echo "$(date +%s.%N) - $started" | bc) s, Docker's spool at most $spool MiB"
}
for _ in 1 2; do
  timed "cudastack load (in steps)" "$cudastack" load "$L"
  # shellcheck disable=SC2016 # $1 is the inner shell's
  timed "tar | docker load (one request)" sh -c 'tar -C "$1" -cf - . | docker load -q' sh "$L"
done
docker rmi -f "$id" >/dev/null 2>&1 || true
