"""Requests given as arrays simulate exactly as the file they came from."""

import numpy as np
import pandas as pd
import tiercache

from conftest import BLOCKS_FORMAT, synthetic

SIZES = [2 << 20, 8 << 20]
POLICIES = ["smq+hotspot", "lru+always", "s3fifo+always"]


def same(a, b):
    pd.testing.assert_frame_equal(a.results, b.results)
    pd.testing.assert_frame_equal(a.opt, b.opt)
    pd.testing.assert_frame_equal(a.mrc, b.mrc)
    assert a.report["configs"] == b.report["configs"]
    assert a.trace == b.trace


def test_dataframe_and_numpy_arrays_equal_the_file(msr_trace):
    path, t = msr_trace
    from_file = tiercache.simulate(path, cache_sizes=SIZES, policies=POLICIES)
    df = tiercache.read_trace(path)
    same(tiercache.simulate(df, cache_sizes=SIZES, policies=POLICIES), from_file)
    arrays = {k: np.asarray(v) for k, v in t.items()}
    same(tiercache.simulate(arrays, cache_sizes=SIZES, policies=POLICIES), from_file)


def test_other_encodings_of_the_same_columns(msr_trace):
    path, t = msr_trace
    base = tiercache.simulate(path, cache_sizes=SIZES, policies=POLICIES)
    codes, _ = pd.factorize(t["volume"])
    alt = {
        "time": (t["time"] + 5_000_000_000).astype(np.uint64),  # absolute times
        "volume": codes + 100,  # any labels, in order of first appearance
        "offset": t["offset"].astype(np.uint64),
        "length": t["length"].astype(np.int32),
        "op": t["op"] == "W",  # booleans: True is a write
    }
    same(tiercache.simulate(alt, cache_sizes=SIZES, policies=POLICIES), base)
    alt["op"] = np.where(alt["op"], "write", "READ")
    same(tiercache.simulate(alt, cache_sizes=SIZES, policies=POLICIES), base)


def test_a_trace_without_volumes_or_timestamps(shared_trace, tmp_path):
    path = shared_trace("arc-P3")
    df = tiercache.read_trace(path, BLOCKS_FORMAT)
    # arc-P3 has no time column (the line number) and no volumes.
    assert list(df.columns) == ["time", "offset", "length", "op"]
    head = tmp_path / "head.csv"
    rows = df.head(30_000)
    head.write_text("".join(f"0,{o},{n},{op}\n" for o, n, op in zip(rows.offset, rows.length, rows.op)))
    notime = tiercache.read_trace(head, "csv:offset=1,len=2,op=3,op_read=R,op_write=W")
    assert list(notime.columns) == ["offset", "length", "op"]
    assert notime.attrs["timestamps"] is False
    a = tiercache.simulate(head, cache_sizes=SIZES, policies=POLICIES,
                           format="csv:offset=1,len=2,op=3,op_read=R,op_write=W")
    same(tiercache.simulate(notime, cache_sizes=SIZES, policies=POLICIES), a)


def test_in_memory_only_synthetic_stream():
    t = synthetic(5_000, 500, seed=3, volumes=1)
    del t["volume"]
    r = tiercache.simulate(t, cache_sizes=[1 << 20], policies=["lru+always"])
    assert r.results.hits[0] + r.results.misses[0] == r.trace["block_refs"] > 5_000
