//! ARC, the adaptive replacement cache (Megiddo and Modha, FAST 2003),
//! following libCacheSim's `cache/eviction/ARC.c` (the version bundled by
//! the `libcachesim` Python package) so miss counts on read-only traces
//! match it exactly.
//!
//! - T1: blocks seen once recently; T2: blocks seen at least twice. B1, B2:
//!   ghosts (origin ids only) of blocks evicted from T1 and T2.
//! - A hit moves the block to the MRU end of T2.
//! - A miss found in B1 raises the target size of T1,
//!   `p = min(p + max(|B2| / |B1|, 1), c)`; one found in B2 lowers it,
//!   `p = max(p - max(|B1| / |B2|, 1), 0)` (floating point, as libCacheSim
//!   does since it cross-checked against a reference implementation). Either
//!   way the ghost entry is dropped and, if the cache is full, REPLACE runs;
//!   the block then enters T2.
//! - A miss found nowhere (case IV), with the cache full: if
//!   `|T1| + |B1| >= c`, drop B1's LRU and REPLACE, or, with B1 empty, evict
//!   T1's LRU without a ghost; otherwise, if `|T1|+|T2|+|B1|+|B2| >= 2c`
//!   drop B2's LRU (if any), then REPLACE. The block enters T1.
//! - REPLACE: evict T1's LRU into B1 if `|T1| > 0` and (`|T1| > p`, or
//!   `|T1| == p` and the block was found in B2), or if T2 is empty;
//!   otherwise evict T2's LRU into B2.
//!
//! Dirty blocks (never evicted): they leave T1/T2 for a dirty twin list
//! (D1/D2) but still count in `|T1|`/`|T2|` for every size rule above, so the
//! adaptation is undisturbed. When REPLACE picks a list whose blocks are all
//! dirty, the LRU clean block of the other list goes (into that list's own
//! ghost). Cost: a dirty block's recency is frozen while it is dirty; when
//! cleaned it re-enters its list at the MRU end. A hit on a D1 block moves it
//! to D2, as a T1 hit moves to T2.
//!
//! Deliberate differences from libCacheSim (none on read-only traces with
//! the `always` admission): libCacheSim drops a ghost entry and adapts `p`
//! as soon as the block misses; here that happens in
//! [`Replacement::insert`], so a miss that admission rejects leaves the
//! ghost and `p` unchanged. `remove` (invalidation) drops the block without
//! a ghost, as libCacheSim's `ARC_remove`.
//!
//! Memory per cache block: the [`SlotTable`] (~21.7 B) and the ghosts, kept
//! exactly (origin ids) in a second [`SlotTable`] of `c` entries (~21.0 B,
//! two lists): ~42.6 B in all.

use crate::slots::SlotTable;
use crate::{Insertion, Replacement};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

// Resident lists. LRU at the front, MRU at the back.
const T1: u8 = 0;
const T2: u8 = 1;
const D1: u8 = 2;
const D2: u8 = 3;
// Ghost lists (in `ghosts`).
const B1: u8 = 0;
const B2: u8 = 1;

/// The ARC replacement policy. See the module documentation.
#[derive(Clone)]
pub struct Arc {
    slots: SlotTable,
    ghosts: SlotTable,
    /// Target size of T1.
    p: f64,
}

impl Arc {
    pub fn new(capacity: u32) -> Self {
        Arc {
            slots: SlotTable::new(capacity, 4),
            ghosts: SlotTable::new(capacity, 2),
            p: 0.0,
        }
    }

    /// The adaptive target size of T1 (for tests and diagnostics).
    pub fn target_t1(&self) -> f64 {
        self.p
    }

    fn t1(&self) -> u32 {
        self.slots.list_len(T1) + self.slots.list_len(D1)
    }
    fn t2(&self) -> u32 {
        self.slots.list_len(T2) + self.slots.list_len(D2)
    }
    fn b1(&self) -> u32 {
        self.ghosts.list_len(B1)
    }
    fn b2(&self) -> u32 {
        self.ghosts.list_len(B2)
    }

    /// REPLACE's choice: true for T1 (into B1), false for T2 (into B2).
    fn replace_from_t1(&self, in_b2: bool) -> bool {
        let t1 = self.t1() as f64;
        (self.t1() > 0 && (t1 > self.p || (t1 == self.p && in_b2))) || self.t2() == 0
    }

    /// The LRU clean block of `list` (T1 or T2), else of the other one.
    fn lru_clean(&self, list: u8) -> Option<CacheBlock> {
        self.slots
            .front(list)
            .or_else(|| self.slots.front(list ^ 1))
    }

    /// The slot REPLACE evicts (into a ghost).
    fn replace_victim(&self, in_b2: bool) -> Option<CacheBlock> {
        self.lru_clean(if self.replace_from_t1(in_b2) { T1 } else { T2 })
    }

    /// The slot a miss evicts from a full cache, and whether it leaves a
    /// ghost. `in_ghost`/`in_b2`: where the missed block was found. Ghost
    /// entries dropped on the way (case IV) do not change the choice.
    fn plan_eviction(&self, in_ghost: bool, in_b2: bool) -> Option<(CacheBlock, bool)> {
        if !in_ghost
            && self.t1() as u64 + self.b1() as u64 >= self.capacity() as u64
            && self.b1() == 0
        {
            // Case IV-A with B1 empty: T1 fills the cache; no ghost.
            self.lru_clean(T1).map(|s| (s, false))
        } else {
            self.replace_victim(in_b2).map(|s| (s, true))
        }
    }

    /// Evicts resident slot `s`, remembering it in the ghost of the list it
    /// was on if `ghost`.
    fn evict(&mut self, s: CacheBlock, ghost: bool) -> OriginBlock {
        let o = self.slots.oblock_of(s).expect("listed slot is mapped");
        let ghost_list = if self.slots.list_of(s) == T1 { B1 } else { B2 };
        self.slots.remove(o);
        if ghost {
            if self.ghosts.is_full() {
                // Cannot happen with the ARC invariants (|B1| + |B2| <= c);
                // kept so a broken invariant costs a ghost, not a panic.
                let old = self
                    .ghosts
                    .front(B2)
                    .or_else(|| self.ghosts.front(B1))
                    .expect("full ghost table");
                let oo = self.ghosts.oblock_of(old).expect("mapped");
                self.ghosts.remove(oo);
            }
            self.ghosts.insert(o, ghost_list);
        }
        o
    }

    fn drop_ghost_lru(&mut self, list: u8) {
        if let Some(g) = self.ghosts.front(list) {
            let o = self.ghosts.oblock_of(g).expect("mapped");
            self.ghosts.remove(o);
        }
    }
}

impl Replacement for Arc {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::Arc
    }
    fn slots(&self) -> &SlotTable {
        &self.slots
    }

    fn touch(&mut self, oblock: OriginBlock, _access: Access, _now: Time) {
        if let Some(c) = self.slots.lookup(oblock) {
            let to = match self.slots.list_of(c) {
                T1 | T2 => T2,
                _ => D2,
            };
            self.slots.move_to_back(c, to);
        }
    }

    fn insert(&mut self, oblock: OriginBlock, _now: Time) -> Option<Insertion> {
        let full = self.slots.is_full();
        if full && self.slots.dirty_count() == self.slots.len() {
            return None;
        }
        let (mut in_b1, mut in_b2) = (false, false);
        if let Some(g) = self.ghosts.lookup(oblock) {
            if self.ghosts.list_of(g) == B1 {
                in_b1 = true;
                let delta = (self.b2() as f64 / self.b1() as f64).max(1.0);
                self.p = (self.p + delta).min(self.capacity() as f64);
            } else {
                in_b2 = true;
                let delta = (self.b1() as f64 / self.b2() as f64).max(1.0);
                self.p = (self.p - delta).max(0.0);
            }
            self.ghosts.remove(oblock);
        }
        let in_ghost = in_b1 || in_b2;
        let mut evicted = None;
        if full {
            let (s, ghost) = self
                .plan_eviction(in_ghost, in_b2)
                .expect("a clean block exists");
            if !in_ghost {
                let c = self.capacity();
                if self.t1() as u64 + self.b1() as u64 >= c as u64 {
                    // Case IV-A: |T1| + |B1| = c.
                    self.drop_ghost_lru(B1);
                } else if self.t1() as u64 + self.t2() as u64 + self.b1() as u64 + self.b2() as u64
                    >= 2 * c as u64
                {
                    // Case IV-B with the directory full.
                    self.drop_ghost_lru(B2);
                }
            }
            evicted = Some(self.evict(s, ghost));
        }
        let list = if in_ghost { T2 } else { T1 };
        let cblock = self.slots.insert(oblock, list).expect("a slot is free");
        Some(Insertion { cblock, evicted })
    }

    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, hint: u8) -> bool {
        let list = match (hint == 2, dirty) {
            (false, false) => T1,
            (true, false) => T2,
            (false, true) => D1,
            (true, true) => D2,
        };
        if !self.slots.insert_into(oblock, cblock, list) {
            return false;
        }
        self.slots.set_dirty(cblock, dirty);
        self.ghosts.remove(oblock);
        true
    }

    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        self.slots.remove(oblock)
    }

    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
        if let Some(c) = self.slots.lookup(oblock) {
            if self.slots.is_dirty(c) != dirty {
                self.slots.set_dirty(c, dirty);
                // T1 <-> D1 and T2 <-> D2: flip bit 1 of the list id.
                let to = self.slots.list_of(c) ^ 2;
                self.slots.move_to_back(c, to);
            }
        }
    }

    /// The block a miss found in no ghost would evict (exact for such a
    /// miss; a ghost hit may pick the other list).
    fn peek_victim(&self) -> Option<OriginBlock> {
        if !self.slots.is_full() {
            return None;
        }
        self.plan_eviction(false, false)
            .and_then(|(s, _)| self.slots.oblock_of(s))
    }

    /// 1: in T1 (seen once), 2: in T2 (seen twice or more).
    fn hint(&self, oblock: OriginBlock) -> u8 {
        self.slots.lookup(oblock).map_or(0, |c| {
            if self.slots.list_of(c) % 2 == T1 {
                1
            } else {
                2
            }
        })
    }

    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes() + self.ghosts.memory_bytes() + std::mem::size_of::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_access as get;

    #[test]
    fn a_scan_does_not_flush_blocks_seen_twice() {
        let mut p = Arc::new(10);
        for o in 0..5 {
            get(&mut p, o);
            get(&mut p, o);
        }
        assert_eq!((p.t1(), p.t2()), (0, 5));
        for o in 100..200 {
            get(&mut p, o);
        }
        for o in 0..5 {
            assert!(p.lookup(OriginBlock(o)).is_some(), "{o} flushed by a scan");
            assert_eq!(p.hint(OriginBlock(o)), 2);
        }
    }

    #[test]
    fn ghost_hits_adapt_p_and_enter_t2() {
        let mut p = Arc::new(4);
        for o in 0..4 {
            get(&mut p, o);
        }
        // Case IV-A with B1 empty: T1 LRU leaves without a ghost.
        let ins = p.insert(OriginBlock(4), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(0)));
        assert_eq!(p.b1(), 0);
        get(&mut p, 4); // 4 -> T2
                        // Now |T1| + |B1| = 3 < 4: REPLACE takes T1's LRU (1) into B1.
        let ins = p.insert(OriginBlock(5), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(1)));
        assert_eq!(p.b1(), 1);
        // 1 again: a B1 hit raises p by max(|B2|/|B1|, 1) = 1 and enters T2.
        assert!(!get(&mut p, 1));
        assert_eq!(p.target_t1(), 1.0);
        assert_eq!(p.hint(OriginBlock(1)), 2);
        assert_eq!(p.b1(), 1, "one ghost dropped, one made");
    }

    #[test]
    fn dirty_blocks_stay_and_count_in_their_list() {
        let mut p = Arc::new(3);
        for o in 0..3 {
            get(&mut p, o);
            p.set_dirty(OriginBlock(o), true);
        }
        assert_eq!(p.t1(), 3);
        assert_eq!(p.peek_victim(), None);
        assert_eq!(p.insert(OriginBlock(9), Time(0)), None);
        get(&mut p, 1); // D1 -> D2
        assert_eq!((p.t1(), p.t2()), (2, 1));
        p.set_dirty(OriginBlock(1), false); // -> T2
        assert_eq!(p.peek_victim(), Some(OriginBlock(1)));
        let ins = p.insert(OriginBlock(9), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(1)));
        assert_eq!(p.dirty_len(), 2);
    }

    #[test]
    fn peek_victim_matches_insert_on_plain_misses() {
        let mut p = Arc::new(40);
        let mut x = 11u64;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let o = ((x >> 33) % 100) * ((x >> 20) % 3 + 1) / 2;
            if p.lookup(OriginBlock(o)).is_some() {
                p.touch(OriginBlock(o), Access::Read, Time(0));
            } else {
                let ghost = p.ghosts.lookup(OriginBlock(o)).is_some();
                let peek = p.peek_victim();
                let ins = p.insert(OriginBlock(o), Time(0)).unwrap();
                if !ghost {
                    assert_eq!(peek, ins.evicted);
                }
            }
            assert!(p.b1() + p.b2() <= 40);
            assert!(p.t1() + p.b1() <= 40);
        }
    }
}
