#!/usr/bin/env bash
# Run the whole test suite with the real components it needs: a Docker daemon, skopeo,
# umoci, a registry. Starts dockerd if none answers (and stops it again on exit).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

started_dockerd=""
if ! docker info >/dev/null 2>&1; then
  if command -v dockerd >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "test: starting dockerd" >&2
    dockerd >/tmp/cudastack-dockerd.log 2>&1 &
    started_dockerd=$!
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "test: dockerd did not start; see /tmp/cudastack-dockerd.log" >&2; tail -20 /tmp/cudastack-dockerd.log >&2; }
  else
    echo "test: no Docker daemon and cannot start one; Docker tests will skip and say why" >&2
  fi
fi
cleanup() {
  if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; wait "$started_dockerd" 2>/dev/null || true; fi
}
trap cleanup EXIT

cargo test --locked --all-targets -- --test-threads="${CUDASTACK_TEST_THREADS:-2}"
# The native probe's own crate (probe/rust), in the target dir setup.sh built it in.
cargo test --locked --manifest-path probe/rust/Cargo.toml --target-dir target/probe-build/cuda12
