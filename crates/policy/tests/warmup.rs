//! A cache full of stale blocks must warm as fast as an empty one.
//!
//! For the default stack (adaptive + always), smq + hotspot, and lru, s3fifo, arc, fifo and
//! sieve with `always`: a Zipf(1.2) stream of 4 KiB reads over a data set of
//! twice the cache's size (the hot set fits: the 8192 most popular blocks
//! get 97.8% of the reads), through the [`Director`] (read-only, sequential
//! cutoff 0), from (a) an empty cache and (b) a cache first filled with
//! stale blocks, each read three times (hot in the previous workload) and
//! never again.
//! A *pass* is as many reads as the data set has blocks; the hit ratio is
//! measured per pass. Even an infinite cache needs 5 passes to reach 95%
//! here: Zipf(1.2)'s long tail keeps producing first-time misses.
//!
//! [`Director`]: tiercache_policy::Director

#[path = "common/warmup.rs"]
mod warmup;

use tiercache_types::{AdmissionKind, ReplacementKind};
use warmup::*;

const CAPACITY: u32 = 8192;
const DATA_BLOCKS: u64 = 16384;
const PASSES: usize = 10;

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn stale_cache_warms_as_fast_as_an_empty_one() {
    let z = Zipf::new(DATA_BLOCKS, 1.2, 1);
    assert!(z.top_share(CAPACITY as u64) > 0.975, "the hot set fits");
    let mut failures = Vec::new();
    for stack in stacks() {
        let w = warmup(stack, CAPACITY, DATA_BLOCKS, PASSES, 7);
        let fmt = |c: &[f64]| {
            c.iter()
                .map(|h| format!("{h:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        eprintln!("{:16} empty {}", stack.name(), fmt(&w.empty));
        eprintln!("{:16} stale {}", "", fmt(&w.stale));
        assert_eq!(w.stale_resident, CAPACITY as u64, "cache full of junk");
        let empty95 = passes_to(&w.empty, 0.95);
        let stale95 = passes_to(&w.stale, 0.95);
        // S3-FIFO (exactly as libCacheSim's) keeps blocks that were hit in
        // main until its CLOCK hand has passed them once per hit, and the
        // hand moves only as new blocks earn their way into main: it warms
        // from junk, but slower. Everything else must be as fast as empty.
        let (slack, tolerance) = match (stack.replacement, stack.admission) {
            (ReplacementKind::Smq, AdmissionKind::Hotspot) => (1, 0.01),
            (ReplacementKind::S3Fifo, _) => (PASSES, 0.03),
            // The default is S3-FIFO underneath: its candidate choice makes
            // it warm from junk far faster than plain S3-FIFO, but one pass
            // after an empty cache (0.6 points lower on average over the
            // ten passes, 0.2 at the last, in session 45; at 64K blocks,
            // the policy bench, as fast as empty). Known gap of the default.
            (ReplacementKind::Adaptive, _) => (1, 0.01),
            _ => (1, 0.02),
        };
        let ok = empty95.is_some_and(|e| e <= 6)
            && stale95.is_some_and(|s| s <= empty95.unwrap_or(0) + slack)
            && mean(&w.stale) >= mean(&w.empty) - tolerance
            && w.stale[PASSES - 1] >= w.empty[PASSES - 1] - tolerance;
        if !ok {
            failures.push(format!(
                "{}: passes to 95% empty {empty95:?} stale {stale95:?}, mean {:.3} vs {:.3}",
                stack.name(),
                mean(&w.empty),
                mean(&w.stale)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The main job's stale run (`main_job_stale_over_empty`), in each
/// layout: a cache full of region A, all of it read again just before,
/// meets region B. The default's probation held open for the cache's first
/// turnover (`first_turnover.rs`) lets B's blocks compete with A's: at most
/// 1.2x the empty run's misses in each layout. Seeds 1-3, 100,000 reads:
/// as the bench lays it out (`AsBench`, the first eviction in the read of
/// A) 1.09-1.11x, and 1.32-1.38x when the turnover told A from B by FIFO
/// and counted that read's hits; as the bench's RAM cache had it
/// (`AsBenchRam`: 7 slots still free when B starts) 1.08-1.10x, and up to
/// 1.36x when slots were tracked from the first eviction only; with A
/// read page by page into 640 blocks (`PageFill640`) 1.07-1.08x
/// (1.11-1.14x then). LRU, which evicts A first, misses each of B's
/// blocks once.
#[test]
fn main_job_stale_cache_misses_little_more_than_empty() {
    let adaptive = Stack {
        replacement: ReplacementKind::Adaptive,
        admission: AdmissionKind::Always,
    };
    let lru = Stack {
        replacement: ReplacementKind::Lru,
        admission: AdmissionKind::Always,
    };
    for layout in [
        MainJobLayout::AsBench,
        MainJobLayout::AsBenchRam,
        MainJobLayout::PageFill640,
    ] {
        for seed in 1..=3 {
            let r = main_job_stale_over_empty(adaptive, layout, 100_000, seed);
            assert!(
                r <= 1.2,
                "{layout:?}, seed {seed}: stale/empty misses {r:.2}x"
            );
            let l = main_job_stale_over_empty(lru, layout, 100_000, seed);
            assert!(l <= 1.01, "{layout:?}, seed {seed}: LRU {l:.2}x");
        }
    }
}

/// The other side of the first turnover: old data that is cold, not
/// dead. A cache of 1000 blocks fills with 900 blocks read three times
/// (A), then meets new blocks each read twice in a row (B, 4000 of them)
/// while A earns one hit per 200 reads of B, then A is read again in
/// full. B's blocks need no room beyond the small FIFO, so the default
/// keeps the 800 or so of A's blocks in main (99 missed on A's return:
/// those the fill left in the small FIFO); a first turnover that opened
/// for B would shrink main to half and throw A's blocks out (398 missed
/// when 1/8 of the new data's hits per block was enough to keep it
/// closed). A's few hits keep it closed: the old data must earn under 1/1024 of the new data's hits per block
/// (libCacheSim's CloudPhysics trace, whose first blocks are cold for
/// thousands of evictions, then wanted, missed 7.1 points more at 64 KiB
/// and 50% when 1/8 was enough: docs/BENCHMARKS.md, session 48).
#[test]
fn cold_but_live_old_data_keeps_its_place() {
    let adaptive = Stack {
        replacement: ReplacementKind::Adaptive,
        admission: AdmissionKind::Always,
    };
    let mut d = director(adaptive, 1000);
    let mut now = tiercache_types::Time::ZERO;
    let a = STALE_BASE;
    for _ in 0..3 {
        for i in 0..900 {
            read(&mut d, a + i, &mut now);
        }
    }
    for i in 0..4000u64 {
        read(&mut d, i, &mut now);
        read(&mut d, i, &mut now);
        if i % 100 == 0 {
            read(&mut d, a + (i / 100) * 7 % 900, &mut now);
        }
    }
    let missed = (0..900).filter(|&i| !read(&mut d, a + i, &mut now)).count();
    assert!(missed < 150, "{missed} of A's 900 blocks missed on return");
}
