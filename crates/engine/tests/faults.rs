//! Cache device faults: in writethrough and writearound a failing cache
//! device never fails a client IO and never serves stale data; after too
//! many errors the cache is taken out of use and stats say why. In
//! writeback, blocks whose only copy is on the failed device fail loudly.

mod common;

use common::*;
use proptest::prelude::*;
use std::sync::Arc;
use tiercache_device::{BlockDevice, FaultDevice, FaultOp, FaultRule, MemDevice};
use tiercache_engine::{Engine, EngineError};
use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

const SECTOR: u64 = 512;
const TOTAL_SECTORS: u64 = 2048;

struct FaultRig {
    engine: Engine,
    cache: Arc<FaultDevice<MemDevice>>,
    backing: Arc<MemDevice>,
}

fn fault_rig(mode: CacheMode, repl: ReplacementKind, error_limit: u64, seed: u64) -> FaultRig {
    let mut cfg = config(mode, repl, AdmissionKind::Always, 4096, 0);
    cfg.cache_error_limit = error_limit;
    let backing = Arc::new(MemDevice::new(TOTAL_SECTORS * SECTOR));
    let cache = Arc::new(FaultDevice::with_seed(MemDevice::new(16 * 4096), seed));
    let engine = Engine::new(
        backing.clone() as Arc<dyn BlockDevice>,
        cache.clone() as Arc<dyn BlockDevice>,
        &cfg,
        Arc::new(ManualClock::new(Time(1))),
    )
    .unwrap();
    FaultRig {
        engine,
        cache,
        backing,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn failing_cache_never_fails_or_misleads_clients(
        mode in prop::sample::select(vec![CacheMode::WriteThrough, CacheMode::WriteAround]),
        repl in prop::sample::select(ReplacementKind::ALL.to_vec()),
        rate in 0.05f64..0.5,
        seed in any::<u64>(),
        ops in proptest::collection::vec((any::<bool>(), 0u64..TOTAL_SECTORS, 1u64..40, any::<u64>()), 1..150),
    ) {
        let r = fault_rig(mode, repl, u64::MAX, seed);
        r.cache.set_rules(vec![FaultRule::rate(FaultOp::All, rate)]);
        let mut model = vec![0u8; (TOTAL_SECTORS * SECTOR) as usize];
        for (is_write, sector, sectors, s) in ops {
            let sectors = sectors.min(TOTAL_SECTORS - sector);
            let (off, len) = (sector * SECTOR, (sectors * SECTOR) as usize);
            if is_write {
                let data = pattern(off, len, s);
                r.engine.write(off, &data, s % 5 == 0).unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&data);
            } else {
                let mut buf = vec![0u8; len];
                r.engine.read(off, &mut buf).unwrap();
                prop_assert!(buf == model[off as usize..off as usize + len], "read at {off} len {len}");
            }
        }
        // The backing device alone is always complete in these modes.
        let mut all = vec![0u8; model.len()];
        r.backing.read_at(&mut all, 0).unwrap();
        prop_assert!(all == model);
    }
}

#[test]
fn cache_is_taken_out_of_use_after_repeated_errors() {
    let r = fault_rig(CacheMode::WriteThrough, ReplacementKind::Lru, 8, 1);
    let data = pattern(0, 65536, 3);
    r.engine.write(0, &data, false).unwrap();
    let mut buf = vec![0u8; 65536];
    r.engine.read(0, &mut buf).unwrap();
    assert_eq!(r.engine.stats().cache_state, "ok");
    r.cache.fail_all();
    for _ in 0..4 {
        r.engine.read(0, &mut buf).unwrap();
        assert_eq!(buf, data);
        r.engine.write(0, &data, true).unwrap();
    }
    let s = r.engine.stats();
    assert!(s.cache_state.starts_with("failed:"), "{}", s.cache_state);
    assert_eq!(s.mode, CacheMode::PassThrough);
    assert!(s.cache_read_errors + s.cache_write_errors >= 8);
    assert!(
        r.engine.set_mode(CacheMode::WriteBack).is_err(),
        "a failed cache cannot be re-enabled"
    );
    // Served entirely from the backing device from now on.
    let errors_before = r.cache.injected().total();
    r.engine.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    assert_eq!(
        r.cache.injected().total(),
        errors_before,
        "the failed cache device is left alone"
    );
}

#[test]
fn writeback_dirty_blocks_on_a_failed_cache_fail_loudly() {
    let r = fault_rig(CacheMode::WriteBack, ReplacementKind::Lru, u64::MAX, 1);
    let dirty = pattern(0, 8192, 1);
    r.engine.write(0, &dirty, false).unwrap();
    let clean = pattern(65536, 4096, 2);
    r.backing.write_at(&clean, 65536).unwrap();
    r.cache.set_rules(vec![FaultRule::always(FaultOp::Read)]);
    let mut buf = vec![0u8; 8192];
    match r.engine.read(0, &mut buf) {
        Err(EngineError::CacheDirty { .. }) => {}
        other => panic!("expected a loud failure, got {other:?}"),
    }
    // Blocks that were never dirty are still served.
    let mut other = vec![0u8; 4096];
    r.engine.read(65536, &mut other).unwrap();
    assert_eq!(other, clean);
    assert!(
        r.engine.drain(|_, _| {}).is_err(),
        "cannot drain from a dead cache"
    );
    r.cache.heal();
    r.engine.drain(|_, _| {}).unwrap();
    r.backing.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, dirty);
}

/// Per sector: the seqs it may hold (the last successful write, plus any
/// failed writes since, which may have landed in part).
fn may_hold(model: &[Vec<u64>], sector: u64, data: &[u8]) -> bool {
    let seq = u64::from_le_bytes(data[..8].try_into().unwrap());
    let s = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let zero = data.iter().all(|&b| b == 0);
    (zero && model[sector as usize].contains(&0))
        || (s == sector
            && model[sector as usize].contains(&seq)
            && data[16..].iter().all(|&b| b == seq as u8))
}

fn tagged(sector: u64, sectors: u64, seq: u64) -> Vec<u8> {
    let mut v = vec![seq as u8; (sectors * SECTOR) as usize];
    for k in 0..sectors {
        let at = (k * SECTOR) as usize;
        v[at..at + 8].copy_from_slice(&seq.to_le_bytes());
        v[at + 8..at + 16].copy_from_slice(&(sector + k).to_le_bytes());
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The backing device fails (reads and writes, at random): clients get
    /// the errors, successful reads never return data that was not
    /// written there, and the metadata stays consistent: the cache reopens
    /// and serves the same.
    #[test]
    fn failing_backing_device_errors_reach_clients_and_metadata_stays_consistent(
        mode in prop::sample::select(CacheMode::ALL.to_vec()),
        rate in 0.05f64..0.4,
        seed in any::<u64>(),
        ops in proptest::collection::vec((0u8..10, 0u64..TOTAL_SECTORS, 1u64..40), 1..120),
    ) {
        let backing = Arc::new(FaultDevice::with_seed(MemDevice::new(TOTAL_SECTORS * SECTOR), seed));
        let cache = Arc::new(MemDevice::new(16 * 4096 + (2 << 20)));
        let clock = Arc::new(ManualClock::new(Time(1)));
        let cfg = config(mode, ReplacementKind::Lru, AdmissionKind::Always, 4096, 0);
        let engine = Engine::create(
            backing.clone() as Arc<dyn BlockDevice>,
            cache.clone() as Arc<dyn BlockDevice>,
            &cfg,
            clock.clone(),
            "backing",
            Some(1 << 20),
        )
        .unwrap();
        backing.set_rules(vec![
            FaultRule::rate(FaultOp::Write, rate),
            FaultRule::rate(FaultOp::Read, rate / 2.0),
        ]);
        let mut model: Vec<Vec<u64>> = vec![vec![0]; TOTAL_SECTORS as usize];
        // What a reopen may find: the possibilities at the last successful
        // flush, plus every write since (unflushed writes may be lost).
        let mut after_reopen: Vec<Vec<u64>> = model.clone();
        let (mut seq, mut failures) = (1u64, 0u64);
        for (kind, sector, sectors) in ops {
            let sectors = sectors.min(TOTAL_SECTORS - sector);
            let off = sector * SECTOR;
            match kind {
                0..=4 => {
                    let ok = engine.write(off, &tagged(sector, sectors, seq), false).is_ok();
                    failures += u64::from(!ok);
                    for k in sector..sector + sectors {
                        after_reopen[k as usize].push(seq);
                        if ok {
                            model[k as usize] = vec![seq];
                        } else {
                            model[k as usize].push(seq);
                        }
                    }
                    seq += 1;
                }
                5..=7 => {
                    let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                    if engine.read(off, &mut buf).is_ok() {
                        for k in 0..sectors {
                            let d = &buf[(k * SECTOR) as usize..((k + 1) * SECTOR) as usize];
                            prop_assert!(may_hold(&model, sector + k, d), "sector {}", sector + k);
                        }
                    } else {
                        failures += 1;
                    }
                }
                8 => {
                    if engine.flush().is_ok() {
                        after_reopen = model.clone();
                    } else {
                        failures += 1;
                    }
                }
                _ => failures += u64::from(engine.clean(4).is_err()),
            }
        }
        let _ = failures;
        // Reopen without a clean shutdown, on a healthy backing device.
        drop(engine);
        backing.set_rules(vec![]);
        let (engine, _) = Engine::open(
            backing.clone() as Arc<dyn BlockDevice>,
            cache.clone() as Arc<dyn BlockDevice>,
            &tiercache_engine::OpenOptions::default(),
            clock,
            "backing",
        )
        .unwrap();
        let mut all = vec![0u8; (TOTAL_SECTORS * SECTOR) as usize];
        engine.read(0, &mut all).unwrap();
        for s in 0..TOTAL_SECTORS {
            let d = &all[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
            prop_assert!(may_hold(&after_reopen, s, d), "after reopen: sector {s}");
        }
        engine.drain(|_, _| {}).unwrap();
    }
}
