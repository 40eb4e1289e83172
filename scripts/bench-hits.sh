#!/usr/bin/env bash
# All-hit reads over NBD at queue depth, and the server's CPU per IO.
#
# The field study's fio job (fio --ioengine=nbd, randread, zipf:1.2, 4 KiB,
# iodepth 8 per job, one NBD connection per job) over a unix socket against:
#   tc-file      tiercache serve, the cache on a file (O_DIRECT), every read a hit
#   tc-ram       tiercache serve, the cache in RAM (mem:), every read a hit
#   nbdkit-file  nbdkit's file plugin on the same data file, cache=none
#   nbdkit-mem   nbdkit's memory plugin, filled with the data
# and fio alone on a file of the data on the same disk (io_uring, O_DIRECT) at the same
# total queue depth (connections x iodepth), for 1, 4 and 8 connections.
# Every configuration runs once per round; rounds interleave them (odd
# rounds in reverse order); the summary gives medians over the rounds.
# CPU per IO = the server's utime + stime delta over the run
# (/proc/PID/stat) / the IOs fio completed; for fio alone, fio's own CPU
# (its usr + sys over the run, from its report) / its IOs: what reading
# the file costs the kernel and fio, the floor for a server reading it.
#
# Environment: DATA (default 256M), RUNTIME seconds per run (5), ROUNDS (3),
# CONNS ("1 4 8"), IODEPTH per connection (8), CONFIGS (all of the above plus
# fio-alone; tc-file-before and tc-ram-before run TIERCACHE_BEFORE, another
# build, side by side), TIERCACHE (the binary; default target/release/tiercache),
# DIR (work directory on the disk to measure; default a new one under
# /var/tmp, removed at the end unless KEEP=1). Needs fio and nbdkit
# (scripts/install-deps.sh) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-256M}
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-"1 4 8"}
IODEPTH=${IODEPTH:-8}
CONFIGS=${CONFIGS:-"tc-file tc-ram nbdkit-file nbdkit-mem fio-alone"}
TIERCACHE=${TIERCACHE:-${CARGO_TARGET_DIR:-target}/release/tiercache}
for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "bench-hits: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$TIERCACHE" ] || { echo "bench-hits: no $TIERCACHE (cargo build --release -p tiercache)" >&2; exit 1; }
if [ -z "${DIR:-}" ]; then
  DIR=$(mktemp -d /var/tmp/bench-hits.XXXXXX)
  [ "${KEEP:-0}" = 1 ] || trap_rm="$DIR"
fi
mkdir -p "$DIR"
bytes=$(numfmt --from=iec "$DATA")

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${trap_rm:-}" ] && rm -rf "$trap_rm"
}
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done
  echo "bench-hits: $1 never appeared" >&2; exit 1
}

uri() { echo "nbd+unix:///default?socket=$DIR/$1.sock"; }

# fio over NBD on server $1; extra arguments follow.
fio_nbd() {
  local name=$1; shift
  fio --name=hits --ioengine=nbd --uri="$(uri "$name")" --size="$bytes" "$@" >/dev/null
}

echo "bench-hits: data $DATA, $RUNTIME s per run, $ROUNDS rounds, connections $CONNS, iodepth $IODEPTH per connection; in $DIR"
head -c "$bytes" /dev/urandom >"$DIR/data"
cache_bytes=$((bytes + bytes / 4 + (64 << 20)))
# fio alone reads this copy (written, so that no read falls in a hole).
cp "$DIR/data" "$DIR/alone"

start() {
  local name=$1; shift
  rm -f "$DIR/$name.sock"
  "$@" >"$DIR/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_${name//-/_}=$!"
  wait_socket "$DIR/$name.sock"
}
for cfg in $CONFIGS; do
  case $cfg in
    tc-file | tc-ram | tc-file-before | tc-ram-before)
      bin=$TIERCACHE
      [[ $cfg != *-before ]] || bin=${TIERCACHE_BEFORE:?tc-*-before needs TIERCACHE_BEFORE}
      # tiercache holds its backing device open exclusively: one copy each.
      backing="$DIR/data-$cfg"
      cp "$DIR/data" "$backing"
      if [[ $cfg == tc-file* ]]; then
        cache="$DIR/cache-$cfg"
        truncate -s "$cache_bytes" "$cache"
      else
        cache="mem:$cache_bytes"
      fi
      start "$cfg" "$bin" serve --backing "$backing" --cache "$cache" --create \
        --sequential-cutoff 0 --socket "$DIR/$cfg.sock" --control "$DIR/$cfg.ctl"
      # Warm: one pass over the data makes every block a hit.
      fio_nbd "$cfg" --rw=read --bs=64k --iodepth=4
      ;;
    nbdkit-file)
      start "$cfg" nbdkit --foreground --readonly --unix "$DIR/$cfg.sock" file file="$DIR/data" cache=none
      ;;
    nbdkit-mem)
      start "$cfg" nbdkit --foreground --unix "$DIR/$cfg.sock" memory size="$bytes"
      fio_nbd "$cfg" --rw=write --bs=1M --iodepth=4 --buffer_compress_percentage=0
      ;;
    fio-alone) ;;
    *) echo "bench-hits: unknown configuration $cfg" >&2; exit 1 ;;
  esac
done

# utime + stime of a process, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

results="$DIR/results.tsv"
: >"$results"
order=()
for cfg in $CONFIGS; do for c in $CONNS; do order+=("$cfg:$c"); done; done
for round in $(seq "$ROUNDS"); do
  runs=("${order[@]}")
  if [ $((round % 2)) = 0 ]; then
    for ((i = ${#order[@]} - 1, j = 0; i >= 0; i--, j++)); do runs[j]=${order[i]}; done
  fi
  for run in "${runs[@]}"; do
    cfg=${run%%:*}
    c=${run##*:}
    out="$DIR/$cfg-$c-$round.json"
    job=(--name=hits --rw=randread --random_distribution=zipf:1.2 --bs=4k --iodepth="$IODEPTH"
      --numjobs="$c" --size="$bytes" --time_based=1 --runtime="$RUNTIME" --group_reporting=1
      --output-format=json --output="$out")
    if [ "$cfg" = fio-alone ]; then
      fio "${job[@]}" --ioengine=io_uring --direct=1 --filename="$DIR/alone"
      cpu=-
    else
      var="pid_${cfg//-/_}"
      pid=${!var}
      t0=$(ticks "$pid")
      fio "${job[@]}" --ioengine=nbd --uri="$(uri "$cfg")"
      t1=$(ticks "$pid")
      cpu=$((t1 - t0))
    fi
    python3 - "$out" "$cfg" "$c" "$round" "$cpu" "$hz" >>"$results" <<'EOF'
import json, sys
out, cfg, conns, rnd, cpu, hz = sys.argv[1:]
job = json.load(open(out))["jobs"][0]
r = job["read"]
ios = r["total_ios"]
if cpu == "-" and ios > 0:
    # fio alone: its CPU share (percent) over its jobs' summed runtime (ms).
    fio_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    per_io = "%.2f" % (fio_s * 1e6 / ios)
else:
    per_io = "-" if cpu == "-" or ios == 0 else "%.2f" % (int(cpu) / int(hz) * 1e6 / ios)
print(f"{cfg}\t{conns}\t{rnd}\t{r['iops']:.0f}\t{per_io}")
EOF
    tail -n 1 "$results"
  done
done

for cfg in tc-file tc-ram tc-file-before tc-ram-before; do
  if [[ " $CONFIGS " == *" $cfg "* ]]; then
    echo "--- $cfg: tiercache stats"
    "$TIERCACHE" stats --control "$DIR/$cfg.ctl" | grep -i -E "hit|read" || true
  fi
done

python3 - "$results" "$CONNS" "$IODEPTH" <<'EOF'
import sys, statistics
from collections import defaultdict
path, conns, qd = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
iops, cpu = defaultdict(dict), defaultdict(list)
for line in open(path):
    cfg, c, rnd, i, p = line.split("\t")
    iops[(cfg, c)][rnd] = float(i)
    if p.strip() != "-":
        cpu[(cfg, c)].append(float(p))
cfgs = list(dict.fromkeys(k[0] for k in iops))
def ratio(cfg, c, base):
    a, b = iops.get((cfg, c), {}), iops.get((base, c), {})
    rs = [a[r] / b[r] for r in a if r in b and b[r] > 0]
    return "%.0f%%" % (100 * statistics.median(rs)) if rs else "-"
print()
print("| configuration | connections | total QD | IOPS median (min-max) | vs fio alone | vs nbdkit file | server CPU per IO (median; fio alone: fio's) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for cfg in cfgs:
    for c in conns:
        v = list(iops.get((cfg, c), {}).values())
        if not v:
            continue
        p = cpu.get((cfg, c))
        print(f"| {cfg} | {c} | {int(c) * qd} | {statistics.median(v)/1000:.1f}k ({min(v)/1000:.1f}k-{max(v)/1000:.1f}k) "
              f"| {ratio(cfg, c, 'fio-alone')} | {ratio(cfg, c, 'nbdkit-file')} "
              f"| {'%.1f us' % statistics.median(p) if p else '-'} |")
EOF
