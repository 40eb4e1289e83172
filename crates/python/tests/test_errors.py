"""Bad input raises a Python exception naming the problem, never a crash."""

import numpy as np
import pytest
import tiercache


def test_unknown_policy(msr_trace):
    with pytest.raises(ValueError, match="policy 'nosuch\\+always'"):
        tiercache.simulate(msr_trace[0], cache_sizes=[1 << 20], policies=["nosuch+always"])


@pytest.mark.parametrize("size", [-4096, 0])
def test_non_positive_cache_size(msr_trace, size):
    with pytest.raises(ValueError, match=f"cache_sizes: {size} is not a positive size"):
        tiercache.simulate(msr_trace[0], cache_sizes=[size])


def test_bad_size_string():
    with pytest.raises(ValueError, match="cache sizes '12Q'"):
        tiercache.simulate("x", cache_sizes="12Q")


def test_unreadable_file(tmp_path):
    with pytest.raises(OSError, match="no-such-file"):
        tiercache.simulate(tmp_path / "no-such-file", cache_sizes=[1 << 20])
    with pytest.raises(OSError, match="no-such-file"):
        tiercache.read_trace(tmp_path / "no-such-file")


def test_garbage_file(tmp_path):
    p = tmp_path / "garbage.txt"
    p.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="cannot tell the trace format"):
        tiercache.read_trace(p)
    with pytest.raises(ValueError, match="unknown trace format 'nope'"):
        tiercache.simulate(p, cache_sizes=[1 << 20], format="nope")
    p.write_text("128166372000000000,hm,0,Read,4096,4096,100\n128166372000000000,hm,0,Read,x,4096,100\n")
    with pytest.raises(ValueError, match=":2:"):
        tiercache.simulate(p, cache_sizes=[1 << 20], format="msr")


def test_mismatched_array_lengths():
    cols = {"offset": np.zeros(10, dtype=np.int64), "length": np.full(9, 4096), "op": np.zeros(10, dtype=bool)}
    with pytest.raises(ValueError, match="'length' has 9 values but 'offset' has 10"):
        tiercache.simulate(cols, cache_sizes=[1 << 20])


def test_bad_columns():
    ok = {"offset": np.zeros(3, dtype=np.int64), "length": np.full(3, 4096), "op": np.array(["R", "W", "R"])}
    with pytest.raises(ValueError, match="missing column.*op"):
        tiercache.simulate({"offset": ok["offset"], "length": ok["length"]}, cache_sizes=[1 << 20])
    with pytest.raises(ValueError, match="column 'op': request 1 is 'X'"):
        tiercache.simulate({**ok, "op": np.array(["R", "X", "R"])}, cache_sizes=[1 << 20])
    with pytest.raises(ValueError, match="column 'offset': request 2 is negative"):
        tiercache.simulate({**ok, "offset": np.array([0, 1, -1])}, cache_sizes=[1 << 20])
    with pytest.raises(ValueError, match="column 'length': expected integers"):
        tiercache.simulate({**ok, "length": np.array([1.5, 2, 3])}, cache_sizes=[1 << 20])
    with pytest.raises(ValueError, match="past 1 PiB"):
        tiercache.simulate({**ok, "volume": np.array([1, 2, 1]), "offset": np.array([0, 1 << 50, 0])},
                           cache_sizes=[1 << 20])


def test_bad_options(msr_trace):
    path = msr_trace[0]
    with pytest.raises(ValueError, match="block size 1000 must be a power of two"):
        tiercache.simulate(path, cache_sizes=[1 << 20], block_size=1000)
    with pytest.raises(ValueError, match="sampling: 2 is not a SHARDS rate"):
        tiercache.mrc(path, sampling=2.0)
    with pytest.raises(ValueError, match="opt 'best'"):
        tiercache.opt(path, cache_sizes=[1 << 20], variant="best")
    with pytest.raises(ValueError, match="unknown device"):
        tiercache.simulate(path, cache_sizes=[1 << 20], devices="nvme/floppy")
    with pytest.raises(ValueError, match="mode 'sideways'"):
        tiercache.simulate(path, cache_sizes=[1 << 20], mode="sideways")
    with pytest.raises(ValueError, match="format applies to a trace file"):
        tiercache.simulate({"offset": [0], "length": [1], "op": ["R"]}, cache_sizes=[1 << 20], format="msr")
