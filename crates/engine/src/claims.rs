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
//! After a crash, a restored clean claim is *unverified* (bit
//! [`UNVERIFIED`]) until its slot has been read and found to match the
//! claim's crc (`verify.rs`: before its first use, or in the background).
//! The bit lives in the same word as the generation, so any change of the
//! slot's content or owner (which bumps the generation) also ends it: new
//! content needs no check.
//!
//! Cost: 4 bytes of RAM per cache block, plus a small map of zombies that
//! lives for at most one commit interval, plus, after a crash and until
//! every restored clean block is verified, 4 bytes per cache block for the
//! expected crcs.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use tiercache_types::CacheBlock;

/// A clean claim with a crc may be durable for this slot.
pub(crate) const DURABLE: u32 = 1;
/// A clean claim for the slot's current content has been recorded.
pub(crate) const CLAIMED: u32 = 2;
/// The slot's block was restored after a crash from a clean claim whose
/// crc has not been checked against the slot yet: it must not be served
/// before it is.
pub(crate) const UNVERIFIED: u32 = 4;
const FLAGS: u32 = DURABLE | CLAIMED | UNVERIFIED;
const GEN_STEP: u32 = 8;

/// Per-slot claim state (see the module comment).
pub(crate) struct Claims {
    word: Vec<AtomicU32>,
    /// Origin block -> slots whose durable clean claim for it is being
    /// withdrawn (record pending).
    zombies: Mutex<HashMap<u64, Vec<u32>>>,
    zombie_count: AtomicUsize,
    /// The crc each UNVERIFIED slot's claim expects, by slot; emptied when
    /// the last one is settled.
    expected_crc: RwLock<Vec<u32>>,
    /// Slots with UNVERIFIED set.
    unverified: AtomicUsize,
    /// Restored blocks found to match (verified) or not (dropped).
    pub verified: AtomicU64,
    pub dropped: AtomicU64,
    /// Where the background verification goes on.
    pub verify_cursor: AtomicU32,
    /// How many times any slot's generation moved ([`Claims::bump`]): a
    /// slot can lose its claim only by a bump, so while this stands still
    /// no claimed slot becomes unclaimed (`reclaim.rs`).
    bumps: AtomicU64,
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
            expected_crc: RwLock::new(Vec::new()),
            unverified: AtomicUsize::new(0),
            verified: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            verify_cursor: AtomicU32::new(0),
            bumps: AtomicU64::new(0),
        }
    }

    /// How many bumps there have been so far (see the field).
    pub fn bumps(&self) -> u64 {
        self.bumps.load(SeqCst)
    }

    /// Starts a change of `c`'s content or owner: moves the generation on
    /// and clears CLAIMED and UNVERIFIED. Returns the previous word (look
    /// at DURABLE).
    pub fn bump(&self, c: CacheBlock) -> u32 {
        let w = &self.word[c.index()];
        let mut cur = w.load(SeqCst);
        loop {
            let new = (generation(cur).wrapping_add(GEN_STEP)) | (cur & DURABLE);
            match w.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
                Ok(prev) => {
                    // After the word: whoever reads the count and then the
                    // word sees this bump in one or the other.
                    self.bumps.fetch_add(1, SeqCst);
                    if prev & UNVERIFIED != 0 {
                        self.one_settled();
                    }
                    return prev;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// At open, before any IO: slot `c` holds a restored clean claim with
    /// crc `crc`, durable, to be checked before the slot is served.
    pub fn restore_unverified(&mut self, c: CacheBlock, crc: u32) {
        let expected = self.expected_crc.get_mut();
        if expected.is_empty() {
            expected.resize(self.word.len(), 0);
        }
        expected[c.index()] = crc;
        let w = self.word[c.index()].get_mut();
        if *w & UNVERIFIED == 0 {
            *self.unverified.get_mut() += 1;
        }
        *w |= DURABLE | CLAIMED | UNVERIFIED;
    }

    /// How many slots wait for their check.
    pub fn unverified_count(&self) -> usize {
        self.unverified.load(SeqCst)
    }

    /// Whether `c` must be checked before it is served.
    pub fn is_unverified(&self, c: CacheBlock) -> bool {
        self.unverified_count() != 0 && self.load(c) & UNVERIFIED != 0
    }

    /// For an unverified slot: its generation and the crc it must match.
    pub fn expected(&self, c: CacheBlock) -> Option<(u32, u32)> {
        let w = self.load(c);
        if w & UNVERIFIED == 0 {
            return None;
        }
        // Emptied only once no slot is left unverified: then this slot was
        // settled after the load above, and is not to be checked.
        let crc = *self.expected_crc.read().get(c.index())?;
        Some((generation(w), crc))
    }

    /// The content of generation `gen` matched its crc: ends UNVERIFIED.
    /// False (nothing changed) if the generation moved on or it had ended.
    pub fn settle_verified(&self, c: CacheBlock, gen: u32) -> bool {
        let w = &self.word[c.index()];
        let mut cur = w.load(SeqCst);
        loop {
            if generation(cur) != gen || cur & UNVERIFIED == 0 {
                return false;
            }
            match w.compare_exchange_weak(cur, cur & !UNVERIFIED, SeqCst, SeqCst) {
                Ok(_) => {
                    self.one_settled();
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn one_settled(&self) {
        if self.unverified.fetch_sub(1, SeqCst) == 1 {
            *self.expected_crc.write() = Vec::new();
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
        self.word.len() * 4 + self.expected_crc.read().len() * 4
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

    #[test]
    fn unverified_ends_by_a_check_of_its_generation_or_by_a_bump() {
        let mut c = Claims::new(3);
        c.restore_unverified(CacheBlock(0), 11);
        c.restore_unverified(CacheBlock(2), 22);
        assert_eq!(c.unverified_count(), 2);
        assert!(c.is_unverified(CacheBlock(0)) && !c.is_unverified(CacheBlock(1)));
        assert_eq!(c.load(CacheBlock(0)) & FLAGS, FLAGS);
        let (gen, crc) = c.expected(CacheBlock(2)).unwrap();
        assert_eq!(crc, 22);
        c.bump(CacheBlock(2));
        assert!(
            !c.settle_verified(CacheBlock(2), gen),
            "a moved slot is not settled"
        );
        assert_eq!(c.expected(CacheBlock(2)), None);
        assert_eq!(c.unverified_count(), 1);
        let (gen, _) = c.expected(CacheBlock(0)).unwrap();
        assert!(c.settle_verified(CacheBlock(0), gen));
        assert!(!c.settle_verified(CacheBlock(0), gen), "settled once");
        assert_eq!(c.unverified_count(), 0);
        assert_eq!(c.load(CacheBlock(0)) & FLAGS, DURABLE | CLAIMED);
        assert_eq!(c.memory_bytes(), 12, "the crcs are freed");
    }
}
