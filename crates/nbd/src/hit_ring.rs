//! [`HitRing`]: a connection's io_uring for the reads its reader thread
//! does itself (cache hits on a file, [`Export::begin_direct_read`]; and
//! misses on files, [`Export::begin_direct_miss`]: the source read, then
//! the fill written from the same buffer), so that one connection keeps
//! as many reads on the devices as its client has requests in flight,
//! instead of one blocking `pread` at a time, and a miss needs no worker.
//!
//! The reader thread owns the ring and is its only user: it begins a hit
//! ([`HitRing::start`], which queues the reads), submits them in batches
//! ([`HitRing::submit`], before it would block), and reaps finished hits
//! ([`HitRing::reap`]), waiting when asked for a completion or for the
//! socket to become readable (one oneshot poll of the socket on the ring),
//! so that one `io_uring_enter` waits for both. The poll's firing says
//! "look", not "readable": the reader then reads the socket without
//! waiting and waits again if it finds nothing ([`HitRing::reap`]). A
//! [`DirectRead`] (and a [`DirectMiss`]) holds the
//! export's locks and pins, which belong to the thread that took them; it
//! never leaves the reader thread. Dropping the ring waits for every read
//! still in flight: the kernel writes into buffers the ring owns.
//!
//! [`Export::begin_direct_read`]: tiercache_frontend::Export::begin_direct_read
//! [`Export::begin_direct_miss`]: tiercache_frontend::Export::begin_direct_miss

use crate::fixed_bufs::FixedBufs;
use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::RawFd;
use tiercache_frontend::{read_sqe, write_sqe, DirectMiss, DirectRead, ReadPiece};

/// Submission queue entries; a hit uses one per piece.
const ENTRIES: u32 = 256;
/// The alignment O_DIRECT files need of the buffer (see
/// [`tiercache_frontend::Export::begin_direct_read`]).
pub(crate) const ALIGN: usize = 4096;
/// `user_data` of the socket's poll; a read's is its slot and its length.
const POLL: u64 = u64::MAX;

/// A hit being read: the request it answers, its buffer and where its data
/// starts in the buffer (aligned to [`ALIGN`]).
struct InFlight<'a> {
    handle: u64,
    offset: u64,
    len: usize,
    buf: Vec<u8>,
    /// `buf`'s index among the ring's registered buffers, if it is one.
    fixed: Option<u16>,
    start: usize,
    op: Op<'a>,
    /// Pieces not yet completed.
    pending: usize,
    /// The first failure of a piece (an errno, or a short read).
    error: Option<io::Error>,
}

/// What a slot of the ring is doing.
enum Op<'a> {
    /// A hit: its pieces read from the cache file into the buffer.
    Hit(DirectRead<'a>),
    /// A miss ([`HitRing::start_miss`]): the source read into the buffer
    /// from `start`, then the fill written from there if `filling`.
    Miss { miss: DirectMiss<'a>, filling: bool },
}

/// A hit whose reads have all completed and whose [`DirectRead`] is
/// finished: Ok, `buf[start..start + len]` holds the data; Err, the export
/// asks for the range to be read the normal way ([`Export::read`]).
///
/// [`Export::read`]: tiercache_frontend::Export::read
pub(crate) struct Finished {
    pub(crate) handle: u64,
    pub(crate) offset: u64,
    pub(crate) len: usize,
    pub(crate) buf: Vec<u8>,
    /// `buf`'s index among the registered buffers ([`FixedBufs`]), if it
    /// is one: it goes back there, never to the spare buffers.
    pub(crate) fixed: Option<u16>,
    pub(crate) start: usize,
    pub(crate) result: io::Result<()>,
}

/// How long [`HitRing::reap`] may wait.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Wait {
    /// Not at all: only what has completed already.
    No,
    /// Until at least one hit has finished (there must be one in flight).
    ForHit,
    /// Until a hit has finished or the socket's poll fires (see
    /// [`HitRing::reap`] for what that tells).
    ForHitOrSocket,
}

/// See the module documentation.
pub(crate) struct HitRing<'a> {
    ring: IoUring,
    /// Buffers registered with `ring` (None: the kernel refused them).
    fixed: Option<FixedBufs>,
    socket: RawFd,
    /// Hits in flight by slot (`user_data >> 32`), and the free slots.
    slots: Vec<Option<InFlight<'a>>>,
    free: Vec<usize>,
    /// Reads queued or submitted and not yet completed.
    sqes_in_flight: usize,
    /// Reads queued but not yet submitted.
    queued: usize,
    poll_armed: bool,
}

impl<'a> HitRing<'a> {
    /// A ring for a connection whose socket is `socket` (polled for
    /// readability). Err when the kernel refuses io_uring (too old,
    /// disabled by `kernel.io_uring_disabled` or a seccomp filter): the
    /// connection then reads hits the blocking way.
    pub(crate) fn new(socket: RawFd) -> io::Result<HitRing<'a>> {
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_single_issuer()
            .build(ENTRIES)
            .or_else(|_| IoUring::new(ENTRIES))?;
        let fixed = FixedBufs::register(&ring)
            .map_err(|e| log::debug!("no registered buffers for hits ({e}): plain reads"))
            .ok();
        Ok(HitRing {
            ring,
            fixed,
            socket,
            slots: Vec::new(),
            free: Vec::new(),
            sqes_in_flight: 0,
            queued: 0,
            poll_armed: false,
        })
    }

    /// Whether a read of `len` bytes may use the ring: its pieces (at most
    /// one per 4 KiB cache block, and two partial ones) fit in the
    /// submission queue.
    pub(crate) fn fits(len: u32) -> bool {
        len as usize / ALIGN + 2 <= ENTRIES as usize
    }

    /// The ring's registered buffers, if any (for the replies to give
    /// back).
    pub(crate) fn fixed_bufs(&self) -> Option<FixedBufs> {
        self.fixed.clone()
    }

    /// The socket the ring polls.
    pub(crate) fn socket(&self) -> RawFd {
        self.socket
    }

    /// Hits in flight (started and not yet returned by `reap`).
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Starts reading hit `read` of request `handle` (`len` bytes at
    /// `offset`) into `buf` (a spare buffer, whatever it holds; grown, never
    /// cleared, to hold `len` bytes at an [`ALIGN`]ed start: a buffer that
    /// served a hit before is used as it is, without zeroing it again).
    /// Queues one read per piece; `submit` sends them. A piece outside the
    /// request ends the hit at once, failed. Call only when
    /// `Self::fits(len)`. A hit that fits a free registered buffer reads
    /// into that one instead (`READ_FIXED`), and `buf` comes back unused.
    pub(crate) fn start(
        &mut self,
        handle: u64,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
        read: DirectRead<'a>,
    ) -> Option<Vec<u8>> {
        let (mut buf, fixed, unused) = self.buffer_for(len, spare);
        let start = buf.as_ptr().align_offset(ALIGN);
        let bad = read
            .pieces
            .iter()
            .any(|p| p.into.checked_add(p.len).map_or(true, |end| end > len));
        let pieces = if bad { 0 } else { read.pieces.len() };
        let slot = self.take_slot();
        let data = buf[start..].as_mut_ptr();
        self.slots[slot] = Some(InFlight {
            handle,
            offset,
            len,
            buf,
            fixed,
            start,
            op: Op::Hit(read),
            pending: pieces,
            error: bad.then(|| io::Error::other("the export gave a piece beyond the request")),
        });
        if pieces == 0 {
            // Nothing to read (or refused): finished at the next reap.
            self.queue(opcode::Nop::new().build().user_data((slot as u64) << 32));
            self.slots[slot].as_mut().unwrap().pending = 1;
            return unused;
        }
        for i in 0..pieces {
            let Some(InFlight {
                op: Op::Hit(read), ..
            }) = &self.slots[slot]
            else {
                unreachable!("a hit was just put in the slot")
            };
            let ReadPiece {
                fd,
                at: file_offset,
                into: at,
                len: n,
            } = read.pieces[i];
            // SAFETY: `at + n <= len` (checked above), and the buffer holds
            // `start + len` bytes, so the kernel writes inside it. The
            // buffer lives in `slots[slot]` (its heap block does not move
            // with the `Vec`) until every piece's completion is reaped;
            // nobody else touches it meanwhile, and `Drop` waits for every
            // read in flight.
            // A registered buffer is read into at the memory registered
            // under its index (`FixedBufs` hands out only such buffers).
            let ptr = unsafe { data.add(at) };
            let sqe = read_sqe(fd, ptr, n as u32, file_offset, fixed);
            self.queue(sqe.user_data(((slot as u64) << 32) | n as u64));
        }
        unused
    }

    /// Starts serving miss `miss` of request `handle` (`len` bytes at
    /// `offset`) in `buf` (a spare buffer, grown to hold the miss's
    /// scratch bytes at an [`ALIGN`]ed start): the source read is queued;
    /// once it completes, `reap` queues the fill's write from the same
    /// bytes if the miss may fill, and finishes the miss when that is
    /// done. The reply's data is the request's bytes within the source,
    /// so nothing is copied. A miss whose request lies outside its source
    /// ends at once, failed. A miss whose scratch bytes fit a free
    /// registered buffer is read and filled from that one instead
    /// (`READ_FIXED`, `WRITE_FIXED`), and `buf` comes back unused.
    pub(crate) fn start_miss(
        &mut self,
        handle: u64,
        offset: u64,
        len: usize,
        spare: Vec<u8>,
        miss: DirectMiss<'a>,
    ) -> Option<Vec<u8>> {
        let (mut buf, fixed, unused) = self.buffer_for(miss.scratch_len(), spare);
        let start = buf.as_ptr().align_offset(ALIGN);
        let src = miss.source;
        let bad = miss
            .data_at
            .checked_add(len)
            .map_or(true, |end| end > src.len);
        let slot = self.take_slot();
        let data = buf[start..].as_mut_ptr();
        self.slots[slot] = Some(InFlight {
            handle,
            offset,
            len,
            buf,
            fixed,
            start,
            op: Op::Miss {
                miss,
                filling: false,
            },
            pending: 1,
            error: bad.then(|| io::Error::other("the export gave a request beyond its source")),
        });
        if bad {
            self.queue(opcode::Nop::new().build().user_data((slot as u64) << 32));
            return unused;
        }
        // SAFETY: the buffer holds `start + scratch_len()` bytes and `src.len <=
        // scratch_len()`, so the kernel writes inside it; it lives in `slots[slot]`
        // until the completion is reaped, nobody else touches it, and
        // `Drop` waits for every IO in flight. A registered buffer is read
        // into at the memory registered under its index.
        let sqe = read_sqe(src.fd, data, src.len as u32, src.offset, fixed);
        self.queue(sqe.user_data(((slot as u64) << 32) | src.len as u64));
        unused
    }

    /// A buffer for `len` bytes at an [`ALIGN`]ed start: a free registered
    /// one (with its index) if one fits, and then `spare` back unused;
    /// else `spare`, grown if it must be.
    fn buffer_for(&self, len: usize, spare: Vec<u8>) -> (Vec<u8>, Option<u16>, Option<Vec<u8>>) {
        let (mut buf, fixed, unused) = match self.fixed.as_ref().and_then(|f| f.take(len)) {
            Some((index, registered)) => (registered, Some(index), Some(spare)),
            None => (spare, None, None),
        };
        if buf.len() < len + ALIGN {
            debug_assert!(fixed.is_none(), "a registered buffer must not move");
            buf.resize(len + ALIGN, 0);
        }
        (buf, fixed, unused)
    }

    /// A free slot for an IO in flight.
    fn take_slot(&mut self) -> usize {
        match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        }
    }

    /// Puts `sqe` on the submission queue, submitting first if it is full.
    fn queue(&mut self, sqe: io_uring::squeue::Entry) {
        loop {
            // SAFETY: every entry queued points into a buffer that outlives
            // its completion (see `start`); a poll and a nop point nowhere.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                break;
            }
            self.submit();
        }
        self.queued += 1;
        self.sqes_in_flight += 1;
    }

    /// Sends the queued reads to the kernel (before the caller blocks on
    /// anything else).
    pub(crate) fn submit(&mut self) {
        if self.queued == 0 {
            return;
        }
        self.enter(0);
    }

    /// `io_uring_enter`: submits what is queued, waits for `want`
    /// completions. A full completion queue (`EBUSY`) is drained by the
    /// caller's next reap; interruptions are retried.
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(e) => {
                    // Only a broken ring fails so; nothing can be done but
                    // to wait for what is in flight, which `reap` does.
                    log::error!("io_uring_enter failed: {e}");
                    break;
                }
            }
        }
        self.queued = self.ring.submission().len();
    }

    /// Collects into `done` the hits whose reads have all completed, each
    /// [`DirectRead`] finished with the outcome. Waits first as `wait`
    /// says; returns whether the socket's poll fired: the socket has bytes
    /// or is closed, or had bytes that were read since. The poll may fire
    /// for those even if the socket was not read after it was armed: a
    /// sender wakes the socket's waiters only after queueing its bytes, so
    /// a read in between takes them and a poll armed after it still gets
    /// that wake-up. So read the socket only without waiting
    /// ([`crate::sockets::recv_now`]), and wait again if it has nothing:
    /// a read that waits there (99bd3c3 trusted the poll) leaves the
    /// reader blocked with hits in flight that only it can answer.
    pub(crate) fn reap(&mut self, wait: Wait, done: &mut Vec<Finished>) -> bool {
        match wait {
            Wait::No => {}
            Wait::ForHit => self.enter(1),
            Wait::ForHitOrSocket => {
                if !self.poll_armed {
                    self.poll_armed = true;
                    self.queue(
                        opcode::PollAdd::new(types::Fd(self.socket), libc::POLLIN as u32)
                            .build()
                            .user_data(POLL),
                    );
                }
                self.enter(1);
            }
        }
        let mut fired = false;
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            self.sqes_in_flight -= 1;
            if cqe.user_data() == POLL {
                self.poll_armed = false;
                fired = true;
                continue;
            }
            let slot = (cqe.user_data() >> 32) as usize;
            let want = (cqe.user_data() & 0xffff_ffff) as i32;
            let hit = self.slots[slot]
                .as_mut()
                .expect("a completion for a free slot");
            let res = cqe.result();
            if res < 0 {
                hit.error.get_or_insert(io::Error::from_raw_os_error(-res));
            } else if res != want {
                hit.error.get_or_insert(io::Error::other(format!(
                    "short read: {res} of {want} bytes"
                )));
            }
            hit.pending -= 1;
            if hit.pending > 0 {
                continue;
            }
            // A miss whose source read worked fills next, if it may.
            if let Op::Miss {
                miss,
                filling: filling @ false,
            } = &mut hit.op
            {
                if let (None, Some(fill)) = (&hit.error, miss.fill) {
                    if fill.len <= hit.buf.len() - hit.start && miss.begin_fill() {
                        *filling = true;
                        hit.pending = 1;
                        // SAFETY: `fill.len` bytes from `start` are inside
                        // the buffer, which stays in its slot, untouched,
                        // until this write's completion is reaped.
                        let data = hit.buf[hit.start..].as_ptr();
                        let sqe = write_sqe(fill.fd, data, fill.len as u32, fill.offset, hit.fixed);
                        self.queue(sqe.user_data(((slot as u64) << 32) | fill.len as u64));
                        continue;
                    }
                }
            }
            let hit = self.slots[slot].take().unwrap();
            self.free.push(slot);
            let mut start = hit.start;
            let result = match hit.op {
                Op::Hit(read) => read.finish(hit.error.map_or(Ok(()), Err)),
                Op::Miss { miss, filling } => {
                    start += miss.data_at;
                    let need = miss.scratch_len().min(hit.buf.len() - hit.start);
                    let scratch = &hit.buf[hit.start..hit.start + need];
                    match (filling, hit.error) {
                        // The fill's outcome; the source read worked.
                        (true, e) => miss.finish(Ok(()), Some(e.map_or(Ok(()), Err)), scratch),
                        (false, e) => {
                            let read = e.map_or(Ok(()), Err);
                            miss.finish(read, None, scratch)
                        }
                    }
                }
            };
            done.push(Finished {
                handle: hit.handle,
                offset: hit.offset,
                len: hit.len,
                buf: hit.buf,
                fixed: hit.fixed,
                start,
                result,
            });
        }
        fired
    }
}

impl Drop for HitRing<'_> {
    /// Waits for every IO in flight (the kernel writes into buffers the
    /// ring owns), then drops each hit and miss unfinished: a device error
    /// is not counted for a closed connection, a miss's promotion is given
    /// up, locks and pins are released (their `Drop`).
    fn drop(&mut self) {
        self.submit();
        // The socket's poll may never complete: cancel it.
        if self.poll_armed {
            self.queue(opcode::PollRemove::new(POLL).build().user_data(POLL - 1));
            self.poll_armed = false;
        }
        while self.sqes_in_flight > 0 {
            self.enter(1);
            while let Some(cqe) = self.ring.completion().next() {
                self.sqes_in_flight -= 1;
                let slot = (cqe.user_data() >> 32) as usize;
                if let Some(Some(hit)) = self.slots.get_mut(slot) {
                    hit.pending -= 1;
                    if hit.pending == 0 {
                        drop(self.slots[slot].take());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbuf::InBuf;
    use crate::sockets::recv_now;
    use std::io::{BufReader, Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// How a miss was finished: the read's outcome, the fill's (if it
    /// was written), the scratch bytes.
    type Finish = (bool, Option<bool>, Vec<u8>);

    /// Records what the ring asks of a miss, and allows its fill or not.
    #[derive(Default)]
    struct Calls {
        may_fill: bool,
        fill_asked: std::cell::Cell<bool>,
        finished: std::cell::RefCell<Option<Finish>>,
    }

    impl tiercache_frontend::MissOps for &Calls {
        fn begin_fill(&mut self) -> bool {
            self.fill_asked.set(true);
            self.may_fill
        }
        fn finish(
            self: Box<Self>,
            read: io::Result<()>,
            fill: Option<io::Result<()>>,
            scratch: &[u8],
        ) -> io::Result<()> {
            let ok = read.is_ok();
            *self.finished.borrow_mut() = Some((ok, fill.map(|f| f.is_ok()), scratch.to_vec()));
            read
        }
    }

    /// A miss is read from its source, answered from where the request's
    /// bytes are in it (no copy), and its fill written from the same bytes
    /// only if the export allows it; a failed source read is answered Err
    /// (read the normal way) and fills nothing.
    #[test]
    fn a_miss_is_read_then_filled_then_finished() {
        let dir = tempfile::tempdir().unwrap();
        let backing: Vec<u8> = (0..16384u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("backing"), &backing).unwrap();
        std::fs::write(dir.path().join("cache"), vec![0u8; 16384]).unwrap();
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        let (b, c) = (open("backing"), open("cache"));
        // Declared before the ring, which holds the misses.
        let calls = [true, false, true].map(|may_fill| Calls {
            may_fill,
            ..Calls::default()
        });
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut ring = match HitRing::new(ours.as_raw_fd()) {
            Ok(r) => r,
            Err(e) => {
                tiercache_testkit::skip(
                    "a_miss_is_read_then_filled_then_finished",
                    &format!("io_uring is refused here ({e})"),
                );
                return;
            }
        };
        let range = |f: &std::fs::File, offset, len| tiercache_frontend::FileRange {
            fd: f.as_raw_fd(),
            offset,
            len,
        };
        for calls in &calls[..2] {
            let may_fill = calls.may_fill;
            // The block at 8192 (4 KiB) into a slot of the cache (another
            // each time round); the request is its second KiB.
            let slot = if may_fill { 4096 } else { 8192 };
            let miss = DirectMiss::new(
                range(&b, 8192, 4096),
                1024,
                Some(range(&c, slot, 4096)),
                calls,
            );
            ring.start_miss(7, 9216, 1024, Vec::new(), miss);
            let mut done = Vec::new();
            while done.is_empty() {
                ring.reap(Wait::ForHit, &mut done);
            }
            let f = &done[0];
            assert!(f.result.is_ok());
            assert_eq!((f.handle, f.offset, f.len), (7, 9216, 1024));
            assert_eq!(
                f.fixed.is_some(),
                ring.fixed_bufs().is_some(),
                "read and filled through a registered buffer when the ring has them"
            );
            assert_eq!(&f.buf[f.start..f.start + f.len], &backing[9216..10240]);
            assert!(calls.fill_asked.get());
            let (read_ok, fill, scratch) = calls.finished.borrow_mut().take().unwrap();
            assert!(read_ok);
            assert_eq!(scratch, backing[8192..12288], "the whole block read");
            let mut cached = vec![0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&c, &mut cached, slot).unwrap();
            if may_fill {
                assert_eq!(fill, Some(true));
                assert_eq!(cached, backing[8192..12288], "filled");
            } else {
                assert_eq!(fill, None);
                assert!(cached.iter().all(|&x| x == 0), "nothing filled");
            }
        }
        // A source read that fails (beyond the end): Err, no fill asked.
        let calls = &calls[2];
        let miss = DirectMiss::new(range(&b, 16384, 4096), 0, Some(range(&c, 0, 4096)), calls);
        ring.start_miss(8, 0, 4096, Vec::new(), miss);
        let mut done = Vec::new();
        while done.is_empty() {
            ring.reap(Wait::ForHit, &mut done);
        }
        assert!(done[0].result.is_err(), "a short read fails the miss");
        assert!(!calls.fill_asked.get());
        assert_eq!(
            calls.finished.borrow().as_ref().map(|f| (f.0, f.1)),
            Some((false, None))
        );
    }

    /// A hit with nothing to read: it finishes at the next reap.
    fn empty_hit<'a>() -> DirectRead<'a> {
        DirectRead::new(-1, Vec::new(), |r| r)
    }

    /// A socket poll that fired for bytes no longer there does not make
    /// the socket readable: the reader's top-up after it (a read that does
    /// not wait) finds nothing and leaves the buffer as it is, so the
    /// reader waits again; a read that waited would block with hits in
    /// flight that only the reader can answer, while the client waits for
    /// them. The kernel does fire a poll so: a sender wakes the socket's
    /// waiters only after queueing its bytes, so a reader that reads them
    /// in between and then arms the poll gets the late wake-up for bytes
    /// it already has (no read since the arming to tell). No test can
    /// stop a sender in that window; this one takes the bytes away
    /// between the poll's firing and the reap, which leaves the ring
    /// with the same completion and the same empty socket.
    #[test]
    fn a_poll_fired_for_bytes_gone_is_not_readable() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut ring = match HitRing::new(ours.as_raw_fd()) {
            Ok(r) => r,
            Err(e) => {
                tiercache_testkit::skip(
                    "a_poll_fired_for_bytes_gone_is_not_readable",
                    &format!("io_uring is refused here ({e})"),
                );
                return;
            }
        };
        let mut reader = InBuf::new(BufReader::new(&ours));
        let mut done = Vec::new();
        // A wait that a hit ends: the poll armed for it stays armed.
        ring.start(1, 0, 0, Vec::new(), empty_hit());
        assert!(!ring.reap(Wait::ForHitOrSocket, &mut done));
        assert_eq!(done.len(), 1);
        assert!(ring.poll_armed);
        // The poll fires; its bytes are gone before the ring looks.
        theirs.write_all(b"x").unwrap();
        reader.read_exact(&mut [0u8]).unwrap();
        ring.start(2, 0, 0, Vec::new(), empty_hit());
        let mut fired = false;
        for _ in 0..100 {
            fired |= ring.reap(Wait::ForHitOrSocket, &mut done);
            if !ring.poll_armed {
                break;
            }
            // The hit was reaped before the poll's completion: wait for
            // the poll alone (a nop hit ends the wait if it never fires).
            ring.start(3, 0, 0, Vec::new(), empty_hit());
        }
        assert!(!ring.poll_armed && fired, "the poll never fired");
        // What the reader does when the poll fired.
        let fd = ring.socket();
        let topped = reader.fill_with(|room| recv_now(fd, room));
        assert_eq!(
            topped.map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock),
            "an empty socket was said to be readable: a read would block"
        );
        assert!(reader.buffer().is_empty());
        // Bytes that do come are read by the next top-up.
        theirs.write_all(b"yz").unwrap();
        assert_eq!(reader.fill_with(|room| recv_now(fd, room)).unwrap(), 2);
        assert_eq!(reader.buffer(), b"yz");
    }
}
