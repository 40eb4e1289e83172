//! Main's recently hit blocks get one more turn through the small FIFO
//! when main shrinks ([`crate::S3Fifo::set_demote_on_shrink`]).
//!
//! A step of [`crate::Adaptive`] towards recency gives the small FIFO a
//! larger share, and main has to give up the difference. Plain S3-FIFO
//! evicts main's coldest blocks for it; on a trace whose phases come back
//! (libCacheSim's CloudPhysics trace) the next phase wanted some of them,
//! and each cost a miss that a cache never sent towards recency does not
//! pay. With demotion, while main gives up that excess, a victim of
//! main's CLOCK that was hit in the lap of the hand before its last moves
//! to the small FIFO's back instead of leaving (and small evicts its
//! oldest in its place). There it is a newcomer: it goes back to main if
//! hit enough, or leaves **without entering the ghost** (a ghost filled
//! with main's old blocks forgets the small FIFO's own evictions sooner:
//! on 1and1-linux-mysql at 4 KiB and 10%, whose ghost is on a cliff, that
//! cost 1.4 points). A victim not hit in that lap is evicted as before:
//! demoting every block ever hit in main cost the short recency-minded
//! traces, and kept a cache full of formerly hot stale blocks from warming
//! as fast as an empty one.
//!
//! Two bits per slot. `hit`: in main, hit since the hand last passed the
//! block; in small, demoted from main. `hit_last_lap`: in main, `hit` as
//! it was when the hand last passed. A block entering, leaving or moving
//! between the FIFOs has both cleared (a demoted one then gets `hit`).

use crate::slot_bits::SlotBits;
use tiercache_types::CacheBlock;

/// The demotion state of one [`crate::S3Fifo`]. Off (and empty) unless
/// [`Demotion::enable`] was called.
#[derive(Clone, Debug, Default)]
pub struct Demotion {
    hit: SlotBits,
    hit_last_lap: SlotBits,
    /// Blocks main still has to give up since its share last shrank.
    left: u32,
    /// Shrinks of main demote nothing while set ([`Demotion::pause`]).
    paused: bool,
}

impl Demotion {
    /// Turns demotion on for a cache of `capacity` slots.
    pub fn enable(&mut self, capacity: u32) {
        self.hit = SlotBits::new(capacity);
        self.hit_last_lap = SlotBits::new(capacity);
    }

    pub fn enabled(&self) -> bool {
        !self.hit.is_empty()
    }

    /// Main's share changed and main holds `excess` blocks over it: that
    /// many of its victims are considered for demotion. A share that grows
    /// (`excess` 0) ends any demotion still due.
    pub fn main_shrank(&mut self, excess: u32) {
        if self.enabled() {
            self.left = if self.paused { 0 } else { excess };
        }
    }

    /// While paused, a shrink of main evicts as plain S3-FIFO does (the
    /// adaptive policy's first turnover, which is there to clear old data
    /// out, pauses it).
    pub fn pause(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// A hit on `c`, a block of main.
    pub fn hit_in_main(&mut self, c: CacheBlock) {
        self.hit.set(c, true);
    }

    /// Main's CLOCK hand passed `c` (hit, so it stays in main).
    pub fn lap(&mut self, c: CacheBlock) {
        if self.enabled() {
            self.hit_last_lap.set(c, self.hit.get(c));
            self.hit.set(c, false);
        }
    }

    /// Main's victim `c` (unhit since the hand last passed it): whether it
    /// goes to the small FIFO instead of leaving, marked as demoted there.
    /// Counts it against the blocks main has to give up either way.
    pub fn demote(&mut self, c: CacheBlock) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        let demote = self.hit_last_lap.get(c);
        if demote {
            self.hit_last_lap.set(c, false);
            self.hit.set(c, true);
        }
        demote
    }

    /// `c` enters, leaves or changes FIFO: clears its bits and says
    /// whether it was a demoted block (if it was in small).
    pub fn clear(&mut self, c: CacheBlock) -> bool {
        let demoted = self.hit.get(c);
        self.hit.set(c, false);
        self.hit_last_lap.set(c, false);
        demoted
    }

    pub fn memory_bytes(&self) -> usize {
        self.hit.memory_bytes() + self.hit_last_lap.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_until_enabled() {
        let mut d = Demotion::default();
        d.hit_in_main(CacheBlock(3));
        d.lap(CacheBlock(3));
        d.main_shrank(5);
        assert!(!d.demote(CacheBlock(3)));
        assert_eq!(d.memory_bytes(), 0);
        d.enable(130);
        assert_eq!(d.memory_bytes(), 48);
    }

    /// Only a victim hit in the lap before the hand's last is demoted, and
    /// every victim counts against main's excess.
    #[test]
    fn a_victim_is_demoted_if_hit_the_lap_before() {
        let mut d = Demotion::default();
        d.enable(200);
        let (old, recent, never) = (CacheBlock(1), CacheBlock(129), CacheBlock(2));
        d.hit_in_main(old);
        d.lap(old); // hit in this lap
        d.lap(old); // not in this one
        d.hit_in_main(recent);
        d.lap(recent);
        d.main_shrank(3);
        assert!(!d.demote(never), "never hit: evicted");
        assert!(!d.demote(old), "hit two laps ago: evicted");
        assert!(d.demote(recent));
        assert!(d.clear(recent), "marked as demoted in small");
        assert!(!d.clear(recent));
        d.hit_in_main(recent);
        d.lap(recent);
        assert!(!d.demote(recent), "main gave up its excess");
        d.main_shrank(1);
        d.pause(true);
        d.main_shrank(1);
        assert!(!d.demote(recent), "paused");
        d.pause(false);
        d.main_shrank(1);
        assert!(d.demote(recent));
    }
}
