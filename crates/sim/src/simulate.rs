//! The simulation driver: replays a request stream through many
//! (cache size, policy) configurations of the [`Director`] at once, plus the
//! offline bounds (OPT) and the LRU miss-ratio curve.
//!
//! Each configuration does exactly what the live engine does per IO, with
//! a virtual clock (the request's time) and no device IO:
//! `begin(offset, len, access, time)`, then `plan_read` or `plan_write`
//! for every block the request touches (`full_block` = the request covers
//! the whole block), then `finish`. The plans are priced by the
//! [`DeviceModel`](crate::device::DeviceModel).
//!
//! Writeback mode: a simple cleaner (if enabled) writes dirty blocks back in
//! origin order whenever more than `high_dirty` of the cache is dirty, down
//! to `low_dirty`, like a bcache-style writeback target. Writebacks are
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
use crate::opt::{next_uses, opt_misses, OptVariant};
use crate::trace::{Request, TraceReader};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tiercache_policy::director::{ReadPlan, WritePlan};
use tiercache_policy::{Counters, Director, DirectorConfig, PolicyConfig};
use tiercache_types::{Access, AdmissionKind, CacheMode, OriginBlock, ReplacementKind};

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
}

/// OPT at one cache size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptResult {
    pub cache_bytes: u64,
    pub cache_blocks: u64,
    pub variant: OptVariant,
    pub misses: u64,
    pub miss_ratio: f64,
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
    /// Distinct blocks referenced (known when OPT or an exact MRC ran).
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
}

// Plan classes, indexes into cost tables.
const HIT: u8 = 0;
const MISS: u8 = 1;
const PROMOTE: u8 = 2;
const BACKING: u8 = 3;
const THROUGH: u8 = 4;
const DIRTY: u8 = 5;
const NO_RUN: u8 = u8::MAX;

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
    device: DeviceModel,
    hist: LatencyHistogram,
    /// Latency / busy time of a one-block IO per class (the common case).
    lat_block: [u64; 6],
    fast_busy_block: [u64; 6],
    slow_busy_block: [u64; 6],
    fast_busy: u128,
    slow_busy: u128,
    cleaner: Option<(u32, u32)>,
    cleaner_writebacks: u64,
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
            device: spec.device.clone(),
            hist: LatencyHistogram::new(),
            lat_block: [0; 6],
            fast_busy_block: [0; 6],
            slow_busy_block: [0; 6],
            fast_busy: 0,
            slow_busy: 0,
            cleaner: match (spec.mode, spec.cleaner) {
                (CacheMode::WriteBack, Some(c)) => Some((
                    (c.high_dirty.clamp(0.0, 1.0) * capacity as f64) as u32,
                    (c.low_dirty.clamp(0.0, 1.0) * capacity as f64) as u32,
                )),
                _ => None,
            },
            cleaner_writebacks: 0,
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
        if r.len == 0 {
            return;
        }
        let now = r.time;
        let end = r.offset.saturating_add(r.len);
        let mut io = self.d.begin(r.offset, r.len, r.access, now);
        let first = r.offset >> self.shift;
        let last = (end - 1) >> self.shift;
        let mut run = NO_RUN;
        let mut run_bytes = 0u64;
        let mut lat = 0u64;
        for b in first..=last {
            let bstart = b << self.shift;
            let bend = bstart.saturating_add(self.bs);
            let lo = r.offset.max(bstart);
            let hi = end.min(bend);
            let class = match r.access {
                Access::Read => match self.d.plan_read(&mut io, OriginBlock(b), now) {
                    ReadPlan::Hit(_) => HIT,
                    ReadPlan::Miss => MISS,
                    ReadPlan::Promote(_) => PROMOTE,
                },
                Access::Write => {
                    let full = lo == bstart && hi == bend;
                    match self.d.plan_write(&mut io, OriginBlock(b), full, now) {
                        WritePlan::Backing => BACKING,
                        WritePlan::Through { .. } => THROUGH,
                        WritePlan::Dirty { .. } => DIRTY,
                    }
                }
            };
            if class == run {
                run_bytes += hi - lo;
            } else {
                if run != NO_RUN {
                    lat += self.run_cost(run, run_bytes);
                }
                run = class;
                run_bytes = hi - lo;
            }
        }
        lat += self.run_cost(run, run_bytes);
        self.d.finish(io);
        self.hist.record(lat);
        if let Some((high, low)) = self.cleaner {
            if r.access == Access::Write && self.d.replacement().dirty_len() > high {
                self.clean(low);
            }
        }
    }

    /// Writes dirty blocks back in origin order until at most `low` remain.
    fn clean(&mut self, low: u32) {
        let dirty = self.d.dirty_blocks();
        let excess = dirty.len().saturating_sub(low as usize);
        for (o, _) in dirty.into_iter().take(excess) {
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
        }
    }
}

/// The block-level analysis: trace summary, dense ids for OPT, the MRC.
struct BlockTask {
    shift: u32,
    summary: TraceSummary,
    ids: Option<IdMap>,
    refs: Option<Vec<u32>>,
    mrc: Option<MrcBuilder>,
    exact: bool,
}

impl BlockTask {
    fn process(&mut self, r: &Request) {
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
            let id = self.ids.as_mut().map(|m| m.get_or_insert(b).0);
            if let (Some(v), Some(id)) = (self.refs.as_mut(), id) {
                v.push(id);
            }
            if let Some(m) = self.mrc.as_mut() {
                match (self.exact, id) {
                    (true, Some(id)) => m.access_dense(id),
                    _ => m.access(b),
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
        ids: (spec.opt.is_some() || exact).then(IdMap::default),
        refs: spec.opt.is_some().then(Vec::new),
        mrc: spec.mrc.map(|m| MrcBuilder::new(m.method, m.bucket_blocks)),
        exact,
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
                })),
            }
        }
    }
    let threads = threads_for(spec, tasks.len());
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut next = Vec::with_capacity(CHUNK);
    read_chunk(source, &mut chunk)?;
    let mut done: u64 = 0;
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
        done += chunk.len() as u64;
        std::mem::swap(&mut chunk, &mut next);
        progress(&Progress {
            phase: Phase::Replay,
            requests: done,
            fraction: source.fraction_done(),
        });
    }

    // Collect per-config results and the block task.
    let mut tasks = tasks
        .into_iter()
        .map(|m| m.into_inner().expect("task lock"));
    let Some(Task::Blocks(blocks)) = tasks.next() else {
        unreachable!("the block task is first")
    };
    for (task, slot) in tasks.zip(config_slot) {
        if let Task::Config(r) = task {
            configs[slot] = Some(r.result(spec.queue_depth));
        }
    }
    let BlockTask {
        mut summary,
        ids,
        refs,
        mrc,
        ..
    } = *blocks;
    summary.unique_blocks = ids.as_ref().map(|m| m.len() as u64);
    summary.timestamps = source.has_timestamps();
    if !summary.timestamps {
        summary.duration_s = 0.0;
    }

    // OPT per size, in parallel.
    let mut opt = Vec::new();
    if let (Some(variant), Some(refs), Some(ids)) = (spec.opt, refs, ids.as_ref()) {
        if refs.len() >= u32::MAX as usize {
            notes.push("OPT skipped: 2^32 or more block references".into());
        } else {
            let n_ids = ids.len() as usize;
            let next_use = next_uses(&refs, n_ids);
            let sizes: Vec<u64> = spec.cache_sizes.clone();
            let results: Vec<Mutex<Option<u64>>> = sizes.iter().map(|_| Mutex::new(None)).collect();
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
                        let m = opt_misses(&refs, &next_use, n_ids, sizes[i] / bs as u64, variant);
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
                let misses = m.into_inner().expect("opt lock").unwrap_or(0);
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
        configs: configs
            .into_iter()
            .map(|c| c.expect("every config ran"))
            .collect(),
        opt,
        mrc,
        elapsed_s: started.elapsed().as_secs_f64(),
        notes,
    })
}
