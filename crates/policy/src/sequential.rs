//! Sequential stream detection for bypass, after bcache's
//! `sequential_cutoff`: IOs that continue a recent stream add to that
//! stream's length; once a stream has covered `cutoff` bytes, its further IOs
//! bypass the cache (they would only push hot blocks out).

use tiercache_types::Time;

/// Streams remembered at once (bcache: RECENT_IO = 64).
pub const STREAMS: usize = 64;
/// A stream not continued for this long is forgotten (bcache: 5 s).
pub const STREAM_TIMEOUT_NS: u64 = 5_000_000_000;

/// Hash slots for the next-offset index (a power of two, > 2 x STREAMS).
const INDEX: usize = 256;
const EMPTY: u8 = u8::MAX;
const NONE: u8 = u8::MAX;

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    next_offset: u64,
    bytes: u64,
    last_used: Time,
    /// Links of the recency list (most recent at `head`).
    prev: u8,
    next: u8,
}

/// Tracks recent streams by where their next IO would start.
///
/// O(1) per IO: an open-addressing index from "next offset" to stream, and
/// a recency list whose tail is replaced when a new stream starts (the
/// least recently continued one, as bcache does).
#[derive(Clone, Debug)]
pub struct SequentialDetector {
    cutoff: u64,
    streams: [Stream; STREAMS],
    index: [u8; INDEX],
    head: u8,
    tail: u8,
}

fn slot_of(offset: u64) -> usize {
    (offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % INDEX
}

impl SequentialDetector {
    /// `cutoff` in bytes; 0 disables detection.
    pub fn new(cutoff: u64) -> Self {
        let mut streams = [Stream::default(); STREAMS];
        // All streams start on the recency list, none indexed. Their
        // next_offset is never looked up until they are indexed.
        for (i, s) in streams.iter_mut().enumerate() {
            s.prev = if i == 0 { NONE } else { (i - 1) as u8 };
            s.next = if i + 1 == STREAMS {
                NONE
            } else {
                (i + 1) as u8
            };
        }
        SequentialDetector {
            cutoff,
            streams,
            index: [EMPTY; INDEX],
            head: 0,
            tail: (STREAMS - 1) as u8,
        }
    }

    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    pub fn set_cutoff(&mut self, cutoff: u64) {
        self.cutoff = cutoff;
    }

    fn find(&self, offset: u64) -> Option<(usize, u8)> {
        let mut i = slot_of(offset);
        loop {
            let s = self.index[i];
            if s == EMPTY {
                return None;
            }
            if self.streams[s as usize].next_offset == offset {
                return Some((i, s));
            }
            i = (i + 1) % INDEX;
        }
    }

    fn index_insert(&mut self, offset: u64, s: u8) {
        let mut i = slot_of(offset);
        while self.index[i] != EMPTY {
            i = (i + 1) % INDEX;
        }
        self.index[i] = s;
    }

    /// Removes index slot `i`, shifting later entries of its probe run back.
    fn index_remove(&mut self, mut hole: usize) {
        self.index[hole] = EMPTY;
        let mut j = hole;
        loop {
            j = (j + 1) % INDEX;
            let s = self.index[j];
            if s == EMPTY {
                return;
            }
            let ideal = slot_of(self.streams[s as usize].next_offset);
            let dist_hole = hole.wrapping_sub(ideal) % INDEX;
            let dist_j = j.wrapping_sub(ideal) % INDEX;
            if dist_hole < dist_j {
                self.index[hole] = s;
                self.index[j] = EMPTY;
                hole = j;
            }
        }
    }

    fn unlink(&mut self, s: u8) {
        let Stream { prev, next, .. } = self.streams[s as usize];
        if prev == NONE {
            self.head = next;
        } else {
            self.streams[prev as usize].next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.streams[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, s: u8) {
        let old = self.head;
        self.streams[s as usize].prev = NONE;
        self.streams[s as usize].next = old;
        if old != NONE {
            self.streams[old as usize].prev = s;
        } else {
            self.tail = s;
        }
        self.head = s;
    }

    /// Records an IO of `len` bytes at `offset` and says whether it should
    /// bypass the cache: true once its stream, this IO included, has covered
    /// more than the cutoff.
    pub fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
        if self.cutoff == 0 || len == 0 {
            return false;
        }
        let end = offset.saturating_add(len);
        let (s, bytes) = match self.find(offset) {
            Some((slot, s)) => {
                self.index_remove(slot);
                let st = &self.streams[s as usize];
                let fresh = now.saturating_sub(st.last_used) <= STREAM_TIMEOUT_NS;
                let bytes = if fresh {
                    st.bytes.saturating_add(len)
                } else {
                    len
                };
                self.unlink(s);
                (s, bytes)
            }
            None => {
                // Replace the least recently continued stream.
                let s = self.tail;
                if let Some((slot, _)) = self.find_exact(s) {
                    self.index_remove(slot);
                }
                self.unlink(s);
                (s, len)
            }
        };
        let st = &mut self.streams[s as usize];
        st.next_offset = end;
        st.bytes = bytes;
        st.last_used = now;
        self.push_front(s);
        self.index_insert(end, s);
        bytes > self.cutoff
    }

    /// The index slot holding stream `s`, if it is indexed.
    fn find_exact(&self, s: u8) -> Option<(usize, u8)> {
        let offset = self.streams[s as usize].next_offset;
        let mut i = slot_of(offset);
        loop {
            let x = self.index[i];
            if x == EMPTY {
                return None;
            }
            if x == s {
                return Some((i, s));
            }
            i = (i + 1) % INDEX;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_stream_bypasses_after_cutoff() {
        let mut d = SequentialDetector::new(1 << 20);
        let mut bypassed = 0;
        for i in 0..64u64 {
            if d.observe(i * 65536, 65536, Time(i)) {
                bypassed += 1;
            }
        }
        // First 16 IOs (1 MiB) are cached, the rest bypass.
        assert_eq!(bypassed, 48);
    }

    #[test]
    fn random_io_never_bypasses_and_zero_disables() {
        let mut d = SequentialDetector::new(8192);
        for i in 0..1000u64 {
            assert!(!d.observe((i * 7919 % 1000) * 1_000_000, 4096, Time(i)));
        }
        let mut off = SequentialDetector::new(0);
        for i in 0..100u64 {
            assert!(!off.observe(i * 4096, 4096, Time(i)));
        }
    }

    #[test]
    fn interleaved_streams_are_tracked_apart() {
        let mut d = SequentialDetector::new(16384);
        let mut last = (false, false);
        for i in 0..8u64 {
            let a = d.observe(i * 4096, 4096, Time(i));
            let b = d.observe(1 << 30 | (i * 4096), 4096, Time(i));
            last = (a, b);
        }
        assert_eq!(last, (true, true));
    }

    #[test]
    fn many_streams_and_reuse_of_offsets_stay_consistent() {
        // More streams than slots, each continued a few times, offsets
        // colliding in the index: lengths must match a simple model.
        let mut d = SequentialDetector::new(u64::MAX / 2);
        let mut model: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        let mut order: Vec<u64> = Vec::new();
        for round in 0..20u64 {
            for k in 0..40u64 {
                let start = k * (1 << 30) + round * 4096;
                d.observe(start, 4096, Time(round * 100 + k));
                let prev = model.remove(&start).unwrap_or(0);
                model.insert(start + 4096, prev + 4096);
                order.retain(|&o| o != start);
                order.push(start + 4096);
            }
        }
        for (&next, &bytes) in &model {
            let (_, s) = d.find(next).expect("every live stream is indexed");
            assert_eq!(d.streams[s as usize].bytes, bytes);
        }
    }

    /// The obvious O(n) detector: the reference the indexed one must match.
    struct Naive {
        cutoff: u64,
        streams: Vec<(u64, u64, Time)>, // next offset, bytes, last used
    }

    impl Naive {
        fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
            let end = offset + len;
            if let Some(i) = self.streams.iter().position(|s| s.0 == offset) {
                let s = self.streams.remove(i);
                let fresh = now.saturating_sub(s.2) <= STREAM_TIMEOUT_NS;
                let bytes = if fresh { s.1 + len } else { len };
                self.streams.push((end, bytes, now));
                return bytes > self.cutoff;
            }
            if self.streams.len() == STREAMS {
                self.streams.remove(0);
            }
            self.streams.push((end, len, now));
            len > self.cutoff
        }
    }

    #[test]
    fn matches_the_obvious_implementation() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut fast = SequentialDetector::new(64 * 1024);
        let mut naive = Naive {
            cutoff: 64 * 1024,
            streams: Vec::new(),
        };
        let mut cursors: Vec<u64> = (0..100).map(|i| i * (1 << 32)).collect();
        let mut now = 0u64;
        for _ in 0..200_000 {
            now += rng.gen_range(0..200_000_000);
            let c = rng.gen_range(0..cursors.len());
            let len = rng.gen_range(1..=16u64) * 4096;
            let offset = if rng.gen_bool(0.1) {
                rng.gen_range(0..1u64 << 40) & !4095
            } else {
                cursors[c]
            };
            cursors[c] = offset + len;
            assert_eq!(
                fast.observe(offset, len, Time(now)),
                naive.observe(offset, len, Time(now))
            );
        }
    }

    #[test]
    fn stale_stream_is_forgotten() {
        let mut d = SequentialDetector::new(8192);
        assert!(!d.observe(0, 8192, Time(0)));
        assert!(!d.observe(8192, 4096, Time(STREAM_TIMEOUT_NS + 10)));
    }
}
