//! SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI 2024), following
//! libCacheSim's `cache/eviction/Sieve.c` step by step so that miss counts
//! on read-only traces match it exactly.
//!
//! - One queue in insertion order (oldest at the front) and one visited bit
//!   per block. A hit sets the bit and moves nothing.
//! - A new block enters at the back with the bit clear.
//! - Eviction: a hand starts where it stopped last time (at the front the
//!   first time, or after it ran off the back) and walks towards the back,
//!   clearing the bit of each visited block it passes and wrapping to the
//!   front at the end, until it finds a block whose bit is clear. That block
//!   is evicted and the hand stays on the block behind it (towards the
//!   back; none if it was the newest).
//! - `remove` of the block under the hand moves the hand one block back,
//!   as libCacheSim's `Sieve_remove`.
//!
//! Dirty blocks (never evicted) keep their place in the queue; the hand
//! skips them, leaving their visited bit as it is, so a block cleaned later
//! is judged on whether it was used since the hand last looked at it while
//! clean. Cost: the hand walks over dirty blocks, so an eviction costs up
//! to one lap over them (SIEVE's own worst case, every block visited, is
//! already a lap).
//!
//! Memory per cache block: the [`SlotTable`] (~21.0 B: one list) and the visited bit.

use crate::slot_bits::SlotBits;
use crate::slots::SlotTable;
use crate::{Insertion, Replacement};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

/// The one queue, oldest at the front.
const QUEUE: u8 = 0;
/// How far `peek_victim` walks before settling for an approximate answer
/// (it runs on every miss, so it must stay cheap).
const PEEK_SCAN: usize = 64;

/// SIEVE replacement. See the module documentation.
#[derive(Clone)]
pub struct Sieve {
    slots: SlotTable,
    /// One visited bit per slot.
    visited: SlotBits,
    /// The hand: the next block to look at; None = the front.
    hand: Option<CacheBlock>,
}

impl Sieve {
    pub fn new(capacity: u32) -> Self {
        Sieve {
            slots: SlotTable::new(capacity, 1),
            visited: SlotBits::new(capacity),
            hand: None,
        }
    }

    fn visited(&self, c: CacheBlock) -> bool {
        self.visited.get(c)
    }

    fn set_visited(&mut self, c: CacheBlock, v: bool) {
        self.visited.set(c, v);
    }

    /// The block after `c` towards the back, wrapping to the front.
    fn advance(&self, c: CacheBlock) -> Option<CacheBlock> {
        self.slots.next_of(c).or_else(|| self.slots.front(QUEUE))
    }

    /// Moves the hand to the victim (libCacheSim `Sieve_evict`) and returns
    /// it. None only if no clean block is resident.
    fn find_victim(&mut self) -> Option<CacheBlock> {
        if self.slots.dirty_count() == self.slots.len() {
            return None;
        }
        let mut c = self.hand.or_else(|| self.slots.front(QUEUE))?;
        // Terminates: a clean block exists, and after one lap every clean
        // block's bit is clear.
        while self.slots.is_dirty(c) || self.visited(c) {
            if !self.slots.is_dirty(c) {
                self.set_visited(c, false);
            }
            c = self.advance(c).expect("the queue is not empty");
        }
        Some(c)
    }
}

impl Replacement for Sieve {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::Sieve
    }
    fn slots(&self) -> &SlotTable {
        &self.slots
    }

    fn touch(&mut self, oblock: OriginBlock, _access: Access, _now: Time) {
        if let Some(c) = self.slots.lookup(oblock) {
            self.set_visited(c, true);
        }
    }

    fn insert(&mut self, oblock: OriginBlock, _now: Time) -> Option<Insertion> {
        let mut evicted = None;
        if self.slots.is_full() {
            let victim = self.find_victim()?;
            self.hand = self.slots.next_of(victim);
            let o = self.slots.oblock_of(victim).expect("listed slot is mapped");
            self.slots.remove(o);
            evicted = Some(o);
        }
        let cblock = self.slots.insert(oblock, QUEUE).expect("a slot is free");
        self.set_visited(cblock, false);
        Some(Insertion { cblock, evicted })
    }

    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, hint: u8) -> bool {
        if !self.slots.insert_into(oblock, cblock, QUEUE) {
            return false;
        }
        self.slots.set_dirty(cblock, dirty);
        self.set_visited(cblock, hint & 1 != 0);
        true
    }

    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        let c = self.slots.lookup(oblock)?;
        if self.hand == Some(c) {
            self.hand = self.slots.next_of(c);
        }
        self.set_visited(c, false);
        self.slots.remove(oblock)
    }

    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
        if let Some(c) = self.slots.lookup(oblock) {
            self.slots.set_dirty(c, dirty);
        }
    }

    /// Walks like the hand without clearing anything: the first clean
    /// unvisited block from the hand. If none within 64 blocks, the first
    /// clean block from the hand (exact when the walk covered a whole lap:
    /// after one lap every bit is clear).
    fn peek_victim(&self) -> Option<OriginBlock> {
        if !self.slots.is_full() || self.slots.dirty_count() == self.slots.len() {
            return None;
        }
        let start = self.hand.or_else(|| self.slots.front(QUEUE))?;
        let mut first_clean = None;
        let mut c = start;
        for _ in 0..PEEK_SCAN.min(self.slots.len() as usize) {
            if !self.slots.is_dirty(c) {
                if !self.visited(c) {
                    return self.slots.oblock_of(c);
                }
                first_clean.get_or_insert(c);
            }
            c = self.advance(c)?;
        }
        if first_clean.is_none() {
            // Only dirty blocks within reach: look on for a clean one.
            while self.slots.is_dirty(c) {
                c = self.advance(c)?;
            }
            first_clean = Some(c);
        }
        first_clean.and_then(|c| self.slots.oblock_of(c))
    }

    /// Bit 0: the visited bit.
    fn hint(&self, oblock: OriginBlock) -> u8 {
        self.slots
            .lookup(oblock)
            .map_or(0, |c| u8::from(self.visited(c)))
    }

    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes() + self.visited.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_access as get;

    fn evict_next(p: &mut Sieve, o: u64) -> Option<OriginBlock> {
        let peek = p.peek_victim();
        let ev = p.insert(OriginBlock(o), Time(0)).unwrap().evicted;
        assert_eq!(peek, ev, "peek_victim agrees");
        ev
    }

    #[test]
    fn the_hand_spares_visited_blocks_once() {
        let mut p = Sieve::new(4);
        for o in 0..4 {
            get(&mut p, o);
        }
        get(&mut p, 0);
        get(&mut p, 2);
        // The hand starts at the front: 0 visited (cleared), 1 goes.
        assert_eq!(evict_next(&mut p, 10), Some(OriginBlock(1)));
        // The hand is on 2 (visited, cleared), then 3 goes.
        assert_eq!(evict_next(&mut p, 11), Some(OriginBlock(3)));
        // On to 10, unvisited: it goes.
        assert_eq!(evict_next(&mut p, 12), Some(OriginBlock(10)));
        // 11 is not visited either.
        assert_eq!(evict_next(&mut p, 13), Some(OriginBlock(11)));
        // Queue: 0 2 12 13, hand on 12.
        get(&mut p, 12);
        get(&mut p, 13);
        // 12, 13 cleared, wrap: 0 (cleared earlier) goes.
        assert_eq!(evict_next(&mut p, 14), Some(OriginBlock(0)));
    }

    #[test]
    fn the_hand_skips_dirty_blocks() {
        let mut p = Sieve::new(3);
        for o in 0..3 {
            get(&mut p, o);
        }
        p.set_dirty(OriginBlock(0), true);
        get(&mut p, 1);
        // 0 dirty: skipped. 1 visited: cleared. 2 goes.
        assert_eq!(evict_next(&mut p, 10), Some(OriginBlock(2)));
        p.set_dirty(OriginBlock(10), true);
        // Hand past the back: front 0 dirty, 1 unvisited now: goes.
        assert_eq!(evict_next(&mut p, 11), Some(OriginBlock(1)));
        p.set_dirty(OriginBlock(11), true);
        assert_eq!(p.peek_victim(), None);
        assert_eq!(p.insert(OriginBlock(12), Time(0)), None);
        p.set_dirty(OriginBlock(10), false);
        assert_eq!(evict_next(&mut p, 12), Some(OriginBlock(10)));
    }

    #[test]
    fn removing_the_block_under_the_hand_moves_the_hand_back() {
        let mut p = Sieve::new(3);
        for o in 0..3 {
            get(&mut p, o);
        }
        get(&mut p, 0);
        // 0 cleared, 1 goes; the hand rests on 2.
        assert_eq!(evict_next(&mut p, 10), Some(OriginBlock(1)));
        get(&mut p, 10);
        p.remove(OriginBlock(2));
        get(&mut p, 20);
        get(&mut p, 20);
        // The hand is on 10 and 20 (visited: cleared), wraps to 0: goes.
        assert_eq!(evict_next(&mut p, 21), Some(OriginBlock(0)));
    }
}
