//! The director over every replacement x admission stack, in every mode:
//! random reads, writes, cleanings, invalidations and mode switches, with
//! a model of the cache built only from the plans the director returns.
//!
//! Checked at every step: plans agree with the model (a hit names the
//! block's slot; a promotion or allocation only for an absent block, in a
//! mode that allows it; an evicted block was resident and clean, and its
//! slot is the one reused; a Dirty plan leaves the block dirty, a Through
//! plan leaves it clean); the replacement's mapping equals the model; the
//! gauges in `counters()` match; a volume at its cap never grows (the
//! pool's sharing steers victims: its evictions must look like any other).

use proptest::prelude::*;
use std::collections::HashMap;
use tiercache_policy::director::{ReadPlan, WritePlan};
use tiercache_policy::{Director, DirectorConfig, Insertion, PolicyConfig, VolumeLimits};
use tiercache_types::{
    Access, AdmissionKind, CacheBlock, CacheMode, OriginBlock, ReplacementKind, Time, VolumeId,
};

const BS: u64 = 4096;

#[derive(Clone, Debug)]
enum Op {
    Read(u16, u64, u64),
    Write(u16, u64, bool),
    MarkClean(u16, u64),
    Invalidate(u16, u64),
    AbortPromotion(u16, u64),
    SetMode(u16, CacheMode),
    /// Share and cap (None: no cap) in blocks.
    SetLimits(u16, u64, Option<u64>),
}

/// Volumes of the pool under test: each op names one.
const VOLUMES: u16 = 3;

/// The pool key of block `o` of volume `v`.
fn key(v: u16, o: u64) -> OriginBlock {
    OriginBlock::of(VolumeId(v), o)
}

fn op() -> impl Strategy<Value = Op> {
    let v = || 0..VOLUMES;
    prop_oneof![
        8 => (v(), 0..40u64, 1..4u64).prop_map(|(v, b, n)| Op::Read(v, b, n)),
        6 => (v(), 0..40u64, proptest::bool::weighted(0.8)).prop_map(|(v, b, f)| Op::Write(v, b, f)),
        2 => (v(), 0..40u64).prop_map(|(v, b)| Op::MarkClean(v, b)),
        1 => (v(), 0..40u64).prop_map(|(v, b)| Op::Invalidate(v, b)),
        1 => (v(), 0..40u64).prop_map(|(v, b)| Op::AbortPromotion(v, b)),
        1 => (v(), proptest::sample::select(CacheMode::ALL)).prop_map(|(v, m)| Op::SetMode(v, m)),
        1 => (v(), 0..4u64, proptest::option::of(0..8u64))
            .prop_map(|(v, s, c)| Op::SetLimits(v, s, c)),
    ]
}

type Model = HashMap<u64, (CacheBlock, bool)>;

/// Applies an insertion to the model after checking it.
fn insertion(model: &mut Model, o: u64, ins: Insertion) -> Result<(), TestCaseError> {
    prop_assert!(!model.contains_key(&o), "{} allocated while resident", o);
    match ins.evicted {
        Some(v) => {
            let (vc, vd) = model.remove(&v.0).expect("evicted block was resident");
            prop_assert!(!vd, "dirty block {} evicted", v);
            prop_assert_eq!(vc, ins.cblock);
        }
        None => prop_assert!(model.values().all(|e| e.0 != ins.cblock)),
    }
    model.insert(o, (ins.cblock, false));
    Ok(())
}

fn run(
    replacement: ReplacementKind,
    admission: AdmissionKind,
    capacity: u32,
    cutoff: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut cfg = DirectorConfig::new(capacity, BS as u32);
    cfg.sequential_cutoff = cutoff;
    cfg.policy = PolicyConfig {
        replacement,
        admission,
        ..PolicyConfig::default()
    };
    let mut d = Director::new(&cfg).expect("valid config");
    for v in 1..VOLUMES {
        prop_assert!(d.attach_volume(VolumeId(v), cfg.mode, cutoff));
    }
    prop_assert!(!d.attach_volume(VolumeId(1), cfg.mode, cutoff));
    let mut model = Model::new();
    for (i, op) in ops.iter().enumerate() {
        let now = Time(i as u64 * 1000);
        let vol = match *op {
            Op::Read(v, ..)
            | Op::Write(v, ..)
            | Op::MarkClean(v, _)
            | Op::Invalidate(v, _)
            | Op::AbortPromotion(v, _)
            | Op::SetMode(v, _)
            | Op::SetLimits(v, ..) => v,
        };
        let resident_before: Vec<u64> = (0..VOLUMES)
            .map(|v| d.volume_counters(VolumeId(v)).expect("attached").resident)
            .collect();
        let mode = d.mode(VolumeId(vol));
        match *op {
            Op::Read(v, b, n) => {
                let mut io = d.begin(VolumeId(v), b * BS, n * BS, Access::Read, now);
                for o in b..b + n {
                    let o = key(v, o).0;
                    let before = model.get(&o).copied();
                    match d.plan_read(&mut io, OriginBlock(o), now) {
                        ReadPlan::Hit(c) => {
                            prop_assert_eq!(before.map(|e| e.0), Some(c));
                            if mode == CacheMode::PassThrough {
                                prop_assert!(before.unwrap().1, "passthrough hit on a clean block");
                            }
                        }
                        ReadPlan::Miss => {
                            if let Some((_, dirty)) = before {
                                prop_assert!(mode == CacheMode::PassThrough && !dirty);
                            }
                        }
                        ReadPlan::Promote(ins) => {
                            prop_assert!(mode != CacheMode::PassThrough && !io.bypass);
                            insertion(&mut model, o, ins)?;
                        }
                    }
                }
                d.finish(io);
            }
            Op::Write(v, o, full) => {
                let mut io = d.begin(VolumeId(v), o * BS + (1 << 30), BS, Access::Write, now);
                let o = key(v, o).0;
                let before = model.get(&o).copied();
                let plan = d.plan_write(&mut io, OriginBlock(o), full, now);
                d.finish(io);
                match plan {
                    WritePlan::Backing => {
                        if let Some((_, dirty)) = before {
                            prop_assert!(mode == CacheMode::PassThrough && !dirty);
                            model.remove(&o);
                        }
                    }
                    WritePlan::Through {
                        cblock,
                        evicted,
                        allocated,
                    } => {
                        prop_assert!(
                            matches!(mode, CacheMode::WriteThrough | CacheMode::WriteAround)
                                || (mode == CacheMode::WriteBack && io.bypass),
                            "Through in {}",
                            mode
                        );
                        if allocated {
                            prop_assert!(full && mode == CacheMode::WriteThrough);
                            insertion(&mut model, o, Insertion { cblock, evicted })?;
                        } else {
                            prop_assert_eq!(evicted, None);
                            prop_assert_eq!(before, Some((cblock, false)));
                        }
                    }
                    WritePlan::Dirty {
                        cblock,
                        evicted,
                        allocated,
                    } => {
                        if allocated {
                            prop_assert!(full && mode == CacheMode::WriteBack);
                            insertion(&mut model, o, Insertion { cblock, evicted })?;
                        } else {
                            prop_assert_eq!(evicted, None);
                            prop_assert_eq!(before.map(|e| e.0), Some(cblock));
                            prop_assert!(mode == CacheMode::WriteBack || before.unwrap().1);
                        }
                        model.insert(o, (cblock, true));
                    }
                }
            }
            Op::MarkClean(v, o) => {
                let o = key(v, o).0;
                d.mark_clean(OriginBlock(o));
                if let Some(e) = model.get_mut(&o) {
                    e.1 = false;
                }
            }
            Op::Invalidate(v, o) => {
                let o = key(v, o).0;
                prop_assert_eq!(d.invalidate(OriginBlock(o)), model.remove(&o).map(|e| e.0));
            }
            Op::AbortPromotion(v, o) => {
                let o = key(v, o).0;
                d.abort_promotion(OriginBlock(o));
                model.remove(&o);
            }
            Op::SetMode(v, m) => d.set_mode(VolumeId(v), m),
            Op::SetLimits(v, share, cap) => {
                let limits = VolumeLimits { share, cap };
                let others: u64 = (0..VOLUMES)
                    .filter(|&w| w != v)
                    .map(|w| d.volume_limits(VolumeId(w)).expect("attached").share)
                    .sum();
                let valid = cap.is_none_or(|c| c >= share) && others + share <= capacity as u64;
                let set = d.set_volume_limits(VolumeId(v), limits);
                prop_assert_eq!(set.is_ok(), valid, "{:?}", set);
                if valid {
                    prop_assert_eq!(d.volume_limits(VolumeId(v)), Some(limits));
                }
            }
        }
        for v in 0..VOLUMES {
            let cap = d.volume_limits(VolumeId(v)).expect("attached").cap;
            let now = d.volume_counters(VolumeId(v)).expect("attached").resident;
            if let Some(cap) = cap {
                let before = resident_before[v as usize];
                prop_assert!(
                    now <= cap.max(before),
                    "volume {} grew from {} to {} past its cap {}",
                    v,
                    before,
                    now,
                    cap
                );
            }
        }
        let r = d.replacement();
        let mut seen = 0usize;
        let mut bad = None;
        r.for_each_resident(&mut |o, c, dirty| {
            seen += 1;
            if model.get(&o.0) != Some(&(c, dirty)) {
                bad = Some(format!("{o} in {c} dirty {dirty} differs from the model"));
            }
        });
        prop_assert!(bad.is_none(), "{}", bad.unwrap_or_default());
        prop_assert_eq!(seen, model.len());
        let c = d.counters();
        prop_assert_eq!(c.resident as usize, model.len());
        prop_assert_eq!(c.dirty as usize, model.values().filter(|e| e.1).count());
        // Each volume's gauges count its own blocks, and its events add up
        // to the pool's.
        let mut sum = 0;
        for v in 0..VOLUMES {
            let vc = d.volume_counters(VolumeId(v)).expect("attached");
            let mine = model
                .iter()
                .filter(|(&o, _)| OriginBlock(o).volume() == VolumeId(v));
            let (n, dirty) = mine.fold((0, 0), |(n, k), (_, e)| (n + 1, k + e.1 as u64));
            prop_assert_eq!((vc.resident, vc.dirty), (n, dirty), "volume {}", v);
            sum += vc.read_hits + vc.write_hits + vc.promotions + vc.demotions;
        }
        prop_assert_eq!(sum, c.read_hits + c.write_hits + c.promotions + c.demotions);
        let dirty: Vec<_> = model
            .iter()
            .filter(|e| e.1 .1)
            .map(|(&o, e)| (OriginBlock(o), e.0))
            .collect();
        let mut sorted = dirty.clone();
        sorted.sort_unstable();
        prop_assert_eq!(d.dirty_blocks(), sorted);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_stack_plans_consistently(
        capacity in 1u32..16,
        cutoff in proptest::sample::select(vec![0u64, 3 * BS]),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        for &r in ReplacementKind::ALL {
            for &a in AdmissionKind::ALL {
                run(r, a, capacity, cutoff, &ops)?;
            }
        }
    }
}
