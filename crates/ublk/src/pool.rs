//! Running blocking export calls off the queue threads.
//!
//! A libublk queue thread runs a single-threaded async executor around one
//! io_uring: it must never block, or every other tag of that queue waits.
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

use parking_lot::Mutex;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads running jobs in submission order.
pub struct WorkerPool {
    jobs: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `n` (at least 1) worker threads named `name-K`.
    pub fn new(n: usize, name: &str) -> io::Result<WorkerPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for k in 0..n.max(1) {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{k}"))
                    .spawn(move || {
                        mark_io_flusher();
                        loop {
                            // One thread waits in recv() while holding the
                            // lock; the others wait for the lock. The lock
                            // is released before the job runs.
                            let job = rx.lock().recv();
                            match job {
                                Ok(job) => job(),
                                Err(mpsc::RecvError) => break,
                            }
                        }
                    })?,
            );
        }
        Ok(WorkerPool {
            jobs: Some(tx),
            threads,
        })
    }

    /// A handle to submit jobs with; cheap to clone, usable from any thread.
    pub fn submitter(&self) -> Submitter {
        Submitter(self.jobs.clone().expect("pool is running"))
    }

    /// Waits for the queued jobs to finish and stops the threads. Every
    /// [`Submitter`] must have been dropped, or this waits for that too.
    pub fn shutdown(mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Sends jobs to a [`WorkerPool`].
#[derive(Clone)]
pub struct Submitter(mpsc::Sender<Job>);

impl Submitter {
    /// Queues `job`; false if the pool has stopped (the job is dropped).
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.0.send(Box::new(job)).is_ok()
    }
}

/// The worker threads do the device IO on behalf of the ublk device, like
/// the queue threads (which libublk marks the same way): with
/// `PR_SET_IO_FLUSHER`, memory reclaim in these threads does not wait for
/// writeback to the very device they serve. Best effort: it needs
/// CAP_SYS_RESOURCE, and nothing else depends on it.
fn mark_io_flusher() {
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
