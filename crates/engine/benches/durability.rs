//! Cost of persistence: metadata bytes written per client write in
//! writeback (write amplification), write IOPS with a FLUSH every N writes
//! against a volatile engine, and recovery (open) time after a crash with
//! many dirty blocks. Run: `cargo bench -p tiercache-engine --bench durability`.

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use tiercache_device::{BlockDevice, CountingDevice, FileDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig, OpenOptions};
use tiercache_types::{CacheMode, MonotonicClock};

const WRITES: u64 = 20_000;

fn cfg() -> EngineConfig {
    EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: 4096,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    }
}

fn main() {
    let dir = std::env::var("TIERCACHE_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    println!("durability bench: {WRITES} random 4 KiB writes, writeback, 4 KiB blocks");
    println!(
        "{:<34} {:>12} {:>16} {:>14}",
        "setup", "write IOPS", "meta B / write", "vs volatile"
    );
    let mut baseline = None;
    for flush_every in [0u64, 1, 8, 64] {
        let backing = Arc::new(MemDevice::new(1 << 30));
        let cache = Arc::new(CountingDevice::new(MemDevice::new(256 << 20)));
        let clock = Arc::new(MonotonicClock::new());
        let engine = if flush_every == 0 {
            Engine::new(
                backing,
                cache.clone() as Arc<dyn BlockDevice>,
                &cfg(),
                clock,
            )
            .unwrap()
        } else {
            Engine::create(
                backing,
                cache.clone() as Arc<dyn BlockDevice>,
                &cfg(),
                clock,
                "b",
                None,
            )
            .unwrap()
        };
        let before = cache.snapshot();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let buf = vec![0x5au8; 4096];
        let t = Instant::now();
        for i in 1..=WRITES {
            let off = rng.gen_range(0..(1u64 << 30) / 4096) * 4096;
            engine.write(off, &buf, false).unwrap();
            if flush_every > 0 && i % flush_every == 0 {
                engine.flush().unwrap();
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let c = cache.snapshot().since(&before);
        let meta = c.bytes_written.saturating_sub(WRITES * 4096);
        let iops = WRITES as f64 / secs;
        let base = *baseline.get_or_insert(iops);
        let name = if flush_every == 0 {
            "volatile (no metadata)".to_string()
        } else {
            format!("persistent, FLUSH every {flush_every}")
        };
        println!(
            "{:<34} {:>12.0} {:>16.1} {:>13.0}%",
            name,
            iops,
            meta as f64 / WRITES as f64,
            iops / base * 100.0
        );
    }

    // Recovery: a cache of ~1M blocks on a file, 200k of them dirty and
    // ~400k clean with crc-carrying claims (written back by the cleaner),
    // which recovery reads and verifies.
    let blocks: u64 = 1 << 20;
    let path = std::path::Path::new(&dir).join("tiercache-recovery-bench.img");
    let bpath = std::path::Path::new(&dir).join("tiercache-recovery-backing.img");
    let cache = Arc::new(FileDevice::create(&path, blocks * 4096 + (64 << 20)).unwrap())
        as Arc<dyn BlockDevice>;
    let backing = Arc::new(FileDevice::create(&bpath, 8 << 30).unwrap()) as Arc<dyn BlockDevice>;
    let e = Engine::create(
        backing.clone(),
        cache.clone(),
        &cfg(),
        Arc::new(MonotonicClock::new()),
        "b",
        None,
    )
    .unwrap();
    let buf = vec![1u8; 1 << 20];
    let dirty_target = 600_000u64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let mut written = 0;
    while written < dirty_target {
        // 1 MiB writes at random places: 256 dirty blocks each.
        let off = rng.gen_range(0..(8u64 << 30) / (1 << 20)) * (1 << 20);
        e.write(off, &buf, false).unwrap();
        written += 256;
    }
    e.flush().unwrap();
    let to_clean = e.dirty_blocks().saturating_sub(200_000) as usize;
    let mut cleaned = 0;
    while cleaned < to_clean {
        cleaned += e.clean(to_clean - cleaned).unwrap();
    }
    e.flush().unwrap();
    let dirty = e.dirty_blocks();
    drop(e); // no clean shutdown: as after a crash
             // Open to the first read answered, with the clean claims checked
             // lazily (the default) and at open, interleaved rounds, medians.
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..3 {
        for (i, at_open) in [false, true].into_iter().enumerate() {
            let t = Instant::now();
            let (e, report) = Engine::open(
                backing.clone(),
                cache.clone(),
                &OpenOptions {
                    verify_clean_at_open: at_open,
                    ..OpenOptions::default()
                },
                Arc::new(MonotonicClock::new()),
                "b",
            )
            .unwrap();
            let mut block = vec![0u8; 4096];
            e.read(0, &mut block).unwrap();
            times[i].push(t.elapsed().as_secs_f64());
            if round == 0 {
                println!(
                    "recovery after a crash ({}): {} slots, {} dirty restored (of {dirty}), {} clean claims checked at open ({} dropped), {} left to check lazily, {} journal records replayed",
                    if at_open { "checked at open" } else { "lazy" },
                    e.capacity(),
                    report.restored_dirty,
                    report.verified_clean,
                    report.dropped_clean,
                    report.unverified_clean,
                    report.journal_records_replayed,
                );
            }
            drop(e); // again no clean shutdown
        }
    }
    for (name, mut t) in ["lazy check (default)", "checked at open"]
        .into_iter()
        .zip(times)
    {
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "open to first read, {name}: median {:.0} ms (file device in {dir})",
            t[t.len() / 2] * 1000.0
        );
    }
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(bpath);
}
