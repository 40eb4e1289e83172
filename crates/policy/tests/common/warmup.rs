//! Warm-up experiment shared by `tests/warmup.rs` and `benches/policy.rs`:
//! a seeded Zipf stream of 4 KiB reads through a [`Director`], from an empty
//! cache and from a cache first filled with stale blocks (the field study's
//! "lvmcache full of junk").
#![allow(dead_code)]

use tiercache_policy::{Director, DirectorConfig, PolicyConfig};
use tiercache_types::{
    Access, AdmissionKind, CacheMode, OriginBlock, ReplacementKind, Time, VolumeId,
};

pub const BLOCK: u32 = 4096;
/// Stale blocks live far away from the Zipf data set.
pub const STALE_BASE: u64 = 1 << 40;
/// Virtual time per IO (100k IOPS).
pub const NANOS_PER_IO: u64 = 10_000;

/// splitmix64: a tiny seeded generator, so the workload is reproducible
/// without depending on a crate's stream stability.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf(`s`) over `n` blocks (`n` a power of two), sampled by inverse CDF.
/// Ranks are scattered over the blocks by an odd multiplier (a bijection
/// modulo a power of two), as fio scatters its zipf ranks, so hot blocks
/// are not all neighbours.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
    rng: Rng,
}

impl Zipf {
    pub fn new(n: u64, s: f64, seed: u64) -> Self {
        assert!(n.is_power_of_two());
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for r in 1..=n {
            sum += (r as f64).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf {
            cdf,
            rng: Rng::new(seed),
        }
    }

    pub fn n(&self) -> u64 {
        self.cdf.len() as u64
    }

    /// The next block.
    pub fn next_block(&mut self) -> u64 {
        let u = self.rng.next_f64();
        let rank = self.cdf.partition_point(|&c| c < u) as u64;
        let rank = rank.min(self.n() - 1);
        rank.wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1) & (self.n() - 1)
    }

    /// Share of accesses the `k` most popular blocks get (the best any
    /// cache of `k` blocks can do in the long run).
    pub fn top_share(&self, k: u64) -> f64 {
        if k == 0 {
            0.0
        } else {
            self.cdf[(k.min(self.n()) - 1) as usize]
        }
    }
}

/// A policy stack under test.
#[derive(Clone, Copy, Debug)]
pub struct Stack {
    pub replacement: ReplacementKind,
    pub admission: AdmissionKind,
}

impl Stack {
    pub fn name(&self) -> String {
        format!("{}+{}", self.replacement, self.admission)
    }
}

/// The default stack (adaptive + always), smq + hotspot, and
/// lru/s3fifo/arc/fifo/sieve with `always`.
pub fn stacks() -> Vec<Stack> {
    if std::env::var("ALL_STACKS").is_ok() {
        let mut v = Vec::new();
        for &r in ReplacementKind::ALL {
            for &a in AdmissionKind::ALL {
                v.push(Stack {
                    replacement: r,
                    admission: a,
                });
            }
        }
        return v;
    }
    let s = |replacement, admission| Stack {
        replacement,
        admission,
    };
    vec![
        s(ReplacementKind::Adaptive, AdmissionKind::Always),
        s(ReplacementKind::Smq, AdmissionKind::Hotspot),
        s(ReplacementKind::Lru, AdmissionKind::Always),
        s(ReplacementKind::S3Fifo, AdmissionKind::Always),
        s(ReplacementKind::Arc, AdmissionKind::Always),
        s(ReplacementKind::Fifo, AdmissionKind::Always),
        s(ReplacementKind::Sieve, AdmissionKind::Always),
    ]
}

/// A writethrough director, 4 KiB blocks, sequential cutoff 0 (the field
/// study's bcache `sequential_cutoff=0`, so only the policies decide).
pub fn director(stack: Stack, capacity: u32) -> Director {
    let mut cfg = DirectorConfig::new(capacity, BLOCK);
    cfg.mode = CacheMode::WriteThrough;
    cfg.sequential_cutoff = 0;
    cfg.policy = PolicyConfig {
        replacement: stack.replacement,
        admission: stack.admission,
        ..PolicyConfig::default()
    };
    Director::new(&cfg).expect("valid config")
}

/// One 4 KiB read of `block`; true on a hit.
pub fn read(d: &mut Director, block: u64, now: &mut Time) -> bool {
    *now = now.add_nanos(NANOS_PER_IO);
    let mut io = d.begin(
        VolumeId(0),
        block * BLOCK as u64,
        BLOCK as u64,
        Access::Read,
        *now,
    );
    let plan = d.plan_read(&mut io, OriginBlock(block), *now);
    d.finish(io);
    matches!(plan, tiercache_policy::director::ReadPlan::Hit(_))
}

/// Fills the cache with `capacity` stale blocks, each read `reads` times
/// (hot in the previous workload), then never again. Returns how many of
/// them are resident afterwards.
pub fn fill_stale(d: &mut Director, capacity: u32, reads: u32, now: &mut Time) -> u64 {
    for _ in 0..reads {
        for i in 0..capacity as u64 {
            read(d, STALE_BASE + i, now);
        }
    }
    let mut stale = 0;
    d.replacement().for_each_resident(&mut |o, _, _| {
        if o.0 >= STALE_BASE {
            stale += 1;
        }
    });
    stale
}

/// Read hit ratio in each of `passes` windows of `pass_len` Zipf reads.
pub fn curve(
    d: &mut Director,
    zipf: &mut Zipf,
    passes: usize,
    pass_len: u64,
    now: &mut Time,
) -> Vec<f64> {
    (0..passes)
        .map(|_| {
            let hits = (0..pass_len)
                .filter(|_| read(d, zipf.next_block(), now))
                .count();
            hits as f64 / pass_len as f64
        })
        .collect()
}

/// Warm-up curves of one stack, from empty and from a cache full of stale
/// blocks, on the same Zipf stream (same seed). One point per *pass*: as
/// many reads as the data set has blocks.
pub struct Warmup {
    pub empty: Vec<f64>,
    pub stale: Vec<f64>,
    /// Stale blocks resident when the Zipf stream started.
    pub stale_resident: u64,
}

pub fn warmup(stack: Stack, capacity: u32, data_blocks: u64, passes: usize, seed: u64) -> Warmup {
    let pass_len = data_blocks;
    let mut now = Time::ZERO;
    let mut d = director(stack, capacity);
    let mut z = Zipf::new(data_blocks, 1.2, seed);
    let empty = curve(&mut d, &mut z, passes, pass_len, &mut now);

    let mut now = Time::ZERO;
    let mut d = director(stack, capacity);
    let stale_resident = fill_stale(&mut d, capacity, 3, &mut now);
    let mut z = Zipf::new(data_blocks, 1.2, seed);
    let stale = curve(&mut d, &mut z, passes, pass_len, &mut now);
    Warmup {
        empty,
        stale,
        stale_resident,
    }
}

/// The first pass (1-based) whose hit ratio reaches `target`.
pub fn passes_to(curve: &[f64], target: f64) -> Option<usize> {
    curve.iter().position(|&h| h >= target).map(|i| i + 1)
}

/// How a copy of the main job's stale-cache run lays its requests out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MainJobLayout {
    /// As `tiercache bench` runs it (read off a recording of its server,
    /// `tiercache trace`): the engine's [`MAIN_JOB_ENGINE_CAPACITY`]
    /// blocks, two fio jobs each over its half of the region with their
    /// requests alternating, and region A read again in 64 KiB reads,
    /// every block once. The engine's first eviction then falls in that
    /// read of A, not at the stale run's start.
    AsBench,
    /// As `AsBench`, but as the bench's RAM cache (`mem:40M`, no metadata:
    /// 640 blocks) ran it in a recording: a few of the 64 KiB reads of A
    /// joined the 4 KiB reads' streams and bypassed the cache (the default
    /// sequential cutoff), so [`MAIN_JOB_BYPASSED_FILLS`] of the cache's
    /// blocks are still free when B starts and take B's first misses, its
    /// hottest blocks, before the first eviction.
    AsBenchRam,
    /// One Zipf stream over the region, A read again page by page (every
    /// 4 KiB page once, so each of A's blocks is read 16 times) and 640
    /// blocks: the first eviction falls at the stale run's start, the
    /// case the first turnover (`first_turnover.rs`) was built on.
    PageFill640,
}

/// The main job's stale-cache run (`make run`, `tiercache bench`) at the
/// policy level (64 KiB cache blocks, 4 KiB reads): "empty cache": `reads`
/// Zipf(1.2) reads over region A's first 512 blocks (32 MiB); then all of
/// A (640 blocks) read again in random order, so the cache is full of A;
/// then "full of stale data": the same Zipf over region B (512 blocks that
/// follow A). B fits the cache, so a stack that evicted A's blocks first
/// would miss each of B's blocks once, as the empty run missed each of
/// A's. `layout` says how close to the bench (see [`MainJobLayout`]).
/// Returns the stale run's misses over the empty run's.
pub fn main_job_stale_over_empty(
    stack: Stack,
    layout: MainJobLayout,
    reads: u64,
    seed: u64,
) -> f64 {
    /// Region A's blocks; region B follows it.
    const REGION_A: u64 = 640;
    let as_bench = layout != MainJobLayout::PageFill640;
    let jobs: u64 = if as_bench { 2 } else { 1 };
    let job_pages = MAIN_JOB_PAGES / jobs;
    let capacity = if layout == MainJobLayout::AsBench {
        MAIN_JOB_ENGINE_CAPACITY
    } else {
        640
    };
    // The reads of A's blocks not yet cached that bypass.
    let mut bypassed = if layout == MainJobLayout::AsBenchRam {
        MAIN_JOB_BYPASSED_FILLS
    } else {
        0
    };
    let mut d = director(stack, capacity);
    let mut now = Time::ZERO;
    let zipf_run = |d: &mut Director, base: u64, now: &mut Time| {
        // The same seeds for both runs, as fio repeats its random streams.
        let mut streams: Vec<Zipf> = (0..jobs)
            .map(|j| Zipf::new(job_pages, 1.2, seed + 1000 * j))
            .collect();
        (0..reads)
            .filter(|i| {
                let j = i % jobs;
                let page = j * job_pages + streams[j as usize].next_block();
                !read(d, base + page / MAIN_JOB_PAGES_PER_BLOCK, now)
            })
            .count()
    };
    let empty = zipf_run(&mut d, 0, &mut now);
    // Region A again: each job's part in random order, the jobs alternating.
    let (units, per_block) = if as_bench {
        (REGION_A, 1)
    } else {
        (
            REGION_A * MAIN_JOB_PAGES_PER_BLOCK,
            MAIN_JOB_PAGES_PER_BLOCK,
        )
    };
    let mut rng = Rng::new(seed);
    let mut parts: Vec<Vec<u64>> = (0..jobs)
        .map(|j| (j * units / jobs..(j + 1) * units / jobs).collect())
        .collect();
    for p in &mut parts {
        for i in (1..p.len()).rev() {
            p.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
    }
    for i in 0..parts[0].len() {
        for p in &parts {
            let block = p[i] / per_block;
            if bypassed > 0 && d.lookup(OriginBlock(block)).is_none() {
                bypassed -= 1;
                continue;
            }
            read(&mut d, block, &mut now);
        }
    }
    let stale = zipf_run(&mut d, REGION_A, &mut now);
    stale as f64 / empty.max(1) as f64
}

/// The main job's cache blocks as the engine has them: what `tiercache
/// serve` makes of the bench's 40 MiB cache file with 64 KiB blocks once
/// its metadata has its room (640 would be the whole file).
pub const MAIN_JOB_ENGINE_CAPACITY: u32 = 623;
/// Reads of region A that bypassed the RAM cache in the recording
/// ([`MainJobLayout::AsBenchRam`]).
pub const MAIN_JOB_BYPASSED_FILLS: u64 = 7;
/// 4 KiB pages of a main-job run's data (32 MiB).
pub const MAIN_JOB_PAGES: u64 = 8192;
pub const MAIN_JOB_PAGES_PER_BLOCK: u64 = 16;
