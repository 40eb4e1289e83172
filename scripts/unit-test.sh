#!/usr/bin/env bash
# The workspace's tests (`make unit`): what `cargo test --workspace
# --release` runs, with the test binaries two at a time.
#
# cargo runs one test binary after another, and many of ours spend most of
# their time waiting (real servers, the HDD model's sleeps, kill -9 rounds):
# run one by one they kept the two cores less than half busy. Here cargo
# builds them (`--no-run`), then they run UNIT_JOBS at a time (default 2,
# at most 2; 1 runs them as cargo does), each as cargo would run it: from its
# package's directory, with CARGO_MANIFEST_DIR and CARGO_PKG_NAME set, and
# the arguments given to this script, which are libtest's (what follows
# `--` for cargo test: a test name filter, --nocapture, ...). Each
# binary's output is printed whole when it ends, in cargo's format
# ("Running ...", then the libtest report), so logs do not interleave;
# then the five slowest binaries. The doc tests run last (`cargo test
# --doc`). Exits non-zero if any binary or the doc tests failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CARGO="${CARGO:-cargo}"

list="$(mktemp)"
logs="$(mktemp -d "${TMPDIR:-/tmp}/unit-test.XXXXXX")"
trap 'rm -rf "$list" "$logs"' EXIT

# One line per test binary: "<executable> <package dir> <manifest> <source path>".
if ! $CARGO test --workspace --release --no-run --message-format=json-render-diagnostics |
  python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m["profile"]["test"]:
        continue
    pkg_dir = os.path.dirname(m["manifest_path"])
    src = os.path.relpath(m["target"]["src_path"], pkg_dir)
    print(m["executable"], pkg_dir, m["manifest_path"], src)
' >"$list"; then
  echo "unit-test: the build failed" >&2
  exit 101
fi

# Two at a time: 235 s -> 130 s on a clean clone. A test that counts
# threads must count only its own kind: libtest starts a test's thread
# whenever another ends, and under the other binary's load that happens at
# any point of a test (crates/nbd/tests/limits.rs counted them once).
jobs="${UNIT_JOBS:-2}"
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
[ "$jobs" -le 2 ] || jobs=2

# run_binary I EXE DIR MANIFEST SRC: one test binary; its output in
# $logs/I.log, "<status> <seconds>" in $logs/I.status.
run_binary() {
  local i=$1 exe=$2 dir=$3 manifest=$4 src=$5
  shift 5
  local pkg status=0 t0
  pkg=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$manifest" | head -n 1)
  t0=$(date +%s)
  {
    echo "     Running ${src} (${exe#"$PWD"/})"
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" "$exe" "$@") 2>&1
  } >"$logs/$i.log" || status=$?
  echo "$status $(($(date +%s) - t0))" >"$logs/$i.status"
}

# The slowest binaries (10-40 s each, mostly waiting) start first, so that
# the two lanes end together; the rest in cargo's order.
slow="${UNIT_SLOW_FIRST:-tests/tiny_run.rs tests/faults.rs tests/pool_run.rs tests/soak.rs tests/bench_cli.rs tests/concurrent.rs tests/sim.rs}"
binaries=()
for s in $slow; do
  while read -r line; do binaries+=("$line"); done < <(grep " $s\$" "$list")
done
while read -r line; do
  case " $slow " in *" ${line##* } "*) ;; *) binaries+=("$line") ;; esac
done <"$list"
running=0
i=0
t0=$(date +%s)
for b in "${binaries[@]}"; do
  read -r exe dir manifest src <<<"$b"
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_binary "$i" "$exe" "$dir" "$manifest" "$src" "$@" &
  running=$((running + 1))
  i=$((i + 1))
done
wait

failed=()
times=()
for ((i = 0; i < ${#binaries[@]}; i++)); do
  cat "$logs/$i.log"
  read -r status secs <"$logs/$i.status"
  read -r exe dir _ src <<<"${binaries[$i]}"
  times+=("$secs s $(basename "$dir")/$src")
  [ "$status" = 0 ] || failed+=("$(basename "$exe") (status $status)")
done
echo "unit-test: ${#binaries[@]} test binaries, ${jobs} at a time, in $(($(date +%s) - t0)) s; the slowest:"
printf '%s\n' "${times[@]}" | sort -rn | head -n 5 | sed 's/^/  /'

if ! $CARGO test --workspace --release --doc -- "$@"; then
  failed+=("doc tests")
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "unit-test: FAILED: ${failed[*]}" >&2
  exit 101
fi
