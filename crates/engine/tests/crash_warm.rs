//! Clean blocks survive a crash (they come back warm when their claim's crc
//! still matches the slot), and the rules of `claims.rs` that keep such a
//! claim true: each test below builds the exact crash that breaks one rule
//! if it is missing (the cache device loses its unflushed writes, the
//! backing device keeps its own).

use std::sync::Arc;
use tiercache_device::{BlockDevice, CrashDevice};
use tiercache_engine::{Engine, EngineConfig, OpenOptions, OpenReport};
use tiercache_policy::PolicyConfig;
use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

const BLOCK: usize = 4096;
const BACKING_BLOCKS: u64 = 256;

struct Rig {
    backing: Arc<CrashDevice>,
    cache: Arc<CrashDevice>,
    clock: Arc<ManualClock>,
}

/// A persistent engine over crash devices; `cache_blocks` bounds the cache.
fn rig(mode: CacheMode, cache_blocks: u64) -> (Rig, Engine) {
    let rig = Rig {
        backing: Arc::new(CrashDevice::new(BACKING_BLOCKS * BLOCK as u64)),
        // Metadata (1 MiB journal, 2 superblocks, 2 volume-table blocks of
        // a small cache, 2 snapshot blocks for up to 252 slots) then the
        // slots.
        cache: Arc::new(CrashDevice::new(
            (1 << 20) + (6 + cache_blocks) * BLOCK as u64,
        )),
        clock: Arc::new(ManualClock::new(Time(1))),
    };
    let cfg = EngineConfig {
        mode,
        block_size: BLOCK as u32,
        sequential_cutoff: 0,
        policy: PolicyConfig {
            replacement: ReplacementKind::Lru,
            admission: AdmissionKind::Always,
            ..PolicyConfig::default()
        },
        ..EngineConfig::default()
    };
    let e = Engine::create(
        rig.backing.clone() as Arc<dyn BlockDevice>,
        rig.cache.clone() as Arc<dyn BlockDevice>,
        &cfg,
        rig.clock.clone(),
        "backing",
        Some(1 << 20),
    )
    .unwrap();
    (rig, e)
}

impl Rig {
    /// Power cut: the cache device loses what was not flushed; the backing
    /// device keeps everything written to it (the worst case for a stale
    /// clean claim).
    fn crash_keeping_backing(&self, e: Engine) {
        drop(e);
        self.backing.flush().unwrap();
        self.cache.crash();
    }

    fn reopen(&self) -> (Engine, OpenReport) {
        self.reopen_in(None)
    }

    fn reopen_in(&self, mode: Option<CacheMode>) -> (Engine, OpenReport) {
        Engine::open(
            self.backing.clone() as Arc<dyn BlockDevice>,
            self.cache.clone() as Arc<dyn BlockDevice>,
            &OpenOptions {
                mode,
                ..OpenOptions::default()
            },
            self.clock.clone(),
            "backing",
        )
        .unwrap()
    }
}

/// A new writethrough engine (the default policy, no sequential bypass)
/// over `backing` and `cache`, its metadata in the cache's first MiB.
fn writethrough_engine(
    backing: Arc<dyn BlockDevice>,
    cache: Arc<dyn BlockDevice>,
    clock: Arc<ManualClock>,
) -> Engine {
    let cfg = EngineConfig {
        mode: CacheMode::WriteThrough,
        block_size: BLOCK as u32,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    };
    Engine::create(backing, cache, &cfg, clock, "backing", Some(1 << 20)).unwrap()
}

fn block_of(byte: u8) -> Vec<u8> {
    vec![byte; BLOCK]
}

fn read_block(e: &Engine, b: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK];
    e.read(b * BLOCK as u64, &mut buf).unwrap();
    buf
}

/// Writes block `b` full of `byte` on the backing device only (through a
/// passthrough engine would drop the cached copy; here we want "the block
/// has data before the cache saw it").
fn seed_backing(r: &Rig, blocks: std::ops::Range<u64>) {
    for b in blocks {
        r.backing
            .write_at(&block_of(b as u8 + 1), b * BLOCK as u64)
            .unwrap();
    }
    r.backing.flush().unwrap();
}

#[test]
fn writethrough_clean_blocks_are_warm_after_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..32);
    for b in 0..32 {
        assert_eq!(read_block(&e, b), block_of(b as u8 + 1));
    }
    e.flush().unwrap(); // commits the clean claims (the cleaner would, every second)
    drop(e);
    r.cache.crash();
    r.backing.crash();
    let (e, report) = r.reopen();
    assert!(!report.was_clean_shutdown);
    assert_eq!(report.restored_blocks, 32, "{report:?}");
    assert_eq!(report.unverified_clean, 32, "{report:?}");
    assert_eq!(report.dropped_clean, 0, "{report:?}");
    for b in 0..32 {
        assert_eq!(read_block(&e, b), block_of(b as u8 + 1));
    }
    let s = e.stats();
    assert_eq!((s.decisions.read_hits, s.decisions.read_misses), (32, 0));
    let checked = e.restore_check();
    assert_eq!(
        (checked.unverified, checked.verified, checked.dropped),
        (0, 32, 0),
        "each checked before its first hit"
    );
}

#[test]
fn writeback_blocks_cleaned_before_a_crash_come_back_clean() {
    let (r, e) = rig(CacheMode::WriteBack, 64);
    for b in 0..16 {
        e.write(b * BLOCK as u64, &block_of(0x40 + b as u8), false)
            .unwrap();
    }
    e.flush().unwrap();
    assert_eq!(e.clean(100).unwrap(), 16);
    for b in 16..24 {
        e.write(b * BLOCK as u64, &block_of(0x40 + b as u8), false)
            .unwrap();
    }
    e.flush().unwrap();
    drop(e);
    r.cache.crash();
    r.backing.crash();
    let (e, report) = r.reopen();
    assert_eq!(report.restored_dirty, 8, "{report:?}");
    assert_eq!(report.unverified_clean, 16, "{report:?}");
    assert_eq!(report.restored_blocks, 24, "{report:?}");
    for b in 0..24 {
        assert_eq!(read_block(&e, b), block_of(0x40 + b as u8));
    }
    let s = e.stats();
    assert_eq!((s.decisions.read_hits, s.decisions.read_misses), (24, 0));
}

/// Blocks 0..4 (contents 1..=4) cached clean in `mode` and claimed, then a
/// crash after which the cached copy of block 2 is scribbled over behind
/// the engine's back: its claim no longer matches.
fn crash_with_block_2_corrupted(mode: CacheMode) -> Rig {
    let (r, e) = rig(mode, 64);
    seed_backing(&r, 0..4);
    for b in 0..4 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    drop(e);
    // The data area starts after the metadata; find block 2's copy by its
    // content.
    let image = r.cache.durable_image();
    let needle = block_of(3);
    let at = image
        .chunks(BLOCK)
        .position(|c| c == &needle[..])
        .expect("block 2 is cached");
    r.cache
        .write_at(&block_of(0xEE), (at * BLOCK) as u64)
        .unwrap();
    r.cache.flush().unwrap();
    r.cache.crash();
    r
}

#[test]
fn a_claim_that_no_longer_matches_is_dropped_before_its_first_hit() {
    let r = crash_with_block_2_corrupted(CacheMode::WriteThrough);
    let (e, report) = r.reopen();
    assert_eq!(report.unverified_clean, 4, "{report:?}");
    assert_eq!(report.verified_clean, 0, "nothing read at open");
    let mut buf = vec![0u8; BLOCK];
    assert!(
        e.read_if_cached(2 * BLOCK as u64, &mut buf).is_none(),
        "an unchecked block is no quick hit"
    );
    assert_eq!(
        read_block(&e, 2),
        block_of(3),
        "served from the backing device"
    );
    let s = e.stats();
    assert_eq!((s.decisions.read_hits, s.decisions.read_misses), (0, 1));
    assert_eq!(e.restore_check().dropped, 1);
    assert_eq!(read_block(&e, 1), block_of(2), "a matching block is a hit");
    assert_eq!(e.stats().decisions.read_hits, 1);
}

#[test]
fn a_claim_that_no_longer_matches_is_dropped_by_the_background_check() {
    let r = crash_with_block_2_corrupted(CacheMode::WriteThrough);
    let (e, _) = r.reopen();
    let checked = e.verify_all_restored();
    assert_eq!(
        (checked.unverified, checked.verified, checked.dropped),
        (0, 3, 1)
    );
    let mut buf = vec![0u8; BLOCK];
    assert!(e.read_if_cached(BLOCK as u64, &mut buf).is_some());
    assert_eq!(read_block(&e, 2), block_of(3));
    let s = e.stats();
    assert_eq!((s.decisions.read_hits, s.decisions.read_misses), (1, 1));
}

#[test]
fn a_claim_that_no_longer_matches_is_dropped_at_open_when_asked() {
    let r = crash_with_block_2_corrupted(CacheMode::WriteThrough);
    let (e, report) = Engine::open(
        r.backing.clone() as Arc<dyn BlockDevice>,
        r.cache.clone() as Arc<dyn BlockDevice>,
        &OpenOptions {
            verify_clean_at_open: true,
            ..OpenOptions::default()
        },
        r.clock.clone(),
        "backing",
    )
    .unwrap();
    assert_eq!(report.verified_clean, 4, "{report:?}");
    assert_eq!(report.dropped_clean, 1, "{report:?}");
    assert_eq!(report.unverified_clean, 0, "{report:?}");
    assert_eq!(read_block(&e, 2), block_of(3));
}

/// A partial write in place must not keep the unchecked rest of a block
/// whose claim no longer matches.
#[test]
fn a_partial_write_to_a_block_that_no_longer_matches_keeps_none_of_it() {
    let r = crash_with_block_2_corrupted(CacheMode::WriteBack);
    let (e, _) = r.reopen();
    e.write(2 * BLOCK as u64, &[0x77; 512], false).unwrap();
    let got = read_block(&e, 2);
    assert_eq!(&got[..512], &[0x77; 512][..]);
    assert_eq!(&got[512..], &block_of(3)[512..], "the rest from backing");
}

/// A clean shutdown before the background check finished writes a mapping
/// the next open trusts: what it holds must have been checked.
#[test]
fn a_clean_shutdown_checks_the_restored_blocks_first() {
    let r = crash_with_block_2_corrupted(CacheMode::WriteThrough);
    let (e, _) = r.reopen();
    e.shutdown(false).unwrap();
    assert_eq!(e.restore_check().dropped, 1);
    drop(e);
    let (e, report) = r.reopen();
    assert!(report.was_clean_shutdown);
    assert_eq!(report.restored_blocks, 3, "{report:?}");
    assert_eq!(read_block(&e, 2), block_of(3));
}

/// Rule 2: a writethrough write hit on a block with a durable clean claim.
#[test]
fn writethrough_hit_after_claim_is_not_undone_by_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..8);
    for b in 0..8 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    e.write(3 * BLOCK as u64, &block_of(0xAB), false).unwrap();
    r.crash_keeping_backing(e);
    let (e, _) = r.reopen();
    assert_eq!(read_block(&e, 3), block_of(0xAB));
}

/// The same in writearound (hits update the cached copy in place).
#[test]
fn writearound_hit_after_claim_is_not_undone_by_a_crash() {
    let (r, e) = rig(CacheMode::WriteAround, 64);
    seed_backing(&r, 0..8);
    for b in 0..8 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    // A partial write too: only part of the slot changes.
    e.write(5 * BLOCK as u64 + 512, &[0xCD; 1024], false)
        .unwrap();
    r.crash_keeping_backing(e);
    let (e, _) = r.reopen();
    let got = read_block(&e, 5);
    assert_eq!(&got[512..1536], &[0xCD; 1024][..]);
    assert_eq!(&got[..512], &block_of(6)[..512]);
}

/// Rule 3: a block evicted while its clean claim is durable, then written
/// on the backing device only (a partial write allocates nothing) before
/// the slot's new owner is committed.
#[test]
fn backing_write_of_an_evicted_claimed_block_is_not_undone_by_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 4);
    assert_eq!(e.capacity(), 4);
    seed_backing(&r, 0..8);
    for b in 0..4 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    // Evict block 0 (LRU) by reading block 4; its slot is refilled, but
    // that fill is not flushed.
    read_block(&e, 4);
    e.write(512, &[0x77; 512], false).unwrap();
    r.crash_keeping_backing(e);
    let (e, _) = r.reopen();
    let got = read_block(&e, 0);
    assert_eq!(&got[512..1024], &[0x77; 512][..]);
}

/// Rule 3 through passthrough: switching to passthrough and writing a
/// cached block drops the cached copy and writes only the backing device.
#[test]
fn passthrough_write_of_a_claimed_block_is_not_undone_by_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..8);
    for b in 0..8 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    e.set_mode(CacheMode::PassThrough).unwrap();
    e.write(2 * BLOCK as u64, &block_of(0x99), false).unwrap();
    r.crash_keeping_backing(e);
    // Back in writethrough, where a restored claim would be served.
    let (e, _) = r.reopen_in(Some(CacheMode::WriteThrough));
    assert_eq!(read_block(&e, 2), block_of(0x99));
}

/// Rule 3 through trim and write-zeroes on the backing device.
#[test]
fn trimmed_then_written_claimed_block_is_not_undone_by_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 4);
    seed_backing(&r, 0..8);
    for b in 0..4 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    e.trim(BLOCK as u64, BLOCK as u64).unwrap();
    e.write(BLOCK as u64 + 1024, &[0x55; 512], false).unwrap();
    r.crash_keeping_backing(e);
    let (e, _) = r.reopen();
    let got = read_block(&e, 1);
    assert_eq!(&got[1024..1536], &[0x55; 512][..]);
}

/// A clean restart keeps the claims' crcs, so a crash after it is warm too.
#[test]
fn clean_restart_then_crash_is_still_warm() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..16);
    for b in 0..16 {
        read_block(&e, b);
    }
    e.shutdown(false).unwrap();
    drop(e);
    let (e, report) = r.reopen();
    assert!(report.was_clean_shutdown);
    assert_eq!(report.restored_blocks, 16);
    // One block changes after the restart: its claim must not survive.
    e.write(7 * BLOCK as u64, &block_of(0x11), false).unwrap();
    r.crash_keeping_backing(e);
    let (e, report) = r.reopen();
    assert!(!report.was_clean_shutdown);
    assert!(report.unverified_clean >= 15, "{report:?}");
    for b in 0..16 {
        let want = if b == 7 { 0x11 } else { b as u8 + 1 };
        assert_eq!(read_block(&e, b), block_of(want), "block {b}");
    }
    let s = e.stats();
    assert!(s.decisions.read_hits >= 15, "{:?}", s.decisions);
}

/// Rule 1: a claim still waiting for its commit when the slot changes (here
/// a failed in-place write drops the cached copy, so the slot keeps the old
/// data while the backing device gets the new) must not be committed.
#[test]
fn a_claim_overtaken_before_its_commit_is_not_committed() {
    use tiercache_device::{FaultDevice, FaultOp, FaultRule};
    let backing = Arc::new(CrashDevice::new(BACKING_BLOCKS * BLOCK as u64));
    let cache = Arc::new(FaultDevice::new(CrashDevice::new(
        (1 << 20) + 68 * BLOCK as u64,
    )));
    let clock = Arc::new(ManualClock::new(Time(1)));
    let e = writethrough_engine(backing.clone(), cache.clone(), clock.clone());
    backing.write_at(&block_of(1), 0).unwrap();
    read_block(&e, 0); // promoted; its clean claim is buffered
    cache.set_rules(vec![FaultRule::always(FaultOp::Write)]);
    e.write(0, &block_of(2), false).unwrap();
    cache.set_rules(vec![]);
    e.flush().unwrap();
    drop(e); // no clean shutdown
    let (e, report) = Engine::open(
        backing.clone() as Arc<dyn BlockDevice>,
        cache.clone() as Arc<dyn BlockDevice>,
        &OpenOptions::default(),
        clock,
        "backing",
    )
    .unwrap();
    assert!(!report.was_clean_shutdown);
    assert_eq!(read_block(&e, 0), block_of(2));
}

/// A block written in writethrough after its claim loses the claim (so
/// later writes need no flush); `reclaim` (the idle cleaner) claims it
/// again from the cache device, and it survives a crash.
#[test]
fn written_blocks_are_reclaimed_and_then_survive_a_crash() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..8);
    for b in 0..8 {
        read_block(&e, b);
    }
    e.flush().unwrap();
    e.write(2 * BLOCK as u64, &block_of(0x42), false).unwrap();
    e.write(3 * BLOCK as u64 + 512, &[0x43; 512], false)
        .unwrap();
    e.flush().unwrap();
    assert_eq!(e.reclaim(100).unwrap(), 2, "the two written blocks");
    assert_eq!(e.reclaim(100).unwrap(), 0, "nothing left to claim");
    e.flush().unwrap();
    drop(e);
    r.cache.crash();
    r.backing.crash();
    let (e, report) = r.reopen();
    assert_eq!(report.unverified_clean, 8, "{report:?}");
    assert_eq!(report.dropped_clean, 0, "{report:?}");
    assert_eq!(read_block(&e, 2), block_of(0x42));
    assert_eq!(&read_block(&e, 3)[512..1024], &[0x43; 512][..]);
    assert_eq!(e.stats().decisions.read_misses, 0);
}

/// The lazy check under concurrent IO: after a crash that left a third of
/// the cached copies corrupted, four threads read (the normal and the
/// quick path) and write their own blocks while a background thread checks
/// the restored blocks: every read returns the block's last written data,
/// never a corrupted copy.
#[test]
fn restored_blocks_are_checked_safely_while_clients_run() {
    const N: u64 = 48;
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..N);
    for b in 0..N {
        read_block(&e, b);
    }
    e.flush().unwrap();
    drop(e);
    let image = r.cache.durable_image();
    let mut corrupted = 0;
    for (slot, chunk) in image.chunks(BLOCK).enumerate() {
        let byte = chunk[0];
        if (1..=N as u8).contains(&byte) && byte % 3 == 0 && chunk.iter().all(|&x| x == byte) {
            r.cache
                .write_at(&[byte ^ 0x5A; 512], (slot * BLOCK + 1024) as u64)
                .unwrap();
            corrupted += 1;
        }
    }
    assert_eq!(corrupted, N / 3);
    r.cache.flush().unwrap();
    r.cache.crash();
    let (e, report) = r.reopen();
    assert_eq!(report.unverified_clean, N, "{report:?}");
    let e = Arc::new(e);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && e.verify_restored(4 * BLOCK as u64) > 0
            {
                std::thread::yield_now();
            }
        })
    };
    let clients: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mine: Vec<u64> = (0..N).filter(|b| b % 4 == t).collect();
                let mut want: Vec<Vec<u8>> = mine.iter().map(|&b| block_of(b as u8 + 1)).collect();
                let mut x = t + 1;
                for round in 0..400u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x % mine.len() as u64) as usize;
                    let off = mine[i] * BLOCK as u64;
                    match x % 5 {
                        0 => {
                            // A partial write in place.
                            let data = vec![(round % 200) as u8 + 50; 512];
                            e.write(off + 512, &data, false).unwrap();
                            want[i][512..1024].copy_from_slice(&data);
                        }
                        1 => {
                            let mut buf = vec![0u8; BLOCK];
                            if let Some(r) = e.read_if_cached(off, &mut buf) {
                                r.unwrap();
                                assert_eq!(buf, want[i], "quick read of block {}", mine[i]);
                            }
                        }
                        _ => {
                            let mut buf = vec![0u8; BLOCK];
                            e.read(off, &mut buf).unwrap();
                            assert_eq!(buf, want[i], "read of block {}", mine[i]);
                        }
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    checker.join().unwrap();
    let checked = e.verify_all_restored();
    assert_eq!(checked.unverified, 0);
    assert!(checked.dropped <= N / 3, "{checked:?}");
}

/// The backing flush of a commit with clean claims is skipped when nothing
/// was written to the backing device since its last flush
/// (`backing_flush.rs`); a writethrough write in between must bring it
/// back, or the claim of the written block would outlive the data when the
/// backing device loses its unflushed writes.
#[test]
fn a_claim_of_data_written_through_survives_the_backing_losing_unflushed_writes() {
    let (r, e) = rig(CacheMode::WriteThrough, 64);
    seed_backing(&r, 0..32);
    // A read miss and a commit: the backing's first flush is spent here.
    assert_eq!(read_block(&e, 0), block_of(1));
    e.commit().unwrap();
    assert_eq!(r.backing.unflushed_sectors(), 0);
    // Written through (the client never asks for a flush), then another
    // read miss whose claim goes out in the same commit as the write's.
    e.write(5 * BLOCK as u64, &block_of(0xAB), false).unwrap();
    assert_eq!(read_block(&e, 1), block_of(2));
    e.commit().unwrap();
    assert_eq!(
        r.backing.unflushed_sectors(),
        0,
        "the commit flushed the backing device the write went to"
    );
    drop(e);
    r.cache.crash();
    r.backing.crash();
    let (e, _) = r.reopen();
    let mut on_backing = vec![0u8; BLOCK];
    r.backing
        .read_at(&mut on_backing, 5 * BLOCK as u64)
        .unwrap();
    assert_eq!(
        read_block(&e, 5),
        on_backing,
        "the cache and the backing device agree"
    );
    assert_eq!(on_backing, block_of(0xAB));
}

/// Read misses alone flush the backing device once, not at every commit.
#[test]
fn read_misses_alone_flush_the_backing_device_once() {
    use tiercache_device::CountingDevice;
    let backing = Arc::new(CountingDevice::new(CrashDevice::new(
        BACKING_BLOCKS * BLOCK as u64,
    )));
    let cache = Arc::new(CrashDevice::new((1 << 20) + 70 * BLOCK as u64));
    let e = writethrough_engine(backing.clone(), cache, Arc::new(ManualClock::new(Time(1))));
    for b in 0..8 {
        read_block(&e, b);
        e.commit().unwrap();
    }
    assert_eq!(backing.snapshot().flushes, 1, "{:?}", backing.snapshot());
    e.write(20 * BLOCK as u64, &block_of(7), false).unwrap();
    read_block(&e, 9);
    e.commit().unwrap();
    assert_eq!(backing.snapshot().flushes, 2, "{:?}", backing.snapshot());
}
