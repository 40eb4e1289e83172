//! Which list each slot of a [`crate::SlotTable`] is on: a byte per slot,
//! or 2 bits per slot when the table has at most three lists (S3-FIFO's
//! small, main and dirty lists; the fourth value is the free list), which
//! saves the default policy 0.75 bytes per cache block.

use crate::slots::FREE_LIST;

/// Packed 2-bit value of [`FREE_LIST`].
const PACKED_FREE: u8 = 3;

/// The list id of every slot. See the module documentation.
#[derive(Clone)]
pub(crate) struct ListIds {
    /// One byte per slot, or four slots per byte (slot `i` in bits
    /// `2 * (i % 4)..2 * (i % 4) + 2` of byte `i / 4`).
    bytes: Vec<u8>,
    packed: bool,
}

impl ListIds {
    /// `slots` slots, all on [`FREE_LIST`], for a table of `lists` lists.
    pub(crate) fn new(slots: usize, lists: u8) -> Self {
        if lists <= PACKED_FREE {
            // Every slot's 2 bits are PACKED_FREE.
            ListIds {
                bytes: vec![0xFF; slots.div_ceil(4)],
                packed: true,
            }
        } else {
            ListIds {
                bytes: vec![FREE_LIST; slots],
                packed: false,
            }
        }
    }

    #[inline]
    pub(crate) fn get(&self, slot: usize) -> u8 {
        if self.packed {
            let v = (self.bytes[slot / 4] >> (2 * (slot % 4))) & 3;
            if v == PACKED_FREE {
                FREE_LIST
            } else {
                v
            }
        } else {
            self.bytes[slot]
        }
    }

    /// Puts `slot` on `list` (a list id below the table's count, or
    /// [`FREE_LIST`]).
    #[inline]
    pub(crate) fn set(&mut self, slot: usize, list: u8) {
        if self.packed {
            let v = if list == FREE_LIST { PACKED_FREE } else { list };
            debug_assert!(v <= PACKED_FREE, "list {list} in a packed table");
            let shift = 2 * (slot % 4);
            let b = &mut self.bytes[slot / 4];
            *b = (*b & !(3 << shift)) | (v << shift);
        } else {
            self.bytes[slot] = list;
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Packed or not, every slot reads back what was last set, and
        /// setting one slot leaves the others alone.
        #[test]
        fn reads_back_what_was_set(
            lists in 1u8..8,
            slots in 1usize..70,
            ops in proptest::collection::vec((0usize..70, 0u8..9), 0..200),
        ) {
            let mut ids = ListIds::new(slots, lists);
            let mut model = vec![FREE_LIST; slots];
            for (s, l) in ops {
                let s = s % slots;
                let l = if l >= lists { FREE_LIST } else { l };
                ids.set(s, l);
                model[s] = l;
                for (i, &m) in model.iter().enumerate() {
                    prop_assert_eq!(ids.get(i), m);
                }
            }
        }
    }

    #[test]
    fn three_lists_take_two_bits_per_slot() {
        assert_eq!(ListIds::new(1000, 3).memory_bytes(), 250);
        assert_eq!(ListIds::new(1000, 4).memory_bytes(), 1000);
        assert_eq!(ListIds::new(5, 3).get(4), FREE_LIST);
    }
}
