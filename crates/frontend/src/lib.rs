//! tiercache-frontend: the contract between a block front end (the NBD
//! server in `tiercache-nbd`, the ublk device in `tiercache-ublk`) and what
//! it serves, independent of any protocol.
//!
//! Modelled after nbdkit's split between its plugin/filter contract
//! (`nbdkit-filter.h`) and `server/backend.c`, which checks every request
//! once before a plugin sees it, with the protocols kept apart:
//!
//! * [`Export`]: what a front end serves (the engine, a bare device, the
//!   in-memory [`MemExport`]), with its block size limits ([`BlockSizes`])
//!   and the quick read paths a front end may take on its own threads
//!   ([`Export::read_if_quick`], [`Export::begin_direct_read`] returning a
//!   [`DirectRead`], [`Export::begin_direct_miss`] returning a
//!   [`DirectMiss`]);
//! * [`check_request`]: the one validation of a request's range (inside
//!   the export, aligned to the minimum block, not longer than the front
//!   end can carry, zero length) that both front ends call before they
//!   touch the export, returning a typed [`RequestError`];
//! * [`errno`]: the one mapping from an export's error to a Linux errno,
//!   which the NBD server narrows to the values its wire allows and ublk
//!   completes a request with (negated).
//!
//! * [`IdleWorkers`]: when a queued job is worth waking one of the front
//!   end's worker threads for;
//! * [`prefer_no_scheduler`]: no IO scheduler on a block device a front end
//!   makes;
//! * [`read_sqe`], [`write_sqe`]: the io_uring entries of a direct read, a
//!   miss's source read and its fill, through a registered buffer or not.
//!
//! Nothing here knows a protocol: the NBD flags, wire errno values and
//! ublk's opcodes stay in their crates.
#![warn(missing_docs)]

mod direct_miss;
mod errno;
mod export;
mod idle_workers;
mod limits;
mod mem;
mod request;
mod scheduler;
mod uring_io;

pub use direct_miss::{DirectMiss, FileRange, MissOps};
pub use errno::errno;
pub use export::{DirectRead, Export, ReadPiece};
pub use idle_workers::IdleWorkers;
pub use limits::{BlockSizes, DEFAULT_MAX_BLOCK};
pub use mem::MemExport;
pub use request::{check_request, Access, Checked, Limits, RequestError};
pub use scheduler::{prefer_no_scheduler, use_no_scheduler};
pub use uring_io::{read_sqe, write_sqe};
