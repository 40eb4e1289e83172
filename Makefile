# The two commands a new user needs:
#   make run    runs the main job (the field-study benchmark, scaled to this machine)
#   make test   runs every test
# Both install what they need first (Rust toolchain components, Debian packages).

CARGO ?= cargo

.PHONY: run test deps lint unit python fuzz vmlab anchors anchors-pool

run: deps
	$(CARGO) run --release -p tiercache -- bench

test: deps lint unit python fuzz vmlab

# The tests run release builds with overflow checks on, which the release
# profile otherwise leaves off: an arithmetic overflow fails the test that
# reaches it instead of wrapping silently (a pool's countdown once wrapped
# this way and no test saw it). `make run` and the benchmarks keep the plain
# release profile, so after `make test` they build once more.
test lint unit python fuzz vmlab: export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS = true

deps:
	./scripts/install-deps.sh
	rustup component add rustfmt clippy >/dev/null 2>&1 || true

# The docs are built in the release profile too, so they reuse the
# dependencies clippy has just checked (in the dev profile they were checked
# again: 110 s against 36 s).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --workspace --no-deps --quiet

# Every tool a test needs is installed by `deps`, so under `make test` a test
# that finds one missing fails instead of skipping (crates/testkit).
# `cargo test --workspace --release` (scripts/unit-test.sh: the test
# binaries two at a time, 235 s -> 130 s, UNIT_JOBS=1 for one at a time;
# the slowest binaries listed after the run).
unit:
	TIERCACHE_REQUIRE_TOOLS=1 CARGO="$(CARGO)" ./scripts/unit-test.sh

# The Python package (crates/python): its abi3 wheel built by maturin and
# installed into .venv, then pytest, which compares it with the CLI.
python:
	TIERCACHE_REQUIRE_TOOLS=1 CARGO="$(CARGO)" ./scripts/python-test.sh

# Every fuzz target for a short while: 5 s each under `make test` (its
# budget is 30 minutes in all), FUZZ_SECONDS=3600 for a long run.
fuzz:
	FUZZ_SECONDS="$${FUZZ_SECONDS:-5}" ./scripts/fuzz-smoke.sh

# tiercache as a kernel block device (NBD, ublk) in a qemu guest; the guest
# image is built once and cached (see vmlab/ and the README).
vmlab:
	CARGO="$(CARGO)" ./vmlab/test.sh

# A benchmark, not a test: bcache, lvmcache and tiercache (NBD and ublk)
# side by side in one qemu guest, with plots (about 25 minutes).
anchors:
	CARGO="$(CARGO)" ./vmlab/anchors.sh

# A benchmark, not a test: a pool of 4 volumes on throttled HDDs behind one
# SSD, bcache (one cache set) against tiercache over ublk (one pool), three
# interleaved rounds (about 15 minutes; docs/BENCHMARKS.md).
anchors-pool:
	CARGO="$(CARGO)" ./vmlab/anchors.sh --pool
