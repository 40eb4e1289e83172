#!/usr/bin/env bash
# Boots the VM lab's guest (qemu, TCG: no KVM needed) with chosen disks and
# runs one guest script in it; streams the serial console; returns the
# script's exit status.
#
# Usage: vmlab/run.sh [OPTIONS] SCRIPT [ARGS...]
#   SCRIPT       a bash script run as root in the guest (with ARGS); it can
#                `. /vmlab/lib.sh` for helpers (step, fail, skip, disk,
#                vmlab_crash, wait_for_path). Every file of vmlab/guest/ is
#                in the guest's /vmlab/ too.
#   --disk NAME=SIZE|PATH[,OPT...]
#                a virtio disk, /dev/vmlab/NAME in the guest. SIZE (e.g. 1G)
#                makes a new sparse file in the run directory; PATH uses an
#                existing raw file (or block device). OPTs: iops=N (qemu
#                throttling of all IO, e.g. an HDD), read-iops=N, write-iops=N,
#                bps=N, or any qemu -drive key=value (default cache=none).
#   --bin PATH   copy a host binary into the guest's /vmlab/bin (on PATH),
#                with the shared libraries the image lacks. Repeatable.
#                Default: the workspace's release `tiercache` ($VMLAB_TIERCACHE,
#                else $CARGO_TARGET_DIR or target/ + /release/tiercache).
#   --env K=V    an environment variable for the script. Repeatable.
#   --out DIR    run directory (default: a new /var/tmp/vmlab-run.XXXXXX):
#                DIR/results is the guest's /results (its result files;
#                emptied first), DIR/console.log the serial console of
#                every boot.
#   --mem SIZE   guest RAM (default 2G)     --smp N    vCPUs (default 2)
#   --timeout S  limit for the whole run, all boots (default 900)
#   --max-boots N  boots allowed (the first + reboots by vmlab_crash; default 3)
#   --keep-disks keep the disk files created from a SIZE (deleted otherwise)
#   --kernel SERIES  the guest kernel: 6.12 (default; $VMLAB_KERNEL too),
#                6.18 (ublk zero copy) or 6.17 (zero copy with reads copied),
#                see build-image.sh
#   --mttcg      one host thread per vCPU (faster, but with qemu 7.2 a guest
#                kernel patching its own code can oops now and then: an int3
#                left behind by text_poke_bp); default: all vCPUs on one host
#                thread (VMLAB_TCG_THREAD=multi|single also chooses)
#   VMLAB_CPU=MODEL  qemu's -cpu (default max,-sse4.2: TCG emulates SSE4.2's
#                crc32 instruction a bit at a time, about 150 times slower
#                than native where other code runs 6-60 times slower, so
#                without it crc32c takes the software path the rest of the
#                guest's code is in proportion with; VMLAB_CPU=max for all)
#   VMLAB_EVENT_IDX=on|off  the virtio disks' event indexes (default off:
#                with them, a notification qemu's single-threaded TCG loses
#                hangs the disk for good; see the -device line below)
#   PANIC_GRACE=S  seconds a guest that printed a kernel panic has to reboot
#                before its qemu is stopped (default 15)
#
# Exit status: the script's, 77 when it skipped, 124 when the run timed out,
# 125 when the lab itself failed (no image, guest died without an exit marker).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
die() { echo "vmlab-run: error: $*" >&2; exit 125; }

disks=() bins=() envs=() out="" mem=2G smp=2 timeout_s=900 max_boots=3 keep_disks=0
tcg_thread="${VMLAB_TCG_THREAD:-single}"
while [ $# -gt 0 ]; do
  case "$1" in
    --disk) disks+=("$2"); shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --smp) smp="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --max-boots) max_boots="$2"; shift 2 ;;
    --keep-disks) keep_disks=1; shift ;;
    --mttcg) tcg_thread=multi; shift ;;
    --kernel) export VMLAB_KERNEL="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no guest script (see --help)"
script="$1"
shift
[ -f "$script" ] || die "no such script: $script"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run scripts/install-vmlab-deps.sh"

if [ ${#bins[@]} -eq 0 ]; then
  target="${CARGO_TARGET_DIR:-$repo/target}"
  case "$target" in /*) ;; *) target="$repo/$target" ;; esac
  tiercache="${VMLAB_TIERCACHE:-$target/release/tiercache}"
  if [ -x "$tiercache" ]; then
    bins+=("$tiercache")
  else
    echo "vmlab-run: warning: no tiercache binary at $tiercache (cargo build --release -p tiercache); the guest has none" >&2
  fi
fi

image="$("$here/build-image.sh")" || die "no guest image"

if [ -z "$out" ]; then
  out="$(mktemp -d /var/tmp/vmlab-run.XXXXXX)"
fi
rm -rf "$out/results"
mkdir -p "$out/results"
out="$(cd "$out" && pwd)"
: >"$out/console.log"

# The payload: a second cpio appended to the image's (the kernel unpacks both).
payload="$out/payload"
rm -rf "$payload"
mkdir -p "$payload/vmlab/bin"
cp "$here"/guest/* "$payload/vmlab/"
cp "$script" "$payload/vmlab/script"
chmod +x "$payload/vmlab/init"
for bin in "${bins[@]}"; do
  [ -f "$bin" ] || die "no such binary: $bin"
  cp "$bin" "$payload/vmlab/bin/"
  # Debug info only makes the initramfs bigger (symbols stay, for backtraces):
  # each MB costs the guest about 40 ms of unpacking at every boot.
  if command -v strip >/dev/null; then
    strip --strip-debug "$payload/vmlab/bin/$(basename "$bin")"
  fi
  # Libraries the image lacks (by name), except the C library's own.
  ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    name="$(basename "$lib")"
    grep -qxF "$name" "$image/libs.txt" || { mkdir -p "$payload/vmlab/lib" && cp -L "$lib" "$payload/vmlab/lib/"; }
  done
done
{
  for kv in "${envs[@]}"; do
    printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"
  done
  printf 'VMLAB_ARGS=('
  for a in "$@"; do printf '%q ' "$a"; done
  printf ')\n'
} >"$payload/vmlab/env"
(cd "$payload" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$out/payload.cpio"
# Copies, so that every boot of this run uses the same image even if the
# cache changes meanwhile.
initrd="$out/initrd.cpio"
kernel="$out/vmlinuz"
cp "$image/vmlinuz" "$kernel"
cat "$image/rootfs.cpio" "$out/payload.cpio" >"$initrd"
rm -rf "$payload" "$out/payload.cpio"

# Disks.
drive_args=() created=()
index=0
for spec in "${disks[@]}"; do
  name="${spec%%=*}"
  rest="${spec#*=}"
  if [ "$name" = "$spec" ] || [ -z "$name" ]; then
    die "--disk wants NAME=SIZE|PATH[,OPT...], got $spec"
  fi
  source="${rest%%,*}"
  opts=""
  [ "$source" != "$rest" ] && opts="${rest#*,}"
  if [[ "$source" =~ ^[0-9]+[KMGT]?$ ]]; then
    file="$out/disk-$name.img"
    rm -f "$file"
    truncate -s "$source" "$file"
    created+=("$file")
  else
    file="$source"
    [ -e "$file" ] || die "disk $name: no such file $file"
  fi
  drive="file=$file,format=raw,if=none,id=disk$index"
  has_cache=0
  IFS=, read -r -a kvs <<<"$opts"
  for kv in "${kvs[@]}"; do
    case "$kv" in
      "") ;;
      iops=*) drive+=",throttling.iops-total=${kv#*=}" ;;
      read-iops=*) drive+=",throttling.iops-read=${kv#*=}" ;;
      write-iops=*) drive+=",throttling.iops-write=${kv#*=}" ;;
      bps=*) drive+=",throttling.bps-total=${kv#*=}" ;;
      cache=*) has_cache=1; drive+=",$kv" ;;
      *) drive+=",$kv" ;;
    esac
  done
  [ "$has_cache" -eq 1 ] || drive+=",cache=none,aio=threads"
  # event_idx=off: on one host thread qemu 7.2 elides the guest's memory
  # barriers, and a virtqueue can lose a notification (vmlab/guest/init,
  # virtio_watch). With event indexes the loss is for good: qemu's stale
  # index makes the guest skip every later kick, so the disk hangs with
  # requests in flight (seen twice on 2026-12-02, the second time through
  # the watch's extra read). With the flags instead, the next request
  # kicks again and takes the stuck ones along.
  drive_args+=(-drive "$drive" -device "virtio-blk-pci,drive=disk$index,serial=$name,event_idx=${VMLAB_EVENT_IDX:-off}")
  index=$((index + 1))
done

started=$(date +%s)
boot=1
status=125
# watch_for_panic OFFSET: once the console (from byte OFFSET on) shows a
# kernel panic, gives the guest PANIC_GRACE seconds to reboot (panic=-1,
# which qemu's -no-reboot turns into an exit) and then stops this run's
# qemu itself: a guest that panicked in the middle of a benchmark has been
# seen to hang instead of rebooting (bcache's oops on Linux 6.18), and
# would otherwise hold the lab until --timeout.
watch_for_panic() {
  local from=$1
  while sleep 2; do
    if tail -c +"$((from + 1))" "$out/console.log" 2>/dev/null | grep -q 'Kernel panic - not syncing'; then
      sleep "${PANIC_GRACE:-15}"
      if pkill -f -- "path=$out/results," 2>/dev/null; then
        echo "vmlab-run: the guest panicked and did not reboot; stopped its qemu (see $out/console.log)" >&2
      fi
      return 0
    fi
  done
}

while :; do
  elapsed=$(($(date +%s) - started))
  remaining=$((timeout_s - elapsed))
  if [ "$remaining" -le 0 ]; then
    echo "vmlab-run: timed out after ${timeout_s}s" >&2
    status=124
    break
  fi
  echo "vmlab-run: boot $boot ($(basename "$script"), image $(basename "$image"), ${remaining}s left)" >&2
  boot_start=$(date +%s)
  watch_for_panic "$(wc -c <"$out/console.log")" &
  watcher=$!
  set +e
  timeout -k 10 "$remaining" qemu-system-x86_64 \
    -accel "tcg,thread=$tcg_thread" -cpu "${VMLAB_CPU:-max,-sse4.2}" -smp "$smp" -m "$mem" -nodefaults -no-reboot \
    -display none -monitor none -nic none \
    -chardev stdio,id=console,signal=on -serial chardev:console \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyS0 rdinit=/vmlab/init panic=-1 oops=panic quiet loglevel=4 mitigations=off cryptomgr.notests vmlab.boot=$boot" \
    -virtfs "local,path=$out/results,mount_tag=results,security_model=none,id=results" \
    "${drive_args[@]}" </dev/null 2>&1 | tee -a "$out/console.log"
  qemu_status=${PIPESTATUS[0]}
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
  set -e
  echo "vmlab-run: boot $boot ended after $(($(date +%s) - boot_start))s (qemu status $qemu_status)" >&2
  if [ "$qemu_status" -eq 124 ] || [ "$qemu_status" -eq 137 ]; then
    echo "vmlab-run: timed out after ${timeout_s}s" >&2
    status=124
    break
  fi
  marker="$(tr -d '\r' <"$out/console.log" | sed -n 's/^VMLAB-EXIT=\([0-9]\{1,3\}\)$/\1/p' | tail -n1)"
  if [ -n "$marker" ]; then
    status=$marker
    break
  fi
  if [ -f "$out/results/.vmlab-reboot" ]; then
    rm -f "$out/results/.vmlab-reboot"
    if [ "$boot" -ge "$max_boots" ]; then
      echo "vmlab-run: the guest asked for boot $((boot + 1)) but --max-boots is $max_boots" >&2
      status=125
      break
    fi
    boot=$((boot + 1))
    continue
  fi
  echo "vmlab-run: the guest stopped without an exit marker (kernel panic? see $out/console.log)" >&2
  status=125
  break
done

rm -f "$initrd" "$kernel"
[ "$keep_disks" -eq 1 ] || rm -f "${created[@]}"
echo "vmlab-run: $(basename "$script") exit status $status after $(($(date +%s) - started))s; results in $out/results" >&2
exit "$status"
