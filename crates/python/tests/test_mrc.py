"""SHARDS-sampled miss-ratio curves against the exact one."""

import numpy as np
import pytest
import tiercache

from conftest import synthetic

# 40 sizes from 256 KiB to 4 GiB, whole 4 KiB blocks.
SIZES = [int(x) for x in np.unique(np.geomspace(1 << 18, 4 << 30, 40).astype(np.int64) // 4096 * 4096)]


def errors(skew: float, seed: int, rate: float) -> tuple:
    """(mean, max) absolute difference of SHARDS at ``rate`` from exact on
    1M requests over 300k blocks of a Zipf-like trace."""
    t = synthetic(1_000_000, 300_000, seed=seed, volumes=1, skew=skew)
    del t["volume"]
    exact = tiercache.mrc(t, cache_sizes=SIZES)
    assert exact.attrs["method"] == "exact"
    sampled = tiercache.mrc(t, cache_sizes=SIZES, sampling=rate)
    assert sampled.attrs["method"] == f"SHARDS rate {rate}"
    assert sampled.attrs["tracked_blocks"] < exact.attrs["tracked_blocks"] * rate * 1.5
    d = np.abs(sampled.miss_ratio.to_numpy() - exact.miss_ratio.to_numpy())
    return float(d.mean()), float(d.max())


@pytest.mark.parametrize("rate", [0.1, 0.01])
def test_shards_close_to_exact(rate):
    mean, worst = errors(0.5, 5, rate)
    assert mean < 0.015 and worst < 0.03, (mean, worst)


def test_shards_close_to_exact_on_a_more_skewed_trace():
    mean, worst = errors(0.8, 6, 0.1)
    assert mean < 0.03, (mean, worst)


def test_the_whole_curve():
    t = synthetic(50_000, 5_000, seed=11, volumes=1)
    del t["volume"]
    curve = tiercache.mrc(t, points=50)
    assert 40 <= len(curve) <= 50
    assert curve.cache_bytes.iloc[0] == 4096
    assert curve.miss_ratio.is_monotonic_decreasing
    assert curve.miss_ratio.iloc[0] > curve.miss_ratio.iloc[-1]
