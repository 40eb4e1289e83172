//! What a run simulates: [`SimSpec`] and its parts, and the parsers of
//! the policy and cache-size lists the command line gives.

use super::CHUNK;
use crate::device::DeviceModel;
use crate::error::{Error, Result};
use crate::mrc::MrcMethod;
use crate::opt::OptVariant;
use serde::{Deserialize, Serialize};
use tiercache_policy::writeback::CleanerConfig;
use tiercache_policy::{DirectorConfig, PolicyConfig};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

/// The writeback cleaner: the engine's own pacing (the policy crate's
/// [`RateController`](tiercache_policy::writeback::RateController): bcache's PI controller on the dirty share, and
/// everything written back once the devices are idle), on the simulator's
/// clock.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CleanerSpec {
    /// Dirty share of the cache to aim for (0..1).
    pub target_dirty: f64,
    /// A gap of this many milliseconds between two requests of a
    /// timestamped trace counts as idle: every dirty block is written
    /// back before the next request (the engine's `--writeback-idle-after`).
    pub idle_after_ms: u64,
}

impl CleanerSpec {
    /// The engine's cleaner settings with this target and idle time.
    pub fn config(&self) -> CleanerConfig {
        CleanerConfig {
            target_dirty: self.target_dirty,
            idle_after: std::time::Duration::from_millis(self.idle_after_ms),
            ..CleanerConfig::default()
        }
    }
}

impl Default for CleanerSpec {
    /// The engine's defaults (bcache's `writeback_percent` is 10).
    fn default() -> Self {
        let c = CleanerConfig::default();
        CleanerSpec {
            target_dirty: c.target_dirty,
            idle_after_ms: c.idle_after.as_millis() as u64,
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
    /// Replay a multi-volume trace as a pool: each volume (the address
    /// range `i << VOLUME_SHIFT` its reader gives it) is its own volume of
    /// the director, with its own sequential detector, sharing the cache
    /// as the engine's pool does; results then list every volume.
    #[serde(default)]
    pub pool: bool,
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
            pool: false,
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
