//! Sequential stream detection for bypass, after bcache's
//! `sequential_cutoff`: IOs that continue a recent stream add to that
//! stream's length; once a stream has covered `cutoff` bytes, its further IOs
//! bypass the cache (they would only push hot blocks out).

use tiercache_types::Time;

/// Streams remembered at once (bcache: RECENT_IO = 64).
pub const STREAMS: usize = 64;
/// A stream not continued for this long is forgotten (bcache: 5 s).
pub const STREAM_TIMEOUT_NS: u64 = 5_000_000_000;

/// Slots of the direct-mapped stream table (a power of two).
const SLOTS: usize = 4096;
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Where the stream's next IO would start; `EMPTY` for a free slot.
    next_offset: u64,
    bytes: u64,
    last_used: Time,
}

/// Tracks recent streams by where their next IO would start.
///
/// A direct-mapped table keyed by that offset: two memory accesses per IO,
/// whatever the load (the simulator replays tens of millions of IOs per
/// second through this). A stream whose slot is taken by another IO starts
/// over, which only delays its bypass; with 4096 slots a stream survives
/// about 4096 unrelated IOs between two of its own, where bcache's 64-entry
/// LRU table survives 64.
#[derive(Clone, Debug)]
pub struct SequentialDetector {
    cutoff: u64,
    /// Allocated at the first IO observed with a cutoff (96 KiB), so an
    /// idle volume of a pool, or one without bypass, costs nothing.
    table: Option<Box<[Stream]>>,
}

const EMPTY_STREAM: Stream = Stream {
    next_offset: EMPTY,
    bytes: 0,
    last_used: Time::ZERO,
};

/// A fresh stream table, built on the heap: `Box::new([..; SLOTS])` would
/// build it on the stack first, and the 96 KiB frame (probed page by page)
/// would cost every caller of [`SequentialDetector::observe`] on every IO,
/// allocating or not.
#[cold]
#[inline(never)]
fn new_table() -> Box<[Stream]> {
    vec![EMPTY_STREAM; SLOTS].into_boxed_slice()
}

fn slot_of(offset: u64) -> usize {
    ((offset >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % SLOTS
}

impl SequentialDetector {
    /// `cutoff` in bytes; 0 disables detection.
    pub fn new(cutoff: u64) -> Self {
        SequentialDetector {
            cutoff,
            table: None,
        }
    }

    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    /// Bytes of RAM its stream table uses (none until the first IO).
    pub fn memory_bytes(&self) -> usize {
        self.table
            .as_ref()
            .map_or(0, |t| std::mem::size_of_val(&**t))
    }

    pub fn set_cutoff(&mut self, cutoff: u64) {
        self.cutoff = cutoff;
    }

    /// Records an IO of `len` bytes at `offset` and says whether it should
    /// bypass the cache: true once its stream, this IO included, has covered
    /// more than the cutoff.
    #[inline]
    pub fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
        if self.cutoff == 0 || len == 0 {
            return false;
        }
        let end = offset.saturating_add(len);
        let i = slot_of(offset);
        let table = self.table.get_or_insert_with(new_table);
        let prev = table[i];
        let bytes = if prev.next_offset == offset
            && now.saturating_sub(prev.last_used) <= STREAM_TIMEOUT_NS
        {
            table[i].next_offset = EMPTY;
            prev.bytes.saturating_add(len)
        } else {
            len
        };
        table[slot_of(end)] = Stream {
            next_offset: end,
            bytes,
            last_used: now,
        };
        bytes > self.cutoff
    }

    #[cfg(test)]
    fn bytes_of_stream_at(&self, next_offset: u64) -> Option<u64> {
        let s = self.table.as_ref()?[slot_of(next_offset)];
        (s.next_offset == next_offset).then_some(s.bytes)
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
    fn live_streams_are_tracked_exactly_when_few() {
        let mut d = SequentialDetector::new(u64::MAX / 2);
        for round in 1..=20u64 {
            for k in 0..8u64 {
                d.observe(
                    k * (1 << 30) + (round - 1) * 4096,
                    4096,
                    Time(round * 100 + k),
                );
            }
        }
        let tracked = (0..8u64)
            .filter(|k| d.bytes_of_stream_at(k * (1 << 30) + 20 * 4096) == Some(20 * 4096))
            .count();
        assert!(tracked >= 7, "{tracked} of 8 streams tracked");
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
        // 16 interleaved streams and 10% random IO: the direct-mapped table
        // may lose a stream to a slot collision (its bypass comes later),
        // the LRU one to age; they must agree on nearly every IO.
        let mut cursors: Vec<u64> = (0..16).map(|i| i * (1 << 32)).collect();
        let mut now = 0u64;
        let (mut agree, total) = (0u64, 200_000u64);
        for _ in 0..total {
            now += rng.gen_range(0..2_000_000);
            let c = rng.gen_range(0..cursors.len());
            let len = rng.gen_range(1..=16u64) * 4096;
            let offset = if rng.gen_bool(0.1) {
                rng.gen_range(0..1u64 << 40) & !4095
            } else {
                cursors[c]
            };
            cursors[c] = offset + len;
            if fast.observe(offset, len, Time(now)) == naive.observe(offset, len, Time(now)) {
                agree += 1;
            }
        }
        assert!(
            agree as f64 / total as f64 > 0.97,
            "agreement {agree} of {total}"
        );
    }

    #[test]
    fn stale_stream_is_forgotten() {
        let mut d = SequentialDetector::new(8192);
        assert!(!d.observe(0, 8192, Time(0)));
        assert!(!d.observe(8192, 4096, Time(STREAM_TIMEOUT_NS + 10)));
    }
}
