//! Where requests come from: [`RequestSource`] over a trace file, a
//! synthetic workload or any iterator.

use crate::error::Result;
use crate::trace::{Request, TraceReader};

/// A stream of requests for [`simulate`](super::simulate).
pub trait RequestSource {
    /// The next request, `None` at the end.
    fn next_request(&mut self) -> Option<Result<Request>>;
    /// Share of the input consumed (0..=1), if known.
    fn fraction_done(&self) -> Option<f64> {
        None
    }
    /// Whether request times are real timestamps rather than IO counters.
    fn has_timestamps(&self) -> bool {
        false
    }
}

impl RequestSource for TraceReader {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.next()
    }
    fn fraction_done(&self) -> Option<f64> {
        let (done, total) = self.progress_bytes();
        total
            .filter(|&t| t > 0)
            .map(|t| (done as f64 / t as f64).min(1.0))
    }
    fn has_timestamps(&self) -> bool {
        TraceReader::has_timestamps(self)
    }
}

impl RequestSource for crate::synth::Synthetic {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.next().map(Ok)
    }
    fn fraction_done(&self) -> Option<f64> {
        Some(crate::synth::Synthetic::fraction_done(self))
    }
}

/// Any iterator of requests (no progress fraction; times taken as IO
/// counters for reporting).
pub struct IterSource<I>(pub I);

impl<I: Iterator<Item = Request>> RequestSource for IterSource<I> {
    fn next_request(&mut self) -> Option<Result<Request>> {
        self.0.next().map(Ok)
    }
}
