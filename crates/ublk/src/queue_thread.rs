//! The threads that serve ublk queues, shared by every device of the
//! process: thread `q` serves queue `q` of every device, on one io_uring
//! and one async executor. A pool of twenty volumes with one queue each
//! runs one queue thread, not twenty: in the VM lab each extra queue
//! thread cost more CPU per IO in wake-ups and thread switches than it
//! added (docs/BENCHMARKS.md), and one ring takes every device's
//! requests and completions in one system call.
//!
//! A device's queue joins a thread by [`QueueThread::run`]: a job the
//! thread runs on its own stack, which spawns the queue's tag tasks on the
//! thread's executor ([`ThreadCtx`]). Jobs, and the completions of the
//! export calls run on worker threads, wake the thread through its
//! [`Notifier`] eventfd, of which the ring always has a read in flight.
//! The threads live as long as the process (an idle one waits in the
//! kernel and costs nothing).

use crate::fixed_buffers::BufferTable;
use crate::pool::Notifier;
use crate::ring::QueueRing;
use io_uring::{opcode, types};
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Submission queue entries of a queue thread's ring: what one loop
/// queues before it enters the kernel (more is submitted on the way).
const RING_SQ: u32 = 512;
/// Completion queue entries: room for every tag of several devices.
const RING_CQ: u32 = 8192;

type Job = Box<dyn FnOnce(&Rc<ThreadCtx>) + Send>;

/// What a queue thread's jobs and tasks use.
pub(crate) struct ThreadCtx {
    pub(crate) ring: Rc<QueueRing>,
    pub(crate) exe: Rc<smol::LocalExecutor<'static>>,
    /// The ring's registered buffers, shared out among the queues.
    pub(crate) buffers: RefCell<BufferTable>,
    /// This thread's wake-up, for the worker threads' completions.
    pub(crate) notifier: Arc<Notifier>,
    /// How the thread's time went, since it started.
    pub(crate) time: Cell<ThreadTime>,
}

/// Where a queue thread's time went: running its tasks, or in
/// `io_uring_enter` (submitting and completing IO in the kernel, or
/// asleep waiting for a completion; the thread's CPU time, e.g.
/// `/proc/PID/task/TID/stat`, tells the two apart). Busy all the time,
/// the thread is what requests wait for.
#[derive(Clone, Copy, Default)]
pub(crate) struct ThreadTime {
    /// Loops: each runs the woken tasks, then enters the kernel.
    pub(crate) loops: u64,
    pub(crate) running: Duration,
    pub(crate) in_enter: Duration,
}

impl std::fmt::Display for ThreadTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} loops, {:.1} s running tasks, {:.1} s in io_uring_enter (working or asleep)",
            self.loops,
            self.running.as_secs_f64(),
            self.in_enter.as_secs_f64()
        )
    }
}

/// A running queue thread.
pub(crate) struct QueueThread {
    inbox: Mutex<Vec<Job>>,
    notifier: Arc<Notifier>,
}

impl QueueThread {
    /// Runs `job` on the thread, soon.
    pub(crate) fn run(&self, job: impl FnOnce(&Rc<ThreadCtx>) + Send + 'static) {
        self.inbox.lock().push(Box::new(job));
        self.notifier.notify();
    }
}

static THREADS: Mutex<Vec<Arc<QueueThread>>> = Mutex::new(Vec::new());

/// Queue thread `q`, started with those before it if not running yet.
pub(crate) fn queue_thread(q: u16) -> io::Result<Arc<QueueThread>> {
    let mut threads = THREADS.lock();
    while threads.len() <= usize::from(q) {
        let k = threads.len();
        let thread = Arc::new(QueueThread {
            inbox: Mutex::new(Vec::new()),
            notifier: Arc::new(Notifier::new()?),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mine = thread.clone();
        std::thread::Builder::new()
            .name(format!("ublk-q{k}"))
            .spawn(move || serve(&mine, ready_tx))?;
        ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the queue thread ended while starting")))?;
        threads.push(thread);
    }
    Ok(threads[usize::from(q)].clone())
}

/// The thread's body: the ring, the executor, the eventfd task, and the
/// loop that runs woken tasks and then waits in the kernel.
fn serve(thread: &Arc<QueueThread>, ready: std::sync::mpsc::Sender<io::Result<()>>) {
    crate::pool::mark_io_flusher();
    let ring = match QueueRing::new(RING_SQ, RING_CQ) {
        Ok(r) => Rc::new(r),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let buffers = BufferTable::register(&ring);
    let ctx = Rc::new(ThreadCtx {
        ring: ring.clone(),
        exe: Rc::new(smol::LocalExecutor::new()),
        buffers: RefCell::new(buffers),
        notifier: thread.notifier.clone(),
        time: Cell::new(ThreadTime::default()),
    });
    let (mine, wake_ctx) = (thread.clone(), ctx.clone());
    ctx.exe
        .spawn(async move {
            // Where the eventfd reads land; lives as long as the thread.
            let mut counter = Box::new(0u64);
            loop {
                let jobs = std::mem::take(&mut *mine.inbox.lock());
                for job in jobs {
                    job(&wake_ctx);
                }
                let read = opcode::Read::new(
                    types::Fd(mine.notifier.raw_fd()),
                    (&mut *counter as *mut u64).cast(),
                    8,
                )
                .build();
                // SAFETY: the eventfd and `counter` live as long as this
                // thread, which never ends.
                let r = unsafe { wake_ctx.ring.push(read) }.await;
                if r < 0 && r != -libc::EINTR && r != -libc::EAGAIN {
                    log::error!(
                        "ublk queue thread: eventfd read: {}",
                        io::Error::from_raw_os_error(-r)
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })
        .detach();
    let _ = ready.send(Ok(()));
    let mut t0 = Instant::now();
    loop {
        while ctx.exe.try_tick() {}
        let t1 = Instant::now();
        if let Err(e) = ring.submit_and_wait(1) {
            log::error!("ublk queue thread: io_uring_enter: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        let t2 = Instant::now();
        let mut time = ctx.time.get();
        time.loops += 1;
        time.running += t1 - t0;
        time.in_enter += t2 - t1;
        ctx.time.set(time);
        t0 = t2;
    }
}
