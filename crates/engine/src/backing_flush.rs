//! A backing device that knows whether it may hold writes not yet flushed.
//!
//! A commit that carries clean claims ("slot c holds what the backing
//! device holds for block b") flushes the backing device first, so that a
//! power loss cannot leave the claim describing data the device's volatile
//! cache lost (`persist.rs`). Most clean claims come from read misses,
//! whose data was already on the device; when nothing was written to it
//! through this engine since its last successful flush, that flush has
//! nothing to make durable. On a SATA disk a flush is not a queued command:
//! the disk drains its queue of reads to run it, so a read-mostly volume
//! was interrupted by a flush for every commit (once a second with misses
//! alone, up to 19 a second in the VM lab's anchors, where bcache flushed
//! its backing disk twice in a run).
//!
//! Contract: every write and discard of the backing device goes through
//! this wrapper (it passes the read fd on for io_uring reads, never a write
//! fd), and [`FlushTracked::flush_if_written`] skips the flush only when
//! every write that had completed when the last successful flush began
//! is all there is. The first call always flushes: writes made before the
//! engine opened the device (by an earlier server) count as unflushed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use tiercache_device::BlockDevice;

/// A backing device and its writes since its last flush. See the module
/// documentation.
pub(crate) struct FlushTracked {
    inner: Arc<dyn BlockDevice>,
    /// Writes and discards returned so far, plus one (the unknown writes
    /// from before the engine opened the device).
    writes: AtomicU64,
    /// `writes` as it was when the last successful flush began.
    flushed: AtomicU64,
}

impl FlushTracked {
    pub(crate) fn new(inner: Arc<dyn BlockDevice>) -> FlushTracked {
        FlushTracked {
            inner,
            writes: AtomicU64::new(1),
            flushed: AtomicU64::new(0),
        }
    }

    /// Whether a write or discard may have returned since the last
    /// successful flush began.
    pub(crate) fn may_hold_unflushed_writes(&self) -> bool {
        self.writes.load(SeqCst) != self.flushed.load(SeqCst)
    }

    /// Flushes the device unless nothing was written to it since the last
    /// successful flush began.
    pub(crate) fn flush_if_written(&self) -> io::Result<()> {
        if self.may_hold_unflushed_writes() {
            self.flush()
        } else {
            Ok(())
        }
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, SeqCst);
    }
}

impl BlockDevice for FlushTracked {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    /// Counted whatever it returns: a failed write may have changed part
    /// of the range.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let r = self.inner.write_at(buf, offset);
        self.wrote();
        r
    }

    /// Flushes and, on success, records that every write returned before
    /// it began is durable.
    fn flush(&self) -> io::Result<()> {
        let before = self.writes.load(SeqCst);
        self.inner.flush()?;
        self.flushed.fetch_max(before, SeqCst);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.inner.discard(offset, len);
        self.wrote();
        r
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    /// Reads change nothing this wrapper tracks, so they may go around it.
    fn raw_read_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.raw_read_fd()
    }

    /// None: a write must go through [`BlockDevice::write_at`] to be
    /// counted.
    fn raw_write_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_device::{CountingDevice, MemDevice};

    fn tracked() -> (Arc<CountingDevice<MemDevice>>, FlushTracked) {
        let dev = Arc::new(CountingDevice::new(MemDevice::new(1 << 20)));
        let t = FlushTracked::new(dev.clone());
        (dev, t)
    }

    #[test]
    fn the_first_flush_happens_and_reads_need_no_more() {
        let (dev, t) = tracked();
        assert!(t.may_hold_unflushed_writes(), "writes from before the open");
        t.flush_if_written().unwrap();
        assert_eq!(dev.snapshot().flushes, 1);
        let mut buf = vec![0u8; 4096];
        t.read_at(&mut buf, 0).unwrap();
        t.flush_if_written().unwrap();
        t.flush_if_written().unwrap();
        assert_eq!(dev.snapshot().flushes, 1, "nothing written since");
    }

    #[test]
    fn a_write_or_discard_since_the_last_flush_is_flushed() {
        let (dev, t) = tracked();
        t.flush_if_written().unwrap();
        t.write_at(&[7u8; 4096], 4096).unwrap();
        t.flush_if_written().unwrap();
        assert_eq!(dev.snapshot().flushes, 2);
        t.discard(0, 4096).unwrap();
        t.flush_if_written().unwrap();
        assert_eq!(dev.snapshot().flushes, 3);
        t.flush_if_written().unwrap();
        assert_eq!(dev.snapshot().flushes, 3);
    }

    #[test]
    fn a_failed_write_counts_and_a_failed_flush_covers_nothing() {
        use tiercache_device::FaultDevice;
        let dev = Arc::new(FaultDevice::new(MemDevice::new(1 << 20)));
        let t = FlushTracked::new(dev.clone());
        t.flush_if_written().unwrap();
        dev.fail_all();
        assert!(t.write_at(&[1u8; 4096], 0).is_err());
        assert!(t.flush_if_written().is_err());
        dev.heal();
        assert!(
            t.may_hold_unflushed_writes(),
            "the failed flush made nothing durable"
        );
        t.flush_if_written().unwrap();
        assert!(!t.may_hold_unflushed_writes());
    }

    #[test]
    fn reads_go_around_it_but_writes_do_not() {
        use tiercache_device::FileDevice;
        let dir = tempfile::tempdir().unwrap();
        let file = Arc::new(FileDevice::create(dir.path().join("backing"), 1 << 20).unwrap());
        assert!(file.raw_write_fd().is_some());
        let t = FlushTracked::new(file.clone());
        assert_eq!(t.raw_read_fd(), file.raw_read_fd());
        assert!(t.raw_read_fd().is_some());
        assert_eq!(
            t.raw_write_fd(),
            None,
            "an io_uring write would not be counted"
        );
    }
}
