//! Replays a read-only trace through one replacement policy (every miss
//! admitted) and prints the miss count, for comparison with libCacheSim
//! (see `tools/compare_libcachesim.py`).
//!
//! Usage: `replay POLICY CAPACITY < trace`, the trace one origin block id
//! per line. Prints `misses requests`.

use std::io::BufRead;
use tiercache_policy::PolicyConfig;
use tiercache_types::{Access, OriginBlock, ReplacementKind, Time};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: replay smq|lru|s3fifo|arc|fifo|sieve CAPACITY < trace");
        std::process::exit(2);
    }
    let kind: ReplacementKind = args[1].parse().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let capacity: u32 = args[2].parse().expect("capacity in blocks");
    let cfg = PolicyConfig {
        replacement: kind,
        ..PolicyConfig::default()
    };
    let mut p = cfg.build_replacement(capacity).expect("policy");
    let (mut misses, mut requests) = (0u64, 0u64);
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line.expect("read trace");
        let Ok(id) = line.trim().parse::<u64>() else {
            continue;
        };
        let o = OriginBlock(id);
        let now = Time(i as u64);
        requests += 1;
        if p.lookup(o).is_some() {
            p.touch(o, Access::Read, now);
        } else {
            misses += 1;
            p.insert(o, now)
                .expect("read-only: never full of dirty blocks");
        }
    }
    println!("{misses} {requests}");
}
