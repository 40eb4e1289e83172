//! One bit per cache slot: SIEVE's visited bits, smq's hit bits, the
//! demotion marks of S3-FIFO (`demotion.rs`).

use tiercache_types::CacheBlock;

/// A bit per slot of a cache of a given capacity, all clear at first. A
/// slot beyond the capacity reads as clear and ignores writes.
#[derive(Clone, Debug, Default)]
pub struct SlotBits(Vec<u64>);

impl SlotBits {
    pub fn new(capacity: u32) -> Self {
        SlotBits(vec![0; (capacity as usize).div_ceil(64)])
    }

    /// Whether it holds no bit at all (built by `Default`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, c: CacheBlock) -> bool {
        self.0
            .get(c.index() / 64)
            .is_some_and(|w| w & (1 << (c.0 % 64)) != 0)
    }

    pub fn set(&mut self, c: CacheBlock, on: bool) {
        if let Some(w) = self.0.get_mut(c.index() / 64) {
            let bit = 1 << (c.0 % 64);
            if on {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
    }

    /// Sets `c`'s bit and says whether it was set before.
    pub fn test_and_set(&mut self, c: CacheBlock) -> bool {
        let was = self.get(c);
        self.set(c, true);
        was
    }

    pub fn clear_all(&mut self) {
        self.0.fill(0);
    }

    pub fn memory_bytes(&self) -> usize {
        self.0.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_per_slot() {
        let mut b = SlotBits::new(130);
        assert_eq!(b.memory_bytes(), 24);
        b.set(CacheBlock(129), true);
        assert!(!b.test_and_set(CacheBlock(3)));
        assert!(b.test_and_set(CacheBlock(3)));
        assert!(b.get(CacheBlock(129)) && !b.get(CacheBlock(128)));
        b.set(CacheBlock(3), false);
        assert!(!b.get(CacheBlock(3)));
        b.clear_all();
        assert!(!b.get(CacheBlock(129)));
        b.set(CacheBlock(1000), true);
        assert!(!b.get(CacheBlock(1000)), "beyond the capacity");
        assert!(SlotBits::default().is_empty());
    }
}
