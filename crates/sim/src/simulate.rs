//! The simulation driver: replays a request stream through many
//! (cache size, policy) configurations of the [`Director`] at once, plus the
//! offline bounds (OPT) and the LRU miss-ratio curve.
//!
//! Each configuration does exactly what the live engine does per IO, with
//! a virtual clock (the request's time) and no device IO:
//! `begin(offset, len, access, time)`, then `plan_read` or `plan_write`
//! for every block the request touches (`full_block` = the request covers
//! the whole block), then `finish`. The plans are priced by the
//! [`crate::device::DeviceModel`].
//!
//! Writeback mode: a simple cleaner (if enabled) writes dirty blocks back
//! whenever more than `high_dirty` of the cache is dirty, down to
//! `low_dirty`, like a bcache-style writeback target. Which blocks is the
//! engine's choice ([`choose_writeback`]: origin order); when is a model,
//! since a synthetic stream has no time to pace by. Writebacks are
//! background IO: they cost device capacity (and so IOPS) but no request
//! latency. Dirty blocks left at the end are reported.
//!
//! Parallelism: the request stream is read once, in chunks. For each chunk
//! the configurations (and the block-level analysis task) are independent,
//! so worker threads (`std::thread::scope`) pick tasks off a shared counter
//! and run them over the chunk while the calling thread reads the next
//! chunk. Memory: one chunk plus per-task state; OPT additionally keeps one
//! u32 per block reference (and one more while it runs).

use crate::device::{DeviceModel, LatencyHistogram};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::mrc::{Mrc, MrcBuilder, MrcMethod};
use crate::opt::{next_uses, opt_run, OptRun, OptVariant};
use crate::trace::{Request, TraceReader};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tiercache_policy::director::{ReadPlan, WritePlan};
use tiercache_policy::writeback::choose_writeback;
use tiercache_policy::{BlockPlan, Counters, Director, DirectorConfig, IoRequest, PolicyConfig};
use tiercache_types::{Access, AdmissionKind, CacheMode, ReplacementKind, VolumeId};

/// Requests per chunk handed to the workers.
pub const CHUNK: usize = 1 << 16;

/// The writeback cleaner model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CleanerSpec {
    /// Start cleaning above this dirty share of the cache (0..1).
    pub high_dirty: f64,
    /// Clean down to this dirty share.
    pub low_dirty: f64,
}

impl CleanerSpec {
    /// Blocks to write back now with `dirty` of `capacity` blocks dirty:
    /// none up to `high_dirty`, else down to `low_dirty`.
    pub fn to_clean(&self, dirty: u64, capacity: u32) -> u64 {
        let high = (self.high_dirty.clamp(0.0, 1.0) * capacity as f64) as u64;
        let low = (self.low_dirty.clamp(0.0, 1.0) * capacity as f64) as u64;
        if dirty > high {
            dirty - low
        } else {
            0
        }
    }
}

impl Default for CleanerSpec {
    /// bcache's `writeback_percent` is 10: keep about 10% dirty.
    fn default() -> Self {
        CleanerSpec {
            high_dirty: 0.2,
            low_dirty: 0.1,
        }
    }
}

/// How to compute the LRU miss-ratio curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MrcSpec {
    pub method: MrcMethod,
    /// Histogram resolution in blocks (1 = exact at every size).
    pub bucket_blocks: u64,
}

impl Default for MrcSpec {
    /// [`MrcMethod::default`] (exact unless the trace has more than 50M
    /// distinct blocks), one-block resolution.
    fn default() -> Self {
        MrcSpec {
            method: MrcMethod::default(),
            bucket_blocks: 1,
        }
    }
}

/// What to simulate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimSpec {
    /// Cache block size in bytes (power of two, 4 KiB..1 MiB).
    pub block_size: u32,
    pub mode: CacheMode,
    /// Sequential bypass cutoff in bytes (0 disables).
    pub sequential_cutoff: u64,
    /// Cache sizes in bytes (rounded down to whole blocks).
    pub cache_sizes: Vec<u64>,
    pub policies: Vec<PolicyConfig>,
    pub device: DeviceModel,
    /// Requests in flight, for the IOPS prediction.
    pub queue_depth: u32,
    /// Writeback mode only; `None` never cleans.
    pub cleaner: Option<CleanerSpec>,
    /// Belady/OPT bound for every cache size; `None` skips it.
    pub opt: Option<OptVariant>,
    /// LRU miss-ratio curve; `None` skips it.
    pub mrc: Option<MrcSpec>,
    /// Worker threads; 0 = available parallelism.
    pub threads: usize,
    /// Stop as soon as every configuration's warm hit ratio has converged
    /// (see [`Convergence`]); `None` replays the whole input.
    #[serde(default)]
    pub converge: Option<Convergence>,
    /// Size of the origin device in bytes, when known (a synthetic
    /// workload's data): a write over its short last block then covers that
    /// block whole, as in the engine. `None`: unbounded (a trace).
    #[serde(default)]
    pub device_size: Option<u64>,
}

/// When a run may stop early because its answers no longer change: the
/// steady-state rule.
///
/// The stream is cut into windows of `window` requests (rounded up to whole
/// chunks of [`CHUNK`]). A configuration's window hit ratio is its block
/// hit ratio (reads and writes) over one window that began with its cache
/// already full. The run has converged at the end of a window when every
/// configuration that runs has at least `windows` such windows and its last
/// `windows` window hit ratios and its warm hit ratio so far (from the
/// moment its cache first became full) all lie within `tolerance` of each
/// other (max - min). A drift shows up as a gap between the recent windows
/// and the warm figure, noise as a spread between windows. The run also
/// stops at the end of the input (the IO bound of a synthetic workload) or
/// after `max_seconds` of replay, and then says it has not converged.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Convergence {
    /// Requests per window.
    pub window: u64,
    /// Windows that must agree.
    pub windows: u32,
    /// Largest spread of hit ratios (0..1) counted as agreement.
    pub tolerance: f64,
    /// Replay time bound in seconds.
    pub max_seconds: f64,
}

impl Default for Convergence {
    /// Windows of 2^20 requests, 3 of them, within 0.25 points, at most 45 s.
    fn default() -> Self {
        Convergence {
            window: 1 << 20,
            windows: 3,
            tolerance: 0.0025,
            max_seconds: 45.0,
        }
    }
}

impl Convergence {
    /// The rule in one sentence, for reports.
    pub fn describe(&self) -> String {
        format!(
            "stop when, for every configuration, the hit ratios of the last {} windows of {} requests (each begun with the cache full) and the warm hit ratio lie within {:.2} points of each other; at most {:.0} s of replay",
            self.windows,
            self.window_requests(),
            self.tolerance * 100.0,
            self.max_seconds
        )
    }

    /// `window` rounded up to whole chunks.
    pub fn window_requests(&self) -> u64 {
        self.window.max(1).div_ceil(CHUNK as u64) * CHUNK as u64
    }
}

impl Default for SimSpec {
    /// 4 KiB blocks, writethrough, the Director's default 4 MiB sequential
    /// cutoff, [`default_policies`], nvme/hdd at depth 8, OPT (bypass) and
    /// the MRC (exact, or SHARDS past 50M distinct blocks). `cache_sizes` is
    /// empty: the caller must set it.
    fn default() -> Self {
        SimSpec {
            block_size: 4096,
            mode: CacheMode::WriteThrough,
            sequential_cutoff: DirectorConfig::new(1, 4096).sequential_cutoff,
            cache_sizes: Vec::new(),
            policies: default_policies(),
            device: DeviceModel::default(),
            queue_depth: 8,
            cleaner: Some(CleanerSpec::default()),
            opt: Some(OptVariant::Bypass),
            mrc: Some(MrcSpec::default()),
            threads: 0,
            converge: None,
            device_size: None,
        }
    }
}

/// The default policy stack first, then every replacement policy with
/// `always` admission.
pub fn default_policies() -> Vec<PolicyConfig> {
    let mut v = vec![PolicyConfig::default()];
    for r in ReplacementKind::ALL {
        v.push(PolicyConfig {
            replacement: *r,
            admission: AdmissionKind::Always,
            ..PolicyConfig::default()
        });
    }
    let mut seen = Vec::new();
    v.retain(|p| {
        let new = !seen.contains(p);
        seen.push(p.clone());
        new
    });
    v
}

/// `replacement+admission`, e.g. `smq+hotspot`, `lru+always`.
pub fn policy_label(p: &PolicyConfig) -> String {
    p.to_string()
}

/// Parses `REPLACEMENT[+ADMISSION]` (admission defaults to `always`) or
/// `default` (the project's default stack).
pub fn parse_policy(s: &str) -> Result<PolicyConfig> {
    s.parse()
        .map_err(|e| Error::Config(format!("policy '{s}': {e}")))
}

/// Parses cache sizes as given on a command line: comma-separated sizes
/// (`256M,1G,10G`) and/or doubling ranges `A..B` (`1G..16G` = 1, 2, 4, 8,
/// 16 GiB; B included when reached), units as in
/// [`tiercache_types::parse_size`]. Sorted, duplicates removed.
pub fn parse_cache_sizes(s: &str) -> Result<Vec<u64>> {
    let size = |t: &str| {
        tiercache_types::parse_size(t).map_err(|e| Error::Config(format!("cache sizes '{s}': {e}")))
    };
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once("..") {
            Some((a, b)) => {
                let (mut x, hi) = (size(a)?, size(b)?);
                if x == 0 || x > hi {
                    return Err(Error::Config(format!(
                        "cache sizes '{s}': range {part} must go from a positive size up"
                    )));
                }
                while x <= hi {
                    out.push(x);
                    x = x.saturating_mul(2);
                }
            }
            None => out.push(size(part)?),
        }
    }
    if out.is_empty() {
        return Err(Error::Config(format!("cache sizes '{s}': no size given")));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A stream of requests for [`simulate`].
pub trait RequestSource {
    /// The next request, `None` at the end.
    fn next_request(&mut self) -> Option<Result<Request>>;
    /// Share of the input consumed (0..=1), if known.
    fn fraction_done(&self) -> Option<f64> {
        None
    }
    /// Whether request times are real timestamps rather than IO counters.
    fn has_timestamps(&self) -> bool {
        false
    }
}

impl RequestSource for TraceReader {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.next()
    }
    fn fraction_done(&self) -> Option<f64> {
        let (done, total) = self.progress_bytes();
        total
            .filter(|&t| t > 0)
            .map(|t| (done as f64 / t as f64).min(1.0))
    }
    fn has_timestamps(&self) -> bool {
        TraceReader::has_timestamps(self)
    }
}

impl RequestSource for crate::synth::Synthetic {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.next().map(Ok)
    }
    fn fraction_done(&self) -> Option<f64> {
        Some(crate::synth::Synthetic::fraction_done(self))
    }
}

/// Any iterator of requests (no progress fraction; times taken as IO
/// counters for reporting).
pub struct IterSource<I>(pub I);

impl<I: Iterator<Item = Request>> RequestSource for IterSource<I> {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.0.next().map(Ok)
    }
}

/// Stage of a run, for progress reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Replaying the requests.
    Replay,
    /// Computing OPT per cache size.
    Opt,
    Done,
}

/// A progress report: called after every chunk of requests and every OPT
/// size. `fraction` is the share of the phase done, when known.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    pub requests: u64,
    pub fraction: Option<f64>,
}

/// Latency percentiles of one configuration, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl LatencySummary {
    fn of(h: &LatencyHistogram) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.quantile(0.5)),
            p90_us: us(h.quantile(0.9)),
            p99_us: us(h.quantile(0.99)),
            p999_us: us(h.quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// The result of one (cache size, policy) configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigResult {
    /// `replacement+admission`.
    pub policy: String,
    pub policy_config: PolicyConfig,
    pub cache_bytes: u64,
    pub cache_blocks: u32,
    /// Set when the configuration could not run (e.g. policy unavailable);
    /// the numbers are then zero.
    pub error: Option<String>,
    pub counters: Counters,
    /// Read blocks served from the cache / read blocks.
    pub read_hit_ratio: f64,
    /// Written blocks that were cached / written blocks.
    pub write_hit_ratio: f64,
    /// 1 - (read + write hits) / (read + write blocks): comparable with OPT
    /// and the LRU MRC, which count every block reference.
    pub miss_ratio: f64,
    /// Writebacks done by the simulated cleaner.
    pub cleaner_writebacks: u64,
    pub latency: LatencySummary,
    /// Predicted IOPS at the spec's queue depth.
    pub iops: f64,
    /// What bounds `iops`: `latency`, `slow device` or `fast device`.
    pub iops_limited_by: String,
    /// Misses on blocks never referenced before (compulsory misses): the
    /// same for every configuration of a run, since no cache can hold a
    /// block it has not seen.
    pub first_touch_misses: u64,
    /// Figures counted from the moment the cache first became full; `None`
    /// when it never did.
    pub warm: Option<WarmResult>,
    /// Convergence runs: the hit ratios of the last windows begun with the
    /// cache full, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_hit_ratios: Vec<f64>,
}

/// The warm part of a run: from the request after the one that first filled
/// the cache to the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmResult {
    /// Requests replayed when the cache became full (that request included).
    pub filled_at_request: u64,
    /// Block references (reads and writes) in the warm part.
    pub block_refs: u64,
    pub hits: u64,
    /// `hits / block_refs` (0 when there were none).
    pub hit_ratio: f64,
    /// Misses in the warm part on blocks never referenced before.
    pub first_touch_misses: u64,
}

impl WarmResult {
    fn new(filled_at_request: u64, block_refs: u64, hits: u64, first_touch_misses: u64) -> Self {
        WarmResult {
            filled_at_request,
            block_refs,
            hits,
            hit_ratio: if block_refs == 0 {
                0.0
            } else {
                hits as f64 / block_refs as f64
            },
            first_touch_misses,
        }
    }
}

/// OPT at one cache size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptResult {
    pub cache_bytes: u64,
    pub cache_blocks: u64,
    pub variant: OptVariant,
    pub misses: u64,
    pub miss_ratio: f64,
    /// Misses on blocks never referenced before.
    pub first_touch_misses: u64,
    /// From the reference after the one that filled OPT's cache; `None`
    /// when it never filled. `filled_at_request` counts block references.
    pub warm: Option<WarmResult>,
}

/// The LRU miss-ratio curve in a report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MrcReport {
    pub method: String,
    /// Sampling rate used (1 for exact).
    pub sample_rate: f64,
    pub bucket_blocks: u64,
    /// Distinct blocks tracked (sampled ones for SHARDS).
    pub tracked_blocks: u64,
    /// `(cache_bytes, miss_ratio)` at the spec's cache sizes.
    pub at_sizes: Vec<(u64, f64)>,
    /// `(cache_bytes, miss_ratio)` over the whole range, for plotting.
    pub curve: Vec<(u64, f64)>,
    /// The full curve, for further queries (not serialized).
    #[serde(skip)]
    pub full: Option<Mrc>,
}

/// What the request stream looked like.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Zero-length requests (skipped).
    pub empty_requests: u64,
    /// Block references (requests split into cache blocks).
    pub block_refs: u64,
    /// Distinct blocks referenced.
    pub unique_blocks: Option<u64>,
    /// Time of the last request in seconds (virtual time).
    pub duration_s: f64,
    /// Whether requests carried timestamps; if not, time was the IO counter
    /// and `duration_s` means nothing.
    pub timestamps: bool,
}

/// Everything a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// What was simulated (trace path or workload description).
    pub source: String,
    pub spec: SimSpec,
    pub trace: TraceSummary,
    pub configs: Vec<ConfigResult>,
    pub opt: Vec<OptResult>,
    pub mrc: Option<MrcReport>,
    /// Wall-clock seconds the simulation took.
    pub elapsed_s: f64,
    pub notes: Vec<String>,
    /// Set when the spec asked to stop at convergence.
    #[serde(default)]
    pub convergence: Option<ConvergenceReport>,
}

/// How a run with [`SimSpec::converge`] ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConvergenceReport {
    /// The rule, in words.
    pub rule: String,
    pub converged: bool,
    /// Requests replayed.
    pub requests: u64,
    /// `converged`, `time bound`, or `end of input` (the IO bound).
    pub stopped_by: String,
}

// Plan classes, indexes into cost tables.
const HIT: u8 = 0;
const MISS: u8 = 1;
const PROMOTE: u8 = 2;
const BACKING: u8 = 3;
const THROUGH: u8 = 4;
const DIRTY: u8 = 5;

/// (uses fast device, uses slow device) per class.
const USES: [(bool, bool); 6] = [
    (true, false), // hit
    (false, true), // miss
    (true, true),  // promote
    (false, true), // backing
    (true, true),  // through
    (true, false), // dirty
];

/// One configuration being simulated: a [`Director`] plus the device model
/// and latency histogram. [`simulate`] runs many of these; it is public for
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
    cleaner: Option<CleanerSpec>,
    cleaner_writebacks: u64,
    /// Requests seen (zero-length ones included).
    requests: u64,
    /// (requests, hits, block refs) when the cache first became full.
    fill: Option<(u64, u64, u64)>,
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
            cleaner: spec.cleaner.filter(|_| spec.mode == CacheMode::WriteBack),
            cleaner_writebacks: 0,
            requests: 0,
            fill: None,
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
        let end = r.offset.saturating_add(r.len);
        let req = IoRequest {
            volume: VolumeId(0),
            offset: r.offset,
            len: r.len,
            access: r.access,
            volume_size: self.volume_size,
        };
        let (shift, bs) = (self.shift, self.bs);
        // Runs of blocks of one class are priced as one device IO each;
        // the plans are collected first (the director is busy planning).
        let classes = &mut self.classes;
        classes.clear();
        self.d.plan_io(&req, now, |b, _, plan| {
            let bstart = b << shift;
            let lo = r.offset.max(bstart);
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
        if let Some(c) = self.cleaner {
            if r.access == Access::Write {
                let n = c.to_clean(self.d.dirty_len() as u64, self.capacity);
                if n > 0 {
                    self.clean(n as usize);
                }
            }
        }
        if self.fill.is_none() {
            let rep = self.d.replacement();
            if rep.len() >= rep.capacity() {
                let (hits, refs) = self.hits_refs();
                self.fill = Some((self.requests, hits, refs));
            }
        }
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

    /// Writes dirty blocks back in origin order until at most `low` remain.
    /// Writes back `n` dirty blocks, the ones the engine would choose.
    fn clean(&mut self, n: usize) {
        let dirty = choose_writeback(self.d.dirty_blocks_unordered(), n);
        for (o, _) in dirty {
            self.d.mark_clean(o);
            self.cleaner_writebacks += 1;
            self.fast_busy += self.device.fast.busy_ns(self.bs) as u128;
            self.slow_busy += self.device.slow.busy_ns(self.bs) as u128;
        }
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
        }
    }
}

/// The block-level analysis: trace summary, dense ids (the seen-set that
/// counts first touches, and OPT's input), the MRC.
struct BlockTask {
    shift: u32,
    summary: TraceSummary,
    ids: IdMap,
    refs: Option<Vec<u32>>,
    mrc: Option<MrcBuilder>,
    exact: bool,
    /// Distinct blocks seen after each request of the current chunk.
    distinct_after: Vec<u64>,
}

impl BlockTask {
    fn process(&mut self, r: &Request) {
        self.process_blocks(r);
        self.distinct_after.push(self.ids.len() as u64);
    }

    fn process_blocks(&mut self, r: &Request) {
        let s = &mut self.summary;
        s.requests += 1;
        s.duration_s = r.time.as_secs_f64().max(s.duration_s);
        if r.len == 0 {
            s.empty_requests += 1;
            return;
        }
        match r.access {
            Access::Read => {
                s.reads += 1;
                s.read_bytes += r.len;
            }
            Access::Write => {
                s.writes += 1;
                s.write_bytes += r.len;
            }
        }
        let first = r.offset >> self.shift;
        let last = (r.offset.saturating_add(r.len) - 1) >> self.shift;
        s.block_refs += last - first + 1;
        for b in first..=last {
            let id = self.ids.get_or_insert(b).0;
            if let Some(v) = self.refs.as_mut() {
                v.push(id);
            }
            if let Some(m) = self.mrc.as_mut() {
                if self.exact {
                    m.access_dense(id)
                } else {
                    m.access(b)
                }
            }
        }
    }
}

enum Task {
    Config(Box<ConfigRunner>),
    Blocks(Box<BlockTask>),
}

impl Task {
    fn run(&mut self, chunk: &[Request]) {
        match self {
            Task::Config(r) => {
                for q in chunk {
                    r.process(q);
                }
            }
            Task::Blocks(b) => {
                b.distinct_after.clear();
                for q in chunk {
                    b.process(q);
                }
            }
        }
    }
}

fn read_chunk(src: &mut dyn RequestSource, out: &mut Vec<Request>) -> Result<()> {
    out.clear();
    while out.len() < CHUNK {
        match src.next_request() {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(())
}

fn threads_for(spec: &SimSpec, tasks: usize) -> usize {
    let t = if spec.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        spec.threads
    };
    t.clamp(1, tasks.max(1))
}

/// Replays `source` through every configuration of `spec`.
///
/// `progress` is called from the calling thread after each chunk of
/// [`CHUNK`] requests and after each OPT size. Configurations whose policy
/// cannot be built get a [`ConfigResult::error`] instead of failing the run;
/// an invalid spec (bad block size, no cache sizes) or a trace error fails
/// it.
pub fn simulate(
    source: &mut dyn RequestSource,
    source_name: &str,
    spec: &SimSpec,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<SimReport> {
    let started = std::time::Instant::now();
    let bs = spec.block_size;
    if !bs.is_power_of_two()
        || !(tiercache_types::MIN_BLOCK_SIZE..=tiercache_types::MAX_BLOCK_SIZE).contains(&bs)
    {
        return Err(Error::Config(format!(
            "block size {bs} must be a power of two between 4 KiB and 1 MiB"
        )));
    }
    if spec.cache_sizes.is_empty() {
        return Err(Error::Config("no cache sizes to simulate".into()));
    }
    let mut notes = Vec::new();
    let mut configs: Vec<Option<ConfigResult>> = Vec::new();
    let mut tasks: Vec<Mutex<Task>> = Vec::new();
    let mut config_slot: Vec<usize> = Vec::new();
    let exact = matches!(
        spec.mrc,
        Some(MrcSpec {
            method: MrcMethod::Exact,
            ..
        })
    );
    let block_task = BlockTask {
        shift: bs.trailing_zeros(),
        summary: TraceSummary::default(),
        ids: IdMap::default(),
        refs: spec.opt.is_some().then(Vec::new),
        mrc: spec.mrc.map(|m| MrcBuilder::new(m.method, m.bucket_blocks)),
        exact,
        distinct_after: Vec::with_capacity(CHUNK),
    };
    tasks.push(Mutex::new(Task::Blocks(Box::new(block_task))));
    for &size in &spec.cache_sizes {
        for p in &spec.policies {
            match ConfigRunner::new(spec, p, size) {
                Ok(r) => {
                    config_slot.push(configs.len());
                    configs.push(None);
                    tasks.push(Mutex::new(Task::Config(Box::new(r))));
                }
                Err(e) => configs.push(Some(ConfigResult {
                    policy: policy_label(p),
                    policy_config: p.clone(),
                    cache_bytes: size,
                    cache_blocks: (size / bs as u64).min(u32::MAX as u64) as u32,
                    error: Some(e),
                    counters: Counters::default(),
                    read_hit_ratio: 0.0,
                    write_hit_ratio: 0.0,
                    miss_ratio: 0.0,
                    cleaner_writebacks: 0,
                    latency: LatencySummary::default(),
                    iops: 0.0,
                    iops_limited_by: String::new(),
                    first_touch_misses: 0,
                    warm: None,
                    window_hit_ratios: Vec::new(),
                })),
            }
        }
    }
    let threads = threads_for(spec, tasks.len());
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut next = Vec::with_capacity(CHUNK);
    read_chunk(source, &mut chunk)?;
    let mut done: u64 = 0;
    // Per config task (index into `tasks`): distinct blocks seen when its
    // cache became full.
    let mut distinct_at_fill: Vec<Option<u64>> = vec![None; tasks.len()];
    let mut conv = spec.converge.map(|c| ConvergeState::new(c, tasks.len()));
    let mut stopped_by = "end of input";
    // (requests, distinct blocks) after each chunk.
    let mut distinct_hist: Vec<(u64, u64)> = Vec::new();
    while !chunk.is_empty() {
        let counter = AtomicUsize::new(0);
        let read = std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = counter.fetch_add(1, Ordering::Relaxed);
                    if i >= tasks.len() {
                        break;
                    }
                    tasks[i].lock().expect("task lock").run(&chunk);
                });
            }
            read_chunk(source, &mut next)
        });
        read?;
        let chunk_start = done;
        done += chunk.len() as u64;
        note_fills(
            &tasks,
            chunk_start,
            &mut distinct_at_fill,
            &mut distinct_hist,
        );
        std::mem::swap(&mut chunk, &mut next);
        let mut fraction = source.fraction_done();
        if let Some(c) = conv.as_ref() {
            // The time bound usually comes first.
            let t = (started.elapsed().as_secs_f64() / c.spec.max_seconds).min(1.0);
            fraction = Some(fraction.map_or(t, |f| f.max(t)));
        }
        progress(&Progress {
            phase: Phase::Replay,
            requests: done,
            fraction,
        });
        if let Some(c) = conv.as_mut() {
            if c.check(&tasks, done) {
                stopped_by = "converged";
                break;
            }
            if !chunk.is_empty() && started.elapsed().as_secs_f64() >= c.spec.max_seconds {
                stopped_by = "time bound";
                break;
            }
        }
    }

    let replay_s = started.elapsed().as_secs_f64();
    // Collect per-config results and the block task.
    let mut tasks = tasks
        .into_iter()
        .map(|m| m.into_inner().expect("task lock"));
    let Some(Task::Blocks(blocks)) = tasks.next() else {
        unreachable!("the block task is first")
    };
    let BlockTask {
        mut summary,
        ids,
        refs,
        mrc,
        ..
    } = *blocks;
    let distinct = ids.len() as u64;
    for (i, (task, slot)) in tasks.zip(config_slot).enumerate() {
        if let Task::Config(r) = task {
            let mut res = r.result(spec.queue_depth);
            res.first_touch_misses = distinct;
            if let (Some(w), Some(d)) = (res.warm.as_mut(), distinct_at_fill[i + 1]) {
                w.first_touch_misses = distinct - d;
            }
            if let Some(c) = conv.as_ref() {
                res.window_hit_ratios = c.windows[i + 1].iter().copied().collect();
            }
            configs[slot] = Some(res);
        }
    }
    summary.unique_blocks = Some(distinct);
    summary.timestamps = source.has_timestamps();
    if !summary.timestamps {
        summary.duration_s = 0.0;
    }

    // OPT per size, in parallel.
    let mut opt = Vec::new();
    if let (Some(variant), Some(refs)) = (spec.opt, refs) {
        if refs.len() >= u32::MAX as usize {
            notes.push("OPT skipped: 2^32 or more block references".into());
        } else {
            let n_ids = ids.len() as usize;
            let next_use = next_uses(&refs, n_ids);
            let sizes: Vec<u64> = spec.cache_sizes.clone();
            let results: Vec<Mutex<Option<OptRun>>> =
                sizes.iter().map(|_| Mutex::new(None)).collect();
            let counter = AtomicUsize::new(0);
            let finished = AtomicUsize::new(0);
            let threads = threads_for(spec, sizes.len());
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| loop {
                        let i = counter.fetch_add(1, Ordering::Relaxed);
                        if i >= sizes.len() {
                            break;
                        }
                        let m = opt_run(&refs, &next_use, n_ids, sizes[i] / bs as u64, variant);
                        *results[i].lock().expect("opt lock") = Some(m);
                        finished.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
            progress(&Progress {
                phase: Phase::Opt,
                requests: done,
                fraction: Some(finished.load(Ordering::Relaxed) as f64 / sizes.len().max(1) as f64),
            });
            for (size, m) in sizes.iter().zip(results) {
                let run = m.into_inner().expect("opt lock").unwrap_or_default();
                let misses = run.misses;
                let n = refs.len() as u64;
                opt.push(OptResult {
                    cache_bytes: *size,
                    cache_blocks: size / bs as u64,
                    variant,
                    misses,
                    miss_ratio: if refs.is_empty() {
                        0.0
                    } else {
                        misses as f64 / refs.len() as f64
                    },
                    first_touch_misses: distinct,
                    warm: run.fill.map(|f| {
                        let warm_refs = n - f.refs;
                        WarmResult::new(
                            f.refs,
                            warm_refs,
                            warm_refs - (misses - f.misses),
                            distinct - f.distinct,
                        )
                    }),
                });
            }
        }
    }

    let mrc = mrc.map(|b| {
        let m = b.finish();
        let bsz = bs as u64;
        let mut curve: Vec<(u64, f64)> = m
            .curve(200)
            .into_iter()
            .map(|(c, r)| (c * bsz, r))
            .collect();
        // Make sure the plotted range covers the simulated sizes.
        for &s in &spec.cache_sizes {
            curve.push((s, m.miss_ratio(s / bsz)));
        }
        curve.sort_by_key(|x| x.0);
        curve.dedup_by_key(|x| x.0);
        MrcReport {
            method: m.method.label(),
            sample_rate: m.sample_rate,
            bucket_blocks: m.bucket_blocks,
            tracked_blocks: m.tracked_blocks,
            at_sizes: spec
                .cache_sizes
                .iter()
                .map(|&s| (s, m.miss_ratio(s / bsz)))
                .collect(),
            curve,
            full: Some(m),
        }
    });
    let configs: Vec<ConfigResult> = configs
        .into_iter()
        .map(|c| c.expect("every config ran"))
        .collect();
    notes.extend(fill_notes(
        spec,
        &configs,
        distinct,
        &distinct_hist,
        done as f64 / replay_s.max(1e-9),
    ));
    if let Some(c) = conv.as_ref() {
        notes.push(convergence_note(c, stopped_by, done, &configs));
    }
    if spec.mode == CacheMode::WriteBack && spec.cleaner.is_none() {
        notes.push("writeback without a cleaner: dirty blocks are never written back".into());
    }
    progress(&Progress {
        phase: Phase::Done,
        requests: done,
        fraction: Some(1.0),
    });
    Ok(SimReport {
        source: source_name.to_string(),
        spec: spec.clone(),
        trace: summary,
        configs,
        opt,
        mrc,
        elapsed_s: started.elapsed().as_secs_f64(),
        notes,
        convergence: conv.map(|c| ConvergenceReport {
            rule: c.spec.describe(),
            converged: stopped_by == "converged",
            requests: done,
            stopped_by: stopped_by.to_string(),
        }),
    })
}

/// Records, for configurations whose cache became full during the chunk
/// just replayed (it began at request `chunk_start`), how many distinct
/// blocks had been seen by then.
fn note_fills(
    tasks: &[Mutex<Task>],
    chunk_start: u64,
    distinct_at_fill: &mut [Option<u64>],
    distinct_hist: &mut Vec<(u64, u64)>,
) {
    let blocks = tasks[0].lock().expect("task lock");
    let Task::Blocks(b) = &*blocks else {
        unreachable!("the block task is first")
    };
    distinct_hist.push((
        chunk_start + b.distinct_after.len() as u64,
        b.ids.len() as u64,
    ));
    for (i, t) in tasks.iter().enumerate().skip(1) {
        if distinct_at_fill[i].is_some() {
            continue;
        }
        if let Task::Config(r) = &*t.lock().expect("task lock") {
            if let Some(at) = r.filled_at() {
                let idx = (at - chunk_start) as usize - 1;
                distinct_at_fill[i] = b.distinct_after.get(idx).copied();
            }
        }
    }
}

/// Window bookkeeping for [`Convergence`].
struct ConvergeState {
    spec: Convergence,
    window: u64,
    /// Per task: (hits, refs) at the start of the current window, if the
    /// cache was full then.
    start: Vec<Option<(u64, u64)>>,
    /// Per task: the last `windows` window hit ratios.
    windows: Vec<std::collections::VecDeque<f64>>,
}

impl ConvergeState {
    fn new(spec: Convergence, tasks: usize) -> Self {
        ConvergeState {
            spec,
            window: spec.window_requests(),
            start: vec![None; tasks],
            windows: vec![Default::default(); tasks],
        }
    }

    /// At a window boundary, records the window just ended and says
    /// whether every configuration has converged.
    fn check(&mut self, tasks: &[Mutex<Task>], done: u64) -> bool {
        if done.checked_rem(self.window) != Some(0) {
            return false;
        }
        let k = self.spec.windows.max(1) as usize;
        let mut all = true;
        for (i, t) in tasks.iter().enumerate().skip(1) {
            let Task::Config(r) = &*t.lock().expect("task lock") else {
                continue;
            };
            let (h, n) = r.hits_refs();
            if let Some((h0, n0)) = self.start[i] {
                let w = &mut self.windows[i];
                w.push_back(if n > n0 {
                    (h - h0) as f64 / (n - n0) as f64
                } else {
                    0.0
                });
                if w.len() > k {
                    w.pop_front();
                }
            }
            self.start[i] = r.filled_at().map(|_| (h, n));
            let w = &self.windows[i];
            let ok = w.len() == k
                && r.warm_hit_ratio().is_some_and(|warm| {
                    let lo = w.iter().copied().fold(warm, f64::min);
                    let hi = w.iter().copied().fold(warm, f64::max);
                    hi - lo <= self.spec.tolerance
                });
            all &= ok;
        }
        all
    }
}

/// Requests after which `target` distinct blocks would have been seen, by
/// a power law fitted to the distinct-block counts at half the run and at
/// its end; `None` when the growth has (nearly) stopped.
pub fn requests_to_reach(hist: &[(u64, u64)], target: u64) -> Option<u64> {
    let &(n1, d1) = hist.last()?;
    let &(n0, d0) = hist.iter().find(|h| h.0 * 2 >= n1)?;
    if n0 == 0 || d0 == 0 || n0 >= n1 || d1 <= d0 {
        return None;
    }
    let a = (d1 as f64 / d0 as f64).ln() / (n1 as f64 / n0 as f64).ln();
    if a < 0.02 {
        return None;
    }
    let n = n1 as f64 * (target as f64 / d1 as f64).powf(1.0 / a);
    (n.is_finite() && n < 1e18).then_some(n as u64)
}

/// Notes for caches that never became full: their figures are cold-start
/// figures. One note per cache size when no configuration of it filled,
/// per configuration otherwise.
fn fill_notes(
    spec: &SimSpec,
    configs: &[ConfigResult],
    distinct: u64,
    hist: &[(u64, u64)],
    requests_per_s: f64,
) -> Vec<String> {
    use crate::report::{fmt_bytes, fmt_count};
    let bs = spec.block_size as u64;
    let mut notes = Vec::new();
    let mut sizes = spec.cache_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let of_size: Vec<&ConfigResult> = configs
            .iter()
            .filter(|c| c.cache_bytes == size && c.error.is_none())
            .collect();
        let unfilled: Vec<&&ConfigResult> = of_size.iter().filter(|c| c.warm.is_none()).collect();
        if unfilled.is_empty() {
            continue;
        }
        let blocks = size / bs;
        if distinct < blocks {
            let mut n = format!(
                "{}: cache never filled: the input touches only {} of its {} blocks ({} of {}); hit ratios are cold-start figures",
                fmt_bytes(size),
                fmt_count(distinct),
                fmt_count(blocks),
                fmt_bytes(distinct * bs),
                fmt_bytes(size)
            );
            if let Some(r) = requests_to_reach(hist, blocks) {
                let _ = std::fmt::Write::write_fmt(
                    &mut n,
                    format_args!(
                        " (at this input's rate of new blocks, filling it takes about {} requests, about {:.0} s of replay at this run's speed)",
                        fmt_count(r),
                        r as f64 / requests_per_s
                    ),
                );
            }
            notes.push(n);
        } else {
            for c in unfilled {
                notes.push(format!(
                    "{} {}: cache never filled ({} of {} blocks resident at the end); hit ratios are cold-start figures",
                    fmt_bytes(size),
                    c.policy,
                    fmt_count(c.counters.resident),
                    fmt_count(blocks)
                ));
            }
        }
    }
    notes
}

fn convergence_note(
    c: &ConvergeState,
    stopped_by: &str,
    done: u64,
    configs: &[ConfigResult],
) -> String {
    use crate::report::fmt_count;
    if stopped_by == "converged" {
        return format!(
            "steady state: converged after {} requests ({})",
            fmt_count(done),
            c.spec.describe()
        );
    }
    let unsettled: Vec<String> = configs
        .iter()
        .filter(|r| r.error.is_none())
        .filter(|r| {
            let w = &r.window_hit_ratios;
            match r.warm {
                None => true,
                Some(warm) => {
                    w.len() < c.spec.windows.max(1) as usize || {
                        let lo = w.iter().copied().fold(warm.hit_ratio, f64::min);
                        let hi = w.iter().copied().fold(warm.hit_ratio, f64::max);
                        hi - lo > c.spec.tolerance
                    }
                }
            }
        })
        .map(|r| format!("{} {}", crate::report::fmt_bytes(r.cache_bytes), r.policy))
        .collect();
    format!(
        "NOT CONVERGED: stopped by the {} after {} requests; not yet steady: {}; the warm figures of these are not steady-state answers (rule: {})",
        if stopped_by == "time bound" {
            "time bound"
        } else {
            "IO bound"
        },
        fmt_count(done),
        if unsettled.len() > 8 {
            format!("{} configurations, e.g. {}", unsettled.len(), unsettled[..4].join(", "))
        } else {
            unsettled.join(", ")
        },
        c.spec.describe()
    )
}
