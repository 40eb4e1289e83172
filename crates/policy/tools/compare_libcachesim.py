#!/usr/bin/env python3
"""Compares miss counts of tiercache's S3-FIFO, ARC, FIFO and SIEVE with
libCacheSim's.

Needs `pip install libcachesim` (0.3.x) and the replay example:
    cargo build --release -p tiercache-policy --example replay
    python3 crates/policy/tools/compare_libcachesim.py [path/to/replay]

For a set of seeded synthetic traces (Zipf of several skews, uniform, loops
and mixtures) and cache sizes, runs both and prints the miss counts; exits 1
if any differ. Read-only traces, unit-size blocks.
"""
import os
import random
import subprocess
import sys
import tempfile

import libcachesim as lcs


def zipf_trace(n_items, alpha, n_req, rng):
    weights = [1.0 / (r ** alpha) for r in range(1, n_items + 1)]
    perm = list(range(n_items))
    rng.shuffle(perm)
    return [perm[i] for i in rng.choices(range(n_items), weights=weights, k=n_req)]


def traces():
    rng = random.Random(42)
    yield "zipf1.2", zipf_trace(5000, 1.2, 60000, rng)
    yield "zipf0.8", zipf_trace(5000, 0.8, 60000, rng)
    yield "uniform", [rng.randrange(3000) for _ in range(40000)]
    loop = list(range(700)) * 30
    yield "loop700", loop
    mix = []
    for i in range(40000):
        mix.append(rng.randrange(200) if rng.random() < 0.6 else 10_000 + i)
    yield "hot+scan", mix


def lcs_misses(name, size, trace):
    cache = {"s3fifo": lcs.S3FIFO, "arc": lcs.ARC, "fifo": lcs.FIFO, "sieve": lcs.Sieve}[name](size)
    misses = 0
    req = lcs.Request()
    req.obj_size = 1
    for i, o in enumerate(trace):
        req.obj_id = o
        req.clock_time = i
        if not cache.get(req):
            misses += 1
    return misses


def ours(replay, name, size, path):
    with open(path) as f:
        out = subprocess.run([replay, name, str(size)], stdin=f, capture_output=True,
                             text=True, check=True).stdout.split()
    return int(out[0])


def main():
    replay = sys.argv[1] if len(sys.argv) > 1 else "target/release/examples/replay"
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for tname, trace in traces():
            path = os.path.join(d, tname)
            with open(path, "w") as f:
                f.write("\n".join(map(str, trace)) + "\n")
            for name in ("s3fifo", "arc", "fifo", "sieve"):
                for size in (20, 64, 100, 500, 1000, 2500):
                    a = lcs_misses(name, size, trace)
                    b = ours(replay, name, size, path)
                    flag = "" if a == b else "  <-- DIFFERENT"
                    bad += a != b
                    print(f"{tname:9} {name:6} {size:5}: libCacheSim {a:6} tiercache {b:6}{flag}")
    print(f"{bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
