//! [`MemExport`]: a sparse in-memory export, for tests, examples and
//! benchmarks of both front ends.

use crate::export::Export;
use crate::limits::BlockSizes;
use parking_lot::RwLock;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE_SHIFT: u32 = 16;
const PAGE: u64 = 1 << PAGE_SHIFT;

/// A sparse RAM export: 64 KiB pages allocated on first write, freed by trim
/// and by write-zeroes with `may_trim`. Pages are individually locked, so
/// concurrent requests to different pages never contend. All connections
/// see the same memory, so it supports multi-conn. Counts flushes (for
/// tests).
pub struct MemExport {
    size: u64,
    pages: Vec<RwLock<Option<Box<[u8]>>>>,
    block_sizes: BlockSizes,
    read_only: bool,
    multi_conn: bool,
    flushes: AtomicU64,
}

impl MemExport {
    /// A zero-filled export of `size` bytes with default block sizes
    /// (1 / 4096 / 32 MiB).
    pub fn new(size: u64) -> MemExport {
        let n = size.div_ceil(PAGE) as usize;
        MemExport {
            size,
            pages: (0..n).map(|_| RwLock::new(None)).collect(),
            block_sizes: BlockSizes::default(),
            read_only: false,
            multi_conn: true,
            flushes: AtomicU64::new(0),
        }
    }

    /// This export with block sizes `b` (checked when it is served).
    pub fn with_block_sizes(mut self, b: BlockSizes) -> Self {
        self.block_sizes = b;
        self
    }

    /// This export refusing writes (`EROFS`) and saying it is read-only.
    pub fn with_read_only(mut self, ro: bool) -> Self {
        self.read_only = ro;
        self
    }

    /// Whether to advertise multi-conn (default true; false lets tests check
    /// the flag is withheld).
    pub fn with_multi_conn(mut self, mc: bool) -> Self {
        self.multi_conn = mc;
        self
    }

    /// Number of `flush` calls so far.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Bytes of page memory currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.iter().filter(|p| p.read().is_some()).count() as u64 * PAGE
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    /// Calls `f(page index, offset within page, range of the caller's
    /// buffer)` for each page overlapping `offset..offset+len`.
    fn for_pages(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE - pos % PAGE).min(len - done);
            f(
                (pos >> PAGE_SHIFT) as usize,
                in_page,
                done as usize..(done + n) as usize,
            )?;
            done += n;
        }
        Ok(())
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.size
    }
    fn block_size_constraints(&self) -> BlockSizes {
        self.block_sizes
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        Self::for_pages(offset, buf.len() as u64, |p, at, r| {
            let dst = &mut buf[r];
            match &*self.pages[p].read() {
                Some(page) => dst.copy_from_slice(&page[at..at + dst.len()]),
                None => dst.fill(0),
            }
            Ok(())
        })
    }
    fn read_if_quick(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        // Memory never makes anyone wait long.
        Some(self.read(offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, data.len() as u64)?;
        Self::for_pages(offset, data.len() as u64, |p, at, r| {
            let src = &data[r];
            let mut g = self.pages[p].write();
            let page = g.get_or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
            page[at..at + src.len()].copy_from_slice(src);
            Ok(())
        })
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        // Only whole pages are dropped; partial pages are left as they are,
        // which trim's contract allows.
        self.write_zeroes_impl(offset, len, true, false)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool, may_trim: bool) -> io::Result<()> {
        self.write_zeroes_impl(offset, len, may_trim, true)
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn can_trim(&self) -> bool {
        true
    }
    fn can_multi_conn(&self) -> bool {
        self.multi_conn
    }
}

impl MemExport {
    fn write_zeroes_impl(&self, offset: u64, len: u64, free: bool, zero: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, len)?;
        Self::for_pages(offset, len, |p, at, r| {
            let mut g = self.pages[p].write();
            if free && r.len() as u64 == PAGE {
                *g = None;
            } else if zero {
                if let Some(page) = g.as_mut() {
                    page[at..at + r.len()].fill(0);
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_export_reads_back_writes_across_pages() {
        let m = MemExport::new(3 * PAGE + 100);
        let data: Vec<u8> = (0..PAGE as usize + 300).map(|i| (i % 251) as u8).collect();
        m.write(PAGE - 100, &data, false).unwrap();
        let mut back = vec![1u8; data.len()];
        m.read(PAGE - 100, &mut back).unwrap();
        assert_eq!(back, data);
        let mut tail = vec![1u8; 100];
        m.read(3 * PAGE, &mut tail).unwrap();
        assert!(tail.iter().all(|&b| b == 0));
        assert!(m.read(3 * PAGE + 1, &mut tail).is_err());
        m.write_zeroes(PAGE - 50, 100, false, true).unwrap();
        m.read(PAGE - 100, &mut back).unwrap();
        assert!(back[50..150].iter().all(|&b| b == 0));
        assert_eq!(back[..50], data[..50]);
        assert_eq!(back[150..], data[150..]);
        m.trim(0, 3 * PAGE).unwrap();
        assert_eq!(m.allocated_bytes(), 0);
    }
}
