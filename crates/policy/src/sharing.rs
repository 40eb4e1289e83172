//! How a pool's volumes share the cache: a guaranteed share and a cap per
//! volume (Open CAS's allocation limits), and beyond them space by
//! marginal utility.
//!
//! Every epoch each volume gets a *target* number of blocks: its share,
//! then, one allocation unit (1/64 of the cache) or a run of units at a
//! time, space goes to the volume whose live hit curve ([`UtilityCurve`])
//! gains the most hits per unit (the lookahead greedy of utility-based
//! cache partitioning, Qureshi & Patt, MICRO '06), never past a cap.
//!
//! The replacement policy still chooses victims; the director only steers
//! when the policy's victim belongs to a volume at or below its target
//! (the inserting volume's own included) while another volume is over its
//! own: then a block of the volume most over target (the inserting one
//! first) leaves instead, so an under-target volume grows. A volume at its
//! cap always makes room from its own blocks. Blocks of a volume are
//! found by a hand over the slots that samples a few of the volume's clean
//! blocks and takes the coldest by the policy's [`hint`].
//!
//! [`hint`]: crate::Replacement::hint

use crate::utility::UtilityCurve;
use crate::Replacement;
use serde::{Deserialize, Serialize};
use std::collections::BinaryHeap;
use std::sync::Arc;
use tiercache_types::{CacheBlock, OriginBlock, VolumeId};

/// The hit curves reach this many times the cache, so the gain of a
/// larger cache can be told too.
pub const CURVE_REACH: u64 = 4;
/// Slots a hand looks at for one steered eviction, at most (a volume
/// holding a fraction f of the cache costs about 1/f slots a block; past
/// this the policy's own victim goes instead). A capped volume's hand
/// looks at the whole cache.
const HAND_SCAN: u32 = 1024;
/// Clean blocks of the volume compared by hint for one eviction.
const HAND_SAMPLE: u32 = 8;

/// A volume's limits, in blocks (0 share: no guarantee; no cap: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeLimits {
    /// Blocks the volume keeps against other volumes' insertions.
    pub share: u64,
    /// Blocks the volume never exceeds.
    pub cap: Option<u64>,
}

/// One volume's sharing state.
#[derive(Clone, Debug)]
pub(crate) struct VolumeShare {
    pub(crate) limits: VolumeLimits,
    pub(crate) curve: UtilityCurve,
    /// Blocks this volume should hold now (`u64::MAX`: no target yet).
    pub(crate) target: u64,
    /// Next slot the hand looks at.
    hand: u32,
}

impl VolumeShare {
    pub(crate) fn new(edges: Arc<[u64]>, limits: VolumeLimits) -> Self {
        VolumeShare {
            limits,
            curve: UtilityCurve::new(edges),
            target: u64::MAX,
            hand: 0,
        }
    }

    /// The block of volume `volume` to evict: among the first few clean
    /// blocks of it the hand finds, the coldest by hint. None if the hand
    /// found none within its scan (`whole`: the whole cache).
    pub(crate) fn pick_victim(
        &mut self,
        volume: VolumeId,
        replacement: &dyn Replacement,
        whole: bool,
    ) -> Option<OriginBlock> {
        let slots = replacement.slots();
        let capacity = slots.capacity();
        let scan = if whole {
            capacity
        } else {
            HAND_SCAN.min(capacity)
        };
        let mut best: Option<(u8, OriginBlock)> = None;
        let mut seen = 0;
        for _ in 0..scan {
            let c = CacheBlock(self.hand);
            self.hand = (self.hand + 1) % capacity;
            let Some(o) = slots.oblock_of(c) else {
                continue;
            };
            if o.volume() != volume || slots.is_dirty(c) {
                continue;
            }
            let h = replacement.hint(o);
            if best.is_none_or(|(bh, _)| h < bh) {
                best = Some((h, o));
            }
            seen += 1;
            if seen == HAND_SAMPLE || h == 0 {
                break;
            }
        }
        best.map(|(_, o)| o)
    }
}

/// Sets every volume's target from its limits and hit curve (see
/// [`split`]).
pub(crate) fn set_targets(capacity: u32, shares: &mut [&mut VolumeShare]) {
    let capacity = capacity as u64;
    let curves: Vec<Vec<(u64, f64)>> = shares.iter().map(|s| s.curve.points()).collect();
    let inputs: Vec<SplitInput<'_>> = shares
        .iter()
        .zip(&curves)
        .map(|(s, c)| SplitInput {
            curve: c,
            floor: s.limits.share,
            cap: s.limits.cap.unwrap_or(capacity),
        })
        .collect();
    let targets = split(&inputs, capacity);
    for (s, t) in shares.iter_mut().zip(targets) {
        s.target = t;
    }
}

/// One volume for [`split`].
#[derive(Clone, Copy, Debug)]
pub struct SplitInput<'a> {
    /// Hits against blocks: increasing points from `(0, 0)`, linear in
    /// between, flat past the last.
    pub curve: &'a [(u64, f64)],
    /// Blocks it gets whatever its curve.
    pub floor: u64,
    /// Blocks it never gets more than.
    pub cap: u64,
}

/// Hits of `curve` at `blocks`, linear between points.
fn hits_at(curve: &[(u64, f64)], blocks: u64) -> f64 {
    let i = curve.partition_point(|p| p.0 <= blocks);
    if i == 0 {
        return 0.0;
    }
    let (b0, h0) = curve[i - 1];
    match curve.get(i) {
        Some(&(b1, h1)) if b1 > b0 => h0 + (h1 - h0) * (blocks - b0) as f64 / (b1 - b0) as f64,
        _ => h0,
    }
}

/// A step of one volume's allocation: gain per block, volume, from, to.
#[derive(PartialEq)]
struct Step(f64, usize, u64, u64);
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Step {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
    }
}

/// Splits `capacity` blocks among volumes: each gets its floor, then,
/// repeatedly, the volume whose curve gains the most hits per block over
/// any step from its allocation (to a later point of its curve, or as far
/// as room and cap allow) takes that step: the lookahead greedy of
/// utility-based cache partitioning (Qureshi & Patt, MICRO '06), exact on
/// concave curves. Blocks no volume gains from are then spread evenly
/// among the volumes below their caps. Floors must fit in `capacity`.
pub fn split(inputs: &[SplitInput<'_>], capacity: u64) -> Vec<u64> {
    let mut at: Vec<u64> = inputs.iter().map(|v| v.floor.min(v.cap)).collect();
    let mut left = capacity.saturating_sub(at.iter().sum());
    let best_step = |v: usize, from: u64, left: u64| -> Option<Step> {
        let input = &inputs[v];
        let curve = input.curve;
        let end = input
            .cap
            .min(from.saturating_add(left))
            .min(curve.last().map_or(0, |p| p.0));
        if end <= from {
            return None;
        }
        let base = hits_at(curve, from);
        let start = curve.partition_point(|p| p.0 <= from);
        curve[start..]
            .iter()
            .map(|p| p.0)
            .take_while(|&b| b < end)
            .chain(std::iter::once(end))
            .filter_map(|to| {
                let gain = (hits_at(curve, to) - base) / (to - from) as f64;
                (gain > 0.0).then_some(Step(gain, v, from, to))
            })
            .max()
    };
    let mut heap: BinaryHeap<Step> = (0..inputs.len())
        .filter_map(|v| best_step(v, at[v], left))
        .collect();
    while let Some(Step(_, v, from, to)) = heap.pop() {
        if at[v] != from {
            continue;
        }
        if to - from > left {
            heap.extend(best_step(v, from, left));
            continue;
        }
        left -= to - from;
        at[v] = to;
        heap.extend(best_step(v, to, left));
    }
    // Space nobody gains from: evenly to whoever may still grow.
    loop {
        let growing: Vec<usize> = (0..inputs.len())
            .filter(|&v| at[v] < inputs[v].cap)
            .collect();
        if left == 0 || growing.is_empty() {
            break;
        }
        let each = (left / growing.len() as u64).max(1);
        for v in growing {
            let add = each.min(inputs[v].cap - at[v]).min(left);
            at[v] += add;
            left -= add;
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(curve: &[(u64, f64)], cap: u64) -> SplitInput<'_> {
        SplitInput {
            curve,
            floor: 0,
            cap,
        }
    }

    #[test]
    fn the_split_takes_the_steepest_gains_first() {
        // Volume 0 gains 100 hits from 10 blocks; volume 1 gains 30 from
        // 10 and 100 from 20. With 20 blocks, 10 each make 130, more than
        // the 100 of all 20 to volume 1; with 30 both fit.
        let a = [(0, 0.0), (10, 100.0)];
        let b = [(0, 0.0), (10, 30.0), (20, 100.0)];
        assert_eq!(split(&[input(&a, 99), input(&b, 99)], 20), vec![10, 10]);
        assert_eq!(split(&[input(&a, 99), input(&b, 99)], 30), vec![10, 20]);
        // Left over once nobody gains: spread evenly, within caps.
        assert_eq!(split(&[input(&a, 99), input(&b, 25)], 50), vec![25, 25]);
        // A partial step along a line is worth its share of the gain.
        assert_eq!(split(&[input(&a, 99), input(&b, 99)], 5), vec![5, 0]);
    }

    #[test]
    fn floors_and_caps_bound_the_split() {
        let a = [(0, 0.0), (100, 1000.0)];
        let b = [(0, 0.0), (100, 10.0)];
        let floor_b = SplitInput {
            curve: &b,
            floor: 40,
            cap: 100,
        };
        assert_eq!(split(&[input(&a, 100), floor_b], 100), vec![60, 40]);
        assert_eq!(split(&[input(&a, 30), input(&b, 100)], 100), vec![30, 70]);
    }
}
