//! How a pool's volumes share the cache: a guaranteed share and a cap per
//! volume (Open CAS's allocation limits), and beyond them space by
//! marginal utility.
//!
//! Every epoch each volume gets a *target* number of blocks: its share,
//! then space goes, a step at a time, to the volume whose live hit curve
//! ([`UtilityCurve`]) gains the most per block (the lookahead greedy of
//! utility-based cache partitioning, Qureshi & Patt, MICRO '06), never
//! past a cap. The curves are joined smoothly between their points
//! (`smooth_curve.rs`) and a quiet volume's hits weigh more
//! (`quiet_weight`), so that the space a newcomer takes comes out of
//! every volume near the margin, and a quiet one does not pay for it with
//! its hit ratio.
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

/// Points each bucket of a live hit curve is cut into for the split
/// ([`crate::smooth_curve::refine`]).
const SMOOTH_STEPS: u64 = 4;

/// What a hit of a volume with `rate` references per epoch weighs in the
/// split: `rate^-1/2`.
///
/// Counting every hit alike (weight 1) gives the pool the most hits, but
/// where two volumes gain about as much per block it may take all the
/// space a newcomer needs from the quieter one, and the same hits lost
/// cost a volume four times as busy a quarter of the hit ratio. In the
/// pool bench a scanner's first 4 MiB, read again every pass, took its 64
/// blocks from the quieter Zipf reader (hot2, 164 IOPS beside hot's 684):
/// 2.1 points of its hit ratio, none of hot's. Counting hit ratios alike
/// (`rate^-1`) would give every volume the same say whatever its traffic,
/// and a busy volume's hits would count for little. The square root is
/// the middle of the two: blocks move from a busy volume to a quiet one
/// only where their gains per block are within the square root of their
/// rates' ratio, so the pool gives up few hits (docs/BENCHMARKS.md,
/// "Who pays for a newcomer's space").
fn quiet_weight(rate: f64) -> f64 {
    rate.max(1.0).powf(-0.5)
}

/// A volume's curve as the split reads it: hits per epoch (`points`, from
/// [`UtilityCurve::points`]) of a volume with `rate` references per epoch,
/// joined smoothly and weighed by [`quiet_weight`].
fn for_split(points: &[(u64, f64)], rate: f64) -> Vec<(u64, f64)> {
    let w = quiet_weight(rate);
    let mut c = crate::smooth_curve::refine(points, SMOOTH_STEPS);
    for p in &mut c {
        p.1 *= w;
    }
    c
}

/// Sets every volume's target from its limits and hit curve (see
/// [`split`]).
pub(crate) fn set_targets(capacity: u32, shares: &mut [&mut VolumeShare]) {
    let capacity = capacity as u64;
    let curves: Vec<Vec<(u64, f64)>> = shares
        .iter()
        .map(|s| for_split(&s.curve.points(), s.curve.refs_per_epoch()))
        .collect();
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

/// The upper concave hull of `curve` from `from` blocks to `end`: the
/// points a lookahead greedy can stop at. From a point of the hull, the
/// step to the next one gains the most hits per block of any step to a
/// later point of the curve (and, among equal gains, goes furthest), so a
/// greedy that walks the hull takes exactly the lookahead greedy's steps,
/// each found in constant time instead of by a scan of the curve.
fn hull(curve: &[(u64, f64)], from: u64, end: u64) -> Vec<(u64, f64)> {
    let mut h: Vec<(u64, f64)> = vec![(from, hits_at(curve, from))];
    let inner = curve.iter().copied().filter(|p| p.0 > from && p.0 < end);
    let last = (end > from).then(|| (end, hits_at(curve, end)));
    for p in inner.chain(last) {
        while let [.., a, b] = h[..] {
            // b goes if it is not above the line from a to p.
            let slope = |u: (u64, f64), v: (u64, f64)| (v.1 - u.1) / (v.0 - u.0) as f64;
            if slope(a, b) <= slope(b, p) {
                h.pop();
            } else {
                break;
            }
        }
        h.push(p);
    }
    h
}

/// Splits `capacity` blocks among volumes: each gets its floor, then,
/// repeatedly, the volume whose curve gains the most hits per block over
/// any step from its allocation (to a later point of its curve, or as far
/// as room and cap allow) takes that step: the lookahead greedy of
/// utility-based cache partitioning (Qureshi & Patt, MICRO '06), exact on
/// concave curves, walked along each curve's upper concave hull
/// (`hull`), so its work grows with the points, not their square. Blocks
/// no volume gains from are then spread evenly among the volumes below
/// their caps. Floors must fit in `capacity`.
pub fn split(inputs: &[SplitInput<'_>], capacity: u64) -> Vec<u64> {
    let mut at: Vec<u64> = inputs.iter().map(|v| v.floor.min(v.cap)).collect();
    let mut left = capacity.saturating_sub(at.iter().sum());
    let end = |v: usize| inputs[v].cap.min(inputs[v].curve.last().map_or(0, |p| p.0));
    let mut hulls: Vec<Vec<(u64, f64)>> = (0..inputs.len())
        .map(|v| hull(inputs[v].curve, at[v], end(v)))
        .collect();
    // next[v]: the index in hulls[v] of the volume's next stop.
    let mut next = vec![1usize; inputs.len()];
    let hull_step = |hulls: &[Vec<(u64, f64)>], v: usize, i: usize| -> Option<Step> {
        let (&(x0, y0), &(x1, y1)) = (hulls[v].get(i - 1)?, hulls[v].get(i)?);
        let gain = (y1 - y0) / (x1 - x0) as f64;
        (gain > 0.0).then_some(Step(gain, v, x0, x1))
    };
    // The best step from `from` within `room` blocks, on the curve itself:
    // a hull's line would overstate a curve that is not concave (20 blocks
    // of a 30-block loop hit nothing).
    let short_step = |v: usize, from: u64, room: u64| -> Option<Step> {
        let curve = inputs[v].curve;
        let stop = end(v).min(from.saturating_add(room));
        if stop <= from {
            return None;
        }
        let base = hits_at(curve, from);
        let start = curve.partition_point(|p| p.0 <= from);
        curve[start..]
            .iter()
            .map(|p| p.0)
            .take_while(|&b| b < stop)
            .chain(std::iter::once(stop))
            .filter_map(|to| {
                let gain = (hits_at(curve, to) - base) / (to - from) as f64;
                (gain > 0.0).then_some(Step(gain, v, from, to))
            })
            .max()
    };
    let mut heap: BinaryHeap<Step> = (0..inputs.len())
        .filter_map(|v| hull_step(&hulls, v, 1))
        .collect();
    while let Some(Step(_, v, from, to)) = heap.pop() {
        if to - from > left {
            heap.extend(short_step(v, from, left));
            continue;
        }
        left -= to - from;
        at[v] = to;
        if hulls[v].get(next[v]).is_some_and(|p| p.0 == to) {
            next[v] += 1;
        } else {
            // A short step ended off the hull: a new hull from there.
            hulls[v] = hull(inputs[v].curve, to, end(v));
            next[v] = 1;
        }
        heap.extend(hull_step(&hulls, v, next[v]));
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

    /// A Zipf-like hit curve at the live curves' edges: `rate` references
    /// per epoch over `n` blocks of skew `s`, as hits per epoch.
    fn zipf_curve(rate: f64, s: f64, n: u64) -> Vec<(u64, f64)> {
        let h: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        let mut cum = vec![0.0];
        for k in 1..=n {
            cum.push(cum[k as usize - 1] + (k as f64).powf(-s) / h);
        }
        let mut pts = vec![(0, 0.0)];
        for &e in crate::utility::curve_edges(n).iter() {
            pts.push((e, rate * cum[e.min(n) as usize]));
        }
        pts
    }

    #[test]
    fn a_newcomer_takes_its_space_from_every_volume_near_the_margin() {
        // A busy reader (Zipf 1.2, 684 references per epoch) and a quiet
        // one (Zipf 0.9, 164), as in the pool bench, share a cache; then a
        // third volume comes whose 64 blocks are worth far more (a
        // scanner's first 4 MiB, read again every pass). Over cache sizes
        // from 700 to 1500 blocks: the hit ratio points the worse-off reader
        // loses, worst and mean, and the readers' hits after.
        let (busy, quiet) = (684.0, 164.0);
        let hot = zipf_curve(busy, 1.2, 4096);
        let hot2 = zipf_curve(quiet, 0.9, 4096);
        let head = [(0, 0.0), (64, 500.0)];
        let outcome = |a: &[(u64, f64)], b: &[(u64, f64)]| {
            let (mut worst, mut sum, mut kept, mut n) = (0.0f64, 0.0, 0.0, 0.0);
            for cache in (700..1500).step_by(25) {
                let before = split(&[input(a, 9999), input(b, 9999)], cache);
                let after = split(&[input(a, 9999), input(b, 9999), input(&head, 9999)], cache);
                assert_eq!(after[2], 64);
                let lost = |c: &[(u64, f64)], rate: f64, i: usize| {
                    100.0 * (hits_at(c, before[i]) - hits_at(c, after[i])) / rate
                };
                let w = lost(&hot, busy, 0).max(lost(&hot2, quiet, 1));
                worst = worst.max(w);
                sum += w;
                kept += hits_at(&hot, after[0]) + hits_at(&hot2, after[1]);
                n += 1.0;
            }
            (worst, sum / n, kept)
        };
        // Straight lines, every hit alike: whoever has the flatter bucket
        // at that size pays it all.
        let plain = outcome(&hot, &hot2);
        // As the live split reads the curves.
        let fair = outcome(&for_split(&hot, busy), &for_split(&hot2, quiet));
        assert!(plain.0 > 2.5, "{plain:?}");
        assert!(fair.0 < 0.6 * plain.0, "{fair:?} against {plain:?}");
        assert!(fair.1 < 0.85 * plain.1, "{fair:?} against {plain:?}");
        assert!(fair.2 >= 0.99 * plain.2, "{fair:?} against {plain:?}");
    }

    /// Walking the hulls takes the lookahead greedy's steps: on a curve
    /// that is flat and then jumps (a loop that only hits once it fits),
    /// the step goes straight to the jump.
    #[test]
    fn the_lookahead_sees_past_a_flat_stretch() {
        let looping = [(0, 0.0), (10, 0.0), (20, 0.0), (30, 90.0)];
        let steady = [(0, 0.0), (30, 60.0)];
        assert_eq!(
            split(&[input(&looping, 99), input(&steady, 99)], 30),
            vec![30, 0]
        );
        // With more room the rest goes to the other; with room for only
        // part of the loop, which would hit nothing, all goes to the other.
        assert_eq!(
            split(&[input(&looping, 99), input(&steady, 99)], 40),
            vec![30, 10]
        );
        assert_eq!(
            split(&[input(&looping, 99), input(&steady, 99)], 20),
            vec![0, 20]
        );
    }

    /// The lookahead greedy as it was written before the hulls: from its
    /// allocation, each volume's best step is found by scanning every later
    /// point of its curve. The model the hull walk must match.
    fn lookahead_split(inputs: &[SplitInput<'_>], capacity: u64) -> Vec<u64> {
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

    proptest::proptest! {
        /// On any curves, caps, floors and cache size, walking the hulls
        /// gives every volume what the scanning lookahead greedy gives it
        /// (or, where two steps tie, as many hits in all).
        #[test]
        fn the_hull_walk_is_the_lookahead_greedy(
            volumes in proptest::collection::vec(
                (proptest::collection::vec((1u64..40, 0u32..50), 1..12), 0u64..60, 0u64..400),
                1..5,
            ),
            capacity in 0u64..600,
        ) {
            let curves: Vec<Vec<(u64, f64)>> = volumes
                .iter()
                .map(|(steps, _, _)| {
                    let mut c = vec![(0u64, 0.0f64)];
                    for &(w, g) in steps {
                        let (x, y) = *c.last().unwrap();
                        c.push((x + w, y + f64::from(g)));
                    }
                    c
                })
                .collect();
            let mut inputs: Vec<SplitInput<'_>> = curves
                .iter()
                .zip(&volumes)
                .map(|(c, &(_, floor, cap))| SplitInput { curve: c, floor, cap: cap.max(floor) })
                .collect();
            // Floors must fit.
            let mut room = capacity;
            for i in inputs.iter_mut() {
                i.floor = i.floor.min(room);
                room -= i.floor;
            }
            let (walked, scanned) = (split(&inputs, capacity), lookahead_split(&inputs, capacity));
            if walked != scanned {
                // Only a tie may part them: two steps of the same gain per
                // block, which the hull's gain (over several points) and
                // the scan's (over one) may round apart. Both must then
                // hit as much, within the same room.
                let hits = |at: &[u64]| -> f64 {
                    at.iter().zip(&inputs).map(|(&a, i)| hits_at(i.curve, a)).sum()
                };
                let (hw, hs) = (hits(&walked), hits(&scanned));
                proptest::prop_assert!((hw - hs).abs() <= 1e-9 * hs.max(1.0), "{walked:?} {hw} against {scanned:?} {hs}");
                proptest::prop_assert_eq!(walked.iter().sum::<u64>(), scanned.iter().sum::<u64>());
            }
        }
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
