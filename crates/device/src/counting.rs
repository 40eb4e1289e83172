//! A decorator that counts IOs and bytes, e.g. to measure metadata write
//! amplification.

use crate::BlockDevice;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counts of the IOs a [`CountingDevice`] passed on.
///
/// Only calls that returned `Ok` are counted in the op and byte counts;
/// calls that failed (including out-of-range calls) count in `errors`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_discarded: u64,
    pub errors: u64,
}

impl IoCounts {
    /// The counts that happened between `earlier` and `self`, field by field
    /// (saturating, so a reset in between yields zeros, not a panic).
    pub fn since(&self, earlier: &IoCounts) -> IoCounts {
        IoCounts {
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            flushes: self.flushes.saturating_sub(earlier.flushes),
            discards: self.discards.saturating_sub(earlier.discards),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            bytes_discarded: self.bytes_discarded.saturating_sub(earlier.bytes_discarded),
            errors: self.errors.saturating_sub(earlier.errors),
        }
    }
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    bytes_discarded: AtomicU64,
    errors: AtomicU64,
}

/// Passes every call to the inner device and counts it.
pub struct CountingDevice<D> {
    inner: D,
    c: Counters,
}

impl<D: BlockDevice> CountingDevice<D> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: D) -> Self {
        CountingDevice {
            inner,
            c: Counters::default(),
        }
    }

    /// The inner device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The counts so far. Each field is read atomically, but IOs running
    /// concurrently may be reflected in some fields and not yet in others.
    pub fn snapshot(&self) -> IoCounts {
        IoCounts {
            reads: self.c.reads.load(Relaxed),
            writes: self.c.writes.load(Relaxed),
            flushes: self.c.flushes.load(Relaxed),
            discards: self.c.discards.load(Relaxed),
            bytes_read: self.c.bytes_read.load(Relaxed),
            bytes_written: self.c.bytes_written.load(Relaxed),
            bytes_discarded: self.c.bytes_discarded.load(Relaxed),
            errors: self.c.errors.load(Relaxed),
        }
    }

    /// Sets every count to zero and returns the counts before.
    pub fn reset(&self) -> IoCounts {
        IoCounts {
            reads: self.c.reads.swap(0, Relaxed),
            writes: self.c.writes.swap(0, Relaxed),
            flushes: self.c.flushes.swap(0, Relaxed),
            discards: self.c.discards.swap(0, Relaxed),
            bytes_read: self.c.bytes_read.swap(0, Relaxed),
            bytes_written: self.c.bytes_written.swap(0, Relaxed),
            bytes_discarded: self.c.bytes_discarded.swap(0, Relaxed),
            errors: self.c.errors.swap(0, Relaxed),
        }
    }

    fn count(
        &self,
        r: io::Result<()>,
        ops: &AtomicU64,
        bytes: Option<(&AtomicU64, u64)>,
    ) -> io::Result<()> {
        match &r {
            Ok(()) => {
                ops.fetch_add(1, Relaxed);
                if let Some((b, n)) = bytes {
                    b.fetch_add(n, Relaxed);
                }
            }
            Err(_) => {
                self.c.errors.fetch_add(1, Relaxed);
            }
        }
        r
    }
}

impl<D: BlockDevice> BlockDevice for CountingDevice<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let n = buf.len() as u64;
        let r = self.inner.read_at(buf, offset);
        self.count(r, &self.c.reads, Some((&self.c.bytes_read, n)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let r = self.inner.write_at(buf, offset);
        self.count(
            r,
            &self.c.writes,
            Some((&self.c.bytes_written, buf.len() as u64)),
        )
    }

    fn flush(&self) -> io::Result<()> {
        let r = self.inner.flush();
        self.count(r, &self.c.flushes, None)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.inner.discard(offset, len);
        self.count(r, &self.c.discards, Some((&self.c.bytes_discarded, len)))
    }

    fn describe(&self) -> String {
        format!("counting({})", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    #[test]
    fn counts_ops_bytes_and_errors() {
        let d = CountingDevice::new(MemDevice::new(1 << 16));
        let mut b = vec![0u8; 4096];
        d.write_at(&b, 0).unwrap();
        d.write_at(&b[..512], 8192).unwrap();
        d.read_at(&mut b, 4096).unwrap();
        d.flush().unwrap();
        d.discard(0, 1024).unwrap();
        assert!(d.read_at(&mut b, 1 << 16).is_err());
        let s = d.snapshot();
        assert_eq!(
            s,
            IoCounts {
                reads: 1,
                writes: 2,
                flushes: 1,
                discards: 1,
                bytes_read: 4096,
                bytes_written: 4608,
                bytes_discarded: 1024,
                errors: 1,
            }
        );
        d.write_at(&b, 0).unwrap();
        let delta = d.snapshot().since(&s);
        assert_eq!(delta.writes, 1);
        assert_eq!(delta.bytes_written, 4096);
        assert_eq!(delta.reads, 0);
        let before = d.snapshot();
        assert_eq!(before.writes, 3);
        assert_eq!(d.reset(), before);
        assert_eq!(d.snapshot(), IoCounts::default());
    }
}
