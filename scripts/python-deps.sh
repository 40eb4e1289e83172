#!/usr/bin/env bash
# Sets up the project venv .venv (never the system Python) with every
# pinned Python package the project uses:
#   - crates/python/requirements.txt: maturin, pytest, numpy, pandas, dask
#     and distributed, to build, test and run the tiercache Python package
#     (scripts/python-test.sh, `make python`);
#   - libcachesim (LIBCACHESIM_VERSION, default below): the reference cache
#     simulator behind the simulator's golden numbers
#     (scripts/regen-golden.sh), crates/policy/tools and the sim_speed
#     benchmark.
# Idempotent: does nothing when .venv already has exactly these pins.
# Called by scripts/install-deps.sh (so by `make deps`), python-test.sh and
# regen-golden.sh. The venv is kept out of git by .venv/.gitignore.
set -euo pipefail
cd "$(dirname "$0")/.."
req=crates/python/requirements.txt
LIBCACHESIM_VERSION="${LIBCACHESIM_VERSION:-0.3.5}"
libcachesim="libcachesim==$LIBCACHESIM_VERSION"
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "python-deps: $PY not found; install python3 (and python3-venv)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "python-deps: creating .venv"
  "$PY" -m venv .venv
fi
# Keep the venv out of git whatever the root .gitignore says.
[ -f .venv/.gitignore ] || echo '*' > .venv/.gitignore
stamp=.venv/.tiercache-python-deps
want="$( (cat "$req"; echo "$libcachesim") | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-deps: $req and $libcachesim present in .venv"
  exit 0
fi
echo "python-deps: installing $req and $libcachesim into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req" "$libcachesim"
.venv/bin/python -c "import libcachesim, maturin, pytest, pandas, dask"
echo "$want" > "$stamp"
