//! First in, first out, following libCacheSim's `cache/eviction/FIFO.c`:
//! a block enters at the back of one queue, a hit changes nothing, and the
//! block at the front (the oldest insertion) is evicted. Miss counts match
//! libCacheSim's exactly on read-only traces.
//!
//! Dirty blocks (never evicted) keep their place while the front of the
//! queue is clean. The queue's front is kept clean at all times: whenever a
//! dirty block reaches the front (the blocks ahead of it were evicted or
//! removed, or it was made dirty there), it is parked at the back of a
//! second list, so eviction never walks over dirty blocks (O(1) amortised:
//! a block is parked at most once per time it is made dirty). Parked blocks
//! are older than every block in the queue and are parked in insertion
//! order; one that is cleaned returns to the front of the queue, so the
//! oldest clean block is still evicted first. The one inexactness: parked
//! blocks cleaned at different times return to the front in the reverse of
//! the order they were cleaned, not of their insertion.
//!
//! Memory per cache block: the [`SlotTable`] alone (~21.0 B: one list).

use crate::slots::SlotTable;
use crate::{Insertion, Replacement};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

/// The queue, oldest at the front. Its front block is always clean.
const QUEUE: u8 = 0;
/// Dirty blocks that reached the queue's front, oldest at the front.
const PARKED: u8 = 1;

/// FIFO replacement. See the module documentation.
#[derive(Clone)]
pub struct Fifo {
    slots: SlotTable,
}

impl Fifo {
    pub fn new(capacity: u32) -> Self {
        Fifo {
            slots: SlotTable::new(capacity, 2),
        }
    }

    /// Parks the dirty blocks at the front of the queue, so its front is
    /// clean (or the queue empty).
    fn settle(&mut self) {
        while let Some(c) = self.slots.front(QUEUE) {
            if !self.slots.is_dirty(c) {
                break;
            }
            self.slots.move_to_back(c, PARKED);
        }
    }
}

impl Replacement for Fifo {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::Fifo
    }
    fn slots(&self) -> &SlotTable {
        &self.slots
    }
    fn touch(&mut self, _oblock: OriginBlock, _access: Access, _now: Time) {}

    fn insert(&mut self, oblock: OriginBlock, _now: Time) -> Option<Insertion> {
        let mut evicted = None;
        if self.slots.is_full() {
            let victim = self.slots.front(QUEUE)?;
            let o = self.slots.oblock_of(victim).expect("listed slot is mapped");
            self.slots.remove(o);
            evicted = Some(o);
        }
        let cblock = self.slots.insert(oblock, QUEUE).expect("a slot is free");
        self.settle();
        Some(Insertion { cblock, evicted })
    }

    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, _hint: u8) -> bool {
        if !self.slots.insert_into(oblock, cblock, QUEUE) {
            return false;
        }
        self.slots.set_dirty(cblock, dirty);
        self.settle();
        true
    }

    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        let c = self.slots.remove(oblock)?;
        self.settle();
        Some(c)
    }

    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
        let Some(c) = self.slots.lookup(oblock) else {
            return;
        };
        if self.slots.is_dirty(c) == dirty {
            return;
        }
        self.slots.set_dirty(c, dirty);
        if dirty {
            self.settle();
        } else if self.slots.list_of(c) == PARKED {
            self.slots.move_to_front(c, QUEUE);
        }
    }

    fn peek_victim(&self) -> Option<OriginBlock> {
        if !self.slots.is_full() {
            return None;
        }
        self.slots
            .front(QUEUE)
            .and_then(|c| self.slots.oblock_of(c))
    }

    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_access as get;

    #[test]
    fn evicts_in_insertion_order_whatever_the_hits() {
        let mut p = Fifo::new(3);
        for o in 0..3 {
            assert!(!get(&mut p, o));
        }
        assert!(get(&mut p, 0));
        assert!(get(&mut p, 0));
        assert_eq!(p.peek_victim(), Some(OriginBlock(0)));
        let ins = p.insert(OriginBlock(9), Time(1)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(0)));
        let ins = p.insert(OriginBlock(10), Time(1)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(1)));
    }

    #[test]
    fn evicts_the_oldest_clean_block() {
        let mut p = Fifo::new(4);
        for o in 0..4 {
            get(&mut p, o);
        }
        p.set_dirty(OriginBlock(0), true);
        p.set_dirty(OriginBlock(2), true);
        assert_eq!(p.peek_victim(), Some(OriginBlock(1)));
        assert_eq!(
            p.insert(OriginBlock(4), Time(0)).unwrap().evicted,
            Some(OriginBlock(1))
        );
        // 2 is at the front now, dirty: 3 goes next.
        assert_eq!(p.peek_victim(), Some(OriginBlock(3)));
        // Cleaned, 0 is again the oldest clean block.
        p.set_dirty(OriginBlock(0), false);
        assert_eq!(
            p.insert(OriginBlock(5), Time(0)).unwrap().evicted,
            Some(OriginBlock(0))
        );
        assert_eq!(
            p.insert(OriginBlock(6), Time(0)).unwrap().evicted,
            Some(OriginBlock(3))
        );
        // A block made dirty while in the queue keeps its place when
        // cleaned before it reaches the front.
        p.set_dirty(OriginBlock(5), true);
        p.set_dirty(OriginBlock(5), false);
        assert_eq!(
            p.insert(OriginBlock(7), Time(0)).unwrap().evicted,
            Some(OriginBlock(4))
        );
        assert_eq!(
            p.insert(OriginBlock(8), Time(0)).unwrap().evicted,
            Some(OriginBlock(5))
        );
    }

    #[test]
    fn full_of_dirty_blocks_refuses_insert() {
        let mut p = Fifo::new(2);
        for o in 0..2 {
            get(&mut p, o);
            p.set_dirty(OriginBlock(o), true);
        }
        assert_eq!(p.peek_victim(), None);
        assert_eq!(p.insert(OriginBlock(5), Time(1)), None);
        assert_eq!(p.len(), 2);
        p.set_dirty(OriginBlock(1), false);
        assert_eq!(
            p.insert(OriginBlock(5), Time(1)).unwrap().evicted,
            Some(OriginBlock(1))
        );
    }
}
