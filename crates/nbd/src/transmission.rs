//! One connection in transmission: the reader that parses requests (and
//! answers hits itself), the workers that execute the rest on the export,
//! and the replies.
//!
//! Threads: the connection's own thread reads requests and write payloads
//! into reusable buffers; `workers` executors share a queue. Executors
//! send their own replies under the connection's writer lock, so replies
//! go out in completion order, one `writev` each. Memory per connection is
//! bounded by `max_inflight_bytes` (plus one maximum-size request) and the
//! reader stops reading while the bound is reached.
//!
//! Hits: on a plain socket, a read the export lets us do from a file
//! ([`Export::begin_direct_read`], a cache hit on a cache file) goes on
//! the connection's io_uring ([`HitRing`]): the reader queues it, submits
//! the queued reads in one call when it has no complete request left to
//! parse, and answers the hits as they finish, waiting for a finished hit
//! or the socket in one `io_uring_enter`; when the socket's poll fires, it
//! reads the socket without waiting ([`InBuf::fill_with`]) and waits again
//! if that finds nothing. So a connection keeps as many
//! reads on the fast device as its client has requests in flight. Without
//! io_uring (TLS, or a kernel that refuses it), and for a hit in RAM
//! ([`Export::read_if_quick`]), the reader reads it itself, one at a time.
//! A miss the export lets the reader serve from files
//! ([`Export::begin_direct_miss`]) goes on the ring too (the backing read,
//! then the promotion's write); everything else goes to the workers. The replies to the hits the
//! reader answers go out in batches ([`ReadReplies`]): sent when the
//! reader has no complete request left to parse (or the batch is full),
//! one `writev` for many.

use crate::config::ServerConfig;
use crate::hit_ring::{Finished, HitRing, Wait};
use crate::inbuf::InBuf;
use crate::proto::{self, Command, TransmissionContext, Verdict};
use crate::replies::{ReadReplies, MAX_REPLIES};
use crate::sockets::{recv_now, Stream};
use crate::splice_out::SpliceOut;
use crate::wire::nbd_errno;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use tiercache_frontend::{Export, IdleWorkers};

struct Job {
    handle: u64,
    cmd: Command,
    buf: Vec<u8>,
}

/// Everything the reader and the workers of one connection share, under a
/// single lock so that a request costs the reader one or two lock
/// acquisitions and a worker two (pop; release), not one per structure.
struct State {
    jobs: VecDeque<Job>,
    /// No more jobs will be queued; workers exit once `jobs` is empty.
    closed: bool,
    /// Requests accepted and not yet answered, and their buffer bytes.
    count: usize,
    bytes: u64,
    /// Spare buffers (capacity at most `KEEP_BUF`), reused for payloads.
    bufs: Vec<Vec<u8>>,
    /// Which queued job is worth waking a worker for.
    idle: IdleWorkers,
}

impl State {
    /// Queues `job`; true if an idle worker must be woken for it.
    fn push_job(&mut self, job: Job) -> bool {
        self.jobs.push_back(job);
        let queued = self.jobs.len();
        self.idle.wake_for(queued)
    }
}

struct Conn<'a> {
    peer: &'a str,
    export: &'a dyn Export,
    structured: bool,
    writer: Mutex<Stream>,
    /// Set once a reply could not be sent; nothing more is sent.
    broken: AtomicBool,
    state: Mutex<State>,
    /// Signalled when a job is queued or the queue is closed.
    work_cv: Condvar,
    /// Signalled when a request completes (room for the reader).
    room_cv: Condvar,
    /// Rejection reasons already logged at warn level on this connection.
    logged: Mutex<Vec<&'static str>>,
    max_inflight: usize,
    max_bytes: u64,
    stopping: &'a AtomicBool,
}

const KEEP_BUF: usize = 1 << 20;
/// How long a connection's end waits for its client to read the replies
/// spliced last (see [`crate::fixed_bufs::FixedBufs::settle`]).
const SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// What only the reader thread uses: the ring for hits (None: hits are
/// read in turn), the read replies it has ready to send, and the list the
/// ring's finished hits are collected in (kept, so that reaping allocates
/// nothing).
struct ReaderSide<'r, 'a> {
    ring: Option<&'r mut HitRing<'a>>,
    replies: ReadReplies,
    done: Vec<Finished>,
    /// A spare buffer a hit did not use (it read into a registered one),
    /// for the next request before the shared spares.
    stash: Option<Vec<u8>>,
}

/// Serves requests on a negotiated connection until the client
/// disconnects, the connection breaks or the server stops (`stopping`, and
/// the socket's read side shut down): reads requests from `reader`, runs
/// them on `export` with `config.workers` workers, answers on `writer`
/// (structured replies if negotiated), then waits for every queued request
/// to be answered and closes the connection. `reader` reads the socket of
/// `writer` (its buffer, taken over with the bytes it holds, tells whether
/// a request can be parsed without waiting; on a plain socket it is the
/// socket itself, read as it is, so that the reader can top it up without
/// waiting).
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve<R: Read>(
    peer: &str,
    export: &dyn Export,
    structured: bool,
    writer: Stream,
    reader: BufReader<R>,
    ctx: &TransmissionContext,
    cfg: &ServerConfig,
    stopping: &AtomicBool,
) {
    // Hits on io_uring need the socket itself to poll: not under TLS,
    // whose records may hold requests the socket no longer shows.
    let mut reader = InBuf::new(reader);
    let mut ring = writer.plain_fd().and_then(|fd| {
        HitRing::new(fd)
            .map_err(|e| log::debug!("{peer}: no io_uring for hits ({e}); reading them in turn"))
            .ok()
    });
    let conn = Conn {
        peer,
        export,
        structured,
        writer: Mutex::new(writer),
        broken: AtomicBool::new(false),
        state: Mutex::new(State {
            jobs: VecDeque::new(),
            closed: false,
            count: 0,
            bytes: 0,
            bufs: Vec::new(),
            idle: IdleWorkers::default(),
        }),
        work_cv: Condvar::new(),
        room_cv: Condvar::new(),
        logged: Mutex::new(Vec::new()),
        max_inflight: cfg.max_inflight,
        max_bytes: cfg.max_inflight_bytes,
        stopping,
    };
    let fixed = ring.as_ref().and_then(|r| r.fixed_bufs());
    thread::scope(|s| {
        for i in 0..cfg.workers {
            let c = &conn;
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn_scoped(s, move || c.work());
            if let Err(e) = spawned {
                log::error!("{peer}: cannot spawn worker: {e}");
                if i == 0 {
                    conn.broken.store(true, Ordering::SeqCst);
                }
                break;
            }
        }
        let splice = match (&fixed, conn.writer.lock().plain_unix_fd()) {
            (Some(_), Some(fd)) => SpliceOut::new()
                .map_err(|e| log::debug!("{peer}: no pipe to splice replies ({e}); copying them"))
                .ok()
                .map(|out| (out, fd)),
            _ => None,
        };
        let mut side = ReaderSide {
            ring: ring.as_mut(),
            replies: ReadReplies::with_fixed(fixed.clone(), splice),
            done: Vec::new(),
            stash: None,
        };
        if !conn.broken.load(Ordering::SeqCst) {
            conn.read_requests(&mut reader, ctx, &mut side);
        }
        conn.drain_hits(&mut side);
        {
            let mut st = conn.state.lock();
            st.closed = true;
        }
        conn.work_cv.notify_all();
    });
    // All workers have exited, so every queued request was answered.
    // Spliced replies the client has not read keep their buffers (the
    // socket is closed next and cannot be asked again).
    if let Some(f) = &fixed {
        f.settle(SETTLE);
    }
    conn.writer.lock().close();
    log::debug!("{peer}: connection closed");
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the
/// first byte.
fn read_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn discard<R: Read>(r: &mut R, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 8192];
    while n > 0 {
        let k = n.min(scratch.len() as u64) as usize;
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Writes all of `parts` with as few `writev` calls as possible.
fn write_all_parts<W: Write>(w: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        if parts[idx].len() == off {
            idx += 1;
            off = 0;
            continue;
        }
        let mut slices = [IoSlice::new(&[]); 64];
        let mut k = 0;
        for (j, p) in parts[idx..].iter().enumerate().take(64) {
            slices[k] = IoSlice::new(if j == 0 { &p[off..] } else { p });
            k += 1;
        }
        let n = match w.write_vectored(&slices[..k]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        crate::parts::advance(parts, &mut idx, &mut off, n);
    }
    Ok(())
}

fn command_name(kind: u16) -> &'static str {
    match kind {
        proto::CMD_READ => "READ",
        proto::CMD_WRITE => "WRITE",
        proto::CMD_DISC => "DISC",
        proto::CMD_FLUSH => "FLUSH",
        proto::CMD_TRIM => "TRIM",
        proto::CMD_CACHE => "CACHE",
        proto::CMD_WRITE_ZEROES => "WRITE_ZEROES",
        proto::CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

impl<'a> Conn<'a> {
    /// Logs at warn level the first time `key` happens on this connection,
    /// at debug level afterwards.
    fn log_once(&self, key: &'static str, msg: impl FnOnce() -> String) {
        let first = {
            let mut l = self.logged.lock();
            if l.contains(&key) {
                false
            } else {
                l.push(key);
                true
            }
        };
        if first {
            log::warn!(
                "{}: {} (further occurrences logged at debug level)",
                self.peer,
                msg()
            );
        } else {
            log::debug!("{}: {}", self.peer, msg());
        }
    }

    fn read_requests<R: Read>(
        &self,
        reader: &mut InBuf<R>,
        ctx: &TransmissionContext,
        side: &mut ReaderSide<'_, 'a>,
    ) {
        let peer = self.peer;
        loop {
            if self.broken.load(Ordering::Relaxed) {
                return;
            }
            self.before_reading(side, reader);
            let mut hb = [0u8; proto::REQUEST_HEADER_LEN];
            match read_or_eof(reader, &mut hb) {
                Ok(true) => {}
                Ok(false) => {
                    if !self.stopping.load(Ordering::Relaxed) {
                        log::info!("{peer}: client closed the connection without NBD_CMD_DISC");
                    }
                    return;
                }
                Err(e) => {
                    if !self.broken.load(Ordering::Relaxed) {
                        log::warn!("{peer}: connection lost in a request header: {e}");
                    }
                    return;
                }
            }
            let h = match proto::parse_request_header(&hb) {
                Ok(h) => h,
                Err(e) => {
                    log::warn!("{peer}: malformed request ({e}); disconnecting");
                    return;
                }
            };
            match proto::validate_request(&h, ctx) {
                Verdict::Execute(Command::Disconnect) => {
                    log::debug!("{peer}: NBD_CMD_DISC");
                    return;
                }
                Verdict::Execute(cmd) => {
                    let bytes = match cmd {
                        Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
                        _ => 0,
                    };
                    let handle = h.handle;
                    let wake;
                    if let Command::Write { len, offset, .. } = cmd {
                        let mut buf = self.acquire(bytes, side);
                        buf.resize(len as usize, 0);
                        self.before_blocking(side); // the payload may not be here yet
                        if let Err(e) = reader.read_exact(&mut buf) {
                            log::warn!(
                                "{peer}: client vanished in the middle of a write payload \
                                 (offset {offset}, {len} bytes): {e}"
                            );
                            self.finish(buf, bytes);
                            return;
                        }
                        wake = self.state.lock().push_job(Job { handle, cmd, buf });
                    } else if let Command::Read { offset, len } = cmd {
                        // A read the export can answer at once (a cache
                        // hit) is answered here, saving the hand-off to a
                        // worker and back: from a file through the ring,
                        // many at once, else from RAM (or a blocking read)
                        // on this thread; the rest go to the workers.
                        let mut buf = self.acquire(bytes, side);
                        if let Some(r) = side.ring.as_deref_mut() {
                            if !cmd.is_empty() && HitRing::fits(len) {
                                let direct =
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                        self.export.begin_direct_read(offset, len)
                                    }))
                                    .unwrap_or_else(|_| {
                                        log::error!("{peer}: export panicked planning a read");
                                        None
                                    });
                                if let Some(direct) = direct {
                                    side.stash = r.start(handle, offset, len as usize, buf, direct);
                                    continue;
                                }
                            }
                        }
                        buf.resize(len as usize, 0);
                        let quick = if cmd.is_empty() {
                            Some(Ok(())) // asks nothing of the export
                        } else {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                self.export.read_if_quick(offset, &mut buf)
                            }))
                            .unwrap_or_else(|_| Some(Err(io::Error::other("export panicked"))))
                        };
                        match quick {
                            Some(Ok(())) => {
                                // Answered: no worker to wake.
                                side.replies.push(
                                    self.structured,
                                    handle,
                                    offset,
                                    buf,
                                    0..len as usize,
                                    None,
                                );
                                if side.replies.is_full() {
                                    self.flush_replies(&mut side.replies);
                                }
                                continue;
                            }
                            Some(res) => {
                                self.complete(handle, cmd, res, buf, bytes);
                                continue;
                            }
                            None => {}
                        }
                        // A miss the export lets this thread serve: read
                        // and promoted through the ring too.
                        if let Some(r) = side.ring.as_deref_mut() {
                            let miss =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    self.export.begin_direct_miss(offset, len)
                                }))
                                .unwrap_or_else(|_| {
                                    log::error!("{peer}: export panicked planning a miss");
                                    None
                                });
                            if let Some(miss) = miss {
                                side.stash = r.start_miss(handle, offset, len as usize, buf, miss);
                                continue;
                            }
                        }
                        buf.clear();
                        wake = self.state.lock().push_job(Job { handle, cmd, buf });
                    } else {
                        // No payload: take the slot and queue in one go; the
                        // worker picks a buffer if it needs one.
                        let mut st = self.wait_for_room(bytes, side);
                        wake = st.push_job(Job {
                            handle,
                            cmd,
                            buf: Vec::new(),
                        });
                    }
                    if wake {
                        self.work_cv.notify_one();
                    }
                }
                Verdict::Reject {
                    errno,
                    discard: n,
                    reason,
                } => {
                    if n > 0 {
                        self.before_blocking(side); // the payload may not be here yet
                        if let Err(e) = discard(reader, u64::from(n)) {
                            log::warn!(
                                "{peer}: client vanished in the middle of a rejected write payload: {e}"
                            );
                            return;
                        }
                    }
                    self.log_once(reason, || {
                        format!(
                            "rejecting {} (type {}, flags {:#x}, offset {}, length {}): {reason}; errno {errno}",
                            command_name(h.kind),
                            h.kind,
                            h.flags,
                            h.offset,
                            h.length
                        )
                    });
                    self.send_error(h.handle, errno, reason);
                }
                Verdict::Disconnect(reason) => {
                    log::warn!(
                        "{peer}: {reason} ({} bytes, limit {}); hard disconnect",
                        h.length,
                        ctx.discard_limit()
                    );
                    return;
                }
            }
        }
    }

    /// Blocks until one more request (with `bytes` of buffer) may be in
    /// flight, counts it, and returns the locked state. Sends the replies
    /// ready first (they hold slots), and while hits are in flight on the
    /// ring, waits for them (only this thread can answer them) rather
    /// than for the workers.
    fn wait_for_room(
        &self,
        bytes: u64,
        side: &mut ReaderSide<'_, 'a>,
    ) -> parking_lot::MutexGuard<'_, State> {
        let full = |st: &State| {
            st.count >= self.max_inflight || (st.count > 0 && st.bytes + bytes > self.max_bytes)
        };
        let mut st = self.state.lock();
        while full(&st) {
            if !side.replies.is_empty() {
                drop(st);
                self.flush_replies(&mut side.replies);
            } else {
                match side.ring.as_deref_mut() {
                    Some(r) if r.in_flight() > 0 => {
                        drop(st);
                        r.reap(Wait::ForHit, &mut side.done);
                        self.answer_hits(&mut side.replies, &mut side.done);
                    }
                    _ => {
                        self.room_cv.wait(&mut st);
                        continue;
                    }
                }
            }
            st = self.state.lock();
        }
        st.count += 1;
        st.bytes += bytes;
        st
    }

    /// Like `wait_for_room`, also handing out a spare buffer.
    fn acquire(&self, bytes: u64, side: &mut ReaderSide<'_, 'a>) -> Vec<u8> {
        let mut st = self.wait_for_room(bytes, side);
        side.stash
            .take()
            .or_else(|| st.bufs.pop())
            .unwrap_or_default()
    }

    /// Before the reader reads the socket: answers the hits that have
    /// finished. Unless a complete request header is buffered in `reader`
    /// (then more requests are parsed first, and their reads and replies
    /// go out with these), sends the replies ready and, while hits are in
    /// flight, waits until one finishes or the socket's poll fires; then
    /// reads the socket without waiting (the poll may have fired for bytes
    /// gone, [`HitRing::reap`]), and waits again unless that brought a
    /// header, the stream's end or an error (kept in `reader` for its next
    /// read). Returns with the queued reads submitted, or with a header
    /// buffered.
    fn before_reading<R: Read>(&self, side: &mut ReaderSide<'_, 'a>, reader: &mut InBuf<R>) {
        let buffered = |r: &InBuf<R>| r.buffer().len() >= proto::REQUEST_HEADER_LEN;
        let Some(ring) = side.ring.as_deref_mut() else {
            if !buffered(reader) {
                self.flush_replies(&mut side.replies);
            }
            return;
        };
        let mut wait = Wait::No;
        loop {
            let fired = ring.reap(wait, &mut side.done);
            self.answer_hits(&mut side.replies, &mut side.done);
            let mut ended = false;
            // (With a header buffered, what the poll announced can wait:
            // the buffer is read first.)
            if fired && !buffered(reader) {
                let fd = ring.socket();
                match reader.fill_with(|room| recv_now(fd, room)) {
                    Ok(0) => ended = true,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => ended = true,
                }
            }
            if buffered(reader) {
                return;
            }
            self.flush_replies(&mut side.replies);
            if ended || ring.in_flight() == 0 {
                ring.submit();
                return;
            }
            wait = Wait::ForHitOrSocket;
        }
    }

    /// Before a read of the socket that may block in the middle of a
    /// request (a write's payload): sends the replies ready and submits
    /// the queued reads.
    fn before_blocking(&self, side: &mut ReaderSide<'_, 'a>) {
        self.flush_replies(&mut side.replies);
        if let Some(r) = side.ring.as_deref_mut() {
            r.submit();
        }
    }

    /// Waits for every hit in flight and answers it, and sends every reply
    /// ready (the connection is ending; a failed hit still goes to the
    /// workers).
    fn drain_hits(&self, side: &mut ReaderSide<'_, 'a>) {
        if let Some(ring) = side.ring.as_deref_mut() {
            while ring.in_flight() > 0 {
                ring.reap(Wait::ForHit, &mut side.done);
                self.answer_hits(&mut side.replies, &mut side.done);
            }
        }
        self.flush_replies(&mut side.replies);
    }

    /// Sends the replies in `replies` with one `writev` and releases their
    /// requests' buffers and slots. The buffers go back to the spares as
    /// they are, not cleared: every user of a spare sets its length itself
    /// and overwrites what it sends, and a hit's next read into one then
    /// need not zero it again ([`HitRing::start`]).
    fn flush_replies(&self, replies: &mut ReadReplies) {
        if replies.is_empty() {
            return;
        }
        if replies.can_splice() && !self.broken.load(Ordering::Relaxed) {
            let w = self.writer.lock();
            let sent = match replies.splice() {
                Ok(bytes) => Some(bytes),
                Err((e, 0)) => {
                    log::debug!("{}: cannot splice replies ({e}); copying them", self.peer);
                    None
                }
                Err((e, sent)) => {
                    if !self.broken.swap(true, Ordering::SeqCst) {
                        log::warn!("{}: cannot send reply ({e}); closing connection", self.peer);
                    }
                    let _ = w.shutdown(Shutdown::Both);
                    Some(sent)
                }
            };
            drop(w);
            if let Some(bytes) = sent {
                let (count, data) = replies.drain_spliced(bytes);
                let mut st = self.state.lock();
                st.count -= count;
                st.bytes -= data;
                drop(st);
                self.room_cv.notify_one();
                return;
            }
        }
        let mut parts: [&[u8]; 2 * MAX_REPLIES] = [&[]; 2 * MAX_REPLIES];
        let mut n = 0;
        for p in replies.parts() {
            parts[n] = p;
            n += 1;
        }
        self.send(&parts[..n]);
        let mut st = self.state.lock();
        for (buf, bytes) in replies.drain_buffers() {
            if let Some(buf) = buf {
                if buf.capacity() <= KEEP_BUF && st.bufs.len() < self.max_inflight {
                    st.bufs.push(buf);
                }
            }
            st.count -= 1;
            st.bytes -= bytes;
        }
        drop(st);
        self.room_cv.notify_one();
    }

    /// Answers the finished hits in `done` (emptying it): a hit read
    /// joins `replies`; a failed one goes to the workers, which read it
    /// with [`Export::read`] (the slot it holds stays taken).
    fn answer_hits(&self, replies: &mut ReadReplies, done: &mut Vec<Finished>) {
        for hit in done.drain(..) {
            match hit.result {
                Ok(()) => {
                    let data = hit.start..hit.start + hit.len;
                    replies.push(
                        self.structured,
                        hit.handle,
                        hit.offset,
                        hit.buf,
                        data,
                        hit.fixed,
                    );
                    if replies.is_full() {
                        self.flush_replies(replies);
                    }
                }
                Err(e) => {
                    log::debug!(
                        "{}: direct read at {} failed ({e}); reading it again",
                        self.peer,
                        hit.offset
                    );
                    let mut st = self.state.lock();
                    match hit.fixed {
                        Some(index) => replies.give_back(index, hit.buf),
                        None => {
                            let mut buf = hit.buf;
                            buf.clear();
                            if buf.capacity() <= KEEP_BUF && st.bufs.len() < self.max_inflight {
                                st.bufs.push(buf);
                            }
                        }
                    }
                    let wake = st.push_job(Job {
                        handle: hit.handle,
                        cmd: Command::Read {
                            offset: hit.offset,
                            len: hit.len as u32,
                        },
                        buf: Vec::new(),
                    });
                    drop(st);
                    if wake {
                        self.work_cv.notify_one();
                    }
                }
            }
        }
    }

    /// Ends a request: returns its buffer to the pool and its slot.
    fn finish(&self, mut buf: Vec<u8>, bytes: u64) {
        let keep = buf.capacity() <= KEEP_BUF;
        if keep {
            buf.clear();
        }
        let mut st = self.state.lock();
        if keep && st.bufs.len() < self.max_inflight {
            st.bufs.push(buf);
        }
        st.count -= 1;
        st.bytes -= bytes;
        drop(st);
        self.room_cv.notify_one();
    }

    /// Worker loop: executes queued requests until the queue is closed and
    /// empty.
    fn work(&self) {
        loop {
            let job = {
                let mut st = self.state.lock();
                loop {
                    if let Some(mut j) = st.jobs.pop_front() {
                        if matches!(j.cmd, Command::Read { .. }) {
                            j.buf = st.bufs.pop().unwrap_or_default();
                        }
                        break j;
                    }
                    if st.closed {
                        return;
                    }
                    st.idle.waiting();
                    self.work_cv.wait(&mut st);
                    st.idle.back();
                }
            };
            self.execute(job);
        }
    }

    fn execute(&self, job: Job) {
        let Job {
            handle,
            cmd,
            mut buf,
        } = job;
        let ex = self.export;
        let bytes = match cmd {
            Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
            _ => 0,
        };
        // A panicking export must not take the connection down with it:
        // the request fails with EIO and the slot is released.
        let run = std::panic::AssertUnwindSafe(|| match cmd {
            // Zero bytes: nothing to ask of the export (and no data to
            // send: a spare buffer comes with what it held).
            _ if cmd.is_empty() => {
                buf.clear();
                Ok(())
            }
            Command::Read { offset, len } => {
                buf.resize(len as usize, 0);
                ex.read(offset, &mut buf)
            }
            Command::Write { offset, fua, .. } => ex.write(offset, &buf, fua),
            Command::Flush => ex.flush(),
            Command::Trim { offset, len, fua } => {
                ex.trim(offset, u64::from(len))
                    .and_then(|()| if fua { ex.flush() } else { Ok(()) })
            }
            Command::WriteZeroes {
                offset,
                len,
                fua,
                may_trim,
            } => ex.write_zeroes(offset, u64::from(len), fua, may_trim),
            Command::Disconnect => Ok(()),
        });
        let res = std::panic::catch_unwind(run).unwrap_or_else(|_| {
            log::error!("{}: export panicked while executing {cmd:?}", self.peer);
            Err(io::Error::other("export panicked"))
        });
        self.complete(handle, cmd, res, buf, bytes);
    }

    /// Answers request `handle` with the export's result (`buf` holds the
    /// data of a read) and releases its slot.
    fn complete(&self, handle: u64, cmd: Command, res: io::Result<()>, buf: Vec<u8>, bytes: u64) {
        match res {
            Ok(()) => match cmd {
                Command::Read { offset, .. } => self.send_read(handle, offset, &buf),
                _ => self.send(&[&proto::encode_simple_reply(0, handle)]),
            },
            Err(e) => {
                let errno = nbd_errno(&e);
                self.log_once("export error", || {
                    format!("export error on {cmd:?}: {e}; answering errno {errno}")
                });
                self.send_error(handle, errno, &e.to_string());
            }
        }
        self.finish(buf, bytes);
    }

    fn send(&self, parts: &[&[u8]]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.writer.lock();
        if let Err(e) = write_all_parts(&mut *w, parts) {
            if !self.broken.swap(true, Ordering::SeqCst) {
                log::warn!("{}: cannot send reply ({e}); closing connection", self.peer);
            }
            // Makes the reader see EOF, so the connection winds down.
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    fn send_read(&self, handle: u64, offset: u64, data: &[u8]) {
        if !self.structured {
            self.send(&[&proto::encode_simple_reply(0, handle), data]);
        } else if data.is_empty() {
            self.send(&[&proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_NONE,
                handle,
                0,
            )]);
        } else {
            let hdr = proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_OFFSET_DATA,
                handle,
                8 + data.len() as u32,
            );
            self.send(&[&hdr, &offset.to_be_bytes(), data]);
        }
    }

    /// An error reply: a structured `NBD_REPLY_TYPE_ERROR` chunk carrying
    /// `msg` when structured replies were negotiated (mandatory for reads),
    /// else a simple reply without payload.
    fn send_error(&self, handle: u64, errno: u32, msg: &str) {
        if !self.structured {
            self.send(&[&proto::encode_simple_reply(errno, handle)]);
            return;
        }
        let mut end = msg.len().min(proto::MAX_STRING_LEN);
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &msg.as_bytes()[..end];
        let hdr = proto::encode_structured_header(
            proto::REPLY_FLAG_DONE,
            proto::REPLY_TYPE_ERROR,
            handle,
            6 + msg.len() as u32,
        );
        self.send(&[
            &hdr,
            &errno.to_be_bytes(),
            &(msg.len() as u16).to_be_bytes(),
            msg,
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that accepts at most 3 bytes per call.
    struct Dribble(Vec<u8>);
    impl Write for Dribble {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(3);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn write_all_parts_handles_short_writes() {
        let mut d = Dribble(Vec::new());
        write_all_parts(&mut d, &[b"abcd", b"", b"efghij", b"k"]).unwrap();
        assert_eq!(d.0, b"abcdefghijk");
    }
}
