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
use tiercache_frontend::IdleWorkers;

type Job = Box<dyn FnOnce() + Send>;

/// The jobs waiting for a worker, and who may still add to them.
struct Queue {
    jobs: VecDeque<Job>,
    /// Live [`Submitter`]s; at 0 with no job left, the workers exit.
    submitters: usize,
    /// Worker threads still running (a job that panics ends its thread).
    workers: usize,
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
}

/// A fixed set of threads running jobs in submission order.
pub struct WorkerPool {
    submitter: Option<Submitter>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `n` (at least 1) worker threads named `name-K`.
    pub fn new(n: usize, name: &str) -> io::Result<WorkerPool> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                submitters: 1,
                workers: 0,
                idle: IdleWorkers::default(),
            }),
            ready: Condvar::new(),
        });
        let mut threads = Vec::new();
        for k in 0..n.max(1) {
            let mine = inner.clone();
            inner.queue.lock().workers += 1;
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{k}"))
                .spawn(move || {
                    mark_io_flusher();
                    let _exit = WorkerExit(&mine);
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
                            mine.ready.wait(&mut q);
                            q.idle.back();
                        }
                    }
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    inner.queue.lock().workers -= 1;
                    // The threads started so far exit with the pool.
                    drop(WorkerPool {
                        submitter: Some(Submitter(inner)),
                        threads,
                    });
                    return Err(e);
                }
            }
        }
        Ok(WorkerPool {
            submitter: Some(Submitter(inner)),
            threads,
        })
    }

    /// A handle to submit jobs with; cheap to clone, usable from any thread.
    pub fn submitter(&self) -> Submitter {
        self.submitter.clone().expect("pool is running")
    }

    /// Waits for the queued jobs to finish and stops the threads. Every
    /// [`Submitter`] must have been dropped, or this waits for that too.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.submitter = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Counts a worker out when its thread ends, by a panic too.
struct WorkerExit<'a>(&'a Inner);

impl Drop for WorkerExit<'_> {
    fn drop(&mut self) {
        self.0.queue.lock().workers -= 1;
    }
}

/// Sends jobs to a [`WorkerPool`].
pub struct Submitter(Arc<Inner>);

impl Submitter {
    /// Queues `job`; false if the pool has no worker left (the job is
    /// dropped).
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let mut q = self.0.queue.lock();
        if q.workers == 0 {
            return false;
        }
        q.jobs.push_back(Box::new(job));
        let queued = q.jobs.len();
        let wake = q.idle.wake_for(queued);
        drop(q);
        if wake {
            self.0.ready.notify_one();
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
    /// running jobs, and with no worker left a submit says so.
    #[test]
    fn a_panicking_job_costs_its_thread_only() {
        let pool = WorkerPool::new(2, "test").unwrap();
        let s = pool.submitter();
        assert!(s.submit(|| panic!("a failing job")));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..10 {
            let tx = tx.clone();
            assert!(s.submit(move || tx.send(()).unwrap()));
        }
        for _ in 0..10 {
            rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
        }
        assert!(s.submit(|| panic!("the last worker")));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while s.submit(|| {}) {
            assert!(
                std::time::Instant::now() < deadline,
                "the workers never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
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
