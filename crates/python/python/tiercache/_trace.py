"""Traces as columns: a file read into a DataFrame, and any trace given to
``simulate`` (a path, a DataFrame, a dict of arrays, an Arrow table) turned
into the byte columns the extension module takes.

Columns (what the simulator makes of a trace file, so that simulating a file
and the DataFrame read from it give the same numbers):

- ``time``: nanoseconds since the first request (int64); absent when the
  trace has no timestamps (the IO counter is then the clock).
- ``volume``: the volume's name as the format gives it (``hm,0``, a Tencent
  volume id, ...); absent for a trace without volumes. Several volumes are
  kept 1 PiB apart, in order of first appearance.
- ``offset``, ``length``: bytes (within the volume).
- ``op``: ``"R"`` or ``"W"``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import pandas as pd

from . import _tiercache

_READ = {"r", "read", "0"}
_WRITE = {"w", "write", "1"}


def read_trace(path: "str | os.PathLike[str]", format: Optional[str] = None) -> pd.DataFrame:
    """Reads a trace file whole into a DataFrame (see the module docs).

    ``format`` is a name ``tiercache sim --format`` takes (``msr``,
    ``tencent``, ``csv:time=0,offset=1,...``) or None to detect it; gzip and
    zstd files are read directly. ``df.attrs`` holds ``format`` and
    ``timestamps``. Raises OSError for a file that cannot be read and
    ValueError for one that does not parse.
    """
    d = _tiercache.read_trace(os.fspath(path), format)
    cols: dict[str, Any] = {}
    if d["time"] is not None:
        cols["time"] = np.frombuffer(d["time"], dtype="<u8").astype(np.int64)
    if d["volume"] is not None:
        names = np.asarray(d["volume_names"], dtype=object)
        cols["volume"] = names[np.frombuffer(d["volume"], dtype="<u8").astype(np.intp)]
    cols["offset"] = np.frombuffer(d["offset"], dtype="<u8").astype(np.int64)
    cols["length"] = np.frombuffer(d["length"], dtype="<u8").astype(np.int64)
    cols["op"] = np.where(np.frombuffer(d["op"], dtype=np.uint8) == 1, "W", "R")
    df = pd.DataFrame(cols)
    df.attrs["format"] = d["format"]
    df.attrs["timestamps"] = d["timestamps"]
    return df


def _column(trace: Any, name: str) -> Optional[np.ndarray]:
    """Column ``name`` of a DataFrame, dict or Arrow table, or None."""
    try:
        has = name in trace if not hasattr(trace, "column_names") else name in trace.column_names
    except TypeError:
        has = False
    if not has:
        return None
    return np.asarray(trace[name])


def _u64_bytes(name: str, values: np.ndarray) -> bytes:
    """Non-negative integers as little-endian u64 bytes."""
    if values.dtype.kind == "M":
        values = values.astype("datetime64[ns]").view(np.int64)
    elif values.dtype.kind == "m":
        values = values.astype("timedelta64[ns]").view(np.int64)
    if values.dtype.kind not in "iub":
        raise ValueError(f"column '{name}': expected integers, got {values.dtype}")
    if values.dtype.kind == "i" and values.size and values.min() < 0:
        i = int(np.argmax(values < 0))
        raise ValueError(f"column '{name}': request {i} is negative ({values[i]})")
    return np.ascontiguousarray(values, dtype="<u8").tobytes()


def _op_bytes(values: np.ndarray) -> bytes:
    """Ops as one byte per request, 0 read, 1 write: strings R/W/read/write
    (any case), booleans (True = write) or integers 0/1."""
    if values.dtype.kind == "b":
        return values.astype(np.uint8).tobytes()
    if values.dtype.kind in "iu":
        bad = (values != 0) & (values != 1)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"column 'op': request {i} is {values[i]} (0 read, 1 write)")
        return values.astype(np.uint8).tobytes()
    low = np.char.lower(values.astype(str))
    is_read = np.isin(low, list(_READ))
    is_write = np.isin(low, list(_WRITE))
    bad = ~(is_read | is_write)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"column 'op': request {i} is {str(values[i])!r} (expected R or W)")
    return is_write.astype(np.uint8).tobytes()


def to_columns(trace: Any) -> dict[str, Optional[bytes]]:
    """The byte columns of an in-memory trace: a DataFrame, a dict of
    arrays or an Arrow table with ``offset``, ``length``, ``op`` and
    optionally ``time`` and ``volume``."""
    missing = [c for c in ("offset", "length", "op") if _column(trace, c) is None]
    if missing:
        raise ValueError(
            f"trace: missing column(s) {', '.join(missing)} "
            "(expected offset, length, op and optionally time, volume)"
        )
    time = _column(trace, "time")
    volume = _column(trace, "volume")
    vol_bytes = None
    if volume is not None:
        codes, _ = pd.factorize(np.asarray(volume, dtype=object), use_na_sentinel=True)
        if (codes < 0).any():
            i = int(np.argmax(codes < 0))
            raise ValueError(f"column 'volume': request {i} has no volume")
        vol_bytes = codes.astype("<u8").tobytes()
    return {
        "time": None if time is None else _u64_bytes("time", time),
        "volume": vol_bytes,
        "offset": _u64_bytes("offset", _column(trace, "offset")),
        "length": _u64_bytes("length", _column(trace, "length")),
        "op": _op_bytes(_column(trace, "op")),
    }
