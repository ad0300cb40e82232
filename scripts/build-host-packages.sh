#!/usr/bin/env bash
# What a build host needs besides the cudastack binary, from Debian/Ubuntu's archive:
# mmdebstrap for the base, fakechroot, fakeroot and uidmap for the rootless build modes,
# ca-certificates for HTTPS. Installed only when missing (apt, as root or with sudo).
# Shared by scripts/install.sh (a release archive) and scripts/run.sh (a checkout).
set -euo pipefail

packages=(mmdebstrap fakechroot fakeroot uidmap ca-certificates)
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
