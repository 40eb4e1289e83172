# The restart test, shared by the front ends whose device outlives its
# server (ublk-restart.sh: ublk user recovery; nbd-restart.sh: the kernel NBD
# client configured by the server, --nbd-device). See docs/RESTART.md.
# Disks: hdd (backing), ssd (cache). One boot:
#   - tiercache serve with the front end's options, ext4 on the device, a
#     file tree;
#   - load kept running on the file system: fio with crc32c verify (one job
#     after another; O_SYNC, so that each write is flushed before fio counts
#     it done: in writeback mode a kill -9 may lose writes the guest never
#     flushed, as a power cut of a disk with a volatile write cache would,
#     see docs/RESTART.md), a writer of files that are fsynced before their sum
#     is recorded (acknowledged and flushed), and a probe that reads the raw
#     device and timestamps every completion (the guest's IO pauses);
#   - RESTART_ROUNDS (default 10) times, after a random 1.5-5.5 s: kill -9
#     of tiercache and a new `tiercache serve` at once, which takes the
#     device over; then one planned upgrade: SIGUSR1 (hand-over, exit 75)
#     and a second copy of the binary taking over (its open must find a
#     clean shutdown);
#   - a second server for the same device is refused while one lives;
#   - afterwards: no fio error, no IO error in the kernel log, e2fsck -fn
#     clean, every file of the tree and every acknowledged file identical;
#     a plain SIGTERM still removes the device.
# Prints per round the restart time (start of the new server -> first
# guest IO completed again) and the longest pause the probe saw (from the
# last completion before the kill to the first after the restart, or any
# longer gap before the next round); also in $OUT/rounds.txt. The rounds
# start no process but the servers (figures and log checks come after the
# last one): with the load running, every process the guest starts takes
# about a second under TCG, which made a round twice as long.
#
# Sourced after lib.sh by a script that sets FRONTEND and SERVE_FRONT (the
# serve options of the front end, an array), defines these hooks and then
# calls run_restart_test:
#   find_device          set DEV to the device the first server serves
#   refuse_intruder      check that a second server for $DEV is refused
#   assert_device_kept   after a hand-over: $DEV is still there
#   assert_device_gone   after SIGTERM: $DEV was removed
ROUNDS=${RESTART_ROUNDS:-10}
. /vmlab/cache-tests.sh

LOG="$OUT/tiercache-boot$VMLAB_BOOT.log"
LOAD=/run/restart-load
mkdir -p "$LOAD"

# start_server BINARY [serve options...]: like start_tiercache, with a given
# binary and the front end's options; returns once the control socket is up
# (the device is then served: serve binds it after the device is live).
start_server() {
  local bin=$1
  shift
  echo "=== $bin serve ${SERVE_FRONT[*]} $* ($(date +%T))" >>"$LOG"
  "$bin" serve --backing "$HDD" --cache "$SSD" "${TC_OPTIONS[@]}" --control "$TC_CONTROL" \
    "${SERVE_FRONT[@]}" "$@" >>"$LOG" 2>&1 &
  TC_PID=$!
  wait_for_server "$TC_PID" "$TC_CONTROL" "$LOG"
}

# wait_dead PID SECONDS WHAT: return once the child PID has exited (the
# caller reaps it); fail, with its threads' kernel stacks and the end of
# the server's log, if it still runs after SECONDS (a bare
# `wait` would hang the guest until the host's timeout, which says nothing).
wait_dead() {
  local pid=$1 limit=$2 what=$3 i=0 state
  while :; do
    state=Z
    { read -r _ _ state _ <"/proc/$pid/stat"; } 2>/dev/null || state=Z
    [ "$state" = Z ] && break
    i=$((i + 1))
    if [ "$i" -gt $((limit * 10)) ]; then
      threads_snapshot "$pid"
      tail -n 20 "$LOG"
      fail "$what (pid $pid) still runs ${limit} s later"
    fi
    nap 0.1
  done
}

# The probe's completions: seconds since the epoch with microseconds, one
# per line in $LOAD/probe; the last also in $LOAD/probe-last as an integer
# of microseconds (for wait_live, which compares it without a process).
probe_loop() {
  local blocks=$(($(blockdev --getsz "$DEV") / 8)) t
  while [ ! -e "$LOAD/stop" ]; do
    dd if="$DEV" of=/dev/null bs=4k count=1 skip=$(((RANDOM * 32768 + RANDOM) % blocks)) \
      iflag=direct status=none || echo "probe read failed at $EPOCHREALTIME" >>"$LOAD/errors"
    t=$EPOCHREALTIME
    echo "$t" >>"$LOAD/probe"
    echo "${t/./}" >"$LOAD/probe-last"
  done
}

fio_loop() {
  local n=0
  while [ ! -e "$LOAD/stop" ]; do
    n=$((n + 1))
    if ! fio --name="verify-$n" --filename=/mnt/r/fio.dat --size=16M --rw=randwrite --bs=16k \
      --iodepth=8 --ioengine=libaio --direct=1 --sync=1 --verify=crc32c --verify_fatal=1 --eta=never \
      --output="$LOAD/fio-$n.txt" || ! grep -q "err= 0" "$LOAD/fio-$n.txt"; then
      echo "fio run $n failed (see fio-$n.txt)" >>"$LOAD/errors"
      cp "$LOAD/fio-$n.txt" "$OUT/" 2>/dev/null || true
    fi
  done
  echo "$n" >"$LOAD/fio-runs"
}

# Each file is fsynced (and its directory) before its sum is recorded: a
# file listed in acked.sha256 was acknowledged and flushed.
acked_loop() {
  mkdir -p /mnt/r/acked
  local i=0
  while [ ! -e "$LOAD/stop" ]; do
    i=$((i + 1))
    head -c 65536 /dev/urandom >"$LOAD/acked.tmp"
    if cp "$LOAD/acked.tmp" "/mnt/r/acked/$i" && sync "/mnt/r/acked/$i" /mnt/r/acked; then
      echo "$(sha256sum <"$LOAD/acked.tmp" | cut -d' ' -f1)  acked/$i" >>"$LOAD/acked.sha256"
    else
      echo "acked file $i: write or fsync failed" >>"$LOAD/errors"
    fi
  done
}

# wait_live T_START: until the probe has completed a read after T_START
# (the device serves IO again).
wait_live() {
  local ts=${1/./} last i=0
  while :; do
    last=0
    read -r last <"$LOAD/probe-last" || true
    [ "${last:-0}" -gt "$ts" ] && return 0
    i=$((i + 1))
    [ "$i" -lt 1200 ] || fail "the guest saw no IO completed 120 s after the restart"
    nap 0.1
  done
}

# The rounds, in order: a name, the kill (or SIGUSR1) and the new server's
# start, as $EPOCHREALTIME; and the shutdown its open must find.
ROUND_NAMES=()
ROUND_KILLS=()
ROUND_STARTS=()
ROUND_EXPECT=()
record_round() {
  ROUND_NAMES+=("$1")
  ROUND_KILLS+=("$2")
  ROUND_STARTS+=("$3")
  ROUND_EXPECT+=("$4")
  step "$1: served again"
}

# check_rounds: each new server's open found the expected shutdown.
check_rounds() {
  local opened i
  mapfile -t opened < <(grep -o "opened cache .* after an* [a-z]* shutdown" "$LOG" | grep -o "[a-z]* shutdown$")
  [ "${#opened[@]}" -eq "${#ROUND_NAMES[@]}" ] ||
    fail "${#ROUND_NAMES[@]} restarts but ${#opened[@]} \"opened cache\" lines in $LOG"
  for i in "${!ROUND_NAMES[@]}"; do
    [ "${opened[$i]}" = "${ROUND_EXPECT[$i]} shutdown" ] ||
      fail "${ROUND_NAMES[$i]}: the new server found ${opened[$i]}, expected ${ROUND_EXPECT[$i]} shutdown"
  done
}

# report_rounds: one line per round (restart time, longest pause, the
# server's takeover time) from the probe's completions and the log.
ROUND_LINES=()
report_rounds() {
  local figures takeovers i line
  # The probe's completions between a round's kill and the next round's.
  mapfile -t figures < <(awk -v kills="${ROUND_KILLS[*]}" -v starts="${ROUND_STARTS[*]}" '
    BEGIN { n = split(kills, tk, " "); split(starts, ts, " "); r = 0 }
    { t = $1 + 0
      while (r < n && t > tk[r + 1]) { r++; live[r] = 0; max[r] = 0; prev[r] = last }
      if (r > 0) {
        if (!live[r] && t > ts[r]) live[r] = t
        if (prev[r]) { gap = t - prev[r]; if (gap > max[r]) max[r] = gap }
        prev[r] = t
      }
      last = t }
    END { for (i = 1; i <= n; i++) printf "%.2f %.2f\n", live[i] ? live[i] - ts[i] : -1, max[i] }' "$LOAD/probe")
  mapfile -t takeovers < <(grep -o "took over /dev/[a-z0-9]* from the previous server in [0-9]* ms" "$LOG" | awk '{print $(NF-1)}')
  for i in "${!ROUND_NAMES[@]}"; do
    line=$(printf '%-28s restart (start -> guest IO again) %6.2f s; longest guest IO pause %6.2f s; %s takeover %s ms' \
      "${ROUND_NAMES[$i]}" "${figures[$i]% *}" "${figures[$i]#* }" "${DEV#/dev/}" "${takeovers[$i]:-?}")
    ROUND_LINES+=("$line")
    echo "$line" >>"$OUT/rounds.txt"
  done
}

run_restart_test() {
  step "tiercache serve ${SERVE_FRONT[*]}"
  start_server tiercache --create
  find_device
  step "$DEV; mkfs.ext4, a file tree"
  mkfs.ext4 -q -F "$DEV"
  mkdir -p /mnt/r
  mount "$DEV" /mnt/r
  mkdir /mnt/r/tree
  cp -a /etc /usr/share/zoneinfo /mnt/r/tree/
  head -c 4M /dev/urandom >/mnt/r/tree/random-4M
  (cd /mnt/r && find tree -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$OUT/tree.sha256"
  tree_listing /mnt/r >"$OUT/tree.list"
  sync
  step "$(wc -l <"$OUT/tree.sha256") files; starting the load (fio verify, fsynced files, IO probe)"
  : >"$LOAD/probe"
  echo 0 >"$LOAD/probe-last"
  : >"$LOAD/errors"
  : >"$LOAD/acked.sha256"
  probe_loop &
  local probe_pid=$!
  fio_loop &
  local fio_pid=$!
  acked_loop &
  local acked_pid=$!
  nap 3

  local round pause_ms t_kill t_start status
  for ((round = 1; round <= ROUNDS; round++)); do
    pause_ms=$((1500 + RANDOM % 4000))
    nap "$((pause_ms / 1000)).$((pause_ms % 1000 / 100))$((pause_ms % 100 / 10))$((pause_ms % 10))"
    t_kill=$EPOCHREALTIME
    kill -9 "$TC_PID"
    wait_dead "$TC_PID" 30 "tiercache after kill -9"
    wait "$TC_PID" 2>/dev/null || true
    t_start=$EPOCHREALTIME
    start_server tiercache
    wait_live "$t_start"
    record_round "round $round: kill -9 at +${pause_ms}ms" "$t_kill" "$t_start" unclean
  done

  step "a second server for ${DEV#/dev/} is refused while one serves it"
  refuse_intruder

  step "planned upgrade: SIGUSR1 (hand-over), then another copy of the binary takes over"
  cp "$(command -v tiercache)" /run/tiercache-next
  nap 2
  t_kill=$EPOCHREALTIME
  kill -USR1 "$TC_PID"
  wait_dead "$TC_PID" 60 "tiercache after SIGUSR1"
  status=0
  wait "$TC_PID" || status=$?
  [ "$status" -eq 75 ] || { tail -n 20 "$LOG"; fail "tiercache exited with status $status after SIGUSR1 (expected 75)"; }
  grep -q "tiercache: handed over $DEV" "$LOG" || fail "no hand-over message"
  assert_device_kept
  t_start=$EPOCHREALTIME
  start_server /run/tiercache-next
  wait_live "$t_start"
  record_round "upgrade (SIGUSR1, new binary)" "$t_kill" "$t_start" clean

  nap 3
  step "stopping the load"
  touch "$LOAD/stop"
  wait_dead "$probe_pid" 120 "the IO probe"
  wait_dead "$fio_pid" 120 "the fio loop"
  wait_dead "$acked_pid" 120 "the acknowledged-files writer"
  wait "$probe_pid" "$fio_pid" "$acked_pid" || true
  cp "$LOAD/acked.sha256" "$LOAD/errors" "$OUT/"
  step "fio runs: $(cat "$LOAD/fio-runs") (16 MiB, O_SYNC, crc32c-verified each), acknowledged files: $(wc -l <"$LOAD/acked.sha256"), probe reads: $(wc -l <"$LOAD/probe")"
  if [ -s "$LOAD/errors" ]; then
    cat "$LOAD/errors"
    fail "the load saw errors"
  fi
  check_rounds
  report_rounds
  step "a last fio verify, then umount, e2fsck -fn, compare every file"
  fio --name=verify-last --filename=/mnt/r/fio-last.dat --size=16M --rw=randwrite --bs=4k --iodepth=8 \
    --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 --eta=never --output="$OUT/fio-last.txt" ||
    fail "the last fio verify failed"
  grep -q "err= 0" "$OUT/fio-last.txt" || fail "the last fio verify reported errors"
  umount /mnt/r
  e2fsck -fn "$DEV" >"$OUT/fsck.txt" 2>&1 || { cat "$OUT/fsck.txt"; fail "e2fsck -fn after the restarts"; }
  mount "$DEV" /mnt/r
  (cd /mnt/r && sha256sum --quiet -c "$OUT/tree.sha256") || fail "the file tree differs"
  tree_listing /mnt/r | diff "$OUT/tree.list" - || fail "the tree's listing differs"
  (cd /mnt/r && sha256sum --quiet -c "$OUT/acked.sha256") || fail "an acknowledged, flushed file was lost or differs"
  umount /mnt/r
  dmesg >"$OUT/dmesg.txt"
  assert_no_io_errors
  if grep -E "I/O error|EXT4-fs error|Buffer I/O" "$OUT/dmesg.txt"; then
    fail "the kernel logged IO or file system errors"
  fi

  step "a plain stop (SIGTERM) still removes the device"
  kill -TERM "$TC_PID"
  wait_dead "$TC_PID" 60 "tiercache after SIGTERM"
  status=0
  wait "$TC_PID" || status=$?
  TC_PID=""
  [ "$status" -eq 0 ] || { tail -n 20 "$LOG"; fail "tiercache exited with status $status after SIGTERM"; }
  grep -q "tiercache: stopped" "$LOG" || fail "no clean stop"
  assert_device_gone

  step "restart rounds:"
  printf '  %s\n' "${ROUND_LINES[@]}"
  step "PASS: $DEV survived $ROUNDS kills (kill -9) and an upgrade: no IO error, fio verify clean, e2fsck clean, files identical"
}
