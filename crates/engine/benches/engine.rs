//! Engine overhead: 4 KiB reads that all hit, through the engine, against
//! the same reads straight from the memory device, with 1 and 2 threads.
//! Also RAM per cache block. Run: `cargo bench -p tiercache-engine`.

use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig};
use tiercache_types::{AdmissionKind, MonotonicClock, ReplacementKind};

const BLOCKS: u64 = 65_536;
const RUN: Duration = Duration::from_secs(2);

fn ops_per_sec(threads: usize, f: impl Fn(u64, &mut [u8]) + Sync) -> f64 {
    let total = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (f, total) = (&f, &total);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut buf = vec![0u8; 4096];
                let start = Instant::now();
                let mut n = 0u64;
                while start.elapsed() < RUN {
                    for _ in 0..256 {
                        f(rng.gen_range(0..BLOCKS) * 4096, &mut buf);
                    }
                    n += 256;
                }
                total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    total.into_inner() as f64 / RUN.as_secs_f64()
}

fn main() {
    println!("engine bench: 4 KiB random reads, all hits, {BLOCKS} blocks, {RUN:?} per run");
    println!(
        "{:<22} {:>8} {:>14} {:>14} {:>8}",
        "policy", "threads", "engine IOPS", "device IOPS", "ratio"
    );
    for (repl, adm) in [
        (ReplacementKind::Smq, AdmissionKind::Hotspot),
        (ReplacementKind::Lru, AdmissionKind::Always),
        (ReplacementKind::S3Fifo, AdmissionKind::Always),
    ] {
        let backing = Arc::new(MemDevice::new(BLOCKS * 4096));
        let cache = Arc::new(MemDevice::new(BLOCKS * 4096));
        let mut cfg = EngineConfig {
            block_size: 4096,
            sequential_cutoff: 0,
            ..EngineConfig::default()
        };
        cfg.policy.replacement = repl;
        cfg.policy.admission = adm;
        let engine = Engine::new(
            backing as Arc<dyn BlockDevice>,
            cache.clone() as Arc<dyn BlockDevice>,
            &cfg,
            Arc::new(MonotonicClock::new()),
        )
        .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for off in (0..BLOCKS * 4096).step_by(1 << 20) {
            engine.read(off, &mut buf).unwrap();
        }
        // Fill by reading every block until all are resident.
        for _ in 0..4 {
            for b in 0..BLOCKS {
                engine.read(b * 4096, &mut buf[..4096]).unwrap();
            }
        }
        let s = engine.stats();
        assert_eq!(s.decisions.resident, BLOCKS, "warm-up left blocks out");
        for threads in [1, 2] {
            let e = ops_per_sec(threads, |off, b| engine.read(off, b).unwrap());
            let d = ops_per_sec(threads, |off, b| cache.read_at(b, off).unwrap());
            println!(
                "{:<22} {:>8} {:>14.0} {:>14.0} {:>8.2}",
                format!("{repl}+{adm}"),
                threads,
                e,
                d,
                e / d
            );
        }
        println!(
            "{:<22} RAM per cache block: {:.1} bytes",
            format!("{repl}+{adm}"),
            engine.memory_bytes_per_block()
        );
    }
}
