//! The functions the module exports. Each runs the simulator's own entry
//! point with the GIL released: a trace file goes through
//! [`tiercache_sim::run`] exactly as `tiercache sim --trace` does, columns
//! through [`tiercache_sim::simulate`] over a [`MemorySource`].
//!
//! A simulation returns `(report_json, curve)`: the report as
//! `tiercache sim --json` writes it, and the LRU miss-ratio curve at
//! `mrc_points` cache sizes (`[(cache_bytes, miss_ratio)]`, empty without
//! an MRC), from the same histogram as the report's.

use crate::columns;
use crate::errors::{to_py, value_error};
use crate::options;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use tiercache_sim::{
    open_trace, read_columns, Input, MemorySource, Progress, SimReport, SimSpec, TraceOptions,
};

fn trace_options(format: Option<&str>) -> PyResult<TraceOptions> {
    let mut o = TraceOptions::default();
    if let Some(f) = format {
        o.format = Some(f.parse().map_err(to_py)?);
    }
    Ok(o)
}

fn no_progress(_: &Progress) {}

/// The report's JSON and its curve at `points` sizes.
fn output(report: &SimReport, spec: &SimSpec, points: usize) -> (String, Vec<(u64, f64)>) {
    let bs = spec.block_size as u64;
    let curve = report
        .mrc
        .as_ref()
        .and_then(|m| m.full.as_ref())
        .map(|m| {
            m.curve(points)
                .into_iter()
                .map(|(c, r)| (c * bs, r))
                .collect()
        })
        .unwrap_or_default();
    (tiercache_sim::to_json(report), curve)
}

/// Simulates the trace at `path` (`format`: a name `tiercache sim
/// --format` takes, or None to detect it) with `options`
/// (see [`options`]).
#[pyfunction]
#[pyo3(signature = (path, format, options, mrc_points=200))]
pub fn simulate_file(
    py: Python<'_>,
    path: PathBuf,
    format: Option<&str>,
    options: &Bound<'_, PyDict>,
    mrc_points: usize,
) -> PyResult<(String, Vec<(u64, f64)>)> {
    let spec = options::spec(options)?;
    let input = Input::Trace {
        path,
        options: trace_options(format)?,
    };
    let report = py
        .detach(|| tiercache_sim::run(&input, &spec, &no_progress))
        .map_err(to_py)?;
    Ok(output(&report, &spec, mrc_points))
}

/// Simulates requests given as columns (see [`columns`]); `name` is the
/// report's source.
#[pyfunction]
#[pyo3(signature = (name, time, volume, offset, length, op, options, mrc_points=200))]
#[allow(clippy::too_many_arguments)]
pub fn simulate_columns(
    py: Python<'_>,
    name: &str,
    time: Option<&[u8]>,
    volume: Option<&[u8]>,
    offset: &[u8],
    length: &[u8],
    op: &[u8],
    options: &Bound<'_, PyDict>,
    mrc_points: usize,
) -> PyResult<(String, Vec<(u64, f64)>)> {
    let spec = options::spec(options)?;
    let cols = columns::from_bytes(time, volume, offset, length, op)?;
    let report = py
        .detach(|| {
            let mut src = MemorySource::from_columns(&cols)?;
            tiercache_sim::simulate(&mut src, name, &spec, &no_progress)
        })
        .map_err(to_py)?;
    Ok(output(&report, &spec, mrc_points))
}

/// Reads the trace at `path` whole into columns (see
/// [`columns::to_dict`]).
#[pyfunction]
#[pyo3(signature = (path, format=None))]
pub fn read_trace<'py>(
    py: Python<'py>,
    path: PathBuf,
    format: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = trace_options(format)?;
    let read = py
        .detach(|| read_columns(open_trace(&path, &opts)?))
        .map_err(to_py)?;
    columns::to_dict(py, &read)
}

/// The policies simulated when none are named, as `tiercache sim` lists
/// them.
#[pyfunction]
pub fn default_policies() -> Vec<String> {
    tiercache_sim::default_policies()
        .iter()
        .map(tiercache_sim::policy_label)
        .collect()
}

/// Cache sizes as `tiercache sim` reads them (`256M,1G`, `1G..16G`), in
/// bytes, sorted.
#[pyfunction]
pub fn parse_cache_sizes(sizes: &str) -> PyResult<Vec<u64>> {
    if sizes.trim().is_empty() {
        return Err(value_error("no cache size given"));
    }
    tiercache_sim::parse_cache_sizes(sizes).map_err(to_py)
}
