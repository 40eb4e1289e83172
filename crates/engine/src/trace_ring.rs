//! A bounded lock-free queue of fixed-size records from any number of IO
//! threads to one reader: the request recorder's buffer (`recorder.rs`).
//!
//! Dmitry Vyukov's bounded MPMC queue, with every cell's data in atomics
//! (no `unsafe`). Contract:
//! - [`TraceRing::push`] never waits and never blocks: it claims a cell
//!   with a compare-and-swap on the tail and returns `false` at once when
//!   the queue is full (the reader fell behind), leaving the record out.
//!   Producers only ever contend with each other, for the tail.
//! - [`TraceRing::pop`] returns each pushed record once, in the order the
//!   pushes claimed cells; a record is visible to it only once its push
//!   completed (the cell's sequence number is published with Release after
//!   the data, read with Acquire before it). The recorder has one reader;
//!   several would also be correct.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One record: three words (see `recorder.rs` for their meaning).
pub(crate) type Words = [u64; 3];

struct Cell {
    /// `pos` when free for the push at position `pos`; `pos + 1` once that
    /// push has written it; `pos + capacity` once popped (free for the next
    /// lap).
    seq: AtomicUsize,
    words: [AtomicU64; 3],
}

pub(crate) struct TraceRing {
    cells: Box<[Cell]>,
    mask: usize,
    /// Next position a push claims.
    tail: AtomicUsize,
    /// Next position the consumer pops.
    head: AtomicUsize,
}

impl TraceRing {
    /// A queue of `capacity` records, rounded up to a power of two (at
    /// least 2).
    pub(crate) fn new(capacity: usize) -> TraceRing {
        let capacity = capacity.max(2).next_power_of_two();
        TraceRing {
            cells: (0..capacity)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    words: Default::default(),
                })
                .collect(),
            mask: capacity - 1,
            tail: AtomicUsize::new(0),
            head: AtomicUsize::new(0),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cells.len()
    }

    /// Appends `words`; `false` (and nothing appended) when full.
    pub(crate) fn push(&self, words: Words) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let lag = seq.wrapping_sub(pos) as isize;
            if lag == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for (w, v) in cell.words.iter().zip(words) {
                            w.store(v, Ordering::Relaxed);
                        }
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if lag < 0 {
                // The cell still holds the record of the previous lap: full.
                return false;
            } else {
                // Another push took this position: try the current tail.
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// The oldest completed record, if any.
    pub(crate) fn pop(&self) -> Option<Words> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let lag = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if lag == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let words = [0, 1, 2].map(|i| cell.words[i].load(Ordering::Relaxed));
                        cell.seq
                            .store(pos.wrapping_add(self.capacity()), Ordering::Release);
                        return Some(words);
                    }
                    Err(now) => pos = now,
                }
            } else if lag < 0 {
                // Not yet written (or being written): empty here.
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_full_ring_refuses_pushes_and_takes_them_again_once_popped() {
        let r = TraceRing::new(3);
        assert_eq!(r.capacity(), 4);
        for i in 0..4 {
            assert!(r.push([i, i + 1, i + 2]));
        }
        assert!(!r.push([9, 9, 9]), "a full ring refuses");
        assert_eq!(r.pop(), Some([0, 1, 2]));
        assert!(r.push([4, 5, 6]));
        let got: Vec<u64> = std::iter::from_fn(|| r.pop()).map(|w| w[0]).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn concurrent_pushes_are_each_popped_once_or_refused() {
        let ring = Arc::new(TraceRing::new(256));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (ring, done) = (ring.clone(), done.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    while let Some(w) = ring.pop() {
                        got.push(w);
                    }
                    if finished {
                        return got;
                    }
                    std::thread::yield_now();
                }
            })
        };
        let accepted: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    let ring = &ring;
                    s.spawn(move || {
                        (0..20_000u64)
                            .filter(|i| {
                                let id = t * 20_000 + i;
                                ring.push([id, id * 3, !id])
                            })
                            .count() as u64
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        done.store(true, Ordering::Release);
        let got = reader.join().unwrap();
        let mut seen = vec![0u32; 80_000];
        for [id, x, y] in &got {
            assert_eq!((*x, *y), (id * 3, !id), "a record is never torn");
            seen[*id as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n <= 1), "no record twice");
        assert_eq!(got.len() as u64, accepted, "every accepted push is popped");
        // Each producer's records come out in its own order.
        for t in 0..4u64 {
            let mine: Vec<u64> = got
                .iter()
                .map(|w| w[0])
                .filter(|id| id / 20_000 == t)
                .collect();
            assert!(mine.windows(2).all(|p| p[0] < p[1]));
        }
    }
}
