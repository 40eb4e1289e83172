# Guest script (a benchmark, not a test): a pool of volumes behind one
# small SSD, bcache against tiercache, side by side in one guest
# (`make anchors-pool`, vmlab/anchors.sh --pool).
#   bcache     one cache set on the SSD, every HDD a backing device
#              attached to it (/dev/bcacheN), its defaults (writeback off,
#              sequential_cutoff 4M), congestion thresholds off (TCG makes
#              every device look slow);
#   tiercache  one `tiercache serve --ublk` with every HDD a volume of one
#              pool on the same SSD (/dev/ublkbN each), its defaults
#              (4 KiB cache blocks for this SSD, the granularity at which
#              bcache caches these 4k reads);
#   tiercache-64k  the same with 64 KiB cache blocks (--block-size 64k,
#              the default before 2026-11-29; not run unless named in
#              BENCH_CONFIGS);
#   tiercache-q2  the defaults with two ublk queues per device (not run
#              unless named in BENCH_CONFIGS);
#   tiercache-zc  the defaults with --ublk-zero-copy (reads into the
#              requests' own pages; Linux >= 6.16, VMLAB_KERNEL=6.18; not
#              run unless named in BENCH_CONFIGS);
#   tiercache-pin, tiercache-zc-pin  the same, the server pinned to the
#              last CPU (taskset; fio runs anywhere; not run unless named);
#   NAME-before   any tiercache set-up above served by the binary
#              `tiercache-before` (a build before a change, copied into the
#              guest with ANCHORS_BIN=/path/to/tiercache-before on the
#              host), for an A/B of two builds in one boot.
# Disks: h1..hN (N >= 4; the HDDs, throttled by qemu iops=), ssd (cache).
# The load, on raw devices (O_DIRECT, libaio): every volume but the last a
# hot Zipf reader (4k random reads, iodepth 8; zipf:1.2, the second 1.1,
# any further 0.9: hot sets of different widths), the last a sequential
# scanner (1 MiB reads, iodepth 2) over its whole volume. Per round and
# set-up: a fresh cache, BENCH_WARMUP s of the load (warm-up), then
# BENCH_RUNTIME s measured. BENCH_ROUNDS rounds, the two set-ups
# interleaved (the order alternating by round). Reported per run and as
# medians over the rounds: the hot volumes' total IOPS and their p99
# completion latency (all hot jobs' IOs together), the scanner's MiB/s,
# the hot volumes' read hit ratio over the measured run (bcache: their
# backing devices' hits and misses; tiercache: their block hits and
# misses) and how busy the guest's CPUs were. Per run, in $OUT:
# diskstats-RUN.txt (each disk's reads, their mean size and latency,
# writes, flushes), guest-RUN.txt (the guest's memory before and after,
# and its paging, compaction and interrupt counters over the run: what
# else changes from round to round) and for tiercache threads-RUN.txt
# (its busiest threads' CPU, wait for a CPU and wake-ups per IO).
#
#   vmlab/run.sh --timeout 3600 --disk h1=1G,iops=300 --disk h2=1G,iops=300 \
#       --disk h3=1G,iops=300 --disk h4=1G,iops=300 --disk ssd=256M \
#       vmlab/guest/pool-bench.sh
#
# Environment (--env K=V): BENCH_RUNTIME (default 20), BENCH_WARMUP
# (default 20), BENCH_ROUNDS (default 3), BENCH_CONFIGS ("bcache
# tiercache"; also tiercache-4k, tiercache-64k, tiercache-q2; names
# separated by spaces or commas),
# BENCH_HOT_RATE=N (each hot volume's reads held to N IOPS, fio's
# rate_iops: an offered load both set-ups can serve, so that they are
# compared on latency and on the guest CPU the same work takes, rather
# than on how many requests a CPU-bound guest completes),
# BENCH_PERF=1 (a system-wide perf profile of each measured run:
# perf-<run>-comm.txt by thread name, -flat.txt by thread and symbol,
# -workers.txt tiercache's ublk workers by symbol; needs the host's perf,
# vmlab/run.sh --bin /usr/bin/perf).
# Caveat (as for anchors-bench.sh): under TCG every IO costs CPU time on
# one host thread; the numbers rank the set-ups, their absolute values say
# nothing about real hardware.
. /vmlab/lib.sh

RUNTIME=${BENCH_RUNTIME:-20}
WARMUP=${BENCH_WARMUP:-20}
ROUNDS=${BENCH_ROUNDS:-3}
CONFIGS=${BENCH_CONFIGS:-bcache tiercache}
CONFIGS=${CONFIGS//,/ } # (commas too: ANCHORS_ENV splits on spaces)
SSD=$(disk ssd)
HDDS=()
for i in $(seq 1 16); do
  [ -e "/dev/vmlab/h$i" ] && HDDS+=("$(disk "h$i")")
done
[ "${#HDDS[@]}" -ge 4 ] || fail "the pool bench wants at least 4 HDDs (--disk h1=... to h4=...)"
NVOL=${#HDDS[@]}
OUT="$VMLAB_RESULTS/pool-bench"
# perf writes its data on tmpfs, not on the results share: Linux 6.18's
# 9p (netfs) fails perf's writes there ("Couldn't get user pages").
PERF_DATA=/run/vmlab-perf.data
mkdir -p "$OUT" /run/tiercache
modprobe bcache
tiercache serve --help | grep -q -- '--ublk' || fail "this tiercache binary has no ublk front end"
modprobe ublk_drv

wipe() { for d in "$@"; do wipefs -qa "$d"; dd if=/dev/zero of="$d" bs=1M count=8 oflag=direct status=none; done; }

# --- bcache: one cache set, every HDD attached --------------------------------
bcache_setup() {
  wipe "$SSD" "${HDDS[@]}"
  make-bcache --wipe-bcache --bucket 64k -C "$SSD" >"$OUT/make-bcache.txt"
  echo "$SSD" >/sys/fs/bcache/register 2>/dev/null || true
  local cset i=0
  cset=$(bcache-super-show "$SSD" | awk '$1 == "cset.uuid" {print $2}')
  wait_for_path "/sys/fs/bcache/$cset" 30
  DEVS=()
  for h in "${HDDS[@]}"; do
    make-bcache --wipe-bcache -B "$h" >>"$OUT/make-bcache.txt"
    echo "$h" >/sys/fs/bcache/register 2>/dev/null || true
  done
  for h in "${HDDS[@]}"; do
    local name
    name=$(basename "$(readlink -f "$h")")
    wait_for_path "/sys/block/$name/bcache/dev" 30
    local b
    b=$(basename "$(readlink -f "/sys/block/$name/bcache/dev")")
    echo "$cset" >"/sys/block/$b/bcache/attach"
    wait_for_path "/sys/block/$b/bcache/cache" 30
    DEVS+=("/dev/$b")
  done
  echo 0 >"/sys/fs/bcache/$cset/congested_read_threshold_us"
  echo 0 >"/sys/fs/bcache/$cset/congested_write_threshold_us"
  BCACHE_SET=/sys/fs/bcache/$cset
}
# *_counters: "hits misses" of the hot volumes' reads (every volume but the
# last, the scanner's), so far. bcache counts its backing devices' requests
# (these are 4k reads), tiercache its volumes' blocks (4 KiB by default).
bcache_counters() {
  local h=0 m=0 d
  for d in "${DEVS[@]:0:$((NVOL - 1))}"; do
    h=$((h + $(cat "/sys/block/${d#/dev/}/bcache/stats_total/cache_hits")))
    m=$((m + $(cat "/sys/block/${d#/dev/}/bcache/stats_total/cache_misses")))
  done
  echo "$h $m"
}
bcache_teardown() {
  (cd "$BCACHE_SET/stats_total" && grep -H . ./*) >"$OUT/bcache-stats-$RUN.txt"
  local d
  for d in "${DEVS[@]}"; do echo 1 >"/sys/block/${d#/dev/}/bcache/stop"; done
  echo 1 >"$BCACHE_SET/stop"
  local i=0
  while [ -e "$BCACHE_SET" ] || ls /sys/block | grep -q '^bcache'; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || fail "bcache did not stop"
    sleep 0.1
  done
  wipe "$SSD" "${HDDS[@]}"
}

# --- tiercache: one pool over ublk ---------------------------------------------
TC_CONTROL=/run/tiercache/pool-bench.ctl
TC_BIN=tiercache # the server's binary (run_config: tiercache-before for NAME-before)
TC_PIN=()        # a command the server runs under (run_config: LAST_CPU for NAME-pin)
LAST_CPU=(taskset -c "$(($(nproc) - 1))")
# tiercache_setup [serve options...]
tiercache_setup() {
  wipe "$SSD" "${HDDS[@]}"
  local volumes=() i
  for i in "${!HDDS[@]}"; do volumes+=(--volume "v$((i + 1))=${HDDS[$i]}"); done
  "${TC_PIN[@]}" "$TC_BIN" serve --cache "$SSD" "${volumes[@]}" --create --control "$TC_CONTROL" --ublk "$@" \
    >>"$OUT/tiercache.log" 2>&1 &
  TC_PID=$!
  wait_for_path "$TC_CONTROL" 120
  DEVS=()
  for i in "${!HDDS[@]}"; do
    local dev
    dev=$(grep -o "serving volume v$((i + 1)) as /dev/ublkb[0-9]*" "$OUT/tiercache.log" | tail -n 1)
    dev=${dev##* }
    [ -n "$dev" ] || fail "tiercache announced no device for volume v$((i + 1))"
    wait_for_path "$dev" 30
    DEVS+=("$dev")
  done
}
tiercache_counters() {
  tiercache stats --control "$TC_CONTROL" --prometheus | awk -v scan="volume=\"v$NVOL\"" '
    /^tiercache_read_(hits|misses)_total[{]volume=/ && index($1, scan) == 0 {
      if ($1 ~ /hits/) h += $2; else m += $2 }
    END { print h + 0, m + 0 }'
}
# The server's CPU so far, in clock ticks (user + system, /proc/PID/stat).
tiercache_cpu() { awk '{print $14 + $15}' "/proc/$TC_PID/stat"; }
bcache_cpu() { echo -; }
tiercache_teardown() {
  tiercache stats --control "$TC_CONTROL" >"$OUT/tiercache-stats-$RUN.txt" || true
  kill -TERM "$TC_PID"
  wait "$TC_PID" || true
  rm -f "$TC_CONTROL"
  local d
  for d in "${DEVS[@]}"; do
    while [ -e "/dev/ublkc${d#/dev/ublkb}" ]; do sleep 0.1; done
  done
  wipe "$SSD" "${HDDS[@]}"
}

# job_file SECONDS: the load on $DEVS, hot readers in one reporting group,
# the scanner in another.
job_file() {
  local i theta
  printf '[global]\nioengine=libaio\ndirect=1\ntime_based\nruntime=%s\ngroup_reporting\n' "$1"
  for i in $(seq 0 $((NVOL - 2))); do
    case "$i" in 0) theta=1.2 ;; 1) theta=1.1 ;; *) theta=0.9 ;; esac
    printf '[hot%d]\nfilename=%s\nrw=randread\nbs=4k\niodepth=8\nrandom_distribution=zipf:%s\n' \
      "$((i + 1))" "${DEVS[$i]}" "$theta"
    # An open loop: each hot volume asks for BENCH_HOT_RATE IOPS at most.
    [ -z "${BENCH_HOT_RATE:-}" ] || printf 'rate_iops=%s\n' "$BENCH_HOT_RATE"
  done
  printf '[scan]\nnew_group\nfilename=%s\nrw=read\nbs=1M\niodepth=2\n' "${DEVS[$((NVOL - 1))]}"
}

# cpu_ticks: "busy idle" clock ticks of all CPUs so far (/proc/stat;
# iowait counts as idle).
cpu_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat; }

# guest_state: "name value" lines: memory (/proc/meminfo, KiB), the
# paging, compaction and THP counters of /proc/vmstat, context switches
# and interrupts (/proc/stat).
guest_state() {
  awk '/^(MemFree|Cached|AnonPages|AnonHugePages|Slab|SUnreclaim|Dirty|PageTables|Percpu):/ {print $1, $2}' /proc/meminfo
  awk '$1 ~ /^(pgfault|pgmajfault|pgalloc_normal|pgalloc_dma32|pgfree|pgscan_kswapd|pgscan_direct|pgsteal_kswapd|compact_stall|compact_migrate_scanned|thp_fault_alloc|thp_collapse_alloc|nr_tlb_remote_flush|workingset_refault_file)$/ {print $1, $2}' /proc/vmstat
  awk '$1 == "ctxt" || $1 == "intr" {print $1, $2}' /proc/stat
}

# guest_report BEFORE AFTER: each counter before, after, and the change.
guest_report() {
  join <(sort <<<"$1") <(sort <<<"$2") |
    awk '{printf "%-28s %14d %14d %+14d\n", $1, $2, $3, $3 - $2}'
}

# run_config NAME ROUND: one row.
run_config() {
  local name=$1 round=$2 kind=$1 options=() base=${1%-before}
  TC_BIN=tiercache TC_PIN=()
  if [ "$base" != "$name" ]; then
    command -v tiercache-before >/dev/null || fail "$name needs tiercache-before in the guest (ANCHORS_BIN)"
    TC_BIN=tiercache-before kind=$base
  fi
  case "$base" in
    bcache | tiercache) ;;
    tiercache-4k) kind=tiercache options=(--block-size 4k) ;;
    tiercache-64k) kind=tiercache options=(--block-size 64k) ;;
    tiercache-q2) kind=tiercache options=(--ublk-queues 2) ;;
    tiercache-zc) kind=tiercache options=(--ublk-zero-copy) ;;
    tiercache-pin) kind=tiercache TC_PIN=("${LAST_CPU[@]}") ;;
    tiercache-zc-pin) kind=tiercache options=(--ublk-zero-copy) TC_PIN=("${LAST_CPU[@]}") ;;
    *) fail "unknown set-up $name" ;;
  esac
  RUN=$name-$round
  step "round $round, $name: set-up"
  "${kind}_setup" "${options[@]}"
  step "round $round, $name: ${WARMUP}s warm-up, then ${RUNTIME}s measured (devices: ${DEVS[*]})"
  job_file "$WARMUP" >"$OUT/warmup.fio"
  fio "$OUT/warmup.fio" --eta=never --output="$OUT/fio-$RUN-warmup.txt" || fail "fio warm-up $RUN"
  local before after cpu_before cpu_after
  before=$("${kind}_counters")
  cpu_before=$(cpu_ticks)
  local server_before server_after
  server_before=$("${kind}_cpu")
  job_file "$RUNTIME" >"$OUT/measure.fio"
  local threads_before="" disks disks_before
  [ "$kind" = tiercache ] && threads_before=$(thread_schedstats "$TC_PID")
  disks=$(for d in "${HDDS[@]}" "$SSD"; do blockdev_name "$d"; done)
  # shellcheck disable=SC2086 # (one device name per word)
  disks_before=$(diskstats $disks)
  local guest_before
  guest_before=$(guest_state)
  local perf_pid=""
  if [ "${BENCH_PERF:-0}" = 1 ] && command -v perf >/dev/null; then
    perf record -q -a -g -e cpu-clock -F 999 -o "$PERF_DATA" -- sleep $((RUNTIME - 3)) \
      >/dev/null 2>&1 &
    perf_pid=$!
  fi
  fio "$OUT/measure.fio" --eta=never --output-format=terse --terse-version=3 \
    --percentile_list=50:99 --output="$OUT/fio-$RUN.out" || fail "fio $RUN"
  cpu_after=$(cpu_ticks)
  server_after=$("${kind}_cpu")
  guest_report "$guest_before" "$(guest_state)" >"$OUT/guest-$RUN.txt"
  if [ -n "$perf_pid" ]; then
    wait "$perf_pid" || true
    perf report -i "$PERF_DATA" --no-children --sort comm --stdio -g none 2>/dev/null |
      grep '%' | head -n 40 >"$OUT/perf-$RUN-comm.txt" || true
    perf report -i "$PERF_DATA" --no-children --sort comm,dso,sym --stdio -g none 2>/dev/null |
      grep '%' | head -n 300 >"$OUT/perf-$RUN-flat.txt" || true
    perf report -i "$PERF_DATA" --no-children --sort sym --stdio -g none \
      --comms "$(seq -s, -f 'ublk-io-%g' 0 127)" 2>/dev/null |
      grep '%' | head -n 120 >"$OUT/perf-$RUN-workers.txt" || true
    rm -f "$PERF_DATA"
  fi
  # shellcheck disable=SC2086
  diskstats_report "$disks_before" "$(diskstats $disks)" "$RUNTIME" >"$OUT/diskstats-$RUN.txt"
  cat "$OUT/diskstats-$RUN.txt"
  if [ -n "$threads_before" ]; then
    # The server's busiest threads per fio IO (hot and scan): CPU, wait
    # for a CPU while runnable, times scheduled in.
    schedstats_report "$threads_before" "$(thread_schedstats "$TC_PID")" \
      "$(awk -F';' '$1 == "3" {n += $8} END {print n * '"$RUNTIME"'}' "$OUT/fio-$RUN.out")" \
      >"$OUT/threads-$RUN.txt"
    cat "$OUT/threads-$RUN.txt"
  fi
  sleep 2 # bcache folds its counters into stats_total about once a second
  after=$("${kind}_counters")
  "${kind}_teardown"
  # terse v3, one line per group: field 8 read IOPS, field 7 read KiB/s;
  # read clat percentiles as "P%=usec" from field 18.
  local row
  row=$(awk -F';' -v name="$name" -v round="$round" -v before="$before" -v after="$after" \
    -v cpu_before="$cpu_before" -v cpu_after="$cpu_after" \
    -v server_before="$server_before" -v server_after="$server_after" -v runtime="$RUNTIME" \
    -v hz="$(getconf CLK_TCK)" '
    $1 == "3" && $3 == "hot1" {
      iops = $8; p99 = "-"
      for (i = 18; i <= 37; i++) { split($i, kv, "="); if (kv[1] == "99.000000%") { p99 = kv[2]; break } }
    }
    $1 == "3" && $3 == "scan" { scan = $7 / 1024; scan_iops = $8 }
    END {
      split(before, b, " "); split(after, a, " ")
      hits = a[1] - b[1]; misses = a[2] - b[2]
      ratio = (hits + misses > 0) ? sprintf("%.1f", 100 * hits / (hits + misses)) : "-"
      split(cpu_before, c0, " "); split(cpu_after, c1, " ")
      busy = c1[1] - c0[1]; total = busy + c1[2] - c0[2]
      cpu = (total > 0) ? sprintf("%.0f", 100 * busy / total) : "-"
      # The server CPU per fio IO (hot and scan), in us.
      ios = (iops + scan_iops) * runtime
      per_io = (server_before != "-" && ios > 0) ? sprintf("%.0f", (server_after - server_before) * 1e6 / hz / ios) : "-"
      printf "%s %s %d %s %.1f %s %s %s\n", name, round, iops, p99, scan, ratio, cpu, per_io
    }' "$OUT/fio-$RUN.out")
  echo "$row" >>"$OUT/rows.txt"
  step "round $round, $name: hot IOPS, hot p99 us, scan MiB/s, hit %, CPU busy %, server CPU us per IO: ${row#* * }"
}

rm -f "$OUT/rows.txt"
step "pool bench: $NVOL HDDs of $(($(blockdev --getsize64 "${HDDS[0]}") >> 20)) MiB, cache $(($(blockdev --getsize64 "$SSD") >> 20)) MiB; $ROUNDS rounds of ${WARMUP}s + ${RUNTIME}s; $CONFIGS"
for round in $(seq 1 "$ROUNDS"); do
  order=$CONFIGS
  [ $((round % 2)) = 0 ] && order=$(echo "$CONFIGS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for config in $order; do
    run_config "$config" "$round"
  done
done

# col COLUMN NAME: the median of a column of rows.txt for NAME.
col() { awk -v n="$2" -v c="$1" '$1 == n { print $c }' "$OUT/rows.txt" | median; }
{
  echo "Pool bench in the VM lab (qemu TCG; $(nproc) vCPUs; $(cpu_features); kernel $(uname -r)): $((NVOL - 1)) hot Zipf volumes + 1 sequential scanner, $NVOL HDDs of $(($(blockdev --getsize64 "${HDDS[0]}") >> 20)) MiB, one cache of $(($(blockdev --getsize64 "$SSD") >> 20)) MiB; medians of $ROUNDS interleaved rounds (${WARMUP}s warm-up, ${RUNTIME}s measured)"
  echo
  echo "| set-up | hot volumes' total IOPS | hot volumes' p99 | scanner MiB/s | hot volumes' read hit ratio | guest CPU busy | server CPU per IO | rounds (IOPS / p99 ms) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---|"
  for config in $CONFIGS; do
    per_round=$(awk -v n="$config" '$1 == n { printf "%s%d / %.2f", sep, $3, $4 / 1000; sep = ", " }' "$OUT/rows.txt")
    per_io=$(col 8 "$config")
    [ "$per_io" = - ] || per_io="$per_io us"
    printf '| %s | %s | %.2f ms | %s | %s%% | %s%% | %s | %s |\n' "$config" "$(col 3 "$config")" \
      "$(awk -v us="$(col 4 "$config")" 'BEGIN { print us / 1000 }')" "$(col 5 "$config")" \
      "$(col 6 "$config")" "$(col 7 "$config")" "$per_io" "$per_round"
  done
} >"$VMLAB_RESULTS/pool-bench.md"
cat "$VMLAB_RESULTS/pool-bench.md"
