//! Least recently used, with clean and dirty blocks on separate lists so
//! eviction (clean only) is O(1).

use crate::slots::SlotTable;
use crate::{Insertion, Replacement};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

const CLEAN: u8 = 0;
const DIRTY: u8 = 1;

/// LRU: a hit moves a block to the back (most recent); the front of the
/// clean list is evicted.
#[derive(Clone)]
pub struct Lru {
    slots: SlotTable,
}

impl Lru {
    pub fn new(capacity: u32) -> Self {
        Lru {
            slots: SlotTable::new(capacity, 2),
        }
    }
}

impl Replacement for Lru {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::Lru
    }
    fn slots(&self) -> &SlotTable {
        &self.slots
    }
    fn touch(&mut self, oblock: OriginBlock, _access: Access, _now: Time) {
        if let Some(c) = self.slots.lookup(oblock) {
            let list = self.slots.list_of(c);
            self.slots.move_to_back(c, list);
        }
    }
    fn insert(&mut self, oblock: OriginBlock, _now: Time) -> Option<Insertion> {
        let mut evicted = None;
        if self.slots.is_full() {
            let victim = self.slots.front(CLEAN)?;
            let o = self.slots.oblock_of(victim).expect("listed slot is mapped");
            self.slots.remove(o);
            evicted = Some(o);
        }
        let cblock = self.slots.insert(oblock, CLEAN).expect("a slot is free");
        Some(Insertion { cblock, evicted })
    }
    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, _hint: u8) -> bool {
        if !self
            .slots
            .insert_into(oblock, cblock, if dirty { DIRTY } else { CLEAN })
        {
            return false;
        }
        self.slots.set_dirty(cblock, dirty);
        true
    }
    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        self.slots.remove(oblock)
    }
    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
        if let Some(c) = self.slots.lookup(oblock) {
            if self.slots.is_dirty(c) != dirty {
                self.slots.set_dirty(c, dirty);
                // Keep recency: a block just written is recent either way.
                self.slots
                    .move_to_back(c, if dirty { DIRTY } else { CLEAN });
            }
        }
    }
    fn peek_victim(&self) -> Option<OriginBlock> {
        if !self.slots.is_full() {
            return None;
        }
        self.slots
            .front(CLEAN)
            .and_then(|c| self.slots.oblock_of(c))
    }
    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_clean_block() {
        let mut p = Lru::new(3);
        for o in 0..3 {
            assert_eq!(p.insert(OriginBlock(o), Time(o)).unwrap().evicted, None);
        }
        p.touch(OriginBlock(0), Access::Read, Time(10));
        p.set_dirty(OriginBlock(1), true);
        // 1 is dirty and 0 was used recently: 2 goes.
        let ins = p.insert(OriginBlock(9), Time(11)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(2)));
        assert_eq!(p.lookup(OriginBlock(9)), Some(ins.cblock));
        assert!(p.lookup(OriginBlock(2)).is_none());
    }

    #[test]
    fn full_of_dirty_blocks_refuses_insert() {
        let mut p = Lru::new(2);
        for o in 0..2 {
            p.insert(OriginBlock(o), Time(0)).unwrap();
            p.set_dirty(OriginBlock(o), true);
        }
        assert_eq!(p.insert(OriginBlock(5), Time(1)), None);
        assert_eq!(p.len(), 2);
        p.set_dirty(OriginBlock(0), false);
        assert_eq!(
            p.insert(OriginBlock(5), Time(1)).unwrap().evicted,
            Some(OriginBlock(0))
        );
    }
}
