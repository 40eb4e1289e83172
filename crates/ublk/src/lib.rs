//! tiercache's ublk front end: serves an export as a Linux block device,
//! `/dev/ublkbN`, through the kernel's ublk driver (Linux >= 6.0,
//! `CONFIG_BLK_DEV_UBLK`, module `ublk_drv`) and the `libublk` crate.
//!
//! # What is served
//!
//! The front-end contract of `tiercache-frontend`, the
//! [`tiercache_frontend::Export`] trait the NBD server serves too: whatever
//! `tiercache serve` hands to NBD (the engine, or a bare device for
//! baselines) can be served here unchanged. This crate knows nothing of
//! NBD. Requests map one to one ([`request::execute`]), after the range
//! check both front ends share ([`tiercache_frontend::check_request`]):
//!
//! | ublk request                  | export call                               |
//! |-------------------------------|-------------------------------------------|
//! | READ                          | `read`                                    |
//! | WRITE (FUA flag)              | `write(fua = true)`                       |
//! | FLUSH                         | `flush`                                   |
//! | DISCARD                       | `trim`                                    |
//! | WRITE_ZEROES (NOUNMAP flag)   | `write_zeroes(may_trim = !NOUNMAP)`       |
//! | WRITE_SAME, zoned operations  | refused with `-EOPNOTSUPP`                |
//!
//! A refused range completes with `-EINVAL`; an error from the export
//! completes with its errno ([`tiercache_frontend::errno`], the mapping the
//! NBD server uses too: the device's own errno, `-EIO` when there is
//! none). The
//! device's parameters ([`params::device_params`]) follow the export: 512-
//! or 4096-byte logical blocks from its minimum block size, a volatile
//! write cache with FUA when it can flush (so the kernel sends FLUSH and
//! FUA instead of assuming writes are durable), discard and write-zeroes
//! limits when it trims, read-only and rotational flags.
//!
//! # Threads
//!
//! libublk drives the control device only; the queues are served here.
//! Queue `q` of every device of the process is served by one queue thread
//! (`queue_thread.rs`), an async executor around one io_uring (`ring.rs`)
//! with one task per tag of each device (`device_queue.rs`): a pool of many
//! volumes runs as many queue threads as one device has queues. Hits,
//! bypassed reads and misses on files are read through that io_uring; the
//! export's other calls block, so they do not run there: each goes to the
//! device's [`pool::WorkerPool`], and its completion comes back to the
//! queue thread through an eventfd that the thread keeps a read posted on
//! (see [`pool`]). A queue therefore has up to `depth` requests in the
//! export at once, limited by the pool size. With
//! [`UblkConfig::zero_copy`] on Linux >= 6.16, hits and bypassed reads are
//! read into the requests' own pages (`zero_copy.rs`).
//!
//! # Lifetime
//!
//! [`UblkServer::start`] adds and starts the device and returns once it
//! serves IO. It is two steps, which a server of many devices takes apart:
//! [`AddedDevice::add`] fixes the device's number (one device after
//! another, so that the numbers the kernel picks follow their order), and
//! [`UblkServer::start_added`] does the rest, on any thread, several
//! devices at once. [`UblkServer::stop`] stops it (requests in flight finish),
//! waits for the queues and workers, and deletes it. Unmount file systems
//! on the device before stopping it: a mounted file system on a device
//! whose server is gone only gets IO errors.
//!
//! Unless [`UblkConfig::recovery`] is off, the device is made with the
//! kernel's user recovery ([`recovery`]): if the process dies, the device
//! stays and the kernel holds its IO until a new server started with the
//! same device number takes it over ([`UblkServer::start`] does that by
//! itself). [`UblkServer::hand_over`] leaves the device that way on
//! purpose, for an upgrade of the server without an IO error. When the kernel has no ublk,
//! [`UblkServer::start`] (and [`check_kernel_support`]) fail with
//! [`StartError::NoKernelSupport`], whose message says what to do.

mod added;
mod device_queue;
mod direct;
mod fixed_buffers;
pub mod params;
pub mod pool;
mod queue_thread;
pub mod recovery;
pub mod request;
mod ring;
mod server;
mod start_error;
mod tag_buffers;
mod zero_copy;

pub use server::{
    check_kernel_support, AddedDevice, StartError, UblkConfig, UblkServer, CONTROL_PATH,
};
