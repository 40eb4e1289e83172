#!/usr/bin/env bash
# Regenerates the simulator's golden miss counts with libCacheSim:
# crates/sim/tests/golden/expected.json from the committed request streams
# (crates/sim/tests/golden/*.txt). Pass --streams to regenerate the streams
# too. Installs libcachesim into .venv first (scripts/python-deps.sh).
# Then: cargo test --release -p tiercache-sim --test golden
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/python-deps.sh
exec .venv/bin/python crates/sim/tests/golden/regen.py "$@"
