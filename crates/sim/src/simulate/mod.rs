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
//! Writeback mode: a simple cleaner (if enabled) writes dirty blocks back
//! whenever more than `high_dirty` of the cache is dirty, down to
//! `low_dirty`, like a bcache-style writeback target. Which blocks is the
//! engine's choice ([`choose_writeback`](tiercache_policy::writeback::choose_writeback): origin order); when is a model,
//! since a synthetic stream has no time to pace by. Writebacks are
//! background IO: they cost device capacity (and so IOPS) but no request
//! latency. Dirty blocks left at the end are reported.
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
