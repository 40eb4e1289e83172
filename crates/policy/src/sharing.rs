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
use tiercache_types::{CacheBlock, OriginBlock, VolumeId};

/// Allocation units the cache is cut into for the targets.
pub const UNITS: usize = 64;
/// The hit curves reach this many times the cache, so the gain of a
/// larger cache can be told too.
const CURVE_REACH: usize = 4;
/// Slots a hand looks at for one eviction, at most.
const HAND_SCAN: u32 = 8192;
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
    pub(crate) fn new(capacity: u32, limits: VolumeLimits) -> Self {
        VolumeShare {
            limits,
            curve: UtilityCurve::new(unit_blocks(capacity), CURVE_REACH * UNITS),
            target: u64::MAX,
            hand: 0,
        }
    }

    /// The block of volume `volume` to evict: among the first few clean
    /// blocks of it the hand finds, the coldest by hint. None if the hand
    /// found none within its scan.
    pub(crate) fn pick_victim(
        &mut self,
        volume: VolumeId,
        replacement: &dyn Replacement,
    ) -> Option<OriginBlock> {
        let capacity = replacement.capacity();
        let mut best: Option<(u8, OriginBlock)> = None;
        let mut seen = 0;
        for _ in 0..HAND_SCAN.min(capacity) {
            let c = CacheBlock(self.hand);
            self.hand = (self.hand + 1) % capacity;
            let Some(o) = replacement.oblock_of(c) else {
                continue;
            };
            if o.volume() != volume || replacement.is_dirty(o) {
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

/// Blocks per allocation unit for a cache of `capacity` blocks.
pub(crate) fn unit_blocks(capacity: u32) -> u64 {
    (capacity as u64).div_ceil(UNITS as u64).max(1)
}

/// Sets every volume's target from its limits and hit curve. `shares` are
/// `(resident blocks, state)` of the attached volumes; `capacity` the cache
/// size in blocks.
pub(crate) fn set_targets(capacity: u32, shares: &mut [&mut VolumeShare]) {
    let unit = unit_blocks(capacity);
    let units = (capacity as u64).div_ceil(unit);
    let mut alloc: Vec<u64> = shares
        .iter()
        .map(|s| s.limits.share.div_ceil(unit))
        .collect();
    let cap_units: Vec<u64> = shares
        .iter()
        .zip(&alloc)
        .map(|(s, &a)| s.limits.cap.map_or(units, |c| (c / unit).max(a)))
        .collect();
    let mut left = units.saturating_sub(alloc.iter().sum());
    while left > 0 {
        // The run of units with the best gain per unit, over all volumes.
        let mut best: Option<(f64, usize, u64)> = None;
        for (i, s) in shares.iter().enumerate() {
            let room = cap_units[i].saturating_sub(alloc[i]).min(left);
            let base = s.curve.hits(alloc[i] as usize);
            for k in 1..=room {
                let gain = (s.curve.hits((alloc[i] + k) as usize) - base) / k as f64;
                if gain > 0.0 && best.is_none_or(|(g, _, _)| gain > g) {
                    best = Some((gain, i, k));
                }
            }
        }
        let Some((_, i, k)) = best else { break };
        alloc[i] += k;
        left -= k;
    }
    // Space nobody gains from goes round to whoever may still grow.
    while left > 0 {
        let mut gave = false;
        for i in 0..shares.len() {
            if left > 0 && alloc[i] < cap_units[i] {
                alloc[i] += 1;
                left -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    for (s, a) in shares.iter_mut().zip(alloc) {
        let mut target = a * unit;
        if let Some(cap) = s.limits.cap {
            target = target.min(cap);
        }
        s.target = target.max(s.limits.share);
        s.curve.decay();
    }
}
