#!/usr/bin/env python3
"""Times libCacheSim's LRU (its C core, via the libcachesim Python package) on
a trace in libCacheSim's oracleGeneral binary format (24-byte records:
u32 time, u64 object id, u32 size, i64 next access). Used by sim_speed.rs.

usage: libcachesim_lru.py TRACE CACHE_OBJECTS...
prints one JSON line per cache size:
{"size": N, "requests": R, "misses": M, "seconds": wall S, "cpu_seconds": process CPU S}
"""
import json
import os
import sys
import time

import libcachesim as lcs

trace = sys.argv[1]
n = os.path.getsize(trace) // 24
for size in map(int, sys.argv[2:]):
    reader = lcs.TraceReader(trace, lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = lcs.LRU(size)
    t, c = time.perf_counter(), time.process_time()
    miss_ratio, _ = cache.process_trace(reader)
    s, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"size": size, "requests": n, "misses": round(miss_ratio * n),
                      "seconds": s, "cpu_seconds": cpu}), flush=True)
