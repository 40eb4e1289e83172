//! Statistics: a snapshot cheap enough to take while IO runs, as a struct,
//! JSON (serde) or Prometheus text.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use tiercache_policy::Counters;
use tiercache_types::CacheMode;

/// Byte and error counters the engine keeps outside the director.
#[derive(Default)]
pub(crate) struct IoCounters {
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub read_hit_bytes: AtomicU64,
    pub cache_read_errors: AtomicU64,
    pub cache_write_errors: AtomicU64,
    pub backing_read_errors: AtomicU64,
    pub backing_write_errors: AtomicU64,
    pub writeback_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
}

impl IoCounters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// A point-in-time view of the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    pub mode: CacheMode,
    pub policy: String,
    pub block_size: u32,
    pub sequential_cutoff: u64,
    /// "ok", or `"failed: <reason>"` once the cache device was taken out of use.
    pub cache_state: String,
    pub backing_bytes: u64,
    pub decisions: Counters,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_hit_bytes: u64,
    pub writeback_bytes: u64,
    pub cache_read_errors: u64,
    pub cache_write_errors: u64,
    pub backing_read_errors: u64,
    pub backing_write_errors: u64,
    pub flushes: u64,
    pub trims: u64,
    /// The request recorder (`tiercache trace`): the current recording's
    /// counters, or the last one's; `None` if none ever ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::TraceStats>,
    /// In a pool of more than one volume, each volume's own counters (the
    /// fields above are the pool's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStats>,
}

/// One volume's counters in [`EngineStats::volumes`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeStats {
    pub id: u16,
    pub name: String,
    pub stats: EngineStats,
    /// Its place in the shared cache.
    #[serde(default)]
    pub sharing: SharingStats,
}

/// A volume's place in the pool's shared cache (see the policy crate's
/// `sharing.rs`): its limits, the blocks the sharing gives it now, and
/// what more space would be worth to it, read off its live hit curve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SharingStats {
    /// Guaranteed blocks.
    pub share_blocks: u64,
    /// Most blocks it may hold.
    pub cap_blocks: Option<u64>,
    /// Blocks the sharing gives it now (None before the first setting).
    pub target_blocks: Option<u64>,
    /// The extra blocks `gain` is for: a quarter of the cache.
    pub more_blocks: u64,
    /// Share of its block references (0..1) that `more_blocks` more would
    /// turn from misses into hits (None while no curve is kept).
    pub gain: Option<f64>,
}

impl EngineStats {
    pub(crate) fn io_part(io: &IoCounters) -> [u64; 10] {
        [
            IoCounters::get(&io.read_bytes),
            IoCounters::get(&io.write_bytes),
            IoCounters::get(&io.read_hit_bytes),
            IoCounters::get(&io.writeback_bytes),
            IoCounters::get(&io.cache_read_errors),
            IoCounters::get(&io.cache_write_errors),
            IoCounters::get(&io.backing_read_errors),
            IoCounters::get(&io.backing_write_errors),
            IoCounters::get(&io.flushes),
            IoCounters::get(&io.trims),
        ]
    }

    /// Share of the cache in use (0..=1).
    pub fn occupancy(&self) -> f64 {
        if self.decisions.capacity == 0 {
            0.0
        } else {
            self.decisions.resident as f64 / self.decisions.capacity as f64
        }
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        // One family per metric: the pool's sample, then each volume's,
        // labelled `volume="NAME"`.
        let mut metric =
            |name: &str, kind: &str, help: &str, value: &dyn Fn(&EngineStats) -> f64| {
                let _ = writeln!(out, "# HELP tiercache_{name} {help}");
                let _ = writeln!(out, "# TYPE tiercache_{name} {kind}");
                let _ = writeln!(out, "tiercache_{name} {}", value(self));
                for v in &self.volumes {
                    let _ = writeln!(
                        out,
                        "tiercache_{name}{{volume=\"{}\"}} {}",
                        v.name,
                        value(&v.stats)
                    );
                }
            };
        metric(
            "read_hits_total",
            "counter",
            "Read blocks served from the cache.",
            &|s: &EngineStats| s.decisions.read_hits as f64,
        );
        metric(
            "read_misses_total",
            "counter",
            "Read blocks served from the backing device.",
            &|s: &EngineStats| s.decisions.read_misses as f64,
        );
        metric(
            "write_hits_total",
            "counter",
            "Written blocks that were cached.",
            &|s: &EngineStats| s.decisions.write_hits as f64,
        );
        metric(
            "write_misses_total",
            "counter",
            "Written blocks that were not cached.",
            &|s: &EngineStats| s.decisions.write_misses as f64,
        );
        metric(
            "read_partial_hit_ios_total",
            "counter",
            "Read IOs partly served from the cache.",
            &|s: &EngineStats| s.decisions.read_partial_hit_ios as f64,
        );
        metric(
            "promotions_total",
            "counter",
            "Blocks brought into the cache.",
            &|s: &EngineStats| s.decisions.promotions as f64,
        );
        metric(
            "declined_fills_total",
            "counter",
            "Missed blocks the policy chose not to bring into the cache (rarely hit kinds of requests).",
            &|s: &EngineStats| s.decisions.declined_fills as f64,
        );
        metric(
            "demotions_total",
            "counter",
            "Clean blocks evicted from the cache.",
            &|s: &EngineStats| s.decisions.demotions as f64,
        );
        metric(
            "writebacks_total",
            "counter",
            "Dirty blocks written back.",
            &|s: &EngineStats| s.decisions.writebacks as f64,
        );
        metric(
            "invalidations_total",
            "counter",
            "Blocks dropped from the cache.",
            &|s: &EngineStats| s.decisions.invalidations as f64,
        );
        metric(
            "bypassed_ios_total",
            "counter",
            "IOs that bypassed the cache.",
            &|s: &EngineStats| s.decisions.bypassed_ios as f64,
        );
        metric(
            "bypassed_bytes_total",
            "counter",
            "Bytes that bypassed the cache.",
            &|s: &EngineStats| s.decisions.bypassed_bytes as f64,
        );
        metric(
            "resident_blocks",
            "gauge",
            "Blocks in the cache.",
            &|s: &EngineStats| s.decisions.resident as f64,
        );
        metric(
            "dirty_blocks",
            "gauge",
            "Dirty blocks in the cache.",
            &|s: &EngineStats| s.decisions.dirty as f64,
        );
        metric(
            "capacity_blocks",
            "gauge",
            "Cache size in blocks.",
            &|s: &EngineStats| s.decisions.capacity as f64,
        );
        metric(
            "read_bytes_total",
            "counter",
            "Bytes read by clients.",
            &|s: &EngineStats| s.read_bytes as f64,
        );
        metric(
            "write_bytes_total",
            "counter",
            "Bytes written by clients.",
            &|s: &EngineStats| s.write_bytes as f64,
        );
        metric(
            "writeback_bytes_total",
            "counter",
            "Bytes written back to the backing device.",
            &|s: &EngineStats| s.writeback_bytes as f64,
        );
        metric(
            "cache_read_errors_total",
            "counter",
            "Failed reads of the cache device.",
            &|s: &EngineStats| s.cache_read_errors as f64,
        );
        metric(
            "cache_write_errors_total",
            "counter",
            "Failed writes of the cache device.",
            &|s: &EngineStats| s.cache_write_errors as f64,
        );
        metric(
            "backing_read_errors_total",
            "counter",
            "Failed reads of the backing device.",
            &|s: &EngineStats| s.backing_read_errors as f64,
        );
        metric(
            "backing_write_errors_total",
            "counter",
            "Failed writes of the backing device.",
            &|s: &EngineStats| s.backing_write_errors as f64,
        );
        metric(
            "cache_failed",
            "gauge",
            "1 when the cache device was taken out of use.",
            &|s: &EngineStats| if s.cache_state == "ok" { 0.0 } else { 1.0 },
        );
        metric(
            "read_hit_ratio",
            "gauge",
            "Share of read blocks served from the cache.",
            &|s: &EngineStats| s.decisions.read_hit_ratio(),
        );
        // Sharing: per volume only.
        let mut volume_metric =
            |name: &str, help: &str, value: &dyn Fn(&SharingStats) -> Option<f64>| {
                let samples: Vec<_> = self
                    .volumes
                    .iter()
                    .filter_map(|v| Some((&v.name, value(&v.sharing)?)))
                    .collect();
                if samples.is_empty() {
                    return;
                }
                let _ = writeln!(out, "# HELP tiercache_{name} {help}");
                let _ = writeln!(out, "# TYPE tiercache_{name} gauge");
                for (volume, x) in samples {
                    let _ = writeln!(out, "tiercache_{name}{{volume=\"{volume}\"}} {x}");
                }
            };
        volume_metric(
            "target_blocks",
            "Blocks the pool's sharing gives the volume now.",
            &|s: &SharingStats| s.target_blocks.map(|t| t as f64),
        );
        volume_metric(
            "gain_from_quarter_more_ratio",
            "Share of the volume's block references a quarter more cache would turn into hits.",
            &|s: &SharingStats| s.gain,
        );
        out
    }
}

impl std::fmt::Display for EngineStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.decisions;
        writeln!(
            f,
            "mode {}  policy {}  block {} B  cache {}",
            self.mode, self.policy, self.block_size, self.cache_state
        )?;
        writeln!(
            f,
            "occupancy  {:>6.2}%  ({} of {} blocks, {} dirty)",
            self.occupancy() * 100.0,
            d.resident,
            d.capacity,
            d.dirty
        )?;
        writeln!(
            f,
            "reads      {:>10} IOs  {:>10} hit blocks  {:>10} missed  hit ratio {:.2}%  partial hits {}",
            d.read_ios,
            d.read_hits,
            d.read_misses,
            d.read_hit_ratio() * 100.0,
            d.read_partial_hit_ios
        )?;
        writeln!(
            f,
            "writes     {:>10} IOs  {:>10} hit blocks  {:>10} missed",
            d.write_ios, d.write_hits, d.write_misses
        )?;
        writeln!(
            f,
            "movement   {:>10} promotions  {} demotions  {} writebacks  {} invalidations  {} declined fills",
            d.promotions, d.demotions, d.writebacks, d.invalidations, d.declined_fills
        )?;
        writeln!(
            f,
            "bypass     {:>10} IOs  {} bytes",
            d.bypassed_ios, d.bypassed_bytes
        )?;
        write!(
            f,
            "errors     cache read {}  cache write {}  backing read {}  backing write {}",
            self.cache_read_errors,
            self.cache_write_errors,
            self.backing_read_errors,
            self.backing_write_errors
        )?;
        if let Some(t) = &self.trace {
            write!(
                f,
                "\ntrace      {} {} requests  {} dropped",
                if t.recording {
                    "recording"
                } else {
                    "last recording"
                },
                t.requests,
                t.dropped
            )?;
        }
        for v in &self.volumes {
            let (s, d) = (&v.stats, &v.stats.decisions);
            write!(
                f,
                "\nvolume {:<12} {}  {} blocks ({} dirty)  reads {} IOs, hit ratio {:.2}%  writes {} IOs  \
                 writebacks {}  bypassed {} IOs  backing errors {}",
                v.name,
                s.mode,
                d.resident,
                d.dirty,
                d.read_ios,
                d.read_hit_ratio() * 100.0,
                d.write_ios,
                d.writebacks,
                d.bypassed_ios,
                s.backing_read_errors + s.backing_write_errors
            )?;
            let sh = &v.sharing;
            if let Some(t) = sh.target_blocks {
                write!(f, "  target {t} blocks")?;
            }
            if sh.share_blocks > 0 {
                write!(f, "  share {} blocks", sh.share_blocks)?;
            }
            if let Some(c) = sh.cap_blocks {
                write!(f, "  cap {c} blocks")?;
            }
            if let Some(g) = sh.gain {
                write!(
                    f,
                    "  would gain {:.1} points of hits from {} more blocks",
                    g * 100.0,
                    sh.more_blocks
                )?;
            }
        }
        Ok(())
    }
}
