//! tiercache-sim: what would a cache of a given size do for this workload?
//!
//! Replays a block IO trace or a synthetic (fio-like) workload through the
//! same [`tiercache_policy::Director`] the live engine runs, for many
//! (cache size, policy) configurations at once, with a virtual clock and no
//! device IO; adds Belady's OPT as the bound and the exact (or SHARDS) LRU
//! miss-ratio curve over every cache size; prices the decisions with a
//! device latency model; and renders a table, JSON and a PNG plot.
//!
//! The CLI's entry points:
//! ```no_run
//! use tiercache_sim::*;
//! let input = Input::Workload(synth::Workload::default());
//! let spec = SimSpec { cache_sizes: vec![256 << 20, 1 << 30], ..SimSpec::default() };
//! let report = run(&input, &spec, &|p: &Progress| eprintln!("{p:?}")).unwrap();
//! let table = write_outputs(&report, &OutputPaths {
//!     json: Some("sim.json".into()),
//!     png: Some("sim.png".into()),
//! }).unwrap();
//! print!("{table}");
//! ```
//!
//! Modules: [`trace`] (readers), [`columns`] (requests held in memory),
//! [`synth`] and [`fiojob`] (workloads),
//! [`simulate()`] (the driver), [`opt`], [`mrc`], [`device`], [`report`],
//! [`plot`].

pub mod columns;
pub mod device;
pub mod error;
pub mod fiojob;
pub mod footprint;
pub mod idmap;
pub mod mrc;
pub mod opt;
pub mod panel;
#[cfg(feature = "plot")]
pub mod plot;
pub mod pool;
pub mod report;
pub mod rng;
pub mod simulate;
pub mod synth;
pub mod trace;

pub use columns::{read_columns, Columns, MemorySource, ReadColumns};
pub use device::{DeviceModel, DeviceProfile};
pub use error::{Error, Result};
pub use fiojob::{parse_fio_job, FioJob};
pub use footprint::{distinct_blocks, trace_footprint};
pub use mrc::{Mrc, MrcMethod};
pub use opt::OptVariant;
pub use panel::{
    panel_trace_options, PANEL_BASELINES, PANEL_BLOCK_SIZES, PANEL_GAP_BAR_POINTS, PANEL_SIZE_PCTS,
    PANEL_TRACES,
};
pub use report::{render_table, to_json, write_outputs, OutputPaths};
pub use simulate::{
    default_policies, parse_cache_sizes, parse_policy, policy_label, simulate, CleanerSpec,
    ConfigResult, ConfigRunner, Convergence, ConvergenceReport, MrcSpec, Phase, Progress,
    RequestSource, SimReport, SimSpec, WarmResult,
};
pub use synth::{Distribution, Workload};
pub use trace::{open_trace, Request, TraceFormat, TraceOptions, TraceReader};

use std::path::PathBuf;

/// What to simulate.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A trace file (`-` for standard input), compressed or not.
    Trace {
        path: PathBuf,
        options: TraceOptions,
    },
    /// A synthetic workload.
    Workload(Workload),
    /// A fio job file, mapped onto a workload; `ios` overrides the number of
    /// IOs derived from the job. A job with no IO count fio would know up
    /// front (`time_based` without `number_ios`) runs until converged when
    /// the spec has [`SimSpec::converge`] (bounded by
    /// [`OPEN_ENDED_IO_BOUND`]), else ten passes.
    FioJob {
        path: PathBuf,
        section: Option<String>,
        ios: Option<u64>,
    },
}

fn describe(w: &Workload, until_converged: bool) -> String {
    format!(
        "synthetic {} bs={} size={} jobs={} rwmixread={} seq={} ios{}{} seed={}",
        w.distribution,
        report::fmt_bytes(w.block_size),
        report::fmt_bytes(w.size),
        w.jobs,
        w.rwmixread,
        w.sequential_share,
        if until_converged { "<=" } else { "=" },
        w.ios,
        w.seed
    )
}

/// The IO bound of a run until convergence when the input sets none (a
/// `time_based` fio job): memory for OPT is 8 bytes per block reference.
pub const OPEN_ENDED_IO_BOUND: u64 = 200_000_000;

/// Opens `input` and runs [`simulate()`] on it. Notes from a fio job file
/// (ignored options, assumptions) are added to the report's notes.
///
/// [`SimSpec::converge`] applies to synthetic workloads (stop early once
/// converged, the workload's `ios` being the bound) and to open-ended fio
/// jobs; a trace or a fio job with a definite IO count is replayed whole.
pub fn run(
    input: &Input,
    spec: &SimSpec,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<SimReport> {
    match input {
        Input::Trace { path, options } => {
            let mut r = open_trace(path, options)?;
            let name = format!("{} ({})", path.display(), r.format());
            let spec = SimSpec {
                converge: None,
                ..spec.clone()
            };
            simulate(&mut r, &name, &spec, progress)
        }
        Input::Workload(w) => {
            let mut s = w.requests()?;
            simulate(
                &mut s,
                &describe(w, spec.converge.is_some()),
                spec,
                progress,
            )
        }
        Input::FioJob { path, section, ios } => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::io(&path.display().to_string(), e))?;
            let mut job = parse_fio_job(&text, section.as_deref()).map_err(|e| match e {
                Error::Parse { line, msg, .. } => Error::Parse {
                    source_name: path.display().to_string(),
                    line,
                    msg,
                },
                other => other,
            })?;
            let mut spec = spec.clone();
            if let Some(n) = ios {
                job.workload.ios = *n;
                spec.converge = None;
            } else if !job.open_ended {
                spec.converge = None;
            } else if spec.converge.is_some() {
                job.workload.ios = OPEN_ENDED_IO_BOUND;
                job.notes.retain(|n| !n.starts_with("time_based"));
                job.notes.push(format!(
                    "time_based: runtime is not modelled; simulating until the hit ratios converge, at most {} IOs",
                    report::fmt_count(OPEN_ENDED_IO_BOUND)
                ));
            }
            let spec = &spec;
            let mut s = job.workload.requests()?;
            let name = format!(
                "{} [{}]: {}",
                path.display(),
                job.name,
                describe(&job.workload, spec.converge.is_some())
            );
            let mut rep = simulate(&mut s, &name, spec, progress)?;
            rep.notes.extend(job.notes);
            Ok(rep)
        }
    }
}
