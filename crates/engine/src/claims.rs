//! Clean claims that survive a crash.
//!
//! A *clean claim* is a metadata record "slot c holds block b, clean, and
//! the slot's content had crc32c X when claimed". After an unclean shutdown
//! the engine reads each clean-claimed slot and keeps the claim only if the
//! crc still matches, so the warm clean set comes back without trusting
//! anything that a crash could have left stale. (Dirty claims need no crc:
//! they are authoritative, see `persist.rs`.)
//!
//! A claim that verifies must also still be *true*: the backing device must
//! hold the same data. The rules that keep it so:
//!
//! 1. Every change of a slot's content or owner bumps the slot's
//!    generation first ([`Claims::bump`]): in-place writes, and the
//!    eviction or invalidation of its block (which precedes any fill). A
//!    commit drops (turns into "slot free") every clean claim whose
//!    generation moved between the claim and the commit's cache flush, so
//!    a committed claim describes flushed content.
//! 2. A write that changes a block on the backing device while the block's
//!    slot may hold a *durable* clean claim (bit [`DURABLE`], which commits
//!    set before their flush and clear once a commit withdrew the claim)
//!    first writes the slot and flushes the cache device: a crash then
//!    leaves either the new data in the slot (the old crc no longer
//!    verifies) or the old data on both devices.
//! 3. A block dropped from a slot whose clean claim may be durable becomes a
//!    *zombie* until the record freeing that slot commits. A backing write
//!    of a zombie block first commits (so the stale claim is gone).
//! 4. Writeback writes in place need nothing: the slot's new content either
//!    fails the old crc or is covered by a dirty claim.
//!
//! Generation and bits share one atomic word per slot, so that "bump and
//! look at DURABLE" and "set DURABLE, flush, check the generation" cannot
//! miss each other: either the commit sees the bump and drops the claim, or
//! the bumper sees DURABLE and orders its writes.
//!
//! Cost: 4 bytes of RAM per cache block, plus a small map of zombies that
//! lives for at most one commit interval.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use tiercache_types::CacheBlock;

/// A clean claim with a crc may be durable for this slot.
pub(crate) const DURABLE: u32 = 1;
/// A clean claim for the slot's current content has been recorded.
pub(crate) const CLAIMED: u32 = 2;
const FLAGS: u32 = DURABLE | CLAIMED;
const GEN_STEP: u32 = 4;

/// Per-slot claim state (see the module comment).
pub(crate) struct Claims {
    word: Vec<AtomicU32>,
    /// Origin block -> slots whose durable clean claim for it is being
    /// withdrawn (record pending).
    zombies: Mutex<HashMap<u64, Vec<u32>>>,
    zombie_count: AtomicUsize,
}

/// The generation part of a state word.
pub(crate) fn generation(word: u32) -> u32 {
    word & !FLAGS
}

impl Claims {
    pub fn new(capacity: u32) -> Self {
        Claims {
            word: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            zombies: Mutex::new(HashMap::new()),
            zombie_count: AtomicUsize::new(0),
        }
    }

    /// Starts a change of `c`'s content or owner: moves the generation on
    /// and clears CLAIMED. Returns the previous word (look at DURABLE).
    pub fn bump(&self, c: CacheBlock) -> u32 {
        let w = &self.word[c.index()];
        let mut cur = w.load(SeqCst);
        loop {
            let new = (generation(cur).wrapping_add(GEN_STEP)) | (cur & DURABLE);
            match w.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
                Ok(prev) => return prev,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn load(&self, c: CacheBlock) -> u32 {
        self.word[c.index()].load(SeqCst)
    }

    /// Marks the content of generation `gen` as claimed; false (nothing
    /// changed) if the generation moved on.
    pub fn set_claimed(&self, c: CacheBlock, gen: u32) -> bool {
        let w = &self.word[c.index()];
        let mut cur = w.load(SeqCst);
        loop {
            if generation(cur) != gen {
                return false;
            }
            match w.compare_exchange_weak(cur, cur | CLAIMED, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn set_durable(&self, c: u32) -> bool {
        self.word[c as usize].fetch_or(DURABLE, SeqCst) & DURABLE != 0
    }

    pub fn clear_durable(&self, c: u32) {
        self.word[c as usize].fetch_and(!DURABLE, SeqCst);
    }

    /// State after opening: the slot holds a verified, durable claim.
    pub fn set_restored(&self, c: CacheBlock) {
        self.word[c.index()].fetch_or(DURABLE | CLAIMED, SeqCst);
    }

    pub fn add_zombie(&self, oblock: u64, slot: u32) {
        self.zombies.lock().entry(oblock).or_default().push(slot);
        self.zombie_count.fetch_add(1, SeqCst);
    }

    pub fn remove_zombie(&self, oblock: u64, slot: u32) {
        let mut z = self.zombies.lock();
        if let Some(v) = z.get_mut(&oblock) {
            if let Some(i) = v.iter().position(|&s| s == slot) {
                v.swap_remove(i);
                self.zombie_count.fetch_sub(1, SeqCst);
            }
            if v.is_empty() {
                z.remove(&oblock);
            }
        }
    }

    /// Whether any block in `blocks` is a zombie.
    pub fn any_zombie(&self, blocks: std::ops::Range<u64>) -> bool {
        if self.zombie_count.load(SeqCst) == 0 {
            return false;
        }
        let z = self.zombies.lock();
        if (blocks.end - blocks.start) as usize > z.len() {
            z.keys().any(|b| blocks.contains(b))
        } else {
            blocks.into_iter().any(|b| z.contains_key(&b))
        }
    }

    pub fn memory_bytes(&self) -> usize {
        self.word.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_keeps_durable_and_clears_claimed() {
        let c = Claims::new(2);
        let s = CacheBlock(1);
        let g0 = generation(c.load(s));
        assert!(c.set_claimed(s, g0));
        assert!(!c.set_durable(1));
        let prev = c.bump(s);
        assert_eq!(prev & FLAGS, DURABLE | CLAIMED);
        let now = c.load(s);
        assert_eq!(now & FLAGS, DURABLE);
        assert_ne!(generation(now), g0);
        assert!(!c.set_claimed(s, g0), "old generation cannot claim");
        c.clear_durable(1);
        assert_eq!(c.load(s) & FLAGS, 0);
    }

    #[test]
    fn generation_wraps_without_touching_flags() {
        let c = Claims::new(1);
        c.word[0].store(!FLAGS | DURABLE, SeqCst);
        c.bump(CacheBlock(0));
        assert_eq!(c.load(CacheBlock(0)), DURABLE);
    }

    #[test]
    fn zombies_are_counted_per_slot() {
        let c = Claims::new(4);
        assert!(!c.any_zombie(0..100));
        c.add_zombie(7, 1);
        c.add_zombie(7, 2);
        assert!(c.any_zombie(5..8));
        assert!(!c.any_zombie(8..9));
        c.remove_zombie(7, 1);
        assert!(c.any_zombie(7..8));
        c.remove_zombie(7, 2);
        assert!(!c.any_zombie(0..u64::MAX));
        c.remove_zombie(7, 2);
        assert_eq!(c.zombie_count.load(SeqCst), 0);
    }
}
