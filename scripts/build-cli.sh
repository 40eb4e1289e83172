#!/usr/bin/env bash
# Builds the release CLI, ${CARGO_TARGET_DIR:-target}/release/tiercache,
# exactly as `make unit` does: `cargo test --workspace --release --no-run`
# (which also builds every test binary; under `make test` they are built
# already and this takes a second). A plain `cargo build -p tiercache`
# resolves the dependencies' features without the workspace's
# dev-dependencies (rand_distr turns on num-traits' `libm`, tempfile
# rustix's defaults), so after the tests it rebuilt those crates and
# everything above them into another binary of the same code: 80 s of
# `make test` on two cores. Extra arguments go to cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${CARGO:-cargo}" test --workspace --release --no-run --quiet "$@"
