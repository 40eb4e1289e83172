//! [`ConfigRunner`]: one configuration (policy and cache size) replaying
//! requests through the policy crate's own decisions, pricing each IO with
//! the device model.

use super::results::{ConfigResult, LatencySummary, VolumeResult, WarmResult};
use super::spec::{policy_label, SimSpec};
use crate::device::{DeviceModel, LatencyHistogram};
use crate::trace::{Request, VOLUME_SHIFT};
use tiercache_policy::director::{ReadPlan, WritePlan};
use tiercache_policy::writeback::{writeback_runs, RateController, MAX_WRITEBACK_RUN_BYTES};
use tiercache_policy::writeback_sweep::WritebackSweep;
use tiercache_policy::{BlockPlan, Director, DirectorConfig, IoRequest, PolicyConfig};
use tiercache_types::{CacheMode, Time, VolumeId};

// Plan classes, indexes into cost tables.
pub(super) const HIT: u8 = 0;
pub(super) const MISS: u8 = 1;
pub(super) const PROMOTE: u8 = 2;
pub(super) const BACKING: u8 = 3;
pub(super) const THROUGH: u8 = 4;
pub(super) const DIRTY: u8 = 5;

/// (uses fast device, uses slow device) per class.
pub(super) const USES: [(bool, bool); 6] = [
    (true, false), // hit
    (false, true), // miss
    (true, true),  // promote
    (false, true), // backing
    (true, true),  // through
    (true, false), // dirty
];

/// One configuration being simulated: a [`Director`] plus the device model
/// and latency histogram. [`simulate`](super::simulate) runs many of these; it is public for
/// benchmarks and for callers that drive requests themselves.
pub struct ConfigRunner {
    policy: PolicyConfig,
    cache_bytes: u64,
    capacity: u32,
    d: Director,
    shift: u32,
    bs: u64,
    /// The origin device's size (`u64::MAX` when unknown): a write over
    /// its short last block covers that block whole, as in the engine.
    volume_size: u64,
    /// The current request's runs of blocks of one class: (class, bytes).
    classes: Vec<(u8, u64)>,
    device: DeviceModel,
    hist: LatencyHistogram,
    /// Latency / busy time of a one-block IO per class (the common case).
    lat_block: [u64; 6],
    fast_busy_block: [u64; 6],
    slow_busy_block: [u64; 6],
    fast_busy: u128,
    slow_busy: u128,
    /// The engine's writeback pacing, and the idle gap in ns.
    cleaner: Option<(RateController, u64)>,
    /// Which dirty blocks the cleaner writes back next, as the engine's.
    sweep: WritebackSweep,
    cleaner_writebacks: u64,
    /// The cleaner's clock: the request's own time for a timestamped
    /// trace, else modelled time (each request's modelled latency over the
    /// queue depth, as if the requests came back to back).
    timestamps: bool,
    clock: Time,
    queue_depth: u64,
    /// Requests seen (zero-length ones included).
    requests: u64,
    /// (requests, hits, block refs) when the cache first became full.
    fill: Option<(u64, u64, u64)>,
    /// Replaying as a pool: requests go to the volume their address range
    /// names, attached on first sight with the spec's mode and cutoff.
    pool: bool,
    mode: CacheMode,
    cutoff: u64,
}

impl ConfigRunner {
    /// A runner for `policy` with a cache of `cache_bytes` (whole blocks of
    /// `spec.block_size`). Errors name the problem (size, policy).
    pub fn new(
        spec: &SimSpec,
        policy: &PolicyConfig,
        cache_bytes: u64,
    ) -> std::result::Result<ConfigRunner, String> {
        let blocks = cache_bytes / spec.block_size as u64;
        if blocks == 0 || blocks > u32::MAX as u64 - 1 {
            return Err(format!(
                "cache size {cache_bytes} bytes is {blocks} blocks of {} bytes (need 1..2^32-1)",
                spec.block_size
            ));
        }
        let capacity = blocks as u32;
        let cfg = DirectorConfig {
            mode: spec.mode,
            block_size: spec.block_size,
            capacity,
            sequential_cutoff: spec.sequential_cutoff,
            policy: policy.clone(),
            utility_sharing: true,
        };
        let d = Director::new(&cfg).map_err(|e| e.to_string())?;
        let bs = spec.block_size as u64;
        let mut r = ConfigRunner {
            policy: policy.clone(),
            cache_bytes,
            capacity,
            d,
            shift: bs.trailing_zeros(),
            bs,
            volume_size: spec.device_size.unwrap_or(u64::MAX),
            classes: Vec::with_capacity(8),
            device: spec.device.clone(),
            hist: LatencyHistogram::new(),
            lat_block: [0; 6],
            fast_busy_block: [0; 6],
            slow_busy_block: [0; 6],
            fast_busy: 0,
            slow_busy: 0,
            cleaner: spec
                .cleaner
                .filter(|_| spec.mode == CacheMode::WriteBack)
                .map(|c| (RateController::new(c.config()), c.idle_after_ms * 1_000_000)),
            sweep: WritebackSweep::new(),
            cleaner_writebacks: 0,
            timestamps: false,
            clock: Time::ZERO,
            queue_depth: spec.queue_depth.max(1) as u64,
            requests: 0,
            fill: None,
            pool: spec.pool,
            mode: spec.mode,
            cutoff: spec.sequential_cutoff,
        };
        for class in 0..6u8 {
            let (l, f, s) = r.cost(class, bs);
            r.lat_block[class as usize] = l;
            r.fast_busy_block[class as usize] = f;
            r.slow_busy_block[class as usize] = s;
        }
        Ok(r)
    }

    /// (latency, fast busy, slow busy) in ns of one device IO run.
    fn cost(&self, class: u8, bytes: u64) -> (u64, u64, u64) {
        let (fast, slow) = USES[class as usize];
        let mut lat = 0;
        let (mut fb, mut sb) = (0, 0);
        if fast {
            lat += self.device.fast.io_latency_ns(bytes);
            fb = self.device.fast.busy_ns(bytes);
        }
        if slow {
            lat += self.device.slow.io_latency_ns(bytes);
            sb = self.device.slow.busy_ns(bytes);
        }
        (lat, fb, sb)
    }

    #[inline]
    fn run_cost(&mut self, class: u8, bytes: u64) -> u64 {
        if bytes == self.bs {
            let c = class as usize;
            self.fast_busy += self.fast_busy_block[c] as u128;
            self.slow_busy += self.slow_busy_block[c] as u128;
            self.lat_block[c]
        } else {
            let (l, f, s) = self.cost(class, bytes);
            self.fast_busy += f as u128;
            self.slow_busy += s as u128;
            l
        }
    }

    /// Plans one request: `begin`, a plan per block, `finish`, then prices
    /// the plans and runs the cleaner if due. Zero-length requests are
    /// ignored.
    #[inline]
    pub fn process(&mut self, r: &Request) {
        self.requests += 1;
        if r.len == 0 {
            return;
        }
        let now = r.time;
        if self.timestamps {
            // An idle gap before this request: once it has lasted
            // `idle_after`, the engine's cleaner writes back at full speed,
            // as much as the backing device can take in the rest of it.
            if let Some((ctl, idle_ns)) = self.cleaner.as_mut() {
                let gap = now.saturating_sub(self.clock);
                if gap >= *idle_ns && self.requests > 1 {
                    let budget = (gap - *idle_ns) as u128;
                    let dirty = self.d.dirty_len() as u64;
                    let n = ctl.blocks_to_clean(dirty, self.capacity as u64, true, false, now);
                    self.clean_within(n as usize, budget);
                }
            }
            self.clock = now;
        }
        let (volume, offset) = self.volume_of(r.offset);
        let req = IoRequest {
            volume,
            offset,
            len: r.len,
            access: r.access,
            volume_size: self.volume_size,
        };
        let end = offset.saturating_add(r.len);
        let (shift, bs) = (self.shift, self.bs);
        // Runs of blocks of one class are priced as one device IO each;
        // the plans are collected first (the director is busy planning).
        let classes = &mut self.classes;
        classes.clear();
        self.d.plan_io(&req, now, |b, _, plan| {
            let bstart = b << shift;
            let lo = offset.max(bstart);
            let hi = end.min(bstart.saturating_add(bs));
            let class = match plan {
                BlockPlan::Read(ReadPlan::Hit(_)) => HIT,
                BlockPlan::Read(ReadPlan::Miss) => MISS,
                BlockPlan::Read(ReadPlan::Promote(_)) => PROMOTE,
                BlockPlan::Write(WritePlan::Backing) => BACKING,
                BlockPlan::Write(WritePlan::Through { .. }) => THROUGH,
                BlockPlan::Write(WritePlan::Dirty { .. }) => DIRTY,
            };
            match classes.last_mut() {
                Some((c, n)) if *c == class => *n += hi - lo,
                _ => classes.push((class, hi - lo)),
            }
        });
        let mut lat = 0u64;
        for k in 0..self.classes.len() {
            let (class, bytes) = self.classes[k];
            lat += self.run_cost(class, bytes);
        }
        self.hist.record(lat);
        if !self.timestamps {
            self.clock = Time(self.clock.0 + lat / self.queue_depth);
        }
        if let Some((ctl, _)) = self.cleaner.as_mut() {
            let dirty = self.d.dirty_len() as u64;
            let n = ctl.blocks_to_clean(dirty, self.capacity as u64, false, false, self.clock);
            if n > 0 {
                self.clean_within(n as usize, u128::MAX);
            }
        }
        if self.fill.is_none() && self.d.resident_len() >= self.d.capacity() {
            let (hits, refs) = self.hits_refs();
            self.fill = Some((self.requests, hits, refs));
        }
    }

    /// The volume and in-volume offset of a trace offset: volume 0 and the
    /// offset itself unless replaying as a pool.
    #[inline]
    fn volume_of(&mut self, offset: u64) -> (VolumeId, u64) {
        if !self.pool {
            return (VolumeId(0), offset);
        }
        let index = offset >> VOLUME_SHIFT;
        let volume = VolumeId(index.min(u16::MAX as u64) as u16);
        if volume.0 != 0 && self.d.mode(volume) == CacheMode::PassThrough {
            self.d.attach_volume(volume, self.mode, self.cutoff);
        }
        (volume, offset & ((1 << VOLUME_SHIFT) - 1))
    }

    /// Every volume's results (a pooled replay), by volume index.
    pub fn volume_results(&self) -> Vec<VolumeResult> {
        if !self.pool {
            return Vec::new();
        }
        self.d
            .volume_ids()
            .into_iter()
            .filter_map(|v| {
                let counters = self.d.volume_counters(v)?;
                (counters.read_ios + counters.write_ios > 0).then(|| VolumeResult {
                    volume: v.0,
                    counters,
                    read_hit_ratio: counters.read_hit_ratio(),
                    target_blocks: self.d.volume_target(v),
                })
            })
            .collect()
    }

    /// Whether request times are real timestamps (the cleaner then runs on
    /// them, idle gaps included) or IO counters (it runs on modelled time).
    pub fn set_timestamps(&mut self, timestamps: bool) {
        self.timestamps = timestamps;
    }

    /// The cleaner's clock now (see [`ConfigRunner::set_timestamps`]).
    pub fn clock(&self) -> Time {
        self.clock
    }

    /// Block hits and block references (reads and writes) so far.
    pub fn hits_refs(&self) -> (u64, u64) {
        let c = self.d.counters();
        (
            c.read_hits + c.write_hits,
            c.read_hits + c.read_misses + c.write_hits + c.write_misses,
        )
    }

    /// Requests seen when the cache first became full, if it has.
    pub fn filled_at(&self) -> Option<u64> {
        self.fill.map(|f| f.0)
    }

    /// The warm hit ratio so far (from the request after the fill).
    pub fn warm_hit_ratio(&self) -> Option<f64> {
        let (_, fh, fr) = self.fill?;
        let (h, r) = self.hits_refs();
        (r > fr).then(|| (h - fh) as f64 / (r - fr) as f64)
    }

    /// Writes back up to `n` dirty blocks, the ones the engine would choose,
    /// as the engine writes them: neighbours merged into one write of up
    /// to [`MAX_WRITEBACK_RUN_BYTES`]. Stops before a run that would take
    /// the backing device past `budget_ns` of busy time (the first run
    /// always goes); the blocks left stay dirty.
    fn clean_within(&mut self, n: usize, budget_ns: u128) {
        let dirty = self.sweep.next_batch(n, &self.d);
        let max_run = (MAX_WRITEBACK_RUN_BYTES / self.bs).max(1) as usize;
        let mut spent = 0u128;
        let mut i = 0;
        for len in writeback_runs(&dirty, max_run) {
            let bytes = len as u64 * self.bs;
            let slow = self.device.slow.busy_ns(bytes) as u128;
            if i > 0 && spent + slow > budget_ns {
                break;
            }
            spent += slow;
            self.slow_busy += slow;
            self.fast_busy += self.device.fast.busy_ns(bytes) as u128;
            for &(o, _) in &dirty[i..i + len] {
                self.d.mark_clean(o);
            }
            self.cleaner_writebacks += len as u64;
            i += len;
        }
        self.sweep.put_back(&dirty[i..]);
    }

    /// The results so far; IOPS predicted at `queue_depth`.
    pub fn result(&self, queue_depth: u32) -> ConfigResult {
        let c = self.d.counters();
        let ratio = |hits: u64, misses: u64| {
            if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            }
        };
        let refs = c.read_hits + c.read_misses + c.write_hits + c.write_misses;
        let n = self.hist.count();
        let mean_s = self.hist.mean() / 1e9;
        let mut iops = if mean_s > 0.0 {
            queue_depth as f64 / mean_s
        } else {
            0.0
        };
        let mut limit = "latency";
        if n > 0 {
            for (busy, name) in [
                (self.slow_busy, "slow device"),
                (self.fast_busy, "fast device"),
            ] {
                if busy > 0 {
                    let cap = n as f64 / (busy as f64 / 1e9);
                    if cap < iops {
                        iops = cap;
                        limit = name;
                    }
                }
            }
        }
        ConfigResult {
            policy: policy_label(&self.policy),
            policy_config: self.policy.clone(),
            cache_bytes: self.cache_bytes,
            cache_blocks: self.capacity,
            error: None,
            counters: c,
            read_hit_ratio: ratio(c.read_hits, c.read_misses),
            write_hit_ratio: ratio(c.write_hits, c.write_misses),
            miss_ratio: if refs == 0 {
                0.0
            } else {
                1.0 - (c.read_hits + c.write_hits) as f64 / refs as f64
            },
            cleaner_writebacks: self.cleaner_writebacks,
            latency: LatencySummary::of(&self.hist),
            iops,
            iops_limited_by: limit.to_string(),
            // Filled in by `simulate`, which knows which blocks were new.
            first_touch_misses: 0,
            warm: self.fill.map(|(at, fh, fr)| {
                let (h, r) = self.hits_refs();
                WarmResult::new(at, r - fr, h - fh, 0)
            }),
            window_hit_ratios: Vec::new(),
            volumes: self.volume_results(),
        }
    }
}
