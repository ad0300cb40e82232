#!/usr/bin/env bash
# The main job from a fresh checkout, set-up included: what a build host needs (Debian's
# mmdebstrap & co., scripts/build-host-packages.sh), the cudastack binary, the recipe's lock
# when it has none, then the image.
#
#   scripts/run.sh RECIPE [cudastack build OPTIONS]
#
# The binary: $CUDASTACK when set, else `cudastack` on PATH (a release installed by
# scripts/install.sh), else this checkout's release build (`cargo build --release`; a no-op
# when it is current; Rust's installer, rustup, first when there is no cargo).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/run.sh RECIPE [cudastack build OPTIONS]" >&2; exit 2; }
recipe="$1"; shift
[ -f "$recipe" ] || { echo "run: no such recipe: $recipe" >&2; exit 2; }
checkout="$(cd "$(dirname "$0")/.." && pwd)"

bash "$checkout/scripts/build-host-packages.sh"

binary="${CUDASTACK:-}"
if [ -z "$binary" ] && command -v cudastack >/dev/null 2>&1; then
  binary="$(command -v cudastack)"
fi
if [ -z "$binary" ]; then
  # Building needs a C toolchain (libdeflate, zstd, ring) and, for rustup, curl.
  bash "$checkout/scripts/build-host-packages.sh" build-essential pkg-config curl
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
      echo "run: no cargo: installing Rust with rustup (https://rustup.rs)" >&2
      curl -fsSL --proto '=https' --tlsv1.2 https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    }
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  echo "run: building cudastack from $checkout (cargo build --release; minutes the first time)" >&2
  (cd "$checkout" && cargo build --release --locked --bin cudastack >&2)
  target_dir="${CARGO_TARGET_DIR:-target}"
  case "$target_dir" in /*) ;; *) target_dir="$checkout/$target_dir" ;; esac
  binary="$target_dir/release/cudastack"
fi
echo "run: $("$binary" --version) ($binary)" >&2

lock="${recipe%.*}.lock"
if [ ! -f "$lock" ]; then
  echo "run: $recipe has no lock: cudastack lock $recipe" >&2
  "$binary" lock "$recipe"
fi
exec "$binary" build "$recipe" "$@"
