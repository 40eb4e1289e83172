#!/usr/bin/env bash
# Installs the Debian packages tiercache's tests and benchmarks use, then
# the pinned Python packages (scripts/python-deps.sh, into .venv: the
# Python package's build and tests, and libcachesim). Idempotent: installs only what is
# missing. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
# python3-venv: scripts/python-deps.sh makes .venv with `python3 -m venv`.
# libclang-dev: libublk-rs-sys (the ublk front end, crates/ublk) generates its kernel bindings with bindgen.
# valgrind: the engine's hit_path benchmark counts instructions per IO with callgrind.
packages=(fio libnbd-bin nbdkit qemu-utils e2fsprogs python3-libnbd fuse3 git util-linux pkg-config libfontconfig1-dev fonts-dejavu-core libclang-dev libssl-dev openssl python3-venv valgrind)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
scripts/python-deps.sh
