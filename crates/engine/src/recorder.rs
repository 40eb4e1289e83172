//! The request recorder: the requests the pool's volumes receive (time,
//! volume, operation, offset, length), handed to one reader that writes
//! them out (`tiercache trace`, `crates/cli/src/trace.rs`).
//!
//! Contract on the IO path ([`Recorder::note`], called by every
//! [`VolumeHandle`](crate::VolumeHandle) request entry point):
//! - no recording: one relaxed atomic load, nothing else;
//! - recording: a clock read and one push into a bounded lock-free queue
//!   (`trace_ring.rs`). The queue never waits: when the reader fell behind
//!   and it is full, the request is left out and counted in
//!   [`TraceStats::dropped`]. An IO is never delayed by the recorder
//!   beyond that push.
//!
//! A request racing with the start or the stop of a recording may or may
//! not be in it. A request is recorded when it arrives (before it is
//! served), whatever its outcome; a hit the front end reads itself
//! (`read_if_cached`, `begin_cached_read`) is recorded when the engine
//! says it can serve it, and a front end that then falls back to a plain
//! read (a failed direct read, rare) records that read too.

use crate::trace_ring::TraceRing;
use crate::{Engine, EngineError, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tiercache_types::VolumeId;

/// What a recorded request asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TracedOp {
    Read = 1,
    Write = 2,
    WriteZeroes = 3,
    Trim = 4,
}

impl TracedOp {
    fn from_code(code: u8) -> Option<TracedOp> {
        Some(match code {
            1 => TracedOp::Read,
            2 => TracedOp::Write,
            3 => TracedOp::WriteZeroes,
            4 => TracedOp::Trim,
            _ => return None,
        })
    }
}

/// One recorded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracedRequest {
    /// Nanoseconds from the start of the recording to the request's arrival.
    pub time_ns: u64,
    pub volume: VolumeId,
    pub op: TracedOp,
    /// Byte offset in the volume.
    pub offset: u64,
    /// Length in bytes (at most [`MAX_TRACED_LEN`]; a longer trim or
    /// write-zeroes is recorded with this length).
    pub len: u64,
}

/// The longest length a record carries (40 bits: 1 TiB - 1).
pub const MAX_TRACED_LEN: u64 = (1 << 40) - 1;

/// The recorder's counters, for the current recording or the last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStats {
    /// A recording is running.
    pub recording: bool,
    /// Requests handed to the reader.
    pub requests: u64,
    /// Requests left out because the queue was full.
    pub dropped: u64,
}

/// Queue size `tiercache trace` uses unless told otherwise: 64 Ki records
/// (2 MiB), a quarter of a second of 250k IOPS.
pub const DEFAULT_TRACE_BUFFER: usize = 1 << 16;

/// Every volume (the value of `volume` when no filter is set).
const ALL_VOLUMES: u32 = u32::MAX;

/// The engine's recorder (one per engine; at most one recording at a time).
pub(crate) struct Recorder {
    active: AtomicBool,
    /// The volume recorded, or [`ALL_VOLUMES`].
    volume: AtomicU32,
    epoch: Instant,
    /// Start of the current recording, in ns since `epoch`.
    start_ns: AtomicU64,
    /// Made by the first recording, with its capacity; reused after.
    ring: OnceLock<TraceRing>,
    /// A [`Recording`] exists.
    taken: AtomicBool,
    /// A recording was ever started (else `stats` shows none).
    ever: AtomicBool,
    requests: AtomicU64,
    dropped: AtomicU64,
}

impl Recorder {
    pub(crate) fn new() -> Recorder {
        Recorder {
            active: AtomicBool::new(false),
            volume: AtomicU32::new(ALL_VOLUMES),
            epoch: Instant::now(),
            start_ns: AtomicU64::new(0),
            ring: OnceLock::new(),
            taken: AtomicBool::new(false),
            ever: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The hook: records a request of `volume` if a recording is running.
    #[inline]
    pub(crate) fn note(&self, volume: VolumeId, op: TracedOp, offset: u64, len: u64) {
        if self.active.load(Ordering::Relaxed) {
            self.push(volume, op, offset, len);
        }
    }

    #[cold]
    #[inline(never)]
    fn push(&self, volume: VolumeId, op: TracedOp, offset: u64, len: u64) {
        let want = self.volume.load(Ordering::Relaxed);
        if want != ALL_VOLUMES && want != u32::from(volume.0) {
            return;
        }
        let Some(ring) = self.ring.get() else { return };
        let now = self.epoch.elapsed().as_nanos() as u64;
        let packed = len.min(MAX_TRACED_LEN) | (u64::from(volume.0) << 40) | ((op as u64) << 56);
        if !ring.push([now, offset, packed]) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> Option<TraceStats> {
        self.ever.load(Ordering::Relaxed).then(|| TraceStats {
            recording: self.active.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        })
    }
}

/// A running recording: the one reader of the engine's recorder. Dropping
/// it stops the recording.
pub struct Recording {
    engine: Arc<Engine>,
}

impl Engine {
    /// Starts recording the requests of `volume` (every volume: `None`)
    /// into a queue of `capacity` records (rounded up to a power of two;
    /// the first recording of an engine sets it for the engine's life).
    /// Fails when a recording is already running.
    pub fn start_recording(
        self: &Arc<Self>,
        volume: Option<VolumeId>,
        capacity: usize,
    ) -> Result<Recording> {
        let r = &self.recorder;
        if r.taken.swap(true, Ordering::AcqRel) {
            return Err(EngineError::Config(
                "a recording is already running on this server".into(),
            ));
        }
        let ring = r.ring.get_or_init(|| TraceRing::new(capacity));
        // Left over from a previous recording (requests that raced its stop).
        while ring.pop().is_some() {}
        r.requests.store(0, Ordering::Relaxed);
        r.dropped.store(0, Ordering::Relaxed);
        r.volume.store(
            volume.map_or(ALL_VOLUMES, |v| u32::from(v.0)),
            Ordering::Relaxed,
        );
        r.start_ns
            .store(r.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r.ever.store(true, Ordering::Relaxed);
        r.active.store(true, Ordering::Release);
        Ok(Recording {
            engine: self.clone(),
        })
    }

    /// The recorder's counters (`None`: nothing was ever recorded).
    pub fn trace_stats(&self) -> Option<TraceStats> {
        self.recorder.stats()
    }
}

impl Recording {
    fn recorder(&self) -> &Recorder {
        &self.engine.recorder
    }

    /// The oldest recorded request not yet taken, if any.
    pub fn next_request(&self) -> Option<TracedRequest> {
        let r = self.recorder();
        let [at, offset, packed] = r.ring.get()?.pop()?;
        r.requests.fetch_add(1, Ordering::Relaxed);
        Some(TracedRequest {
            time_ns: at.saturating_sub(r.start_ns.load(Ordering::Relaxed)),
            volume: VolumeId((packed >> 40) as u16),
            op: TracedOp::from_code((packed >> 56) as u8).unwrap_or(TracedOp::Read),
            offset,
            len: packed & MAX_TRACED_LEN,
        })
    }

    /// Stops recording new requests; those already queued can still be
    /// taken with [`Recording::next_request`].
    pub fn stop(&self) {
        self.recorder().active.store(false, Ordering::Release);
    }

    /// Requests taken and requests dropped so far.
    pub fn stats(&self) -> TraceStats {
        self.recorder().stats().unwrap_or_default()
    }

    /// The queue's size in records.
    pub fn buffer_capacity(&self) -> usize {
        self.recorder().ring.get().map_or(0, TraceRing::capacity)
    }

    /// Nanoseconds since the recording started.
    pub fn elapsed_ns(&self) -> u64 {
        let r = self.recorder();
        (r.epoch.elapsed().as_nanos() as u64).saturating_sub(r.start_ns.load(Ordering::Relaxed))
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.stop();
        self.recorder().taken.store(false, Ordering::Release);
    }
}
