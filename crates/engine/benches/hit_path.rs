//! The engine's own work per IO on the paths a front end calls for every
//! request: N IOs of 4 KiB through a [`VolumeHandle`] of a persistent pool
//! (64 KiB blocks, the default policy, as `tiercache serve` builds it),
//! with the cache in RAM or on a file.
//!
//! Run one scenario: `cargo bench -p tiercache-engine --bench hit_path --
//! SCENARIO [IOS]` (prints nanoseconds per IO, a noisy figure on a shared
//! machine; `HIT_PATH_THREADS=N` shares the IOs among N threads on the
//! one volume, as a front end's connections or queues do, and gives
//! their wall time per IO: how far the hit path scales past its locks).
//! The repeatable figure is instructions per IO: `cargo bench -p
//! tiercache-engine --bench hit_path -- callgrind [IOS]` runs every
//! scenario under valgrind's callgrind, counting only inside [`measured`]
//! (`--toggle-collect`), so the set-up and the warm-up are not counted
//! (valgrind must be installed; 20,000 IOs per scenario by default).
//!
//! Scenarios (all on a warm cache unless named miss):
//! - `read-hit-mem`: `read`, cache in RAM;
//! - `quick-hit-mem`: `read_if_cached`, cache in RAM (NBD's and ublk's hit
//!   path for a RAM cache);
//! - `direct-hit-file`: `begin_cached_read` then `finish`, cache on a file
//!   (NBD's and ublk's hit path for a cache file: the caller reads the
//!   pieces itself, so no device read is counted here);
//! - `read-hit-file`: `read`, cache on a file (O_DIRECT `pread`s counted
//!   in user space only);
//! - `read-miss-mem`: `read` of blocks never cached, every one promoted
//!   (evicting another: the data is 4x the cache);
//! - `write-hit-mem`: writeback, 4 KiB writes on blocks already dirty.

use std::sync::Arc;
use std::time::Instant;
use tiercache_device::{BlockDevice, FileDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig, VolumeHandle};
use tiercache_types::{CacheMode, MonotonicClock, VolumeId};

const BLOCK: u64 = 64 << 10;
const IO: usize = 4096;
/// Cache blocks (16 MiB of cache).
const CACHE_BLOCKS: u64 = 256;
const SCENARIOS: [&str; 6] = [
    "read-hit-mem",
    "quick-hit-mem",
    "direct-hit-file",
    "read-hit-file",
    "read-miss-mem",
    "write-hit-mem",
];

/// A fixed pseudo-random sequence (xorshift64), so every run issues the
/// same offsets.
struct Offsets(u64);

impl Offsets {
    /// The next 4 KiB-aligned offset below `span` bytes.
    fn next(&mut self, span: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % (span / IO as u64)) * IO as u64
    }
}

struct Rig {
    volume: VolumeHandle,
    /// Bytes of the volume the scenario's IOs fall in.
    span: u64,
    _dir: Option<tempfile::TempDir>,
}

/// A persistent pool of one volume: the cache in RAM or on a file of
/// `CACHE_BLOCKS` blocks plus room for the metadata.
fn rig(mode: CacheMode, cache_on_file: bool, backing_blocks: u64) -> Rig {
    let backing = Arc::new(MemDevice::new(backing_blocks * BLOCK)) as Arc<dyn BlockDevice>;
    let cache_bytes = (CACHE_BLOCKS + 64) * BLOCK;
    let (cache, dir) = if cache_on_file {
        let dir = tempfile::tempdir_in("/var/tmp").expect("a temporary directory");
        let path = dir.path().join("cache");
        let dev = FileDevice::create(&path, cache_bytes).expect("the cache file");
        (Arc::new(dev) as Arc<dyn BlockDevice>, Some(dir))
    } else {
        (
            Arc::new(MemDevice::new(cache_bytes)) as Arc<dyn BlockDevice>,
            None,
        )
    };
    let cfg = EngineConfig {
        mode,
        block_size: BLOCK as u32,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    };
    let engine = Engine::create(
        backing,
        cache,
        &cfg,
        Arc::new(MonotonicClock::new()),
        "bench-backing",
        None,
    )
    .expect("a pool");
    let engine = Arc::new(engine);
    assert!(
        engine.capacity() as u64 >= CACHE_BLOCKS,
        "the cache holds {} blocks",
        engine.capacity()
    );
    let volume = engine.volume_handle(VolumeId(0)).expect("volume 0");
    Rig {
        volume,
        span: backing_blocks * BLOCK,
        _dir: dir,
    }
}

/// Reads (or writes) every block of the first `blocks` until all are
/// cached, so that the measured IOs all hit.
fn warm(rig: &Rig, blocks: u64, write: bool) {
    let mut buf = vec![0u8; BLOCK as usize];
    for _ in 0..3 {
        for b in 0..blocks {
            if write {
                rig.volume.write(b * BLOCK, &buf, false).expect("write");
            } else {
                rig.volume.read(b * BLOCK, &mut buf).expect("read");
            }
        }
    }
    let s = rig.volume.stats();
    assert!(
        s.decisions.resident >= blocks,
        "warm-up left blocks out: {} of {blocks} resident",
        s.decisions.resident
    );
}

/// The scenario's IOs; the only function callgrind counts in
/// (`scripts/bench-hitpath.sh`), so keep it out of line.
#[inline(never)]
fn measured(scenario: &str, rig: &Rig, ios: u64, buf: &mut [u8], seed: u64) {
    let mut at = Offsets(0x9E37_79B9_7F4A_7C15 ^ seed);
    let v = &rig.volume;
    for _ in 0..ios {
        let off = at.next(rig.span);
        match scenario {
            "read-hit-mem" | "read-hit-file" | "read-miss-mem" => v.read(off, buf).expect("read"),
            "quick-hit-mem" => v
                .read_if_cached(off, buf)
                .expect("every read is a ready hit")
                .expect("read"),
            "direct-hit-file" => {
                let range = v
                    .begin_cached_read(off, buf.len() as u64)
                    .expect("every read is a ready hit");
                std::hint::black_box(&range.pieces);
                range.finish(Ok(())).expect("finish");
            }
            "write-hit-mem" => v.write(off, buf, false).expect("write"),
            other => panic!("unknown scenario {other}"),
        }
    }
}

/// Runs every scenario under callgrind and prints instructions per IO.
fn callgrind(ios: u64) {
    let exe = std::env::current_exe().expect("this benchmark's path");
    let out = tempfile::tempdir().expect("a temporary directory");
    println!("instructions per IO (callgrind, {ios} IOs per scenario, counted inside `measured`)");
    for scenario in SCENARIOS {
        let run = std::process::Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg("--toggle-collect=*hit_path*measured*")
            .arg(format!(
                "--callgrind-out-file={}",
                out.path().join(scenario).display()
            ))
            .arg(&exe)
            .arg(scenario)
            .arg(ios.to_string())
            .output()
            .expect("valgrind runs (is it installed?)");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{scenario} under callgrind: {stderr}");
        let collected: u64 = stderr
            .lines()
            .find_map(|l| l.split("Collected :").nth(1))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no instruction count from callgrind: {stderr}"));
        println!("{scenario:<16} {:>8.0}", collected as f64 / ios as f64);
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if args.first().map(String::as_str) == Some("callgrind") {
        args.remove(0);
        let ios = args
            .first()
            .map_or(20_000, |n| n.parse().expect("IOS is a number"));
        return callgrind(ios);
    }
    let scenarios: Vec<&str> = match args.first() {
        Some(s) => vec![s.as_str()],
        None => SCENARIOS.to_vec(),
    };
    let ios: u64 = args
        .get(1)
        .map(|n| n.parse().expect("IOS is a number"))
        .unwrap_or(100_000);
    let threads: u64 = std::env::var("HIT_PATH_THREADS")
        .map(|n| n.parse().expect("HIT_PATH_THREADS is a number"))
        .unwrap_or(1)
        .max(1);
    for scenario in scenarios {
        let (mode, on_file, blocks) = match scenario {
            "read-hit-mem" | "quick-hit-mem" => (CacheMode::WriteThrough, false, CACHE_BLOCKS),
            "direct-hit-file" | "read-hit-file" => (CacheMode::WriteThrough, true, CACHE_BLOCKS),
            // Four times the cache, touched once each by the warm-up: the
            // random reads mostly miss and promote.
            "read-miss-mem" => (CacheMode::WriteThrough, false, 4 * CACHE_BLOCKS),
            "write-hit-mem" => (CacheMode::WriteBack, false, CACHE_BLOCKS),
            other => panic!("unknown scenario {other}; one of {SCENARIOS:?}"),
        };
        let rig = rig(mode, on_file, blocks);
        if scenario != "read-miss-mem" {
            warm(&rig, blocks, scenario == "write-hit-mem");
        }
        let before = rig.volume.stats().decisions;
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let rig = &rig;
                s.spawn(move || {
                    let mut buf = tiercache_device::AlignedBuf::new(IO);
                    measured(scenario, rig, ios / threads, &mut buf, t);
                });
            }
        });
        let ios = ios / threads * threads;
        let took = start.elapsed();
        let after = rig.volume.stats().decisions;
        let hits = (after.read_hits + after.write_hits) - (before.read_hits + before.write_hits);
        println!(
            "{scenario:<16} {ios} IOs on {threads} thread(s), {:.0} ns per IO ({:.2}M IOs/s), {:.1}% hits, {} promotions",
            took.as_nanos() as f64 / ios as f64,
            ios as f64 / took.as_secs_f64() / 1e6,
            100.0 * hits as f64 / ios as f64,
            after.promotions - before.promotions
        );
    }
}
