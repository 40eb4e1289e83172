//! The [`Export`] trait: what a front end serves, and the quick read paths
//! a front end may take on the threads that serve many requests.

use crate::limits::BlockSizes;
use crate::DirectMiss;
use std::io;

/// A block device served by a front end (NBD or ublk).
///
/// The front ends call these methods concurrently from several threads
/// (and, with several NBD connections, for several clients), hence `Send +
/// Sync`. Every `offset`/length a front end passes has been accepted by
/// [`crate::check_request`] first: it lies within `0..size()`, is a
/// multiple of the minimum block size, is not zero, and (for `read` and
/// `write`) is at most the maximum block size. Writes, trims and
/// write-zeroes are only called when `read_only()` is false; `trim` only
/// when `can_trim()`; `flush` only when `can_flush()`; `fua` is only true
/// when `can_fua()`.
///
/// Errors are `io::Error`s; the front ends turn them into a Linux errno
/// with [`crate::errno`] (an errno the error or its source chain carries,
/// else one from its kind: `InvalidInput` -> `EINVAL`, anything unknown
/// -> `EIO`), which NBD narrows to its wire values.
pub trait Export: Send + Sync {
    /// Size in bytes. Must not change while a front end serves it.
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

    /// For a caller that can read files asynchronously (ublk's queues and
    /// NBD connections, through io_uring): if the range can be read
    /// straight from files (a cache hit, or a read that bypasses the
    /// cache), the pieces to read, the range held stable until the returned read is finished or
    /// dropped, on the thread that began it (it may hold locks that
    /// belong to that thread). None (the default): use
    /// `read_if_quick` or `read`. The buffer the pieces are read into must
    /// be aligned to 4096 bytes (the file may be open with O_DIRECT).
    fn begin_direct_read(&self, offset: u64, len: u32) -> Option<DirectRead<'_>> {
        let _ = (offset, len);
        None
    }

    /// For a caller that can read and write files asynchronously (ublk's
    /// queues, through io_uring): a read that is not a quick hit, served
    /// by the caller from the files [`DirectMiss`] names (the backing
    /// device's, then the cache's for the promotion), with everything it
    /// decides already decided and counted as `read` would. None (the
    /// default): use `read`.
    fn begin_direct_miss(&self, offset: u64, len: u32) -> Option<DirectMiss<'_>> {
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

    /// Refuse writes (NBD: `NBD_FLAG_READ_ONLY`; ublk: a read-only device).
    fn read_only(&self) -> bool {
        false
    }
    /// `flush` does something (NBD: `NBD_FLAG_SEND_FLUSH`; ublk: a volatile
    /// write cache).
    fn can_flush(&self) -> bool {
        true
    }
    /// `fua` is honoured (NBD: `NBD_FLAG_SEND_FUA`; ublk: the FUA
    /// attribute).
    fn can_fua(&self) -> bool {
        true
    }
    /// `trim` is worth sending (NBD: `NBD_FLAG_SEND_TRIM`; ublk: discard
    /// limits).
    fn can_trim(&self) -> bool {
        false
    }
    /// `write_zeroes` is supported (NBD: `NBD_FLAG_SEND_WRITE_ZEROES`; the
    /// default implementation always works).
    fn can_write_zeroes(&self) -> bool {
        true
    }
    /// The effects of `flush` and FUA are visible to every connection when
    /// they return, i.e. there is no per-connection cache (NBD:
    /// `NBD_FLAG_CAN_MULTI_CONN`). Say `true` only if that holds.
    fn can_multi_conn(&self) -> bool {
        false
    }
    /// Seeks are expensive (NBD: `NBD_FLAG_ROTATIONAL`; ublk: a rotational
    /// device).
    fn is_rotational(&self) -> bool {
        false
    }
}

/// One piece of a [`DirectRead`]: `len` bytes of file `fd` at `at`, read
/// into the caller's buffer at `into`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    /// The file to read.
    pub fd: std::os::fd::RawFd,
    /// Where in the file.
    pub at: u64,
    /// Where in the caller's buffer.
    pub into: usize,
    /// Bytes.
    pub len: usize,
}

/// A read the caller performs itself, from files, instead of calling
/// [`Export::read`] (see [`Export::begin_direct_read`]).
pub struct DirectRead<'a> {
    /// Reading every piece fills the caller's buffer with the requested
    /// range.
    pub pieces: Vec<ReadPiece>,
    finish: Box<dyn FnOnce(io::Result<()>) -> io::Result<()> + 'a>,
}

impl<'a> DirectRead<'a> {
    /// A read of `pieces` (offset in the file, offset in the caller's
    /// buffer, bytes) from one file, `fd`; `finish` is called once, with
    /// the outcome of reading the pieces.
    pub fn new(
        fd: std::os::fd::RawFd,
        pieces: Vec<(u64, usize, usize)>,
        finish: impl FnOnce(io::Result<()>) -> io::Result<()> + 'a,
    ) -> DirectRead<'a> {
        let pieces = pieces
            .into_iter()
            .map(|(at, into, len)| ReadPiece { fd, at, into, len })
            .collect();
        DirectRead::of_pieces(pieces, finish)
    }

    /// A read of `pieces`, each from its own file (a bypassed read: some
    /// blocks from the cache, the rest from the backing device).
    pub fn of_pieces(
        pieces: Vec<ReadPiece>,
        finish: impl FnOnce(io::Result<()>) -> io::Result<()> + 'a,
    ) -> DirectRead<'a> {
        DirectRead {
            pieces,
            finish: Box::new(finish),
        }
    }

    /// Ends the read with the outcome of reading every piece (a short read
    /// is an error). Ok: the buffer holds the data. Err: it does not; read
    /// the range with [`Export::read`] instead. With `result` Ok it
    /// returns Ok (a front end may rely on it to answer its client before
    /// it calls this).
    pub fn finish(self, result: io::Result<()>) -> io::Result<()> {
        (self.finish)(result)
    }
}
