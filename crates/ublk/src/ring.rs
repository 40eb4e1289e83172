//! A queue thread's io_uring, as futures: every operation the thread runs
//! (the ublk commands of every device queue it serves, the reads and
//! writes of hits and misses, the eventfd read that wakes it) is one SQE
//! whose completion resolves one [`Op`] future.
//!
//! Contract: single-threaded (it lives in one queue thread, behind an
//! `Rc`). An [`Op`] is pushed to the submission queue when it is made and
//! reaches the kernel at the thread's next [`QueueRing::submit_and_wait`],
//! so that the requests woken in one loop go to the kernel in one system
//! call. A future dropped before its completion leaves its slot to the
//! completion, which frees it: the kernel may still be using the memory
//! the SQE names, which the caller must keep alive until then (the tag
//! tasks never drop an IO in flight, see `server`).

use io_uring::{cqueue, squeue, IoUring};
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// `io_uring_enter`'s flag to reap completions (linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// What one submitted SQE is waiting for.
enum Slot {
    Free(Option<usize>),
    /// Submitted; the result once it completed, and who to wake.
    Waiting {
        result: Option<i32>,
        waker: Option<Waker>,
    },
    /// Its future was dropped: the completion frees the slot.
    Abandoned,
}

/// The ring and its in-flight operations (`user_data` = index in `slots`).
pub(crate) struct QueueRing {
    ring: RefCell<IoUring<squeue::Entry, cqueue::Entry>>,
    slots: RefCell<Vec<Slot>>,
    /// Head of the free list threaded through `Slot::Free`.
    free: RefCell<Option<usize>>,
}

impl QueueRing {
    /// A ring with `sq` submission entries and `cq` completion entries
    /// (the completions of every tag of every queue the thread serves can
    /// be pending at once; the kernel keeps overflowing ones, but a larger
    /// queue avoids that detour). One thread submits
    /// (`SINGLE_ISSUER`), and the kernel runs the ring's completion work
    /// only when that thread waits in [`QueueRing::submit_and_wait`]
    /// (`DEFER_TASKRUN`), all of it at once, instead of interrupting the
    /// thread's tasks (in the VM lab's pool bench, 3933 and 3750 hot IOPS
    /// against 3585 and 3597 without it, docs/BENCHMARKS.md).
    pub(crate) fn new(sq: u32, cq: u32) -> io::Result<QueueRing> {
        let ring = IoUring::builder()
            .setup_cqsize(cq)
            .setup_coop_taskrun()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(sq)?;
        Ok(QueueRing {
            ring: RefCell::new(ring),
            slots: RefCell::new(Vec::new()),
            free: RefCell::new(None),
        })
    }

    /// Runs `f` with the ring's submitter (buffer registration).
    pub(crate) fn with_submitter<T>(&self, f: impl FnOnce(io_uring::Submitter<'_>) -> T) -> T {
        f(self.ring.borrow().submitter())
    }

    /// Queues `sqe` and returns the future of its result (the CQE's `res`:
    /// bytes moved or `-errno`).
    ///
    /// # Safety
    /// Every buffer and file the SQE names must stay valid until the
    /// operation completes, even if the returned future is dropped first.
    pub(crate) unsafe fn push(self: &Rc<Self>, sqe: squeue::Entry) -> Op {
        let key = self.take_slot();
        let sqe = sqe.user_data(key as u64);
        let mut ring = self.ring.borrow_mut();
        loop {
            // SAFETY: the caller keeps the SQE's memory valid until its
            // completion (this function's contract).
            if unsafe { ring.submission().push(&sqe) }.is_ok() {
                break;
            }
            // The submission queue is full: hand it to the kernel now.
            if let Err(e) = ring.submit() {
                if e.raw_os_error() != Some(libc::EINTR) && e.raw_os_error() != Some(libc::EBUSY) {
                    drop(ring);
                    self.complete(key, -e.raw_os_error().unwrap_or(libc::EIO));
                    return Op {
                        ring: self.clone(),
                        key: Some(key),
                    };
                }
            }
        }
        Op {
            ring: self.clone(),
            key: Some(key),
        }
    }

    /// Submits what was queued and waits for at least `want` completions
    /// (0: none; none either when some are waiting to be reaped already),
    /// then wakes the futures of every completion that came. One
    /// `io_uring_enter`: it submits, runs the completion work due (all of
    /// it, `DEFER_TASKRUN`) and sleeps until the completions are in. (It
    /// was two, one to work and one to sleep, to tell the two apart in the
    /// thread's time: a system call more per loop.)
    pub(crate) fn submit_and_wait(&self, want: usize) -> io::Result<()> {
        let r = {
            let mut ring = self.ring.borrow_mut();
            let want = if ring.completion().is_empty() {
                want
            } else {
                0
            };
            let to_submit = ring.submission().len() as u32;
            // SAFETY: no argument is passed; the submission queue's tail
            // was published when its last push ended.
            unsafe {
                ring.submitter().enter::<libc::sigset_t>(
                    to_submit,
                    want as u32,
                    IORING_ENTER_GETEVENTS,
                    None,
                )
            }
        };
        match r {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        self.reap();
        Ok(())
    }

    /// Resolves the futures of the completions in the completion queue.
    fn reap(&self) {
        loop {
            // Taken in batches so that no borrow of the ring is held while
            // a waker runs (it may push).
            let mut done = [(0u64, 0i32); 64];
            let mut n = 0;
            {
                let mut ring = self.ring.borrow_mut();
                for c in ring.completion().take(done.len()) {
                    done[n] = (c.user_data(), c.result());
                    n += 1;
                }
            }
            if n == 0 {
                return;
            }
            for &(key, result) in &done[..n] {
                self.complete(key as usize, result);
            }
        }
    }

    fn complete(&self, key: usize, result: i32) {
        let waker = {
            let mut slots = self.slots.borrow_mut();
            match slots.get_mut(key) {
                Some(Slot::Waiting { result: r, waker }) => {
                    *r = Some(result);
                    waker.take()
                }
                Some(Slot::Abandoned) => {
                    drop(slots);
                    self.release(key);
                    None
                }
                _ => {
                    log::error!("ublk: a completion for no operation ({key})");
                    None
                }
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn take_slot(&self) -> usize {
        let mut slots = self.slots.borrow_mut();
        let waiting = Slot::Waiting {
            result: None,
            waker: None,
        };
        let mut free = self.free.borrow_mut();
        match *free {
            Some(key) => {
                let Slot::Free(next) = slots[key] else {
                    unreachable!("the free list holds free slots only")
                };
                *free = next;
                slots[key] = waiting;
                key
            }
            None => {
                slots.push(waiting);
                slots.len() - 1
            }
        }
    }

    fn release(&self, key: usize) {
        let mut free = self.free.borrow_mut();
        self.slots.borrow_mut()[key] = Slot::Free(*free);
        *free = Some(key);
    }
}

/// The result of one SQE; see [`QueueRing::push`].
pub(crate) struct Op {
    ring: Rc<QueueRing>,
    /// None once the result was taken.
    key: Option<usize>,
}

impl Future for Op {
    type Output = i32;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        let Some(key) = self.key else {
            panic!("an io_uring operation polled after its result");
        };
        let ready = {
            let mut slots = self.ring.slots.borrow_mut();
            match &mut slots[key] {
                Slot::Waiting {
                    result: Some(r), ..
                } => Some(*r),
                Slot::Waiting { waker, .. } => {
                    *waker = Some(cx.waker().clone());
                    None
                }
                _ => unreachable!("a live operation's slot"),
            }
        };
        match ready {
            Some(r) => {
                self.ring.release(key);
                self.key = None;
                Poll::Ready(r)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let Some(key) = self.key else { return };
        let completed = {
            let mut slots = self.ring.slots.borrow_mut();
            match &slots[key] {
                Slot::Waiting {
                    result: Some(_), ..
                } => true,
                _ => {
                    slots[key] = Slot::Abandoned;
                    false
                }
            }
        };
        if completed {
            self.ring.release(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io_uring::{opcode, types};
    use std::os::fd::AsRawFd;

    fn run<T>(ring: &Rc<QueueRing>, fut: impl Future<Output = T>) -> T {
        let mut fut = std::pin::pin!(fut);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            ring.submit_and_wait(1).unwrap();
        }
    }

    /// Reads through the ring resolve with the bytes read, in any number
    /// and order, and the slots are reused.
    #[test]
    fn reads_complete_with_their_results() {
        let ring = Rc::new(QueueRing::new(4, 16).unwrap());
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; 4096]).unwrap();
        let mut bufs = vec![vec![0u8; 512]; 10];
        for round in 0..3 {
            // More operations than the submission queue holds.
            let ops: Vec<Op> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let sqe = opcode::Read::new(
                        types::Fd(file.as_raw_fd()),
                        b.as_mut_ptr(),
                        (100 + i) as u32,
                    )
                    .offset(i as u64 * 100)
                    .build();
                    // SAFETY: `bufs` and `file` outlive the operations
                    // (each is awaited below).
                    unsafe { ring.push(sqe) }
                })
                .collect();
            for (i, op) in ops.into_iter().enumerate().rev() {
                assert_eq!(run(&ring, op), (100 + i) as i32, "round {round}");
            }
            assert!(ring.slots.borrow().len() <= 10);
        }
        assert!(bufs.iter().all(|b| b[0] == 7));
    }

    /// A dropped operation's completion frees its slot; errors come back
    /// as `-errno`.
    #[test]
    fn dropped_operations_and_errors() {
        let ring = Rc::new(QueueRing::new(4, 16).unwrap());
        let file = tempfile::tempfile().unwrap();
        let mut buf = vec![0u8; 64];
        let bad = opcode::Read::new(types::Fd(-1), buf.as_mut_ptr(), 64).build();
        // SAFETY: no memory is touched for a bad descriptor.
        assert_eq!(run(&ring, unsafe { ring.push(bad) }), -libc::EBADF);
        let read = opcode::Read::new(types::Fd(file.as_raw_fd()), buf.as_mut_ptr(), 64).build();
        // SAFETY: `buf` outlives the completion, waited for below.
        drop(unsafe { ring.push(read) });
        ring.submit_and_wait(1).unwrap();
        assert!(matches!(ring.slots.borrow()[0], Slot::Free(_)));
    }
}
