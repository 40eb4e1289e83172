"""Fleet sizing: how much cache each host needs for a target hit ratio.

Every volume's LRU miss-ratio curve is computed as its own task on Dask
``distributed`` (by default an embedded LocalCluster of one in-process worker
with a thread per core, ``--workers N`` for N worker processes instead,
``--scheduler ADDRESS`` for a running cluster, ``--serial`` for none), each
task running the simulator's MRC (``tiercache.mrc``) on that volume alone.
The report is then put together here:

- per volume: the hit ratio at every size of the grid, its block references,
  and the smallest grid size whose hit ratio reaches the target (the largest
  size, flagged unreachable, when none does: cold misses bound every cache);
- per host: each volume gets its own share of the host's cache (a
  partitioned cache), so the host needs the sum of its volumes' sizes; its
  hit ratio is its volumes' hit ratios at those sizes weighted by their block
  references;
- the fleet: the sum over hosts.

Run it as ``python -m tiercache.fleet TRACE... --cache-sizes 16M..16G
--target 0.8 [--hosts MAP.csv] [--out report.json]``: every volume of every
trace is a volume of the fleet (a trace without volume names is one volume,
named after its file); ``--hosts`` maps volumes to hosts (lines
``VOLUME,HOST``), a volume it does not name is a host of its own.

The result does not depend on how the tasks are run: the same volumes give
the same report serially, on a LocalCluster or on a remote scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from ._simulate import _sizes
from ._simulate import mrc as _mrc
from ._trace import read_trace


def volume_curve(
    volume: str,
    columns: dict,
    cache_sizes: Sequence[int],
    block_size: int = 4096,
    sampling: Optional[float] = None,
) -> dict:
    """One task: the MRC of one volume's requests (``columns`` as
    ``tiercache.simulate`` takes them) at ``cache_sizes``."""
    m = _mrc(columns, cache_sizes=list(cache_sizes), sampling=sampling, block_size=block_size)
    return {
        "volume": volume,
        "block_refs": int(m.attrs["block_refs"]),
        "hit_ratio": [1.0 - float(x) for x in m.miss_ratio],
    }


def split_volumes(paths: Iterable[str], format: Optional[str] = None) -> list:
    """``(volume name, columns)`` of every volume of every trace, in order
    of first appearance."""
    out = []
    for path in paths:
        df = read_trace(path, format)
        cols = [c for c in ("time", "offset", "length", "op") if c in df.columns]
        if "volume" not in df.columns:
            out.append((os.path.basename(os.fspath(path)), {c: df[c].to_numpy() for c in cols}))
            continue
        for name, g in df.groupby("volume", sort=False):
            out.append((str(name), {c: g[c].to_numpy() for c in cols}))
    return out


def is_url(path: str) -> bool:
    """True for an object URL (``scheme://...``) rather than a file path."""
    return "://" in str(path)


def split_trace(path: str, format: Optional[str] = None) -> list:
    """``split_volumes`` of one trace given by a path or by an object URL
    (anything fsspec opens: ``file://``, ``http(s)://``, ``s3://`` with s3fs
    installed, ...). A URL is copied to a temporary file of the same name
    where this runs (so a volume without a name is still named after its
    file, and a ``.zst`` or ``.gz`` ending still says how it is
    compressed), read, and removed."""
    if not is_url(path):
        return split_volumes([path], format)
    import shutil
    import tempfile

    import fsspec

    name = os.path.basename(str(path).split("://", 1)[1].rstrip("/")) or "trace"
    with tempfile.TemporaryDirectory(prefix="tiercache-fleet-") as tmp:
        local = os.path.join(tmp, name)
        with fsspec.open(str(path), "rb") as src, open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return split_volumes([local], format)


def file_curves(
    path: str,
    cache_sizes: Sequence[int],
    block_size: int = 4096,
    sampling: Optional[float] = None,
    format: Optional[str] = None,
) -> list:
    """One task: the curves of every volume of the trace at ``path`` (a
    path or an object URL), read where the task runs, in order of first
    appearance."""
    return [
        volume_curve(v, c, cache_sizes, block_size, sampling)
        for v, c in split_trace(path, format)
    ]


def run_file_tasks(
    paths: Sequence[str],
    cache_sizes: Sequence[int],
    block_size: int = 4096,
    sampling: Optional[float] = None,
    format: Optional[str] = None,
    client: Any = None,
) -> list:
    """The curves of every volume of every trace, in the order of
    ``split_volumes``: one Dask task per file on ``client`` (the workers
    read the files: paths they can open), serially when it is None."""
    sizes = list(cache_sizes)
    if client is None:
        per_file = [file_curves(p, sizes, block_size, sampling, format) for p in paths]
    else:
        futures = [
            client.submit(file_curves, p, sizes, block_size, sampling, format, pure=False)
            for p in paths
        ]
        per_file = client.gather(futures)
    return [c for curves in per_file for c in curves]


def run_tasks(
    volumes: Sequence[tuple],
    cache_sizes: Sequence[int],
    block_size: int = 4096,
    sampling: Optional[float] = None,
    client: Any = None,
) -> list:
    """The curve of every volume, in the order given: as Dask tasks on
    ``client`` (a ``distributed.Client``), or serially when it is None."""
    sizes = list(cache_sizes)
    if client is None:
        return [volume_curve(v, c, sizes, block_size, sampling) for v, c in volumes]
    futures = [
        client.submit(volume_curve, v, c, sizes, block_size, sampling, pure=False)
        for v, c in volumes
    ]
    return client.gather(futures)


def fleet_report(
    curves: Sequence[dict],
    cache_sizes: Sequence[int],
    target: float,
    hosts: Optional[dict] = None,
) -> dict:
    """The report of the module docs from the volumes' curves: ``volumes``
    and ``hosts`` DataFrames and the ``fleet`` totals (dict)."""
    sizes = list(cache_sizes)
    hosts = hosts or {}
    rows = []
    for c in curves:
        hr = c["hit_ratio"]
        reach = next((i for i, h in enumerate(hr) if h >= target), None)
        i = reach if reach is not None else len(sizes) - 1
        rows.append(
            {
                "volume": c["volume"],
                "host": hosts.get(c["volume"], c["volume"]),
                "block_refs": c["block_refs"],
                "cache_bytes": sizes[i],
                "hit_ratio": hr[i],
                "reaches_target": reach is not None,
                **{f"hit_ratio@{s}": h for s, h in zip(sizes, hr)},
            }
        )
    vols = pd.DataFrame(rows)
    vols["hits"] = vols.hit_ratio * vols.block_refs
    by = vols.groupby("host", sort=False)
    host_df = pd.DataFrame(
        {
            "volumes": by.size(),
            "block_refs": by.block_refs.sum(),
            "cache_bytes": by.cache_bytes.sum(),
            "hits": by.hits.sum(),
            "all_reach_target": by.reaches_target.all(),
        }
    ).reset_index()
    host_df["hit_ratio"] = np.where(
        host_df.block_refs > 0, host_df.hits / host_df.block_refs.where(host_df.block_refs > 0, 1), 0.0
    )
    host_df = host_df.drop(columns="hits")
    vols = vols.drop(columns="hits")
    refs = int(host_df.block_refs.sum())
    fleet = {
        "target_hit_ratio": target,
        "volumes": int(len(vols)),
        "hosts": int(len(host_df)),
        "cache_bytes": int(host_df.cache_bytes.sum()),
        "block_refs": refs,
        "hit_ratio": float((host_df.hit_ratio * host_df.block_refs).sum() / refs) if refs else 0.0,
        "volumes_below_target": int((~vols.reaches_target).sum()),
    }
    return {"volumes": vols, "hosts": host_df, "fleet": fleet}


def read_hosts(path: Optional[str]) -> dict:
    """Volume -> host from lines ``VOLUME,HOST`` (the host is after the
    last comma, so volume names such as MSR's ``hm,0`` need no quoting);
    blank lines and lines starting with ``#`` are skipped."""
    if path is None:
        return {}
    hosts = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            volume, sep, host = line.rpartition(",")
            if not sep or not volume.strip() or not host.strip():
                raise ValueError(f"{path}:{n}: expected VOLUME,HOST")
            hosts[volume.strip()] = host.strip()
    return hosts


def _client(args):
    """(client, cluster) for the arguments; (None, None) for --serial."""
    if args.serial:
        return None, None
    from distributed import Client, LocalCluster

    if args.scheduler:
        return Client(args.scheduler), None
    if args.workers is None:
        # One worker in this process: no worker start-up, nothing pickled.
        # The simulator releases the GIL while it parses and replays, so
        # the threads run the tasks in parallel.
        threads = args.threads or os.cpu_count() or 1
        cluster = LocalCluster(
            n_workers=1, threads_per_worker=threads, processes=False, dashboard_address=None
        )
    else:
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    return Client(cluster), cluster


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tiercache.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "traces",
        nargs="+",
        help="trace files or object URLs (file://, http(s)://, s3://, ...; any format tiercache sim reads)",
    )
    p.add_argument("--format", help="trace format, as tiercache sim --format (default: detect)")
    p.add_argument("--cache-sizes", default="16M..16G", help="size grid, e.g. 16M..16G or 1G,4G")
    p.add_argument("--target", type=float, default=0.8, help="target hit ratio (0..1)")
    p.add_argument("--hosts", help="file of VOLUME,HOST lines")
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--sampling", type=float, help="SHARDS rate (default: exact)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="address of a running Dask scheduler")
    g.add_argument("--serial", action="store_true", help="no Dask: one volume after another")
    p.add_argument("--workers", type=int, help="a LocalCluster of this many worker processes")
    p.add_argument(
        "--threads",
        type=int,
        help="threads of the default LocalCluster's one in-process worker (default: one per core)",
    )
    p.add_argument("--out", help="write the report as JSON here")
    args = p.parse_args(argv)
    if args.threads is not None and (args.threads < 1 or args.serial or args.scheduler or args.workers):
        p.error("--threads: expected a number of threads >= 1, without --serial, --scheduler or --workers")
    if args.workers is not None and (args.workers < 1 or args.serial or args.scheduler):
        p.error("--workers: expected a number of processes >= 1, without --serial or --scheduler")
    if not 0.0 < args.target <= 1.0:
        p.error(f"--target {args.target}: expected a hit ratio in (0, 1]")
    sizes = _sizes(args.cache_sizes)
    # Several files: one task per file, read by the worker that runs it (the
    # parsing is most of the work). One file: read here, one task per volume.
    volumes = split_trace(args.traces[0], args.format) if len(args.traces) == 1 else None
    client, cluster = _client(args)
    try:
        if volumes is None:
            curves = run_file_tasks(
                args.traces, sizes, args.block_size, args.sampling, args.format, client
            )
        else:
            curves = run_tasks(volumes, sizes, args.block_size, args.sampling, client)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    rep = fleet_report(curves, sizes, args.target, read_hosts(args.hosts))
    f = rep["fleet"]
    print(rep["hosts"].to_string(index=False))
    print(
        f"fleet: {f['hosts']} hosts, {f['volumes']} volumes, {f['cache_bytes']} bytes of cache "
        f"for a hit ratio of {f['hit_ratio']:.4f} (target {f['target_hit_ratio']}); "
        f"{f['volumes_below_target']} volumes cannot reach the target within the grid"
    )
    if args.out:
        with open(args.out, "w") as out:
            json.dump(
                {
                    "cache_sizes": sizes,
                    "fleet": f,
                    "hosts": rep["hosts"].to_dict(orient="records"),
                    "volumes": rep["volumes"].to_dict(orient="records"),
                },
                out,
                indent=1,
                default=lambda x: x.item() if hasattr(x, "item") else str(x),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
