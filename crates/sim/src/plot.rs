//! PNG plot: miss ratio against cache size (log scale), one line per policy,
//! plus OPT and the LRU miss-ratio curve.

use crate::error::{Error, Result};
use crate::simulate::SimReport;
use plotters::prelude::*;
use std::path::Path;
use tiercache_types::fmt_bytes;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

/// (label, points, dashed).
type Series = (String, Vec<(f64, f64)>, bool);

/// Writes a 1200x800 PNG to `path`.
pub fn write_png(r: &SimReport, path: &Path) -> Result<()> {
    // Series: (label, points, dashed?)
    let mut series: Vec<Series> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    for c in r.configs.iter().filter(|c| c.error.is_none()) {
        if !labels.contains(&c.policy) {
            labels.push(c.policy.clone());
        }
    }
    for l in &labels {
        let mut pts: Vec<(f64, f64)> = r
            .configs
            .iter()
            .filter(|c| &c.policy == l && c.error.is_none())
            .map(|c| (c.cache_bytes as f64, c.miss_ratio))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push((l.clone(), pts, false));
    }
    if !r.opt.is_empty() {
        let mut pts: Vec<(f64, f64)> = r
            .opt
            .iter()
            .map(|o| (o.cache_bytes as f64, o.miss_ratio))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let v = serde_json::to_value(r.opt[0].variant)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        series.push((format!("OPT ({v})"), pts, true));
    }
    let mut mrc_label = None;
    if let Some(m) = &r.mrc {
        let pts: Vec<(f64, f64)> = m
            .curve
            .iter()
            .filter(|p| p.0 > 0)
            .map(|&(b, mr)| (b as f64, mr))
            .collect();
        let label = if m.sample_rate < 1.0 {
            format!("LRU MRC ({}, rate {:.4})", m.method, m.sample_rate)
        } else {
            format!("LRU MRC ({})", m.method)
        };
        mrc_label = Some(label.clone());
        series.push((label, pts, true));
    }
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    if all.is_empty() {
        return Err(Error::Plot("nothing to plot".into()));
    }
    let bs = r.spec.block_size as f64;
    // X range: the simulated sizes, widened to the MRC's range but not
    // below one block.
    let sim_min = r.spec.cache_sizes.iter().copied().min().unwrap_or(1) as f64;
    let sim_max = r.spec.cache_sizes.iter().copied().max().unwrap_or(1) as f64;
    let mrc_max = r
        .mrc
        .as_ref()
        .and_then(|m| m.curve.last().map(|p| p.0 as f64))
        .unwrap_or(sim_max);
    let xmin = (sim_min / 16.0).max(bs);
    let xmax = (sim_max * 2.0)
        .max(mrc_max.min(sim_max * 64.0))
        .max(xmin * 4.0);
    let ymax = all
        .iter()
        .filter(|p| p.0 >= xmin && p.0 <= xmax)
        .map(|p| p.1)
        .fold(0.0f64, f64::max)
        .clamp(0.01, 1.0)
        * 1.05;

    // X is log2(bytes) on a linear axis from one whole power of two to
    // another; with at most 14 labels plotters puts them on whole numbers
    // (step 1, or 2 for wide ranges), i.e. on powers of two.
    let (lx0, lx1) = (xmin.log2().floor(), xmax.log2().ceil());
    let span = (lx1 - lx0).max(1.0) as usize;
    let labels = if span <= 13 { span + 1 } else { span / 2 + 1 };
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let title = format!(
        "Miss ratio vs cache size: {} ({} blocks, {})",
        short(&r.source, 60),
        fmt_bytes(r.spec.block_size as u64),
        r.spec.mode
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(75)
        .build_cartesian_2d(lx0..lx1, 0.0..ymax)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_labels(labels)
        .x_desc("cache size (log scale)")
        .y_desc("miss ratio (block references)")
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .x_label_formatter(&|x| fmt_bytes(2f64.powf(*x).round() as u64))
        .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
        .draw()
        .map_err(plot_err)?;
    for (i, (label, pts, dashed)) in series.iter().enumerate() {
        let color = if Some(label) == mrc_label.as_ref() {
            RGBColor(60, 60, 60)
        } else {
            COLORS[i % COLORS.len()]
        };
        let (lo, hi) = (2f64.powf(lx0), 2f64.powf(lx1));
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.0 >= lo && p.0 <= hi)
            .map(|&(x, y)| (x.log2(), y))
            .collect();
        let style = ShapeStyle {
            color: color.to_rgba(),
            filled: false,
            stroke_width: if *dashed { 2 } else { 3 },
        };
        let anno = if *dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                .map_err(plot_err)?
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(plot_err)?
        };
        anno.label(label.clone()).legend(move |(x, y)| {
            PathElement::new(
                vec![(x, y), (x + 24, y)],
                ShapeStyle {
                    color: color.to_rgba(),
                    filled: true,
                    stroke_width: 3,
                },
            )
        });
        if Some(label) != mrc_label.as_ref() {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(plot_err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 3).collect();
        format!("{t}...")
    }
}
