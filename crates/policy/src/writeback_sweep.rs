//! Which dirty blocks to write back next: a sweep in pool-key order,
//! refilled a bounded batch at a time (bcache's writeback keybuf, refilled
//! from where the last refill ended). Shared by the engine's cleaner and
//! the simulator, so both write back the same blocks.
//!
//! Before the sweep, every call listed and sorted all dirty blocks to pick
//! the first few: with the cleaner ticking twenty times a second that was
//! a third of its CPU in the VM lab, and the listing runs under the
//! director's lock, which every hit takes. Now a call lists the dirty
//! blocks only when the batch it keeps has run out, which at the paced
//! rate is once per [`SWEEP_BATCH`] blocks written back.
//!
//! The contract: [`WritebackSweep::next_batch`] returns at most `n`
//! distinct blocks, each dirty in the slot given when it checked them
//! ([`DirtySource::retain_dirty`]), and fewer than `n` only when a whole
//! pass found no more. A block dirtied behind the sweep waits for the next
//! pass; the pass wraps around to key 0 when nothing is left ahead of it.

use std::collections::VecDeque;
use tiercache_types::{CacheBlock, OriginBlock};

/// How many dirty blocks a refill keeps (at least the batch asked for).
pub const SWEEP_BATCH: usize = 4096;

/// Where the sweep reads the dirty blocks from: the director (the
/// simulator), or the director behind the engine's lock.
pub trait DirtySource {
    /// Every dirty block with its slot, in any order.
    fn dirty_unordered(&self) -> Vec<(OriginBlock, CacheBlock)>;
    /// Keeps the blocks that are still cached in that slot and dirty.
    fn retain_dirty(&self, blocks: &mut Vec<(OriginBlock, CacheBlock)>);
}

impl DirtySource for crate::Director {
    fn dirty_unordered(&self) -> Vec<(OriginBlock, CacheBlock)> {
        self.dirty_blocks_unordered()
    }
    fn retain_dirty(&self, blocks: &mut Vec<(OriginBlock, CacheBlock)>) {
        blocks.retain(|&(o, c)| self.lookup(o) == Some(c) && self.is_dirty(o));
    }
}

/// The sweep's position and the batch it still holds.
#[derive(Clone, Debug, Default)]
pub struct WritebackSweep {
    /// Dirty blocks from the last refill not handed out yet, in key order.
    queue: VecDeque<(OriginBlock, CacheBlock)>,
    /// Where the next refill starts: past the last key it queued.
    cursor: u64,
}

impl WritebackSweep {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next up to `n` dirty blocks of the sweep (see the module's
    /// contract), in key order but for one wrap to key 0.
    pub fn next_batch(
        &mut self,
        n: usize,
        src: &impl DirtySource,
    ) -> Vec<(OriginBlock, CacheBlock)> {
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        // This call hands out keys from `lo` up, then, after a wrap, keys
        // below `lo`: no key twice.
        let lo = self.queue.front().map_or(self.cursor, |&(o, _)| o.0);
        let mut wrapped = false;
        loop {
            while out.len() < n && !self.queue.is_empty() {
                let k = (n - out.len()).min(self.queue.len());
                let mut taken: Vec<_> = self.queue.drain(..k).collect();
                src.retain_dirty(&mut taken);
                out.extend(taken);
            }
            if out.len() == n {
                return out;
            }
            let below = if wrapped { lo } else { u64::MAX };
            let from = self.cursor;
            let mut ahead: Vec<_> = src
                .dirty_unordered()
                .into_iter()
                .filter(|&(o, _)| o.0 >= from && o.0 < below)
                .collect();
            if ahead.is_empty() {
                if wrapped {
                    return out;
                }
                wrapped = true;
                self.cursor = 0;
                continue;
            }
            let keep = SWEEP_BATCH.max(n - out.len());
            if ahead.len() > keep {
                ahead.select_nth_unstable(keep - 1);
                ahead.truncate(keep);
            }
            ahead.sort_unstable();
            self.cursor = ahead[ahead.len() - 1].0 .0 + 1;
            self.queue = ahead.into();
        }
    }

    /// Hands `blocks` out again first: the tail of the last batch that was
    /// not written back (the simulator's cleaner, when an idle gap ends
    /// before the batch does), in the order it was handed out.
    pub fn put_back(&mut self, blocks: &[(OriginBlock, CacheBlock)]) {
        for &b in blocks.iter().rev() {
            self.queue.push_front(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// A dirty set: key -> slot.
    struct Dirty(RefCell<BTreeMap<u64, u32>>);

    impl DirtySource for Dirty {
        fn dirty_unordered(&self) -> Vec<(OriginBlock, CacheBlock)> {
            // Reversed: the sweep must not rely on the order it is given.
            let m = self.0.borrow();
            m.iter()
                .rev()
                .map(|(&o, &c)| (OriginBlock(o), CacheBlock(c)))
                .collect()
        }
        fn retain_dirty(&self, blocks: &mut Vec<(OriginBlock, CacheBlock)>) {
            let m = self.0.borrow();
            blocks.retain(|(o, c)| m.get(&o.0) == Some(&c.0));
        }
    }

    fn dirty(keys: impl IntoIterator<Item = u64>) -> Dirty {
        Dirty(RefCell::new(
            keys.into_iter().map(|k| (k, k as u32)).collect(),
        ))
    }

    fn keys(v: &[(OriginBlock, CacheBlock)]) -> Vec<u64> {
        v.iter().map(|(o, _)| o.0).collect()
    }

    fn clean(d: &Dirty, v: &[(OriginBlock, CacheBlock)]) {
        for (o, _) in v {
            d.0.borrow_mut().remove(&o.0);
        }
    }

    #[test]
    fn a_sweep_goes_up_in_key_order_then_wraps_to_what_was_dirtied_behind_it() {
        let d = dirty([50, 10, 40, 20, 30]);
        let mut s = WritebackSweep::new();
        let a = s.next_batch(2, &d);
        assert_eq!(keys(&a), [10, 20]);
        clean(&d, &a);
        // Dirtied behind the sweep (5) and ahead of it (35).
        d.0.borrow_mut().insert(5, 5);
        d.0.borrow_mut().insert(35, 35);
        let b = s.next_batch(3, &d);
        assert_eq!(keys(&b), [30, 40, 50], "the batch kept from the refill");
        clean(&d, &b);
        // 35 was dirtied between the keys of the batch already kept, so
        // behind the next refill's start, like 5: both wait for the next
        // pass.
        let c = s.next_batch(10, &d);
        assert_eq!(keys(&c), [5, 35], "the next pass, from key 0");
        clean(&d, &c);
        assert!(s.next_batch(4, &d).is_empty());
    }

    #[test]
    fn blocks_cleaned_or_moved_since_the_refill_are_skipped_and_the_batch_filled() {
        let d = dirty(0..100);
        let mut s = WritebackSweep::new();
        assert_eq!(keys(&s.next_batch(10, &d)), (0..10).collect::<Vec<_>>());
        // 10..20 cleaned behind the cleaner's back; 20 moved to slot 999.
        for k in 10..20 {
            d.0.borrow_mut().remove(&k);
        }
        d.0.borrow_mut().insert(20, 999);
        let v = s.next_batch(5, &d);
        assert_eq!(keys(&v), [21, 22, 23, 24, 25]);
    }

    #[test]
    fn fewer_than_asked_only_when_a_whole_pass_finds_no_more() {
        let d = dirty([7, 3, 9]);
        let mut s = WritebackSweep::new();
        assert_eq!(keys(&s.next_batch(2, &d)), [3, 7]);
        // Not cleaned: the sweep goes on (9), wraps, and hands out 3 and 7
        // again, each once.
        assert_eq!(keys(&s.next_batch(10, &d)), [9, 3, 7]);
        assert_eq!(keys(&s.next_batch(0, &d)), Vec::<u64>::new());
    }

    #[test]
    fn a_refill_keeps_a_bounded_batch_of_the_smallest_keys_ahead() {
        let n = SWEEP_BATCH as u64 * 3;
        let d = dirty((0..n).rev());
        let mut s = WritebackSweep::new();
        let first = s.next_batch(1, &d);
        assert_eq!(keys(&first), [0]);
        assert_eq!(s.queue.len(), SWEEP_BATCH - 1);
        assert_eq!(s.cursor, SWEEP_BATCH as u64);
        // Every block once over a whole pass, in order.
        clean(&d, &first);
        let mut seen = vec![0];
        loop {
            let v = s.next_batch(1000, &d);
            if v.is_empty() {
                break;
            }
            clean(&d, &v);
            seen.extend(keys(&v));
        }
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
    }
}
