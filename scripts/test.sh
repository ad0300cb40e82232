#!/usr/bin/env bash
# Run the whole test suite with the real components it needs: a Docker daemon, skopeo,
# umoci, a registry. Starts dockerd if none answers (and stops it again on exit).
#
# Every test that cannot run here goes through one gate (tests/gate, issue 17). With
# CUDASTACK_REQUIRE=1 (set here when CI is set, or by the caller; `.ci/run` sets it) a
# missing component fails its test instead of skipping, and a Docker daemon that cannot be
# started fails the run before any test. Without it, the skips are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${CI:-}" in
  "" | 0 | false) ;;
  *) export CUDASTACK_REQUIRE=1 ;;
esac
require="${CUDASTACK_REQUIRE:-}"
[ "$require" = 0 ] && require=""

# The skip log the gate appends to: one line per skip (test, component, reason).
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
mkdir -p "$target_dir"
export CUDASTACK_SKIP_LOG="$target_dir/test-skips.log"
: >"$CUDASTACK_SKIP_LOG"

# A component the run cannot do without: fatal under CUDASTACK_REQUIRE, a warning otherwise.
missing() {
  if [ -n "$require" ]; then
    echo "test: error: $1" >&2
    echo "test: CUDASTACK_REQUIRE is set (CI), so a missing component fails the run; unset it to let the tests skip" >&2
    exit 1
  fi
  echo "test: warning: $1; the tests that need it will skip and say why" >&2
}

# Disk: the debug build, the end-to-end cache (a torch stack: ~6 GB of wheels, ~6 GB staged)
# and the images loaded into Docker. A run that dies of ENOSPC says so in its test output;
# these lines make the cause plain before and after.
disk_report() {
  echo "test: disk $1: $(df -h --output=avail,target "$target_dir" | tail -1 | awk '{print $1" free on "$2}')" >&2
}
disk_report "before setup"

# The lowest free space seen while the tests run: a test that died of a full disk mid-run
# leaves no trace in the figure at the end, once the other tests removed what they made.
# With it, what held the disk then: the time, the test log's last line (the tests running),
# the e2e cache and Docker's store; taken again each time the low falls by another GiB.
disk_low_file="$target_dir/test-disk-low"
disk_low_where="$target_dir/test-disk-low-where"
watch_disk() {
  local low="" described="" now
  while :; do
    now=$(df --output=avail -B1M "$target_dir" | tail -1 | tr -d ' ')
    if [ -z "$low" ] || [ "$now" -lt "$low" ]; then
      low=$now
      echo "$low" >"$disk_low_file"
      if [ -z "$described" ] || [ $((described - now)) -ge 1024 ]; then
        described=$now
        {
          echo "at $(date -u +%H:%M:%S) UTC, after: $(tail -n 1 "$test_log" 2>/dev/null | cut -c1-160)"
          # -x: never into a mount, such as the /sys of a base mmdebstrap is making (a du
          # inside it when mmdebstrap unmounts it leaves it mounted in the tree).
          echo "e2e cache: $(du -smx "$target_dir/tmp/e2e-cache" 2>/dev/null | cut -f1) MiB; target dir: $(du -smx "$target_dir" 2>/dev/null | cut -f1) MiB"
          echo "docker: $(docker system df --format '{{.Type}} {{.Size}}' 2>/dev/null | tr '\n' ';')"
        } >"$disk_low_where.new" && mv "$disk_low_where.new" "$disk_low_where"
      fi
    fi
    sleep 5
  done
}

scripts/setup.sh --for-tests
disk_report "before the tests"
# The native probes (scripts/build-probe.sh: zig from PyPI, a Debian chroot for the other
# architecture) build while cargo builds the tests; the tests need them only when they run.
probe_log="$target_dir/probe-build.log"
scripts/build-probe.sh >"$probe_log" 2>&1 &
probe_builder=$!

started_dockerd=""
if ! docker info >/dev/null 2>&1; then
  if command -v dockerd >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "test: starting dockerd" >&2
    dockerd >/tmp/cudastack-dockerd.log 2>&1 &
    started_dockerd=$!
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 "$started_dockerd" 2>/dev/null || break # it exited: no use waiting
      sleep 1
    done
    if ! docker info >/dev/null 2>&1; then
      tail -20 /tmp/cudastack-dockerd.log >&2
      kill "$started_dockerd" 2>/dev/null || true
      started_dockerd=""
      missing "dockerd did not start (it exited, or did not answer within 60 s; its log, above, is /tmp/cudastack-dockerd.log)"
    fi
  elif ! command -v dockerd >/dev/null 2>&1; then
    missing "no Docker daemon answers and dockerd is not installed (apt-get install docker.io)"
  else
    missing "no Docker daemon answers and only root can start dockerd (run as root, or start it)"
  fi
fi
# CI shows only the head and the tail of this output, so the cause of each failure is
# repeated at the end: every failed test's own output, a few lines each.
test_log="$target_dir/test-output.log"
failure_summary() {
  [ -s "$test_log" ] || return 0
  grep -q '^---- .* stdout ----$' "$test_log" || return 0
  echo >&2
  echo "why the failed tests failed (first lines of each; all of it in $test_log):" >&2
  awk '
    /^---- .* stdout ----$/ { inblock = 1; lines = 0; print; next }
    /^failures:$/ || /^test result:/ { inblock = 0 }
    inblock && lines < 12 && NF > 0 && $0 !~ /^note: run with/ { print "    " substr($0, 1, 400); lines++ }
  ' "$test_log" | head -400 >&2
}
cleanup() {
  status=$?
  [ -n "${disk_watcher:-}" ] && kill "$disk_watcher" 2>/dev/null
  [ -n "${probe_builder:-}" ] && kill "$probe_builder" 2>/dev/null
  failure_summary
  disk_report "at the end"
  if [ -s "$disk_low_file" ]; then
    echo "test: disk at its lowest during the tests: $(awk '{ printf "%.1f", $1 / 1024 }' "$disk_low_file") GiB free" >&2
    [ -s "$disk_low_where" ] && sed 's/^/test:   /' "$disk_low_where" >&2
  fi
  if [ -n "$started_dockerd" ]; then kill "$started_dockerd" 2>/dev/null || true; wait "$started_dockerd" 2>/dev/null || true; fi
  # The skips a developer sees locally, at the end where they are read.
  if [ -s "$CUDASTACK_SKIP_LOG" ]; then
    tests=$(cut -f1 "$CUDASTACK_SKIP_LOG" | sort -u | wc -l)
    echo >&2
    echo "skipped here: $tests tests ($CUDASTACK_SKIP_LOG)" >&2
    sort "$CUDASTACK_SKIP_LOG" | awk -F '\t' '{ printf "  %s [%s]: %s\n", $1, $2, $3 }' >&2
  fi
  exit "$status"
}
trap cleanup EXIT

: >"$test_log"
rm -f "$disk_low_file" "$disk_low_where"
watch_disk &
disk_watcher=$!
cargo test --locked --all-targets --no-run
if ! wait "$probe_builder"; then
  cat "$probe_log" >&2
  echo "test: error: the native probes did not build (scripts/build-probe.sh; its output is above)" >&2
  exit 1
fi
probe_builder=""
sed 's/^/probes: /' "$probe_log" >&2
# Four threads on two cores: most tests wait on Docker, a registry or a subprocess, not on the
# CPU; the tests that put a large image on the disk take e2e_support::large_image_slot, one at a
# time, whatever the thread count.
cargo test --locked --all-targets -- --test-threads="${CUDASTACK_TEST_THREADS:-4}" 2>&1 | tee "$test_log"
# Source builds compile against a CUDA 13 stack of their own (~11 GB of downloads, staged trees
# and layers while the test runs, in a cache it removes). They run after the suite so that
# they never share the disk with the torch images the other tests load; on CI, whose disk is
# the tightest and whose caches are thrown away, the shared e2e cache (~14 GB) goes first
# (.ci/run sets CUDASTACK_DROP_E2E_CACHE).
if [ -n "${CUDASTACK_DROP_E2E_CACHE:-}" ]; then
  rm -rf "$target_dir/tmp/e2e-cache"
  disk_report "before the source builds"
fi
cargo test --locked --test suite source_build::extensions_build_for_the_recipe_gpus_and_are_reused \
  -- --ignored --exact 2>&1 | tee -a "$test_log"
# The native probe's own crate (probe/rust), in the target dir setup.sh built it in.
cargo test --locked --manifest-path probe/rust/Cargo.toml --target-dir target/probe-build/cuda12
