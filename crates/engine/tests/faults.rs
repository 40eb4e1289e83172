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
