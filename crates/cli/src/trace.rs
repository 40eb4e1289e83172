//! `tiercache trace`: records the requests a running server receives into
//! a trace file that `tiercache sim` (and the Python package) read back
//! (tiercache's own format, docs/TRACE-FORMAT.md). This is the client: it
//! sends the control request ([`TraceRequest`]) and shows the seconds go
//! by; the server side is `recording.rs`.

use crate::control::{self, Reply, Request};
use crate::recording::TraceRequest;
use crate::ControlArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use tiercache_engine::DEFAULT_TRACE_BUFFER;

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// Record only this volume of the pool (default: every volume).
    #[arg(long)]
    volume: Option<String>,
    /// How long to record.
    #[arg(long)]
    seconds: f64,
    /// The trace file to write (zstd compressed; overwritten).
    #[arg(long)]
    out: PathBuf,
    /// Keep this share of the blocks (0 < RATE <= 1), chosen by a hash of
    /// the block as SHARDS does: simulate the trace with cache sizes times
    /// RATE for the miss ratios of the full sizes.
    #[arg(long, default_value_t = 1.0)]
    sample: f64,
    /// Requests the server buffers for the writer; when the writer falls
    /// behind by more, requests are dropped (counted), never delayed. The
    /// first recording of a server sets it for the server's life.
    #[arg(long, default_value_t = DEFAULT_TRACE_BUFFER)]
    buffer: usize,
}

/// The client: asks the server to record, shows progress, prints the summary.
pub fn run(a: &TraceArgs) -> Result<()> {
    if !(a.sample > 0.0 && a.sample <= 1.0) {
        bail!("--sample must be in (0, 1], got {}", a.sample);
    }
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        bail!("--seconds must be positive");
    }
    let out = std::path::absolute(&a.out).context("--out")?;
    let req = Request::Trace(TraceRequest {
        out,
        volume: a.volume.clone(),
        seconds: a.seconds,
        sample: a.sample,
        buffer: a.buffer.max(2),
    });
    let bar = indicatif::ProgressBar::new(a.seconds.ceil() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("recording [{bar:40}] {pos}/{len} s")
            .expect("template")
            .progress_chars("=> "),
    );
    let reply = control::call(&a.control.path(), &req, |done, _| bar.set_position(done))?;
    bar.finish_and_clear();
    match reply {
        Reply::Traced(s) => {
            println!("{s}");
            if s.dropped > 0 {
                eprintln!(
                    "tiercache: warning: {} requests were dropped (the writer fell behind); \
                     a larger --buffer or a lower --sample keeps up",
                    s.dropped
                );
            }
            Ok(())
        }
        Reply::Error { message } => bail!("{message}"),
        other => bail!("unexpected reply {other:?}"),
    }
}
