# Guest bench: the same tiercache engine through the kernel NBD client and
# through ublk, same fio jobs, IOPS side by side. Not a test (always exits
# 0 unless something breaks); results in /results/ublk-bench/.
# Disk: ssd (backing, not throttled). The cache is in RAM (mem:), so every
# read after the warm-up is a hit and the front end's cost shows.
# Run:
#   vmlab/run.sh --disk ssd=512M vmlab/guest/ublk-bench.sh
# Environment: BENCH_RUNTIME (seconds per job, default 15), BENCH_ROUNDS
# (NBD then ublk, repeated; default 1), UBLK_QUEUES (default 2),
# NBD_CONNECTIONS (default 1, as anchors-bench.sh).
. /vmlab/lib.sh
OUT="$VMLAB_RESULTS/ublk-bench"
mkdir -p "$OUT" /run/tiercache
SSD=$(disk ssd)
RUNTIME=${BENCH_RUNTIME:-15}
UBLK_QUEUES=${UBLK_QUEUES:-2}
NBD_CONNECTIONS=${NBD_CONNECTIONS:-1}
ROUNDS=${BENCH_ROUNDS:-1}
SIZE=$((256 << 20))
TC_PID=""

serve() {
  tiercache serve --backing "$SSD" --cache mem:320M --mode writeback --admission always \
    --control /run/tiercache/tc.ctl "$@" >>"$OUT/tiercache.log" 2>&1 &
  TC_PID=$!
  wait_for_path /run/tiercache/tc.ctl 60
}

stop() {
  kill -TERM "$TC_PID"
  wait "$TC_PID" || fail "tiercache exited with an error"
  rm -f /run/tiercache/tc.ctl
}

# jobs FRONTEND DEV: warm-up, then the measured jobs; one line per job in
# $OUT/summary.txt.
jobs() {
  local fe=$1 dev=$2 name
  fio --name=warmup --filename="$dev" --direct=1 --ioengine=libaio --rw=write --bs=1M \
    --iodepth=4 --size=$SIZE --eta=never --output="$OUT/$fe-warmup.txt" || fail "warm-up on $fe"
  for job in "randread 4k 1 1" "randread 4k 32 2" "randwrite 4k 32 2" "read 128k 8 1"; do
    set -- $job
    name="$1-$2-qd$3x$4"
    step "$fe: fio $name (${RUNTIME}s)"
    fio --name="$name" --filename="$dev" --direct=1 --ioengine=libaio --rw="$1" --bs="$2" \
      --iodepth="$3" --numjobs="$4" --size=$SIZE --time_based --runtime="$RUNTIME" \
      --group_reporting --eta=never --output="$OUT/$fe-$name.txt" || fail "fio $name on $fe"
    printf '%-5s %-20s %s  clat avg %s\n' "$fe" "$name" \
      "$(grep -oE '(read|write): IOPS=[^,]*' "$OUT/$fe-$name.txt" | head -n 1)" \
      "$(grep -E '^ +clat \(' "$OUT/$fe-$name.txt" | head -n 1 | sed -E 's/.*clat \(([a-z]+)\).*avg= *([0-9.]+).*/\2 \1/')" \
      >>"$OUT/summary.txt"
    tail -n 1 "$OUT/summary.txt"
  done
}

have_ublk=0
tiercache serve --help | grep -q -- '--ublk' && modprobe ublk_drv && have_ublk=1
modprobe nbd nbds_max=2
for round in $(seq 1 "$ROUNDS"); do
  step "round $round: NBD (kernel nbd-client, $NBD_CONNECTIONS connections)"
  serve --socket /run/tiercache/tc.sock
  nbd-client -unix /run/tiercache/tc.sock /dev/nbd0 -N default -b 4096 -C "$NBD_CONNECTIONS" -t 120 >/dev/null ||
    fail "nbd-client"
  wait_for_path /sys/block/nbd0/pid 30
  jobs nbd /dev/nbd0
  nbd-client -d /dev/nbd0 >/dev/null
  stop
  if [ "$have_ublk" = 1 ]; then
    step "round $round: ublk ($UBLK_QUEUES queues)"
    while [ -e /dev/ublkc0 ]; do sleep 0.1; done
    serve --ublk --ublk-id 0 --ublk-queues "$UBLK_QUEUES"
    wait_for_path /dev/ublkb0 30
    jobs ublk /dev/ublkb0
    stop
  else
    step "no ublk here; NBD only"
  fi
done

step "summary (guest under TCG: compare the two front ends, not absolute numbers)"
cat "$OUT/summary.txt"
