//! The results table, the targets (PASS/MISS) and REPORT.md.

use crate::fio::Measured;
use crate::{plot, Results};
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Fast,
    Slow,
    Tiercache,
    Nbdkit,
}

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub label: String,
    pub kind: Kind,
    /// Measured after the cache was filled with stale data.
    pub stale: bool,
    pub measured: Measured,
    /// Read hit ratio over the measured run (tiercache: its own counters).
    pub hit_ratio: Option<f64>,
    pub promotions: Option<u64>,
    pub demotions: Option<u64>,
    /// tiercache with its cache device in RAM (a reference, not a target
    /// for "as fast as the fast device").
    pub ram_cache: bool,
    pub note: String,
}

impl RunResult {
    pub fn new(
        label: &str,
        kind: Kind,
        stale: bool,
        measured: Measured,
        hit_ratio: Option<f64>,
    ) -> RunResult {
        RunResult {
            label: label.to_string(),
            kind,
            stale,
            measured,
            hit_ratio,
            promotions: None,
            demotions: None,
            ram_cache: false,
            note: String::new(),
        }
    }
}

/// One point of the data-size sweep (tiercache, cache filled first).
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    /// Data size as a multiple of the cache size.
    pub factor: f64,
    pub data_size: u64,
    pub measured: Measured,
    pub hit_ratio: Option<f64>,
}

/// A checked target.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub pass: bool,
    pub text: String,
}

pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) => format!("{:.2}%", r * 100.0),
        None => "-".into(),
    }
}

/// Latency in ns as "412 us" / "31.2 ms".
pub fn fmt_lat(ns: Option<u64>) -> String {
    match ns {
        None => "-".into(),
        Some(ns) if ns < 1_000_000 => format!("{:.0} us", ns as f64 / 1e3),
        Some(ns) if ns < 10_000_000 => format!("{:.2} ms", ns as f64 / 1e6),
        Some(ns) => format!("{:.1} ms", ns as f64 / 1e6),
    }
}

fn fmt_iops(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// The Markdown results table: one row per configuration.
pub fn table(r: &Results) -> String {
    let fast = r.fast_iops();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| configuration | avg IOPS | vs fast (mean of both runs) | hit ratio | p50 | p90 | p99 | p99.9 | p99.99 | IOs at fast latency (<= {}) |",
        fmt_lat(Some(r.fast_threshold_ns))
    );
    t.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for x in &r.runs {
        let m = &x.measured;
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}% |",
            x.label,
            fmt_iops(m.iops),
            fast.map(|f| format!("{:.1}%", 100.0 * m.iops / f))
                .unwrap_or_default(),
            fmt_ratio(x.hit_ratio),
            fmt_lat(m.pct(50.0)),
            fmt_lat(m.pct(90.0)),
            fmt_lat(m.pct(99.0)),
            fmt_lat(m.pct(99.9)),
            fmt_lat(m.pct(99.99)),
            100.0 * m.share_within(r.fast_threshold_ns),
        );
    }
    t
}

/// The sweep table.
pub fn sweep_table(r: &Results) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| data size | data / cache | avg IOPS | hit ratio | p50 | p90 | p99 | p99.9 | IOs at fast latency |"
    );
    t.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for p in &r.sweep {
        let m = &p.measured;
        let _ = writeln!(
            t,
            "| {} | {}x | {} | {} | {} | {} | {} | {} | {:.1}% |",
            fmt_bytes(p.data_size),
            p.factor,
            fmt_iops(m.iops),
            fmt_ratio(p.hit_ratio),
            fmt_lat(m.pct(50.0)),
            fmt_lat(m.pct(90.0)),
            fmt_lat(m.pct(99.0)),
            fmt_lat(m.pct(99.9)),
            100.0 * m.share_within(r.fast_threshold_ns),
        );
    }
    t
}

/// The targets, checked against this run.
pub fn targets(r: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    let find = |kind: Kind, stale: bool, label_prefix: &str| {
        r.runs
            .iter()
            .find(|x| x.kind == kind && x.stale == stale && x.label.starts_with(label_prefix))
    };
    let fast = r.fast_iops();
    let st = &r.settings;
    for x in r
        .runs
        .iter()
        .filter(|x| x.kind == Kind::Tiercache && !x.stale)
    {
        let base = x.label.trim_end_matches(", empty cache");
        // 1. Hot set fits: the main comparison has all the data fitting.
        // (A cache in RAM is a reference, not held to the fast device.)
        if let (Some(f), false) = (fast, x.ram_cache) {
            if st.data_size <= st.cache_size {
                let ratio = x.measured.iops / f;
                out.push(Target {
                    pass: ratio >= 0.85,
                    text: format!(
                        "{base}: data fits the cache: avg IOPS {:.0} = {:.1}% of the fast device alone ({f:.0}, mean of its two runs); target >= 85%",
                        x.measured.iops,
                        ratio * 100.0,
                    ),
                });
            }
        }
        // 2. Stale cache against empty cache.
        if let Some(s) = r.runs.iter().find(|y| {
            y.kind == Kind::Tiercache && y.stale && y.label.starts_with(&format!("{base},"))
        }) {
            let ratio = s.measured.iops / x.measured.iops;
            out.push(Target {
                pass: ratio >= 0.90,
                text: format!(
                    "{base}: cache full of stale data: avg IOPS {:.0} = {:.1}% of the empty cache ({:.0}); target >= 90%",
                    s.measured.iops,
                    ratio * 100.0,
                    x.measured.iops
                ),
            });
        }
        // 3. Against nbdkit's cache filter, state by state.
        for stale in [false, true] {
            let ours = r.runs.iter().find(|y| {
                y.kind == Kind::Tiercache
                    && y.stale == stale
                    && y.label.starts_with(&format!("{base},"))
            });
            if let (Some(o), Some(n)) = (ours, find(Kind::Nbdkit, stale, "")) {
                let ratio = o.measured.iops / n.measured.iops;
                out.push(Target {
                    pass: ratio > 1.0,
                    text: format!(
                        "{base} vs nbdkit cache filter, {}: {:.0} vs {:.0} IOPS ({:.2}x); target > 1x",
                        if stale { "full of stale data" } else { "empty cache" },
                        o.measured.iops,
                        n.measured.iops,
                        ratio
                    ),
                });
            }
        }
    }
    // Sweep points where all the data fits count for target 1 too.
    if let Some(f) = fast {
        for p in r.sweep.iter().filter(|p| p.data_size <= st.cache_size) {
            let ratio = p.measured.iops / f;
            out.push(Target {
                pass: ratio >= 0.85,
                text: format!(
                    "sweep, data {} ({}x cache, fits): avg IOPS {:.0} = {:.1}% of the fast device alone; target >= 85%",
                    fmt_bytes(p.data_size),
                    p.factor,
                    p.measured.iops,
                    ratio * 100.0
                ),
            });
        }
    }
    out
}

/// Writes REPORT.md, the PNGs, results.json and the merged IOPS CSVs into
/// `out`. Returns the text summary for the terminal (table and targets).
pub fn write(r: &Results, out: &Path) -> Result<String> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(r)?)?;
    for x in &r.runs {
        let mut csv = String::from("seconds,iops_all_jobs\n");
        for (t, v) in &x.measured.series {
            let _ = writeln!(csv, "{t},{v}");
        }
        std::fs::write(out.join(format!("iops-{}.csv", crate::slug(&x.label))), csv)?;
    }
    let pngs = plot::write_all(r, out).context("drawing the plots")?;
    let targets = targets(r);
    let table = table(r);
    let st = &r.settings;

    let mut md = String::new();
    let _ = writeln!(md, "# tiercache bench: the field study, side by side\n");
    let _ = writeln!(
        md,
        "The study's fio job (randread, `random_distribution=zipf:1.2`, 4 KiB blocks, iodepth 8, \
         2 jobs, both jobs summed) over NBD (`ioengine=nbd`), {} s per run. Data {} ({} per job), \
         cache {} in blocks of {} (tiercache and nbdkit alike). The fast device is a file on this \
         machine's disk; the slow device is a sparse file behind tiercache's emulated-HDD latency \
         model (`hdd:`; about 156 IOPS at queue depth 16). \"Full of stale data\": every block of a \
         {} junk region is read once (the cache is then full), then the study's job runs {} s on \
         that region, then the measured job reads a different region.\n",
        st.runtime,
        fmt_bytes(st.data_size),
        fmt_bytes(st.data_size / 2),
        fmt_bytes(st.cache_size),
        fmt_bytes(st.block_size),
        fmt_bytes(st.junk_size),
        st.junk_runtime
    );
    if !r.variants.is_empty() {
        let v: Vec<String> = r
            .variants
            .iter()
            .map(|v| {
                format!(
                    "{}{} ({})",
                    v.policy,
                    v.admission
                        .as_ref()
                        .map(|a| format!("+{a}"))
                        .unwrap_or_else(|| "+hotspot (default admission)".into()),
                    v.mode
                )
            })
            .collect();
        let _ = writeln!(md, "tiercache variants: {}.\n", v.join(", "));
    }
    let _ = writeln!(md, "## Results\n\n{table}");
    let _ = writeln!(md, "## Targets\n");
    if targets.is_empty() {
        let _ = writeln!(md, "No target could be checked (missing configurations).\n");
    }
    for t in &targets {
        let _ = writeln!(
            md,
            "- **{}** {}",
            if t.pass { "PASS" } else { "MISS" },
            t.text
        );
    }
    let missed = targets.iter().filter(|t| !t.pass).count();
    if missed > 0 {
        let _ = writeln!(
            md,
            "\n**{missed} of {} targets missed in this run.**",
            targets.len()
        );
    } else if !targets.is_empty() {
        let _ = writeln!(md, "\nAll {} targets met in this run.", targets.len());
    }
    let _ = writeln!(md, "\n## How to read this\n");
    let _ = writeln!(
        md,
        "Each run's two per-job IOPS logs ({} ms windows) are summed per window, which the study \
         could not do; the thin faint points are those windows and the bold line is a moving \
         average over {} windows. IOPS are on a log scale so the HDD (hundreds) and the fast \
         device (tens of thousands) fit on one plot; the zoom plot shows the slower \
         configurations on a linear scale. Averages hide misses: every miss costs an HDD seek \
         (milliseconds), so the latency-percentile plot (log scale) and the column \"IOs at fast \
         latency\" (share of IOs completing within the fast device's own p99, {}) show how often \
         users actually see fast-device speed. The hit ratio is tiercache's own counters \
         (`read_hits / (read_hits + read_misses)`, blocks) over the measured run only; nbdkit has \
         no counters, so its figure is estimated from its stats filter. This machine is shared \
         and noisy: compare configurations as ratios within one run, not across runs.\n",
        st.log_msec,
        plot::SMOOTH_WINDOWS,
        fmt_lat(Some(r.fast_threshold_ns))
    );
    for (title, file) in &pngs {
        let _ = writeln!(md, "### {title}\n\n![{title}]({file})\n");
    }
    if !r.sweep.is_empty() {
        let _ = writeln!(
            md,
            "## Data size against a fixed {} cache\n\nThe cache is filled by the same job (half the \
             run time) before each measured run. The hot set of zipf:1.2 is about 10% of the data: \
             it fits while the data is at most about 10x the cache. Where the data is larger than \
             the cache, even a perfect cache misses on the tail, and every miss is an HDD seek, so \
             average IOPS fall long before the hot set stops fitting; the share of IOs at fast \
             latency is the figure to watch (the study: 70-80% for every size).\n\n{}",
            fmt_bytes(st.cache_size),
            sweep_table(r)
        );
    }
    if let Some(g) = &r.git {
        let _ = writeln!(md, "## Real application: git\n\n{}", g.markdown());
    }
    if !r.notes.is_empty() {
        let _ = writeln!(md, "## Notes\n");
        for n in &r.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    let notes: Vec<&RunResult> = r.runs.iter().filter(|x| !x.note.is_empty()).collect();
    if !notes.is_empty() {
        let _ = writeln!(md, "\n## Per-run notes\n");
        for x in notes {
            let mut extra = String::new();
            if let (Some(p), Some(d)) = (x.promotions, x.demotions) {
                extra = format!(" (during the run: {p} promotions, {d} demotions)");
            }
            let _ = writeln!(md, "- {}: {}{extra}", x.label, x.note);
        }
    }
    std::fs::write(out.join("REPORT.md"), md)?;

    let mut summary = String::new();
    let _ = writeln!(summary, "\n{table}");
    if !r.sweep.is_empty() {
        let _ = writeln!(summary, "{}", sweep_table(r));
    }
    if let Some(g) = &r.git {
        let _ = writeln!(summary, "{}", g.markdown());
    }
    for t in &targets {
        let _ = writeln!(
            summary,
            "{} {}",
            if t.pass { "PASS" } else { "MISS" },
            t.text
        );
    }
    for n in &r.notes {
        let _ = writeln!(summary, "note: {n}");
    }
    Ok(summary)
}
