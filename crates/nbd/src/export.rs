//! The thing an NBD server serves: the [`Export`] trait, its error mapping
//! to NBD errnos, and [`MemExport`], a sparse in-memory export for tests.

use crate::proto;
use parking_lot::RwLock;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Block size constraints of an export (see "Block size constraints" in the
/// NBD spec).
///
/// Contract (checked by [`BlockSizes::validate`], enforced by
/// `Server::new`): `min` is a power of two in `1..=65536`; `preferred` is a
/// power of two `>= max(min, 512)`; `max` is a multiple of `min` and at least
/// `min(preferred, export size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    pub min: u32,
    pub preferred: u32,
    pub max: u32,
}

/// 32 MiB: the default maximum request length, also the largest length the
/// spec says clients may always use.
pub const DEFAULT_MAX_BLOCK: u32 = 32 << 20;

impl Default for BlockSizes {
    /// The spec's defaults (min 1, preferred 4096) with a 32 MiB maximum.
    fn default() -> Self {
        BlockSizes {
            min: 1,
            preferred: 4096,
            max: DEFAULT_MAX_BLOCK,
        }
    }
}

impl BlockSizes {
    /// Checks the spec's constraints for an export of `size` bytes.
    pub fn validate(&self, size: u64) -> Result<(), String> {
        let BlockSizes {
            min,
            preferred,
            max,
        } = *self;
        if !min.is_power_of_two() || min > 65536 {
            return Err(format!(
                "minimum block size {min} is not a power of two <= 65536"
            ));
        }
        if !preferred.is_power_of_two() || preferred < min.max(512) {
            return Err(format!(
                "preferred block size {preferred} is not a power of two >= max(min, 512)"
            ));
        }
        if max % min != 0 {
            return Err(format!(
                "maximum block size {max} is not a multiple of {min}"
            ));
        }
        if u64::from(max) < u64::from(preferred).min(size) {
            return Err(format!(
                "maximum block size {max} is smaller than min(preferred, size)"
            ));
        }
        Ok(())
    }
}

/// A block device served over NBD.
///
/// The server calls these methods concurrently from several worker threads
/// (and, with several connections, for several clients), hence `Send +
/// Sync`. Every `offset`/length the server passes has already been checked:
/// it lies within `0..size()`, is a multiple of the minimum block size, and
/// (for `read`, `write`, `write_zeroes`) is at most the maximum block size.
/// Writes, trims and write-zeroes are only called when `read_only()` is
/// false; `trim` only when `can_trim()`; `flush` only when `can_flush()`;
/// `fua` is only true when `can_fua()`.
///
/// Errors are `io::Error`s; the server maps them to NBD errnos with
/// [`nbd_errno`] (`ENOSPC`/`EDQUOT`/`EFBIG` -> `ENOSPC`, `EPERM`/`EACCES`/
/// `EROFS` -> `EPERM`, `EINVAL` -> `EINVAL`, anything unknown -> `EIO`).
/// A read the caller performs itself, from a file, instead of calling
/// [`Export::read`] (see [`Export::begin_direct_read`]).
pub struct DirectRead<'a> {
    /// The file to read.
    pub fd: std::os::fd::RawFd,
    /// (offset in the file, offset in the caller's buffer, bytes): reading
    /// every piece fills the caller's buffer with the requested range.
    pub pieces: Vec<(u64, usize, usize)>,
    finish: Box<dyn FnOnce(io::Result<()>) -> io::Result<()> + 'a>,
}

impl<'a> DirectRead<'a> {
    /// `finish` is called once, with the outcome of reading the pieces.
    pub fn new(
        fd: std::os::fd::RawFd,
        pieces: Vec<(u64, usize, usize)>,
        finish: impl FnOnce(io::Result<()>) -> io::Result<()> + 'a,
    ) -> DirectRead<'a> {
        DirectRead {
            fd,
            pieces,
            finish: Box::new(finish),
        }
    }

    /// Ends the read with the outcome of reading every piece (a short read
    /// is an error). Ok: the buffer holds the data. Err: it does not; read
    /// the range with [`Export::read`] instead.
    pub fn finish(self, result: io::Result<()>) -> io::Result<()> {
        (self.finish)(result)
    }
}

pub trait Export: Send + Sync {
    /// Size in bytes. Must not change while the server runs.
    fn size(&self) -> u64;

    /// Minimum, preferred and maximum block sizes (see [`BlockSizes`]).
    fn block_size_constraints(&self) -> BlockSizes {
        BlockSizes::default()
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// [`Export::read`] if the export can answer at once, without waiting
    /// for a slow device or for another request (a cache hit); None if it
    /// cannot, having done nothing: then `read` follows on a thread that
    /// may wait. Called on threads that serve many requests (an NBD
    /// connection's reader, a ublk queue), so it must not block for long.
    /// The default: None, every read goes the normal way.
    fn read_if_quick(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        let _ = (offset, buf);
        None
    }

    /// For a caller that can read files asynchronously (ublk's io_uring):
    /// if the range can be read straight from a file (a cache hit), the
    /// file and the pieces to read, the range held stable until the
    /// returned read is finished or dropped. None (the default): use
    /// `read_if_quick` or `read`. The buffer the pieces are read into must
    /// be aligned to 4096 bytes (the file may be open with O_DIRECT).
    fn begin_direct_read(&self, offset: u64, len: u32) -> Option<DirectRead<'_>> {
        let _ = (offset, len);
        None
    }

    /// Writes `data` at `offset`. With `fua`, the data must be persistent
    /// before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;

    /// Makes every write that has completed so far persistent.
    fn flush(&self) -> io::Result<()>;

    /// Hint that the range is no longer needed; may do nothing. Afterwards
    /// the range's contents are unspecified until written again.
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Makes the range read as zeroes. With `may_trim`, the export may
    /// deallocate it; without, it must stay allocated. With `fua`, the
    /// zeroes must be persistent before returning. The default writes
    /// zero-filled buffers.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()> {
        let _ = may_trim;
        const CHUNK: u64 = 1 << 20;
        let zeroes = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0u64;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write(offset + done, &zeroes[..n as usize], fua)?;
            done += n;
        }
        Ok(())
    }

    /// Refuse writes (advertises `NBD_FLAG_READ_ONLY`).
    fn read_only(&self) -> bool {
        false
    }
    /// `flush` does something (advertises `NBD_FLAG_SEND_FLUSH`).
    fn can_flush(&self) -> bool {
        true
    }
    /// `fua` is honoured (advertises `NBD_FLAG_SEND_FUA`).
    fn can_fua(&self) -> bool {
        true
    }
    /// `trim` is worth sending (advertises `NBD_FLAG_SEND_TRIM`).
    fn can_trim(&self) -> bool {
        false
    }
    /// `write_zeroes` is supported (advertises `NBD_FLAG_SEND_WRITE_ZEROES`;
    /// the default implementation always works).
    fn can_write_zeroes(&self) -> bool {
        true
    }
    /// The effects of `flush` and FUA are visible to every connection when
    /// they return, i.e. there is no per-connection cache (advertises
    /// `NBD_FLAG_CAN_MULTI_CONN`). Say `true` only if that holds.
    fn can_multi_conn(&self) -> bool {
        false
    }
    /// Seeks are expensive (advertises `NBD_FLAG_ROTATIONAL`).
    fn is_rotational(&self) -> bool {
        false
    }
}

/// The operating system's error code of `e` or of the first error in its
/// source chain that has one (an export may wrap the device's error).
fn os_error_code(e: &io::Error) -> Option<i32> {
    if let Some(code) = e.raw_os_error() {
        return Some(code);
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = e
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    while let Some(err) = next {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(|io| io.raw_os_error())
        {
            return Some(code);
        }
        next = err.source();
    }
    None
}

/// Maps an export error to the NBD errno sent to the client.
pub fn nbd_errno(e: &io::Error) -> u32 {
    if let Some(code) = os_error_code(e) {
        return match code {
            libc::EPERM | libc::EACCES | libc::EROFS => proto::EPERM,
            libc::EIO => proto::EIO,
            libc::ENOMEM => proto::ENOMEM,
            libc::EINVAL => proto::EINVAL,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => proto::ENOSPC,
            libc::EOVERFLOW => proto::EOVERFLOW,
            libc::ESHUTDOWN => proto::ESHUTDOWN,
            _ => proto::EIO,
        };
    }
    match e.kind() {
        io::ErrorKind::PermissionDenied => proto::EPERM,
        io::ErrorKind::InvalidInput => proto::EINVAL,
        io::ErrorKind::OutOfMemory => proto::ENOMEM,
        _ => proto::EIO,
    }
}

/// Transmission flags advertised for `export`, given whether structured
/// replies were negotiated (`NBD_FLAG_SEND_DF` requires them).
pub fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut f = proto::FLAG_HAS_FLAGS;
    if export.read_only() {
        f |= proto::FLAG_READ_ONLY;
    } else {
        if export.can_trim() {
            f |= proto::FLAG_SEND_TRIM;
        }
        if export.can_write_zeroes() {
            f |= proto::FLAG_SEND_WRITE_ZEROES;
        }
    }
    if export.can_flush() {
        f |= proto::FLAG_SEND_FLUSH;
        if export.can_fua() && !export.read_only() {
            f |= proto::FLAG_SEND_FUA;
        }
    }
    if export.is_rotational() {
        f |= proto::FLAG_ROTATIONAL;
    }
    if export.can_multi_conn() {
        f |= proto::FLAG_CAN_MULTI_CONN;
    }
    if structured {
        // Reads are always answered with a single data chunk.
        f |= proto::FLAG_SEND_DF;
    }
    f
}

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

    pub fn with_block_sizes(mut self, b: BlockSizes) -> Self {
        self.block_sizes = b;
        self
    }

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

    #[test]
    fn errno_mapping() {
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::EDQUOT)),
            proto::ENOSPC
        );
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::EROFS)),
            proto::EPERM
        );
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::ENOENT)),
            proto::EIO
        );
        assert_eq!(nbd_errno(&io::Error::other("x")), proto::EIO);
        // A device error wrapped by the export keeps its errno.
        #[derive(Debug)]
        struct Wrapped(io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "backing device: {}", self.0)
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let full = io::Error::other(Wrapped(io::Error::from_raw_os_error(libc::ENOSPC)));
        assert_eq!(nbd_errno(&full), proto::ENOSPC);
        assert_eq!(
            nbd_errno(&io::Error::new(io::ErrorKind::InvalidInput, "x")),
            proto::EINVAL
        );
    }

    #[test]
    fn block_size_validation() {
        assert!(BlockSizes::default().validate(1 << 30).is_ok());
        let bad = BlockSizes {
            min: 3,
            ..BlockSizes::default()
        };
        assert!(bad.validate(1 << 30).is_err());
        let bad = BlockSizes {
            min: 4096,
            preferred: 4096,
            max: 4097,
        };
        assert!(bad.validate(1 << 30).is_err());
    }
}
