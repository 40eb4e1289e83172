//! The main job's stale-cache run (`make run`, `tiercache bench`) at the
//! policy level, in a second instead of minutes: which blocks each stack
//! misses when a cache full of one region's blocks meets another region.
//!
//! As the bench's defaults lay it out (64 KiB cache blocks, 4 KiB reads):
//! a cache of 640 blocks (40 MiB); "empty cache": Zipf(1.2) reads over
//! region A's first 512 blocks (32 MiB, 8192 pages); then every block of A
//! (640 of them) read once in random order, so the cache is full of A;
//! then "full of stale data": the same Zipf over region B (512 blocks that
//! follow A). B fits the cache, so a stack that evicted A's blocks first
//! would miss each of B's blocks once, as the empty run missed each of A's.
//! Prints, per stack, the stale run's misses over the empty run's, for
//! seeds 1 to SEEDS (the adaptive default's varies with the moment its
//! minis move), and their median.
//!
//! Usage: `mainjob_stale [READS_PER_RUN [SEEDS]]` (defaults 300000 5).

#[path = "../tests/common/warmup.rs"]
mod warmup;

use tiercache_types::Time;
use warmup::*;

/// Cache blocks (40 MiB of 64 KiB blocks).
const CAPACITY: u32 = 640;
/// Region A's blocks; region B follows it.
const REGION_A: u64 = 640;
/// 4 KiB pages of a run's data (32 MiB).
const PAGES: u64 = 8192;
const PAGES_PER_BLOCK: u64 = 16;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let reads = args.first().copied().unwrap_or(300_000);
    let seeds = args.get(1).copied().unwrap_or(5);
    println!(
        "cache {CAPACITY} blocks; {reads} Zipf(1.2) reads per run over {} blocks",
        PAGES / PAGES_PER_BLOCK
    );
    for stack in stacks() {
        let mut ratios: Vec<f64> = (1..=seeds)
            .map(|seed| stale_over_empty(stack, reads, seed))
            .collect();
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{:16} stale/empty misses: median {:.2}x ({})",
            stack.name(),
            ratios[ratios.len() / 2],
            shown.join(" ")
        );
    }
}

/// The stale run's misses over the empty run's, for one seed.
fn stale_over_empty(stack: Stack, reads: u64, seed: u64) -> f64 {
    let mut d = director(stack, CAPACITY);
    let mut now = Time::ZERO;
    let zipf_run = |d: &mut _, base: u64, now: &mut Time| {
        // The same seed for both runs, as fio repeats its random stream.
        let mut z = Zipf::new(PAGES, 1.2, seed);
        (0..reads)
            .filter(|_| !read(d, base + z.next_block() / PAGES_PER_BLOCK, now))
            .count()
    };
    let empty = zipf_run(&mut d, 0, &mut now);
    let mut order: Vec<u64> = (0..REGION_A).collect();
    let mut rng = Rng::new(seed);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    for b in order {
        read(&mut d, b, &mut now);
    }
    let stale = zipf_run(&mut d, REGION_A, &mut now);
    stale as f64 / empty.max(1) as f64
}
