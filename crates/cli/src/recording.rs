//! The server's side of `tiercache trace`: the control connection thread
//! is the writer. It takes requests from the engine's recorder
//! (`crates/engine/src/recorder.rs`: a bounded lock-free queue the IO path
//! pushes into, never waiting), keeps the sampled blocks (SHARDS-style, by
//! a hash of the block) and writes them zstd compressed to the file, at the
//! absolute path the client gave. A client that goes away (Ctrl-C) ends the
//! recording at the next progress line, with the file complete; so does a
//! server that stops or hands over (SIGTERM, an upgrade): it ends every
//! recording through [`Recordings`] and waits for the files and the
//! replies before it exits.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tiercache_engine::{Engine, TracedOp};
use tiercache_sim::trace::recorded::{
    sampled_runs, RecordedHeader, RecordedOp, RecordedRequest, RecordedWriter,
};

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
    /// The server stopped before the seconds asked were over (the file
    /// holds what came until then).
    #[serde(default)]
    pub server_stopped: bool,
}

/// The server's recordings in progress, so that a stopping server can end
/// them with their files complete instead of exiting under them.
#[derive(Default)]
pub struct Recordings {
    stopping: AtomicBool,
    active: Mutex<usize>,
    ended: Condvar,
}

/// A recording in progress, from its start to its reply (see
/// [`Recordings::begin`]).
pub struct Active<'a>(&'a Recordings);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        *self.0.count() -= 1;
        self.0.ended.notify_all();
    }
}

impl Recordings {
    fn count(&self) -> MutexGuard<'_, usize> {
        // A count is always valid, even if a holder panicked.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new recording, held until its reply is sent; `None` once the
    /// server is stopping.
    pub fn begin(&self) -> Option<Active<'_>> {
        let mut n = self.count();
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        *n += 1;
        Some(Active(self))
    }

    /// Whether recordings should end now.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Ends every recording and waits up to `limit` for them to finish
    /// their files and replies. Returns how many were still running.
    pub fn end_all(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut n = self.count();
        self.stopping.store(true, Ordering::SeqCst);
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            n = match self.ended.wait_timeout(n, left) {
                Ok((n, _)) => n,
                Err(e) => e.into_inner().0,
            };
        }
        *n
    }
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
        )?;
        if self.server_stopped {
            write!(f, "; the server stopped before the time asked was over")?;
        }
        Ok(())
    }
}
/// How long the writer sleeps when the queue is empty.
const IDLE_WAIT: Duration = Duration::from_millis(2);

/// The server's side: records for `req.seconds` (or until `progress`,
/// called about once a second with the seconds done and asked, returns
/// `false`, or until `recordings` is stopping), writing the file.
pub fn record(
    engine: &Arc<Engine>,
    recordings: &Recordings,
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
    let mut server_stopped = false;
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
        if recordings.stopping() {
            server_stopped = true;
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
        server_stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopping_server_waits_for_recordings_and_starts_no_new_one() {
        let r = Recordings::default();
        let active = r.begin().expect("not stopping yet");
        assert!(!r.stopping());
        std::thread::scope(|s| {
            // A recording that ends a little after the server asks.
            s.spawn(|| {
                while !r.stopping() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(50));
                drop(active);
            });
            let t = Instant::now();
            assert_eq!(r.end_all(Duration::from_secs(10)), 0, "every one finished");
            assert!(t.elapsed() >= Duration::from_millis(50), "it waited");
        });
        assert!(r.begin().is_none(), "no recording starts once stopping");
        // One that never ends is given up on after the limit.
        let stuck = Recordings::default();
        let _held = stuck.begin().unwrap();
        assert_eq!(stuck.end_all(Duration::from_millis(20)), 1);
    }
}
