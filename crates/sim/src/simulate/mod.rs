//! The simulation driver: replays a request stream through many
//! (cache size, policy) configurations of the [`Director`](tiercache_policy::Director) at once, plus the
//! offline bounds (OPT) and the LRU miss-ratio curve.
//!
//! Each configuration does exactly what the live engine does per IO, with
//! a virtual clock (the request's time) and no device IO:
//! `begin(offset, len, access, time)`, then `plan_read` or `plan_write`
//! for every block the request touches (`full_block` = the request covers
//! the whole block), then `finish`. The plans are priced by the
//! [`crate::device::DeviceModel`].
//!
//! Writeback mode: the cleaner (if enabled) is the engine's own: how many
//! blocks and when come from the policy crate's
//! [`RateController`](tiercache_policy::writeback::RateController)
//! (bcache's PI controller on the dirty share; everything once idle),
//! which blocks from a
//! [`WritebackSweep`](tiercache_policy::writeback_sweep::WritebackSweep)
//! (origin order, a batch at a time, as the engine's cleaner). Its clock is the trace's time when the trace has
//! timestamps (a gap of `idle_after_ms` or more counts as idle: before the
//! next request the cleaner writes back at full speed as much as the
//! backing device can write in the rest of the gap), else modelled time (each
//! request's modelled latency over the queue depth, back to back, never
//! idle). Writebacks are written as the engine writes them, neighbouring
//! blocks merged into runs of up to 4 MiB, each run one write of the
//! backing device's model; they are background IO: they cost device
//! capacity (and so IOPS) but no request latency. Dirty blocks left at the
//! end are reported.
//!
//! Parallelism: the request stream is read once, in chunks. For each chunk
//! the configurations (and the block-level analysis task) are independent,
//! so worker threads (`std::thread::scope`) pick tasks off a shared counter
//! and run them over the chunk while the calling thread reads the next
//! chunk. Memory: one chunk plus per-task state; OPT additionally keeps one
//! u32 per block reference (and one more while it runs).

mod block_task;
mod driver;
mod notes;
mod results;
mod runner;
mod source;
mod spec;

pub use driver::simulate;
pub use notes::requests_to_reach;
pub use results::*;
pub use runner::ConfigRunner;
pub use source::{IterSource, RequestSource};
pub use spec::*;

/// Requests per chunk handed to the workers.
pub const CHUNK: usize = 1 << 16;
