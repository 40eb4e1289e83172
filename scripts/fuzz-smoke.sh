#!/usr/bin/env bash
# Runs every cargo-fuzz target of the project (crates/*/fuzz) for a short
# while: FUZZ_SECONDS each (default 10). A crash, hang (-timeout) or
# out-of-memory fails the script and leaves the input in
# crates/<crate>/fuzz/artifacts/<target>/. Long runs by hand:
#   FUZZ_SECONDS=3600 scripts/fuzz-smoke.sh
#   FUZZ_TARGETS="blkparse msr" FUZZ_SECONDS=600 scripts/fuzz-smoke.sh
#   FUZZ_SANITIZER=address FUZZ_SECONDS=3600 scripts/fuzz-smoke.sh
#
# Toolchain: nightly when rustup has it; else the default (stable) toolchain
# with RUSTC_BOOTSTRAP=1, which lets a stable rustc accept the -Z flags
# cargo-fuzz passes (sanitizer, coverage instrumentation). FUZZ_TOOLCHAIN=
# nightly|stable forces one. cargo-fuzz itself is installed from crates.io
# when missing.
#
# Sanitizer: FUZZ_SANITIZER=address|none for every crate; unset, each fuzz
# crate's Cargo.toml chooses with `sanitizer = "none"` or "address" in
# [package.metadata.fuzz-smoke] (default address). The crates say "none"
# when the code their targets reach has no unsafe code of the project's
# own: AddressSanitizer would then only watch third-party code, and costs
# most of the build time (every dependency is built a second time) and the
# speed. If an address-sanitizer build fails on this toolchain the crate is
# built with -s none instead.
#
# Optimization: FUZZ_OPT_LEVEL (the fuzz crates' release opt-level),
# default 1 for runs under a minute (`make test`'s 5 s each: the builds
# take 175 s instead of 223, the targets run 60-100% as many inputs, still
# hundreds of thousands each) and 3, cargo's, for longer runs.
#
# Every fuzz crate is built once (`cargo fuzz build`), all into one target
# directory per sanitizer, so dependencies they share are built once:
# $FUZZ_TARGET_DIR (default <CARGO_TARGET_DIR or ./target>/fuzz-<sanitizer>).
# Then the targets' binaries run directly, FUZZ_JOBS at a time (default: the
# number of CPUs; each target is single-threaded and still runs FUZZ_SECONDS).
#
# Inputs per target: corpus/<target>/ (generated, gitignored) plus the
# checked-in seeds/<target>/ and dictionary dicts/<target>.dict when present.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
secs="${FUZZ_SECONDS:-10}"
only="${FUZZ_TARGETS:-}"
started=$(date +%s)

have_nightly() { rustup run nightly rustc --version >/dev/null 2>&1; }
why="no nightly toolchain"
case "${FUZZ_TOOLCHAIN:-auto}" in
  nightly) use_nightly=1 ;;
  stable) use_nightly=0 why="FUZZ_TOOLCHAIN=stable" ;;
  *) if have_nightly; then use_nightly=1; else use_nightly=0; fi ;;
esac
if [ "$use_nightly" = 1 ]; then
  cargo_fuzz=(cargo +nightly fuzz)
  echo "fuzz-smoke: toolchain: nightly ($(rustup run nightly rustc --version))"
else
  # Plain `cargo`: the default toolchain, which is all a fresh machine has.
  cargo_fuzz=(cargo fuzz)
  export RUSTC_BOOTSTRAP=1
  echo "fuzz-smoke: toolchain: stable with RUSTC_BOOTSTRAP=1 ($(rustc --version)): $why"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz"
  cargo install --locked cargo-fuzz >/dev/null
fi
host="$(rustc -vV | sed -n 's/^host: //p')"
case "${FUZZ_SANITIZER:-}" in
  "" | address | none) ;;
  *) echo "fuzz-smoke: FUZZ_SANITIZER must be address or none, not ${FUZZ_SANITIZER}" >&2; exit 2 ;;
esac
if [ "$secs" -lt 60 ] 2>/dev/null; then opt_level=1; else opt_level=3; fi
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${FUZZ_OPT_LEVEL:-$opt_level}"
jobs="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}"
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
# Targets built without a sanitizer use glibc's malloc, which by default
# returns each freed 256 KiB reader buffer to the kernel and page-faults it
# back in on the next input: keeping freed memory makes them ~5x faster.
# (ASan's allocator ignores this.) Set for the fuzz runs only.
run_tunables="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432"
logs="$(mktemp -d "${TMPDIR:-/tmp}/fuzz-smoke.XXXXXX")"

build_failures=0
build_secs=0
failed=()
# One entry per target to run: "<fuzz dir> <target> <binary>".
runs=()
for dir in crates/*/fuzz; do
  [ -f "$dir/Cargo.toml" ] && [ -d "$dir/fuzz_targets" ] || continue
  crate_dir="$(dirname "$dir")"
  names=()
  for t in "$dir"/fuzz_targets/*.rs; do
    name="$(basename "$t" .rs)"
    if [ -z "$only" ] || [[ " $only " == *" $name "* ]]; then
      names+=("$name")
    fi
  done
  [ ${#names[@]} -gt 0 ] || continue

  sanitizer=address
  if sed -n '/^\[package.metadata.fuzz-smoke\]/,/^\[/p' "$dir/Cargo.toml" |
    grep -Eq '^sanitizer *= *"none"'; then
    sanitizer=none
  fi
  sanitizer="${FUZZ_SANITIZER:-$sanitizer}"
  build_log="$logs/build-$(basename "$crate_dir").log"
  t0=$(date +%s)
  # Sets bin_dir; returns cargo-fuzz's status.
  build() {
    local tdir="${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}/fuzz-$sanitizer}"
    case "$tdir" in /*) ;; *) tdir="$root/$tdir" ;; esac
    bin_dir="$tdir/$host/release"
    (cd "$dir" && "${cargo_fuzz[@]}" build -s "$sanitizer" --target-dir "$tdir") >"$build_log" 2>&1
  }
  built=1
  if ! build; then
    if [ "$sanitizer" = address ]; then
      echo "fuzz-smoke: $crate_dir: address-sanitizer build failed (log $build_log); building with -s none"
      tail -5 "$build_log"
      sanitizer=none
      build || built=0
    else
      built=0
    fi
  fi
  if [ "$built" = 0 ]; then
    echo "fuzz-smoke: FAILED: $crate_dir: build (log $build_log)"
    tail -30 "$build_log"
    build_failures=$((build_failures + 1))
    failed+=("$crate_dir:build")
    continue
  fi
  t1=$(date +%s)
  build_secs=$((build_secs + t1 - t0))
  echo "fuzz-smoke: $crate_dir: built (sanitizer $sanitizer) in $((t1 - t0)) s"
  for name in "${names[@]}"; do
    runs+=("$dir $name $bin_dir/$name")
  done
done

# run_target DIR NAME BINARY: one libFuzzer run; its log is
# $logs/<crate>-<target>.log, its status $logs/<crate>-<target>.status
# ("<exit status> <seconds>").
run_target() {
  local dir=$1 name=$2 bin=$3
  local base
  base="$logs/$(basename "$(dirname "$dir")")-$name"
  mkdir -p "$dir/corpus/$name" "$dir/artifacts/$name"
  local args=(-max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
    -artifact_prefix="$dir/artifacts/$name/")
  [ -f "$dir/dicts/$name.dict" ] && args+=(-dict="$dir/dicts/$name.dict")
  local inputs=("$dir/corpus/$name")
  [ -d "$dir/seeds/$name" ] && inputs+=("$dir/seeds/$name")
  local s0 status=0
  s0=$(date +%s)
  GLIBC_TUNABLES="$run_tunables" "$bin" "${args[@]}" "${inputs[@]}" >"$base.log" 2>&1 || status=$?
  echo "$status $(($(date +%s) - s0))" >"$base.status"
}

# report DIR NAME: prints one target's result; returns 1 if it failed.
report() {
  local dir=$1 name=$2
  local crate_dir base status secs_taken execs rate
  crate_dir="$(dirname "$dir")"
  base="$logs/$(basename "$crate_dir")-$name"
  read -r status secs_taken <"$base.status"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$base.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$base.log" | tail -1)
  total_execs=$((total_execs + ${execs:-0}))
  if [ "$status" = 0 ]; then
    echo "fuzz-smoke: $crate_dir $name: ${execs:-?} executions, ${rate:-?} exec/s, ${secs_taken} s"
    return 0
  fi
  echo "fuzz-smoke: FAILED: $crate_dir $name after ${secs_taken} s (input in $dir/artifacts/$name/, log $base.log)"
  grep -E "panicked|ERROR: libFuzzer|SUMMARY|out-of-memory|Test unit written" "$base.log" | head -10 || true
  tail -30 "$base.log"
  return 1
}

targets=${#runs[@]}
crashes=0
total_execs=0
t0=$(date +%s)
running=0
for run in "${runs[@]}"; do
  read -r dir name bin <<<"$run"
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$dir" "$name" "$bin" &
  running=$((running + 1))
done
wait
run_secs=$(($(date +%s) - t0))
for run in "${runs[@]}"; do
  read -r dir name _ <<<"$run"
  if ! report "$dir" "$name"; then
    crashes=$((crashes + 1))
    failed+=("$(dirname "$dir"):$name")
  fi
done

elapsed=$(($(date +%s) - started))
echo "fuzz-smoke: $targets targets, $total_execs executions, $crashes crashes" \
  "(${secs} s each, ${jobs} at a time, opt-level ${CARGO_PROFILE_RELEASE_OPT_LEVEL}; builds ${build_secs} s, runs ${run_secs} s, total ${elapsed} s)"
if [ "$crashes" -gt 0 ] || [ "$build_failures" -gt 0 ]; then
  echo "fuzz-smoke: failed: ${failed[*]}"
  exit 1
fi
rm -rf "$logs"
