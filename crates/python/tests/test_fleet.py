"""Fleet sizing on Dask: a LocalCluster of worker processes, or of one
in-process worker with several threads, gives the same report as the
serial run."""

import json

import numpy as np
import pytest
import tiercache.fleet as fleet

from conftest import synthetic, write_msr

VOLUMES = 300
HOSTS = 12


@pytest.fixture(scope="module")
def fleet_trace(tmp_path_factory):
    """One MSR file with 300 small volumes of different sizes and skews,
    and a host map putting them on 12 hosts."""
    d = tmp_path_factory.mktemp("fleet")
    parts = []
    for v in range(VOLUMES):
        t = synthetic(200 + 7 * v, 50 + 13 * (v % 40), seed=1000 + v, volumes=1,
                      skew=0.6 + 0.1 * (v % 6))
        t["volume"] = np.full(len(t["offset"]), f"vol{v},{v % 3}", dtype=object)
        parts.append(t)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(merged["time"], kind="stable")
    merged = {k: v[order] for k, v in merged.items()}
    path = write_msr(d / "fleet.csv", merged)
    hosts = d / "hosts.csv"
    hosts.write_text("".join(f"vol{v},{v % 3},host{v % HOSTS}\n" for v in range(VOLUMES)))
    return path, hosts


def run(tmp_path, trace, hosts, *mode):
    out = tmp_path / f"report{len(mode)}{'-'.join(mode)}.json"
    assert fleet.main([str(trace), "--hosts", str(hosts), "--cache-sizes", "64K..8M",
                       "--target", "0.7", "--out", str(out), *mode]) == 0
    return json.loads(out.read_text())


def test_local_cluster_equals_serial(tmp_path, fleet_trace):
    trace, hosts = fleet_trace
    serial = run(tmp_path, trace, hosts, "--serial")
    dask = run(tmp_path, trace, hosts, "--workers", "3")
    assert dask == serial
    assert run(tmp_path, trace, hosts) == serial  # the default: one worker, a thread per core
    assert run(tmp_path, trace, hosts, "--threads", "3") == serial
    f = serial["fleet"]
    assert (f["volumes"], f["hosts"]) == (VOLUMES, HOSTS)
    assert f["cache_bytes"] == sum(h["cache_bytes"] for h in serial["hosts"])
    assert f["cache_bytes"] == sum(v["cache_bytes"] for v in serial["volumes"])
    # Every volume that reaches the target does so at its chosen size and not
    # at the size below it.
    sizes = serial["cache_sizes"]
    for v in serial["volumes"]:
        i = sizes.index(v["cache_bytes"])
        if v["reaches_target"]:
            assert v["hit_ratio"] >= 0.7
            assert i == 0 or v[f"hit_ratio@{sizes[i - 1]}"] < 0.7
        else:
            assert i == len(sizes) - 1 and v["hit_ratio"] < 0.7
    assert 0 < f["volumes_below_target"] < VOLUMES


def test_several_files_are_read_by_the_workers_and_give_the_same_report(tmp_path, fleet_trace):
    """Three files of 100 volumes each: one task per file (the workers read
    them); the report equals the serial one and, volume for volume, the
    one of the same requests in one file."""
    trace, hosts = fleet_trace
    lines = trace.read_text().splitlines(keepends=True)
    files = []
    for part in range(3):
        f = tmp_path / f"part{part}.csv"
        # Volume vN is in part N % 3 (its name is "volN,disk").
        f.write_text("".join(l for l in lines if int(l.split(",")[1][3:]) % 3 == part))
        files.append(f)

    def report(*mode, names=files):
        out = tmp_path / f"files{'-'.join(mode)}{len(str(names[0]))}.json"
        assert fleet.main([*map(str, names), "--hosts", str(hosts), "--cache-sizes", "64K..8M",
                           "--target", "0.7", "--out", str(out), *mode]) == 0
        return json.loads(out.read_text())

    serial = report("--serial")
    assert report("--workers", "3") == serial
    assert report() == serial
    # As object URLs, each worker fetches its own (no shared file system).
    urls = [f.as_uri() for f in files]
    assert report("--workers", "3", names=urls) == serial
    one_file = run(tmp_path, trace, hosts, "--serial")
    by_name = lambda rep: sorted(rep["volumes"], key=lambda v: v["volume"])
    assert by_name(serial) == by_name(one_file)
    assert serial["fleet"] == one_file["fleet"]


def test_a_trace_by_url_is_named_and_read_as_its_file(tmp_path, msr_trace):
    path, _ = msr_trace
    plain = fleet.split_trace(str(path))
    by_url = fleet.split_trace(path.as_uri())
    assert [v for v, _ in by_url] == [v for v, _ in plain]
    for (_, a), (_, b) in zip(plain, by_url):
        assert all((a[k] == b[k]).all() for k in a)
    with pytest.raises(FileNotFoundError):
        fleet.split_trace((tmp_path / "missing.csv").as_uri())


def test_curves_are_the_volumes_own(fleet_trace):
    trace, _ = fleet_trace
    vols = fleet.split_volumes([str(trace)])
    assert sorted(v for v, _ in vols) == sorted(f"vol{v},{v % 3}" for v in range(VOLUMES))
    name, cols = vols[5]
    c = fleet.volume_curve(name, cols, [1 << 20])
    assert c["block_refs"] > len(cols["offset"])
    m = fleet._mrc(cols, cache_sizes=[1 << 20])
    assert c["hit_ratio"] == [1.0 - m.miss_ratio[0]]


def test_bad_hosts_file(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("# volume,host\nvol1,0,hostA\nnohost\n")
    with pytest.raises(ValueError, match="h.csv:3: expected VOLUME,HOST"):
        fleet.read_hosts(str(p))


@pytest.mark.parametrize(
    "options",
    [["--threads", "0"], ["--workers", "0"], ["--workers", "2", "--threads", "2"], ["--serial", "--threads", "2"]],
)
def test_contradictory_cluster_options_are_refused(fleet_trace, options, capsys):
    trace, _ = fleet_trace
    with pytest.raises(SystemExit) as exit:
        fleet.main([str(trace), *options])
    assert exit.value.code == 2
    assert "expected a number of" in capsys.readouterr().err
