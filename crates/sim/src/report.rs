//! Text table, JSON and PNG renderings of a [`SimReport`].

use crate::error::{Error, Result};
use crate::simulate::SimReport;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use tiercache_types::fmt_bytes;

/// A count with a metric suffix: `950`, `12.3k`, `1.35M`, `2.10G`.
pub fn fmt_count(n: u64) -> String {
    human(n as f64)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

fn us(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1}ms", x / 1000.0)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn human(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2}G", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

fn first_touch(n: u64, misses: u64) -> String {
    if misses == 0 {
        return "0".into();
    }
    format!(
        "{} ({:.0}%)",
        human(n as f64),
        100.0 * n as f64 / misses as f64
    )
}

/// A plain-text report: a header describing the input and the spec, then
/// one row per (cache size, policy), with OPT and the LRU MRC at each size.
/// Latencies in microseconds unless suffixed `ms`.
pub fn render_table(r: &SimReport) -> String {
    let mut out = String::new();
    let s = &r.spec;
    let t = &r.trace;
    let _ = writeln!(out, "source: {}", r.source);
    let _ = writeln!(
        out,
        "cache: {} blocks, {}, sequential cutoff {}, devices {} (fast/slow), queue depth {}",
        fmt_bytes(s.block_size as u64),
        s.mode,
        if s.sequential_cutoff == 0 {
            "off".to_string()
        } else {
            fmt_bytes(s.sequential_cutoff)
        },
        s.device,
        s.queue_depth
    );
    let _ = write!(
        out,
        "trace: {} requests ({} reads, {} writes), {} read, {} written, {} block refs",
        t.requests,
        t.reads,
        t.writes,
        fmt_bytes(t.read_bytes),
        fmt_bytes(t.write_bytes),
        t.block_refs
    );
    if let Some(u) = t.unique_blocks {
        let _ = write!(
            out,
            ", {} distinct blocks ({} footprint)",
            u,
            fmt_bytes(u * s.block_size as u64)
        );
    }
    if t.timestamps {
        let _ = writeln!(out, ", {:.1} s of trace time", t.duration_s);
    } else {
        let _ = writeln!(out, ", no timestamps (the IO counter is the clock)");
    }
    if let Some(m) = &r.mrc {
        let _ = writeln!(
            out,
            "LRU MRC: {} (sampling rate {}, {} blocks tracked)",
            m.method, m.sample_rate, m.tracked_blocks
        );
    }
    let _ = writeln!(out);
    let header = [
        "cache",
        "policy",
        "read hit",
        "write hit",
        "miss",
        "warm hit",
        "first-touch misses",
        "promoted",
        "declined",
        "demoted",
        "writeback",
        "bypassed",
        "dirty",
        "mean",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "IOPS",
        "IOPS bound",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut sizes: Vec<u64> = s.cache_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        for c in r.configs.iter().filter(|c| c.cache_bytes == size) {
            if let Some(e) = &c.error {
                rows.push(vec![
                    fmt_bytes(size),
                    c.policy.clone(),
                    format!("error: {e}"),
                ]);
                continue;
            }
            let k = &c.counters;
            rows.push(vec![
                fmt_bytes(size),
                c.policy.clone(),
                pct(c.read_hit_ratio),
                if k.write_ios == 0 {
                    "-".into()
                } else {
                    pct(c.write_hit_ratio)
                },
                pct(c.miss_ratio),
                c.warm.map_or("-".into(), |w| pct(w.hit_ratio)),
                first_touch(
                    c.first_touch_misses,
                    (k.read_misses + k.write_misses).max(c.first_touch_misses),
                ),
                k.promotions.to_string(),
                k.declined_fills.to_string(),
                k.demotions.to_string(),
                (k.writebacks).to_string(),
                fmt_bytes(k.bypassed_bytes),
                k.dirty.to_string(),
                us(c.latency.mean_us),
                us(c.latency.p50_us),
                us(c.latency.p90_us),
                us(c.latency.p99_us),
                us(c.latency.p999_us),
                human(c.iops),
                c.iops_limited_by.clone(),
            ]);
        }
        for o in r.opt.iter().filter(|o| o.cache_bytes == size) {
            rows.push(vec![
                fmt_bytes(size),
                format!(
                    "OPT ({})",
                    serde_json::to_value(o.variant)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                ),
                "".into(),
                "".into(),
                pct(o.miss_ratio),
                o.warm.map_or("-".into(), |w| pct(w.hit_ratio)),
                first_touch(o.first_touch_misses, o.misses),
            ]);
        }
        if let Some(m) = &r.mrc {
            for (_, mr) in m.at_sizes.iter().filter(|x| x.0 == size) {
                rows.push(vec![
                    fmt_bytes(size),
                    "LRU (MRC)".into(),
                    "".into(),
                    "".into(),
                    pct(*mr),
                ]);
            }
        }
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() && !cell.starts_with("error") {
                widths[i] = widths[i].max(cell.len());
            }
        }
    }
    let line = |cells: &[String], out: &mut String| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i < 2 {
                let _ = write!(l, "{c:<w$}  ");
            } else if c.starts_with("error") {
                let _ = write!(l, "{c}");
            } else {
                let _ = write!(l, "{c:>w$}  ");
            }
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(
        &header.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        &mut out,
    );
    for row in &rows {
        line(row, &mut out);
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let _ = writeln!(
        out,
        "warm hit: block hit ratio from the moment that configuration's cache first became full (- = it never did); first-touch misses: misses on blocks never referenced before (no cache can avoid them), with their share of the row's misses; declined: misses the policy chose not to fill (their blocks go to its ghost)"
    );
    let _ = writeln!(
        out,
        "latencies in microseconds (model: {}); IOPS = min(queue depth / mean latency, device limits); simulated in {:.1} s",
        s.device, r.elapsed_s
    );
    out
}

/// The report as pretty-printed JSON (every field of [`SimReport`] except
/// the full MRC histogram).
pub fn to_json(r: &SimReport) -> String {
    serde_json::to_string_pretty(r).expect("a report always serializes")
}

/// Where [`write_outputs`] writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputPaths {
    pub json: Option<PathBuf>,
    pub png: Option<PathBuf>,
}

/// Writes the requested files and returns the text table (for stdout).
pub fn write_outputs(r: &SimReport, out: &OutputPaths) -> Result<String> {
    if let Some(p) = &out.json {
        std::fs::write(p, to_json(r)).map_err(|e| Error::io(&p.display().to_string(), e))?;
    }
    if let Some(p) = &out.png {
        write_png(r, p)?;
    }
    Ok(render_table(r))
}

#[cfg(feature = "plot")]
fn write_png(r: &SimReport, path: &Path) -> Result<()> {
    crate::plot::write_png(r, path)
}

#[cfg(not(feature = "plot"))]
fn write_png(_: &SimReport, path: &Path) -> Result<()> {
    Err(Error::Plot(format!(
        "cannot write {}: tiercache-sim was built without its `plot` feature",
        path.display()
    )))
}

/// For callers that only have a path.
pub fn write_json(r: &SimReport, path: &Path) -> Result<()> {
    std::fs::write(path, to_json(r)).map_err(|e| Error::io(&path.display().to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4096), "4 KiB");
        assert_eq!(fmt_bytes(10 << 30), "10 GiB");
        assert_eq!(fmt_bytes(1536 << 20), "1.50 GiB");
    }
}
