//! What a run reports: per-configuration results, the trace summary, OPT,
//! the MRC and the convergence verdict, and the progress events.

use super::spec::SimSpec;
use crate::device::LatencyHistogram;
use crate::mrc::Mrc;
use crate::opt::OptVariant;
use serde::{Deserialize, Serialize};
use tiercache_policy::{Counters, PolicyConfig};

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
    pub(super) fn of(h: &LatencyHistogram) -> Self {
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
    /// A pool's volumes (see [`SimSpec::pool`]), by volume index; empty
    /// otherwise.
    #[serde(default)]
    pub volumes: Vec<VolumeResult>,
}

/// One volume of a pooled replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeResult {
    /// The volume's index in the trace (its address range's number).
    pub volume: u16,
    pub counters: Counters,
    /// Read blocks served from the cache / read blocks.
    pub read_hit_ratio: f64,
    /// Blocks the sharing gives the volume at the end, if it set targets.
    pub target_blocks: Option<u64>,
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
    pub(super) fn new(
        filled_at_request: u64,
        block_refs: u64,
        hits: u64,
        first_touch_misses: u64,
    ) -> Self {
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
    /// A multi-volume trace replayed as a pool against static splits
    /// (`tiercache sim --pool`), per cache size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool: Vec<PoolSplit>,
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

/// Shared against static splits for one cache size and policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolSplit {
    pub cache_bytes: u64,
    pub policy: String,
    /// Volumes with at least one request.
    pub volumes: usize,
    /// Block references (reads and writes) of all volumes.
    pub block_refs: u64,
    /// Block hits of the shared cache.
    pub shared_hits: u64,
    /// Block hits of the best static split found.
    pub best_static_hits: u64,
    /// Block hits with every volume given the same slice.
    pub equal_hits: u64,
    /// The best static split: (volume, blocks), volumes given none left out.
    pub best_split: Vec<(u16, u64)>,
    /// Every volume of the shared replay.
    pub shared_volumes: Vec<VolumeResult>,
    /// Every volume's hit curve, replayed alone through the same policy.
    pub curves: Vec<VolumeCurve>,
}

/// One volume's hit curve in a [`PoolSplit`]: its own requests replayed
/// alone through the policy at slice sizes a quarter apart.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VolumeCurve {
    pub volume: u16,
    pub requests: u64,
    /// (slice blocks, block hits), from (0, 0) to the volume's footprint
    /// or the cache, whichever is smaller.
    pub points: Vec<(u64, u64)>,
}

impl PoolSplit {
    fn ratio(&self, hits: u64) -> f64 {
        if self.block_refs == 0 {
            0.0
        } else {
            hits as f64 / self.block_refs as f64
        }
    }
    pub fn shared_hit_ratio(&self) -> f64 {
        self.ratio(self.shared_hits)
    }
    pub fn best_static_hit_ratio(&self) -> f64 {
        self.ratio(self.best_static_hits)
    }
    pub fn equal_hit_ratio(&self) -> f64 {
        self.ratio(self.equal_hits)
    }
}
