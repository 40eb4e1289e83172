//! The `Replacement` trait contract, checked against a simple model for
//! every replacement policy: random sequences of touch / insert / remove /
//! set_dirty / restore.
//!
//! Checked after every step:
//! - the mapping agrees with the model both ways (`lookup`, `oblock_of`,
//!   `for_each_resident`), with `is_dirty`, `len`, `dirty_len`,
//!   `len <= capacity`;
//! - `declines_fill` never declines a fill that is not optional, and a
//!   declined one changes nothing resident;
//! - `insert` evicts only when full, only a clean resident block, reuses
//!   the evicted block's slot, and returns None exactly when the cache is
//!   full of dirty blocks (changing nothing);
//! - `restore` succeeds exactly when the slot is free and the block absent;
//! - `peek_victim` is None when a slot is free, else a clean resident block
//!   (or None only when every block is dirty), and has no side effects: a
//!   twin policy that is never peeked makes exactly the same decisions.

use proptest::prelude::*;
use std::collections::HashMap;
use tiercache_policy::{PolicyConfig, Replacement, RequestClass};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

#[derive(Clone, Debug)]
enum Op {
    Touch(u64, bool),
    /// The block, its request's class (read or write, length in blocks,
    /// continuing the previous request or not), and whether the fill is
    /// optional (not a writeback allocation).
    Insert(u64, bool, u64, bool, bool),
    Remove(u64),
    SetDirty(u64, bool),
    Restore(u64, u32, bool, u8),
}

fn op(keys: u64, capacity: u32) -> impl Strategy<Value = Op> {
    op_weighted(keys, capacity, 2)
}

/// `dirty`: weight of set_dirty among the operations (touch 4, insert 6).
fn op_weighted(keys: u64, capacity: u32, dirty: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..keys, any::<bool>()).prop_map(|(k, w)| Op::Touch(k, w)),
        6 => (0..keys, any::<bool>(), 1u64..80, any::<bool>(), proptest::bool::weighted(0.9))
            .prop_map(|(k, w, n, c, opt)| Op::Insert(k, w, n, c, opt)),
        1 => (0..keys).prop_map(Op::Remove),
        dirty => (0..keys, proptest::bool::weighted(0.8)).prop_map(|(k, d)| Op::SetDirty(k, d)),
        1 => (0..keys, 0..capacity, any::<bool>(), any::<u8>())
            .prop_map(|(k, c, d, h)| Op::Restore(k, c, d, h)),
    ]
}

fn build(kind: ReplacementKind, capacity: u32) -> Box<dyn Replacement> {
    let cfg = PolicyConfig {
        replacement: kind,
        ..PolicyConfig::default()
    };
    let p = cfg
        .build_replacement(capacity)
        .expect("every kind is built");
    assert_eq!(p.kind(), kind);
    p
}

/// The model: origin block -> (slot, dirty).
type Model = HashMap<u64, (CacheBlock, bool)>;

fn check_matches(p: &dyn Replacement, model: &Model) -> Result<(), TestCaseError> {
    prop_assert!(p.len() <= p.capacity());
    prop_assert_eq!(p.len() as usize, model.len());
    prop_assert_eq!(
        p.dirty_len() as usize,
        model.values().filter(|(_, d)| *d).count()
    );
    for (&o, &(c, d)) in model {
        prop_assert_eq!(p.lookup(OriginBlock(o)), Some(c));
        prop_assert_eq!(p.oblock_of(c), Some(OriginBlock(o)));
        prop_assert_eq!(p.is_dirty(OriginBlock(o)), d);
    }
    let mut seen = 0;
    let mut err = None;
    p.for_each_resident(&mut |o, c, d| {
        seen += 1;
        if model.get(&o.0) != Some(&(c, d)) {
            err = Some(format!("resident {o} in {c} dirty {d} not in the model"));
        }
    });
    prop_assert!(err.is_none(), "{}", err.unwrap_or_default());
    prop_assert_eq!(seen, model.len());
    for s in 0..p.capacity() {
        let c = CacheBlock(s);
        if let Some(o) = p.oblock_of(c) {
            prop_assert_eq!(model.get(&o.0).map(|e| e.0), Some(c));
        }
    }
    Ok(())
}

fn run(kind: ReplacementKind, capacity: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut p = build(kind, capacity);
    // The twin is never peeked: if peek_victim had side effects, the two
    // would drift apart.
    let mut twin = build(kind, capacity);
    let mut model = Model::new();
    for (step, op) in ops.iter().enumerate() {
        let now = Time(step as u64);
        let full = model.len() == capacity as usize;
        let all_dirty = model.values().all(|(_, d)| *d);
        let peek = p.peek_victim();
        prop_assert_eq!(peek, p.peek_victim(), "peek_victim is repeatable");
        if !full {
            prop_assert_eq!(peek, None, "a slot is free");
        } else if let Some(v) = peek {
            prop_assert_eq!(
                model.get(&v.0).map(|e| e.1),
                Some(false),
                "victim {} clean",
                v
            );
        } else {
            prop_assert!(all_dirty, "no victim although a block is clean");
        }
        match *op {
            Op::Touch(k, w) => {
                if model.contains_key(&k) {
                    let a = if w { Access::Write } else { Access::Read };
                    p.touch(OriginBlock(k), a, now);
                    twin.touch(OriginBlock(k), a, now);
                }
            }
            Op::Insert(k, w, n, continues, optional) => {
                if model.contains_key(&k) {
                    continue;
                }
                let a = if w { Access::Write } else { Access::Read };
                let class = RequestClass::of(a, n, continues);
                let declined = p.declines_fill(OriginBlock(k), class, optional);
                prop_assert_eq!(
                    declined,
                    twin.declines_fill(OriginBlock(k), class, optional),
                    "peek changed a decision"
                );
                if declined {
                    prop_assert!(optional, "a writeback allocation declined");
                    check_matches(&*p, &model)?;
                    continue;
                }
                let r = p.insert(OriginBlock(k), now);
                prop_assert_eq!(
                    r,
                    twin.insert(OriginBlock(k), now),
                    "peek changed a decision"
                );
                match r {
                    None => prop_assert!(full && all_dirty, "insert refused with a clean block"),
                    Some(ins) => {
                        match ins.evicted {
                            Some(v) => {
                                prop_assert!(full, "evicted with a free slot");
                                let (vc, vd) = model.remove(&v.0).expect("victim was resident");
                                prop_assert!(!vd, "dirty block {} evicted", v);
                                prop_assert_eq!(
                                    vc,
                                    ins.cblock,
                                    "new block takes the victim's slot"
                                );
                            }
                            None => {
                                prop_assert!(!full, "full cache inserted without eviction");
                                prop_assert!(model.values().all(|e| e.0 != ins.cblock));
                            }
                        }
                        model.insert(k, (ins.cblock, false));
                    }
                }
            }
            Op::Remove(k) => {
                let r = p.remove(OriginBlock(k));
                prop_assert_eq!(r, twin.remove(OriginBlock(k)));
                prop_assert_eq!(r, model.remove(&k).map(|e| e.0));
            }
            Op::SetDirty(k, d) => {
                if let Some(e) = model.get_mut(&k) {
                    p.set_dirty(OriginBlock(k), d);
                    twin.set_dirty(OriginBlock(k), d);
                    e.1 = d;
                }
            }
            Op::Restore(k, c, d, h) => {
                let c = CacheBlock(c);
                let ok =
                    c.0 < capacity && !model.contains_key(&k) && model.values().all(|e| e.0 != c);
                let r = p.restore(OriginBlock(k), c, d, h);
                prop_assert_eq!(r, twin.restore(OriginBlock(k), c, d, h));
                prop_assert_eq!(r, ok, "restore of {} into {}", k, c);
                if ok {
                    model.insert(k, (c, d));
                }
            }
        }
        check_matches(&*p, &model)?;
        for &o in model.keys() {
            prop_assert_eq!(p.hint(OriginBlock(o)), twin.hint(OriginBlock(o)));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_policy_keeps_the_contract(
        capacity in 1u32..12,
        ops in (1u32..12).prop_flat_map(|c| proptest::collection::vec(op(24, c), 1..400)),
    ) {
        for &kind in ReplacementKind::ALL {
            run(kind, capacity, &ops)?;
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Larger caches, so smq's periods, S3-FIFO's small/main split and
    /// ARC's ghosts all come into play.
    #[test]
    fn every_policy_keeps_the_contract_at_size(
        ops in proptest::collection::vec(op(300, 100), 1..1200),
    ) {
        for &kind in ReplacementKind::ALL {
            run(kind, 100, &ops)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Mostly dirty caches of 20..40 blocks: S3-FIFO's small FIFO has two or
    /// more blocks, main's share can be all dirty, hot blocks pile up.
    #[test]
    fn every_policy_keeps_the_contract_when_mostly_dirty(
        capacity in 20u32..40,
        ops in proptest::collection::vec(op_weighted(60, 40, 6), 1..800),
    ) {
        for &kind in ReplacementKind::ALL {
            run(kind, capacity, &ops)?;
        }
    }
}
