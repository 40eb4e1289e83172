//! Jobs run a few at a time on short-lived threads, their results kept in
//! the jobs' order: for work that mostly waits (the kernel starting a
//! ublk device), where running it one job after another only adds the
//! waits up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Runs `job` on each of `items`, at most `threads` at once (the calling
/// thread is one of them), and returns once every job begun has ended.
/// Result `i` is item `i`'s: `Ok` with its job's result, or `Err` with the
/// item itself when its job was never begun, which happens only after
/// some job's result made `stop` true (no job is begun after that; the
/// jobs running then still end). Fewer threads than asked are used if the
/// system will not make more; a job that panics panics the caller, once
/// the other threads have ended.
#[cfg_attr(not(feature = "ublk"), allow(dead_code))]
pub fn in_order<T, R>(
    items: Vec<T>,
    threads: usize,
    stop: impl Fn(&R) -> bool + Sync,
    job: impl Fn(T) -> R + Sync,
) -> Vec<Result<R, T>>
where
    T: Send,
    R: Send,
{
    let n = items.len();
    let todo = Mutex::new(items.into_iter().enumerate());
    let done: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    let stopped = AtomicBool::new(false);
    let worker = || loop {
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        let Some((i, item)) = lock(&todo).next() else {
            return;
        };
        let result = job(item);
        if stop(&result) {
            stopped.store(true, Ordering::SeqCst);
        }
        lock(&done)[i] = Some(result);
    };
    std::thread::scope(|scope| {
        for _ in 1..threads.min(n) {
            let spawned = std::thread::Builder::new()
                .name("tiercache-start".into())
                .spawn_scoped(scope, worker);
            if spawned.is_err() {
                break;
            }
        }
        worker();
    });
    let mut left: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for (i, item) in todo.into_inner().unwrap_or_else(|e| e.into_inner()) {
        left[i] = Some(item);
    }
    let done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.into_iter()
        .zip(left)
        .map(|pair| match pair {
            (Some(result), _) => Ok(result),
            (None, Some(item)) => Err(item),
            (None, None) => unreachable!("every item is either run or left"),
        })
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn results_come_back_in_the_items_order() {
        let items: Vec<u64> = (0..20).collect();
        let out = in_order(
            items,
            4,
            |_: &u64| false,
            |i| {
                // Later items end first.
                std::thread::sleep(Duration::from_millis(20 - i));
                i * 10
            },
        );
        let out: Vec<u64> = out.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(out, (0..20).map(|i| i * 10).collect::<Vec<_>>());
    }

    #[test]
    fn no_more_than_the_threads_asked_for_run_at_once() {
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = in_order(
            (0..16).collect(),
            3,
            |_: &()| false,
            |_: u32| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(10));
                running.fetch_sub(1, Ordering::SeqCst);
            },
        );
        assert_eq!(out.len(), 16);
        assert!(out.iter().all(Result::is_ok));
        let most = most.load(Ordering::SeqCst);
        assert!((1..=3).contains(&most), "{most} at once");
    }

    #[test]
    fn after_a_stop_no_job_is_begun_and_the_rest_come_back() {
        let out = in_order(
            (0..10).collect(),
            1,
            |r: &Result<u32, u32>| r.is_err(),
            |i: u32| if i == 3 { Err(i) } else { Ok(i) },
        );
        assert_eq!(out.len(), 10);
        for (i, r) in out.into_iter().enumerate() {
            let i = i as u32;
            match r {
                Ok(Ok(v)) => assert!(i < 3 && v == i),
                Ok(Err(v)) => assert!(i == 3 && v == i),
                Err(item) => assert!(i > 3 && item == i),
            }
        }
    }

    #[test]
    fn no_items_no_threads() {
        let out = in_order(Vec::<u8>::new(), 8, |_: &u8| false, |i| i);
        assert!(out.is_empty());
    }
}
