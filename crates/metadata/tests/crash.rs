//! Crash consistency, by property test over `CrashDevice`.
//!
//! A random workload of record / commit / snapshot / set_mode / clean
//! shutdown runs on a device that loses power after a random number of
//! writes and flushes (possibly in the middle of a journal commit, a
//! snapshot or a superblock write). The crash then keeps either none of the
//! unflushed writes or a random subset of their 512-byte sectors (torn
//! blocks). Recovery may itself be cut by a second power loss.
//!
//! What is allowed after the crash, precisely: `open` succeeds, and the
//! recovered mapping equals either
//! - the mapping as of the last operation that returned `Ok` (commit,
//!   snapshot or clean shutdown), or
//! - if an operation was cut by the power loss, the mapping that operation
//!   would have made durable (its blocks happened to land completely);
//!
//! never a mix of the two (a commit is atomic), never anything else. When
//! the last acknowledged operation was a clean shutdown, `open` reports a
//! clean shutdown. After a successful `open`, `check` finds nothing wrong.

mod common;

use common::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::CrashDevice;
use tiercache_metadata::{check, Entry, Mapping, MetadataStore, Severity, VolumeId};
use tiercache_types::CacheMode;

#[derive(Clone, Debug)]
enum Op {
    /// One slot update (`None`: free the slot).
    Update {
        slot: u16,
        oblock: Option<u16>,
        dirty: bool,
        hint: u8,
        crc: Option<u32>,
    },
    /// `n` random updates.
    Burst {
        seed: u64,
        n: u16,
    },
    Commit,
    Snapshot,
    SetMode,
    /// Ends the round with a clean shutdown of the final mapping.
    CleanShutdown,
}

#[derive(Clone, Copy, Debug)]
enum Keep {
    /// Nothing.
    Nothing,
    /// A random subset of 512-byte sectors (torn blocks).
    Sectors(u64),
    /// A random subset of whole 4 KiB blocks (out-of-order persistence).
    Blocks(u64),
}

#[derive(Clone, Debug)]
struct Round {
    ops: Vec<Op>,
    /// Writes + flushes that succeed before the power cut (`None`: none
    /// fails; the cut happens after the last op).
    budget: Option<u16>,
    /// What survives of the unflushed writes.
    keep: Keep,
    /// Power is cut again after this many writes of the recovery `open`.
    open_budget: Option<u8>,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u16..2000, proptest::option::weighted(0.85, 0u16..BACKING_BLOCKS as u16), any::<bool>(), 0u8..80, proptest::option::of(any::<u32>()))
            .prop_map(|(slot, oblock, dirty, hint, crc)| Op::Update { slot, oblock, dirty, hint, crc }),
        2 => (any::<u64>(), 1u16..900).prop_map(|(seed, n)| Op::Burst { seed, n }),
        4 => Just(Op::Commit),
        1 => Just(Op::Snapshot),
        1 => Just(Op::SetMode),
        1 => Just(Op::CleanShutdown),
    ]
}

fn round() -> impl Strategy<Value = Round> {
    (
        proptest::collection::vec(op(), 1..25),
        proptest::option::weighted(0.8, 0u16..24),
        prop_oneof![
            1 => Just(Keep::Nothing),
            1 => any::<u64>().prop_map(Keep::Sectors),
            2 => any::<u64>().prop_map(Keep::Blocks),
        ],
        proptest::option::weighted(0.3, 0u8..6),
    )
        .prop_map(|(ops, budget, keep, open_budget)| Round {
            ops,
            budget,
            keep,
            open_budget,
        })
}

/// Records `slot := e` in the store and the model, first freeing any other
/// slot holding the same origin block (as the engine would, in the same
/// commit).
fn update(
    store: &mut MetadataStore,
    view: &mut Mapping,
    slot: u32,
    e: Option<Entry>,
) -> Result<(), ()> {
    if let Some(e) = e {
        if let Some(other) = view
            .iter()
            .position(|x| x.is_some_and(|x| x.oblock == e.oblock))
        {
            if other != slot as usize {
                store.record(other as u32, None).map_err(|_| ())?;
                view[other] = None;
            }
        }
    }
    store.record(slot, e).map_err(|_| ())?;
    view[slot as usize] = e;
    Ok(())
}

static CASES: AtomicU64 = AtomicU64::new(0);
static CUT_OPS: AtomicU64 = AtomicU64::new(0);
static INFLIGHT_RECOVERED: AtomicU64 = AtomicU64::new(0);
static TORN_IGNORED: AtomicU64 = AtomicU64::new(0);

fn run(slots: u32, journal_blocks: u64, rounds: Vec<Round>) -> Result<(), TestCaseError> {
    CASES.fetch_add(1, Ordering::Relaxed);
    let crash = Arc::new(CrashDevice::new(device_size(
        u64::from(slots),
        journal_blocks,
    )));
    let mut fa = Arc::new(FailAfter::new(crash.clone(), i64::MAX));
    let mut store = Some(MetadataStore::format(fa.clone(), &params(journal_blocks)).unwrap());
    prop_assert_eq!(store.as_ref().unwrap().layout().capacity, slots);
    let mut durable: Mapping = vec![None; slots as usize];
    let modes = [CacheMode::WriteBack, CacheMode::WriteThrough];
    for (ri, r) in rounds.iter().enumerate() {
        let s = store
            .take()
            .expect("a store is open at the start of each round");
        fa.set_budget(r.budget.map_or(i64::MAX, i64::from));

        let mut view = durable.clone();
        let mut inflight: Option<Mapping> = None;
        let mut clean_acked = false;
        let mut live = Some(s);
        'ops: for (k, o) in r.ops.iter().enumerate() {
            let s = live.as_mut().expect("store open during ops");
            match o {
                Op::Update {
                    slot,
                    oblock,
                    dirty,
                    hint,
                    crc,
                } => {
                    let e = oblock.map(|ob| Entry {
                        volume: VolumeId(0),
                        oblock: u64::from(ob),
                        dirty: *dirty,
                        hint: (*hint).min(63), // the store saturates hints
                        crc: *crc,
                    });
                    if update(s, &mut view, u32::from(*slot) % slots, e).is_err() {
                        break 'ops;
                    }
                }
                Op::Burst { seed, n } => {
                    let mut rng = StdRng::seed_from_u64(*seed);
                    for _ in 0..*n {
                        let slot = rng.gen_range(0..slots);
                        let e = rng.gen_bool(0.9).then(|| Entry {
                            volume: VolumeId(0),
                            oblock: rng.gen_range(0..BACKING_BLOCKS),
                            dirty: rng.gen_bool(0.5),
                            hint: rng.gen_range(0..64),
                            crc: rng.gen_bool(0.5).then(|| rng.gen()),
                        });
                        if update(s, &mut view, slot, e).is_err() {
                            break 'ops;
                        }
                    }
                }
                Op::Commit | Op::Snapshot => {
                    let res = if matches!(o, Op::Commit) {
                        s.commit()
                    } else {
                        s.snapshot()
                    };
                    match res {
                        Ok(_) => durable = view.clone(),
                        Err(_) => {
                            inflight = Some(view.clone());
                            CUT_OPS.fetch_add(1, Ordering::Relaxed);
                            break 'ops;
                        }
                    }
                }
                Op::SetMode => {
                    if s.set_mode(modes[(ri + k) % 2]).is_err() {
                        break 'ops;
                    }
                }
                Op::CleanShutdown => {
                    let mut fin = view.clone();
                    for e in fin.iter_mut().flatten() {
                        e.hint = (e.hint + 1) % 64; // fresh hints
                    }
                    let s = live.take().expect("open");
                    match s.mark_clean_shutdown(&fin, &vol0(backing())) {
                        Ok(()) => {
                            durable = fin;
                            clean_acked = true;
                        }
                        Err(_) => {
                            inflight = Some(fin);
                            CUT_OPS.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    break 'ops;
                }
            }
        }
        // Power cut.
        fa.set_budget(0);
        drop(live);
        match r.keep {
            Keep::Nothing => {
                crash.crash();
            }
            Keep::Sectors(seed) => {
                crash.crash_keep_random(seed);
            }
            Keep::Blocks(seed) => {
                fa.crash_keep_blocks(seed);
            }
        }
        // Before recovery, `check` sees at most a torn commit (a warning),
        // never an error: nothing acknowledged is missing.
        let pre = check(&*crash);
        prop_assert!(pre.worst() < Some(Severity::Error), "{}", pre);
        // Recovery, perhaps cut once more.
        if let Some(ob) = r.open_budget {
            let fa = Arc::new(FailAfter::new(crash.clone(), i64::from(ob)));
            if let Ok((_, rec)) = open_checked(fa.clone(), &backing()) {
                prop_assert!(rec.mapping == durable || Some(&rec.mapping) == inflight.as_ref());
            }
            fa.crash_keep_blocks(u64::from(ob));
        }
        fa = Arc::new(FailAfter::new(crash.clone(), i64::MAX));
        let (s, rec) = match open_checked(fa.clone(), &backing()) {
            Ok(x) => x,
            Err(e) => return Err(TestCaseError::fail(format!("open after crash: {e}"))),
        };
        let ok_durable = rec.mapping == durable;
        let ok_inflight = Some(&rec.mapping) == inflight.as_ref();
        prop_assert!(
            ok_durable || ok_inflight,
            "round {}: recovered mapping is neither the acknowledged state nor the cut operation's",
            ri
        );
        if ok_inflight && !ok_durable {
            INFLIGHT_RECOVERED.fetch_add(1, Ordering::Relaxed);
        }
        TORN_IGNORED.fetch_add(rec.torn_commit_blocks_ignored, Ordering::Relaxed);
        if clean_acked && r.open_budget.is_none() {
            prop_assert!(rec.was_clean_shutdown);
        }
        let report = check(&*crash);
        prop_assert!(report.is_clean(), "{}", report);
        durable = rec.mapping;
        store = Some(s);
    }
    Ok(())
}

#[test]
fn crash_recovery_yields_an_acknowledged_state() {
    let cases = std::env::var("CRASH_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2500);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        any::<bool>(),
        2u64..12,
        proptest::collection::vec(round(), 1..4),
    );
    runner
        .run(&strategy, |(big, journal_blocks, rounds)| {
            run(if big { 1100 } else { 600 }, journal_blocks, rounds)
        })
        .unwrap();
    eprintln!(
        "crash cases: {}, operations cut by power loss: {}, cut operations recovered whole: {}, torn commit blocks ignored: {}",
        CASES.load(Ordering::Relaxed),
        CUT_OPS.load(Ordering::Relaxed),
        INFLIGHT_RECOVERED.load(Ordering::Relaxed),
        TORN_IGNORED.load(Ordering::Relaxed)
    );
}
