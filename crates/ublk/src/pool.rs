//! Running blocking export calls off the queue threads.
//!
//! A queue thread runs a single-threaded async executor around one
//! io_uring: it must never block, or every other tag it serves waits.
//! The export's calls block (the engine does synchronous IO on the cache
//! and backing devices), so each request is handed to a [`WorkerPool`]
//! thread. The worker stores the result in the tag's [`Completion`], which
//! wakes the tag's task, and then writes the queue's [`Notifier`] eventfd;
//! the queue thread always has a read of that eventfd in flight on its
//! io_uring, so the write wakes it out of `io_uring_enter`, and it then
//! runs the woken task, which commits the result to the kernel.
//!
//! The order (complete, then notify) makes lost wake-ups impossible: if
//! the queue thread is awake when the worker completes, it runs the task
//! on its next executor tick; if it is asleep in the kernel, the eventfd
//! read completes and wakes it. A spurious eventfd wake-up costs one loop.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;
use tiercache_frontend::IdleWorkers;

type Job = Box<dyn FnOnce() + Send>;

/// How long a worker waits for a job before it ends: an idle volume of a
/// pool costs no thread, a busy one keeps its workers.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// The jobs waiting for a worker, and who may still add to them.
struct Queue {
    jobs: VecDeque<Job>,
    /// Live [`Submitter`]s; at 0 with no job left, the workers exit.
    submitters: usize,
    /// Worker threads running (a job that panics ends its thread; a worker
    /// idle for [`IDLE_EXIT`] ends too).
    workers: usize,
    /// The most workers at once.
    most: usize,
    /// Workers started so far, for their names.
    started: usize,
    /// Which queued job is worth a wake-up.
    idle: IdleWorkers,
}

/// One queue under one lock, and one condition variable the idle workers
/// wait on: a job wakes at most one of them ([`IdleWorkers`]; a lock around
/// a channel, as before, woke two: the thread waiting in the channel, then,
/// when it let the lock go, the next thread waiting for the lock).
struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
    name: String,
    /// Every worker thread started, joined at shutdown (finished ones are
    /// dropped as new ones start).
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Threads running jobs in submission order: started when a job finds no
/// idle worker (up to a maximum), ended when idle for a while.
pub struct WorkerPool {
    submitter: Option<Submitter>,
    inner: Arc<Inner>,
}

impl WorkerPool {
    /// A pool of at most `n` (at least 1) worker threads named `name-K`,
    /// none started yet.
    pub fn new(n: usize, name: &str) -> io::Result<WorkerPool> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                submitters: 1,
                workers: 0,
                most: n.max(1),
                started: 0,
                idle: IdleWorkers::default(),
            }),
            ready: Condvar::new(),
            name: name.to_string(),
            threads: Mutex::new(Vec::new()),
        });
        Ok(WorkerPool {
            submitter: Some(Submitter(inner.clone())),
            inner,
        })
    }

    /// A handle to submit jobs with; cheap to clone, usable from any thread.
    pub fn submitter(&self) -> Submitter {
        self.submitter.clone().expect("pool is running")
    }

    /// Worker threads running now.
    pub fn workers(&self) -> usize {
        self.inner.queue.lock().workers
    }

    /// Waits for the queued jobs to finish and stops the threads. Every
    /// [`Submitter`] must have been dropped, or this waits for that too.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.submitter = None;
        loop {
            let threads = std::mem::take(&mut *self.inner.threads.lock());
            if threads.is_empty() {
                break;
            }
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts one more worker; the caller has counted it in `workers`.
fn start_worker(inner: &Arc<Inner>, k: usize) -> io::Result<()> {
    let mine = inner.clone();
    let t = std::thread::Builder::new()
        .name(format!("{}-{k}", inner.name))
        .spawn(move || {
            mark_io_flusher();
            let _exit = WorkerExit(mine.clone());
            let mut q = mine.queue.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    drop(q);
                    job();
                    q = mine.queue.lock();
                } else if q.submitters == 0 {
                    break;
                } else {
                    q.idle.waiting();
                    let waited = mine.ready.wait_for(&mut q, IDLE_EXIT);
                    q.idle.back();
                    if waited.timed_out() && q.jobs.is_empty() && q.submitters > 0 {
                        break;
                    }
                }
            }
        })?;
    let mut threads = inner.threads.lock();
    threads.retain(|t| !t.is_finished());
    threads.push(t);
    Ok(())
}

/// Counts a worker out when its thread ends, by a panic too; and if jobs
/// are left that no worker will take (the others busy, or ending too),
/// starts one in its place.
struct WorkerExit(Arc<Inner>);

impl Drop for WorkerExit {
    fn drop(&mut self) {
        let mut q = self.0.queue.lock();
        q.workers -= 1;
        let queued = q.jobs.len();
        let k = q.started;
        let start = queued > 0 && q.idle.none_to_wake(queued) && q.workers < q.most;
        if start {
            q.workers += 1;
            q.started += 1;
        }
        drop(q);
        if start {
            if let Err(e) = start_worker(&self.0, k) {
                log::warn!("{}: starting a worker: {e}", self.0.name);
                self.0.queue.lock().workers -= 1;
            }
        }
    }
}

/// Sends jobs to a [`WorkerPool`].
pub struct Submitter(Arc<Inner>);

impl Submitter {
    /// Queues `job`, starting a worker for it if none is idle and the pool
    /// has room; false if no worker runs and none could be started (the
    /// job is dropped).
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let mut q = self.0.queue.lock();
        q.jobs.push_back(Box::new(job));
        let queued = q.jobs.len();
        let wake = q.idle.wake_for(queued);
        let start = !wake && q.idle.none_to_wake(queued) && q.workers < q.most;
        let k = q.started;
        if start {
            q.workers += 1;
            q.started += 1;
        }
        drop(q);
        if wake {
            self.0.ready.notify_one();
        }
        if start {
            if let Err(e) = start_worker(&self.0, k) {
                log::warn!("{}: starting a worker: {e}", self.0.name);
                let mut q = self.0.queue.lock();
                q.workers -= 1;
                if q.workers == 0 {
                    // Nobody would ever run it.
                    q.jobs.pop_back();
                    return false;
                }
            }
        }
        true
    }
}
impl Clone for Submitter {
    fn clone(&self) -> Self {
        self.0.queue.lock().submitters += 1;
        Submitter(self.0.clone())
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        let mut q = self.0.queue.lock();
        q.submitters -= 1;
        if q.submitters == 0 {
            drop(q);
            // The idle workers see that no job can come any more.
            self.0.ready.notify_all();
        }
    }
}

/// The worker threads do the device IO on behalf of the ublk device, like
/// the queue threads (which libublk marks the same way): with
/// `PR_SET_IO_FLUSHER`, memory reclaim in these threads does not wait for
/// writeback to the very device they serve. Best effort: it needs
/// CAP_SYS_RESOURCE, and nothing else depends on it.
pub(crate) fn mark_io_flusher() {
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only; no memory is passed.
    unsafe {
        libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0);
    }
}

/// A one-shot result slot, reused for every request of one tag: a worker
/// [`Completion::complete`]s it, the tag's task awaits [`Completion::wait`].
#[derive(Default)]
pub struct Completion {
    state: Mutex<(Option<i32>, Option<Waker>)>,
}

impl Completion {
    /// Stores `result` and wakes the waiting task, if any.
    pub fn complete(&self, result: i32) {
        let waker = {
            let mut s = self.state.lock();
            s.0 = Some(result);
            s.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Resolves to the next stored result (and clears it).
    /// The result, if the job has completed since the last take (for a
    /// caller that polls instead of awaiting [`Completion::wait`]).
    pub fn try_take(&self) -> Option<i32> {
        self.state.lock().0.take()
    }

    pub fn wait(&self) -> WaitCompletion<'_> {
        WaitCompletion(self)
    }
}

/// Future of [`Completion::wait`].
pub struct WaitCompletion<'a>(&'a Completion);

impl Future for WaitCompletion<'_> {
    type Output = i32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        let mut s = self.0.state.lock();
        match s.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// An eventfd that worker threads write after completing a request of
/// this queue, and that the queue thread reads through its io_uring.
pub struct Notifier {
    fd: OwnedFd,
}

impl Notifier {
    pub fn new() -> io::Result<Notifier> {
        // Blocking on purpose: io_uring then waits for the counter to
        // become non-zero instead of failing the read with EAGAIN.
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        Ok(Notifier {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds one to the counter, waking a pending read.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It
        // cannot block: the counter would have to reach 2^64 - 2 first.
        let n = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n < 0 {
            log::error!("ublk: eventfd write failed: {}", io::Error::last_os_error());
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn pool_runs_every_job_and_shuts_down() {
        let pool = WorkerPool::new(3, "test").unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let s = pool.submitter();
        for _ in 0..100 {
            let done = done.clone();
            assert!(s.submit(move || {
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        drop(s);
        pool.shutdown();
        assert_eq!(done.load(Ordering::SeqCst), 100);
    }

    /// Jobs that block (as the export's device IO does) each get a thread
    /// of their own: four jobs that wait for one another all run at once.
    #[test]
    fn blocking_jobs_run_side_by_side() {
        let pool = WorkerPool::new(4, "test").unwrap();
        let s = pool.submitter();
        for _round in 0..50 {
            let barrier = Arc::new(std::sync::Barrier::new(4));
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..4 {
                let (b, tx) = (barrier.clone(), tx.clone());
                assert!(s.submit(move || {
                    b.wait();
                    tx.send(()).unwrap();
                }));
            }
            for _ in 0..4 {
                rx.recv_timeout(std::time::Duration::from_secs(60))
                    .expect("a job waited for a worker that was never woken");
            }
        }
        drop(s);
        pool.shutdown();
    }

    /// A job that panics ends its thread, not the pool: the others keep
    /// running jobs, and later jobs get a new worker.
    #[test]
    fn a_panicking_job_costs_its_thread_only() {
        let pool = WorkerPool::new(2, "test").unwrap();
        let s = pool.submitter();
        // Many rounds: the panicking worker may still be ending when the
        // next round's jobs come (its replacement must start then).
        for _round in 0..50 {
            assert!(s.submit(|| panic!("a failing job")));
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..10 {
                let tx = tx.clone();
                assert!(s.submit(move || tx.send(()).unwrap()));
            }
            for _ in 0..10 {
                rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
            }
        }
        drop(s);
        pool.shutdown();
    }

    /// Workers start only for jobs, as many as the jobs that block at
    /// once need, never more than the pool's maximum.
    #[test]
    fn workers_start_on_demand_up_to_the_maximum() {
        let pool = WorkerPool::new(3, "test").unwrap();
        assert_eq!(pool.workers(), 0, "no job, no worker");
        let s = pool.submitter();
        for _round in 0..3 {
            // Three jobs that wait for each other and for the test: they
            // can only all run if the pool started three workers.
            let held = Arc::new(std::sync::Barrier::new(4));
            for _ in 0..3 {
                let h = held.clone();
                assert!(s.submit(move || {
                    h.wait();
                }));
            }
            held.wait();
            // More jobs than the maximum: they queue, no fourth worker.
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..20 {
                let tx = tx.clone();
                assert!(s.submit(move || tx.send(()).unwrap()));
            }
            for _ in 0..20 {
                rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
            }
            assert!(pool.workers() <= 3, "{} workers", pool.workers());
        }
        drop(s);
        pool.shutdown();
    }

    #[test]
    fn completion_from_another_thread_resolves_the_future_and_notifies() {
        let c = Arc::new(Completion::default());
        let n = Arc::new(Notifier::new().unwrap());
        let pool = WorkerPool::new(1, "test").unwrap();
        for round in 0..3 {
            let (c2, n2) = (c.clone(), n.clone());
            pool.submitter().submit(move || {
                c2.complete(round);
                n2.notify();
            });
            assert_eq!(smol::block_on(c.wait()), round);
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
            let r = unsafe { libc::read(n.raw_fd(), (&mut count as *mut u64).cast(), 8) };
            assert_eq!(r, 8);
            assert_eq!(count, 1);
        }
        pool.shutdown();
    }
}
