# Helpers for VM lab guest scripts: `. /vmlab/lib.sh` at the top.
# Everything a script writes under $VMLAB_RESULTS (/results, the host's
# results directory) is on the host when run.sh returns.

set -euo pipefail

# step TEXT: a visible, timestamped progress line on the console. Builtins
# only: under TCG, with a load running, every process a script starts can
# cost a second.
step() {
  local up _
  read -r up _ </proc/uptime
  echo "[vmlab +${up}s boot $VMLAB_BOOT] $*"
}

# nap SECONDS: sleep without starting a process (`sleep` is one): a read
# with a timeout on a FIFO that nobody writes.
nap() {
  if [ -z "${VMLAB_NAP_FD:-}" ]; then
    [ -p /run/vmlab-nap ] || mkfifo /run/vmlab-nap
    exec {VMLAB_NAP_FD}<>/run/vmlab-nap
  fi
  read -r -t "$1" -u "$VMLAB_NAP_FD" _ || true
}

# fail TEXT: print and exit 1.
fail() { echo "FAIL: $*"; exit 1; }

# skip TEXT: the test cannot run here; run.sh returns 77.
skip() { echo "SKIP: $*"; exit 77; }

# vmlab_crash: reboot the guest at once, without syncing or unmounting
# (sysrq b, a crash as far as the disks are concerned). The host boots the
# same image again with VMLAB_BOOT incremented; files under /results and the
# disks' contents survive. Never returns.
vmlab_crash() {
  : >"$VMLAB_RESULTS/.vmlab-reboot"
  sync -f "$VMLAB_RESULTS/.vmlab-reboot" 2>/dev/null || true
  step "crash: sysrq b"
  echo b >/proc/sysrq-trigger
  sleep 60
  fail "sysrq b did not reboot"
}

# wait_for_path PATH [SECONDS]: wait until PATH exists (a socket, a device).
wait_for_path() {
  local path=$1 limit=${2:-60} i=0
  while [ ! -e "$path" ]; do
    i=$((i + 1))
    [ "$i" -le $((limit * 10)) ] || fail "$path did not appear within ${limit}s"
    nap 0.1
  done
}

# wait_for_server PID SOCKET LOG: until the tiercache server PID has bound
# its control socket SOCKET (it does once its devices serve); fails, with
# the end of LOG, if the server exits first or 120 s pass.
wait_for_server() {
  local pid=$1 socket=$2 log=$3 i=0
  while [ ! -S "$socket" ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$log"; fail "tiercache exited while starting"; }
    i=$((i + 1))
    [ "$i" -lt 1200 ] || fail "no control socket 120 s after starting tiercache"
    nap 0.1
  done
}

# proc_status PID FIELD: a field of /proc/PID/status, its number only
# (VmPin and VmRSS in KiB, Threads).
proc_status() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# disk NAME: the guest device of the disk run.sh was given as --disk NAME=...
disk() {
  local link="/dev/vmlab/$1"
  [ -e "$link" ] || fail "no disk named $1 (run.sh --disk $1=SIZE)"
  readlink -f "$link"
}

# median: the median of the numbers on stdin, one per line ("-" lines
# ignored; the mean of the middle two for an even count; "-" if none).
median() {
  { grep -v '^-$' || true; } | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# cpu_features: which of the CPU features the lab leaves out (vmlab/run.sh,
# VMLAB_CPU) this guest has, e.g. "without SSE4.2, without ERMS", for the
# benchmarks' headers.
cpu_features() {
  local f out=()
  for f in sse4_2:SSE4.2 erms:ERMS; do
    if grep -qw "${f%%:*}" /proc/cpuinfo; then out+=("with ${f#*:}"); else out+=("without ${f#*:}"); fi
  done
  local IFS=,
  echo "${out[*]}" | sed 's/,/, /g'
}

# thread_schedstats PID: "comm tid cpu_ns runqueue_wait_ns timeslices
# voluntary involuntary" per thread of PID (/proc/PID/task/TID/schedstat:
# time on a CPU, time runnable but waiting for one, times scheduled in;
# /proc/PID/task/TID/status: context switches by sleeping, and by being
# preempted). A thread that ends meanwhile is left out.
thread_schedstats() {
  local t line
  for t in /proc/"$1"/task/*; do
    line="$(tr -d ' ' <"$t/comm" 2>/dev/null) ${t##*/} $(cat "$t/schedstat" 2>/dev/null) $(awk '/^(non)?voluntary_ctxt_switches/ {printf "%s ", $2}' "$t/status" 2>/dev/null)" || continue
    [ "$(echo "$line" | wc -w)" = 7 ] && echo "$line"
  done
}
# threads_snapshot PID: each thread of PID with its state, the kernel
# function it sleeps in (wchan) and its kernel stack; then the block
# devices' requests in flight. What a process that stopped answering is
# waiting for (a futex: a lock or a condition; io_uring_enter: its IO).
threads_snapshot() {
  local t
  for t in /proc/"$1"/task/*; do
    echo "== $(cat "$t/comm") (tid ${t##*/}) state $(awk '{sub(/.*\) /, ""); print $1}' "$t/stat") wchan $(cat "$t/wchan" 2>/dev/null)"
    cat "$t/stack" 2>/dev/null
  done
  echo "== requests in flight (reads writes) per block device"
  for t in /sys/block/*/inflight; do
    echo "$(basename "$(dirname "$t")") $(cat "$t")"
  done
}

# schedstats_report BEFORE AFTER IOS: per thread busy in the run, its CPU
# time and its wait for a CPU while runnable, each per IO, how often it
# was scheduled in per IO, and of that how often it had slept (woken) and
# been preempted; the five busiest threads.
schedstats_report() {
  awk -v ios="$3" 'NR == FNR { c[$2] = $3; w[$2] = $4; n[$2] = $5; v[$2] = $6; p[$2] = $7; next }
    { cpu = $3 - c[$2]; wait = $4 - w[$2]; slices = $5 - n[$2]
      if (ios > 0 && cpu > 0) printf "%-18s cpu %7.1f us/IO  waiting for a CPU %7.1f us/IO  scheduled in %5.2f /IO (woken %5.2f, preempted %5.2f)\n",
        $1, cpu / 1000 / ios, wait / 1000 / ios, slices / ios, ($6 - v[$2]) / ios, ($7 - p[$2]) / ios }' <(echo "$1") <(echo "$2") |
    sort -k3 -g -r | head -n 5
}

# The block layer's own counters.
# blockdev_name DEV: the name under /sys/class/block of a device node.
blockdev_name() { basename "$(readlink -f "$1")"; }
# diskstats DEV...: "name reads read_ms in_queue_ms writes write_ms
# flushes sectors_read" per device (/sys/class/block/NAME/stat fields 1,
# 4, 11, 5, 8, 16 and 3).
diskstats() {
  local d
  for d in "$@"; do
    echo "$d $(awk '{print $1, $4, $11, $5, $8, (NF >= 16) ? $16 : 0, $3}' "/sys/class/block/$d/stat")"
  done
}
# diskstats_report BEFORE AFTER SECONDS: per device, the reads and writes
# in the run, the reads' mean size, their mean latency as the block layer sees it (from
# submission to completion, queueing included) and the mean number of IOs
# in flight.
diskstats_report() {
  awk -v secs="$3" 'NR == FNR { r[$1] = $2; t[$1] = $3; q[$1] = $4; w[$1] = $5; wt[$1] = $6; f[$1] = $7; s[$1] = $8; next }
    { reads = $2 - r[$1]; ms = $3 - t[$1]; inq = $4 - q[$1]; writes = $5 - w[$1]; wms = $6 - wt[$1]; flushes = $7 - f[$1]; kib = ($8 - s[$1]) / 2
      printf "%-10s reads %8d  mean read %7.1f KiB  mean read latency %7.3f ms  writes %7d  mean write latency %7.3f ms  flushes %6d  mean in flight %6.2f\n",
        $1, reads, (reads > 0) ? kib / reads : 0, (reads > 0) ? ms / reads : 0, writes, (writes > 0) ? wms / writes : 0, flushes, inq / (1000 * secs) }' \
    <(echo "$1") <(echo "$2")
}
