//! The live cache's first turnover: probation held wide open once the
//! cache first fills, until main's blocks show they are wanted.
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
//! cache has blocks) the live cache runs at least candidate
//! [`FIRST_TURNOVER_CANDIDATE`] (50% probation, two hits to move): main shrinks to half, its least used
//! blocks first, and the new data competes for the other half. It ends
//! early, for good, once main's blocks earn hits: at least
//! `1 / MAIN_DENSITY_FACTOR` of the small FIFO's hits per block, over at
//! least [`MIN_HITS`] hits since the first eviction. Then the minis' choice
//! alone holds, as before.
//!
//! The cost is a workload whose first blocks go unread for a long while
//! after the cache fills and come back later: libCacheSim's CloudPhysics
//! trace at 64 KiB and 50% of its footprint misses 5.4 points more (main
//! is cold there for thousands of evictions, then wanted again). No
//! local signal separates that from stale blocks; see docs/BENCHMARKS.md.
//! A cache restored warm after a restart has a history, and skips this.

/// The candidate index the live cache runs at least, in the first
/// turnover (`CANDIDATES[5]`: 50% small, two hits to move).
pub const FIRST_TURNOVER_CANDIDATE: usize = 5;
/// The first turnover ends once main's hits per block reach this fraction
/// of the small FIFO's.
pub const MAIN_DENSITY_FACTOR: u64 = 16;
/// Hits (both FIFOs) needed before main's density is judged.
pub const MIN_HITS: u64 = 32;

/// Where the live cache is with its first turnover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstTurnover {
    /// The cache has not evicted yet.
    Filling,
    /// Evictions since the cache first filled (the first included), and
    /// the hits in the small FIFO and in main since then.
    Running {
        evictions: u64,
        small_hits: u64,
        main_hits: u64,
    },
    /// Over, or skipped (a cache restored warm).
    Over,
}

impl FirstTurnover {
    /// Whether the live cache runs at least [`FIRST_TURNOVER_CANDIDATE`].
    pub fn running(&self) -> bool {
        matches!(self, FirstTurnover::Running { .. })
    }

    /// A hit of the live cache, in main or in the small FIFO.
    pub fn hit(&mut self, in_main: bool) {
        if let FirstTurnover::Running {
            small_hits,
            main_hits,
            ..
        } = self
        {
            if in_main {
                *main_hits += 1;
            } else {
                *small_hits += 1;
            }
        }
    }

    /// One eviction of the live cache of `capacity` blocks, whose FIFOs
    /// now hold `small` and `main` blocks. Returns whether
    /// [`FirstTurnover::running`] changed.
    pub fn evicted(&mut self, capacity: u32, small: u32, main: u32) -> bool {
        match *self {
            FirstTurnover::Filling => {
                *self = FirstTurnover::Running {
                    evictions: 1,
                    small_hits: 0,
                    main_hits: 0,
                };
                true
            }
            FirstTurnover::Running {
                evictions,
                small_hits,
                main_hits,
            } => {
                let evictions = evictions + 1;
                // Main's density at least 1/MAIN_DENSITY_FACTOR of small's:
                // main_hits / main >= small_hits / small / factor.
                let main_wanted = small_hits + main_hits >= MIN_HITS
                    && main_hits * small.max(1) as u64 * MAIN_DENSITY_FACTOR
                        >= small_hits * main.max(1) as u64;
                if evictions >= capacity as u64 || main_wanted {
                    *self = FirstTurnover::Over;
                    true
                } else {
                    *self = FirstTurnover::Running {
                        evictions,
                        small_hits,
                        main_hits,
                    };
                    false
                }
            }
            FirstTurnover::Over => false,
        }
    }

    /// A block restored warm: the cache has a history, no first turnover.
    pub fn skip(&mut self) {
        *self = FirstTurnover::Over;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_starts_at_the_first_eviction_and_lasts_one_turnover() {
        let mut t = FirstTurnover::Filling;
        t.hit(true); // not counted while filling
        assert!(t.evicted(4, 2, 2), "started");
        assert!(t.running());
        for _ in 0..3 {
            assert!(t.running());
            let ended = t.evicted(4, 2, 2);
            assert_eq!(ended, !t.running());
        }
        assert_eq!(t, FirstTurnover::Over);
        assert!(!t.evicted(4, 2, 2), "once only");
    }

    #[test]
    fn it_ends_once_main_earns_hits() {
        let mut t = FirstTurnover::Filling;
        t.evicted(1000, 500, 500);
        // Main unread: the small FIFO's hits alone never end it.
        for _ in 0..100 {
            t.hit(false);
        }
        assert!(!t.evicted(1000, 500, 500));
        // Main's density reaches 1/16 of small's: 7 hits over 500 blocks
        // against 100 over 500 (7 * 16 >= 100).
        for _ in 0..6 {
            t.hit(true);
        }
        assert!(!t.evicted(1000, 500, 500), "6 * 16 < 100");
        t.hit(true);
        assert!(t.evicted(1000, 500, 500));
        assert_eq!(t, FirstTurnover::Over);
    }

    #[test]
    fn too_few_hits_say_nothing() {
        let mut t = FirstTurnover::Filling;
        t.evicted(1000, 500, 500);
        for _ in 0..(MIN_HITS - 1) {
            t.hit(true);
        }
        assert!(!t.evicted(1000, 500, 500));
        t.hit(true);
        assert!(t.evicted(1000, 500, 500));
    }

    #[test]
    fn a_restored_cache_skips_it() {
        let mut t = FirstTurnover::Filling;
        t.skip();
        assert!(!t.evicted(4, 2, 2));
        assert!(!t.running());
    }
}
