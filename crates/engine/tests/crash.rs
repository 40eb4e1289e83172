//! Crash safety with the crash device: random IO through a persistent
//! engine, a power cut at a random point (unflushed writes dropped, or a
//! random subset of them kept, per sector, on each device independently),
//! reopen, and check:
//! - every write acknowledged before the last acknowledged FLUSH (or with
//!   FUA) reads back, or a later write to the same sector does;
//! - nothing reads back that was never written;
//! - a reopened cache serves hits at once (dirty blocks come back, clean
//!   ones whose claim still verifies too);
//! - and all of it again after a second crash of the reopened engine.

use proptest::prelude::*;
use std::sync::Arc;
use tiercache_device::{BlockDevice, CrashDevice};
use tiercache_engine::{Engine, EngineConfig, OpenOptions};
use tiercache_policy::PolicyConfig;
use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

const SECTOR: u64 = 512;
const BACKING_SECTORS: u64 = 1024;
const BLOCK: u32 = 4096;

fn tag(sector: u64, seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (sector ^ seq.wrapping_mul(131) ^ i as u64) as u8;
    }
}

/// The seq a sector holds (0 for never written), or None if it is garbage.
fn decode(sector: u64, data: &[u8]) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let s = u64::from_le_bytes(data[..8].try_into().unwrap());
    let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let mut want = vec![0u8; SECTOR as usize];
    tag(sector, seq, &mut want);
    (s == sector && data == &want[..]).then_some(seq)
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        sector: u64,
        sectors: u64,
        fua: bool,
    },
    Read {
        sector: u64,
        sectors: u64,
    },
    Flush,
    Clean(usize),
    Reclaim,
    SetMode(CacheMode),
}

fn op() -> impl Strategy<Value = Op> {
    let range =
        (0..BACKING_SECTORS).prop_flat_map(|s| (Just(s), 1..=(BACKING_SECTORS - s).min(48)));
    prop_oneof![
        8 => (range.clone(), prop::bool::weighted(0.1)).prop_map(|((sector, sectors), fua)| Op::Write { sector, sectors, fua }),
        4 => range.prop_map(|(sector, sectors)| Op::Read { sector, sectors }),
        2 => Just(Op::Flush),
        1 => (1usize..6).prop_map(Op::Clean),
        1 => Just(Op::Reclaim),
        1 => prop::sample::select(vec![CacheMode::WriteBack, CacheMode::WriteThrough, CacheMode::WriteAround])
            .prop_map(Op::SetMode),
    ]
}

/// Per sector: the seq durable for sure (as of the last acknowledged flush)
/// and every seq written since.
#[derive(Clone, Default)]
struct SectorModel {
    flushed: u64,
    since: Vec<u64>,
}

struct Devices {
    backing: Arc<CrashDevice>,
    cache: Arc<CrashDevice>,
}

fn open(dev: &Devices, clock: &Arc<ManualClock>) -> Engine {
    let (e, report) = Engine::open(
        dev.backing.clone() as Arc<dyn BlockDevice>,
        dev.cache.clone() as Arc<dyn BlockDevice>,
        &OpenOptions::default(),
        clock.clone(),
        "backing",
    )
    .expect("reopen after crash");
    assert!(report.restored_blocks >= report.restored_dirty);
    e
}

fn run(
    policy: (ReplacementKind, AdmissionKind),
    epochs: Vec<(Vec<Op>, usize, Option<u64>)>,
) -> Result<(), TestCaseError> {
    let dev = Devices {
        backing: Arc::new(CrashDevice::new(BACKING_SECTORS * SECTOR)),
        cache: Arc::new(CrashDevice::new(64 * 4096 + (2 << 20))),
    };
    let clock = Arc::new(ManualClock::new(Time(1)));
    let cfg = EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: BLOCK,
        sequential_cutoff: 0,
        policy: PolicyConfig {
            replacement: policy.0,
            admission: policy.1,
            ..PolicyConfig::default()
        },
        ..EngineConfig::default()
    };
    let engine = Engine::create(
        dev.backing.clone() as Arc<dyn BlockDevice>,
        dev.cache.clone() as Arc<dyn BlockDevice>,
        &cfg,
        clock.clone(),
        "backing",
        Some(1 << 20),
    )
    .unwrap();
    let mut model = vec![SectorModel::default(); BACKING_SECTORS as usize];
    let mut seq = 1u64;
    let mut engine = engine;
    let epoch_count = epochs.len();
    for (epoch, (ops, crash_at, keep_seed)) in epochs.into_iter().enumerate() {
        for (i, op) in ops.into_iter().enumerate() {
            if i == crash_at {
                break;
            }
            clock.advance(1_000_000);
            match op {
                Op::Write {
                    sector,
                    sectors,
                    fua,
                } => {
                    let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                    for k in 0..sectors {
                        tag(
                            sector + k,
                            seq,
                            &mut buf[(k * SECTOR) as usize..((k + 1) * SECTOR) as usize],
                        );
                        model[(sector + k) as usize].since.push(seq);
                    }
                    engine.write(sector * SECTOR, &buf, fua).unwrap();
                    if fua {
                        for k in 0..sectors {
                            let m = &mut model[(sector + k) as usize];
                            m.flushed = seq;
                            m.since.clear();
                        }
                    }
                    seq += 1;
                }
                Op::Read { sector, sectors } => {
                    let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                    engine.read(sector * SECTOR, &mut buf).unwrap();
                }
                Op::Flush => {
                    engine.flush().unwrap();
                    for m in &mut model {
                        if let Some(&last) = m.since.last() {
                            m.flushed = last;
                        }
                        m.since.clear();
                    }
                }
                Op::Clean(n) => {
                    engine.clean(n).unwrap();
                }
                Op::Reclaim => {
                    engine.reclaim(8).unwrap();
                }
                Op::SetMode(m) => engine.set_mode(m).unwrap(),
            }
        }
        let dirty_before = engine.dirty_blocks();
        drop(engine);
        match keep_seed {
            Some(s) => {
                dev.cache.crash_keep_random(s);
                dev.backing.crash_keep_random(s ^ 0xABCD);
            }
            None => {
                dev.cache.crash();
                dev.backing.crash();
            }
        }
        engine = open(&dev, &clock);
        let check = |engine: &Engine, what: &str| -> Result<(), TestCaseError> {
            let mut all = vec![0u8; (BACKING_SECTORS * SECTOR) as usize];
            engine.read(0, &mut all).unwrap();
            for s in 0..BACKING_SECTORS {
                let data = &all[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
                let got = decode(s, data);
                prop_assert!(got.is_some(), "{what}: sector {s} holds data never written");
                let got = got.unwrap();
                let m = &model[s as usize];
                prop_assert!(
                    got == m.flushed || m.since.contains(&got),
                    "{what}: sector {s} holds seq {got}; flushed {} then {:?}",
                    m.flushed,
                    m.since
                );
            }
            Ok(())
        };
        check(&engine, &format!("after crash {epoch}"))?;
        if epoch + 1 < epoch_count {
            // What came back is now the durable state: later reads must agree
            // with it (or with later writes), whether they hit or miss.
            let mut all = vec![0u8; (BACKING_SECTORS * SECTOR) as usize];
            engine.read(0, &mut all).unwrap();
            for s in 0..BACKING_SECTORS {
                let data = &all[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
                let m = &mut model[s as usize];
                m.flushed = decode(s, data).unwrap();
                m.since.clear();
            }
            continue;
        }
        // The cleaner writes back what came back dirty; the backing device then
        // agrees with what the engine served.
        engine.drain(|_, _| {}).unwrap();
        check(&engine, "after drain")?;
        prop_assert!(engine.dirty_blocks() == 0);
        let _ = dirty_before;
        // A clean stop and restart is warm: blocks come back.
        let resident = engine.stats().decisions.resident;
        engine.shutdown(false).unwrap();
        drop(engine);
        let engine = open(&dev, &clock);
        prop_assert_eq!(engine.stats().decisions.resident, resident);
        check(&engine, "after clean restart")?;
        break;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn flushed_writes_survive_a_crash(
        policy in prop::sample::select(vec![
            (ReplacementKind::Smq, AdmissionKind::Hotspot),
            (ReplacementKind::Lru, AdmissionKind::Always),
            (ReplacementKind::S3Fifo, AdmissionKind::Always),
            (ReplacementKind::Arc, AdmissionKind::NHit),
        ]),
        epochs in proptest::collection::vec(
            (
                proptest::collection::vec(op(), 1..120),
                0usize..120,
                proptest::option::of(any::<u64>()),
            ),
            1..=3,
        ),
    ) {
        run(policy, epochs)?;
    }
}

#[test]
fn clean_restart_is_warm_and_dirty_data_comes_back_after_a_crash() {
    let dev = Devices {
        backing: Arc::new(CrashDevice::new(BACKING_SECTORS * SECTOR)),
        cache: Arc::new(CrashDevice::new(64 * 4096 + (2 << 20))),
    };
    let clock = Arc::new(ManualClock::new(Time(1)));
    let cfg = EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: BLOCK,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    };
    let e = Engine::create(
        dev.backing.clone() as Arc<dyn BlockDevice>,
        dev.cache.clone() as Arc<dyn BlockDevice>,
        &cfg,
        clock.clone(),
        "backing",
        Some(1 << 20),
    )
    .unwrap();
    let data = vec![7u8; 16 * 4096];
    e.write(0, &data, false).unwrap();
    e.flush().unwrap();
    let mut buf = vec![0u8; 16 * 4096];
    e.read(256 * 1024, &mut buf).unwrap();
    assert_eq!(e.dirty_blocks(), 16);
    drop(e);
    dev.cache.crash();
    dev.backing.crash();
    let e = open(&dev, &clock);
    // The dirty blocks came back and are served from the cache at once.
    assert_eq!(e.dirty_blocks(), 16);
    e.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    let s = e.stats();
    assert_eq!((s.decisions.read_hits, s.decisions.read_misses), (16, 0));
    // Clean blocks are warm after a clean stop.
    e.read(256 * 1024, &mut buf).unwrap();
    e.shutdown(false).unwrap();
    drop(e);
    let e = open(&dev, &clock);
    e.read(0, &mut buf).unwrap();
    e.read(256 * 1024, &mut buf).unwrap();
    let s = e.stats();
    assert_eq!(
        (s.decisions.read_hits, s.decisions.read_misses),
        (32, 0),
        "warm after a clean stop"
    );
}

#[test]
fn wrong_backing_device_and_unformatted_cache_are_refused() {
    let backing = Arc::new(CrashDevice::new(BACKING_SECTORS * SECTOR));
    let cache = Arc::new(CrashDevice::new(4 << 20));
    let clock = Arc::new(ManualClock::new(Time(1)));
    let err = Engine::open(
        backing.clone() as Arc<dyn BlockDevice>,
        cache.clone() as Arc<dyn BlockDevice>,
        &OpenOptions::default(),
        clock.clone(),
        "b",
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("not a tiercache cache device"),
        "{err}"
    );
    let e = Engine::create(
        backing as Arc<dyn BlockDevice>,
        cache.clone() as Arc<dyn BlockDevice>,
        &EngineConfig::default(),
        clock.clone(),
        "b",
        None,
    )
    .unwrap();
    e.shutdown(false).unwrap();
    drop(e);
    let other = Arc::new(CrashDevice::new(2 * BACKING_SECTORS * SECTOR));
    let err = Engine::open(
        other as Arc<dyn BlockDevice>,
        cache as Arc<dyn BlockDevice>,
        &OpenOptions::default(),
        clock,
        "other",
    )
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("belongs to backing device"),
        "{err}"
    );
}
