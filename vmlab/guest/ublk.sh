# Guest test: tiercache served as /dev/ublkb0 (`tiercache serve --ublk`,
# the kernel's ublk_drv). Disks: hdd (backing), ssd (cache). Two boots (the
# second after a crash). The shared tests (cache-tests.sh: ext4 + restart,
# fio verify, crash recovery) run first; boot 2 then adds the ublk-specific
# ones: several queues under several fio jobs (crc32c verify, writeback),
# write-zeroes and discard through the device, the device's limits, and
# SIGTERM while the device is open. UBLK_ONLY=1: one boot, the
# ublk-specific tests alone.
# Skips (exit 77) when the binary has no ublk front end (built without the
# cargo feature `ublk`, on by default).
# Run it alone with:
#   vmlab/run.sh --disk hdd=1G,iops=300 --disk ssd=256M vmlab/guest/ublk.sh
. /vmlab/lib.sh
FRONTEND=ublk
UBLK_ID=0
UBLK_QUEUES=${UBLK_QUEUES:-2}
UBLK_DEPTH=${UBLK_DEPTH:-64}
# UBLK_ZERO_COPY=1: serve with --ublk-zero-copy, which on a kernel that
# registers requests' pages (Linux >= 6.16, VMLAB_KERNEL=6.18) must be used
# (on 6.17 with every read copied into its request).
UBLK_ZC_ARGS=()
[ "${UBLK_ZERO_COPY:-0}" = 1 ] && UBLK_ZC_ARGS=(--ublk-zero-copy)
# UBLK_ONLY=1: one boot with only the ublk-specific tests (on a fresh
# cache), no shared cache tests and no crash: for a kernel run whose point
# is how the device serves (the 6.17 zero-copy run), not the cache's
# recovery, which the other runs test.
UBLK_ONLY=${UBLK_ONLY:-0}

tiercache serve --help | grep -q -- '--ublk' ||
  skip "this tiercache binary has no ublk front end (serve --ublk; build it with the ublk feature)"
modprobe ublk_drv
[ -e /dev/ublk-control ] || fail "no /dev/ublk-control after modprobe ublk_drv"

attach_device() {
  # The previous instance's device is deleted asynchronously.
  local i=0
  while [ -e /dev/ublkc$UBLK_ID ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "/dev/ublkc$UBLK_ID still exists 10 s after tiercache stopped"
    sleep 0.1
  done
  start_tiercache --ublk --ublk-id "$UBLK_ID" --ublk-queues "$UBLK_QUEUES" --ublk-depth "$UBLK_DEPTH" "${UBLK_ZC_ARGS[@]}" "$@"
  DEV=/dev/ublkb$UBLK_ID
  wait_for_path "$DEV" 30
  grep -q "serving $DEV" "$OUT/tiercache-boot$VMLAB_BOOT.log" || fail "tiercache did not announce $DEV"
  local q=/sys/block/ublkb$UBLK_ID/queue
  step "$DEV: $(($(cat /sys/block/ublkb$UBLK_ID/size) * 512 >> 20)) MiB, write cache: $(cat $q/write_cache), fua: $(cat $q/fua 2>/dev/null), logical block $(cat $q/logical_block_size), max IO $(cat $q/max_hw_sectors_kb) KiB, discard max $(cat $q/discard_max_bytes), write-zeroes max $(cat $q/write_zeroes_max_bytes), hw queues $(ls /sys/block/ublkb$UBLK_ID/mq | wc -l)"
}

# Stopping tiercache (SIGTERM or detach) deletes the ublk device.
remove_device() { :; }

ublk_specific_tests() {
  attach_device
  local q=/sys/block/ublkb$UBLK_ID/queue
  [ "$(cat $q/write_cache)" = "write back" ] || fail "the device does not announce a volatile write cache (no FLUSH would be sent)"
  [ "$(cat $q/fua)" = 1 ] || fail "the device does not announce FUA"
  [ "$(cat $q/discard_max_bytes)" -gt 0 ] || fail "the device does not announce discard"
  [ "$(cat $q/write_zeroes_max_bytes)" -gt 0 ] || fail "the device does not announce write-zeroes"
  [ "$(ls /sys/block/ublkb$UBLK_ID/mq | wc -l)" = "$UBLK_QUEUES" ] || fail "expected $UBLK_QUEUES hardware queues"

  # Several submitters, one per CPU, spread over the hardware queues; each
  # verifies its own region (crc32c) after writing it.
  run_fio multiqueue-verify --rw=randrw --rwmixread=30 --bs=4k --iodepth=16 --numjobs=4 \
    --offset=$((600 << 20)) --size=12M --offset_increment=16M --verify=crc32c --verify_fatal=1 \
    --randrepeat=1 --cpus_allowed_policy=split
  run_fio multiqueue-mixed-sizes --rw=randwrite --bsrange=512-256k --iodepth=32 --numjobs=2 \
    --offset=$((800 << 20)) --size=32M --offset_increment=32M --verify=crc32c --verify_fatal=1 \
    --randrepeat=1 --fsync=16

  step "write-zeroes (blkdiscard -z) and discard through $DEV"
  local off=$((900 << 20)) len=$((8 << 20))
  head -c $len /dev/urandom | dd of="$DEV" bs=1M seek=$((off >> 20)) oflag=direct conv=fsync status=none
  blkdiscard -f -z -o $off -l $len "$DEV"
  cmp -n $len <(dd if="$DEV" bs=1M skip=$((off >> 20)) count=$((len >> 20)) iflag=direct status=none) /dev/zero ||
    fail "the range does not read as zeroes after write-zeroes"
  blkdiscard -f -o $off -l $len "$DEV" || fail "discard failed"
  tc_stats

  step "SIGTERM while $DEV is open by a reader"
  dd if="$DEV" of=/dev/null bs=64k iflag=direct status=none &
  local reader=$!
  sleep 1
  stop_tiercache
  local status=0
  wait "$reader" 2>/dev/null || status=$?
  step "the reader ended with status $status (EOF or EIO once the device is gone)"
  wait_gone() {
    local i=0
    while [ -e "$1" ]; do
      i=$((i + 1))
      [ "$i" -lt 100 ] || fail "$1 still exists 10 s after tiercache stopped"
      sleep 0.1
    done
  }
  wait_gone "$DEV"
  wait_gone /dev/ublkc$UBLK_ID
  grep -q "tiercache: stopped" "$OUT/tiercache-boot$VMLAB_BOOT.log" || fail "no clean stop"
  # Every hardware queue carried requests (tiercache counts them per queue
  # and logs the counts when the device stops).
  local qid served
  for qid in $(seq 0 $((UBLK_QUEUES - 1))); do
    served=$(grep -o "ublk$UBLK_ID queue $qid: [0-9]* requests served" "$OUT/tiercache-boot$VMLAB_BOOT.log" | tail -n 1 | awk '{print $4}')
    step "queue $qid served ${served:-no} requests"
    [ "${served:-0}" -gt 0 ] || fail "hardware queue $qid carried no request"
  done
  if [ "${UBLK_ZERO_COPY:-0}" = 1 ]; then
    grep -q "registered buffers: the requests' own pages (zero copy)" "$OUT/tiercache-boot$VMLAB_BOOT.log" ||
      fail "--ublk-zero-copy on this kernel did not serve with zero copy"
    # Linux 6.17 can misplace a read into a registered request: there
    # every read must be copied into its request (the mixed sizes above
    # are what caught it).
    case "$(uname -r)" in
      6.17.*)
        grep -q "every read is copied into its request instead" "$OUT/tiercache-boot$VMLAB_BOOT.log" ||
          fail "on Linux $(uname -r) reads were not copied into their requests"
        step "served with zero copy, every read copied into its request (Linux $(uname -r))" ;;
      *)
        ! grep -q "every read is copied into its request instead" "$OUT/tiercache-boot$VMLAB_BOOT.log" ||
          fail "on Linux $(uname -r) reads were copied into their requests"
        step "served with zero copy" ;;
    esac
  fi

  # The worst case for a stop: a mounted file system. tiercache must still
  # exit cleanly (the device is deleted when the mount goes away), and the
  # next start must find a clean shutdown.
  attach_device
  mkfs.ext4 -q -F "$DEV"
  mkdir -p /mnt/fs
  mount "$DEV" /mnt/fs
  head -c 4M /dev/urandom >/mnt/fs/file
  sync
  step "SIGTERM with ext4 mounted on $DEV"
  timeout 60 bash -c "kill -TERM $TC_PID; while kill -0 $TC_PID 2>/dev/null; do sleep 0.2; done" ||
    fail "tiercache did not exit within 60 s of SIGTERM with a mounted file system"
  wait "$TC_PID" || fail "tiercache exited with an error with a mounted file system"
  TC_PID=""
  rm -f "$TC_CONTROL"
  umount -l /mnt/fs || true
  wait_gone /dev/ublkc$UBLK_ID
  attach_device
  grep "opened cache" "$OUT/tiercache-boot$VMLAB_BOOT.log" | tail -n 1 | grep -q "after a clean shutdown" ||
    fail "the start after a stop with a mounted file system did not find a clean shutdown"
  stop_tiercache
}

. /vmlab/cache-tests.sh
if [ "$UBLK_ONLY" = 1 ]; then
  [ "$VMLAB_BOOT" = 1 ] || fail "UBLK_ONLY=1 runs one boot, not boot $VMLAB_BOOT"
  attach_device --create
  stop_tiercache
  ublk_specific_tests
  step "PASS: tiercache over $FRONTEND (the ublk-specific tests only)"
  exit 0
fi
case "$VMLAB_BOOT" in
  1) run_cache_tests ;; # ends with a crash
  2)
    verify_after_crash
    ublk_specific_tests
    step "PASS: tiercache over $FRONTEND"
    ;;
  *) fail "unexpected boot $VMLAB_BOOT" ;;
esac
