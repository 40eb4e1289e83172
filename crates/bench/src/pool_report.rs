//! The pool benchmark's results: per volume and for the pool, per run
//! (shared, equal static slices, shared with the scanner off), the table
//! printed and written as POOL-REPORT.md, and pool-results.json.

use crate::pool_jobs::{JobMeasured, Workload};
use crate::report::{fmt_bytes, fmt_lat, fmt_ratio};
use anyhow::Result;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Sizes and times of a pool run.
#[derive(Clone, Debug, Serialize)]
pub struct PoolSettings {
    /// Bytes of each volume (each an emulated HDD over a sparse file).
    pub volume_size: u64,
    /// Bytes of the one shared cache device (the slices add up to it).
    pub cache_size: u64,
    pub block_size: u64,
    /// Seconds of each measured run, after a warm-up of half as long.
    pub runtime: u64,
    pub warmup: u64,
    pub policy: String,
    pub mode: String,
}

/// One volume's figures in one run: fio's and the server's counters over
/// the measured run only.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VolumeResult {
    pub name: String,
    pub iops: f64,
    pub total_ios: u64,
    pub p99_ns: Option<u64>,
    /// Block hits and misses, reads and writes together.
    pub hits: u64,
    pub misses: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    /// IOs that bypassed the cache (sequential streams).
    pub bypassed_ios: u64,
    /// Cache blocks the volume held at the end of the run.
    pub resident: u64,
}

impl VolumeResult {
    pub fn new(name: &str, m: &JobMeasured, d: &VolumeCounters) -> VolumeResult {
        VolumeResult {
            name: name.to_string(),
            iops: m.iops,
            total_ios: m.total_ios,
            p99_ns: m.p99_ns,
            hits: d.read_hits + d.write_hits,
            misses: d.read_misses + d.write_misses,
            read_hits: d.read_hits,
            read_misses: d.read_misses,
            bypassed_ios: d.bypassed_ios,
            resident: d.resident,
        }
    }

    /// hits / (hits + misses) over every block reference; None without
    /// any.
    pub fn hit_ratio(&self) -> Option<f64> {
        let t = self.hits + self.misses;
        (t > 0).then(|| self.hits as f64 / t as f64)
    }
}

/// A volume's counters from `tiercache stats --json` (its `decisions`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VolumeCounters {
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    pub bypassed_ios: u64,
    pub resident: u64,
}

impl VolumeCounters {
    /// From a `decisions` JSON object.
    pub fn from_json(d: &serde_json::Value) -> VolumeCounters {
        let g = |k: &str| d[k].as_u64().unwrap_or(0);
        VolumeCounters {
            read_hits: g("read_hits"),
            read_misses: g("read_misses"),
            write_hits: g("write_hits"),
            write_misses: g("write_misses"),
            bypassed_ios: g("bypassed_ios"),
            resident: g("resident"),
        }
    }

    /// Accumulated since `before` (resident is "now").
    pub fn since(&self, before: &VolumeCounters) -> VolumeCounters {
        VolumeCounters {
            read_hits: self.read_hits - before.read_hits,
            read_misses: self.read_misses - before.read_misses,
            write_hits: self.write_hits - before.write_hits,
            write_misses: self.write_misses - before.write_misses,
            bypassed_ios: self.bypassed_ios - before.bypassed_ios,
            resident: self.resident,
        }
    }
}

/// One configuration's measured run.
#[derive(Clone, Debug, Serialize)]
pub struct PoolRun {
    pub label: String,
    /// Every volume that ran a job, in table order.
    pub volumes: Vec<VolumeResult>,
    /// Share of the machine's CPU other processes used meanwhile.
    pub others_cpu: Option<f64>,
}

impl PoolRun {
    /// The pool's totals: IOPS, IOs and counters summed; p99 is the worst
    /// volume's.
    pub fn total(&self) -> VolumeResult {
        self.total_but("")
    }

    /// [`PoolRun::total`] without volume `skip`.
    pub fn total_but(&self, skip: &str) -> VolumeResult {
        let mut t = VolumeResult {
            name: "pool".into(),
            ..VolumeResult::default()
        };
        for v in self.volumes.iter().filter(|v| v.name != skip) {
            t.iops += v.iops;
            t.total_ios += v.total_ios;
            t.p99_ns = t.p99_ns.max(v.p99_ns);
            t.hits += v.hits;
            t.misses += v.misses;
            t.read_hits += v.read_hits;
            t.read_misses += v.read_misses;
            t.bypassed_ios += v.bypassed_ios;
            t.resident += v.resident;
        }
        t
    }

    pub fn volume(&self, name: &str) -> Option<&VolumeResult> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

/// The simulator's view of the same workloads (synthetic requests shaped
/// like the fio jobs): shared against the best static split it finds.
#[derive(Clone, Debug, Serialize)]
pub struct SimSplit {
    pub requests: usize,
    pub shared_hit_ratio: f64,
    pub best_static_hit_ratio: f64,
    pub equal_hit_ratio: f64,
    /// (volume, blocks) of the best static split.
    pub best_split: Vec<(String, u64)>,
    /// (volume, bytes) of the slice files the measured best-split run
    /// used (the split's shares of the cache, at least 2 MiB each).
    pub slices: Vec<(String, u64)>,
}

/// Everything one `tiercache bench --pool` produced.
#[derive(Clone, Debug, Serialize)]
pub struct PoolResults {
    pub settings: PoolSettings,
    pub workloads: Vec<Workload>,
    /// [`SHARED`], [`SLICES`], [`BEST`], [`NO_SCAN`], those that ran.
    pub runs: Vec<PoolRun>,
    pub sim: Option<SimSplit>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
}

pub const SHARED: &str = "shared cache, one server";
pub const SLICES: &str = "equal static slices, one server each";
pub const BEST: &str = "best static split (simulator), one server each";
pub const NO_SCAN: &str = "shared cache, scanner off";

impl PoolResults {
    pub fn run(&self, label: &str) -> Option<&PoolRun> {
        self.runs.iter().find(|r| r.label == label)
    }

    /// Per volume (scanner aside): hit ratio with the scanner off minus
    /// with it on, in points (positive: the scanner cost hits).
    pub fn scanner_cost(&self) -> Vec<(String, f64)> {
        let (Some(on), Some(off)) = (self.run(SHARED), self.run(NO_SCAN)) else {
            return Vec::new();
        };
        off.volumes
            .iter()
            .filter_map(|v| {
                let a = v.hit_ratio()?;
                let b = on.volume(&v.name)?.hit_ratio()?;
                Some((v.name.clone(), (a - b) * 100.0))
            })
            .collect()
    }
}

fn cell(v: Option<&VolumeResult>) -> String {
    match v {
        Some(v) => format!(
            "{:.0} | {} | {}",
            v.iops,
            fmt_lat(v.p99_ns),
            fmt_ratio(v.hit_ratio())
        ),
        None => "- | - | -".into(),
    }
}

/// The Markdown table: one row per volume and one for the pool; IOPS,
/// p99 and hit ratio per run, and the scanner's cost per volume.
pub fn table(r: &PoolResults) -> String {
    let mut t = String::from("| volume | workload |");
    let mut sep = String::from("|---|---|");
    for run in &r.runs {
        let _ = write!(t, " {} IOPS | p99 | hits |", short(&run.label));
        sep.push_str("---:|---:|---:|");
    }
    t.push_str(" scanner's cost |\n");
    sep.push_str("---:|\n");
    t.push_str(&sep);
    let cost = r.scanner_cost();
    for w in &r.workloads {
        let _ = write!(t, "| {} | {} |", w.name, w.what);
        for run in &r.runs {
            let _ = write!(t, " {} |", cell(run.volume(w.name)));
        }
        match cost.iter().find(|c| c.0 == w.name) {
            Some((_, p)) => {
                let _ = writeln!(t, " {p:+.2} points |");
            }
            None => t.push_str(" - |\n"),
        }
    }
    t.push_str("| **pool** | all together |");
    for run in &r.runs {
        let _ = write!(t, " {} |", cell(Some(&run.total())));
    }
    t.push_str(" - |\n");
    t
}

fn short(label: &str) -> &str {
    match label {
        SHARED => "shared",
        SLICES => "slices",
        BEST => "best split",
        NO_SCAN => "no scan",
        l => l,
    }
}

/// The summary lines: totals shared against slices (and the simulator's
/// best static split), and the scanner's worst cost against its target.
pub fn summary(r: &PoolResults) -> Vec<String> {
    let mut s = Vec::new();
    let scan = r
        .workloads
        .iter()
        .find(|w| w.scanner)
        .map_or("", |w| w.name);
    let ratio = |v: &VolumeResult| v.hit_ratio().unwrap_or(0.0);
    if let Some(a) = r.run(SHARED) {
        for other in [SLICES, BEST] {
            let Some(b) = r.run(other) else { continue };
            let (at, bt) = (a.total(), b.total());
            let (ao, bo) = (a.total_but(scan), b.total_but(scan));
            s.push(format!(
                "Shared against {other}: pool hit ratio {} against {} ({:+.2} points; without the scanner's volume {} against {}), {:.0} against {:.0} IOPS ({:.2}x). Target, shared at or above: **{}**.",
                fmt_ratio(at.hit_ratio()),
                fmt_ratio(bt.hit_ratio()),
                (ratio(&at) - ratio(&bt)) * 100.0,
                fmt_ratio(ao.hit_ratio()),
                fmt_ratio(bo.hit_ratio()),
                at.iops,
                bt.iops,
                if bt.iops > 0.0 { at.iops / bt.iops } else { 0.0 },
                if ratio(&at) >= ratio(&bt) { "PASS" } else { "MISS" }
            ));
        }
    }
    if let Some(x) = &r.sim {
        s.push(format!(
            "Simulator ({} synthetic requests shaped like the jobs): shared {}, best static split {} ({} blocks; measured with slices of {}), equal slices {}.",
            x.requests,
            fmt_ratio(Some(x.shared_hit_ratio)),
            fmt_ratio(Some(x.best_static_hit_ratio)),
            x.best_split
                .iter()
                .map(|(v, b)| format!("{v} {b}"))
                .collect::<Vec<_>>()
                .join(", "),
            x.slices
                .iter()
                .map(|(v, b)| format!("{v} {}", fmt_bytes(*b)))
                .collect::<Vec<_>>()
                .join(", "),
            fmt_ratio(Some(x.equal_hit_ratio)),
        ));
    }
    let cost = r.scanner_cost();
    if let Some((name, worst)) = cost.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        s.push(format!(
            "Scanner on: the worst-hit other volume ({name}) lost {worst:+.2} points of hit ratio (target: at most 1): **{}**.",
            if *worst <= 1.0 { "PASS" } else { "MISS" }
        ));
    }
    s
}

/// Writes POOL-REPORT.md and pool-results.json to `out`; returns the text
/// to print.
pub fn write(r: &PoolResults, out: &Path) -> Result<String> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("pool-results.json"),
        serde_json::to_string_pretty(r)?,
    )?;
    let st = &r.settings;
    let mut md = String::from("# tiercache bench --pool\n\n");
    let _ = writeln!(
        md,
        "{} volumes of {} each (emulated HDDs over sparse files), one cache of {} (blocks of {}), policy {}, mode {}; each run {} s after a {} s warm-up, all volumes' fio jobs at once. Hit ratios count block hits of reads and writes over the measured run (the server's per-volume counters); p99 is fio's completion latency; the pool's p99 is its worst volume's.\n",
        r.workloads.len(),
        fmt_bytes(st.volume_size),
        fmt_bytes(st.cache_size),
        fmt_bytes(st.block_size),
        st.policy,
        st.mode,
        st.runtime,
        st.warmup
    );
    md.push_str(&table(r));
    md.push('\n');
    for l in summary(r) {
        let _ = writeln!(md, "- {l}");
    }
    for run in &r.runs {
        let _ = writeln!(
            md,
            "- {}: other processes used {} of the CPU.",
            run.label,
            fmt_ratio(run.others_cpu)
        );
    }
    for n in &r.notes {
        let _ = writeln!(md, "- {n}");
    }
    let _ = writeln!(md, "\nThe benchmark took {:.0} s.", r.elapsed_secs);
    std::fs::write(out.join("POOL-REPORT.md"), &md)?;
    Ok(md)
}
