#!/usr/bin/env bash
# The VM lab's part of `make test` (`make vmlab`): tiercache as a real kernel
# block device in a qemu guest (TCG; no KVM needed).
#   1. installs qemu, debootstrap, cpio (scripts/install-vmlab-deps.sh);
#      skips, with a message, only if qemu cannot be installed;
#   2. builds the guest image, or reuses the cached one (vmlab/build-image.sh);
#   3. builds the release tiercache binary;
#   4. runs the guest tests: vmlab/guest/nbd.sh (kernel NBD client),
#      vmlab/guest/ublk.sh (skipped while tiercache has no ublk front end),
#      vmlab/guest/ublk-restart.sh and vmlab/guest/nbd-restart.sh (the ublk
#      device, and the kernel NBD device the server configures itself,
#      survive kill -9 and an upgrade of the server; each prints its rounds'
#      pause and restart time).
# Run directories (console logs, result files): $VMLAB_OUT, default
# ${CARGO_TARGET_DIR:-target}/vmlab. VMLAB_CARGO_FLAGS adds cargo build flags
# (e.g. "--features ublk").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo="$(pwd)"
CARGO="${CARGO:-cargo}"

if ! ./scripts/install-vmlab-deps.sh; then
  if ! command -v qemu-system-x86_64 >/dev/null; then
    echo "vmlab: SKIP: qemu-system-x86_64 is not installed and could not be installed; the kernel block device tests did not run"
    exit 0
  fi
  echo "vmlab: some lab packages could not be installed; trying with what is there" >&2
fi

t0=$(date +%s)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! image="$($SUDO ./vmlab/build-image.sh | tail -n 1)"; then
  echo "vmlab: FAILED to build the guest image" >&2
  exit 1
fi
t_image=$(($(date +%s) - t0))

t0=$(date +%s)
# shellcheck disable=SC2086
$CARGO build --release -p tiercache ${VMLAB_CARGO_FLAGS:-} || exit 1
t_build=$(($(date +%s) - t0))
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
export VMLAB_TIERCACHE="$target/release/tiercache"
out="${VMLAB_OUT:-$target/vmlab}"
mkdir -p "$out"

failed=0
summary=()
run_guest_test() {
  local name=$1
  shift
  local t status
  t=$(date +%s)
  ./vmlab/run.sh --out "$out/$name" "$@"
  status=$?
  t=$(($(date +%s) - t))
  case "$status" in
    0) summary+=("vmlab: $name: ok (${t}s)") ;;
    77) summary+=("vmlab: $name: SKIPPED: $(grep -a '^SKIP:' "$out/$name/console.log" | tail -n 1 | tr -d '\r')") ;;
    *) summary+=("vmlab: $name: FAILED with status $status (${t}s; $out/$name/console.log)"); failed=1 ;;
  esac
}

# shellcheck disable=SC2054 # (commas inside one --disk argument)
disks=(--disk hdd=1G,iops=300 --disk ssd=256M)
run_guest_test nbd --timeout 900 "${disks[@]}" vmlab/guest/nbd.sh
run_guest_test ublk --timeout 900 "${disks[@]}" vmlab/guest/ublk.sh
run_guest_test ublk-restart --timeout 900 "${disks[@]}" vmlab/guest/ublk-restart.sh
run_guest_test nbd-restart --timeout 900 "${disks[@]}" vmlab/guest/nbd-restart.sh

echo "vmlab: image $(basename "$image") ready in ${t_image}s, tiercache built in ${t_build}s"
printf '%s\n' "${summary[@]}"
for t in ublk-restart nbd-restart; do
  if [ -f "$out/$t/results/$t/rounds.txt" ]; then
    echo "vmlab: $t rounds:"
    sed 's/^/  /' "$out/$t/results/$t/rounds.txt"
  fi
done
exit "$failed"
