# Guest test: 64 volumes over ublk from one server (issue 15's "test 64"):
# one /dev/ublkbN each, every device reads back its own volume's data, and
# the server stays small: a few threads, no memory pinned by idle devices,
# bounded resident memory and open files per volume. The volumes and the
# cache are sparse files in /run (tmpfs); no disks.
# Run it alone with:
#   vmlab/run.sh vmlab/guest/ublk-many.sh
. /vmlab/lib.sh
OUT="$VMLAB_RESULTS/ublk-many"
mkdir -p "$OUT" /run/tiercache /run/many
CONTROL=/run/tiercache/many.ctl
LOG="$OUT/tiercache.log"
N=64

tiercache serve --help | grep -q -- '--ublk' ||
  skip "this tiercache binary has no ublk front end (serve --ublk; build it with the ublk feature)"
modprobe ublk_drv
[ -e /dev/ublk-control ] || fail "no /dev/ublk-control after modprobe ublk_drv"

step "$N volumes of 16 MiB, each with its own 4 KiB at a block of the first 16, one 64 MiB cache"
args=()
for i in $(seq 1 $N); do
  truncate -s 16M "/run/many/v$i.img"
  # The volume's number in every byte of block i % 16.
  head -c 4096 /dev/zero | tr '\0' "\\$(printf '%03o' "$i")" >"/run/many/block-$i"
  dd if="/run/many/block-$i" of="/run/many/v$i.img" bs=4096 seek=$((i % 16)) conv=notrunc status=none
  args+=(--volume "vm$i=/run/many/v$i.img")
done
truncate -s 64M /run/many/cache.img
# The usual soft limit of 1024 open files, whatever the guest's init set.
ulimit -Sn 1024
t0=$(date +%s%N)
tiercache serve --cache /run/many/cache.img --create "${args[@]}" --control "$CONTROL" \
  --ublk >"$LOG" 2>&1 &
TC_PID=$!
wait_for_server "$TC_PID" "$CONTROL" "$LOG"
i=0
while [ "$(grep -c "^tiercache: serving volume" "$LOG")" -lt $N ]; do
  i=$((i + 1))
  [ "$i" -lt 600 ] || { tail -n 20 "$LOG"; fail "$(grep -c "^tiercache: serving volume" "$LOG") of $N volumes announced after 60 s"; }
  nap 0.1
done
start_ms=$((($(date +%s%N) - t0) / 1000000))

pin=$(proc_status "$TC_PID" VmPin) rss=$(proc_status "$TC_PID" VmRSS) threads=$(proc_status "$TC_PID" Threads)
fds=$(ls "/proc/$TC_PID/fd" | wc -l)
step "$N devices up in $start_ms ms: $threads threads, $pin KiB pinned, $rss KiB resident, $fds open files"
[ "$threads" -le 8 ] || fail "$threads threads for $N volumes"
[ "$pin" -le $((N * 256)) ] || fail "$pin KiB pinned by $N idle devices (at most 256 KiB each)"
[ "$rss" -le $((64 * 1024 + N * 1024)) ] || fail "$rss KiB resident (at most 64 MiB and 1 MiB per volume)"
[ "$fds" -le $((64 + N * 4)) ] || fail "$fds open files for $N volumes"

step "every device reads back its own volume's data"
for i in $(seq 1 $N); do
  dev=$(grep -o "serving volume vm$i as /dev/ublkb[0-9]*" "$LOG" | tail -n 1)
  dev=${dev##* }
  [ -b "$dev" ] || fail "volume vm$i: no device ($dev)"
  dd if="$dev" bs=4096 count=1 skip=$((i % 16)) iflag=direct status=none | cmp -s - "/run/many/block-$i" ||
    fail "volume vm$i ($dev) does not read back its own block"
done
pin2=$(proc_status "$TC_PID" VmPin)
step "after a read on each device: $pin2 KiB pinned"

kill -TERM "$TC_PID"
status=0
wait "$TC_PID" || status=$?
[ "$status" -eq 0 ] || { tail -n 20 "$LOG"; fail "tiercache exited with status $status after SIGTERM"; }
i=0
while ls /dev/ublkc* >/dev/null 2>&1; do
  i=$((i + 1))
  [ "$i" -lt 100 ] || fail "devices left 10 s after SIGTERM: $(ls /dev/ublkc*)"
  nap 0.1
done
step "PASS: $N volumes over ublk from one server in $start_ms ms, $threads threads, $pin KiB pinned, $rss KiB resident, $fds open files; each device its own data"
