#!/usr/bin/env bash
# Builds the tiercache Python package (crates/python) as an abi3 wheel with
# maturin into target/wheels, installs it into .venv, builds the CLI the
# tests compare against, and runs pytest on crates/python/tests. Extra
# arguments go to pytest (e.g. -k mrc). Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
target="${CARGO_TARGET_DIR:-target}"
scripts/python-deps.sh
CARGO="$CARGO" scripts/build-cli.sh
rm -f "$target"/wheels/tiercache-*.whl
.venv/bin/maturin build --release --quiet -i .venv/bin/python \
  -m crates/python/Cargo.toml --out "$target/wheels"
wheel="$(ls "$target"/wheels/tiercache-*-abi3-*.whl)"
echo "python-test: installing $wheel"
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  --force-reinstall --no-deps "$wheel"
export TIERCACHE_BIN="$PWD/$target/release/tiercache"
case "$target" in /*) TIERCACHE_BIN="$target/release/tiercache" ;; esac
exec .venv/bin/python -m pytest -q -p no:cacheprovider crates/python/tests "$@"
