#!/usr/bin/env bash
# Installs the Python packages the simulator's golden tests and benchmarks
# use (libcachesim, the reference cache simulator) into a project venv at
# .venv (never the system Python). Idempotent: does nothing when .venv
# already imports them. The venv is kept out of git by .venv/.gitignore.
#
#   scripts/install-py-deps.sh          # then: .venv/bin/python -c 'import libcachesim'
set -euo pipefail
cd "$(dirname "$0")/.."
LIBCACHESIM_VERSION="${LIBCACHESIM_VERSION:-0.3.5}"
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "install-py-deps: $PY not found; install python3 (and python3-venv)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "install-py-deps: creating .venv"
  "$PY" -m venv .venv
fi
# Keep the venv out of git whatever the root .gitignore says.
[ -f .venv/.gitignore ] || echo '*' > .venv/.gitignore
if .venv/bin/python -c "import libcachesim, sys; sys.exit(0 if libcachesim.__version__ == '$LIBCACHESIM_VERSION' else 1)" 2>/dev/null; then
  echo "install-py-deps: libcachesim $LIBCACHESIM_VERSION present in .venv"
  exit 0
fi
echo "install-py-deps: installing libcachesim==$LIBCACHESIM_VERSION into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check "libcachesim==$LIBCACHESIM_VERSION"
.venv/bin/python -c "import libcachesim; print('install-py-deps: libcachesim', libcachesim.__version__)"
