//! The results table, the targets (PASS/MISS) and REPORT.md.

use crate::run_result::{median, paired_ratios, Kind, RunResult};
use crate::{plot, Results};
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// A checked target.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub pass: bool,
    pub text: String,
}

pub use tiercache_types::fmt_bytes;

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

fn fmt_pct(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{:.0}%", v * 100.0),
        None => "-".into(),
    }
}

/// "28.7k" for one repeat, "28.7k (26.1k-30.2k)" for several.
fn fmt_iops_range(x: &RunResult) -> String {
    if x.repeats.len() <= 1 {
        return fmt_iops(x.median_iops());
    }
    format!(
        "{} ({}-{})",
        fmt_iops(x.median_iops()),
        fmt_iops(x.min_iops()),
        fmt_iops(x.max_iops())
    )
}

/// The Markdown results table: one row per configuration.
pub fn table(r: &Results) -> String {
    let fast = r.fast_iops();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| configuration | IOPS median (min-max) | vs fast | 2nd half of the run | hit ratio | p50 | p90 | p99 | p99.9 | p99.99 | IOs at fast latency (<= {}) | CPU used by other processes |",
        fmt_lat(Some(r.fast_threshold_ns))
    );
    t.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for x in &r.runs {
        let m = &x.measured;
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1}% | {} |",
            x.label,
            fmt_iops_range(x),
            fast.filter(|f| *f > 0.0)
                .map(|f| format!("{:.1}%", 100.0 * x.median_iops() / f))
                .unwrap_or_default(),
            m.second_half_iops().map(fmt_iops).unwrap_or("-".into()),
            fmt_ratio(x.hit_ratio),
            fmt_lat(m.pct(50.0)),
            fmt_lat(m.pct(90.0)),
            fmt_lat(m.pct(99.0)),
            fmt_lat(m.pct(99.9)),
            fmt_lat(m.pct(99.99)),
            100.0 * m.share_within(r.fast_threshold_ns),
            fmt_pct(x.others_cpu()),
        );
    }
    t
}

/// IOPS of every repeat by round, with the CPU other processes used.
pub fn rounds_table(r: &Results) -> String {
    let n = r
        .runs
        .iter()
        .flat_map(|x| x.repeats.iter().map(|p| p.round + 1))
        .max()
        .unwrap_or(0);
    let mut t = String::from("| configuration |");
    for i in 1..=n {
        let _ = write!(t, " round {i} |");
    }
    t.push_str("\n|---|");
    t.push_str(&"---:|".repeat(n));
    t.push('\n');
    for x in &r.runs {
        let _ = write!(t, "| {} |", x.label);
        for i in 0..n {
            match x.repeats.iter().find(|p| p.round == i) {
                Some(p) => {
                    let _ = write!(t, " {} ({}) |", fmt_iops(p.iops), fmt_pct(p.others_cpu));
                }
                None => t.push_str(" |"),
            }
        }
        t.push('\n');
    }
    t
}

/// The sweep table.
pub fn sweep_table(r: &Results) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| data size | data / cache | avg IOPS | vs fast | hit ratio | p50 | p90 | p99 | p99.9 | IOs at fast latency | CPU used by other processes |"
    );
    t.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let fast = r.fast_iops().filter(|f| *f > 0.0);
    for p in &r.sweep {
        let m = &p.measured;
        let _ = writeln!(
            t,
            "| {} | {}x | {} | {} | {} | {} | {} | {} | {} | {:.1}% | {} |",
            fmt_bytes(p.data_size),
            p.factor,
            fmt_iops(m.iops),
            fast.map(|f| format!("{:.0}%", 100.0 * m.iops / f))
                .unwrap_or("-".into()),
            fmt_ratio(p.hit_ratio),
            fmt_lat(m.pct(50.0)),
            fmt_lat(m.pct(90.0)),
            fmt_lat(m.pct(99.0)),
            fmt_lat(m.pct(99.9)),
            100.0 * m.share_within(r.fast_threshold_ns),
            fmt_pct(p.others_cpu),
        );
    }
    t
}

/// "0.93, 1.02, 0.97" (percent or x) for the per-round ratios.
fn fmt_ratios(v: &[f64], percent: bool) -> String {
    v.iter()
        .map(|x| {
            if percent {
                format!("{:.0}%", x * 100.0)
            } else {
                format!("{x:.2}x")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The targets, checked against this run: every ratio is the
/// median of the per-round ratios.
pub fn targets(r: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    let st = &r.settings;
    let fast = r.fast_row();
    let tc = |base: &str, stale: bool| {
        r.runs.iter().find(|y| {
            y.kind == Kind::Tiercache
                && y.stale == stale
                && y.label.starts_with(&format!("{base},"))
        })
    };
    let peer = |capped: bool, stale: bool| {
        r.runs
            .iter()
            .find(|y| y.kind == Kind::Nbdkit && y.memory_capped == capped && y.stale == stale)
    };
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
                let v = paired_ratios(x, f);
                let ratio = median(&v).unwrap_or(0.0);
                // The first seconds of an empty cache are bound by the
                // slow device (every block is read from it once); the
                // second half of the run shows the cache's own speed.
                let late = match (x.measured.second_half_iops(), f.measured.second_half_iops()) {
                    (Some(a), Some(b)) if b > 0.0 => format!(
                        "; second half of the median runs, after the warm-up from the slow device: {:.0}%",
                        100.0 * a / b
                    ),
                    _ => String::new(),
                };
                out.push(Target {
                    pass: ratio >= 0.85,
                    text: format!(
                        "{base}: data fits the cache: {:.1}% of the fast device alone (median {:.0} vs {:.0} IOPS; per round {}{late}); target >= 85%",
                        ratio * 100.0,
                        x.median_iops(),
                        f.median_iops(),
                        fmt_ratios(&v, true),
                    ),
                });
            }
        }
        // 2. Stale cache against empty cache.
        if let Some(s) = tc(base, true) {
            let v = paired_ratios(s, x);
            let ratio = median(&v).unwrap_or(0.0);
            out.push(Target {
                pass: ratio >= 0.90,
                text: format!(
                    "{base}: cache full of stale data: {:.1}% of the empty cache (median {:.0} vs {:.0} IOPS; per round {}); target >= 90%",
                    ratio * 100.0,
                    s.median_iops(),
                    x.median_iops(),
                    fmt_ratios(&v, true),
                ),
            });
        }
        // 3. Against nbdkit's cache filter on the same devices and the
        // same memory: a file cache against the memory-capped nbdkit, a
        // RAM cache against nbdkit's cache file in the page cache.
        for stale in [false, true] {
            if let (Some(o), Some(n)) = (tc(base, stale), peer(!x.ram_cache, stale)) {
                let v = paired_ratios(o, n);
                let ratio = median(&v).unwrap_or(0.0);
                out.push(Target {
                    pass: ratio > 1.0,
                    text: format!(
                        "{base} vs {}: {}: {:.2}x (median {:.0} vs {:.0} IOPS; per round {}); target > 1x",
                        n.label.trim_end_matches(&format!(", {}", if stale { "full of stale data" } else { "empty cache" })),
                        if stale { "full of stale data" } else { "empty cache" },
                        ratio,
                        o.median_iops(),
                        n.median_iops(),
                        fmt_ratios(&v, false),
                    ),
                });
            }
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
        std::fs::write(
            out.join(format!("iops-{}.csv", crate::files::slug(&x.label))),
            csv,
        )?;
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
         model (`hdd:`; about 156 IOPS at queue depth 16). Each cached configuration is measured \
         twice in one server, as the study's two runs met the cache: \"empty cache\" reads region \
         A from a fresh cache; then every block of region A ({}) is read once, so the cache is \
         full of A; then \"full of stale data\" reads region B, which the cache has never \
         seen.\n",
        st.runtime,
        fmt_bytes(st.data_size),
        fmt_bytes(st.data_size / 2),
        fmt_bytes(st.cache_size),
        fmt_bytes(st.block_size),
        fmt_bytes(st.junk_size),
    );
    let _ = writeln!(
        md,
        "The peer on the same devices: nbdkit's cache filter keeps its cache in a temporary file \
         written through the kernel's page cache, so on a machine with free RAM its cache is RAM, \
         while tiercache's file cache uses O_DIRECT on the fast device. Two nbdkit rows make the \
         comparison like-for-like: \"nbdkit cache filter (memory-capped)\" runs nbdkit in a memory cgroup whose limit (RSS and \
         page cache together: {}) is tiercache's own peak RSS with its file cache, its cache file \
         on the fast device's filesystem: the same devices and the same RAM, compared with \
         tiercache's file cache. \"nbdkit cache filter (in page cache)\" leaves the page cache uncapped (its cache in RAM), \
         compared with tiercache's RAM cache (`--cache mem:`).\n",
        r.nbdkit_memory_cap
            .map(fmt_bytes)
            .unwrap_or_else(|| "not measured".into()),
    );
    if !r.variants.is_empty() {
        let v: Vec<String> = r
            .variants
            .iter()
            .map(|v| {
                format!(
                    "{}{} ({}, cache {})",
                    v.policy,
                    v.admission
                        .as_ref()
                        .map(|a| format!("+{a}"))
                        .unwrap_or_else(|| "+hotspot (default admission)".into()),
                    v.mode,
                    if v.ram { "in RAM" } else { "file, O_DIRECT" }
                )
            })
            .collect();
        let _ = writeln!(md, "tiercache variants: {}.\n", v.join(", "));
    }
    let _ = writeln!(
        md,
        "## Results\n\nEvery configuration ran {} time(s), interleaved: each round runs every \
         configuration once (odd rounds in reverse order). IOPS are the median with the range \
         over the rounds; the other columns are those of the median run. The last column is the \
         share of this machine's CPU that processes outside the benchmark used meanwhile: the \
         noise. \"2nd half of the run\" is the mean IOPS of the run's second half, after an empty \
         cache's warm-up (every block read once from the slow device).\n\n{table}",
        st.repeats
    );
    if st.repeats > 1 {
        let _ = writeln!(
            md,
            "IOPS by round (CPU used by other processes in parentheses):\n\n{}",
            rounds_table(r)
        );
    }
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
         no counters, so its figure is estimated from the reads its log filter saw reach the \
         backend. This machine may be shared and noisy: compare configurations as ratios within \
         one run (the targets use the median of the per-round ratios), not across runs, and look \
         at the CPU other processes took.\n",
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
            "## Data size against a fixed {} cache\n\nOne run per size (no repeats: a picture of \
             the trend, not a target). The cache is filled by the same job (half the run time) \
             before each measured run; tiercache keeps a little of the cache device for its \
             metadata, so at 1x the data is slightly larger than the cache. The hot set of zipf:1.2 is about 10% of the data: \
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
        let _ = writeln!(md, "\n## Per-run notes (the median run)\n");
        for x in notes {
            let mut extra = String::new();
            if let (Some(p), Some(d)) = (x.promotions, x.demotions) {
                extra = format!(" (during the run: {p} promotions, {d} demotions)");
            }
            let _ = writeln!(md, "- {}: {}{extra}", x.label, x.note);
        }
    }
    let _ = writeln!(
        md,
        "\nThe whole benchmark took {:.0} s on this machine.",
        r.elapsed_secs
    );
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
