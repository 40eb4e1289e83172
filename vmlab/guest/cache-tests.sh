# The guest-side tests of tiercache as a kernel block device, shared by every
# front end (nbd.sh: kernel NBD client; ublk.sh: ublk). Sourced after
# lib.sh by a script that defines two hooks:
#
#   attach_device [serve options...]
#       start `tiercache serve` (use start_tiercache) with the given extra
#       options and make the block device appear; set DEV to its path.
#   remove_device
#       make the block device go away before tiercache stops (nbd-client -d);
#       a no-op if stopping tiercache removes it.
#
# and then calls run_cache_tests. Disks: `hdd` (backing, throttled by qemu)
# and `ssd` (cache), see vmlab/test.sh. The tests:
#   boot 1  mkfs.ext4, a file tree, fsck clean; tiercache restart; files
#           identical and fsck clean again. fio verify (crc32c) in writeback
#           mode, a flush, then a second read-only verify. Region A written
#           and flushed (fsync) in writeback, then a crash (sysrq b) in the
#           middle of more writes.
#   boot 2  tiercache recovers; region A and the earlier verify regions read
#           back intact through the device; after `tiercache detach` the same
#           regions verify directly on the backing disk (all written back).

TC_DIR=/run/tiercache
TC_CONTROL=$TC_DIR/tc.ctl
TC_PID=""
FRONTEND=${FRONTEND:-unknown}
OUT="$VMLAB_RESULTS/$FRONTEND"
mkdir -p "$OUT" "$TC_DIR"
HDD=$(disk hdd)
SSD=$(disk ssd)

# Regions of the device (byte offsets) used by the fio phases; the ext4 test
# comes first and its file system is overwritten by them.
VERIFY_RAND_OFFSET=$((128 << 20)) VERIFY_RAND_SIZE=$((16 << 20))
VERIFY_SEQ_OFFSET=$((192 << 20)) VERIFY_SEQ_SIZE=$((32 << 20))
CRASH_A_OFFSET=$((256 << 20)) CRASH_A_SIZE=$((32 << 20))
CRASH_B_OFFSET=$((384 << 20)) CRASH_B_SIZE=$((128 << 20))

# start_tiercache [serve options...]: tiercache serve in writeback over hdd
# and ssd, in the background ($TC_PID), log in $OUT/tiercache-bootN.log.
# Every write is admitted and the cleaner lets dirty data reach 90% of the
# cache, so that data flows through the cache and is dirty at the crash.
TC_OPTIONS=(--mode writeback --admission always --writeback-target 0.9)
start_tiercache() {
  local log="$OUT/tiercache-boot$VMLAB_BOOT.log"
  step "tiercache serve --backing $HDD --cache $SSD ${TC_OPTIONS[*]} $*"
  echo "=== tiercache serve $* ($(date +%T))" >>"$log"
  tiercache serve --backing "$HDD" --cache "$SSD" "${TC_OPTIONS[@]}" --control "$TC_CONTROL" "$@" >>"$log" 2>&1 &
  TC_PID=$!
  wait_for_path "$TC_CONTROL" 60
  grep -E "opened cache|formatting|serving" "$log" | tail -n 3 || true
}

# stop_tiercache: SIGTERM, wait; fails unless tiercache exits 0.
stop_tiercache() {
  step "stopping tiercache (SIGTERM)"
  kill -TERM "$TC_PID"
  local status=0
  wait "$TC_PID" || status=$?
  TC_PID=""
  [ "$status" -eq 0 ] || { tail -n 20 "$OUT/tiercache-boot$VMLAB_BOOT.log"; fail "tiercache exited with status $status"; }
  rm -f "$TC_CONTROL"
}

# detach_device: remove the device, stop tiercache cleanly.
detach_device() {
  remove_device
  stop_tiercache
}

# detach_with_writeback: remove the device, `tiercache detach` (writes every
# dirty block back, then the server exits), wait for a clean exit.
detach_with_writeback() {
  remove_device
  tiercache detach --control "$TC_CONTROL" 2>&1 | tr '\r' '\n' | tail -n 1
  local status=0
  wait "$TC_PID" || status=$?
  TC_PID=""
  [ "$status" -eq 0 ] || fail "tiercache exited with status $status after detach"
}

tc_stats() { tiercache stats --control "$TC_CONTROL" | tee -a "$OUT/stats-boot$VMLAB_BOOT.txt"; }

# run_fio NAME fio-options...: runs fio on $DEV (or --filename=... given),
# output in $OUT/fio-NAME.txt; prints its summary, fails on any error.
run_fio() {
  local name=$1
  shift
  step "fio $name"
  if ! fio --name="$name" --filename="$DEV" --direct=1 --ioengine=libaio --group_reporting --eta=never \
    --output="$OUT/fio-$name.txt" "$@"; then
    cat "$OUT/fio-$name.txt"
    fail "fio $name"
  fi
  grep -E "^ +(read|write):|err=" "$OUT/fio-$name.txt" | sed 's/^ */  /'
  grep -q "err= 0" "$OUT/fio-$name.txt" || { cat "$OUT/fio-$name.txt"; fail "fio $name reported errors"; }
}

# The fio jobs whose data is checked again after the crash; same options in
# both boots (fio verifies with --verify_only).
fio_verify_rand() { run_fio "$1" --rw=randwrite --bs=4k --iodepth=8 --offset="$VERIFY_RAND_OFFSET" \
  --size="$VERIFY_RAND_SIZE" --verify=crc32c --verify_fatal=1 --randrepeat=1 "${@:2}"; }
fio_verify_seq() { run_fio "$1" --rw=write --bs=128k --iodepth=4 --offset="$VERIFY_SEQ_OFFSET" \
  --size="$VERIFY_SEQ_SIZE" --verify=crc32c --verify_fatal=1 "${@:2}"; }
# Region A: whole cache blocks (64 KiB), which writeback mode allocates dirty.
fio_crash_a() { run_fio "$1" --rw=randwrite --bs=64k --iodepth=8 --offset="$CRASH_A_OFFSET" \
  --size="$CRASH_A_SIZE" --verify=crc32c --verify_fatal=1 --randrepeat=1 "${@:2}"; }

# assert_no_io_errors: the kernel logged no IO error for $DEV so far (a
# failed request the kernel or mkfs silently worked around is still a bug).
assert_no_io_errors() {
  local name
  name=$(basename "$DEV")
  if dmesg | grep -E "I/O error,? (on )?dev $name\b|$name: .*(error|timed out)"; then
    fail "the kernel logged IO errors for $DEV"
  fi
}

tree_listing() { (cd "$1" && find tree -printf '%y %m %s %p %l\n' | LC_ALL=C sort); }

test_ext4_restart() {
  attach_device --create
  step "mkfs.ext4 on $DEV"
  mkfs.ext4 -q -F "$DEV"
  mkdir -p /mnt/fs
  mount "$DEV" /mnt/fs
  step "writing a file tree"
  mkdir /mnt/fs/tree
  cp -a /etc /usr/share/perl5 /usr/share/zoneinfo /usr/lib/x86_64-linux-gnu/perl-base /mnt/fs/tree/
  head -c 8M /dev/urandom >/mnt/fs/tree/random-8M # longer than the sequential cutoff
  for i in 1 2 3 4; do head -c $((i * 1000 + 4096 * i * i)) /dev/urandom >"/mnt/fs/tree/random-$i"; done
  (cd /mnt/fs && find tree -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$OUT/tree.sha256"
  tree_listing /mnt/fs >"$OUT/tree.list"
  step "$(wc -l <"$OUT/tree.sha256") files, $(du -sm /mnt/fs/tree | cut -f1) MiB; sync, umount, fsck"
  sync
  umount /mnt/fs
  e2fsck -fn "$DEV" >"$OUT/fsck-1.txt" 2>&1 || { cat "$OUT/fsck-1.txt"; fail "fsck after writing the tree"; }
  tc_stats
  detach_device

  step "tiercache check (offline) after a clean stop"
  tiercache check --cache "$SSD" | tee "$OUT/check-clean.txt"

  attach_device
  grep -q "after a clean shutdown" "$OUT/tiercache-boot$VMLAB_BOOT.log" || fail "restart did not see a clean shutdown"
  e2fsck -fn "$DEV" >"$OUT/fsck-2.txt" 2>&1 || { cat "$OUT/fsck-2.txt"; fail "fsck after the restart"; }
  mount "$DEV" /mnt/fs
  step "comparing the file tree after the restart"
  (cd /mnt/fs && sha256sum -c --quiet "$OUT/tree.sha256") || fail "file contents differ after the restart"
  tree_listing /mnt/fs | diff "$OUT/tree.list" - || fail "file tree differs after the restart"
  umount /mnt/fs
  assert_no_io_errors
  step "ext4 over $FRONTEND: file tree identical after a tiercache restart, fsck clean"
}

test_fio_verify() {
  fio_verify_rand verify-rand
  fio_verify_seq verify-seq
  tc_stats
  step "tiercache flush"
  tiercache flush --control "$TC_CONTROL" 2>&1 | tr '\r' '\n' | tail -n 1
  fio_verify_rand verify-rand-reread --verify_only
  fio_verify_seq verify-seq-reread --verify_only
  assert_no_io_errors
}

# Region B gets random writes (and flushes) all along, so the cache is never
# idle (an idle cache is cleaned at full speed) while region A is written and
# flushed; then the guest crashes with B's writes in flight (half of them
# whole blocks, cached dirty; half partial, written to the backing disk).
crash_during_writes() {
  step "random writes to region B in the background"
  fio --name=crash-b --filename="$DEV" --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite \
    --bssplit=4k/50:64k/50 --blockalign=64k --offset="$CRASH_B_OFFSET" --size="$CRASH_B_SIZE" --time_based --runtime=300 \
    --fsync=64 --eta=never --output="$OUT/fio-crash-b.txt" &
  sleep 2
  fio_crash_a crash-a-write --do_verify=0 --end_fsync=1
  echo "region A written and flushed at $(date +%T)" >"$OUT/crash-state"
  tc_stats | grep occupancy
  sleep 2
  vmlab_crash
}

verify_after_crash() {
  [ -f "$OUT/crash-state" ] || fail "boot $VMLAB_BOOT without the first boot's crash state"
  step "tiercache check (offline) after the crash"
  tiercache check --cache "$SSD" >"$OUT/check-crash.txt" 2>&1 || true
  cat "$OUT/check-crash.txt"
  attach_device
  local opened
  opened=$(grep -E "opened cache" "$OUT/tiercache-boot$VMLAB_BOOT.log" | tail -n 1)
  [[ "$opened" == *unclean* ]] || fail "restart after the crash did not report an unclean shutdown"
  # The test means something only if dirty data had to be recovered.
  if ! [[ "$opened" =~ \(([0-9]+)\ dirty\) ]] || [ "${BASH_REMATCH[1]}" -eq 0 ]; then
    fail "no dirty blocks recovered after the crash: $opened"
  fi
  tc_stats
  fio_crash_a crash-a-verify --verify_only
  fio_verify_rand verify-rand-after-crash --verify_only
  fio_verify_seq verify-seq-after-crash --verify_only
  step "reading all of region B (no IO errors)"
  dd if="$DEV" of=/dev/null bs=1M iflag=direct skip=$((CRASH_B_OFFSET >> 20)) count=$((CRASH_B_SIZE >> 20)) status=none
  assert_no_io_errors
  step "tiercache detach (write everything back)"
  detach_with_writeback
  DEV=$HDD
  fio_crash_a crash-a-on-backing --verify_only
  fio_verify_rand verify-rand-on-backing --verify_only
  fio_verify_seq verify-seq-on-backing --verify_only
  step "after a crash: every flushed write read back through $FRONTEND and from the backing disk after detach"
}

run_cache_tests() {
  case "$VMLAB_BOOT" in
    1)
      test_ext4_restart
      test_fio_verify
      crash_during_writes
      ;;
    2)
      verify_after_crash
      step "PASS: tiercache over $FRONTEND"
      ;;
    *) fail "unexpected boot $VMLAB_BOOT" ;;
  esac
}
