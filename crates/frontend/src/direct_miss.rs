//! [`DirectMiss`]: a read miss the front end serves itself, from the
//! backing file into a scratch buffer and from there into the cache file
//! (see [`Export::begin_direct_miss`](crate::Export::begin_direct_miss)).

use std::io;
use std::os::fd::RawFd;

/// Bytes of an open file: `len` bytes at `offset` of `fd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    /// The file.
    pub fd: RawFd,
    /// Where in the file.
    pub offset: u64,
    /// How many bytes.
    pub len: usize,
}

/// The export's side of a [`DirectMiss`].
pub trait MissOps {
    /// Whether the caller may write the fill now. No: the caller skips it
    /// (the read still answers).
    fn begin_fill(&mut self) -> bool;

    /// Ends the miss: `read`, the outcome of reading the source; `fill`,
    /// of writing the fill (None if it was not written); `scratch`, the
    /// scratch buffer. Ok: the client's bytes copied out of the scratch
    /// buffer are right. Err: they are not; read the range with
    /// [`Export::read`](crate::Export::read) instead. With `read` Ok it
    /// must return Ok, whatever became of the fill: a front end may answer
    /// the client before the fill is written (ublk does).
    fn finish(
        self: Box<Self>,
        read: io::Result<()>,
        fill: Option<io::Result<()>>,
        scratch: &[u8],
    ) -> io::Result<()>;
}

/// A read miss the caller performs itself, in order:
/// 1. read [`DirectMiss::source`] into a scratch buffer aligned to 4096
///    bytes (the files may be open with O_DIRECT);
/// 2. if that worked, copy the request's bytes out of it, from
///    [`DirectMiss::data_at`];
/// 3. if [`DirectMiss::fill`] is Some and [`DirectMiss::begin_fill`] says
///    so, write the scratch buffer's first `fill.len` bytes there;
/// 4. [`DirectMiss::finish`] with both outcomes.
///
/// On the thread that began it: it may hold locks that belong to that
/// thread. Dropping it unfinished gives the fill up.
pub struct DirectMiss<'a> {
    /// What to read first.
    pub source: FileRange,
    /// Where the request's bytes start in the scratch buffer.
    pub data_at: usize,
    /// Where to write the scratch buffer's first bytes once read (a
    /// promotion into the cache), if anywhere.
    pub fill: Option<FileRange>,
    ops: Box<dyn MissOps + 'a>,
}

impl<'a> DirectMiss<'a> {
    /// A miss read from `source`, the request's bytes at `data_at` of it,
    /// then written to `fill`; `ops` decides and ends.
    pub fn new(
        source: FileRange,
        data_at: usize,
        fill: Option<FileRange>,
        ops: impl MissOps + 'a,
    ) -> DirectMiss<'a> {
        DirectMiss {
            source,
            data_at,
            fill,
            ops: Box::new(ops),
        }
    }

    /// Bytes the scratch buffer needs.
    pub fn scratch_len(&self) -> usize {
        self.source.len.max(self.fill.map_or(0, |f| f.len))
    }

    /// See [`MissOps::begin_fill`].
    pub fn begin_fill(&mut self) -> bool {
        self.fill.is_some() && self.ops.begin_fill()
    }

    /// See [`MissOps::finish`].
    pub fn finish(
        self,
        read: io::Result<()>,
        fill: Option<io::Result<()>>,
        scratch: &[u8],
    ) -> io::Result<()> {
        self.ops.finish(read, fill, scratch)
    }
}
