"""tiercache's cache simulator from Python.

Every number comes from the simulator in crates/sim (the code behind
``tiercache sim``), reached through the extension module ``_tiercache``;
this package only turns its results into pandas DataFrames.

- ``read_trace(path, format=None)``: a trace file as a DataFrame.
- ``simulate(trace, cache_sizes=..., policies=None, ...)``: replay a trace
  file, a DataFrame or arrays through policies and cache sizes.
- ``mrc(trace, cache_sizes=None, sampling=None)``: the LRU miss-ratio curve,
  exact or SHARDS-sampled.
- ``opt(trace, cache_sizes=...)``: Belady's OPT bound per cache size.
"""

from ._tiercache import __version__, default_policies, parse_cache_sizes
from ._trace import read_trace
from ._simulate import Report, mrc, opt, simulate

__all__ = [
    "__version__",
    "Report",
    "default_policies",
    "mrc",
    "opt",
    "parse_cache_sizes",
    "read_trace",
    "simulate",
]
