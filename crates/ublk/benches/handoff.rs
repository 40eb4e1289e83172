//! What handing a request to the worker pool costs: CPU time (this
//! process's, from `getrusage`) and context switches per job, with a
//! submitter keeping `depth` jobs in flight and waiting for each job's
//! completion as a ublk queue thread does (a [`Completion`] per slot and
//! one [`Notifier`] eventfd read per batch of completions).
//!
//! `cargo bench -p tiercache-ublk --bench handoff` (a few seconds; no
//! kernel ublk support needed). Prints one line per depth.

use std::sync::Arc;
use std::time::Instant;
use tiercache_ublk::pool::{Completion, Notifier, WorkerPool};

fn usage() -> (f64, i64) {
    // SAFETY: getrusage fills the zeroed struct we pass; no other memory.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(u.ru_utime) + t(u.ru_stime), u.ru_nvcsw + u.ru_nivcsw)
}

fn run(workers: usize, depth: usize, jobs: usize) {
    let pool = WorkerPool::new(workers, "bench").expect("pool");
    let submitter = pool.submitter();
    let notifier = Arc::new(Notifier::new().expect("eventfd"));
    let slots: Vec<Arc<Completion>> = (0..depth).map(|_| Arc::default()).collect();
    let (cpu0, cs0) = usage();
    let start = Instant::now();
    let mut submitted = 0;
    let submit = |k: usize| {
        let (c, n) = (slots[k].clone(), notifier.clone());
        assert!(submitter.submit(move || {
            c.complete(k as i32);
            n.notify();
        }));
    };
    for k in 0..depth.min(jobs) {
        submit(k);
        submitted += 1;
    }
    let mut done = 0;
    while done < jobs {
        // Waits for the eventfd as the queue thread's ring would.
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
        let r = unsafe { libc::read(notifier.raw_fd(), (&mut count as *mut u64).cast(), 8) };
        assert_eq!(r, 8);
        for (k, slot) in slots.iter().enumerate() {
            if let Some(v) = slot.try_take() {
                assert_eq!(v, k as i32);
                done += 1;
                if submitted < jobs {
                    submit(k);
                    submitted += 1;
                }
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (cpu1, cs1) = usage();
    drop(submitter);
    pool.shutdown();
    println!(
        "workers {workers:2} depth {depth:2}: {:6.2} us CPU per job, {:4.2} context switches per job, {:7.0} jobs/s",
        (cpu1 - cpu0) * 1e6 / jobs as f64,
        (cs1 - cs0) as f64 / jobs as f64,
        jobs as f64 / wall
    );
}

fn main() {
    for round in 0..3 {
        println!("round {round}");
        for depth in [1, 8, 16] {
            run(32, depth, 100_000);
        }
    }
}
