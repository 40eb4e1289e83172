"""Simulation runs: the options of ``tiercache sim`` as keyword arguments,
the simulator's report (the JSON ``tiercache sim --json`` writes) as
DataFrames."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Sequence, Union

import pandas as pd

from . import _tiercache
from ._trace import to_columns

Sizes = Union[str, int, Iterable[int]]


def _sizes(cache_sizes: Optional[Sizes]) -> Optional[list]:
    """Sizes as a list of ints; a string is read as ``tiercache sim
    --cache-sizes`` reads it (``1G,4G`` or ``1G..16G``)."""
    if cache_sizes is None:
        return None
    if isinstance(cache_sizes, str):
        return _tiercache.parse_cache_sizes(cache_sizes)
    if isinstance(cache_sizes, int):
        return [cache_sizes]
    out = []
    for s in cache_sizes:
        if isinstance(s, str):
            out.extend(_tiercache.parse_cache_sizes(s))
        else:
            try:
                out.append(int(s))
            except (TypeError, ValueError):
                raise ValueError(f"cache_sizes: {s!r} is not a size") from None
    return out


def _run(trace: Any, format: Optional[str], options: dict, points: int) -> tuple:
    """Runs the simulator on ``trace``: (report dict, MRC curve)."""
    options = {k: v for k, v in options.items() if v is not None or k == "opt"}
    if isinstance(trace, (str, os.PathLike)):
        text, curve = _tiercache.simulate_file(os.fspath(trace), format, options, points)
    else:
        if format is not None:
            raise ValueError("format applies to a trace file, not to in-memory columns")
        c = to_columns(trace)
        text, curve = _tiercache.simulate_columns(
            "columns", c["time"], c["volume"], c["offset"], c["length"], c["op"], options, points
        )
    return json.loads(text), curve


def _results(report: dict) -> pd.DataFrame:
    """One row per (cache size, policy), in the report's order."""
    rows = []
    for c in report["configs"]:
        k = c["counters"]
        hits = k["read_hits"] + k["write_hits"]
        misses = k["read_misses"] + k["write_misses"]
        warm = c.get("warm")
        lat = c["latency"]
        rows.append(
            {
                "policy": c["policy"],
                "cache_bytes": c["cache_bytes"],
                "cache_blocks": c["cache_blocks"],
                "hits": hits,
                "misses": misses,
                # As the simulator counts: block references, reads and writes.
                "hit_ratio": hits / (hits + misses) if hits + misses else 0.0,
                "miss_ratio": c["miss_ratio"],
                "read_hits": k["read_hits"],
                "read_misses": k["read_misses"],
                "write_hits": k["write_hits"],
                "write_misses": k["write_misses"],
                "read_hit_ratio": c["read_hit_ratio"],
                "write_hit_ratio": c["write_hit_ratio"],
                "warm_hit_ratio": warm["hit_ratio"] if warm else None,
                "first_touch_misses": c["first_touch_misses"],
                "promotions": k["promotions"],
                "demotions": k["demotions"],
                "writebacks": k["writebacks"],
                "bypassed_bytes": k["bypassed_bytes"],
                "mean_us": lat["mean_us"],
                "p99_us": lat["p99_us"],
                "iops": c["iops"],
                "iops_limited_by": c["iops_limited_by"],
                "error": c["error"],
            }
        )
    return pd.DataFrame(rows, columns=_RESULT_COLUMNS)


_RESULT_COLUMNS = [
    "policy", "cache_bytes", "cache_blocks", "hits", "misses", "hit_ratio", "miss_ratio",
    "read_hits", "read_misses", "write_hits", "write_misses", "read_hit_ratio",
    "write_hit_ratio", "warm_hit_ratio", "first_touch_misses", "promotions", "demotions",
    "writebacks", "bypassed_bytes", "mean_us", "p99_us", "iops", "iops_limited_by", "error",
]


def _opt(report: dict) -> pd.DataFrame:
    rows = [
        {
            "variant": o["variant"],
            "cache_bytes": o["cache_bytes"],
            "cache_blocks": o["cache_blocks"],
            "misses": o["misses"],
            "miss_ratio": o["miss_ratio"],
            "hit_ratio": 1.0 - o["miss_ratio"],
            "first_touch_misses": o["first_touch_misses"],
            "warm_hit_ratio": o["warm"]["hit_ratio"] if o.get("warm") else None,
        }
        for o in report["opt"]
    ]
    return pd.DataFrame(
        rows,
        columns=["variant", "cache_bytes", "cache_blocks", "misses", "miss_ratio",
                 "hit_ratio", "first_touch_misses", "warm_hit_ratio"],
    )


def _mrc(report: dict, curve: Sequence) -> pd.DataFrame:
    df = pd.DataFrame(list(curve), columns=["cache_bytes", "miss_ratio"])
    m = report.get("mrc")
    if m:
        df.attrs.update(
            method=m["method"],
            sample_rate=m["sample_rate"],
            tracked_blocks=m["tracked_blocks"],
            block_refs=report["trace"]["block_refs"],
        )
    return df


class Report:
    """What ``simulate`` returns.

    - ``results``: one row per (cache size, policy): hits, misses and hit
      ratio over block references, read/write splits, warm hit ratio,
      latency and IOPS from the device model.
    - ``opt``: Belady's OPT per cache size (empty when skipped).
    - ``mrc``: the LRU miss-ratio curve (``cache_bytes``, ``miss_ratio``).
    - ``trace``: the summary of the requests (dict); ``notes``: the
      simulator's notes; ``report``: the whole report as ``tiercache sim
      --json`` writes it.
    """

    def __init__(self, report: dict, curve: Sequence):
        self.report = report
        self.results = _results(report)
        self.opt = _opt(report)
        self.mrc = _mrc(report, curve)
        self.trace = report["trace"]
        self.notes = list(report["notes"])

    def __repr__(self) -> str:
        return f"Report({self.report['source']!r})\n{self.results.to_string()}"


def simulate(
    trace: Any,
    cache_sizes: Sizes,
    policies: Optional[Sequence[str]] = None,
    block_size: int = 4096,
    *,
    format: Optional[str] = None,
    mode: Optional[str] = None,
    sequential_cutoff: Optional[int] = None,
    devices: Optional[str] = None,
    queue_depth: Optional[int] = None,
    opt: Optional[str] = "bypass",
    sampling: Optional[float] = None,
    mrc_points: int = 200,
    threads: int = 0,
) -> Report:
    """Replays ``trace`` through every policy at every cache size.

    ``trace``: a file path (any format ``tiercache sim --trace`` reads;
    ``format`` names it or None detects it), or requests in memory (a
    DataFrame, a dict of NumPy arrays or an Arrow table with columns
    ``offset``, ``length``, ``op`` and optionally ``time`` (ns) and
    ``volume``; see ``read_trace``). ``cache_sizes``: bytes, or a string
    such as ``"256M,1G"`` or ``"1G..16G"``. ``policies``: names as
    ``REPLACEMENT+ADMISSION`` (``smq+hotspot``, ``lru+always``) or
    ``default``; None simulates every policy, as the CLI does. The other
    options and their defaults are the CLI's (``mode="writethrough"``,
    ``sequential_cutoff=4 MiB``, ``devices="nvme/hdd"``, ``queue_depth=8``);
    ``opt`` is ``"bypass"``, ``"demand"`` or None to skip OPT; ``sampling``
    is a SHARDS rate for the MRC (None: exact, SHARDS only past 50M
    distinct blocks).

    Raises ValueError for a bad option or trace line, OSError for a file
    that cannot be read.
    """
    options = {
        "cache_sizes": _sizes(cache_sizes),
        "policies": None if policies is None else list(policies),
        "block_size": block_size,
        "mode": mode,
        "sequential_cutoff": sequential_cutoff,
        "devices": devices,
        "queue_depth": queue_depth,
        "opt": opt,
        "sampling": sampling,
        "threads": threads,
    }
    return Report(*_run(trace, format, options, mrc_points))


def mrc(
    trace: Any,
    cache_sizes: Optional[Sizes] = None,
    sampling: Optional[float] = None,
    block_size: int = 4096,
    *,
    format: Optional[str] = None,
    points: int = 200,
) -> pd.DataFrame:
    """The LRU miss-ratio curve of ``trace`` (as in ``simulate``): a
    DataFrame of ``cache_bytes`` and ``miss_ratio``, at ``cache_sizes`` if
    given, else at ``points`` sizes from one block to past the largest
    reuse distance. ``sampling``: None for exact, or a SHARDS rate in
    (0, 1]. ``df.attrs`` says the method, rate, blocks tracked and the
    block references the ratios are of."""
    sizes = _sizes(cache_sizes)
    options = {
        "cache_sizes": sizes if sizes is not None else [block_size],
        "policies": [],
        "block_size": block_size,
        "opt": None,
        # Exact unless sampled, whatever the trace's size (the CLI's default
        # switches to SHARDS past 50M distinct blocks).
        "mrc": "exact",
        "sampling": sampling,
    }
    report, curve = _run(trace, format, options, points)
    m = report["mrc"]
    if sizes is not None:
        curve = [tuple(p) for p in m["at_sizes"]]
    return _mrc(report, curve)


def opt(
    trace: Any,
    cache_sizes: Sizes,
    block_size: int = 4096,
    *,
    variant: str = "bypass",
    format: Optional[str] = None,
) -> pd.DataFrame:
    """Belady's OPT on ``trace`` (as in ``simulate``) at each cache size:
    the fewest misses any cache of that size can have. ``variant``:
    ``"bypass"`` (a block used later than everything resident is not
    inserted: the bound for a cache with admission) or ``"demand"``
    (every miss is inserted, the classic MIN)."""
    options = {
        "cache_sizes": _sizes(cache_sizes),
        "policies": [],
        "block_size": block_size,
        "opt": variant,
        "mrc": False,
    }
    report, _ = _run(trace, format, options, 2)
    return _opt(report)
