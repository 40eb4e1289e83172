//! The pool benchmark's results: per volume and for the pool, per run
//! (shared, equal static slices, the best static split, shared with the
//! scanner off) and their medians over the rounds, the tables printed and
//! written as POOL-REPORT.md, and pool-results.json.

use crate::pool_jobs::{JobMeasured, Workload};
use crate::pool_rounds::{at_mix, mix_of, paired, ConfigMedians, Spread, VolumeMedians};
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
    /// Rounds: each runs every configuration once.
    pub rounds: usize,
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
    /// The round it ran in, from 0.
    pub round: usize,
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
    /// Every run that finished, in the order they ran: [`SHARED`],
    /// [`SLICES`], [`BEST`], [`NO_SCAN`] in round 0, rotated after.
    pub runs: Vec<PoolRun>,
    /// Per configuration that ran at least once, in [`LABELS`] order: its
    /// medians over the rounds.
    pub medians: Vec<ConfigMedians>,
    /// Block references per volume, the shared runs' medians: the fixed
    /// mix the pool's hit ratios are compared at (see `pool_rounds.rs`).
    pub mix: Vec<(String, f64)>,
    /// The simulator's split, from round 0's shared run; every round's
    /// best-split run uses its slices.
    pub sim: Option<SimSplit>,
    pub notes: Vec<String>,
    pub elapsed_secs: f64,
}

pub const SHARED: &str = "shared cache, one server";
pub const SLICES: &str = "equal static slices, one server each";
pub const BEST: &str = "best static split (simulator), one server each";
pub const NO_SCAN: &str = "shared cache, scanner off";
/// The configurations, in round 0's order.
pub const LABELS: [&str; 4] = [SHARED, SLICES, BEST, NO_SCAN];

impl PoolResults {
    /// The results of `runs`, with each configuration's medians.
    pub fn new(
        settings: PoolSettings,
        workloads: Vec<Workload>,
        runs: Vec<PoolRun>,
        sim: Option<SimSplit>,
        notes: Vec<String>,
        elapsed_secs: f64,
    ) -> PoolResults {
        let scan = workloads.iter().find(|w| w.scanner).map_or("", |w| w.name);
        let of = |l: &str| -> Vec<&PoolRun> { runs.iter().filter(|r| r.label == l).collect() };
        let mix = mix_of(&of(SHARED));
        let medians = LABELS
            .iter()
            .filter_map(|l| {
                let rs = of(l);
                (!rs.is_empty()).then(|| ConfigMedians::of(l, &rs, scan, &mix))
            })
            .collect();
        PoolResults {
            settings,
            workloads,
            runs,
            medians,
            mix,
            sim,
            notes,
            elapsed_secs,
        }
    }

    pub fn medians(&self, label: &str) -> Option<&ConfigMedians> {
        self.medians.iter().find(|m| m.label == label)
    }

    fn scan_name(&self) -> &str {
        self.workloads
            .iter()
            .find(|w| w.scanner)
            .map_or("", |w| w.name)
    }

    /// Per volume (scanner aside): its median hit ratio with the scanner
    /// off minus its median with it on, in points (positive: the scanner
    /// cost hits), and the same difference per round (paired by round).
    pub fn scanner_cost(&self) -> Vec<(String, f64, Spread)> {
        let (Some(on), Some(off)) = (self.medians(SHARED), self.medians(NO_SCAN)) else {
            return Vec::new();
        };
        off.volumes
            .iter()
            .filter_map(|v| {
                let a = v.hit_ratio.median?;
                let b = on.volume(&v.name)?.hit_ratio.median?;
                let name = v.name.clone();
                let per = paired(&self.runs, NO_SCAN, SHARED, &|r| {
                    r.volume(&name)?.hit_ratio().map(|x| x * 100.0)
                });
                Some((v.name.clone(), (a - b) * 100.0, per))
            })
            .collect()
    }
}

fn fmt_spread_ratio(s: &Spread) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) if hi > lo => format!(
            "{} ({:.1}-{:.1})",
            fmt_ratio(Some(m)),
            lo * 100.0,
            hi * 100.0
        ),
        (m, _, _) => fmt_ratio(m),
    }
}

fn cell(v: Option<&VolumeMedians>) -> String {
    match v {
        Some(v) => format!(
            "{:.0} | {} | {}",
            v.iops.median.unwrap_or(0.0),
            fmt_lat(v.p99_ns.median.map(|x| x as u64)),
            fmt_spread_ratio(&v.hit_ratio)
        ),
        None => "- | - | -".into(),
    }
}

/// The Markdown table of medians: one row per volume and one for the
/// pool; median IOPS, p99 and hit ratio per configuration (the rounds'
/// lowest and highest hit ratio in brackets), and the scanner's cost per
/// volume.
pub fn table(r: &PoolResults) -> String {
    let mut t = String::from("| volume | workload |");
    let mut sep = String::from("|---|---|");
    for m in &r.medians {
        let _ = write!(t, " {} IOPS | p99 | hits |", short(&m.label));
        sep.push_str("---:|---:|---:|");
    }
    t.push_str(" scanner's cost |\n");
    sep.push_str("---:|\n");
    t.push_str(&sep);
    let cost = r.scanner_cost();
    for w in &r.workloads {
        let _ = write!(t, "| {} | {} |", w.name, w.what);
        for m in &r.medians {
            let _ = write!(t, " {} |", cell(m.volume(w.name)));
        }
        match cost.iter().find(|c| c.0 == w.name) {
            Some((_, p, per)) => {
                let _ = writeln!(
                    t,
                    " {p:+.2} points ({:+.1} to {:+.1}) |",
                    per.min.unwrap_or(0.0),
                    per.max.unwrap_or(0.0)
                );
            }
            None => t.push_str(" - |\n"),
        }
    }
    t.push_str("| **pool** | all together |");
    for m in &r.medians {
        let _ = write!(t, " {} |", cell(Some(&m.pool)));
    }
    t.push_str(" - |\n");
    t.push_str("| **pool but scan** | the other four |");
    for m in &r.medians {
        let _ = write!(t, " {} |", cell(Some(&m.pool_but_scan)));
    }
    t.push_str(" - |\n");
    for (name, what, pick) in [
        ("pool", "at the shared runs' mix", 0),
        ("pool but scan", "the other four, at that mix", 1),
    ] {
        let _ = write!(t, "| **{name}** | {what} |");
        for m in &r.medians {
            let x = if pick == 0 {
                &m.pool_at_mix
            } else {
                &m.pool_but_scan_at_mix
            };
            let _ = write!(t, " - | - | {} |", fmt_spread_ratio(x));
        }
        t.push_str(" - |\n");
    }
    t
}

/// Every run, one row each in the order they ran: round, configuration,
/// each volume's hit ratio, the pool's with and without the scanner's
/// volume and at the fixed mix, the pool's IOPS, the scanner's bypassed IOs (server) against
/// its IOs (fio) and the CPU other processes used.
pub fn rounds_table(r: &PoolResults) -> String {
    let scan = r.scan_name();
    let mut t = String::from("| round | configuration |");
    let mut sep = String::from("|---:|---|");
    for w in &r.workloads {
        let _ = write!(t, " {} |", w.name);
        sep.push_str("---:|");
    }
    t.push_str(
        " pool | pool but scan | pool at the mix | pool IOPS | scan bypassed / IOs | others' CPU |\n",
    );
    sep.push_str("---:|---:|---:|---:|---:|---:|\n");
    t.push_str(&sep);
    for run in &r.runs {
        let _ = write!(t, "| {} | {} |", run.round + 1, short(&run.label));
        for w in &r.workloads {
            let h = run.volume(w.name).and_then(|v| v.hit_ratio());
            let _ = write!(t, " {} |", fmt_ratio(h));
        }
        let (all, but) = (run.total(), run.total_but(scan));
        let bypass = match run.volume(scan) {
            Some(v) => format!("{} / {}", v.bypassed_ios, v.total_ios),
            None => "-".into(),
        };
        let _ = writeln!(
            t,
            " {} | {} | {} | {:.0} | {} | {} |",
            fmt_ratio(all.hit_ratio()),
            fmt_ratio(but.hit_ratio()),
            fmt_ratio(at_mix(run, &r.mix)),
            all.iops,
            bypass,
            fmt_ratio(run.others_cpu)
        );
    }
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

fn points(s: &Spread) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) => {
            format!("{m:+.2} points (rounds {lo:+.2} to {hi:+.2})")
        }
        _ => "-".into(),
    }
}

/// The summary lines: the targets judged on medians (MET / MISSED), with
/// each round's difference (paired by round) for the spread; the pools
/// compared at the shared runs' mix (see `pool_rounds.rs`).
pub fn summary(r: &PoolResults) -> Vec<String> {
    let mut s = Vec::new();
    let scan = r.scan_name().to_string();
    let mix = r.mix.clone();
    let but: Vec<(String, f64)> = mix.iter().filter(|m| m.0 != scan).cloned().collect();
    if let Some(a) = r.medians(SHARED) {
        for other in [SLICES, BEST] {
            let Some(b) = r.medians(other) else { continue };
            let (am, bm) = (
                a.pool_at_mix.median.unwrap_or(0.0),
                b.pool_at_mix.median.unwrap_or(0.0),
            );
            let per = paired(&r.runs, SHARED, other, &|x| {
                at_mix(x, &mix).map(|h| h * 100.0)
            });
            let per_but = paired(&r.runs, SHARED, other, &|x| {
                at_mix(x, &but).map(|h| h * 100.0)
            });
            let (ai, bi) = (
                a.pool.iops.median.unwrap_or(0.0),
                b.pool.iops.median.unwrap_or(0.0),
            );
            s.push(format!(
                "Shared against {other}, medians of {} and {} rounds, at the shared runs' mix: pool hit ratio {} against {} ({:+.2} points; per round {}; without the scanner's volume {} against {}, per round {}; each run's own mix: {} against {}), {:.0} against {:.0} IOPS ({:.2}x). Target, shared at or above: **{}**.",
                a.rounds,
                b.rounds,
                fmt_ratio(Some(am)),
                fmt_ratio(Some(bm)),
                (am - bm) * 100.0,
                points(&per),
                fmt_ratio(a.pool_but_scan_at_mix.median),
                fmt_ratio(b.pool_but_scan_at_mix.median),
                points(&per_but),
                fmt_ratio(a.pool.hit_ratio.median),
                fmt_ratio(b.pool.hit_ratio.median),
                ai,
                bi,
                if bi > 0.0 { ai / bi } else { 0.0 },
                if am >= bm { "MET" } else { "MISSED" }
            ));
        }
    }
    if let Some(x) = &r.sim {
        s.push(format!(
            "Simulator ({} synthetic requests shaped like the jobs, weighted by round 1's shared run): shared {}, best static split {} ({} blocks; measured with slices of {}), equal slices {}.",
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
    if let Some((name, worst, per)) = cost.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
        s.push(format!(
            "Scanner on, medians: the worst-hit other volume ({name}) lost {worst:+.2} points of hit ratio (per round {}; target: at most 1): **{}**.",
            points(per),
            if *worst <= 1.0 { "MET" } else { "MISSED" }
        ));
    }
    if let Some(m) = r.medians(SHARED).and_then(|m| m.volume(&scan)) {
        s.push(format!(
            "The scanner's volume, shared, medians: {:.0} of {:.0} IOs bypassed the cache (the server's count against fio's).",
            m.bypassed_ios.median.unwrap_or(0.0),
            m.total_ios.median.unwrap_or(0.0)
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
        "{} volumes of {} each (emulated HDDs over sparse files), one cache of {} (blocks of {}), policy {}, mode {}; {} rounds, each running every configuration once (the order rotated each round), each run {} s after a {} s warm-up, all volumes' fio jobs at once. Hit ratios count block hits of reads and writes over the measured run (the server's per-volume counters); p99 is fio's completion latency; the pool's p99 is its worst volume's. Medians over the rounds, the rounds' lowest and highest hit ratio in brackets:\n",
        r.workloads.len(),
        fmt_bytes(st.volume_size),
        fmt_bytes(st.cache_size),
        fmt_bytes(st.block_size),
        st.policy,
        st.mode,
        st.rounds,
        st.runtime,
        st.warmup
    );
    md.push_str(&table(r));
    md.push('\n');
    for l in summary(r) {
        let _ = writeln!(md, "- {l}");
    }
    for n in &r.notes {
        let _ = writeln!(md, "- {n}");
    }
    md.push_str("\nEvery run, hit ratios:\n\n");
    md.push_str(&rounds_table(r));
    let _ = writeln!(md, "\nThe benchmark took {:.0} s.", r.elapsed_secs);
    std::fs::write(out.join("POOL-REPORT.md"), &md)?;
    Ok(md)
}
