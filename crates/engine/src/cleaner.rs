//! Background writeback: a thread that keeps the dirty share near a target
//! while clients run, and drains flat out when the devices are idle or when
//! asked. When and how much is decided by the policy crate's pacing
//! ([`RateController`], shared with the simulator); this file only runs it
//! against the engine and the clock.

use crate::Engine;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiercache_types::Time;

pub use tiercache_policy::writeback::{CleanerConfig, RateController};

struct Shared {
    stop: AtomicBool,
    drain: AtomicBool,
    wake: Condvar,
    lock: Mutex<()>,
}

/// A running background cleaner; stops when dropped.
pub struct Cleaner {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Cleaner {
    /// Starts cleaning `engine` in a background thread.
    pub fn spawn(engine: Arc<Engine>, cfg: CleanerConfig) -> Cleaner {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            wake: Condvar::new(),
            lock: Mutex::new(()),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tiercache-cleaner".into())
            .spawn(move || run(engine, cfg, sh))
            .expect("spawn cleaner thread");
        Cleaner {
            shared,
            thread: Some(thread),
        }
    }

    /// Asks for full-speed cleaning until nothing is dirty (or `false` to
    /// return to normal pacing).
    pub fn set_drain(&self, drain: bool) {
        self.shared.drain.store(drain, Ordering::SeqCst);
        self.shared.wake.notify_all();
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Cleaner {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(engine: Arc<Engine>, cfg: CleanerConfig, sh: Arc<Shared>) {
    let mut ctl = RateController::new(cfg.clone());
    let capacity = engine.capacity() as u64;
    let mut last_error_log = None::<Time>;
    let mut last_commit = engine.now();
    while !sh.stop.load(Ordering::SeqCst) {
        let now = engine.now();
        // Dirty claims reach the disk at least every second, flushes or not.
        if now.saturating_sub(last_commit) >= 1_000_000_000 {
            last_commit = now;
            if let Err(e) = engine.commit() {
                log::error!("metadata commit failed: {e}");
            }
        }
        let dirty = engine.dirty_blocks();
        let idle = engine.idle_for(now) >= cfg.idle_after.as_nanos() as u64;
        let drain = sh.drain.load(Ordering::SeqCst);
        let n = if dirty == 0 {
            0
        } else {
            ctl.blocks_to_clean(dirty, capacity, idle, drain, now)
        };
        if n > 0 {
            // Full speed goes in batches so that returning client IO is
            // noticed quickly.
            let batch = if idle || drain { n.min(256) } else { n };
            if let Err(e) = engine.clean(batch as usize) {
                if last_error_log.map_or(true, |t| now.saturating_sub(t) > 10_000_000_000) {
                    log::error!("writeback failed: {e}");
                    last_error_log = Some(now);
                }
                let mut g = sh.lock.lock();
                sh.wake.wait_for(&mut g, Duration::from_secs(1));
                continue;
            }
            if idle || drain {
                continue;
            }
        }
        if idle && n == 0 {
            // Nothing to write back and no client: claim the clean blocks
            // that lost their claim, so that they survive a crash too.
            match engine.reclaim(256) {
                Ok(k) if k > 0 => continue,
                Ok(_) => {}
                Err(e) => log::warn!("reclaim: {e}"),
            }
        }
        let mut g = sh.lock.lock();
        if !sh.stop.load(Ordering::SeqCst) {
            sh.wake.wait_for(&mut g, cfg.tick);
        }
    }
}
