//! Many threads at once: writers own disjoint sector ranges (which share
//! cache blocks with their neighbours), readers read everywhere, a third
//! party switches modes and cleans. Every sector carries a tag (sector
//! number, write sequence) so a read can tell stale or torn data apart.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_engine::Engine;
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

const SECTOR: usize = 512;
const WRITERS: usize = 3;
const READERS: usize = 2;
/// Sectors per writer region: 9 KiB + 512, so regions straddle blocks.
const REGION: u64 = 19;
const TOTAL: u64 = REGION * WRITERS as u64 * 20;

fn tag(sector: u64, seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (sector
            .wrapping_mul(31)
            .wrapping_add(seq.wrapping_mul(17))
            .wrapping_add(i as u64)) as u8;
    }
}

/// The write sequence a sector holds; panics on a torn or misplaced sector.
fn decode(sector: u64, data: &[u8]) -> u64 {
    if data.iter().all(|&b| b == 0) {
        return 0;
    }
    let s = u64::from_le_bytes(data[..8].try_into().unwrap());
    let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
    assert_eq!(s, sector, "sector {sector} holds data of sector {s}");
    let mut want = vec![0u8; SECTOR];
    tag(sector, seq, &mut want);
    assert!(data == &want[..], "sector {sector} is torn (seq {seq})");
    seq
}

struct Shared {
    engine: Engine,
    started: Vec<AtomicU64>,
    completed: Vec<AtomicU64>,
    stop: AtomicBool,
    /// Reads completed by all readers so far.
    reads: AtomicU64,
}

fn writer(sh: &Shared, id: usize, seed: u64, seq: &AtomicU64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Writer `id` owns every region r with r % WRITERS == id.
    let regions: Vec<u64> = (0..TOTAL / REGION)
        .filter(|r| r % WRITERS as u64 == id as u64)
        .collect();
    while !sh.stop.load(Ordering::Relaxed) {
        let r = regions[rng.gen_range(0..regions.len())];
        let start = r * REGION + rng.gen_range(0..REGION);
        let n = rng.gen_range(1..=(r * REGION + REGION - start));
        let s = seq.fetch_add(1, Ordering::Relaxed);
        let mut buf = vec![0u8; n as usize * SECTOR];
        for k in 0..n {
            tag(
                start + k,
                s,
                &mut buf[k as usize * SECTOR..(k as usize + 1) * SECTOR],
            );
            sh.started[(start + k) as usize].store(s, Ordering::SeqCst);
        }
        sh.engine
            .write(start * SECTOR as u64, &buf, rng.gen_bool(0.05))
            .unwrap();
        for k in 0..n {
            sh.completed[(start + k) as usize].store(s, Ordering::SeqCst);
        }
        if rng.gen_bool(0.02) {
            sh.engine.flush().unwrap();
        }
    }
}

fn reader(sh: &Shared, seed: u64) -> u64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut reads = 0;
    while !sh.stop.load(Ordering::Relaxed) {
        let start = rng.gen_range(0..TOTAL);
        let n = rng.gen_range(1..=(TOTAL - start).min(64));
        let lo: Vec<u64> = (start..start + n)
            .map(|s| sh.completed[s as usize].load(Ordering::SeqCst))
            .collect();
        let mut buf = vec![0u8; n as usize * SECTOR];
        sh.engine.read(start * SECTOR as u64, &mut buf).unwrap();
        for k in 0..n {
            let s = start + k;
            let got = decode(s, &buf[k as usize * SECTOR..(k as usize + 1) * SECTOR]);
            let hi = sh.started[s as usize].load(Ordering::SeqCst);
            assert!(
                got >= lo[k as usize],
                "stale read of sector {s}: got seq {got}, a write of seq {} had completed",
                lo[k as usize]
            );
            assert!(
                got <= hi,
                "sector {s} holds seq {got} never started (latest {hi})"
            );
        }
        reads += 1;
        sh.reads.fetch_add(1, Ordering::Relaxed);
    }
    reads
}

fn hammer(
    mode: CacheMode,
    repl: ReplacementKind,
    adm: AdmissionKind,
    block_size: u32,
    iterations_ms: u64,
) {
    let cfg = config(mode, repl, adm, block_size, 0);
    // A cache far smaller than the data: promotions and evictions all the time.
    let r = rig(TOTAL * SECTOR as u64, 6, &cfg);
    let sh = Arc::new(Shared {
        engine: r.engine,
        started: (0..TOTAL).map(|_| AtomicU64::new(0)).collect(),
        completed: (0..TOTAL).map(|_| AtomicU64::new(0)).collect(),
        stop: AtomicBool::new(false),
        reads: AtomicU64::new(0),
    });
    let seq = Arc::new(AtomicU64::new(1));
    std::thread::scope(|scope| {
        for w in 0..WRITERS {
            let (sh, seq) = (sh.clone(), seq.clone());
            scope.spawn(move || writer(&sh, w, 100 + w as u64, &seq));
        }
        let mut readers = Vec::new();
        for k in 0..READERS {
            let sh = sh.clone();
            readers.push(scope.spawn(move || reader(&sh, 900 + k as u64)));
        }
        // The operator: switches modes and cleans while IO runs.
        let op = {
            let sh = sh.clone();
            scope.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                let modes = [
                    mode,
                    CacheMode::WriteBack,
                    CacheMode::WriteThrough,
                    CacheMode::WriteAround,
                    CacheMode::PassThrough,
                ];
                let no_modes = std::env::var("NO_MODES").is_ok();
                let no_clean = std::env::var("NO_CLEAN").is_ok();
                while !sh.stop.load(Ordering::Relaxed) {
                    if !no_modes && rng.gen_bool(0.3) {
                        sh.engine
                            .set_mode(modes[rng.gen_range(0..modes.len())])
                            .unwrap();
                    }
                    if !no_clean {
                        sh.engine.clean(rng.gen_range(1..4)).unwrap();
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                sh.engine.set_mode(mode).unwrap();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(iterations_ms));
        // On a loaded machine the readers may have had little CPU: give them
        // time (bounded) to make real progress before stopping.
        let patience = std::time::Instant::now();
        while sh.reads.load(Ordering::Relaxed) < 50
            && patience.elapsed() < std::time::Duration::from_secs(30)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        sh.stop.store(true, Ordering::Relaxed);
        op.join().unwrap();
        let total_reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(total_reads > 10, "readers made progress");
    });
    // Quiescent: the whole device reads back as the last completed writes.
    let mut buf = vec![0u8; TOTAL as usize * SECTOR];
    sh.engine.read(0, &mut buf).unwrap();
    for s in 0..TOTAL {
        let got = decode(s, &buf[s as usize * SECTOR..(s as usize + 1) * SECTOR]);
        assert_eq!(
            got,
            sh.completed[s as usize].load(Ordering::SeqCst),
            "sector {s} after the run"
        );
    }
    sh.engine.drain(|_, _| {}).unwrap();
    let mut back = vec![0u8; TOTAL as usize * SECTOR];
    r.backing.read_at_for_test(&mut back);
    assert!(back == buf, "backing device after drain differs");
}

trait ReadAll {
    fn read_at_for_test(&self, buf: &mut [u8]);
}
impl ReadAll for tiercache_device::MemDevice {
    fn read_at_for_test(&self, buf: &mut [u8]) {
        tiercache_device::BlockDevice::read_at(self, buf, 0).unwrap();
    }
}

#[test]
fn concurrent_io_never_reads_stale_or_torn_data() {
    for (mode, repl, adm) in all_stacks() {
        for bs in [4096u32, 16384] {
            hammer(mode, repl, adm, bs, 60);
        }
    }
}
