#!/usr/bin/env bash
# Runs every cargo-fuzz target of the project for a short while (default 10 s
# each; FUZZ_SECONDS overrides). A crash fails the script and leaves the input
# in crates/<crate>/fuzz/artifacts/<target>/. Long runs by hand:
#   FUZZ_SECONDS=3600 scripts/fuzz-smoke.sh
# Needs the nightly toolchain and cargo-fuzz (installed here from crates.io if
# missing). Where no nightly toolchain exists it says so and exits 0, because
# the decoders are also covered by stable property tests.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-10}"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz-smoke: SKIPPED: no nightly toolchain (rustup toolchain install nightly)"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz"
  cargo install --locked cargo-fuzz >/dev/null
fi
status=0
for dir in crates/*/fuzz; do
  [ -d "$dir/fuzz_targets" ] || continue
  crate_dir="$(dirname "$dir")"
  for t in "$dir"/fuzz_targets/*.rs; do
    name="$(basename "$t" .rs)"
    echo "fuzz-smoke: $crate_dir $name for ${secs}s"
    mkdir -p "$dir/corpus/$name"
    if ! (cd "$crate_dir" && cargo +nightly fuzz run "$name" -- -max_total_time="$secs" -print_final_stats=1 2>"/tmp/fuzz-$name.log"); then
      echo "fuzz-smoke: FAILED: $crate_dir $name (see $dir/artifacts/$name, log /tmp/fuzz-$name.log)"
      tail -30 "/tmp/fuzz-$name.log"
      status=1
    else
      grep -E "stat::number_of_executed_units|stat::average_exec_per_sec" "/tmp/fuzz-$name.log" | tr '\n' ' '
      echo
    fi
  done
done
exit $status
