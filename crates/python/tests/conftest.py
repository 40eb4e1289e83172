"""Shared by the tests: the CLI binary to compare with, the shared real
traces, and small synthetic traces written by the tests themselves.

Under ``make test`` (TIERCACHE_REQUIRE_TOOLS set) a missing CLI binary or
missing shared traces fail the test instead of skipping it, as
crates/testkit does for the Rust tests."""

import os
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
# The common form of every shared trace (its README).
BLOCKS_FORMAT = "csv:time=0,offset=1,len=2,op=3,op_read=R,op_write=W"


def need(what: str, why: str):
    """Skips, or under `make test` fails, a test that cannot run."""
    if os.environ.get("TIERCACHE_REQUIRE_TOOLS"):
        pytest.fail(f"{what} cannot run: {why} (make test provides it, so this is a failure)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def cli() -> str:
    """The `tiercache` binary scripts/python-test.sh built."""
    path = os.environ.get("TIERCACHE_BIN", str(ROOT / "target" / "release" / "tiercache"))
    if not os.access(path, os.X_OK):
        need("the CLI comparison", f"no tiercache binary at {path} (run scripts/python-test.sh)")
    return path


@pytest.fixture(scope="session")
def shared_trace():
    """Path of a trace in ../shared/traces (the common blocks.csv.zst form)."""

    def get(name: str) -> pathlib.Path:
        p = SHARED_TRACES / name / "blocks.csv.zst"
        if not p.exists():
            need(f"the shared trace {name}", f"{p} is missing")
        return p

    return get


def synthetic(n: int, blocks: int, seed: int, volumes: int = 2, skew: float = 1.1) -> dict:
    """A skewed (Zipf-like) request stream: ``n`` requests over ``blocks``
    4 KiB blocks per volume, a quarter writes, lengths of 1 to 4 KiB
    blocks at block-aligned and unaligned offsets, times 10-110 us apart."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, blocks + 1, dtype=np.float64)
    p = ranks**-skew
    p /= p.sum()
    block = rng.permutation(blocks)[rng.choice(blocks, size=n, p=p)]
    offset = block.astype(np.int64) * 4096 + rng.choice([0, 0, 0, 512], size=n)
    length = rng.integers(1, 5, size=n) * 4096
    op = np.where(rng.random(n) < 0.25, "W", "R")
    time = np.cumsum(rng.integers(10_000, 110_000, size=n)).astype(np.int64)
    volume = np.array([f"hm,{v}" for v in rng.integers(0, volumes, size=n)], dtype=object)
    return {"time": time, "volume": volume, "offset": offset, "length": length, "op": op}


def write_msr(path: pathlib.Path, t: dict) -> pathlib.Path:
    """Writes ``t`` as an MSR Cambridge CSV (Windows filetime timestamps,
    volume ``host,disk``); its first request is at time 0 when read back."""
    start = 128166372000000000
    with open(path, "w") as f:
        for time, vol, off, ln, op in zip(t["time"], t["volume"], t["offset"], t["length"], t["op"]):
            f.write(f"{start + (time - t['time'][0]) // 100},{vol},{'Write' if op == 'W' else 'Read'},{off},{ln},100\n")
    return path


@pytest.fixture(scope="session")
def msr_trace(tmp_path_factory):
    """A synthetic two-volume MSR trace file and the columns it holds."""
    t = synthetic(20_000, 3_000, seed=7)
    # MSR times are in 100 ns units: keep the columns what the file says.
    t["time"] = (t["time"] - t["time"][0]) // 100 * 100
    return write_msr(tmp_path_factory.mktemp("msr") / "trace.csv", t), t
