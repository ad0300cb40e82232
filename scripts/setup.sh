#!/usr/bin/env bash
# Install what cudastack and its tests use on a Debian/Ubuntu host, and build the binary.
# Idempotent: safe to run again. Needs root (or sudo) for the apt step.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(docker.io skopeo umoci mmdebstrap docker-registry pigz zstd xz-utils gcc busybox-static)
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

cargo build --release --locked
echo "setup: built target/release/cudastack" >&2
