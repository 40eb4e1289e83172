#!/usr/bin/env bash
# Fleet sizing on Dask against the serial run: `python -m tiercache.fleet`
# over VOLUMES synthetic volumes, one MSR CSV file each (the fleet tests'
# generator, crates/python/tests/conftest.py, at REQUESTS requests per
# volume), timed as
#   serial     --serial (no Dask)
#   processes  --workers N (a LocalCluster of N worker processes)
#   threads    --threads N (a LocalCluster of one in-process worker, N threads)
# Every configuration runs once per round; rounds interleave them (odd
# rounds in reverse order); the summary gives each one's median wall and
# CPU (user + system, children included) and the speed-up against serial,
# and checks that every run wrote the same report.
#
# Environment: VOLUMES (300), REQUESTS (30000; each volume gets 20k-50k
# around it), N (2: workers or threads), ROUNDS (3), SIZES (1M..64M),
# TARGET (0.7), DIR (work directory; default target/fleet-bench, the traces
# kept there between runs). Needs the .venv with the package installed
# (scripts/python-test.sh) and /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."

VOLUMES=${VOLUMES:-300}
REQUESTS=${REQUESTS:-30000}
N=${N:-2}
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-1M..64M}
TARGET=${TARGET:-0.7}
DIR=${DIR:-${CARGO_TARGET_DIR:-target}/fleet-bench}
PY=.venv/bin/python
[ -x "$PY" ] || { echo "bench-fleet: no $PY (run scripts/python-test.sh first)" >&2; exit 1; }

traces="$DIR/traces-$VOLUMES-$REQUESTS"
if [ ! -f "$traces/done" ]; then
  echo "bench-fleet: writing $VOLUMES volumes into $traces"
  rm -rf "$traces" && mkdir -p "$traces"
  "$PY" - "$traces" "$VOLUMES" "$REQUESTS" <<'EOF'
import pathlib
import sys

sys.path.insert(0, "crates/python/tests")
from conftest import synthetic, write_msr  # noqa: E402

out, volumes, requests = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for v in range(volumes):
    n = requests * 2 // 3 + (v * 7919) % requests
    t = synthetic(n, 2_000 + 97 * (v % 50), seed=5000 + v, volumes=1, skew=0.6 + 0.1 * (v % 6))
    t["volume"][:] = f"vol{v},0"
    write_msr(out / f"vol{v}.csv", t)
(out / "done").write_text("")
EOF
fi
mapfile -t files < <(ls "$traces"/vol*.csv | sort -V)
echo "bench-fleet: $(du -sh "$traces" | cut -f1) in ${#files[@]} files, $N workers or threads, $ROUNDS rounds"

configs=(serial processes threads)
declare -A opts=([serial]="--serial" [processes]="--workers $N" [threads]="--threads $N")
results="$DIR/results.txt"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
  order=("${configs[@]}")
  if [ $((round % 2)) -eq 0 ]; then order=(threads processes serial); fi
  for c in "${order[@]}"; do
    # shellcheck disable=SC2086
    /usr/bin/time -f "%e %U %S" -o "$DIR/time.txt" \
      "$PY" -m tiercache.fleet "${files[@]}" --cache-sizes "$SIZES" --target "$TARGET" \
      ${opts[$c]} --out "$DIR/report-$c.json" >/dev/null 2>"$DIR/stderr-$c.txt" ||
      { cat "$DIR/stderr-$c.txt" >&2; exit 1; }
    read -r wall user sys <"$DIR/time.txt"
    echo "$c $wall $user $sys" >>"$results"
    echo "round $round: $c: wall $wall s, CPU $(echo "$user + $sys" | bc) s"
  done
  for c in processes threads; do
    cmp -s "$DIR/report-serial.json" "$DIR/report-$c.json" ||
      { echo "bench-fleet: $c's report differs from the serial one" >&2; exit 1; }
  done
done

"$PY" - "$results" <<'EOF'
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    c, wall, user, sys_ = line.split()
    runs.setdefault(c, []).append((float(wall), float(user) + float(sys_)))
serial = statistics.median(w for w, _ in runs["serial"])
print("| run | wall (median) | CPU (median) | speed-up |")
print("|---|---:|---:|---:|")
for c, rs in runs.items():
    wall = statistics.median(w for w, _ in rs)
    cpu = statistics.median(u for _, u in rs)
    print(f"| {c} | {wall:.1f} s | {cpu:.1f} s | {serial / wall:.2f}x |")
EOF
echo "bench-fleet: reports identical"
