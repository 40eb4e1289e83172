//! Sequential stream detection for bypass, after bcache's
//! `sequential_cutoff`: IOs that continue a recent stream add to that
//! stream's length; once a stream has covered `cutoff` bytes, its further IOs
//! bypass the cache (they would only push hot blocks out).
//!
//! Unlike bcache, which sees a task's bios in the order it issued them, the
//! engine sees a stream's IOs in whatever order its front end's threads
//! reach it: the kernel splits a 1 MiB read into two ublk requests, two
//! queues and the worker threads run them at once. So a stream is a range
//! `[start, next)` that grows at either end: an IO that ends exactly where a
//! recent stream starts joins it as well as one that starts where a stream
//! ends, and an IO that fills the gap between two streams joins them into
//! one. An IO that overtook up to [`REORDER_IOS`] IOs of its own size joins
//! an established stream (at least [`ESTABLISHED_IOS`] such IOs long) across
//! the gap they leave, and the overtaken IOs, arriving inside the stream
//! up to [`OVERTAKEN_IOS`] IOs behind its end, are judged as its members.
//! Otherwise adjacency is exact, as in bcache:
//! random IO is not counted as a stream unless its requests touch end to
//! end.

use tiercache_types::Time;

/// Streams remembered at once (bcache: RECENT_IO = 64).
pub const STREAMS: usize = 64;
/// A stream not continued for this long is forgotten (bcache: 5 s).
pub const STREAM_TIMEOUT_NS: u64 = 5_000_000_000;

/// IOs of its own length that an IO of an established stream may have
/// overtaken and still join it (the requests in flight of one stream: a
/// split request's parts, a client's queue depth).
pub const REORDER_IOS: u64 = 3;
/// IOs of its own length that may have passed an IO of an established
/// stream while it waited, so that it arrives this far inside the stream
/// and is still judged as its member. Far more than [`REORDER_IOS`]: a
/// front end that cannot tell an IO bypasses (its predecessor is still
/// in flight) hands it to a worker thread, which may be busy with other
/// volumes' misses on their HDDs, while the stream's next IOs bypass on
/// the front end's own thread. In the pool bench the scanner's held-back
/// reads arrived 5 to 10 of its IOs late (iodepth 2), each one promoted as
/// a stream of its own before this was 3.
pub const OVERTAKEN_IOS: u64 = 32;
/// IOs of its own length that a stream must cover before an IO may join
/// it across a gap.
pub const ESTABLISHED_IOS: u64 = 4;

/// Slots of the direct-mapped stream table (a power of two).
const SLOTS: usize = 4096;
/// Slots of the index by where a stream starts (a power of two): only a
/// stream whose first IOs arrived out of order needs it, so it can be
/// smaller than the table.
const START_SLOTS: usize = 1024;
const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Stream {
    /// Where the stream's next IO would start; `EMPTY` for a free slot.
    next_offset: u64,
    /// Bytes the stream covers, which end at `next_offset`: the stream is
    /// `[next_offset - bytes, next_offset)`.
    bytes: u64,
    last_used: Time,
}

impl Stream {
    fn start(&self) -> u64 {
        self.next_offset - self.bytes
    }

    fn fresh(&self, now: Time) -> bool {
        now.saturating_sub(self.last_used) <= STREAM_TIMEOUT_NS
    }
}

/// Tracks recent streams by where their next IO would start, and by where
/// they start.
///
/// A direct-mapped table keyed by the next offset: two to four memory
/// accesses per IO, whatever the load (the simulator replays tens of
/// millions of IOs per second through this), and a smaller direct-mapped
/// index from a stream's start to its next offset. A stream whose slot is
/// taken by another IO starts over, which only delays its bypass; with 4096
/// slots a stream survives about 4096 unrelated IOs between two of its own,
/// where bcache's 64-entry LRU table survives 64.
#[derive(Clone, Debug)]
pub struct SequentialDetector {
    cutoff: u64,
    /// Allocated at the first IO observed with a cutoff (104 KiB with the
    /// start index), so an idle volume of a pool, or one without bypass,
    /// costs nothing.
    table: Option<Tables>,
}

#[derive(Clone, Debug)]
struct Tables {
    by_next: Box<[Stream]>,
    /// The next offset of the stream that starts at an offset hashing to
    /// the slot; checked against `by_next` before use (a slot may be stale).
    by_start: Box<[u64]>,
    /// When a stream last became (or stayed) established: without one in
    /// the last [`STREAM_TIMEOUT_NS`] no IO can join one across a gap, and
    /// random IO is spared those lookups.
    last_established: Option<Time>,
}

const EMPTY_STREAM: Stream = Stream {
    next_offset: EMPTY,
    bytes: 0,
    last_used: Time::ZERO,
};

/// Fresh stream tables, built on the heap: `Box::new([..; SLOTS])` would
/// build them on the stack first, and the 96 KiB frame (probed page by page)
/// would cost every caller of [`SequentialDetector::observe`] on every IO,
/// allocating or not.
#[cold]
#[inline(never)]
fn new_tables() -> Tables {
    Tables {
        by_next: vec![EMPTY_STREAM; SLOTS].into_boxed_slice(),
        by_start: vec![EMPTY; START_SLOTS].into_boxed_slice(),
        last_established: None,
    }
}

fn hash(offset: u64) -> u64 {
    (offset >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn slot_of(offset: u64) -> usize {
    (hash(offset) >> 52) as usize % SLOTS
}

fn start_slot_of(offset: u64) -> usize {
    (hash(offset) >> 54) as usize % START_SLOTS
}

impl Tables {
    /// Takes out the fresh stream that ends at `offset`, if one is known.
    fn take_ending_at(&mut self, offset: u64, now: Time) -> Option<Stream> {
        let i = slot_of(offset);
        let s = self.by_next[i];
        if s.next_offset != offset {
            return None;
        }
        self.by_next[i] = EMPTY_STREAM;
        s.fresh(now).then_some(s)
    }

    /// Takes out the fresh established stream that ends up to
    /// [`REORDER_IOS`] IOs of `len` before `offset`, if one is known.
    fn take_ending_shortly_before(&mut self, offset: u64, len: u64, now: Time) -> Option<Stream> {
        (1..=REORDER_IOS).find_map(|k| {
            let at = offset.checked_sub(k.checked_mul(len)?)?;
            let i = slot_of(at);
            let s = self.by_next[i];
            let established = s.bytes >= ESTABLISHED_IOS.saturating_mul(len);
            if s.next_offset != at || !established || !s.fresh(now) {
                return None;
            }
            self.by_next[i] = EMPTY_STREAM;
            Some(s)
        })
    }

    /// The fresh stream that covers `[offset, end)` and ends at most
    /// [`OVERTAKEN_IOS`] IOs of `len` after it (an IO overtaken by later
    /// ones of its stream), marked as used now.
    fn covering(&mut self, offset: u64, end: u64, len: u64, now: Time) -> Option<Stream> {
        (0..=OVERTAKEN_IOS).find_map(|k| {
            let at = end.checked_add(k.checked_mul(len)?)?;
            let s = &mut self.by_next[slot_of(at)];
            if s.next_offset != at || s.start() > offset || !s.fresh(now) {
                return None;
            }
            s.last_used = now;
            Some(*s)
        })
    }

    /// Takes out the fresh stream that starts at `offset`, if one is known.
    fn take_starting_at(&mut self, offset: u64, now: Time) -> Option<Stream> {
        let j = start_slot_of(offset);
        let next = self.by_start[j];
        if next == EMPTY {
            return None;
        }
        let i = slot_of(next);
        let s = self.by_next[i];
        if s.next_offset != next || s.start() != offset {
            return None;
        }
        self.by_start[j] = EMPTY;
        self.by_next[i] = EMPTY_STREAM;
        s.fresh(now).then_some(s)
    }

    fn put(&mut self, s: Stream) {
        self.by_next[slot_of(s.next_offset)] = s;
        self.by_start[start_slot_of(s.start())] = s.next_offset;
    }
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

    /// Bytes of RAM its stream tables use (none until the first IO).
    pub fn memory_bytes(&self) -> usize {
        self.table.as_ref().map_or(0, |t| {
            std::mem::size_of_val(&*t.by_next) + std::mem::size_of_val(&*t.by_start)
        })
    }

    pub fn set_cutoff(&mut self, cutoff: u64) {
        self.cutoff = cutoff;
    }

    /// Records an IO of `len` bytes at `offset` and says whether it should
    /// bypass the cache: true once its stream, this IO included, has covered
    /// more than the cutoff. The IO joins the recent stream that ends where
    /// it starts and the one that starts where it ends, if any.
    #[inline]
    pub fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
        if self.cutoff == 0 || len == 0 {
            return false;
        }
        let end = offset.saturating_add(len);
        let t = self.table.get_or_insert_with(new_tables);
        let mut s = Stream {
            next_offset: end,
            bytes: end - offset,
            last_used: now,
        };
        let established_lately = t
            .last_established
            .is_some_and(|at| now.saturating_sub(at) <= STREAM_TIMEOUT_NS);
        if let Some(before) = t.take_ending_at(offset, now) {
            s.bytes = s.bytes.saturating_add(before.bytes);
        } else if established_lately {
            if let Some(before) = t.take_ending_shortly_before(offset, len, now) {
                s.bytes = end - before.start();
            } else if let Some(member) = t.covering(offset, end, len, now) {
                return member.bytes > self.cutoff;
            }
        }
        if let Some(after) = t.take_starting_at(end, now) {
            s.next_offset = after.next_offset;
            s.bytes = s.bytes.saturating_add(after.bytes);
        }
        if s.bytes >= ESTABLISHED_IOS.saturating_mul(len) {
            t.last_established = Some(now);
        }
        t.put(s);
        s.bytes > self.cutoff
    }

    /// Whether [`SequentialDetector::observe`] of this IO, called now,
    /// would surely say bypass, changing nothing: the IO continues in
    /// order a fresh stream that, with it, covers more than the cutoff.
    /// False says nothing (an IO joining a stream out of order may still
    /// bypass). A front end that serves bypassed reads itself asks this
    /// before planning, since only a bypassed read never promotes.
    pub fn surely_bypasses(&self, offset: u64, len: u64, now: Time) -> bool {
        if self.cutoff == 0 || len == 0 {
            return false;
        }
        let Some(t) = self.table.as_ref() else {
            return false;
        };
        // As `take_ending_at` finds it; `observe` then adds at least `len`.
        let s = t.by_next[slot_of(offset)];
        s.next_offset == offset && s.fresh(now) && s.bytes.saturating_add(len) > self.cutoff
    }

    #[cfg(test)]
    fn bytes_of_stream_at(&self, next_offset: u64) -> Option<u64> {
        let s = self.table.as_ref()?.by_next[slot_of(next_offset)];
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
        streams: Vec<(u64, u64, Time)>, // start, next offset, last used
    }

    impl Naive {
        fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
            let fresh = |s: &(u64, u64, Time)| now.saturating_sub(s.2) <= STREAM_TIMEOUT_NS;
            let (mut start, mut next) = (offset, offset + len);
            if let Some(i) = self.streams.iter().position(|s| s.1 == offset) {
                let s = self.streams.remove(i);
                if fresh(&s) {
                    start = s.0;
                }
            }
            if let Some(i) = self.streams.iter().position(|s| s.0 == offset + len) {
                let s = self.streams.remove(i);
                if fresh(&s) {
                    next = s.1;
                }
            }
            if self.streams.len() == STREAMS {
                self.streams.remove(0);
            }
            self.streams.push((start, next, now));
            next - start > self.cutoff
        }
    }

    /// How many of a stream's 64 IOs of 64 KiB bypass with a 1 MiB cutoff
    /// when they arrive in the order `order` gives for each group of
    /// `group` IOs.
    fn bypassed_in_order(group: u64, order: impl Fn(u64, u64) -> u64) -> usize {
        let mut d = SequentialDetector::new(1 << 20);
        (0..64u64)
            .filter(|&i| {
                let k = i / group * group + order(i / group, i % group);
                d.observe(k * 65536, 65536, Time(i))
            })
            .count()
    }

    #[test]
    fn a_stream_arriving_out_of_order_bypasses_as_in_order() {
        assert_eq!(bypassed_in_order(1, |_, _| 0), 48);
        // Pairs swapped (two halves of a split request, run at once).
        assert_eq!(bypassed_in_order(2, |_, j| 1 - j), 48);
        // Groups of 4 in a different scrambled order each time (requests
        // run by many worker threads): an IO that overtook others joins the
        // stream across their gap, and they are judged as its members.
        let n = bypassed_in_order(4, |g, j| (j * 3 + g) % 4);
        assert!((44..=48).contains(&n), "{n} of 64 bypassed");
    }

    /// The pool bench's scanner, live: 256 KiB reads at iodepth 2, one of
    /// them held back (handed to a busy worker) while the stream's next
    /// ten bypass; it arrives inside the stream and bypasses too.
    #[test]
    fn an_io_held_back_while_ten_of_its_stream_pass_bypasses() {
        let len = 256 << 10;
        let mut d = SequentialDetector::new(4 << 20);
        let mut now = 0;
        let mut observe = |d: &mut SequentialDetector, i: u64| {
            now += 1;
            d.observe(i * len, len, Time(now))
        };
        let head = (0..20).filter(|&i| !observe(&mut d, i)).count();
        assert_eq!(head, 16, "the first 4 MiB are cached");
        // IO 20 waits; 21..=30 pass it (21 joins across its gap).
        assert!((21..=30).all(|i| observe(&mut d, i)));
        assert!(observe(&mut d, 20), "the held-back IO is a member");
        assert!(observe(&mut d, 31), "the stream goes on");
        // Further behind than OVERTAKEN_IOS it is a stream of its own.
        assert!((32..=32 + OVERTAKEN_IOS).all(|i| observe(&mut d, i + 1)));
        assert!(!observe(&mut d, 32));
    }

    #[test]
    fn a_backward_scan_is_a_stream_too() {
        let mut d = SequentialDetector::new(1 << 20);
        let bypassed = (0..64u64)
            .filter(|&i| d.observe((63 - i) * 65536, 65536, Time(i)))
            .count();
        assert_eq!(bypassed, 48);
    }

    #[test]
    fn requests_that_only_touch_a_stream_at_a_distance_do_not_join_it() {
        // Every other 64 KiB block, in pairs swapped: no two IOs are
        // adjacent, so nothing is a stream.
        let mut d = SequentialDetector::new(128 << 10);
        for i in 0..64u64 {
            let k = i / 2 * 2 + (1 - i % 2);
            assert!(!d.observe(k * 2 * 65536, 65536, Time(i)), "IO {i}");
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

    proptest::proptest! {
        /// `surely_bypasses` never promises a bypass that `observe` then
        /// refuses, and promises it for an in-order stream past the cutoff.
        #[test]
        fn a_sure_bypass_is_a_bypass(
            ios in proptest::collection::vec((0u64..3, 0u64..8, 1u64..5, 0u64..3_000_000_000), 1..300),
        ) {
            let mut d = SequentialDetector::new(64 * 1024);
            let mut cursors = [0u64, 1 << 30, 1 << 31];
            let mut now = 0u64;
            for (stream, jump, len, dt) in ios {
                now += dt;
                let s = stream as usize;
                let len = len * 16384;
                // Mostly in order; sometimes a jump ahead (out of order) or
                // back, which may join, split or restart a stream.
                let offset = match jump {
                    0 => cursors[s].saturating_sub(len),
                    1 => cursors[s] + len,
                    _ => cursors[s],
                };
                let sure = d.surely_bypasses(offset, len, Time(now));
                let bypassed = d.observe(offset, len, Time(now));
                proptest::prop_assert!(!sure || bypassed, "promised a bypass at {offset}");
                cursors[s] = offset + len;
            }
        }
    }

    #[test]
    fn an_in_order_stream_past_the_cutoff_is_surely_bypassed() {
        let mut d = SequentialDetector::new(1 << 20);
        let mut sure = 0;
        for i in 0..64u64 {
            let promised = d.surely_bypasses(i * 65536, 65536, Time(i));
            assert_eq!(promised, d.observe(i * 65536, 65536, Time(i)), "IO {i}");
            sure += usize::from(promised);
        }
        assert_eq!(sure, 48);
    }

    #[test]
    fn stale_stream_is_forgotten() {
        let mut d = SequentialDetector::new(8192);
        assert!(!d.observe(0, 8192, Time(0)));
        assert!(!d.observe(8192, 4096, Time(STREAM_TIMEOUT_NS + 10)));
    }
}
