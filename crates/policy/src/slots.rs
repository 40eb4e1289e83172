//! The resident set shared by every replacement policy: which origin block
//! lives in which cache slot, the slot's dirty bit, and intrusive doubly
//! linked lists threaded through the slots.
//!
//! Memory per slot: 8 (origin block) + 8 (list links) + 1 (list id; a
//! quarter in a table of at most three lists, `list_ids.rs`) + 1/8 (dirty
//! bit) + about 4.6 (hash index at load factor 7/8): ~21.7 bytes, ~21.0
//! with three lists or fewer.
//!
//! The index is sized to exactly `8/7 * capacity` entries (not rounded up to a
//! power of two, which would cost up to 9.1 bytes per slot), addressed by
//! multiply-shift range reduction, and probed linearly. Each 32-bit entry
//! holds a slot number in its low bits (as many as `capacity` needs) and, in
//! the bits left over, the entry's distance from its home position
//! (saturating). A probe at distance `k` from a key's home reads the origin
//! block of an entry only if the entry's distance is `k` (the same home), so
//! the long probe sequences of load 7/8 (~4.5 entries for a hit, ~32 for a
//! miss) stay within one or two cache lines of the index, with about one
//! read of `oblock` per lookup; deletion (backward shift) takes homes from
//! the distances without rehashing. With 2^31 slots or more no bits are
//! left over and every probe reads the origin block.
//!
//! A table whose size is bounded whatever the cache's (a mini-cache of
//! [`crate::Adaptive`]: at most ~4096 slots) can afford a sparser index
//! ([`SlotTable::sparse`], load 1/2: 8 bytes per slot, ~1.5 entries per hit
//! and ~2.5 per miss). At load 7/8 the probes dominate: replaying a real
//! trace through the default policy, the tables' lookups, insertions and
//! removals were about 60% of the simulator's instructions, most of them
//! the mini-caches'.

use crate::list_ids::ListIds;
use tiercache_types::{CacheBlock, OriginBlock};

/// "No slot" in links and in the hash index.
pub const NIL: u32 = u32::MAX;
/// List id of free slots.
pub const FREE_LIST: u8 = u8::MAX;
const EMPTY_OBLOCK: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, Default)]
struct ListHead {
    head: u32, // least recently pushed (front)
    tail: u32, // most recently pushed (back)
    len: u32,
}

/// Slots, their mapping and their lists. Policies own one and decide which
/// list a slot is on; the table keeps the mapping and links consistent.
#[derive(Clone)]
pub struct SlotTable {
    oblock: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    list: ListIds,
    dirty: Vec<u64>,
    heads: Vec<ListHead>,
    free: ListHead,
    /// Entries `(distance << slot_bits) | slot`, or `NIL`.
    index: Vec<u32>,
    index_len: usize,
    /// Bits of an index entry that hold the slot.
    slot_bits: u32,
    /// The largest distance an entry records (0: none recorded); an entry
    /// recording it may be farther from home.
    disp_max: u32,
    resident: u32,
    dirty_count: u32,
}

fn hash(o: u64) -> u64 {
    crate::seeded_hash::seeded_hash(o, 0)
}

impl SlotTable {
    /// A table of `capacity` free slots with `lists` policy lists (ids
    /// `0..lists`, at most 255).
    pub fn new(capacity: u32, lists: u8) -> Self {
        SlotTable::with_index_len(capacity, lists, capacity as usize * 8 / 7 + 1)
    }

    /// As [`SlotTable::new`], with the hash index at load 1/2 instead of
    /// 7/8: 3.4 bytes more per slot for lookups about a thirteenth as long
    /// when the block is absent, a third as long when present. For tables of
    /// bounded size (see the module documentation).
    pub fn sparse(capacity: u32, lists: u8) -> Self {
        SlotTable::with_index_len(capacity, lists, capacity as usize * 2 + 1)
    }

    fn with_index_len(capacity: u32, lists: u8, index_len: usize) -> Self {
        assert!(capacity < NIL, "capacity too large");
        let n = capacity as usize;
        let index_len = index_len.max(8);
        // capacity < 2^slot_bits, so a slot field is never all ones and no
        // entry equals NIL.
        let slot_bits = (32 - capacity.leading_zeros()).max(1);
        let disp_max = if slot_bits >= 32 {
            0
        } else {
            (1u32 << (32 - slot_bits)) - 1
        };
        let mut t = SlotTable {
            oblock: vec![EMPTY_OBLOCK; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            list: ListIds::new(n, lists),
            dirty: vec![0; n.div_ceil(64)],
            heads: vec![
                ListHead {
                    head: NIL,
                    tail: NIL,
                    len: 0
                };
                lists as usize
            ],
            free: ListHead {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            index: vec![NIL; index_len],
            index_len,
            slot_bits,
            disp_max,
            resident: 0,
            dirty_count: 0,
        };
        for s in 0..capacity {
            t.link_back(FREE_LIST, s);
        }
        t
    }

    pub fn capacity(&self) -> u32 {
        self.oblock.len() as u32
    }
    /// Number of resident (mapped) slots.
    pub fn len(&self) -> u32 {
        self.resident
    }
    pub fn is_empty(&self) -> bool {
        self.resident == 0
    }
    pub fn is_full(&self) -> bool {
        self.free.len == 0
    }
    pub fn dirty_count(&self) -> u32 {
        self.dirty_count
    }

    /// Bytes of RAM this table uses.
    pub fn memory_bytes(&self) -> usize {
        self.oblock.len() * (8 + 4 + 4)
            + self.list.memory_bytes()
            + self.dirty.len() * 8
            + self.index.len() * 4
            + self.heads.len() * std::mem::size_of::<ListHead>()
    }

    /// The slot holding `o`, if resident.
    pub fn lookup(&self, o: OriginBlock) -> Option<CacheBlock> {
        self.find(o.0).map(|(_, s)| CacheBlock(s))
    }

    /// The index position and slot of `key`, if resident.
    #[inline]
    fn find(&self, key: u64) -> Option<(usize, u32)> {
        let mut i = self.home(key);
        let mut k = 0u32;
        loop {
            let e = self.index[i];
            if e == NIL {
                return None;
            }
            let d = self.entry_disp(e);
            if d == k || (d == self.disp_max && k > d) {
                let s = self.entry_slot(e);
                if self.oblock[s as usize] == key {
                    return Some((i, s));
                }
            }
            i = self.step(i);
            k = k.saturating_add(1);
        }
    }

    /// The index entry for slot `s` at distance `disp` from its home.
    #[inline]
    fn entry(&self, s: u32, disp: usize) -> u32 {
        if self.disp_max == 0 {
            s
        } else {
            ((disp.min(self.disp_max as usize) as u32) << self.slot_bits) | s
        }
    }

    #[inline]
    fn entry_slot(&self, e: u32) -> u32 {
        if self.slot_bits >= 32 {
            e
        } else {
            e & ((1 << self.slot_bits) - 1)
        }
    }

    /// The distance an entry records (saturated at `disp_max`).
    #[inline]
    fn entry_disp(&self, e: u32) -> u32 {
        if self.disp_max == 0 {
            0
        } else {
            e >> self.slot_bits
        }
    }

    /// The home position of `key` in the index: `hash * len / 2^64`.
    #[inline]
    fn home(&self, key: u64) -> usize {
        ((hash(key) as u128 * self.index_len as u128) >> 64) as usize
    }

    /// The next probe position after `i` (linear probing, wrapping).
    #[inline]
    fn step(&self, i: usize) -> usize {
        if i + 1 == self.index_len {
            0
        } else {
            i + 1
        }
    }

    /// Probe distance from `from` forward to `to`, wrapping.
    #[inline]
    fn dist(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.index_len - from
        }
    }

    /// The origin block in slot `c`, if the slot is mapped.
    pub fn oblock_of(&self, c: CacheBlock) -> Option<OriginBlock> {
        let o = self.oblock[c.index()];
        (o != EMPTY_OBLOCK).then_some(OriginBlock(o))
    }

    /// Maps `o` into a free slot and puts it at the back of `list`.
    /// Caller guarantees `o` is not resident. Returns None when no slot is free.
    pub fn insert(&mut self, o: OriginBlock, list: u8) -> Option<CacheBlock> {
        debug_assert!(self.lookup(o).is_none(), "{o} already resident");
        assert!(o.0 != EMPTY_OBLOCK);
        let s = self.free.head;
        if s == NIL {
            return None;
        }
        self.unlink(s);
        self.insert_at(o, s, list);
        Some(CacheBlock(s))
    }

    /// Maps `o` into the specific free slot `c` (used when restoring saved
    /// mappings). Returns false if the slot is not free or `o` is resident.
    pub fn insert_into(&mut self, o: OriginBlock, c: CacheBlock, list: u8) -> bool {
        if c.0 >= self.capacity()
            || self.list.get(c.index()) != FREE_LIST
            || self.lookup(o).is_some()
        {
            return false;
        }
        self.unlink(c.0);
        self.insert_at(o, c.0, list);
        true
    }

    fn insert_at(&mut self, o: OriginBlock, s: u32, list: u8) {
        self.oblock[s as usize] = o.0;
        let mut i = self.home(o.0);
        let mut k = 0;
        while self.index[i] != NIL {
            i = self.step(i);
            k += 1;
        }
        self.index[i] = self.entry(s, k);
        self.resident += 1;
        self.link_back(list, s);
    }

    /// Unmaps `o`, frees its slot (clearing its dirty bit) and returns it.
    pub fn remove(&mut self, o: OriginBlock) -> Option<CacheBlock> {
        let (i, s) = self.find(o.0)?;
        let c = CacheBlock(s);
        self.set_dirty(c, false);
        self.unlink(s);
        self.index_remove(i);
        self.oblock[s as usize] = EMPTY_OBLOCK;
        self.resident -= 1;
        self.link_back(FREE_LIST, s);
        Some(c)
    }

    /// Empties index position `i`.
    fn index_remove(&mut self, i: usize) {
        // Backward-shift deletion keeps probe sequences intact.
        let mut hole = i;
        let mut j = i;
        loop {
            j = self.step(j);
            let e = self.index[j];
            if e == NIL {
                break;
            }
            let s = self.entry_slot(e);
            let recorded = self.entry_disp(e);
            let d = if recorded < self.disp_max {
                recorded as usize
            } else {
                self.dist(self.home(self.oblock[s as usize]), j)
            };
            // Move the entry into the hole if its home is not in (hole, j].
            let gap = self.dist(hole, j);
            if d >= gap {
                self.index[hole] = self.entry(s, d - gap);
                hole = j;
            }
        }
        self.index[hole] = NIL;
    }

    pub fn is_dirty(&self, c: CacheBlock) -> bool {
        self.dirty[c.index() / 64] & (1 << (c.0 % 64)) != 0
    }

    pub fn set_dirty(&mut self, c: CacheBlock, dirty: bool) {
        let was = self.is_dirty(c);
        if was == dirty {
            return;
        }
        let word = &mut self.dirty[c.index() / 64];
        if dirty {
            *word |= 1 << (c.0 % 64);
            self.dirty_count += 1;
        } else {
            *word &= !(1 << (c.0 % 64));
            self.dirty_count -= 1;
        }
    }

    /// Which list slot `c` is on (`FREE_LIST` if free).
    pub fn list_of(&self, c: CacheBlock) -> u8 {
        self.list.get(c.index())
    }

    pub fn list_len(&self, list: u8) -> u32 {
        self.heads[list as usize].len
    }

    /// The front (oldest pushed) slot of `list`.
    pub fn front(&self, list: u8) -> Option<CacheBlock> {
        let h = self.heads[list as usize].head;
        (h != NIL).then_some(CacheBlock(h))
    }

    /// The back (newest pushed) slot of `list`.
    pub fn back(&self, list: u8) -> Option<CacheBlock> {
        let t = self.heads[list as usize].tail;
        (t != NIL).then_some(CacheBlock(t))
    }

    /// The slot after `c` on its list (towards the back).
    pub fn next_of(&self, c: CacheBlock) -> Option<CacheBlock> {
        let n = self.next[c.index()];
        (n != NIL).then_some(CacheBlock(n))
    }

    /// Moves resident slot `c` to the back of `list`.
    pub fn move_to_back(&mut self, c: CacheBlock, list: u8) {
        debug_assert!(self.list.get(c.index()) != FREE_LIST);
        self.unlink(c.0);
        self.link_back(list, c.0);
    }

    /// Moves resident slot `c` to the front of `list`.
    pub fn move_to_front(&mut self, c: CacheBlock, list: u8) {
        debug_assert!(self.list.get(c.index()) != FREE_LIST);
        self.unlink(c.0);
        self.link_front(list, c.0);
    }

    /// Calls `f` for every resident slot (in slot order).
    pub fn for_each_resident(&self, mut f: impl FnMut(OriginBlock, CacheBlock, bool)) {
        for (s, &o) in self.oblock.iter().enumerate() {
            if o != EMPTY_OBLOCK {
                let c = CacheBlock(s as u32);
                f(OriginBlock(o), c, self.is_dirty(c));
            }
        }
    }

    fn head_mut(&mut self, list: u8) -> &mut ListHead {
        if list == FREE_LIST {
            &mut self.free
        } else {
            &mut self.heads[list as usize]
        }
    }

    fn unlink(&mut self, s: u32) {
        let list = self.list.get(s as usize);
        let (p, n) = (self.prev[s as usize], self.next[s as usize]);
        if p != NIL {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        let h = self.head_mut(list);
        if h.head == s {
            h.head = n;
        }
        if h.tail == s {
            h.tail = p;
        }
        h.len -= 1;
        self.prev[s as usize] = NIL;
        self.next[s as usize] = NIL;
    }

    fn link_back(&mut self, list: u8, s: u32) {
        let h = *self.head_mut(list);
        self.prev[s as usize] = h.tail;
        self.next[s as usize] = NIL;
        if h.tail != NIL {
            self.next[h.tail as usize] = s;
        }
        let h = self.head_mut(list);
        if h.head == NIL {
            h.head = s;
        }
        h.tail = s;
        h.len += 1;
        self.list.set(s as usize, list);
    }

    fn link_front(&mut self, list: u8, s: u32) {
        let h = *self.head_mut(list);
        self.next[s as usize] = h.head;
        self.prev[s as usize] = NIL;
        if h.head != NIL {
            self.prev[h.head as usize] = s;
        }
        let h = self.head_mut(list);
        if h.tail == NIL {
            h.tail = s;
        }
        h.head = s;
        h.len += 1;
        self.list.set(s as usize, list);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn table_matches_a_hashmap(
            ops in proptest::collection::vec((0u8..3, 0u64..64), 1..400),
            disp_max in prop_oneof![Just(None), (0u32..3).prop_map(Some)],
            sparse in any::<bool>(),
        ) {
            let mut t = if sparse { SlotTable::sparse(16, 2) } else { SlotTable::new(16, 2) };
            // Few distance bits (0: none, as with 2^31 slots): the
            // saturated entries' homes are recomputed.
            if let Some(m) = disp_max {
                t.disp_max = m;
                if m == 0 {
                    t.slot_bits = 32;
                }
            }
            let mut model: HashMap<u64, CacheBlock> = HashMap::new();
            for (op, key) in ops {
                let o = OriginBlock(key);
                match op {
                    0 => {
                        if model.contains_key(&key) { continue; }
                        match t.insert(o, (key % 2) as u8) {
                            Some(c) => { model.insert(key, c); }
                            None => prop_assert_eq!(model.len(), 16),
                        }
                    }
                    1 => { prop_assert_eq!(t.remove(o), model.remove(&key)); }
                    _ => { if let Some(&c) = model.get(&key) { t.set_dirty(c, true); } }
                }
                prop_assert_eq!(t.len() as usize, model.len());
                for (k, c) in &model {
                    prop_assert_eq!(t.lookup(OriginBlock(*k)), Some(*c));
                    prop_assert_eq!(t.oblock_of(*c), Some(OriginBlock(*k)));
                }
                for k in (0u64..64).filter(|k| !model.contains_key(k)) {
                    prop_assert_eq!(t.lookup(OriginBlock(k)), None);
                }
                prop_assert_eq!(t.list_len(0) + t.list_len(1), t.len());
            }
        }
    }
}
