#!/usr/bin/env bash
# Installs the pinned Python packages that build, test and run the tiercache
# Python package (crates/python/requirements.txt: maturin, pytest, numpy,
# pandas, dask and distributed for tiercache.fleet) into the project venv
# .venv (never the system Python).
# Idempotent: does nothing when .venv already has exactly those pins.
# Called by scripts/install-deps.sh (so by `make deps`).
set -euo pipefail
cd "$(dirname "$0")/.."
req=crates/python/requirements.txt
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
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python-deps: $req present in .venv"
  exit 0
fi
echo "python-deps: installing $req into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
