#!/usr/bin/env bash
# A user's setup: cudastack from a release archive, and what a build host needs besides it
# (mmdebstrap for the base; fakechroot, fakeroot and uidmap for the rootless build modes).
# No Rust, no compiler, no test tools: that is the contributor's scripts/setup.sh.
#
#   scripts/install.sh ARCHIVE [--prefix DIR]
#
# ARCHIVE: cudastack-VERSION-TARGET.tar.gz, a path or an https URL, with its .sha256 beside
# it (as a release publishes them, and as scripts/release.sh writes them). The archive is
# checked against the .sha256 before anything is unpacked, and must hold only
# cudastack-VERSION-TARGET/bin/cudastack and its probe/ directory. It is unpacked under
# PREFIX/opt (default: /usr/local as root, else ~/.local) and bin/cudastack linked into
# PREFIX/bin; the probes stay beside it, where `cudastack build` looks for them.
set -euo pipefail

usage() { echo "usage: scripts/install.sh ARCHIVE [--prefix DIR]" >&2; exit 2; }
die() { echo "install: $*" >&2; exit 1; }

[ $# -ge 1 ] || usage
archive="$1"; shift
if [ "$(id -u)" -eq 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || usage; prefix="$2"; shift 2 ;;
    *) usage ;;
  esac
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
name="$(basename "$archive")"
case "$name" in
  cudastack-*-*.tar.gz) ;;
  *) die "\`$name\` is not a release archive (cudastack-VERSION-TARGET.tar.gz)" ;;
esac
case "$archive" in
  https://*)
    curl -fsSL --proto '=https' -o "$work/$name" "$archive"
    curl -fsSL --proto '=https' -o "$work/$name.sha256" "$archive.sha256"
    ;;
  *://*) die "only https URLs: $archive" ;;
  *)
    [ -f "$archive" ] || die "no such file: $archive"
    [ -f "$archive.sha256" ] || die "no $archive.sha256 beside the archive: it cannot be checked"
    cp "$archive" "$work/$name"
    cp "$archive.sha256" "$work/$name.sha256"
    ;;
esac
# The .sha256 must name this archive and nothing else.
[ "$(awk '{print $2}' "$work/$name.sha256")" = "$name" ] \
  || die "$name.sha256 does not name $name"
(cd "$work" && sha256sum --check --strict --quiet "$name.sha256") \
  || die "$name does not match its .sha256: not installed"

top="${name%.tar.gz}"
# Every member under TOP/bin/cudastack or TOP/probe/, no absolute path, no `..`.
while IFS= read -r member; do
  case "$member" in
    "$top/" | "$top/bin/" | "$top/bin/cudastack" | "$top/probe/" | "$top/probe/cudastack-probe-"*) ;;
    *) die "$name holds \`$member\`, which a release archive does not" ;;
  esac
  case "$member" in *..*) die "$name holds \`$member\`" ;; esac
done < <(tar -tzf "$work/$name")
# Regular files and directories only: a link in the archive would point the installed
# command somewhere outside it.
while IFS= read -r entry; do
  case "$entry" in
    -* | d*) ;;
    *) die "$name holds something that is not a file or a directory: $entry" ;;
  esac
done < <(tar -tvzf "$work/$name")

# What a build host needs, once the archive is known to be the one published.
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
[ -f "$(dirname "$0")/build-host-packages.sh" ] \
  || die "scripts/build-host-packages.sh is not beside this script: run install.sh from the scripts/ directory it came with"
bash "$(dirname "$0")/build-host-packages.sh"

$sudo_cmd mkdir -p "$prefix/opt" "$prefix/bin"
$sudo_cmd rm -rf "$prefix/opt/$top.new"
$sudo_cmd mkdir "$prefix/opt/$top.new"
$sudo_cmd tar -xzf "$work/$name" -C "$prefix/opt/$top.new" --no-same-owner
$sudo_cmd rm -rf "$prefix/opt/$top"
$sudo_cmd mv "$prefix/opt/$top.new/$top" "$prefix/opt/$top"
$sudo_cmd rmdir "$prefix/opt/$top.new"
$sudo_cmd ln -sfn "$prefix/opt/$top/bin/cudastack" "$prefix/bin/cudastack"
"$prefix/bin/cudastack" --version
echo "install: $prefix/bin/cudastack -> $prefix/opt/$top/bin/cudastack" >&2
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" >&2 ;;
esac
