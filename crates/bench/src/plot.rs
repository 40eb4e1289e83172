//! PNG plots with plotters (text through the system's fonts via fontconfig,
//! as crates/sim does: scripts/install-deps.sh installs fonts-dejavu-core).

use crate::run_result::{Kind, RunResult};
use crate::Results;
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use tiercache_types::fmt_bytes;

/// IOPS windows averaged by the bold line of the IOPS plots.
pub const SMOOTH_WINDOWS: usize = 5;

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
];

const FONT: &str = "sans-serif";

fn e(err: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plot: {err}")
}

/// Centered moving average over `w` points.
pub fn smooth(pts: &[(f64, f64)], w: usize) -> Vec<(f64, f64)> {
    let h = w / 2;
    (0..pts.len())
        .map(|i| {
            let lo = i.saturating_sub(h);
            let hi = (i + h + 1).min(pts.len());
            let avg = pts[lo..hi].iter().map(|p| p.1).sum::<f64>() / (hi - lo) as f64;
            (pts[i].0, avg)
        })
        .collect()
}

/// Draws every plot; returns (title, file name) in report order.
pub fn write_all(r: &Results, out: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    let colored: Vec<(&RunResult, RGBColor)> = r
        .runs
        .iter()
        .enumerate()
        .map(|(i, x)| (x, COLORS[i % COLORS.len()]))
        .collect();
    if colored.iter().any(|(x, _)| !x.measured.series.is_empty()) {
        let title = "IOPS over time, both jobs summed (log scale)";
        iops_plot(&out.join("iops.png"), title, &colored, true)?;
        files.push((title.to_string(), "iops.png".to_string()));
        // The zoom: configurations far below the fast device.
        let fast = r.fast_iops().unwrap_or(f64::INFINITY);
        let low: Vec<(&RunResult, RGBColor)> = colored
            .iter()
            .copied()
            .filter(|(x, _)| x.measured.iops < 0.25 * fast)
            .collect();
        if !low.is_empty() {
            let title = "Zoom: configurations below 25% of the fast device (linear scale)";
            iops_plot(&out.join("iops-zoom.png"), title, &low, false)?;
            files.push((title.to_string(), "iops-zoom.png".to_string()));
        }
    }
    let title = "Completion latency percentiles (log scale)";
    let series: Vec<(String, RGBColor, &crate::Measured)> = colored
        .iter()
        .map(|(x, c)| (x.label.clone(), *c, &x.measured))
        .collect();
    latency_plot(
        &out.join("latency.png"),
        title,
        &series,
        r.fast_threshold_ns,
    )?;
    files.push((title.to_string(), "latency.png".to_string()));
    if !r.sweep.is_empty() {
        let title = format!(
            "Data size against a fixed {} cache",
            fmt_bytes(r.settings.cache_size)
        );
        sweep_plot(&out.join("sweep.png"), &title, r)?;
        files.push((title, "sweep.png".to_string()));
        let series: Vec<(String, RGBColor, &crate::Measured)> = r
            .sweep
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (
                    format!("data {} ({}x cache)", fmt_bytes(p.data_size), p.factor),
                    COLORS[i % COLORS.len()],
                    &p.measured,
                )
            })
            .collect();
        let title = "Sweep: completion latency percentiles by data size (log scale)";
        latency_plot(
            &out.join("sweep-latency.png"),
            title,
            &series,
            r.fast_threshold_ns,
        )?;
        files.push((title.to_string(), "sweep-latency.png".to_string()));
    }
    Ok(files)
}

/// Draws the IOPS-over-time plot (log scale) and the latency-percentile
/// plot of `runs` as `<prefix>-iops.png` and `<prefix>-latency.png` in
/// `out`, titles ending in `what`; returns the file names written. For
/// runs measured elsewhere (see [`crate::fio_dir`]). The fast device's
/// p99 (a run of kind Fast, if any) is drawn as the latency threshold.
pub fn write_runs(runs: &[RunResult], prefix: &str, what: &str, out: &Path) -> Result<Vec<String>> {
    let colored: Vec<(&RunResult, RGBColor)> = runs
        .iter()
        .enumerate()
        .map(|(i, x)| (x, COLORS[i % COLORS.len()]))
        .collect();
    let mut files = Vec::new();
    if colored.iter().any(|(x, _)| !x.measured.series.is_empty()) {
        let file = format!("{prefix}-iops.png");
        let title = format!("IOPS over time, both jobs summed (log scale), {what}");
        iops_plot(&out.join(&file), &title, &colored, true)?;
        files.push(file);
    }
    let threshold = runs
        .iter()
        .find(|r| r.kind == Kind::Fast)
        .and_then(|r| r.measured.pct(99.0))
        .unwrap_or(0);
    let series: Vec<(String, RGBColor, &crate::Measured)> = colored
        .iter()
        .map(|(x, c)| (x.label.clone(), *c, &x.measured))
        .collect();
    let file = format!("{prefix}-latency.png");
    let title = format!("Completion latency percentiles (log scale), {what}");
    latency_plot(&out.join(&file), &title, &series, threshold)?;
    files.push(file);
    Ok(files)
}

fn legend_line(c: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(4))
}

fn iops_plot(path: &Path, title: &str, runs: &[(&RunResult, RGBColor)], log: bool) -> Result<()> {
    let pts: Vec<(f64, f64)> = runs
        .iter()
        .flat_map(|(x, _)| x.measured.series.iter().copied())
        .collect();
    let xmax = pts.iter().map(|p| p.0).fold(1.0, f64::max);
    let ymax = pts.iter().map(|p| p.1).fold(10.0, f64::max) * 1.3;
    let root = BitMapBackend::new(path, (1400, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    if log {
        let ymin = pts
            .iter()
            .map(|p| p.1)
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .min(ymax / 10.0)
            .max(1.0)
            * 0.7;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 26))
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..xmax, (ymin..ymax).log_scale())
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("time since the run started (s)")
            .y_desc("IOPS (both jobs)")
            .axis_desc_style((FONT, 20))
            .label_style((FONT, 16))
            .y_label_formatter(&|v| fmt_count(*v))
            .draw()
            .map_err(e)?;
        draw_iops_series(&mut chart, runs, ymin)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    } else {
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 26))
            .margin(20)
            .x_label_area_size(55)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("time since the run started (s)")
            .y_desc("IOPS (both jobs)")
            .axis_desc_style((FONT, 20))
            .label_style((FONT, 16))
            .y_label_formatter(&|v| fmt_count(*v))
            .draw()
            .map_err(e)?;
        draw_iops_series(&mut chart, runs, 0.0)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

fn draw_iops_series<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    runs: &[(&RunResult, RGBColor)],
    floor: f64,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate<From = (f64, f64)>,
{
    for (x, c) in runs {
        let raw: Vec<(f64, f64)> = x
            .measured
            .series
            .iter()
            .map(|&(t, v)| (t, v.max(floor)))
            .collect();
        let c = *c;
        chart
            .draw_series(raw.iter().map(|&p| Circle::new(p, 2, c.mix(0.35).filled())))
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(
                smooth(&raw, SMOOTH_WINDOWS),
                c.stroke_width(3),
            ))
            .map_err(e)?
            .label(format!("{} (avg {})", x.label, fmt_count(x.measured.iops)))
            .legend(legend_line(c));
    }
    Ok(())
}

/// Position of percentile `p` on a "nines" axis: 90 -> 1, 99 -> 2, 99.9 -> 3.
fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

fn latency_plot(
    path: &Path,
    title: &str,
    series: &[(String, RGBColor, &crate::Measured)],
    threshold_ns: u64,
) -> Result<()> {
    let to_ms = |ns: u64| ns as f64 / 1e6;
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, _, m)| {
            m.clat_percentiles
                .iter()
                .filter(|(p, _)| *p >= 50.0 && *p <= 99.99)
                .map(|&(_, v)| to_ms(v))
        })
        .filter(|v| *v > 0.0)
        .collect();
    if all.is_empty() {
        return Err(anyhow!("plot: no latency percentiles"));
    }
    let ymin = all.iter().copied().fold(f64::INFINITY, f64::min) * 0.6;
    let ymax = all.iter().copied().fold(0.0, f64::max) * 1.8;
    let root = BitMapBackend::new(path, (1400, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let (xmin, xmax) = (nines(50.0) - 0.1, nines(99.99) + 0.15);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 26))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(90)
        .build_cartesian_2d(xmin..xmax, (ymin..ymax).log_scale())
        .map_err(e)?;
    let ticks: Vec<f64> = [50.0, 90.0, 99.0, 99.9, 99.99]
        .iter()
        .map(|&p| nines(p))
        .collect();
    chart
        .configure_mesh()
        .x_desc("percentile of completion latency")
        .y_desc("completion latency (ms)")
        .axis_desc_style((FONT, 20))
        .label_style((FONT, 16))
        .x_labels(40)
        .x_label_formatter(&|x| {
            // Label only the ticks that are a whole number of nines or 50%.
            for (&t, p) in ticks
                .iter()
                .zip(["50th", "90th", "99th", "99.9th", "99.99th"])
            {
                if (x - t).abs() < 0.03 {
                    return p.to_string();
                }
            }
            String::new()
        })
        .y_label_formatter(&|v| {
            if *v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        })
        .draw()
        .map_err(e)?;
    if threshold_ns > 0 {
        let t = to_ms(threshold_ns);
        if t > ymin && t < ymax {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(xmin, t), (xmax, t)],
                    10,
                    6,
                    BLACK.mix(0.6).stroke_width(2),
                ))
                .map_err(e)?
                .label(format!("fast device p99 ({t:.2} ms)"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.mix(0.6)));
        }
    }
    for (label, c, m) in series {
        let pts: Vec<(f64, f64)> = m
            .clat_percentiles
            .iter()
            .filter(|(p, v)| *p >= 50.0 && *p <= 99.99 && *v > 0)
            .map(|&(p, v)| (nines(p), to_ms(v)))
            .collect();
        let c = *c;
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
            .map_err(e)?
            .label(label.clone())
            .legend(legend_line(c));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

fn sweep_plot(path: &Path, title: &str, r: &Results) -> Result<()> {
    let root = BitMapBackend::new(path, (1600, 750)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, (FONT, 28)).map_err(e)?;
    let (left, right) = root.split_horizontally(800);
    sweep_iops(&left, r)?;
    sweep_shares(&right, r)?;
    root.present().map_err(e)?;
    Ok(())
}

fn factor_range(r: &Results) -> (f64, f64) {
    let lo = r
        .sweep
        .iter()
        .map(|p| p.factor)
        .fold(f64::INFINITY, f64::min);
    let hi = r.sweep.iter().map(|p| p.factor).fold(0.0, f64::max);
    (lo / 1.4, hi * 1.4)
}

fn sweep_iops(area: &DrawingArea<BitMapBackend, Shift>, r: &Results) -> Result<()> {
    let (xlo, xhi) = factor_range(r);
    let mut refs: Vec<(&str, f64, RGBColor)> = Vec::new();
    if let Some(f) = r.fast_iops() {
        refs.push(("fast device alone", f, COLORS[0]));
    }
    if let Some(s) = r.runs.iter().find(|x| x.kind == Kind::Slow) {
        refs.push(("slow device alone", s.measured.iops, COLORS[1]));
    }
    let vals: Vec<f64> = r
        .sweep
        .iter()
        .map(|p| p.measured.iops)
        .chain(refs.iter().map(|x| x.1))
        .filter(|v| *v > 0.0)
        .collect();
    let ylo = vals.iter().copied().fold(f64::INFINITY, f64::min) * 0.5;
    let yhi = vals.iter().copied().fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption("average IOPS (log scales)", (FONT, 22))
        .margin(15)
        .x_label_area_size(55)
        .y_label_area_size(85)
        .build_cartesian_2d((xlo..xhi).log_scale(), (ylo.max(1.0)..yhi).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("data size / cache size")
        .y_desc("IOPS (both jobs)")
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .x_label_formatter(&|v| factor_label(r, *v))
        .y_label_formatter(&|v| fmt_count(*v))
        .draw()
        .map_err(e)?;
    for (label, v, c) in &refs {
        let c = *c;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(xlo, *v), (xhi, *v)],
                10,
                6,
                c.stroke_width(2),
            ))
            .map_err(e)?
            .label(format!("{label} ({})", fmt_count(*v)))
            .legend(legend_line(c));
    }
    let pts: Vec<(f64, f64)> = r
        .sweep
        .iter()
        .map(|p| (p.factor, p.measured.iops.max(1.0)))
        .collect();
    let c = COLORS[2];
    chart
        .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
        .map_err(e)?
        .label("tiercache, cache filled first")
        .legend(legend_line(c));
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 6, c.filled())))
        .map_err(e)?;
    if let Some(edge) = hot_set_edge(r) {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(edge, ylo.max(1.0)), (edge, yhi)],
                6,
                6,
                BLACK.mix(0.5).stroke_width(2),
            ))
            .map_err(e)?
            .label("hot 10% of the data = cache size")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.mix(0.5)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// "4x" at a swept factor (within 3%), "" elsewhere: the log axis puts
/// a tick at every integer, and their labels run into each other.
fn factor_label(r: &Results, v: f64) -> String {
    r.sweep
        .iter()
        .find(|p| (v / p.factor - 1.0).abs() < 0.03)
        .map(|p| format!("{}x", p.factor))
        .unwrap_or_default()
}

/// Where the hot 10% of the data equals the cache (data = 10x cache), if
/// inside the swept range.
fn hot_set_edge(r: &Results) -> Option<f64> {
    let (lo, hi) = factor_range(r);
    (lo..hi).contains(&10.0).then_some(10.0)
}

fn sweep_shares(area: &DrawingArea<BitMapBackend, Shift>, r: &Results) -> Result<()> {
    let (xlo, xhi) = factor_range(r);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "hit ratio and IOs served at fast-device latency",
            (FONT, 22),
        )
        .margin(15)
        .x_label_area_size(55)
        .y_label_area_size(70)
        .build_cartesian_2d((xlo..xhi).log_scale(), 0.0..105.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("data size / cache size")
        .y_desc("% of reads")
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .x_label_formatter(&|v| factor_label(r, *v))
        .draw()
        .map_err(e)?;
    let hits: Vec<(f64, f64)> = r
        .sweep
        .iter()
        .filter_map(|p| p.hit_ratio.map(|h| (p.factor, h * 100.0)))
        .collect();
    let fast: Vec<(f64, f64)> = r
        .sweep
        .iter()
        .map(|p| {
            (
                p.factor,
                100.0 * p.measured.share_within(r.fast_threshold_ns),
            )
        })
        .collect();
    for (label, pts, c) in [
        ("hit ratio (tiercache counters)", hits, COLORS[3]),
        (
            "IOs completing within the fast device's p99",
            fast,
            COLORS[4],
        ),
    ] {
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
            .map_err(e)?
            .label(label)
            .legend(legend_line(c));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 6, c.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn fmt_count(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1000.0 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoothing_averages_neighbours() {
        let s = smooth(&[(0.0, 0.0), (1.0, 3.0), (2.0, 6.0)], 3);
        assert_eq!(s, vec![(0.0, 1.5), (1.0, 3.0), (2.0, 4.5)]);
    }

    #[test]
    fn nines_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
    }
}
