#!/usr/bin/env bash
# Build the native verification probe (probe/rust, `cudastack-probe`) of images without
# torch: one binary per CUDA major (cudarc fixes the library SONAMEs at compile time) and
# per machine, into target/probe/cudastack-probe-cudaNN-MACHINE (MACHINE as `uname -m`
# says it: x86_64, aarch64). `cudastack build` bakes the one for the image's machine.
#
# cargo-zigbuild (zig as the linker, both from PyPI) links against glibc 2.17, so the probe
# runs on every base back to CentOS 7 / UBI 8 / Ubuntu 20.04; without it the host probe
# needs this machine's glibc (2.34 symbols on Debian 12).
#
# The other machine's probe needs that machine's Rust standard library, which rustup would
# fetch from a server this project cannot count on. Debian packages it per architecture
# (libstd-rust-dev:arm64 beside the amd64 rustc), so it is built in a Debian trixie chroot
# made by mmdebstrap (target/probe-xc, kept between runs) with trixie-backports' rustc.
# That needs root; without it only this machine's probe is built and arm64 images say so.
#
#   scripts/build-probe.sh [--host|--foreign]   (default: both)
#
# The parts split so CI can build this machine's probe as the runner user (its rustup
# toolchain) and the other machine's under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

parts="${1:---all}"
case "$parts" in
  --all|--host|--foreign) ;;
  *) echo "usage: $0 [--host|--foreign]" >&2; exit 2 ;;
esac

host_machine="$(uname -m)"
mkdir -p target/probe

probe_inputs=(probe/rust/src probe/rust/Cargo.toml probe/rust/Cargo.lock)
# True when every output named is newer than every probe source.
up_to_date() {
  local output
  for output in "$@"; do
    [ -f "$output" ] || return 1
    [ -z "$(find "${probe_inputs[@]}" -newer "$output" -print -quit)" ] || return 1
  done
}

build_host_probe() {
  # cargo-zigbuild and zig from PyPI, in a venv of their own where pip may not install
  # into the system Python (PEP 668 on Ubuntu 24.04 and Debian 12's python3).
  if ! command -v cargo-zigbuild >/dev/null 2>&1; then
    tools="$PWD/target/probe-tools"
    if [ ! -x "$tools/bin/cargo-zigbuild" ]; then
      { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet ziglang cargo-zigbuild; } >&2 \
        || echo "build-probe: no cargo-zigbuild; the native probe is linked against this machine's glibc" >&2
    fi
    [ -x "$tools/bin/cargo-zigbuild" ] && PATH="$tools/bin:$PATH"
  fi
  local major probe_args triple built
  for major in 12 13; do
    probe_args=(--release --locked --quiet --manifest-path probe/rust/Cargo.toml
      --target-dir "target/probe-build/cuda$major" --no-default-features --features "cuda$major")
    if command -v cargo-zigbuild >/dev/null 2>&1; then
      triple="$host_machine-unknown-linux-gnu"
      cargo zigbuild "${probe_args[@]}" --target "$triple.2.17"
      built="target/probe-build/cuda$major/$triple/release/cudastack-probe"
    else
      cargo build "${probe_args[@]}"
      built="target/probe-build/cuda$major/release/cudastack-probe"
    fi
    install -m 0755 "$built" "target/probe/cudastack-probe-cuda$major-$host_machine"
  done
  echo "build-probe: built target/probe/cudastack-probe-cuda{12,13}-$host_machine" >&2
}
[ "$parts" = --foreign ] || build_host_probe
[ "$parts" != --host ] || exit 0

case "$host_machine" in
  x86_64) foreign_machine=aarch64 foreign_arch=arm64 host_arch=amd64 ;;
  aarch64) foreign_machine=x86_64 foreign_arch=amd64 host_arch=arm64 ;;
  *) echo "build-probe: no cross build from $host_machine" >&2; exit 0 ;;
esac
outputs=(target/probe/cudastack-probe-cuda{12,13}-"$foreign_machine")
if up_to_date "${outputs[@]}"; then
  echo "build-probe: ${outputs[*]} are up to date" >&2
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "build-probe: the $foreign_machine probe needs root and mmdebstrap (a Debian chroot with its Rust std): not built" >&2
  exit 0
fi

root="$PWD/target/probe-xc/$foreign_arch"
if [ ! -f "$root.complete" ]; then
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  echo "build-probe: making the cross-build chroot $root" >&2
  # Debian's keys, named explicitly: on an Ubuntu host apt trusts only Ubuntu's.
  keyring=()
  [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ] \
    || keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
  mmdebstrap --quiet --variant=apt --architectures="$host_arch,$foreign_arch" "${keyring[@]}" \
    --include="ca-certificates,python3-pip,rustc/trixie-backports,cargo/trixie-backports,libstd-rust-dev/trixie-backports,libstd-rust-dev:$foreign_arch/trixie-backports" \
    trixie "$root" \
    "deb http://deb.debian.org/debian trixie main" \
    "deb http://deb.debian.org/debian trixie-backports main" >&2
  # The chroot trusts what this host trusts (a site's TLS proxy included) for PyPI and crates.io.
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  chroot "$root" python3 -m pip install --quiet --break-system-packages --root-user-action=ignore \
    ziglang cargo-zigbuild >&2
  touch "$root.complete"
fi

rm -rf "$root/src"
mkdir -p "$root/src"
cp -r probe/rust/src probe/rust/Cargo.toml probe/rust/Cargo.lock "$root/src/"
# rustc needs /proc; the mount lives in a private namespace and goes with it.
# shellcheck disable=SC2016 # expanded by the inner shell
unshare --mount --fork sh -c '
  mount -t proc proc "$1/proc"
  chroot "$1" sh -c "cd /src && for major in 12 13; do
    CARGO_HOME=/cargo cargo zigbuild --release --locked --quiet --no-default-features \
      --features cuda\$major --target-dir /build/cuda\$major --target $2-unknown-linux-gnu.2.17 || exit 1
  done"' sh "$root" "$foreign_machine"
for major in 12 13; do
  install -m 0755 "$root/build/cuda$major/$foreign_machine-unknown-linux-gnu/release/cudastack-probe" \
    "target/probe/cudastack-probe-cuda$major-$foreign_machine"
done
echo "build-probe: built ${outputs[*]} (trixie-backports $(chroot "$root" rustc -V))" >&2
