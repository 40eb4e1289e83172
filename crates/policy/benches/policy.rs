//! Policy benchmark: `cargo bench -p tiercache-policy` (under a minute).
//!
//! For each replacement policy, with the default admission (hotspot) and
//! with `always`:
//! 1. decisions per second on one core: a Zipf(1.2) stream of 4 KiB reads
//!    through `Director::begin / plan_read / finish`, cache of 256K blocks
//!    (1 GiB), data set of 16M blocks (64 GiB), timed on a second stream
//!    after a first one filled the cache; timed in CPU time of the thread
//!    (`CLOCK_THREAD_CPUTIME_ID`), so other work on the shared cores does
//!    not count, though it still evicts our data from the CPU caches: the
//!    fastest of 8 chunks counts;
//! 2. RAM bytes per cache block: `memory_bytes() / capacity` of replacement
//!    plus admission at 1M blocks (dm-cache's smq: ~25 B);
//! 3. warm-up: read hit ratio per pass over a data set of twice the cache,
//!    from an empty cache and from a cache full of stale blocks, and the
//!    passes needed to reach 95%.

#[path = "../tests/common/warmup.rs"]
mod warmup;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::Distribution;
use std::time::Instant;
use tiercache_policy::{Director, PolicyConfig};
use tiercache_types::{Access, AdmissionKind, OriginBlock, ReplacementKind, Time, VolumeId};
use warmup::*;

/// Cache size for bytes per block.
const CAPACITY: u32 = 1 << 20;
/// Cache size for decisions per second: 1 GiB of 4 KiB blocks, small
/// enough against the data set that Zipf(1.2) keeps evicting (a 1M-block
/// cache holds nearly every block this stream ever touches).
const SPEED_CAPACITY: u32 = 1 << 18;
const DATA_BLOCKS: u64 = 16 << 20;
const STREAM: usize = 4 << 20;
/// The timed stream is cut in this many chunks; the fastest one counts.
const CHUNKS: usize = 8;

const WARM_CAPACITY: u32 = 1 << 16;
const WARM_DATA: u64 = 1 << 17;
const WARM_PASSES: usize = 10;

/// `len` blocks of a Zipf(1.2) stream over `DATA_BLOCKS`, ranks scattered
/// as in `warmup::Zipf` (rand_distr's sampler: O(1) per sample).
fn zipf_stream(len: usize, seed: u64) -> Vec<u64> {
    let z = rand_distr::Zipf::new(DATA_BLOCKS, 1.2).expect("valid Zipf");
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len)
        .map(|_| {
            let rank = z.sample(&mut rng) as u64 - 1;
            rank.wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1) & (DATA_BLOCKS - 1)
        })
        .collect()
}

fn all_stacks() -> Vec<Stack> {
    let mut v = Vec::new();
    for &replacement in ReplacementKind::ALL {
        for admission in [AdmissionKind::Hotspot, AdmissionKind::Always] {
            v.push(Stack {
                replacement,
                admission,
            });
        }
    }
    v
}

/// CPU time of this thread, in seconds.
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Plans every block of `stream` as a 4 KiB read; returns (CPU seconds,
/// hits).
fn run(d: &mut Director, stream: &[u64], now: &mut Time) -> (f64, u64) {
    let before = d.counters().read_hits;
    let t = thread_cpu_secs();
    for &b in stream {
        *now = now.add_nanos(NANOS_PER_IO);
        let mut io = d.begin(
            VolumeId(0),
            b * BLOCK as u64,
            BLOCK as u64,
            Access::Read,
            *now,
        );
        std::hint::black_box(d.plan_read(&mut io, OriginBlock(b), *now));
        d.finish(io);
    }
    (thread_cpu_secs() - t, d.counters().read_hits - before)
}

fn bytes_per_block(stack: Stack, capacity: u32) -> (f64, f64) {
    let cfg = PolicyConfig {
        replacement: stack.replacement,
        admission: stack.admission,
        ..PolicyConfig::default()
    };
    let r = cfg.build_replacement(capacity).expect("replacement");
    let a = cfg.build_admission(capacity, BLOCK).expect("admission");
    (
        r.memory_bytes() as f64 / capacity as f64,
        a.memory_bytes() as f64 / capacity as f64,
    )
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is ignored.
    let started = Instant::now();
    println!(
        "tiercache-policy bench: decisions/s with a cache of {} blocks (4 KiB), Zipf(1.2) over {} blocks, \
         {} reads timed per stack; bytes per block at {} blocks",
        SPEED_CAPACITY, DATA_BLOCKS, STREAM, CAPACITY
    );
    let warm = zipf_stream(STREAM, 1);
    let stream = zipf_stream(STREAM, 2);

    println!();
    println!(
        "{:16} {:>14} {:>9} {:>10} {:>10} {:>10}",
        "stack", "decisions/s", "hit %", "repl B/blk", "adm B/blk", "total B/blk"
    );
    for stack in all_stacks() {
        let mut d = director(stack, SPEED_CAPACITY);
        let mut now = Time::ZERO;
        run(&mut d, &warm, &mut now);
        // The least disturbed of CHUNKS chunks counts.
        let (mut secs, mut hits) = (f64::INFINITY, 0);
        for chunk in stream.chunks(STREAM / CHUNKS) {
            let (s, h) = run(&mut d, chunk, &mut now);
            secs = secs.min(s * CHUNKS as f64);
            hits += h;
        }
        let (rb, ab) = bytes_per_block(stack, CAPACITY);
        println!(
            "{:16} {:>14.0} {:>9.2} {:>10.2} {:>10.2} {:>10.2}",
            stack.name(),
            STREAM as f64 / secs,
            100.0 * hits as f64 / STREAM as f64,
            rb,
            ab,
            rb + ab
        );
    }

    println!();
    println!(
        "warm-up: cache {} blocks, Zipf(1.2) over {} blocks (hot set fits; best possible {:.2}%), hit % per pass of {} reads",
        WARM_CAPACITY,
        WARM_DATA,
        100.0 * Zipf::new(WARM_DATA, 1.2, 1).top_share(WARM_CAPACITY as u64),
        WARM_DATA
    );
    println!(
        "{:16} {:6} {:>8} hit % per pass",
        "stack", "start", "to 95%"
    );
    for stack in all_stacks() {
        let w = warmup(stack, WARM_CAPACITY, WARM_DATA, WARM_PASSES, 7);
        for (name, c) in [("empty", &w.empty), ("stale", &w.stale)] {
            let p = passes_to(c, 0.95).map_or("never".to_string(), |p| p.to_string());
            let curve: Vec<String> = c.iter().map(|h| format!("{:5.1}", 100.0 * h)).collect();
            println!(
                "{:16} {:6} {:>8} {}",
                stack.name(),
                name,
                p,
                curve.join(" ")
            );
        }
    }
    println!();
    println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
}
