//! tiercache-sim: cache simulation (work in progress).

pub mod error;
pub mod rng;
pub mod trace;

pub use error::{Error, Result};
pub use trace::{open_trace, Request, TraceFormat, TraceOptions, TraceReader};
pub mod fiojob;
pub mod synth;
