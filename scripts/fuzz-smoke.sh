#!/usr/bin/env bash
# Runs every cargo-fuzz target of the project (crates/*/fuzz) for a short
# while: FUZZ_SECONDS each (default 10). A crash, hang (-timeout) or
# out-of-memory fails the script and leaves the input in
# crates/<crate>/fuzz/artifacts/<target>/. Long runs by hand:
#   FUZZ_SECONDS=3600 scripts/fuzz-smoke.sh
#   FUZZ_TARGETS="blkparse msr" FUZZ_SECONDS=600 scripts/fuzz-smoke.sh
#
# Toolchain: nightly when rustup has it; else the default (stable) toolchain
# with RUSTC_BOOTSTRAP=1, which lets a stable rustc accept the -Z flags
# cargo-fuzz passes (sanitizer, coverage instrumentation). FUZZ_TOOLCHAIN=
# nightly|stable forces one. cargo-fuzz itself is installed from crates.io
# when missing.
#
# Each fuzz crate is built once (`cargo fuzz build`), then its targets' binaries
# run directly, so nothing is rebuilt per target. Sanitizer: address, unless
# the fuzz crate's Cargo.toml says `sanitizer = "none"` in
# [package.metadata.fuzz-smoke] (for crates without unsafe code, where ASan
# finds nothing and costs most of the speed); if an address-sanitizer build
# fails on this toolchain the crate is built with -s none instead. Builds go
# to $FUZZ_TARGET_DIR (default <CARGO_TARGET_DIR or ./target>/fuzz-<sanitizer>).
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
# Targets built without a sanitizer use glibc's malloc, which by default
# returns each freed 256 KiB reader buffer to the kernel and page-faults it
# back in on the next input: keeping freed memory makes them ~5x faster.
# (ASan's allocator ignores this.) Set for the fuzz runs only.
run_tunables="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432"
logs="${TMPDIR:-/tmp}/fuzz-smoke"
mkdir -p "$logs"

targets=0
crashes=0
build_failures=0
total_execs=0
build_secs=0
failed=()
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
  build_log="$logs/build-$(basename "$crate_dir").log"
  t0=$(date +%s)
  # Sets bin_dir; returns cargo-fuzz's status.
  build() {
    local tdir="${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}/fuzz-$sanitizer}"
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
    targets=$((targets + 1))
    mkdir -p "$dir/corpus/$name" "$dir/artifacts/$name"
    args=(-max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
      -artifact_prefix="$dir/artifacts/$name/")
    [ -f "$dir/dicts/$name.dict" ] && args+=(-dict="$dir/dicts/$name.dict")
    inputs=("$dir/corpus/$name")
    [ -d "$dir/seeds/$name" ] && inputs+=("$dir/seeds/$name")
    log="$logs/$(basename "$crate_dir")-$name.log"
    s0=$(date +%s)
    if GLIBC_TUNABLES="$run_tunables" "$bin_dir/$name" "${args[@]}" "${inputs[@]}" >"$log" 2>&1; then
      ok=1
    else
      ok=0
    fi
    s1=$(date +%s)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    total_execs=$((total_execs + ${execs:-0}))
    if [ "$ok" = 1 ]; then
      echo "fuzz-smoke: $crate_dir $name: ${execs:-?} executions, ${rate:-?} exec/s, $((s1 - s0)) s"
    else
      crashes=$((crashes + 1))
      failed+=("$crate_dir:$name")
      echo "fuzz-smoke: FAILED: $crate_dir $name after $((s1 - s0)) s (input in $dir/artifacts/$name/, log $log)"
      grep -E "panicked|ERROR: libFuzzer|SUMMARY|out-of-memory|Test unit written" "$log" | head -10 || true
      tail -30 "$log"
    fi
  done
done

elapsed=$(($(date +%s) - started))
echo "fuzz-smoke: $targets targets, $total_execs executions, $crashes crashes" \
  "(${secs} s each; builds ${build_secs} s, total ${elapsed} s)"
if [ "$crashes" -gt 0 ] || [ "$build_failures" -gt 0 ]; then
  echo "fuzz-smoke: failed: ${failed[*]}"
  exit 1
fi
