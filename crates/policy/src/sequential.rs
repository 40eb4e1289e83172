//! Sequential stream detection for bypass, after bcache's
//! `sequential_cutoff`: IOs that continue a recent stream add to that
//! stream's length; once a stream has covered `cutoff` bytes, its further IOs
//! bypass the cache (they would only push hot blocks out).

use tiercache_types::Time;

/// Streams remembered at once (bcache: RECENT_IO = 64).
pub const STREAMS: usize = 64;
/// A stream not continued for this long is forgotten (bcache: 5 s).
pub const STREAM_TIMEOUT_NS: u64 = 5_000_000_000;

#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    next_offset: u64,
    bytes: u64,
    last_used: Time,
    live: bool,
}

/// Tracks recent streams by where their next IO would start.
#[derive(Clone, Debug)]
pub struct SequentialDetector {
    cutoff: u64,
    streams: [Stream; STREAMS],
}

impl SequentialDetector {
    /// `cutoff` in bytes; 0 disables detection.
    pub fn new(cutoff: u64) -> Self {
        SequentialDetector {
            cutoff,
            streams: [Stream::default(); STREAMS],
        }
    }

    pub fn cutoff(&self) -> u64 {
        self.cutoff
    }

    pub fn set_cutoff(&mut self, cutoff: u64) {
        self.cutoff = cutoff;
    }

    /// Records an IO of `len` bytes at `offset` and says whether it should
    /// bypass the cache: true once its stream, this IO included, has covered
    /// more than the cutoff.
    pub fn observe(&mut self, offset: u64, len: u64, now: Time) -> bool {
        if self.cutoff == 0 || len == 0 {
            return false;
        }
        let end = offset.saturating_add(len);
        let mut oldest = 0;
        for i in 0..STREAMS {
            let s = &mut self.streams[i];
            let fresh = s.live && now.saturating_sub(s.last_used) <= STREAM_TIMEOUT_NS;
            if fresh && s.next_offset == offset {
                s.bytes = s.bytes.saturating_add(len);
                s.next_offset = end;
                s.last_used = now;
                return s.bytes > self.cutoff;
            }
            let o = &self.streams[oldest];
            let cand = &self.streams[i];
            if !cand.live || (o.live && cand.last_used < o.last_used) {
                oldest = i;
            }
        }
        self.streams[oldest] = Stream {
            next_offset: end,
            bytes: len,
            last_used: now,
            live: true,
        };
        len > self.cutoff
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
    fn stale_stream_is_forgotten() {
        let mut d = SequentialDetector::new(8192);
        assert!(!d.observe(0, 8192, Time(0)));
        assert!(!d.observe(8192, 4096, Time(STREAM_TIMEOUT_NS + 10)));
    }
}
