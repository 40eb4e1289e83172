//! tiercache-sim: cache simulation (work in progress).

pub mod error;
pub mod rng;
pub mod trace;

pub use error::{Error, Result};
pub use trace::{open_trace, Request, TraceFormat, TraceOptions, TraceReader};
pub mod device;
pub mod fiojob;
pub mod idmap;
pub mod mrc;
pub mod opt;
pub mod synth;
