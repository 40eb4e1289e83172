# Guest script: the field study's anchors side by side in one guest, scaled
# down for TCG: the study's fio job (randread, zipf:1.2, 4k, iodepth 8,
# 2 jobs, files on ext4) on
#   ssd-alone          ext4 on the fast disk
#   hdd-alone          ext4 on the throttled disk
#   bcache-cutoff4M    bcache writeback, sequential_cutoff 4M (its default)
#   bcache-cutoff0     bcache writeback, sequential_cutoff 0
#   bcache-cutoff0-junk  the same, its cache first filled with other data
#   lvmcache-empty     lvmcache (dm-cache) writeback, smq, empty cache
#   lvmcache-junk      the same, its cache first filled with other data
#   tiercache-empty    tiercache writeback over the kernel NBD client
#   tiercache-junk     the same, its cache first filled with other data
#   tiercache-ublk-empty  tiercache writeback as /dev/ublkb0 (ublk_drv)
#   tiercache-ublk-junk   the same, its cache first filled with other data
#   tiercache-ublk-cutoff0-empty, tiercache-ublk-cutoff0-junk,
#   tiercache-cutoff0-empty (NBD)
#   tiercache-ublk-zc-cutoff0-empty, tiercache-ublk-zc-cutoff0-junk: the
#                      same with --ublk-zero-copy (Linux >= 6.16,
#                      VMLAB_KERNEL=6.18)
#                      the same with serve --sequential-cutoff 0, as
#                      bcache-cutoff0: the files' layout (sequential writes)
#                      is then cached too (not in the default list)
# each with a hot set that fits the cache and one that does not (data 4x the
# cache). Prints and writes $VMLAB_RESULTS/anchors.md: IOPS, p50/p99
# completion latency, hit ratio (the cache's own counters, over the
# measured run only). Each run's fio JSON (json+, with the latency
# histogram) and per-job IOPS logs stay in $VMLAB_RESULTS/anchors/ for the
# plots (`tiercache plot-fio`, see vmlab/anchors.sh).
#
#   vmlab/run.sh --timeout 1800 --disk hdd=3G,iops=300 --disk ssd=256M \
#       --disk fast=3G vmlab/guest/anchors-bench.sh
#
# Environment (--env K=V): BENCH_RUNTIME (s per run, default 15),
# BENCH_JUNK_RUNTIME (s of junk reads, default 20), BENCH_CONFIGS (a
# space-separated subset of the names above), BENCH_SIZES ("fits nofit"),
# BENCH_NBD_CONNECTIONS (nbd-client -C, default 1: nbd-client's own
# default and what serve --nbd-device gives the kernel; with 2 the server
# spent 40% more CPU per IO for 15% fewer IOPS, docs/BENCHMARKS.md; by
# round as BENCH_TC_ENV: 1/2),
# BENCH_NBD_ATTACH (who configures the kernel NBD client: nbd-client, the
# default, or serve: `tiercache serve --nbd-device /dev/nbd0`, which also
# sets the device's IO scheduler to none; unix socket, one connection; by
# round as BENCH_TC_ENV: nbd-client/serve),
# BENCH_NBD_TRANSPORT (how the kernel NBD client reaches the server: unix,
# the default, or tcp: plain NBD on 127.0.0.1; by round as BENCH_TC_ENV:
# unix/tcp),
# BENCH_UBLK_QUEUES (serve --ublk-queues; default: the server's),
# BENCH_ROUNDS (default 1: every configuration and size once; with N > 1
# each runs N times, the rounds interleaved, every other round in reverse
# order, and the table gives medians with each round's IOPS / p99; files
# of round R are named NAME-rR-SIZE),
# BENCH_SCHED (an IO scheduler for the device fio runs on, e.g. none;
# default: the kernel's choice, recorded in diskstats-<run>.txt; several
# separated by '/' take turns by round: mq-deadline/none),
# BENCH_RQ_AFFINITY (the device's queue/rq_affinity: where completions
# run, 1 the kernel's default; by round as BENCH_TC_ENV: 1/0),
# BENCH_TC_NICE (a nice value for every thread of the tiercache server
# once its device is up, by round as BENCH_TC_ENV: 0/-20),
# BENCH_TC_ENV (environment for the tiercache server, KEY=V[,KEY=V];
# several separated by '/' take turns by round, '-' for none: for an A/B
# of a server setting in one boot),
# any tiercache configuration NAME-before (served by tiercache-before,
# copied in with ANCHORS_BIN=/path/to/tiercache-before: an A/B of two
# builds side by side in one boot),
# BENCH_TC_BIN (the server's binary by round as BENCH_TC_ENV, e.g.
# tiercache/tiercache-before: a build before a change, copied in with
# ANCHORS_BIN=/path/to/tiercache-before on the host, for an A/B of two
# builds in one boot),
# BENCH_TC_ARGS (more arguments for tiercache serve, separated by ',';
# by round as BENCH_TC_ENV: -/--writeback-target,1), BENCH_TC_CREATE_ARGS
# (the same for tiercache create: -/--block-size,4k),
# BENCH_MOVES=1 (tiercache's dirty blocks and writebacks twice a second
# into moves-<run>.txt; the sampling costs the guest CPU),
# BENCH_PERF=1 (a system-wide perf profile of each measured run into
# perf-<run>.txt; needs perf in the guest: run.sh --bin /usr/bin/perf),
# BENCH_RECORD=SECONDS (tiercache's requests from its start, for SECONDS,
# into trace-<run>.tct for `tiercache sim`: junk, layout and the measured
# run; the run waits for the recording to end before its teardown),
# BENCH_TRACE_HDD=1 (every request queued to the HDD during each measured
# run, by thread and kind, with the kernel stacks of the writes and
# flushes, into hddtrace-<run>.txt; needs perf in the guest as above).
# Caveat: under TCG every IO costs CPU time on one host thread, so the
# numbers rank the set-ups (hits against misses, warm-up, bypass) but their
# absolute values say nothing about real hardware; a userspace cache pays
# for its context switches more than in-kernel ones do.
. /vmlab/lib.sh

RUNTIME=${BENCH_RUNTIME:-15}
ROUNDS=${BENCH_ROUNDS:-1}
JUNK_RUNTIME=${BENCH_JUNK_RUNTIME:-20}
CONFIGS=${BENCH_CONFIGS:-ssd-alone hdd-alone bcache-cutoff4M bcache-cutoff0 lvmcache-empty lvmcache-junk tiercache-empty tiercache-junk tiercache-ublk-empty tiercache-ublk-junk}
SIZES=${BENCH_SIZES:-fits nofit}
CONFIGS=${CONFIGS//,/ } # (commas too: ANCHORS_ENV splits on spaces)
SIZES=${SIZES//,/ }
NBD_CONNECTIONS=${BENCH_NBD_CONNECTIONS:-1}
HDD=$(disk hdd)
SSD=$(disk ssd)
FAST=$(disk fast)
CACHE_BYTES=$(blockdev --getsize64 "$SSD")
OUT="$VMLAB_RESULTS/anchors"
# perf writes its data on tmpfs, not on the results share: Linux 6.18's
# 9p (netfs) fails perf's writes there ("Couldn't get user pages").
PERF_DATA=/run/vmlab-perf.data
HDDTRACE_DATA=/run/vmlab-hddtrace.data
mkdir -p "$OUT" /mnt/bench
modprobe -a nbd bcache dm-cache dm-cache-smq
HAVE_UBLK=0
tiercache serve --help | grep -q -- '--ublk' && modprobe ublk_drv && HAVE_UBLK=1

# Per job: half the cache (both jobs' data fit) or twice the cache (4x).
job_size() {
  case "$1" in
    fits) echo $((CACHE_BYTES / 2 / 1048576))M ;;
    nofit) echo $((CACHE_BYTES * 2 / 1048576))M ;;
  esac
}

wipe() { for d in "$@"; do wipefs -qa "$d"; dd if=/dev/zero of="$d" bs=1M count=8 oflag=direct status=none; done; }

make_fs() {
  mkfs.ext4 -q -F -E nodiscard "$1"
  mount -o noinit_itable "$1" /mnt/bench
}

# --- bcache -----------------------------------------------------------------
bcache_setup() {
  local cutoff=$1
  wipe "$HDD" "$SSD"
  # 64k buckets: bcache wants at least 1024 of them on the cache device.
  make-bcache --wipe-bcache --bucket 64k -C "$SSD" -B "$HDD" --writeback >"$OUT/make-bcache.txt"
  echo "$SSD" >/sys/fs/bcache/register 2>/dev/null || true
  echo "$HDD" >/sys/fs/bcache/register 2>/dev/null || true
  wait_for_path /dev/bcache0 30
  wait_for_path /sys/block/bcache0/bcache/cache 30
  echo writeback >/sys/block/bcache0/bcache/cache_mode
  echo "$cutoff" >/sys/block/bcache0/bcache/sequential_cutoff
  # TCG makes every device look slow: without this bcache would call its
  # cache congested and bypass it.
  local set
  set=$(readlink -f /sys/block/bcache0/bcache/cache)
  echo 0 >"$set/congested_read_threshold_us"
  echo 0 >"$set/congested_write_threshold_us"
  DEV=/dev/bcache0
}
bcache_counters() { echo "$(cat /sys/block/bcache0/bcache/stats_total/cache_hits) $(cat /sys/block/bcache0/bcache/stats_total/cache_misses)"; }
bcache_teardown() {
  (cd /sys/block/bcache0/bcache/stats_total && grep -H . ./*) >"$OUT/bcache-stats-$RUN.txt"
  local set
  set=$(readlink -f /sys/block/bcache0/bcache/cache)
  echo 1 >/sys/block/bcache0/bcache/stop
  echo 1 >"$set/stop"
  local i=0
  while [ -e /sys/block/bcache0 ] || [ -e "$set" ]; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || fail "bcache did not stop"
    sleep 0.1
  done
  wipe "$HDD" "$SSD"
}

# --- lvmcache ---------------------------------------------------------------
LVM_CONFIG='devices { obtain_device_list_from_udev = 0 } activation { udev_sync = 0 udev_rules = 0 }'
lvm_() { lvm "$1" --config "$LVM_CONFIG" "${@:2}"; }
lvmcache_setup() {
  wipe "$HDD" "$SSD"
  lvm_ pvcreate -qq -ff -y "$HDD" "$SSD"
  lvm_ vgcreate -qq anchors "$HDD" "$SSD"
  lvm_ lvcreate -qq -y -Wy -Zy -n origin -l 100%PVS anchors "$HDD"
  lvm_ lvcreate -qq -y --type cache-pool -n cpool -l 100%PVS anchors "$SSD"
  lvm_ lvconvert -qq -y --type cache --cachepool anchors/cpool --cachemode writeback \
    --cachepolicy smq anchors/origin
  DEV=/dev/mapper/anchors-origin
  dmsetup table anchors-origin >"$OUT/lvmcache-table.txt"
}
# dm-cache status: ... <read hits> <read misses> <write hits> <write misses> ...
lvmcache_counters() { dmsetup status anchors-origin | awk '{print $8, $9}'; }
lvmcache_teardown() {
  # Dropped, not flushed: the dirty blocks are of no interest and the
  # disks are wiped next.
  dmsetup remove_all --force >/dev/null 2>&1 || true
  rm -rf /dev/anchors
  wipe "$HDD" "$SSD"
}

# --- tiercache (over the kernel NBD client or as a ublk device) -------------
TC_SOCKET=/run/tiercache/bench.sock
TC_CONTROL=/run/tiercache/bench.ctl
# tiercache_setup nbd|ublk|ublk-zc [CUTOFF]: CUTOFF, the sequential cutoff (default:
# the server's, 4 MiB).
tiercache_setup() {
  local frontend=$1 cutoff=${2:-}
  wipe "$HDD" "$SSD"
  mkdir -p /run/tiercache
  local bin
  bin=${TC_BIN_OF_RUN:-$(per_round "${BENCH_TC_BIN:-tiercache}")}
  "$bin" create --force --backing "$HDD" --cache "$SSD" --mode writeback \
    $(per_round "${BENCH_TC_CREATE_ARGS:-}" | tr ',' ' ' | sed 's/^-$//') >"$OUT/tiercache-create.txt"
  local serve=(env $(per_round "${BENCH_TC_ENV:-}" | tr ',' ' ' | sed 's/^-$//') "$bin" serve --backing "$HDD" --cache "$SSD" --mode writeback --control "$TC_CONTROL"
    ${cutoff:+--sequential-cutoff "$cutoff"} $(per_round "${BENCH_TC_ARGS:-}" | tr ',' ' ' | sed 's/^-$//'))
  if [ "$frontend" = ublk ] || [ "$frontend" = ublk-zc ]; then
    local zc=()
    [ "$frontend" = ublk-zc ] && zc=(--ublk-zero-copy)
    while [ -e /dev/ublkc0 ]; do sleep 0.1; done
    "${serve[@]}" --ublk --ublk-id 0 ${BENCH_UBLK_QUEUES:+--ublk-queues "$BENCH_UBLK_QUEUES"} "${zc[@]}" >>"$OUT/tiercache.log" 2>&1 &
    TC_PID=$!
    DEV=/dev/ublkb0
    wait_for_path "$DEV" 60
    return
  fi
  local transport server
  transport=$(per_round "${BENCH_NBD_TRANSPORT:-unix}")
  if [ "$(per_round "${BENCH_NBD_ATTACH:-nbd-client}")" = serve ]; then
    "${serve[@]}" --socket "$TC_SOCKET" --nbd-device /dev/nbd0 >>"$OUT/tiercache.log" 2>&1 &
    TC_PID=$!
    DEV=/dev/nbd0
    local i=0
    while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
      i=$((i + 1))
      [ "$i" -lt 600 ] || fail "serve --nbd-device did not configure nbd0"
      sleep 0.1
    done
    return
  fi
  if [ "$transport" = tcp ]; then
    # The guest has no iproute2: bring the loopback interface up with
    # SIOCSIFFLAGS (IFF_UP | IFF_LOOPBACK | IFF_RUNNING); the kernel gives
    # it 127.0.0.1 itself.
    perl -e 'use Socket; socket(my $s, PF_INET, SOCK_DGRAM, 0) or die "socket: $!";
      my $ifr = pack("a16 s x22", "lo", 0x49); ioctl($s, 0x8914, $ifr) or die "lo up: $!"' || fail "loopback up"
    "${serve[@]}" --listen 127.0.0.1:10809 --insecure >>"$OUT/tiercache.log" 2>&1 &
    TC_PID=$!
    server=(127.0.0.1 10809)
    # The control socket is the server's readiness signal here.
    wait_for_path "$TC_CONTROL" 60
  else
    "${serve[@]}" --socket "$TC_SOCKET" >>"$OUT/tiercache.log" 2>&1 &
    TC_PID=$!
    server=(-unix "$TC_SOCKET")
    wait_for_path "$TC_SOCKET" 60
  fi
  nbd-client "${server[@]}" /dev/nbd0 -N default -b 4096 -t 120 -C "$(per_round "$NBD_CONNECTIONS")" >/dev/null
  # The scheduler a fresh nbd0 has (a serve round before set none; the
  # device and its queue outlive a connection).
  echo mq-deadline >/sys/block/nbd0/queue/scheduler 2>/dev/null || true
  DEV=/dev/nbd0
  local i=0
  while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || fail "nbd0 did not connect"
    sleep 0.1
  done
}
tiercache_counters() { tiercache stats --control "$TC_CONTROL" | awk '$1 == "reads" {print $4, $7}'; }
tiercache_teardown() {
  tiercache stats --control "$TC_CONTROL" >"$OUT/tiercache-stats-$RUN.txt" || true
  # CPU clock ticks per thread since tiercache started (where its CPU goes).
  local t
  for t in /proc/"$TC_PID"/task/*; do
    echo "$(cat "$t/comm") $(proc_ticks "${t#/proc/}")"
  done | sort -k2 -n -r >"$OUT/tiercache-threads-$RUN.txt" || true
  # (A device the server configured itself goes with the server.)
  [ "$DEV" = /dev/nbd0 ] && [ "$(per_round "${BENCH_NBD_ATTACH:-nbd-client}")" != serve ] &&
    nbd-client -d /dev/nbd0 >/dev/null
  kill -TERM "$TC_PID"
  wait "$TC_PID" || true
  if [ "$DEV" = /dev/nbd0 ]; then
    local i=0
    while [ "$(cat /sys/block/nbd0/size)" != 0 ]; do
      i=$((i + 1))
      [ "$i" -lt 100 ] || fail "nbd0 still configured 10 s after the server stopped"
      sleep 0.1
    done
  fi
  rm -f "$TC_CONTROL"
  wipe "$HDD" "$SSD"
}

# cpu_ticks: "busy idle" clock ticks of all CPUs so far (/proc/stat;
# iowait counts as idle).
cpu_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat; }
# ipi_counts: "function_calls reschedules" interrupts between CPUs so far,
# all CPUs (/proc/interrupts: CAL, RES).
ipi_counts() {
  awk '$1 == "CAL:" || $1 == "RES:" { n = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i; v[$1] = n }
    END { print v["CAL:"] + 0, v["RES:"] + 0 }' /proc/interrupts
}
# proc_ticks PID: user + system clock ticks of a process, all its threads.
proc_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# per_round LIST: the entry of a '/'-separated LIST for this round (they
# take turns: round 1 the first); empty for an empty LIST.
per_round() {
  [ -n "$1" ] || return 0
  local items
  IFS=/ read -r -a items <<<"$1"
  echo "${items[$(((ROUND - 1) % ${#items[@]}))]}"
}

# slow_layout_watch FIO_PID: while the layout runs, from its 60th second
# on and every 30 s, what tiercache's threads wait for and its stats, into
# $OUT/slow-layout-$RUN.txt (a layout takes 20-40 s here; the stalls
# seen so far, up to the kernel NBD client's 120 s timeout, were the
# virtual SSD's: virtio_watch in vmlab/guest/init).
slow_layout_watch() {
  local waited=0
  while kill -0 "$1" 2>/dev/null; do
    nap 5
    waited=$((waited + 5))
    if [ "$waited" -ge 60 ] && [ $((waited % 30)) -eq 0 ]; then
      { echo "--- the layout has run ${waited} s"
        threads_snapshot "$TC_PID"
        timeout 10 tiercache stats --control "$TC_CONTROL"; } >>"$OUT/slow-layout-$RUN.txt" 2>&1
      step "$RUN: the layout has run ${waited} s (threads in slow-layout-$RUN.txt)"
    fi
  done
}

# --- a quiet HDD before each run (the counters: diskstats in lib.sh) ---------
# settle_hdd: waits (up to 30 s) until the HDD has taken no write for a
# second. After the files' layout tiercache writes its dirty blocks back
# while the devices are idle (about 3 s here), where bcache keeps up to
# its writeback_percent dirty; measured from the moment `sync` returned,
# tiercache's runs counted that tail (215-370 HDD writes and up to 124
# flushes in the first seconds, and the cleaner's CPU in the server's per
# IO) and bcache's none. Measuring from a quiet HDD gives both the same
# start.
settle_hdd() {
  local stat=/sys/class/block/$(blockdev_name "$HDD")/stat prev now i
  prev=$(awk '{print $5}' "$stat")
  for i in $(seq 1 30); do
    sleep 1
    now=$(awk '{print $5}' "$stat")
    [ "$now" = "$prev" ] && return
    prev=$now
  done
  echo "warning: the HDD was still being written 30 s after the layout"
}

# hdd_trace_report PERF_DATA MAJ:MIN: the bios queued to that device, as
# counts by thread and kind (blktrace's RWBS: R read, W write, S sync, F
# preflush, M metadata, A readahead, D discard), then the kernel stacks
# of everything but reads, most frequent first.
hdd_trace_report() {
  local data=$1 dev=$2
  echo "bios queued to $dev, by thread and kind:"
  perf script -i "$data" -F comm,event,trace 2>/dev/null |
    awk -v dev="$dev" '$3 == dev { n[$1 " " $4]++ } END { for (k in n) print n[k], k }' | sort -rn
  echo
  echo "stacks of the bios that are not plain reads (count, thread, kind, stack):"
  perf script -i "$data" -F comm,trace,ip,sym 2>/dev/null |
    awk -v dev="$dev" '
      /^[^ \t]/ { if (keep) st[head "|" stack]++; keep = 0; stack = ""
                   if ($2 == dev && $3 !~ /^R/) { keep = 1; head = $1 " " $3 } ; next }
      NF >= 2 && keep { stack = stack " <- " $2 }
      END { if (keep) st[head "|" stack]++; for (k in st) print st[k], k }' |
    sort -rn | head -n 20
}

# --- plain devices ----------------------------------------------------------
plain_counters() { echo "0 0"; }

# run_config NAME SIZE ROUND: one run: a line of runs.txt (NAME SIZE ROUND
# IOPS p50_us p99_us hit% busy% server_us, "-" where it has none).
run_config() {
  local name=$1 size=$2 round=$3 kind junk=0 cutoff="" frontend=""
  ROUND=$round
  if [ "$HAVE_UBLK" = 0 ] && [[ $name == tiercache-ublk-* ]]; then
    step "$name: skipped (no ublk front end in this tiercache binary or kernel)"
    return
  fi
  # NAME-before: the set-up NAME served by tiercache-before.
  TC_BIN_OF_RUN=""
  if [ "${name%-before}" != "$name" ]; then
    command -v tiercache-before >/dev/null || fail "$name needs tiercache-before in the guest (ANCHORS_BIN)"
    TC_BIN_OF_RUN=tiercache-before
  fi
  case "${name%-before}" in
    ssd-alone) kind=plain DEV=$FAST ;;
    hdd-alone) kind=plain DEV=$HDD ;;
    bcache-cutoff4M) kind=bcache cutoff=$((4 << 20)) ;;
    bcache-cutoff0) kind=bcache cutoff=0 ;;
    bcache-cutoff0-junk) kind=bcache cutoff=0 junk=1 ;;
    lvmcache-empty) kind=lvmcache ;;
    lvmcache-junk) kind=lvmcache junk=1 ;;
    tiercache-empty) kind=tiercache frontend=nbd ;;
    tiercache-junk) kind=tiercache frontend=nbd junk=1 ;;
    tiercache-ublk-empty) kind=tiercache frontend=ublk ;;
    tiercache-ublk-junk) kind=tiercache frontend=ublk junk=1 ;;
    tiercache-ublk-cutoff0-empty) kind=tiercache frontend=ublk cutoff=0 ;;
    tiercache-ublk-cutoff0-junk) kind=tiercache frontend=ublk cutoff=0 junk=1 ;;
    tiercache-cutoff0-empty) kind=tiercache frontend=nbd cutoff=0 ;;
    tiercache-ublk-zc-cutoff0-empty) kind=tiercache frontend=ublk-zc cutoff=0 ;;
    tiercache-ublk-zc-cutoff0-junk) kind=tiercache frontend=ublk-zc cutoff=0 junk=1 ;;
    *) fail "unknown configuration $name" ;;
  esac
  # Files of the run: NAME-SIZE, or NAME-rR-SIZE with rounds (the part
  # after the last '-' is the size: `tiercache plot-fio` groups by it).
  RUN=$name-$size
  [ "$ROUNDS" -gt 1 ] && RUN=$name-r$round-$size
  step "$name, data $size: set-up"
  case "$kind" in
    plain) wipe "$DEV" ;;
    bcache) bcache_setup "$cutoff" ;;
    tiercache) tiercache_setup "$frontend" "$cutoff" ;;
    *) "${kind}_setup" ;;
  esac
  local record_pid=""
  if [ "$kind" = tiercache ] && [ -n "${BENCH_RECORD:-}" ]; then
    # Every request the server gets from here on (the junk, the layout and
    # the measured run) into a trace for `tiercache sim`; teardown waits
    # for the recording's end.
    tiercache trace --control "$TC_CONTROL" --seconds "$BENCH_RECORD" --out "$OUT/trace-$RUN.tct" \
      >"$OUT/trace-$RUN.txt" 2>&1 &
    record_pid=$!
  fi
  local front disks
  front=$(blockdev_name "$DEV")
  if [ -n "${BENCH_SCHED:-}" ] && [ -e "/sys/class/block/$front/queue/scheduler" ]; then
    local sched
    sched=$(per_round "$BENCH_SCHED")
    echo "$sched" >"/sys/class/block/$front/queue/scheduler" || fail "scheduler $sched on $front"
  fi
  if [ -n "${BENCH_RQ_AFFINITY:-}" ] && [ -e "/sys/class/block/$front/queue/rq_affinity" ]; then
    echo "$(per_round "$BENCH_RQ_AFFINITY")" >"/sys/class/block/$front/queue/rq_affinity" || fail "rq_affinity on $front"
  fi
  if [ "$kind" = tiercache ] && [ -n "${BENCH_TC_NICE:-}" ]; then
    # Every thread the server has by now (its connection's or queue's
    # threads included: the device is up).
    local t
    for t in /proc/"$TC_PID"/task/*; do
      renice -n "$(per_round "$BENCH_TC_NICE")" -p "${t##*/}" >/dev/null || fail "renice ${t##*/}"
    done
  fi
  disks=$(printf '%s\n' "$front" "$(blockdev_name "$SSD")" "$(blockdev_name "$HDD")" | sort -u | tr '\n' ' ')
  make_fs "$DEV"
  if [ "$junk" = 1 ]; then
    step "$name: filling the cache with other data (${JUNK_RUNTIME}s of random 64k reads over twice its size)"
    fio --name=junk --directory=/mnt/bench --rw=randread --bs=64k --size=$((CACHE_BYTES * 2 / 1048576))M \
      --ioengine=libaio --direct=1 --iodepth=8 --time_based --runtime="$JUNK_RUNTIME" --unlink=1 --zero_buffers \
      --eta=never --output="$OUT/fio-$RUN-junk.txt" || fail "junk fill"
  fi
  # The study's job: lay the files out first, then measure.
  local common=(--name=study --directory=/mnt/bench --rw=randread --bs=4k --random_distribution=zipf:1.2
    --iodepth=8 --numjobs=2 --ioengine=libaio --direct=1 --size="$(job_size "$size")" --group_reporting)
  # (zeroes: random buffers cost a lot of emulated CPU and no cache here
  # looks at the data)
  fio "${common[@]}" --create_only=1 --zero_buffers --eta=never --output=/dev/null &
  local layout=$!
  [ "$kind" = tiercache ] && slow_layout_watch "$layout" &
  wait "$layout" || fail "fio layout"
  sync
  settle_hdd
  local before after
  before=$("${kind}_counters")
  local cpu_before tc_before=0 disks_before trace_pid=""
  if [ "${BENCH_TRACE_HDD:-0}" = 1 ] && command -v perf >/dev/null; then
    # From before the first diskstats to after the second, so the trace
    # holds every request they count (perf takes a few seconds to start
    # under TCG: wait for its data file's header, then some more).
    rm -f "$HDDTRACE_DATA"
    perf record -q -a -g -e block:block_bio_queue -o "$HDDTRACE_DATA" >/dev/null 2>&1 &
    trace_pid=$!
    local waited=0
    while [ ! -s "$HDDTRACE_DATA" ] && [ $waited -lt 50 ]; do sleep 0.2; waited=$((waited + 1)); done
    sleep 3
  fi
  disks_before=$(diskstats $disks)
  local ipis_before
  ipis_before=$(ipi_counts)
  local threads_before="" moves_before=""
  if [ "$kind" = tiercache ]; then
    threads_before=$(thread_schedstats "$TC_PID")
    moves_before=$(tiercache stats --control "$TC_CONTROL" | grep -E '^(occupancy|movement)')
  fi
  cpu_before=$(cpu_ticks)
  [ "$kind" = tiercache ] && tc_before=$(proc_ticks "$TC_PID")
  step "$name, data $size, round $round/$ROUNDS: fio ${RUNTIME}s"
  local perf_pid="" moves_pid=""
  if [ "$kind" = tiercache ] && [ "${BENCH_MOVES:-0}" = 1 ]; then
    # The server's dirty blocks and writebacks twice a second through the
    # run (wall clock in ms; fio's JSON gives its jobs' start in the same).
    while :; do
      echo "$(date +%s%3N) $(tiercache stats --control "$TC_CONTROL" |
        awk '$1 == "occupancy" {d = $7} $1 == "movement" {w = $6} END {print d, w}')"
      sleep 0.5
    done >"$OUT/moves-$RUN.txt" 2>/dev/null &
    moves_pid=$!
  fi
  if [ "${BENCH_PERF:-0}" = 1 ] && command -v perf >/dev/null; then
    perf record -q -a -g -e cpu-clock -F 999 -o "$PERF_DATA" -- sleep $((RUNTIME - 3)) \
      >/dev/null 2>&1 &
    perf_pid=$!
  fi
  fio "${common[@]}" --time_based --runtime="$RUNTIME" --unlink=1 --eta=never \
    --percentile_list=1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.95:99.99 \
    --output-format=terse,json+ --terse-version=3 \
    --write_iops_log="$OUT/iops-$RUN" --log_avg_msec=1000 \
    --output="$OUT/fio-$RUN.out" || {
      # fio 3.33 has been seen to segfault on its way out after a complete
      # run (2026-11-27, NBD, data 4x the cache): a run whose report is
      # whole counts; one without it fails.
      grep -q '^3;' "$OUT/fio-$RUN.out" 2>/dev/null || fail "fio $name"
      echo "warning: fio $name exited with an error after writing its whole report; the run counts"
    }
  [ -n "$moves_pid" ] && kill "$moves_pid" 2>/dev/null
  {
    [ "$kind" = tiercache ] && [ -n "${BENCH_TC_BIN:-}" ] && echo "server binary: $(per_round "$BENCH_TC_BIN")"
    [ "$kind" = tiercache ] && [ -n "${BENCH_TC_ENV:-}" ] && echo "server environment: $(per_round "$BENCH_TC_ENV")"
    [ "$kind" = tiercache ] && [ -n "${BENCH_TC_ARGS:-}" ] && echo "server arguments: $(per_round "$BENCH_TC_ARGS")"
    [ "$kind" = tiercache ] && [ -n "${BENCH_TC_NICE:-}" ] && echo "server nice: $(per_round "$BENCH_TC_NICE")"
    [ "$front" = nbd0 ] && echo "NBD connections: $(per_round "$NBD_CONNECTIONS"), configured by $(per_round "${BENCH_NBD_ATTACH:-nbd-client}")"
    [ "$kind" = tiercache ] && [ -n "${BENCH_TC_CREATE_ARGS:-}" ] && echo "create arguments: $(per_round "$BENCH_TC_CREATE_ARGS")"
    echo "$front: scheduler $(cat "/sys/class/block/$front/queue/scheduler" 2>/dev/null || echo -), rq_affinity $(cat "/sys/class/block/$front/queue/rq_affinity" 2>/dev/null || echo -)"
    diskstats_report "$disks_before" "$(diskstats $disks)" "$RUNTIME"
    echo "$ipis_before $(ipi_counts) $(awk -F';' '/^3;/ {print $8 * '"$RUNTIME"'}' "$OUT/fio-$RUN.out")" |
      awk '$5 > 0 {printf "IPIs per IO: function calls %.2f, reschedules %.2f\n", ($3 - $1) / $5, ($4 - $2) / $5}'
    if [ -n "$moves_before" ]; then
      echo "before: $moves_before" | tr '\n' ' '
      echo
      echo "after:  $(tiercache stats --control "$TC_CONTROL" | grep -E '^(occupancy|movement)' | tr '\n' ' ')"
    fi
    if [ -n "$threads_before" ]; then
      schedstats_report "$threads_before" "$(thread_schedstats "$TC_PID")" \
        "$(awk -F';' '/^3;/ {print $8 * '"$RUNTIME"'}' "$OUT/fio-$RUN.out")"
    fi
  } >"$OUT/diskstats-$RUN.txt"
  cat "$OUT/diskstats-$RUN.txt"
  sleep 2 # bcache folds its counters into stats_total about once a second
  if [ -n "$trace_pid" ]; then
    kill -INT "$trace_pid" 2>/dev/null
    wait "$trace_pid" || true
    hdd_trace_report "$HDDTRACE_DATA" "$(lsblk -dno MAJ:MIN "$HDD" | tr -d ' ' | tr : ,)" >"$OUT/hddtrace-$RUN.txt"
    rm -f "$HDDTRACE_DATA"
  fi
  if [ -n "$perf_pid" ]; then
    wait "$perf_pid" || true
    perf report -i "$PERF_DATA" --no-children --sort comm,dso,sym --stdio 2>/dev/null |
      grep -v '^$' | head -n 400 >"$OUT/perf-$RUN.txt" || true
    perf report -i "$PERF_DATA" --no-children --sort comm --stdio -g none 2>/dev/null |
      grep '%' | head -n 30 >"$OUT/perf-$RUN-comm.txt" || true
    perf report -i "$PERF_DATA" --no-children --sort comm,dso,sym --stdio -g none 2>/dev/null |
      grep '%' | head -n 300 >"$OUT/perf-$RUN-flat.txt" || true
    if [ "$kind" = tiercache ]; then
      # The server's threads by symbol: the queue threads, the workers
      # (ublk-io-N, nbd workers) and the cleaner, each group summed.
      # (NBD: the connections' readers nbd-conn-N and workers nbd-worker-N.)
      perf report -i "$PERF_DATA" --no-children --sort sym --stdio -g none \
        --comms "$(seq -s, -f 'ublk-io-%g' 0 63),$(seq -s, -f 'nbd-worker-%g' 0 63)" 2>/dev/null |
        grep '%' | head -n 120 >"$OUT/perf-$RUN-workers.txt" || true
      perf report -i "$PERF_DATA" --no-children --sort sym --stdio -g none \
        --comms "$(seq -s, -f 'ublk-q%g' 0 31),$(seq -s, -f 'nbd-conn-%g' 0 63)" 2>/dev/null |
        grep '%' | head -n 120 >"$OUT/perf-$RUN-queues.txt" || true
    fi
    rm -f "$PERF_DATA"
  fi
  after=$("${kind}_counters")
  local cpu_after tc_after=0
  cpu_after=$(cpu_ticks)
  [ "$kind" = tiercache ] && tc_after=$(proc_ticks "$TC_PID")
  umount /mnt/bench
  if [ -n "$record_pid" ]; then
    step "$name: waiting for the recording's end (BENCH_RECORD=${BENCH_RECORD}s)"
    wait "$record_pid" || fail "tiercache trace"
  fi
  case "$kind" in
    plain) ;;
    *) "${kind}_teardown" ;;
  esac
  # terse v3: field 8 read IOPS; read clat percentiles follow as "P%=usec".
  local row
  row=$(awk -F';' -v name="$name" -v size="$size" -v round="$round" -v before="$before" -v after="$after" \
    -v cpu_before="$cpu_before" -v cpu_after="$cpu_after" -v tc_ticks=$((tc_after - tc_before)) \
    -v hz="$(getconf CLK_TCK)" -v runtime="$RUNTIME" '{
      iops = $8; p50 = "-"; p99 = "-"
      for (i = 18; i <= 37; i++) {
        split($i, kv, "=")
        if (kv[1] == "50.000000%" && p50 == "-") p50 = kv[2]
        if (kv[1] == "99.000000%" && p99 == "-") p99 = kv[2]
      }
      split(before, b, " "); split(after, a, " ")
      hits = a[1] - b[1]; misses = a[2] - b[2]
      ratio = (hits + misses > 0) ? sprintf("%.1f", 100 * hits / (hits + misses)) : "-"
      # Guest CPU over the measured run plus the 2 s after it: busy share,
      # and the cache server'"'"'s own CPU time per IO (tiercache only).
      split(cpu_before, c0, " "); split(cpu_after, c1, " ")
      busy = (c1[1] - c0[1]); total = busy + (c1[2] - c0[2])
      cpu = (total > 0) ? sprintf("%.0f", 100 * busy / total) : "-"
      ios = iops * runtime
      server = (tc_ticks > 0 && ios > 0) ? sprintf("%.0f", 1e6 * tc_ticks / hz / ios) : "-"
      printf "%s %s %s %d %s %s %s %s %s\n", name, size, round, iops, p50, p99, ratio, cpu, server
    }' \
    <(grep '^3;' "$OUT/fio-$RUN.out"))
  echo "$row" >>"$OUT/runs.txt"
  step "$name, data $size, round $round: IOPS, p50 us, p99 us, hit %, CPU busy %, server us per IO: ${row#* * * }"
}

rm -f "$OUT/runs.txt"
step "anchors: cache $((CACHE_BYTES >> 20)) MiB, hdd $(($(blockdev --getsize64 "$HDD") >> 20)) MiB, runs of ${RUNTIME}s, $ROUNDS round(s); configurations: $CONFIGS; sizes: $SIZES"
for round in $(seq 1 "$ROUNDS"); do
  order=$CONFIGS
  [ $((round % 2)) = 0 ] && order=$(echo "$CONFIGS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for size in $SIZES; do
    for config in $order; do
      run_config "$config" "$size" "$round"
    done
  done
done

# col KEY COLUMN: the median of COLUMN of runs.txt over the runs of KEY
# ("NAME SIZE"), "-" if none has it.
col() { awk -v k="$1" -v c="$2" '$1 " " $2 == k { print $c }' "$OUT/runs.txt" | median; }
# ms US: microseconds as milliseconds.
ms() { [ "$1" = - ] && echo - || awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
# pct X: X%.
pct() { [ "$1" = - ] && echo - || echo "$1%"; }
{
  echo "Anchors in the VM lab (qemu TCG; $(nproc) vCPUs; $(cpu_features); cache $((CACHE_BYTES >> 20)) MiB; data per job: fits $(job_size fits), nofit $(job_size nofit); ${RUNTIME}s per run; kernel $(uname -r))$([ "$ROUNDS" -gt 1 ] && echo "; medians of $ROUNDS interleaved rounds")"
  echo
  if [ "$ROUNDS" -gt 1 ]; then
    echo "| configuration | data | IOPS | p50 | p99 | hit ratio | guest CPU busy | server CPU per IO | rounds (IOPS / p99 ms) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
  else
    echo "| configuration | data | IOPS | p50 | p99 | hit ratio | guest CPU busy | server CPU per IO |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
  fi
  for size in $SIZES; do
    for config in $CONFIGS; do
      key="$config $size"
      grep -q "^$key " "$OUT/runs.txt" 2>/dev/null || continue
      server=$(col "$key" 9)
      [ "$server" = - ] || server="$(printf %.0f "$server") us"
      row="| $config | $size | $(printf %.0f "$(col "$key" 4)") | $(ms "$(col "$key" 5)") | $(ms "$(col "$key" 6)") | $(pct "$(col "$key" 7)") | $(pct "$(col "$key" 8)") | $server |"
      if [ "$ROUNDS" -gt 1 ]; then
        per_round=$(awk -v k="$key" '$1 " " $2 == k { printf "%s%d / %.2f", sep, $4, $6 / 1000; sep = ", " }' "$OUT/runs.txt")
        row="$row $per_round |"
      fi
      echo "$row"
    done
  done
} >"$VMLAB_RESULTS/anchors.md"
cat "$VMLAB_RESULTS/anchors.md"
