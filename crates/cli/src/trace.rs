//! `tiercache trace`: records the requests a running server receives into
//! a trace file that `tiercache sim` (and the Python package) read back
//! (tiercache's own format, docs/TRACE-FORMAT.md).
//!
//! The client sends the control request ([`TraceRequest`]) and shows the
//! seconds go by; the server's control connection thread is the writer: it
//! takes requests from the engine's recorder (`crates/engine/src/
//! recorder.rs`: a bounded lock-free queue the IO path pushes into, never
//! waiting), keeps the sampled blocks (SHARDS-style, by a hash of the
//! block) and writes them zstd compressed to the file. The file is written
//! by the server, at the absolute path the client gave. A client that goes
//! away (Ctrl-C) ends the recording at the next progress line, with the
//! file complete.

use crate::control::{self, Reply, Request};
use crate::ControlArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tiercache_engine::{Engine, TracedOp, DEFAULT_TRACE_BUFFER};
use tiercache_sim::trace::recorded::{
    sampled_runs, RecordedHeader, RecordedOp, RecordedRequest, RecordedWriter,
};

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

/// The control request: what to record, where.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Absolute path of the file the server writes.
    pub out: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    pub seconds: f64,
    pub sample: f64,
    pub buffer: usize,
}

/// What a recording did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceSummary {
    pub out: PathBuf,
    /// Seconds recorded.
    pub seconds: f64,
    /// Requests the server received and handed to the writer.
    pub requests: u64,
    /// Requests left out because the writer fell behind.
    pub dropped: u64,
    /// Records in the file (the sampled requests' pieces).
    pub records: u64,
    pub sample_rate: f64,
    /// Size of the file.
    pub bytes: u64,
}

impl std::fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "recorded {} requests in {:.1} s ({} dropped), {} records at sample rate {} \
             in {} ({} bytes)",
            self.requests,
            self.seconds,
            self.dropped,
            self.records,
            self.sample_rate,
            self.out.display(),
            self.bytes
        )
    }
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

/// How long the writer sleeps when the queue is empty.
const IDLE_WAIT: Duration = Duration::from_millis(2);

/// The server's side: records for `req.seconds` (or until `progress`,
/// called about once a second with the seconds done and asked, returns
/// `false`), writing the file.
pub fn record(
    engine: &Arc<Engine>,
    req: &TraceRequest,
    mut progress: impl FnMut(u64, u64) -> bool,
) -> Result<TraceSummary> {
    let names = engine.volume_names();
    let volume = match &req.volume {
        None => None,
        Some(name) => Some(
            names
                .iter()
                .find(|(_, n)| n == name)
                .map(|(id, _)| *id)
                .with_context(|| format!("no volume named {name:?} in this pool"))?,
        ),
    };
    let header = RecordedHeader {
        start_unix_ns: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        block_bytes: engine.block_size(),
        sample_threshold: RecordedHeader::threshold_of_rate(req.sample),
        volumes: names
            .iter()
            .filter(|(id, _)| volume.map_or(true, |v| v == *id))
            .map(|(id, n)| (id.0, n.clone()))
            .collect(),
    };
    let file = std::fs::File::create(&req.out)
        .with_context(|| format!("creating {}", req.out.display()))?;
    let mut w = RecordedWriter::new(BufWriter::with_capacity(1 << 20, file), &header)?;
    let rec = engine.start_recording(volume, req.buffer)?;
    let total_s = req.seconds.ceil() as u64;
    let asked = Duration::from_secs_f64(req.seconds);
    let started = Instant::now();
    let mut reported_s = 0;
    let take = |w: &mut RecordedWriter<_>| -> Result<bool> {
        let mut any = false;
        while let Some(r) = rec.next_request() {
            any = true;
            let op = match r.op {
                TracedOp::Read => RecordedOp::Read,
                TracedOp::Write => RecordedOp::Write,
                TracedOp::WriteZeroes => RecordedOp::WriteZeroes,
                TracedOp::Trim => RecordedOp::Trim,
            };
            for (offset, len) in sampled_runs(
                r.volume.0,
                r.offset,
                r.len,
                header.block_bytes,
                header.sample_threshold,
            ) {
                w.write(&RecordedRequest {
                    time_ns: r.time_ns,
                    volume: r.volume.0,
                    op,
                    offset,
                    len,
                })?;
            }
        }
        Ok(any)
    };
    loop {
        let busy = take(&mut w)?;
        let elapsed = started.elapsed();
        if elapsed >= asked {
            break;
        }
        let whole_s = elapsed.as_secs();
        if whole_s > reported_s {
            reported_s = whole_s;
            if !progress(whole_s, total_s) {
                break;
            }
        }
        if !busy {
            std::thread::sleep(IDLE_WAIT);
        }
    }
    rec.stop();
    take(&mut w)?;
    let duration_ns = rec.elapsed_ns();
    let stats = rec.stats();
    drop(rec);
    let records = w.requests();
    let mut out = w.finish(duration_ns, stats.dropped)?;
    std::io::Write::flush(&mut out)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    let _ = progress(total_s, total_s);
    Ok(TraceSummary {
        out: req.out.clone(),
        seconds: duration_ns as f64 / 1e9,
        requests: stats.requests,
        dropped: stats.dropped,
        records,
        sample_rate: header.sample_rate(),
        bytes,
    })
}
