#!/usr/bin/env bash
# The anchors side by side (`make anchors`; a benchmark, not a test): the
# field study's fio job in one qemu guest on the same emulated SSD and HDD
# for the SSD alone, the HDD alone, bcache, lvmcache and tiercache (over the
# kernel NBD client and over ublk), hot set fitting the cache and not
# (vmlab/guest/anchors-bench.sh), then the bench plots of every run
# (`tiercache plot-fio`). About 25 minutes on 2 cores.
#
# Output: $ANCHORS_OUT (default ${CARGO_TARGET_DIR:-target}/vmlab/anchors):
#   results/anchors.md       the table
#   results/anchors/         fio reports, IOPS logs, cache statistics
#   results/plots/*.png      IOPS over time and latency percentiles, per size
#   console.log              the guest's console
# Environment for the guest script: ANCHORS_ENV="BENCH_RUNTIME=30 ..."
# (see vmlab/guest/anchors-bench.sh; BENCH_ROUNDS=3 with a few
# BENCH_CONFIGS for the decisive runs: medians of interleaved rounds).
# ANCHORS_TIMEOUT: seconds the guest may run (default 3600).
# ANCHORS_HDD: the emulated HDDs' qemu throttling (run.sh --disk options;
# default iops=300; e.g. iops=300,bps=209715200 also caps their bandwidth
# at 200 MiB/s, as a disk's media rate does, however large the requests).
#
# vmlab/anchors.sh --pool (`make anchors-pool`): the pool bench instead
# (vmlab/guest/pool-bench.sh): 4 volumes on HDDs throttled to 300 IOPS
# behind one 256 MiB SSD, bcache (one cache set) against tiercache over ublk
# (one pool), 3 hot Zipf readers and a sequential scanner, interleaved
# rounds. Output: $ANCHORS_OUT (default ${CARGO_TARGET_DIR:-target}/vmlab/
# anchors-pool): results/pool-bench.md (the table), results/pool-bench/
# (fio reports, cache statistics), console.log. ANCHORS_ENV as above
# (BENCH_ROUNDS, BENCH_RUNTIME, BENCH_WARMUP).
set -euo pipefail
cd "$(dirname "$0")/.."
pool=0
[ "${1:-}" = --pool ] && pool=1
repo="$(pwd)"
CARGO="${CARGO:-cargo}"
./scripts/install-vmlab-deps.sh
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO ./vmlab/build-image.sh >/dev/null
$CARGO build --release -p tiercache
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
export VMLAB_TIERCACHE="$target/release/tiercache"
envs=()
for kv in ${ANCHORS_ENV:-}; do envs+=(--env "$kv"); done
bins=()
case " ${ANCHORS_ENV:-} " in *" BENCH_PERF=1 "* | *" BENCH_TRACE_HDD=1 "*) bins=(--bin "$VMLAB_TIERCACHE" --bin "$(command -v perf)") ;; esac
# More host binaries for the guest's PATH (e.g. a build before a change,
# named tiercache-before, for BENCH_TC_BIN, or the pool
# bench's NAME-before set-ups).
if [ -n "${ANCHORS_BIN:-}" ]; then
  # (Any --bin replaces run.sh's default of tiercache alone.)
  [ ${#bins[@]} -eq 0 ] && bins=(--bin "$VMLAB_TIERCACHE")
  for b in $ANCHORS_BIN; do bins+=(--bin "$b"); done
fi
hdd="${ANCHORS_HDD:-iops=300}"
if [ "$pool" = 1 ]; then
  out="${ANCHORS_OUT:-$target/vmlab/anchors-pool}"
  ./vmlab/run.sh --out "$out" --timeout "${ANCHORS_TIMEOUT:-3600}" --disk "h1=1G,$hdd" --disk "h2=1G,$hdd" \
    --disk "h3=1G,$hdd" --disk "h4=1G,$hdd" --disk ssd=256M "${envs[@]}" "${bins[@]}" vmlab/guest/pool-bench.sh
  echo
  cat "$out/results/pool-bench.md"
  exit 0
fi
out="${ANCHORS_OUT:-$target/vmlab/anchors}"
./vmlab/run.sh --out "$out" --timeout "${ANCHORS_TIMEOUT:-3600}" --disk "hdd=3G,$hdd" --disk ssd=256M --disk fast=3G \
  "${envs[@]}" "${bins[@]}" vmlab/guest/anchors-bench.sh
"$VMLAB_TIERCACHE" plot-fio "$out/results/anchors" --out "$out/results/plots"
echo
cat "$out/results/anchors.md"
echo
echo "anchors: plots in $out/results/plots"
