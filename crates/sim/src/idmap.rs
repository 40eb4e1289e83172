//! Dense ids for block numbers: an open-addressing hash map u64 -> u32 that
//! hands out 0, 1, 2... in order of first appearance. Faster than
//! `std::collections::HashMap` (no SipHash, no tombstones: nothing is ever
//! removed) and half its memory.

use crate::rng::mix64;

const EMPTY: u64 = u64::MAX;

/// Maps block numbers to dense ids. `u64::MAX` cannot be a key.
#[derive(Clone, Debug)]
pub struct IdMap {
    keys: Vec<u64>,
    vals: Vec<u32>,
    mask: usize,
    len: u32,
}

impl Default for IdMap {
    fn default() -> Self {
        Self::with_capacity(1024)
    }
}

impl IdMap {
    pub fn with_capacity(n: usize) -> Self {
        let cap = (n * 2).next_power_of_two().max(16);
        IdMap {
            keys: vec![EMPTY; cap],
            vals: vec![0; cap],
            mask: cap - 1,
            len: 0,
        }
    }

    /// Number of distinct keys seen.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The id of `key`, assigning the next id if it is new. Returns
    /// `(id, new)`. Panics past 2^32 - 1 distinct keys.
    #[inline]
    pub fn get_or_insert(&mut self, key: u64) -> (u32, bool) {
        debug_assert!(key != EMPTY);
        let mut i = mix64(key) as usize & self.mask;
        loop {
            let k = self.keys[i];
            if k == key {
                return (self.vals[i], false);
            }
            if k == EMPTY {
                break;
            }
            i = (i + 1) & self.mask;
        }
        assert!(self.len < u32::MAX, "more than 2^32 - 1 distinct blocks");
        let id = self.len;
        self.keys[i] = key;
        self.vals[i] = id;
        self.len += 1;
        if self.len as usize * 2 > self.keys.len() {
            self.grow();
        }
        (id, true)
    }

    /// The id of `key` if seen.
    pub fn get(&self, key: u64) -> Option<u32> {
        let mut i = mix64(key) as usize & self.mask;
        loop {
            let k = self.keys[i];
            if k == key {
                return Some(self.vals[i]);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    fn grow(&mut self) {
        let cap = self.keys.len() * 2;
        let old_k = std::mem::replace(&mut self.keys, vec![EMPTY; cap]);
        let old_v = std::mem::replace(&mut self.vals, vec![0; cap]);
        self.mask = cap - 1;
        for (k, v) in old_k.into_iter().zip(old_v) {
            if k != EMPTY {
                let mut i = mix64(k) as usize & self.mask;
                while self.keys[i] != EMPTY {
                    i = (i + 1) & self.mask;
                }
                self.keys[i] = k;
                self.vals[i] = v;
            }
        }
    }

    pub fn memory_bytes(&self) -> usize {
        self.keys.len() * 12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_ids_in_order_of_first_appearance() {
        let mut m = IdMap::with_capacity(2);
        let keys = [5u64, 1 << 40, 5, 7, 1 << 40, 0];
        let ids: Vec<(u32, bool)> = keys.iter().map(|&k| m.get_or_insert(k)).collect();
        assert_eq!(
            ids,
            vec![
                (0, true),
                (1, true),
                (0, false),
                (2, true),
                (1, false),
                (3, true)
            ]
        );
        for i in 0..10_000u64 {
            m.get_or_insert(i * 7919);
        }
        assert_eq!(m.get(7919 * 9999).map(|_| ()), Some(()));
        assert_eq!(m.get(3), None);
        assert_eq!(m.get(5), Some(0));
    }
}
