"""The Python package and `tiercache sim` give identical numbers: the same
hits, misses and ratios per policy and cache size, the same OPT and MRC."""

import json
import subprocess

import pytest
import tiercache

from conftest import BLOCKS_FORMAT


def cli_report(cli, tmp_path, path, sizes, fmt=None, policies=None, extra=()):
    out = tmp_path / "cli.json"
    cmd = [cli, "sim", "--trace", str(path), "--cache-sizes", sizes, "--json", str(out), *extra]
    if fmt:
        cmd += ["--format", fmt]
    if policies:
        cmd += ["--policies", ",".join(policies)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def assert_identical(cli, r):
    assert len(r.results) == len(cli["configs"])
    for row, c in zip(r.results.itertuples(), cli["configs"]):
        k = c["counters"]
        assert (row.policy, row.cache_bytes) == (c["policy"], c["cache_bytes"])
        assert row.hits == k["read_hits"] + k["write_hits"]
        assert row.misses == k["read_misses"] + k["write_misses"]
        assert row.hit_ratio == (k["read_hits"] + k["write_hits"]) / (
            k["read_hits"] + k["write_hits"] + k["read_misses"] + k["write_misses"]
        )
        assert row.miss_ratio == c["miss_ratio"]
        assert row.read_hit_ratio == c["read_hit_ratio"]
        assert row.write_hit_ratio == c["write_hit_ratio"]
        assert row.iops == c["iops"]
    assert r.report["configs"] == cli["configs"]
    assert r.report["opt"] == cli["opt"]
    assert r.report["mrc"]["at_sizes"] == cli["mrc"]["at_sizes"]
    assert r.report["trace"] == cli["trace"]


def test_generated_trace_every_default_policy(cli, tmp_path, msr_trace):
    path, _ = msr_trace
    c = cli_report(cli, tmp_path, path, "2M,8M,32M")
    r = tiercache.simulate(path, cache_sizes="2M,8M,32M")
    assert_identical(c, r)


@pytest.mark.parametrize("mode", ["writethrough", "writeback"])
def test_shared_tencent_trace(cli, tmp_path, shared_trace, mode):
    path = shared_trace("tencent-cbs-sample")
    policies = ["smq+hotspot", "lru+always", "s3fifo+always", "arc+always"]
    c = cli_report(cli, tmp_path, path, "64M,256M", BLOCKS_FORMAT, policies,
                   ["--mode", mode, "--shards", "0.1"])
    r = tiercache.simulate(path, cache_sizes=[64 << 20, 256 << 20], policies=policies,
                           format=BLOCKS_FORMAT, mode=mode, sampling=0.1)
    assert_identical(c, r)
    assert c["trace"]["requests"] == 50_000
