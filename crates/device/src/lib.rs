//! Block devices behind one small trait.
//!
//! *What* a device is ([`BlockDevice`]) is kept apart from the decorators
//! that change how it behaves. Everything here is synchronous and
//! thread-safe: many IOs are in flight when many threads call a device at
//! once, which is how the engine and the NBD server use it.
//!
//! Devices:
//! - [`FileDevice`]: a regular file or block device node, O_DIRECT where
//!   possible, `pread`/`pwrite` from any number of threads.
//! - [`MemDevice`]: bytes in RAM.
//! - [`CrashDevice`]: RAM that can lose its unflushed writes on
//!   [`CrashDevice::crash`], for crash tests.
//!
//! Decorators (each wraps any `D: BlockDevice`, including `Arc<D>`):
//! - [`EmulatedHdd`]: seek, rotation and transfer delays of a spinning disk,
//!   with per-spindle queues served shortest-positioning-time first.
//! - [`FaultDevice`]: EIO on chosen ranges or at a seeded rate, changeable
//!   at run time.
//! - [`CountingDevice`]: counts of IOs and bytes, for write amplification.
//!
//! Benches: `cargo bench -p tiercache-device` runs `file_vs_fio` (FileDevice
//! against fio on a 1 GiB file) and `hdd` (calibration of the HDD model).

mod aligned;
mod counting;
mod crash;
mod exclusive;
mod fault;
mod file;
mod hdd;
mod memory;

pub use aligned::{is_aligned, AlignedBuf, BUF_ALIGN};
pub use counting::{CountingDevice, IoCounts};
pub use crash::{CrashDevice, CrashReport};
pub use fault::{FaultCounts, FaultDevice, FaultOp, FaultRule};
pub use file::{DirectIo, FileDevice};
pub use hdd::{EmulatedHdd, HddModel, InvalidHddModel, QueuedIo};
pub use memory::MemDevice;

use std::io;

/// A random-access block device.
///
/// Contract for every implementation:
/// - `offset` and `buf.len()` are multiples of [`BlockDevice::alignment`]
///   and `offset + len <= size()`; otherwise the call fails with
///   `io::ErrorKind::InvalidInput` and touches nothing.
/// - Buffers may have any memory alignment; devices that need aligned memory
///   (O_DIRECT) bounce internally. Passing an [`AlignedBuf`] avoids the copy.
/// - A write that returned `Ok` is visible to every later read from any
///   thread; it is durable only after a later `flush` returned `Ok`.
/// - Calls may run concurrently from many threads; concurrent writes to
///   overlapping ranges leave the range holding one of the writes per sector.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes, a multiple of `alignment()`.
    fn size(&self) -> u64;

    /// Required alignment of offsets and lengths, in bytes (512 or 4096).
    fn alignment(&self) -> u64 {
        512
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Makes every write that completed before this call durable.
    fn flush(&self) -> io::Result<()>;

    /// Says the range's contents are no longer needed. Later reads of the
    /// range return unspecified data (zeros where the device can).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;

    /// A short human description for logs and errors, e.g. `file:/dev/sdb`.
    fn describe(&self) -> String;

    /// The open file behind the device, for callers that submit reads of
    /// it themselves (io_uring): a read of `len` bytes at `offset` of this
    /// fd must return what `read_at(offset)` would, given a buffer aligned
    /// to `alignment()`. None (the default) for anything else: memory,
    /// and wrappers that change behaviour (fault injection, latency
    /// models) must not pass their inner device's fd on.
    fn raw_read_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// As [`BlockDevice::raw_read_fd`], for writes: a write of `len` bytes
    /// at `offset` of this fd, from a buffer aligned to `alignment()`,
    /// must do what `write_at(offset)` would. None (the default) for
    /// anything else, wrappers included.
    fn raw_write_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// Checks a request against a device's size and alignment, as every
/// implementation must before touching anything.
pub fn check_range(dev: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
    let align = dev.alignment();
    if offset % align != 0 || len % align != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: offset {offset} / length {len} not aligned to {align} bytes",
                dev.describe()
            ),
        ));
    }
    match offset.checked_add(len) {
        Some(end) if end <= dev.size() => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: range {offset}+{len} is beyond the end of the device ({} bytes)",
                dev.describe(),
                dev.size()
            ),
        )),
    }
}

impl<T: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn alignment(&self) -> u64 {
        (**self).alignment()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn raw_read_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).raw_read_fd()
    }
    fn raw_write_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).raw_write_fd()
    }
}
