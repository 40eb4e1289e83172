//! An emulated hard disk: a decorator that delays IO as a spinning disk
//! would, because the machines this project runs on have no HDD.
//!
//! # The model
//!
//! [`HddModel`] holds the parameters; its methods are pure functions of
//! (head position, time, request), so tests compute service times and whole
//! queueing runs deterministically without sleeping. [`EmulatedHdd`] then
//! queues real requests per spindle and sleeps for the computed times.
//!
//! * **Layout.** With several spindles the device is striped over them
//!   (RAID 0, `stripe_bytes` per stripe). A request is served whole by the
//!   spindle that holds its first byte (an approximation for requests that
//!   cross a stripe boundary).
//! * **Seek.** The bytes of a spindle are spread over the whole stroke of a
//!   full-size disk: a seek of `d` bytes covers the fraction
//!   `f = min(1, d / stroke)` of the stroke, where `stroke` is
//!   `stroke_bytes`, by default the spindle's share of the device. So even a
//!   small file seeks like a whole disk, and a workload that stays within a
//!   tenth of the device seeks as a workload within a tenth of a real disk.
//!   `seek(f) = track_to_track + a*sqrt(f) + b*f`, with `a` and `b` chosen so
//!   that `seek(1) = full_stroke` and the mean over uniformly random pairs of
//!   positions is `average_seek` (the mean of `sqrt(f)` is 8/15 and of `f`
//!   is 1/3). That is the usual shape (Ruemmler and Wilkes 1994): the arm
//!   accelerates (square root) then coasts (linear). A jump of less than one
//!   track's bytes needs no seek, only rotation.
//! * **Rotation.** The platter turns at `rpm` from time zero. A track holds
//!   `track_bytes = transfer_rate * rotation_period` bytes and byte `o` sits
//!   at angle `frac(o / track_bytes)`; after the seek, the head waits until
//!   the target angle comes round.
//! * **Streaming.** A request that starts exactly where the head stopped
//!   costs only its transfer time, whatever the time since (read-ahead and
//!   the write cache of a real drive hide the gap), so sequential IO runs at
//!   `transfer_rate`.
//! * **Queueing.** Each spindle serves one request at a time. With several
//!   waiting it picks the one with the shortest positioning time (seek plus
//!   rotation; "SPTF", as NCQ firmware does), except that a request passed
//!   over `max_bypass` times is served next (no starvation). That is what
//!   lets queue depth 16 beat queue depth 1.
//!
//! With the defaults, computed by [`HddModel::simulate_random`]: 4 KiB random
//! reads over the whole stroke give about 82 IOPS at queue depth 1, 117 at
//! depth 4, 170 at depth 16 and 205 at depth 32 per spindle (the figures of
//! a desktop 7200 rpm disk), and sequential reads 150 MB/s. `benches/hdd.rs` measures the
//! real decorator against these numbers.

use crate::{check_range, BlockDevice};
use parking_lot::{Condvar, Mutex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Parameters of the emulated disk. Build with `HddModel::default()` and
/// change fields; [`HddModel::validate`] (called by [`EmulatedHdd::new`])
/// checks them.
#[derive(Clone, Debug, PartialEq)]
pub struct HddModel {
    /// Independent disks the device is striped over (RAID 0). Default 1.
    pub spindles: u32,
    /// Stripe unit across spindles, a multiple of 512. Default 1 MiB.
    pub stripe_bytes: u64,
    /// Rotation speed. Default 7200.
    pub rpm: u32,
    /// Seek to the adjacent track. Default 0.8 ms.
    pub track_to_track_seek: Duration,
    /// Mean seek between uniformly random positions. Default 8 ms. Must
    /// lie between `t2t + (full - t2t) / 3` and `t2t + 8/15 (full - t2t)`
    /// for the seek curve to be monotonic.
    pub average_seek: Duration,
    /// Seek across the whole stroke. Default 15 ms.
    pub full_stroke_seek: Duration,
    /// Sustained media transfer rate in bytes per second. Default 150 MB/s.
    pub transfer_rate: u64,
    /// Bytes of a spindle that map onto a full stroke; `None` (default) means
    /// the spindle's share of the device, i.e. the device spans the whole
    /// platter whatever its size.
    pub stroke_bytes: Option<u64>,
    /// Serve queued requests shortest-positioning-time first (true, default)
    /// or in arrival order.
    pub reorder: bool,
    /// A queued request passed over this many times is served next.
    /// Default 128 (lower values cap the gain of deep queues: at 32, queue
    /// depth 32 is hardly faster than depth 1).
    pub max_bypass: u32,
    /// Real time slept per modelled second: 1.0 (default) is real speed,
    /// 0.1 ten times faster, 0.0 never sleeps (queueing and head movement
    /// are still modelled).
    pub time_scale: f64,
}

impl Default for HddModel {
    fn default() -> Self {
        HddModel {
            spindles: 1,
            stripe_bytes: 1 << 20,
            rpm: 7200,
            track_to_track_seek: Duration::from_micros(800),
            average_seek: Duration::from_micros(8000),
            full_stroke_seek: Duration::from_micros(15000),
            transfer_rate: 150_000_000,
            stroke_bytes: None,
            reorder: true,
            max_bypass: 128,
            time_scale: 1.0,
        }
    }
}

/// Why an [`HddModel`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid HDD model: {0}")]
pub struct InvalidHddModel(pub String);

/// A request waiting for a spindle, as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedIo {
    /// Byte offset on the spindle.
    pub offset: u64,
    pub len: u64,
    /// How many times another request was served before this one.
    pub bypassed: u32,
}

fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

fn from_ns(x: f64) -> Duration {
    Duration::from_nanos(x.max(0.0).round() as u64)
}

impl HddModel {
    /// A model that never sleeps: for functional tests of code above it.
    pub fn zero_latency() -> HddModel {
        HddModel {
            time_scale: 0.0,
            ..HddModel::default()
        }
    }

    /// Checks every parameter; returns what is wrong otherwise.
    pub fn validate(&self) -> Result<(), InvalidHddModel> {
        let bad = |m: String| Err(InvalidHddModel(m));
        if self.spindles == 0 {
            return bad("spindles must be at least 1".into());
        }
        if self.stripe_bytes == 0 || self.stripe_bytes % 512 != 0 {
            return bad(format!(
                "stripe_bytes {} must be a positive multiple of 512",
                self.stripe_bytes
            ));
        }
        if self.rpm == 0 {
            return bad("rpm must be positive".into());
        }
        if self.transfer_rate == 0 {
            return bad("transfer_rate must be positive".into());
        }
        if self.stroke_bytes == Some(0) {
            return bad("stroke_bytes must be positive".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return bad(format!(
                "time_scale {} must be a finite number >= 0",
                self.time_scale
            ));
        }
        let (t2t, avg, full) = (
            ns(self.track_to_track_seek),
            ns(self.average_seek),
            ns(self.full_stroke_seek),
        );
        if !(t2t <= avg && avg <= full) {
            return bad(format!(
                "seek times must satisfy track_to_track ({:?}) <= average ({:?}) <= full_stroke ({:?})",
                self.track_to_track_seek, self.average_seek, self.full_stroke_seek
            ));
        }
        let lo = t2t + (full - t2t) / 3.0;
        let hi = t2t + (full - t2t) * 8.0 / 15.0;
        if avg < lo - 1.0 || avg > hi + 1.0 {
            return bad(format!(
                "average_seek {:?} must lie between {:?} and {:?} for these track-to-track and \
                 full-stroke seeks (seek = t2t + a*sqrt(d) + b*d with a, b >= 0)",
                self.average_seek,
                from_ns(lo),
                from_ns(hi)
            ));
        }
        Ok(())
    }

    /// One revolution.
    pub fn rotation_period(&self) -> Duration {
        Duration::from_nanos(60_000_000_000 / self.rpm as u64)
    }

    /// Bytes that pass under the head in one revolution.
    pub fn track_bytes(&self) -> u64 {
        ((self.transfer_rate as u128 * self.rotation_period().as_nanos()) / 1_000_000_000) as u64
    }

    /// (a, b) of `seek(f) = t2t + a*sqrt(f) + b*f`, in nanoseconds.
    fn seek_coefficients(&self) -> (f64, f64) {
        let (t2t, avg, full) = (
            ns(self.track_to_track_seek),
            ns(self.average_seek),
            ns(self.full_stroke_seek),
        );
        // mean(seek) = t2t + a*8/15 + b/3 = avg and a + b = full - t2t.
        let a = (5.0 * ((avg - t2t) - (full - t2t) / 3.0)).max(0.0);
        let b = (full - t2t - a).max(0.0);
        (a, b)
    }

    /// Seek time across the fraction `fraction` (clamped to [0, 1]) of the
    /// stroke; zero for a zero distance.
    pub fn seek_time(&self, fraction: f64) -> Duration {
        let f = fraction.clamp(0.0, 1.0);
        if f == 0.0 {
            return Duration::ZERO;
        }
        let (a, b) = self.seek_coefficients();
        from_ns(ns(self.track_to_track_seek) + a * f.sqrt() + b * f)
    }

    /// Time to transfer `len` bytes at the media rate.
    pub fn transfer_time(&self, len: u64) -> Duration {
        Duration::from_nanos(((len as u128 * 1_000_000_000) / self.transfer_rate as u128) as u64)
    }

    /// Bytes per full stroke on a device of `device_size` bytes.
    pub fn stroke(&self, device_size: u64) -> u64 {
        self.stroke_bytes
            .unwrap_or(device_size / self.spindles as u64)
            .max(1)
    }

    /// Which spindle holds device byte `offset`, and where on it.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let n = self.spindles as u64;
        let stripe = offset / self.stripe_bytes;
        let spindle = (stripe % n) as usize;
        let local = (stripe / n) * self.stripe_bytes + offset % self.stripe_bytes;
        (spindle, local)
    }

    /// Time from `now` (since the platter started turning) until the head,
    /// resting just past byte `head` of the spindle, is over byte `offset`:
    /// seek plus rotational wait, or zero when `offset == head` (streaming).
    pub fn positioning_time(&self, head: u64, now: Duration, offset: u64, stroke: u64) -> Duration {
        if offset == head {
            return Duration::ZERO;
        }
        let distance = offset.abs_diff(head);
        let seek = if distance < self.track_bytes() {
            Duration::ZERO
        } else {
            self.seek_time(distance as f64 / stroke.max(1) as f64)
        };
        let period = self.rotation_period().as_nanos();
        let arrive = (now + seek).as_nanos();
        let head_angle = (arrive % period) as f64 / period as f64;
        let track = self.track_bytes().max(1);
        let target_angle = (offset % track) as f64 / track as f64;
        let wait = (target_angle - head_angle).rem_euclid(1.0);
        seek + from_ns(wait * period as f64)
    }

    /// Positioning plus transfer time of a request of `len` bytes at
    /// `offset`, started at `now` with the head just past `head`.
    pub fn service_time(
        &self,
        head: u64,
        now: Duration,
        offset: u64,
        len: u64,
        stroke: u64,
    ) -> Duration {
        self.positioning_time(head, now, offset, stroke) + self.transfer_time(len)
    }

    /// Index in `queue` (non-empty) of the request to serve next: the first
    /// one passed over `max_bypass` times if any, else the shortest
    /// positioning time (ties to the earliest), or the first one when
    /// `reorder` is off.
    pub fn pick_next(&self, head: u64, now: Duration, queue: &[QueuedIo], stroke: u64) -> usize {
        assert!(!queue.is_empty(), "pick_next on an empty queue");
        if !self.reorder {
            return 0;
        }
        if let Some(i) = queue.iter().position(|q| q.bypassed >= self.max_bypass) {
            return i;
        }
        let mut best = 0;
        let mut best_t = Duration::MAX;
        for (i, q) in queue.iter().enumerate() {
            let t = self.positioning_time(head, now, q.offset, stroke);
            if t < best_t {
                best = i;
                best_t = t;
            }
        }
        best
    }

    /// Runs `ios` random reads of `io_len` bytes (aligned to `io_len`) over
    /// the first `span` bytes of one spindle whose stroke is `span` bytes,
    /// with `queue_depth` requests always outstanding, and returns the
    /// modelled time it takes. Deterministic for a given `seed`; sleeps
    /// never.
    pub fn simulate_random(
        &self,
        span: u64,
        io_len: u64,
        queue_depth: usize,
        ios: usize,
        seed: u64,
    ) -> Duration {
        assert!(queue_depth > 0 && io_len > 0 && span >= io_len);
        let mut rng = StdRng::seed_from_u64(seed);
        let slots = span / io_len;
        let random = |rng: &mut StdRng| QueuedIo {
            offset: rng.gen_range(0..slots) * io_len,
            len: io_len,
            bypassed: 0,
        };
        let mut queue: Vec<QueuedIo> = (0..queue_depth).map(|_| random(&mut rng)).collect();
        let mut now = Duration::ZERO;
        let mut head = 0u64;
        for _ in 0..ios {
            let i = self.pick_next(head, now, &queue, span);
            let io = queue.remove(i);
            for q in &mut queue {
                q.bypassed += 1;
            }
            now += self.service_time(head, now, io.offset, io.len, span);
            head = io.offset + io.len;
            queue.push(random(&mut rng));
        }
        now
    }
}

struct SpindleState {
    /// Spindle byte just past the last request served.
    head: u64,
    /// A granted request is being served.
    busy: bool,
    /// Modelled time at which the last granted request completes.
    free_at: Duration,
    queue: Vec<QueuedIo>,
    tickets: Vec<u64>,
    /// (ticket, real deadline) of the request allowed to run next.
    grant: Option<(u64, Instant)>,
}

struct Spindle {
    state: Mutex<SpindleState>,
    cv: Condvar,
}

/// A [`BlockDevice`] decorator that makes reads and writes take as long as
/// they would on the hard disk described by an [`HddModel`].
///
/// The inner IO is done while the request holds its spindle, then the
/// caller sleeps until the modelled completion time. Writes cost what reads
/// cost (a drive with its volatile write cache off, as a backing disk under
/// a write-back cache should be run). Flush and discard pass straight
/// through without delay.
pub struct EmulatedHdd<D> {
    inner: D,
    model: HddModel,
    stroke: u64,
    start: Instant,
    spindles: Vec<Spindle>,
    next_ticket: AtomicU64,
}

/// A streaming request arriving up to this long after its predecessor
/// completed is served as if it had been queued already.
const STREAM_SLACK: Duration = Duration::from_millis(1);

/// Below this, finish a wait by spinning (sleep overshoots by ~50 µs).
const SPIN: Duration = Duration::from_micros(80);

fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::hint::spin_loop();
        }
    }
}

impl<D: BlockDevice> EmulatedHdd<D> {
    /// Wraps `inner`; fails when the model is invalid.
    pub fn new(inner: D, model: HddModel) -> Result<Self, InvalidHddModel> {
        model.validate()?;
        let stroke = model.stroke(inner.size());
        let spindles = (0..model.spindles)
            .map(|_| Spindle {
                state: Mutex::new(SpindleState {
                    head: 0,
                    busy: false,
                    free_at: Duration::ZERO,
                    queue: Vec::new(),
                    tickets: Vec::new(),
                    grant: None,
                }),
                cv: Condvar::new(),
            })
            .collect();
        Ok(EmulatedHdd {
            inner,
            model,
            stroke,
            start: Instant::now(),
            spindles,
            next_ticket: AtomicU64::new(0),
        })
    }

    /// The inner device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The model in use.
    pub fn model(&self) -> &HddModel {
        &self.model
    }

    /// Current head position (spindle byte offset) of every spindle.
    pub fn head_positions(&self) -> Vec<u64> {
        self.spindles.iter().map(|s| s.state.lock().head).collect()
    }

    fn model_now(&self) -> Duration {
        if self.model.time_scale == 0.0 {
            Duration::ZERO
        } else {
            self.start.elapsed().div_f64(self.model.time_scale)
        }
    }

    /// Grants the spindle to the best queued request. Caller holds the
    /// spindle's lock, the spindle is not busy and the queue is not empty.
    fn dispatch(&self, st: &mut SpindleState) {
        let real_now = self.model_now();
        let mut now = real_now.max(st.free_at);
        let i = self.model.pick_next(st.head, now, &st.queue, self.stroke);
        let io = st.queue.remove(i);
        if io.offset == st.head {
            // Streaming: the drive's read-ahead (or write cache) kept the
            // media busy while the host was between requests, so a short
            // gap (including our own wake-up latency) costs nothing.
            now = st.free_at.max(real_now.saturating_sub(STREAM_SLACK));
        }
        let ticket = st.tickets.remove(i);
        for q in &mut st.queue {
            q.bypassed += 1;
        }
        let service = self
            .model
            .service_time(st.head, now, io.offset, io.len, self.stroke);
        st.head = io.offset + io.len;
        st.free_at = now + service;
        st.busy = true;
        let deadline = self.start + st.free_at.mul_f64(self.model.time_scale);
        st.grant = Some((ticket, deadline));
    }

    /// Queues a request on its spindle, waits for the spindle, runs `io`,
    /// then waits out the modelled service time.
    fn timed<R>(&self, offset: u64, len: u64, io: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        let (s, local) = self.model.locate(offset);
        let spindle = &self.spindles[s];
        let ticket = self.next_ticket.fetch_add(1, Relaxed);
        let deadline = {
            let mut st = spindle.state.lock();
            st.queue.push(QueuedIo {
                offset: local,
                len,
                bypassed: 0,
            });
            st.tickets.push(ticket);
            if !st.busy {
                self.dispatch(&mut st);
            }
            loop {
                match st.grant {
                    Some((t, d)) if t == ticket => {
                        st.grant = None;
                        break d;
                    }
                    _ => spindle.cv.wait(&mut st),
                }
            }
        };
        // Frees the spindle even if `io` panics, so other callers go on.
        let _release = Release { hdd: self, spindle };
        let result = io();
        sleep_until(deadline);
        result
    }
}

/// Frees a spindle when dropped and grants it to the next queued request.
struct Release<'a, D: BlockDevice> {
    hdd: &'a EmulatedHdd<D>,
    spindle: &'a Spindle,
}

impl<D: BlockDevice> Drop for Release<'_, D> {
    fn drop(&mut self) {
        let mut st = self.spindle.state.lock();
        st.busy = false;
        if !st.queue.is_empty() {
            self.hdd.dispatch(&mut st);
            self.spindle.cv.notify_all();
        }
    }
}

impl<D: BlockDevice> BlockDevice for EmulatedHdd<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        self.timed(offset, len, || self.inner.read_at(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.timed(offset, buf.len() as u64, || {
            self.inner.write_at(buf, offset)
        })
    }

    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }

    fn describe(&self) -> String {
        format!(
            "hdd({}x{}rpm, {})",
            self.model.spindles,
            self.model.rpm,
            self.inner.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use std::sync::Arc;

    const GIB: u64 = 1 << 30;

    fn iops(m: &HddModel, qd: usize) -> f64 {
        let ios = 4000;
        ios as f64 / m.simulate_random(GIB, 4096, qd, ios, 1).as_secs_f64()
    }

    #[test]
    fn seek_curve_hits_its_parameters() {
        let m = HddModel::default();
        assert_eq!(m.seek_time(0.0), Duration::ZERO);
        assert_eq!(m.seek_time(1.0), m.full_stroke_seek);
        assert_eq!(m.seek_time(7.0), m.full_stroke_seek);
        let tiny = m.seek_time(1e-9);
        assert!(
            tiny >= m.track_to_track_seek
                && tiny < m.track_to_track_seek + Duration::from_micros(10)
        );
        // The mean over random pairs is the average seek (within 2%).
        let mut rng = StdRng::seed_from_u64(3);
        let n = 200_000;
        let total: f64 = (0..n)
            .map(|_| {
                let (x, y): (f64, f64) = (rng.gen(), rng.gen());
                m.seek_time((x - y).abs()).as_secs_f64()
            })
            .sum();
        let mean = total / n as f64;
        let want = m.average_seek.as_secs_f64();
        assert!(
            (mean - want).abs() < 0.02 * want,
            "mean seek {mean} vs {want}"
        );
        // Monotonic.
        let mut last = Duration::ZERO;
        for i in 0..=100 {
            let t = m.seek_time(i as f64 / 100.0);
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn geometry() {
        let m = HddModel::default();
        assert_eq!(m.rotation_period(), Duration::from_nanos(8_333_333));
        assert_eq!(m.track_bytes(), 1_249_999);
        assert_eq!(m.transfer_time(150_000_000), Duration::from_secs(1));
        let m4 = HddModel {
            spindles: 4,
            ..HddModel::default()
        };
        let mb = 1 << 20;
        assert_eq!(m4.locate(0), (0, 0));
        assert_eq!(m4.locate(mb + 5), (1, 5));
        assert_eq!(m4.locate(4 * mb + 7), (0, mb + 7));
        assert_eq!(m4.locate(7 * mb), (3, mb));
        assert_eq!(m4.stroke(8 * GIB), 2 * GIB);
    }

    #[test]
    fn sequential_is_faster_than_random() {
        let m = HddModel::default();
        let stroke = GIB;
        let mib = 1 << 20;
        // Streaming 1 MiB: transfer only, ~150 MB/s.
        let seq = m.service_time(10 * mib, Duration::from_millis(3), 10 * mib, mib, stroke);
        assert_eq!(seq, m.transfer_time(mib));
        let mbps = mib as f64 / seq.as_secs_f64() / 1e6;
        assert!((145.0..155.0).contains(&mbps), "{mbps} MB/s");
        // The same read elsewhere pays a seek and some rotation.
        let rnd = m.service_time(10 * mib, Duration::from_millis(3), 600 * mib, mib, stroke);
        assert!(rnd > seq + m.seek_time(0.5), "{rnd:?} vs {seq:?}");
        // Small random reads: QD1 IOPS is that of a 7200 rpm disk.
        let qd1 = iops(&m, 1);
        assert!((65.0..95.0).contains(&qd1), "QD1 {qd1} IOPS");
        // Sequential 4 KiB reads are ~transfer bound: far more IOPS.
        let t = m.service_time(4096, Duration::from_millis(1), 4096, 4096, stroke);
        assert!(1.0 / t.as_secs_f64() > 100.0 * qd1);
    }

    #[test]
    fn reordering_makes_queue_depth_pay() {
        let m = HddModel::default();
        let qd1 = iops(&m, 1);
        let qd4 = iops(&m, 4);
        let qd16 = iops(&m, 16);
        assert!(qd4 > 1.3 * qd1, "QD4 {qd4} vs QD1 {qd1}");
        assert!(qd16 > 1.3 * qd4, "QD16 {qd16} vs QD4 {qd4}");
        assert!((150.0..300.0).contains(&qd16), "QD16 {qd16} IOPS");
        // Without reordering, depth does not help.
        let fifo = HddModel {
            reorder: false,
            ..HddModel::default()
        };
        let f16 = iops(&fifo, 16);
        assert!(
            (f16 - qd1).abs() < 0.1 * qd1,
            "FIFO QD16 {f16} vs QD1 {qd1}"
        );
    }

    #[test]
    fn pick_next_prefers_near_and_ages() {
        let m = HddModel::default();
        let q = |offset, bypassed| QueuedIo {
            offset,
            len: 4096,
            bypassed,
        };
        let head = 100 << 20;
        let queue = [q(900 << 20, 0), q(head, 0), q(10 << 20, 0)];
        assert_eq!(m.pick_next(head, Duration::ZERO, &queue, GIB), 1);
        let queue = [q(900 << 20, m.max_bypass), q(head, 0)];
        assert_eq!(m.pick_next(head, Duration::ZERO, &queue, GIB), 0);
        let fifo = HddModel {
            reorder: false,
            ..HddModel::default()
        };
        let queue = [q(900 << 20, 0), q(head, 0)];
        assert_eq!(fifo.pick_next(head, Duration::ZERO, &queue, GIB), 0);
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let ok = HddModel::default();
        assert!(ok.validate().is_ok());
        let cases = [
            HddModel {
                spindles: 0,
                ..ok.clone()
            },
            HddModel {
                rpm: 0,
                ..ok.clone()
            },
            HddModel {
                transfer_rate: 0,
                ..ok.clone()
            },
            HddModel {
                stripe_bytes: 1000,
                ..ok.clone()
            },
            HddModel {
                stroke_bytes: Some(0),
                ..ok.clone()
            },
            HddModel {
                time_scale: -1.0,
                ..ok.clone()
            },
            HddModel {
                time_scale: f64::NAN,
                ..ok.clone()
            },
            HddModel {
                average_seek: Duration::from_millis(20),
                ..ok.clone()
            },
            HddModel {
                average_seek: Duration::from_millis(2),
                ..ok.clone()
            },
            HddModel {
                track_to_track_seek: Duration::from_millis(17),
                ..ok.clone()
            },
        ];
        for c in cases {
            let e = c.validate().unwrap_err();
            assert!(e.to_string().starts_with("invalid HDD model"), "{e}");
            assert!(EmulatedHdd::new(MemDevice::new(4096), c).is_err());
        }
    }

    #[test]
    fn decorator_passes_data_and_moves_the_head() {
        let d = EmulatedHdd::new(MemDevice::new(8 << 20), HddModel::zero_latency()).unwrap();
        d.write_at(&[5u8; 8192], 1 << 20).unwrap();
        assert_eq!(d.head_positions(), vec![(1 << 20) + 8192]);
        let mut b = vec![0u8; 8192];
        d.read_at(&mut b, 1 << 20).unwrap();
        assert!(b.iter().all(|&x| x == 5));
        assert!(d.read_at(&mut b, 8 << 20).is_err());
        d.discard(1 << 20, 4096).unwrap();
        d.flush().unwrap();
        d.read_at(&mut b[..4096], 1 << 20).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0));
    }

    /// Panics on reads at offset 0, works elsewhere.
    struct PanicAtZero(MemDevice);

    impl BlockDevice for PanicAtZero {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            assert!(offset != 0, "inner device panics");
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
            self.0.discard(offset, len)
        }
        fn describe(&self) -> String {
            "panicky".into()
        }
    }

    #[test]
    fn a_panicking_io_frees_its_spindle() {
        let d = Arc::new(
            EmulatedHdd::new(
                PanicAtZero(MemDevice::new(1 << 20)),
                HddModel::zero_latency(),
            )
            .unwrap(),
        );
        let d2 = d.clone();
        let r = std::thread::spawn(move || {
            let mut b = [0u8; 512];
            d2.read_at(&mut b, 0)
        })
        .join();
        assert!(r.is_err(), "the inner read should have panicked");
        let mut b = [0u8; 512];
        d.read_at(&mut b, 4096).unwrap();
        let st = d.spindles[0].state.lock();
        assert!(!st.busy && st.queue.is_empty());
    }

    #[test]
    fn decorator_serves_many_threads_on_many_spindles() {
        let model = HddModel {
            spindles: 3,
            stripe_bytes: 64 << 10,
            ..HddModel::zero_latency()
        };
        let d = Arc::new(EmulatedHdd::new(MemDevice::new(16 << 20), model).unwrap());
        let hs: Vec<_> = (0..12u64)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let off = ((t * 50 + i) * 7919 % 4096) * 4096;
                        let v = vec![(t + 1) as u8; 4096];
                        d.write_at(&v, off).unwrap();
                        let mut r = vec![0u8; 4096];
                        d.read_at(&mut r, off).unwrap();
                        // Another thread may have written the same block; it
                        // holds one whole write.
                        assert!(r.iter().all(|&x| x == r[0]) && r[0] != 0);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        for s in &d.spindles {
            let st = s.state.lock();
            assert!(!st.busy && st.queue.is_empty() && st.grant.is_none());
        }
    }
}
