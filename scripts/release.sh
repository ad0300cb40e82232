#!/usr/bin/env bash
# Build a static cudastack for TARGET and pack it as dist/cudastack-VERSION-TARGET.tar.gz
# with its .sha256 (issue 24: installable binaries). What .github/workflows/release.yml
# runs on a tag, and what tests/release_binary.rs runs here.
#
#   scripts/release.sh TARGET [--out DIR] [--profile NAME]
#
# --profile: the cargo profile (default `dist`). tests/release_binary.rs builds with
# `static-check`, which links the same static binary without optimising it: what the test
# proves (no interpreter, no shared library, the commands work in a bare container) does not
# depend on the optimisation level, and a clean CI run compiles every dependency for musl
# in a third of the time.
#
# TARGET: x86_64-unknown-linux-musl or aarch64-unknown-linux-musl. musl links statically:
# one binary that runs on any Linux of its machine, whatever its libc (a glibc build
# would need the oldest glibc it should run on). The C parts (aws-lc for rustls, zstd,
# liblzma) need a musl C compiler: musl-gcc (Debian's musl-tools) for this machine, or
# aarch64-linux-musl-gcc to cross-compile (else build on an arm64 machine).
#
# The archive holds cudastack-VERSION-TARGET/bin/cudastack and, when scripts/build-probe.sh
# has built them (target/probe), the native probes in cudastack-VERSION-TARGET/probe/,
# where `cudastack build` looks for them (bin/../probe).
#
# Reproducible: source paths are remapped out of the binary and the C objects, and the
# archive has fixed mtimes (SOURCE_DATE_EPOCH, else the commit's time), owners, modes and
# order, and a gzip header without a name or time.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/release.sh TARGET [--out DIR] [--profile NAME]" >&2; exit 2; }
die() { echo "release: $*" >&2; exit 1; }

[ $# -ge 1 ] || usage
target="$1"; shift
out="dist"
profile="dist"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --profile) [ $# -ge 2 ] || usage; profile="$2"; shift 2 ;;
    *) usage ;;
  esac
done

case "$target" in
  x86_64-unknown-linux-musl) machine=x86_64 ;;
  aarch64-unknown-linux-musl) machine=aarch64 ;;
  *) die "unsupported target \`$target\`: x86_64-unknown-linux-musl or aarch64-unknown-linux-musl" ;;
esac

# The musl C compiler for TARGET: native musl-gcc on a machine of that kind, else a cross
# one. Natively rustc links with its default `cc` and its own musl crt and libc
# (self-contained): Debian's musl-gcc as the linker adds `-dynamic-linker` to every link,
# which turned rustc's `-static-pie` into a PIE that asks for /lib/ld-musl-x86_64.so.1.
linker=""
if [ "$(uname -m)" = "$machine" ] && command -v musl-gcc >/dev/null 2>&1; then
  cc=musl-gcc
elif command -v "$machine-linux-musl-gcc" >/dev/null 2>&1; then
  cc="$machine-linux-musl-gcc"
  linker="$cc"
else
  die "no musl C compiler for $target: install musl-tools (apt-get install musl-tools) on a $machine machine, or put $machine-linux-musl-gcc on PATH"
fi
rustup target list --installed 2>/dev/null | grep -qx "$target" \
  || die "the Rust standard library for $target is not installed: rustup target add $target"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
[ -n "$version" ] || die "no version in Cargo.toml"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH

# Paths that would otherwise land in the binary (panic locations, C __FILE__ strings).
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
remap="--remap-path-prefix=$PWD=/cudastack --remap-path-prefix=$cargo_home=/cargo"
target_env="$(echo "$target" | tr 'a-z-' 'A-Z_')"
target_lower="${target//-/_}"
[ -z "$linker" ] || export "CARGO_TARGET_${target_env}_LINKER=$linker"
export "CARGO_TARGET_${target_env}_RUSTFLAGS=-C target-feature=+crt-static $remap"
export "CC_${target_lower}=$cc"
export "CFLAGS_${target_lower}=-O2 -ffile-prefix-map=$PWD=/cudastack -ffile-prefix-map=$cargo_home=/cargo"

echo "release: building cudastack $version for $target (C compiler: $cc)" >&2
cargo build --locked --profile "$profile" --target "$target" --bin cudastack
target_dir="${CARGO_TARGET_DIR:-target}"
binary="$target_dir/$target/$profile/cudastack"

# Static means no program interpreter and no shared library to load.
if readelf -lW "$binary" | grep -q 'INTERP'; then
  die "$binary asks for a program interpreter: it is not static"
fi
if readelf -dW "$binary" | grep -q '(NEEDED)'; then
  die "$binary needs shared libraries: $(readelf -dW "$binary" | grep '(NEEDED)' | tr -s ' ')"
fi

name="cudastack-$version-$target"
mkdir -p "$out"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 "$binary" "$stage/$name/bin/cudastack"
probes=(target/probe/cudastack-probe-cuda*)
if [ -e "${probes[0]}" ]; then
  install -d -m 0755 "$stage/$name/probe"
  install -m 0755 "${probes[@]}" "$stage/$name/probe/"
else
  echo "release: no native probes in target/probe (scripts/build-probe.sh): the archive has none" >&2
fi

archive="$name.tar.gz"
tar --sort=name --format=gnu --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  --mode='u+rwX,go+rX,go-w' -C "$stage" -cf - "$name" | gzip -n -9 > "$out/$archive.tmp"
mv "$out/$archive.tmp" "$out/$archive"
(cd "$out" && sha256sum "$archive" > "$archive.sha256")
echo "release: $out/$archive" >&2
cat "$out/$archive.sha256"
