"""Results come back as DataFrames with the documented columns."""

import numpy as np
import pandas as pd
import tiercache

RESULT_COLUMNS = [
    "policy", "cache_bytes", "cache_blocks", "hits", "misses", "hit_ratio", "miss_ratio",
    "read_hits", "read_misses", "write_hits", "write_misses", "read_hit_ratio",
    "write_hit_ratio", "warm_hit_ratio", "first_touch_misses", "promotions", "demotions",
    "writebacks", "bypassed_bytes", "mean_us", "p99_us", "iops", "iops_limited_by", "error",
]


def test_read_trace_gives_the_files_requests(msr_trace):
    path, t = msr_trace
    df = tiercache.read_trace(path)
    assert list(df.columns) == ["time", "volume", "offset", "length", "op"]
    assert df.attrs == {"format": "msr", "timestamps": True}
    assert len(df) == len(t["offset"])
    np.testing.assert_array_equal(df["time"], t["time"])
    np.testing.assert_array_equal(df["volume"], t["volume"])
    np.testing.assert_array_equal(df["offset"], t["offset"])
    np.testing.assert_array_equal(df["length"], t["length"])
    np.testing.assert_array_equal(df["op"], t["op"])


def test_simulate_gives_a_row_per_policy_and_size(msr_trace):
    path, _ = msr_trace
    r = tiercache.simulate(path, cache_sizes="4M,16M", policies=["lru+always", "s3fifo+always"])
    assert list(r.results.columns) == RESULT_COLUMNS
    assert list(zip(r.results.policy, r.results.cache_bytes)) == [
        ("lru+always", 4 << 20), ("s3fifo+always", 4 << 20),
        ("lru+always", 16 << 20), ("s3fifo+always", 16 << 20),
    ]
    assert (r.results.hits + r.results.misses == r.trace["block_refs"]).all()
    assert r.results.error.isna().all()
    assert list(r.opt.columns) == [
        "variant", "cache_bytes", "cache_blocks", "misses", "miss_ratio", "hit_ratio",
        "first_touch_misses", "warm_hit_ratio",
    ]
    assert list(r.opt.cache_bytes) == [4 << 20, 16 << 20]
    # OPT is a bound: no policy misses less.
    for size, best in zip(r.opt.cache_bytes, r.opt.misses):
        assert (r.results[r.results.cache_bytes == size].misses >= best).all()
    assert list(r.mrc.columns) == ["cache_bytes", "miss_ratio"]
    assert len(r.mrc) > 10 and r.mrc.cache_bytes.is_monotonic_increasing
    assert r.mrc.miss_ratio.is_monotonic_decreasing


def test_default_policies_are_the_clis(msr_trace):
    path, _ = msr_trace
    r = tiercache.simulate(path, cache_sizes=[8 << 20], opt=None)
    assert list(r.results.policy) == tiercache.default_policies()
    assert r.opt.empty


def test_opt_and_mrc_alone(msr_trace):
    path, _ = msr_trace
    o = tiercache.opt(path, cache_sizes=[4 << 20, 16 << 20])
    full = tiercache.simulate(path, cache_sizes=[4 << 20, 16 << 20], policies=[]).opt
    pd.testing.assert_frame_equal(o, full)
    demand = tiercache.opt(path, cache_sizes=[4 << 20, 16 << 20], variant="demand")
    assert (demand.misses >= o.misses).all()
    m = tiercache.mrc(path, cache_sizes=[4 << 20, 16 << 20])
    assert list(m.cache_bytes) == [4 << 20, 16 << 20]
    assert m.attrs["method"] == "exact"
    # OPT never misses more than LRU.
    assert (o.miss_ratio.to_numpy() <= m.miss_ratio.to_numpy() + 1e-12).all()
