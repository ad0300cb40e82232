#!/usr/bin/env bash
# Install Debian/Ubuntu PACKAGES that are missing (apt, as root or with sudo); without
# arguments, what a build host needs besides the cudastack binary: mmdebstrap for the base,
# fakechroot, fakeroot and uidmap for the rootless build modes, ca-certificates for HTTPS.
# Used by scripts/install.sh (a release archive) and scripts/run.sh (a checkout).
# Without recommended packages; scripts/setup.sh keeps its own install, with them.
#
#   scripts/build-host-packages.sh [PACKAGE...]
set -euo pipefail

if [ $# -gt 0 ]; then
  packages=("$@")
else
  packages=(mmdebstrap fakechroot fakeroot uidmap ca-certificates)
fi
missing=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
