#!/usr/bin/env bash
# Installs the Debian packages the VM lab (vmlab/) needs on the host: qemu
# (TCG, no KVM needed), debootstrap and cpio to build the guest image.
# Idempotent: installs only what is missing. Needs root (or sudo).
# Exit status: 0 when everything is present afterwards, 1 otherwise.
set -euo pipefail
packages=(qemu-system-x86 debootstrap cpio xz-utils zstd coreutils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-vmlab-deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-vmlab-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
