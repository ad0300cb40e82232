#!/usr/bin/env bash
# The start-time guard's cost (docs/guard.md): the guard in front of a good start against
# the entrypoint alone, 50 runs each, median and p90, on the planted host of
# tests/guard_start.rs (the NVML stub compiled with cc, a /proc driver file, eight H100s,
# the facts the build writes for a recipe with two kernel coverage groups, one reached by JIT).
#
# Usage: scripts/bench-guard.sh
# Env:   CARGO_TARGET_DIR as for any cargo run. Needs cargo, cc and python3; /usr/bin/python3
#        (the interpreter images run the guard with) when present, else python3 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --test suite guard_start::start_cost -- --ignored --exact --nocapture 2>&1 |
    grep -E '^(entrypoint alone|guard \+ entrypoint|guard.s cost)'
