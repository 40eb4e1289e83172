//! The live cache's first turnover: probation held wide open once the
//! cache first fills, until the blocks it held then show they are wanted.
//!
//! Why: a cache that fills from empty admits every block without
//! competition, and S3-FIFO's fill routes all but the small FIFO's share
//! straight into main. When it first has to evict, main therefore holds
//! whatever the cache happened to read first, frequencies included, and a
//! narrow small FIFO (10% by default) probes the new data while those
//! blocks keep the rest. If they are stale (the field study's second run:
//! a cache full of a deleted file's blocks, the main job's region A), the
//! new data's lukewarm blocks are evicted from probation once before their
//! second read, and the minis, equal until then, need several epochs to
//! move the live cache towards recency. Measured on the main job's copy
//! (`examples/mainjob_stale.rs`): 1.29x the empty cache's misses, and 79%
//! of its IOPS in `tiercache bench` (target 90%).
//!
//! So for one turnover after the first eviction (as many evictions as the
//! cache has blocks) the live cache may run at least candidate
//! [`FIRST_TURNOVER_CANDIDATE`] (50% probation, two hits to move): main
//! shrinks to half, its least used blocks first, and the new data competes
//! for the other half. It does so while the old data (the blocks resident
//! since before the cache was nearly full) earns under `1 / OLD_DENSITY_FACTOR` of the new
//! data's hits per block, judged once the new data (blocks that entered
//! since) has [`MIN_NEW_HITS`] hits; hits on the old data count from the
//! new data's first hit on, so that both are compared over the same
//! requests. As soon as the old data earns that much, it ends for good.
//! Old and new are told apart by cache block ([`RenewedSlots`]: a slot is
//! new once it has taken a block since the cache was nearly full, at most
//! `capacity / NEARLY_FULL_DIVISOR` free), not by FIFO: new data that
//! reaches main (a ghost hit sends it there) is still new, and hits on it
//! are not taken for the old data's. Nor are hits on new blocks that found
//! the last slots free: in a recording of the bench's RAM cache a few of
//! the fill's reads of A had bypassed it (the sequential cutoff), B's
//! first misses, its hottest blocks, took the free slots before the first
//! eviction, and tracked from that eviction their hits counted as the old
//! data's and ended the turnover at once (1.32-1.39x the empty run's
//! misses in two of three runs; 1.05-1.06x tracked from nearly full).
//!
//! Counting from the new data's first hit lets a scan of the old data
//! right after the first eviction pass (`tiercache bench` reads region A
//! again in full, and its cache's first eviction falls in that read: that
//! scan's hits on A once ended the turnover before B arrived), and a scan
//! of new blocks right after the fill, read once, hits no new block and
//! opens nothing (a pool's hot volumes must survive the others' first
//! reads: `crates/engine/tests/pool_scale.rs`). Then the minis' choice
//! alone holds, as before.
//!
//! The old data must be all but dead: under 1/1024 of the new data's
//! hits per block. A workload whose first blocks go unread for a long
//! while after the cache fills and come back later earns a few hits on
//! them meanwhile, and that ends the turnover: libCacheSim's CloudPhysics
//! trace at 64 KiB and 50% of its footprint missed 7.1 points more than
//! without a first turnover when the old data had to earn 1/8 of the new
//! data's hits per block, 3.8 more at 1/128, none at 1/1024 (its old data
//! is cold for thousands of evictions, then wanted again). Stale data (a
//! deleted file's blocks, the bench's region A) earns no hits at all.
//! See docs/BENCHMARKS.md. A cache restored warm after a restart has a
//! history, and skips this.
//!
//! Measured on a recording of the bench's server (`tiercache trace`,
//! replayed at the engine's 623 blocks): the stale run's misses 1.29x the
//! empty run's when the first turnover told old from new by FIFO and
//! counted every hit, 1.07x now; LRU 1.00x (docs/BENCHMARKS.md, session
//! 47). RAM: the bits cost at most 8 KiB, and only during the turnover.

/// The candidate index the live cache runs at least, in the first
/// turnover (`CANDIDATES[5]`: 50% small, two hits to move).
pub const FIRST_TURNOVER_CANDIDATE: usize = 5;
/// The first turnover ends once the old data's hits per block reach
/// `1 / OLD_DENSITY_FACTOR` of the new data's: any sign of life in the
/// old data, short of hits on a few of a large cache's blocks.
pub const OLD_DENSITY_FACTOR: u64 = 1024;
/// Hits on the new data (tracked slots) needed before the old data's
/// density is judged.
pub const MIN_NEW_HITS: u64 = 64;
/// Slots start to be tracked ([`RenewedSlots`]) once the cache has at most
/// `capacity / NEARLY_FULL_DIVISOR` free: what enters the last free slots
/// is new data as much as what replaces evicted blocks.
pub const NEARLY_FULL_DIVISOR: u32 = 16;
/// At most this many cache blocks are tracked ([`RenewedSlots`]): every
/// `stride`-th slot of a larger cache, so that the bits cost at most 8 KiB.
pub const TRACKED_SLOTS: u32 = 65_536;

/// Which of the cache's slots (cache blocks) have taken a new block since
/// the cache was nearly full, for every `stride`-th slot: those hold new
/// data, the others still hold what was resident then (or nothing yet).
/// Allocated when the cache is nearly full ([`NEARLY_FULL_DIVISOR`]) or
/// first evicts, freed when the first turnover ends.
#[derive(Clone, Debug, Default)]
pub struct RenewedSlots {
    bits: Vec<u64>,
    stride: u32,
    tracked: u32,
    renewed: u32,
}

impl RenewedSlots {
    /// Starts tracking a full cache of `capacity` slots, all old.
    pub fn start(&mut self, capacity: u32) {
        self.stride = capacity.div_ceil(TRACKED_SLOTS).max(1);
        self.tracked = capacity.div_ceil(self.stride);
        self.bits = vec![0; (self.tracked as usize).div_ceil(64)];
        self.renewed = 0;
    }

    /// Whether slots are being tracked.
    pub fn tracking(&self) -> bool {
        !self.bits.is_empty()
    }

    /// Stops tracking and frees the bits.
    pub fn clear(&mut self) {
        *self = RenewedSlots::default();
    }

    /// The bit of `slot`, if it is tracked.
    fn bit(&self, slot: u32) -> Option<(usize, u64)> {
        if self.bits.is_empty() || !slot.is_multiple_of(self.stride) {
            return None;
        }
        let i = (slot / self.stride) as usize;
        Some((i / 64, 1 << (i % 64)))
    }

    /// `slot` took a new block.
    pub fn renew(&mut self, slot: u32) {
        if let Some((w, b)) = self.bit(slot) {
            if self.bits[w] & b == 0 {
                self.bits[w] |= b;
                self.renewed += 1;
            }
        }
    }

    /// Whether `slot` still holds old data (None: not tracked).
    pub fn is_old(&self, slot: u32) -> Option<bool> {
        self.bit(slot).map(|(w, b)| self.bits[w] & b == 0)
    }

    /// Tracked slots holding new data and old data.
    pub fn counts(&self) -> (u32, u32) {
        (self.renewed, self.tracked - self.renewed)
    }

    pub fn memory_bytes(&self) -> usize {
        self.bits.capacity() * 8
    }
}

/// Where the live cache is with its first turnover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstTurnover {
    /// The cache has not evicted yet.
    Filling,
    /// Evictions since the cache first filled (the first included), the
    /// hits on new data since then and on old data since the new data's
    /// first (tracked slots only), and whether
    /// the live cache holds probation open now: once the new data has
    /// [`MIN_NEW_HITS`] hits, and as long as the old data's density stays
    /// under the new data's over [`OLD_DENSITY_FACTOR`]. Before that
    /// nothing is known: a scan of blocks read once hits no new block, and
    /// opening probation for it would only evict main's blocks for blocks
    /// that never come back.
    Watching {
        evictions: u64,
        new_hits: u64,
        old_hits: u64,
        open: bool,
    },
    /// Over, or skipped (a cache restored warm).
    Over,
}

impl FirstTurnover {
    /// Whether the live cache runs at least [`FIRST_TURNOVER_CANDIDATE`].
    pub fn running(&self) -> bool {
        matches!(self, FirstTurnover::Watching { open: true, .. })
    }

    /// Whether hits are being counted (the first turnover is under way).
    pub fn watching(&self) -> bool {
        matches!(self, FirstTurnover::Watching { .. })
    }

    /// A hit of the live cache on old data (resident since before the
    /// cache was nearly full) or on new data. Hits on old data count from the new
    /// data's first hit on: the two are compared over the same stretch of
    /// requests, so a scan of the old data that ends before the new data
    /// is reused (the bench reads region A again right before B) says
    /// nothing about it.
    pub fn hit(&mut self, old: bool) {
        if let FirstTurnover::Watching {
            new_hits, old_hits, ..
        } = self
        {
            if !old {
                *new_hits += 1;
            } else if *new_hits > 0 {
                *old_hits += 1;
            }
        }
    }

    /// One eviction of the live cache of `capacity` blocks, whose tracked
    /// slots now hold `new` and `old` blocks. Returns whether
    /// [`FirstTurnover::running`] changed.
    pub fn evicted(&mut self, capacity: u32, new: u32, old: u32) -> bool {
        let was_running = self.running();
        match *self {
            FirstTurnover::Filling => {
                *self = FirstTurnover::Watching {
                    evictions: 1,
                    new_hits: 0,
                    old_hits: 0,
                    open: false,
                };
            }
            FirstTurnover::Watching {
                evictions,
                new_hits,
                old_hits,
                ..
            } => {
                let evictions = evictions + 1;
                let known = new_hits >= MIN_NEW_HITS;
                // The old data's density under 1/OLD_DENSITY_FACTOR of the
                // new data's: old_hits / old < new_hits / new / factor.
                let old_cold = old_hits * new.max(1) as u64 * OLD_DENSITY_FACTOR
                    < new_hits * old.max(1) as u64;
                *self = if evictions >= capacity as u64 || (known && !old_cold) {
                    FirstTurnover::Over
                } else {
                    FirstTurnover::Watching {
                        evictions,
                        new_hits,
                        old_hits,
                        open: known && old_cold,
                    }
                };
            }
            FirstTurnover::Over => {}
        }
        self.running() != was_running
    }

    /// A block restored warm: the cache has a history, no first turnover.
    pub fn skip(&mut self) {
        *self = FirstTurnover::Over;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first turnover with the old data unread and the new data hit.
    fn open(capacity: u32) -> FirstTurnover {
        let mut t = FirstTurnover::Filling;
        assert!(!t.evicted(capacity, 2, 2), "nothing known at the first");
        for _ in 0..MIN_NEW_HITS {
            t.hit(false);
        }
        assert!(t.evicted(capacity, 2, 2), "opened");
        t
    }

    #[test]
    fn it_lasts_one_turnover_from_the_first_eviction() {
        let mut t = open(5);
        for _ in 0..2 {
            assert!(!t.evicted(5, 2, 2));
            assert!(t.running());
        }
        assert!(t.evicted(5, 2, 2), "the fifth eviction ends it");
        assert_eq!(t, FirstTurnover::Over);
        t.hit(false);
        assert!(!t.evicted(5, 2, 2), "once only");
    }

    #[test]
    fn it_ends_once_the_old_data_earns_hits() {
        let mut t = open(1000);
        // 2 * OLD_DENSITY_FACTOR hits on 500 new blocks; the 500 old ones
        // need 2 hits to be wanted.
        for _ in MIN_NEW_HITS..2 * OLD_DENSITY_FACTOR {
            t.hit(false);
        }
        t.hit(true);
        assert!(!t.evicted(1000, 500, 500));
        assert!(t.running());
        t.hit(true);
        assert!(t.evicted(1000, 500, 500));
        assert_eq!(t, FirstTurnover::Over);
    }

    #[test]
    fn a_scan_that_hits_nowhere_opens_nothing() {
        let mut t = FirstTurnover::Filling;
        for _ in 0..999 {
            assert!(!t.evicted(1000, 100, 900));
            assert!(!t.running());
        }
        assert!(t.watching());
        assert!(!t.evicted(1000, 100, 900));
        assert_eq!(t, FirstTurnover::Over);
    }

    /// The bench's stale run as a recording of its server shows it (623
    /// blocks): the first eviction falls while the old data is read again
    /// once in full (hits on old blocks, none on new ones), then the new
    /// data is read and reused. The scan's hits, before the new data's
    /// first, do not count; the new data's reuse opens it.
    #[test]
    fn a_scan_of_the_old_data_then_new_data_reused_opens_it() {
        let mut t = FirstTurnover::Filling;
        t.evicted(623, 1, 622);
        for i in 0..100u32 {
            t.hit(true);
            assert!(!t.evicted(623, (2 + i).min(60), (621 - i).max(563)));
        }
        assert!(t.watching() && !t.running(), "no new data hit yet");
        for _ in 0..MIN_NEW_HITS - 1 {
            t.hit(false);
        }
        assert!(!t.evicted(623, 60, 563) && t.watching(), "not yet known");
        t.hit(false);
        // No hit on 560 old blocks since the new data's first, 64 on 63
        // new ones (counting the scan's 100, the old data would have
        // earned 0.18 hits per block against 1.02: over 1/OLD_DENSITY_FACTOR, wanted).
        assert!(t.evicted(623, 63, 560), "opened");
        assert!(t.running());
    }

    #[test]
    fn old_data_hit_beside_the_new_ends_it_unopened() {
        let mut t = FirstTurnover::Filling;
        t.evicted(1000, 1, 999);
        for _ in 0..MIN_NEW_HITS {
            t.hit(false);
            t.hit(true);
            t.hit(true);
        }
        // 128 hits on 900 old blocks against 64 on 100 new ones: 0.14 per
        // block against 0.64, over 1/OLD_DENSITY_FACTOR of it.
        assert!(!t.evicted(1000, 100, 900));
        assert_eq!(t, FirstTurnover::Over);
    }

    #[test]
    fn old_data_hits_count_from_the_new_data_first_hit() {
        let mut t = FirstTurnover::Filling;
        t.evicted(1000, 1, 999);
        for _ in 0..1000 {
            t.hit(true);
        }
        t.hit(false);
        t.hit(true);
        assert_eq!(
            t,
            FirstTurnover::Watching {
                evictions: 1,
                new_hits: 1,
                old_hits: 1,
                open: false
            }
        );
    }

    #[test]
    fn a_restored_cache_skips_it() {
        let mut t = FirstTurnover::Filling;
        t.skip();
        assert!(!t.evicted(4, 2, 2));
        assert!(!t.running());
    }

    #[test]
    fn renewed_slots_tell_old_from_new() {
        let mut r = RenewedSlots::default();
        assert_eq!(r.is_old(0), None, "nothing tracked before start");
        r.start(10);
        assert_eq!(r.counts(), (0, 10));
        r.renew(3);
        r.renew(3);
        assert_eq!(r.is_old(3), Some(false));
        assert_eq!(r.is_old(4), Some(true));
        assert_eq!(r.counts(), (1, 9));
        r.clear();
        assert_eq!(r.is_old(3), None);
        assert_eq!(r.memory_bytes(), 0);
    }

    #[test]
    fn a_large_cache_tracks_every_stride_th_slot() {
        let mut r = RenewedSlots::default();
        r.start(4 * TRACKED_SLOTS);
        assert_eq!(r.is_old(4), Some(true));
        assert_eq!(r.is_old(5), None);
        assert_eq!(r.counts(), (0, TRACKED_SLOTS));
        assert_eq!(r.memory_bytes(), 8 * 1024);
    }
}
