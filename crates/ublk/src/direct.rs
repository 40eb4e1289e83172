//! Requests a queue thread serves through its own io_uring, without a
//! worker: a hit or a bypassed read ([`direct_read`]) and a miss on files
//! ([`direct_miss`]).
//!
//! With zero copy (`zero_copy.rs`) a direct read's pieces land in the
//! request's own pages, registered by the kernel at the tag's index, and
//! a miss's bytes are copied into the request from its scratch buffer.
//!
//! A direct read's pieces are read side by side; the caller commits the
//! request once they are all in. (Chaining the commit after the reads,
//! `IOSQE_IO_LINK`, saved a third of the server's CPU per hit in the VM
//! lab, but a chained ublk commit is not reliable: on Linux 6.12 the
//! driver now and then refused one (`-EINVAL`, `-EBUSY`) and its request
//! was never completed; with zero copy on 6.17 the guest kernel oopsed,
//! in `bio_dirty_fn` unpinning a bad page of the client's O_DIRECT read.
//! Both under the test suite's mixed-size writes, which pass without the
//! chain. The cause, in the kernel or in how it is used here, is not
//! known.)

use crate::device_queue::DeviceQueue;
use crate::fixed_buffers::TagScratch;
use crate::request::Request;
use crate::ring::{Op, QueueRing};
use crate::tag_buffers::TagBuf;
use std::rc::Rc;
use tiercache_frontend::{read_sqe, write_sqe, Checked, Export, ReadPiece};

/// A tag of a device queue and its buffer.
#[derive(Clone, Copy)]
pub(crate) struct TagBuffer<'a> {
    pub(crate) queue: &'a DeviceQueue,
    pub(crate) tag: u16,
    pub(crate) buf: &'a TagBuf,
    /// The buffer's index among the ring's registered buffers, if it is
    /// registered.
    pub(crate) fixed: Option<u16>,
    /// With zero copy, the index at which the kernel registered the
    /// request's own pages (None: none, or the kernel could not).
    pub(crate) request_index: Option<u16>,
}

/// Serves a read straight from the export's files through the queue's
/// io_uring ([`Export::begin_direct_read`]: a hit, or a read that bypasses
/// the cache). Some(result to commit) if it did; None if the read must go
/// another way (neither a hit nor a bypass, or a file read failed: the
/// export then reads it again itself).
pub(crate) async fn direct_read(
    ring: &Rc<QueueRing>,
    tag: &TagBuffer<'_>,
    export: &dyn Export,
    offset: u64,
    len: u32,
) -> Option<i32> {
    let TagBuffer {
        queue,
        tag: tag_no,
        buf,
        fixed,
        request_index,
    } = *tag;
    let req = Request::Read { offset, len };
    let Ok(Checked::Range { .. }) = crate::request::check(export, req, buf.len()) else {
        return None; // `execute` explains or answers it
    };
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        export.begin_direct_read(offset, len)
    }))
    .unwrap_or_else(|_| {
        log::error!("ublk: the export panicked planning a read at {offset}");
        None
    })?;
    let mut sqes = Vec::with_capacity(read.pieces.len());
    for &ReadPiece {
        fd,
        at: file_offset,
        into: buf_offset,
        len: n,
    } in &read.pieces
    {
        if buf_offset + n > len as usize {
            let _ = read.finish(Err(std::io::Error::other("a piece beyond the request")));
            return None;
        }
        sqes.push(match request_index {
            // Straight into the request's pages: a registered kernel
            // buffer is addressed by offset from its start.
            Some(index) => read_sqe(
                fd,
                buf_offset as *mut u8,
                n as u32,
                file_offset,
                Some(index),
            ),
            None => {
                // SAFETY (of the pointer): `buf_offset + n <= len <=
                // buf.len()` (checked above: `check` bounds a read by the
                // buffer), so the kernel writes inside the tag's buffer.
                let ptr = unsafe { buf.as_mut_ptr().add(buf_offset) };
                read_sqe(fd, ptr, n as u32, file_offset, fixed)
            }
        });
    }
    // SAFETY: nothing else touches the tag's buffer until this request is
    // committed (see the worker's comment in `serve_tag`), and this task
    // waits for every read's completion before going on; the buffer lives
    // in the tag's slot, which outlives the task; the files stay open while
    // the export's read plan lives, until `finish` below.
    let ops: Vec<Op> = sqes
        .into_iter()
        .map(|sqe| unsafe { ring.push(sqe) })
        .collect();
    let mut outcome = Ok(());
    for (op, piece) in ops.into_iter().zip(&read.pieces) {
        let r = uring_result(op.await, piece.len);
        if outcome.is_ok() {
            outcome = r;
        }
    }
    match read.finish(outcome) {
        Ok(()) if queue.zero_copy() && request_index.is_none() => {
            // SAFETY: every read into the tag's buffer has completed;
            // `len <= buf.len()` (`check`).
            let data = unsafe { std::slice::from_raw_parts(buf.as_ptr(), len as usize) };
            Some(match queue.copy_to_request(tag_no, data) {
                Ok(()) => len as i32,
                Err(e) => {
                    log::error!("ublk: copying a read at {offset} to its request: {e}");
                    -libc::EIO
                }
            })
        }
        Ok(()) => Some(len as i32),
        Err(e) => {
            log::debug!("ublk: direct read at {offset} failed ({e}); reading it again");
            None
        }
    }
}

/// Serves a read miss through the queue's io_uring
/// ([`Export::begin_direct_miss`]): the backing file read into the tag's
/// `scratch` buffer, the request's bytes copied to the tag's buffer and
/// the request committed, then the promotion written from `scratch` to the
/// cache file (the client does not wait for it). Some(the commit, which
/// resolves with the tag's next request) if it did; None if the read must
/// go another way and be committed by the caller (the export cannot serve
/// it so, or the backing read failed: the export then reads it again
/// itself).
pub(crate) async fn direct_miss(
    ring: &Rc<QueueRing>,
    tag: &TagBuffer<'_>,
    export: &dyn Export,
    offset: u64,
    len: u32,
    scratch: &mut TagScratch,
) -> Option<Op> {
    let buf = tag.buf;
    let req = Request::Read { offset, len };
    let Ok(Checked::Range { .. }) = crate::request::check(export, req, buf.len()) else {
        return None;
    };
    let mut miss = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        export.begin_direct_miss(offset, len)
    }))
    .unwrap_or_else(|_| {
        log::error!("ublk: the export panicked planning a miss at {offset}");
        None
    })?;
    let need = miss.scratch_len();
    if miss.data_at + len as usize > miss.source.len {
        let bad = std::io::Error::other("the request's bytes beyond the source");
        let _ = miss.finish(Err(bad), None, &[]);
        return None;
    }
    let (scratch, index) = scratch.get(ring, need);
    let src = miss.source;
    // SAFETY: `src.len <= need <= scratch.len()`, so the kernel writes
    // inside the scratch buffer, which this tag's task owns (nothing else
    // reads or writes it). The task is never dropped with an IO in flight:
    // the queue thread's executor runs every tag task to its end, and the
    // thread lives as long as the process.
    let sqe = read_sqe(
        src.fd,
        scratch.as_mut_ptr(),
        src.len as u32,
        src.offset,
        index,
    );
    // SAFETY: see above; the backing file stays open while the miss's
    // plan lives, until `finish` below.
    let read = uring_result(unsafe { ring.push(sqe) }.await, src.len);
    if read.is_err() {
        if let Err(e) = miss.finish(read, None, &[]) {
            log::debug!("ublk: direct miss at {offset} failed ({e}); reading it again");
        }
        return None;
    }
    let mut result = len as i32;
    if tag.queue.zero_copy() {
        // SAFETY: `data_at + len <= src.len <= scratch.len()` (checked
        // above), and the source read into it has completed.
        let data =
            unsafe { std::slice::from_raw_parts(scratch.as_ptr().add(miss.data_at), len as usize) };
        if let Err(e) = tag.queue.copy_to_request(tag.tag, data) {
            log::error!("ublk: copying a miss at {offset} to its request: {e}");
            result = -libc::EIO;
        }
    } else {
        // SAFETY: `data_at + len <= src.len <= scratch.len()` (checked
        // above) and `len <= buf.len()` (`check`); the tag's buffer is ours
        // until the commit (see the worker's comment in `serve_tag`); the
        // two buffers are distinct allocations.
        unsafe {
            std::ptr::copy_nonoverlapping(
                scratch.as_ptr().add(miss.data_at),
                buf.as_mut_ptr(),
                len as usize,
            );
        }
    }
    // The client's bytes are in its buffer: `DirectMiss::finish`'s
    // contract is Ok once the source read has succeeded, so the request
    // is committed now, before the fill.
    // SAFETY: the commit names the tag's buffer, as every commit; it is
    // not touched again until the tag's next request.
    let commit = unsafe { ring.push(tag.queue.commit_sqe(tag.tag, buf.as_mut_ptr(), result)) };
    let fill_range = miss.fill;
    let fill = match fill_range {
        Some(f) if f.len <= need && miss.begin_fill() => {
            // SAFETY: the kernel reads `f.len <= scratch.len()` bytes of
            // the scratch buffer, which nothing writes meanwhile.
            let sqe = write_sqe(f.fd, scratch.as_ptr(), f.len as u32, f.offset, index);
            // SAFETY: as above; the cache file stays open while the
            // plan lives.
            Some(uring_result(unsafe { ring.push(sqe) }.await, f.len))
        }
        _ => None,
    };
    // SAFETY: every IO into the scratch buffer has completed.
    let bytes = unsafe { std::slice::from_raw_parts(scratch.as_ptr(), need) };
    if let Err(e) = miss.finish(Ok(()), fill, bytes) {
        log::error!("ublk: a direct miss at {offset} was refused after it was served: {e}");
    }
    Some(commit)
}

/// An io_uring IO's outcome: Ok if it moved exactly `n` bytes.
fn uring_result(r: i32, n: usize) -> std::io::Result<()> {
    match r {
        r if r >= 0 && r as usize == n => Ok(()),
        r if r < 0 => Err(std::io::Error::from_raw_os_error(-r)),
        r => Err(std::io::Error::other(format!("short IO: {r} of {n} bytes"))),
    }
}
