//! Background writeback: keeps the dirty share near a target while clients
//! run, and drains flat out when the devices are idle or when asked.
//!
//! Choice (see docs/ARCHITECTURE.md): bcache's proportional-integral rate
//! controller on the dirty share, with Open CAS ALRU's lesson that an idle
//! device should be cleaned at full speed, and writeback in backing-device
//! order with neighbours merged (`Engine::clean`). The controller is a pure
//! function of its inputs and time so tests drive it with a virtual clock.

use crate::Engine;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiercache_types::Time;

/// Settings of the background cleaner.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CleanerConfig {
    /// Dirty share of the cache to aim for, 0..=1 (bcache: 10%).
    pub target_dirty: f64,
    /// No client IO for this long counts as idle: clean at full speed.
    pub idle_after: Duration,
    /// How often the controller runs.
    pub tick: Duration,
    /// Lowest writeback rate while above target, blocks per second.
    pub min_rate: f64,
    /// Highest writeback rate under load, blocks per second.
    pub max_rate: f64,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            target_dirty: 0.10,
            idle_after: Duration::from_millis(500),
            tick: Duration::from_millis(50),
            min_rate: 8.0,
            max_rate: 100_000.0,
        }
    }
}

/// A proportional-integral controller of the writeback rate (bcache's
/// `__update_writeback_rate`): the further the dirty share is above target,
/// and the longer it has been, the faster blocks are written back.
#[derive(Clone, Debug)]
pub struct RateController {
    cfg: CleanerConfig,
    integral: f64,
    last: Option<Time>,
    budget: f64,
}

/// Proportional term: error / P_INVERSE blocks per second (bcache: 40).
const P_INVERSE: f64 = 40.0;
/// Integral term: integral / I_INVERSE blocks per second (bcache: 10000).
const I_INVERSE: f64 = 10_000.0;

impl RateController {
    pub fn new(cfg: CleanerConfig) -> Self {
        RateController {
            cfg,
            integral: 0.0,
            last: None,
            budget: 0.0,
        }
    }

    /// The rate (blocks per second) for the given state.
    pub fn rate(&self, dirty: u64, capacity: u64) -> f64 {
        let target = self.cfg.target_dirty * capacity as f64;
        let error = dirty as f64 - target;
        if error <= 0.0 && self.integral <= 0.0 {
            return 0.0;
        }
        (error / P_INVERSE + self.integral / I_INVERSE).clamp(self.cfg.min_rate, self.cfg.max_rate)
    }

    /// Advances to `now` and returns how many blocks to write back now.
    /// `idle` (no client IO lately) or `drain` ask for everything.
    pub fn blocks_to_clean(
        &mut self,
        dirty: u64,
        capacity: u64,
        idle: bool,
        drain: bool,
        now: Time,
    ) -> u64 {
        let dt = match self.last {
            Some(t) => now.saturating_sub(t) as f64 / 1e9,
            None => 0.0,
        };
        self.last = Some(now);
        if drain || idle {
            self.budget = 0.0;
            return dirty;
        }
        let target = self.cfg.target_dirty * capacity as f64;
        let error = dirty as f64 - target;
        // Anti-windup: the integral only grows while the rate is not
        // clamped at the top, and never goes negative.
        if self.rate(dirty, capacity) < self.cfg.max_rate {
            self.integral = (self.integral + error * dt).max(0.0);
        }
        if error <= 0.0 {
            self.integral *= 0.5;
        }
        self.budget += self.rate(dirty, capacity) * dt;
        let n = self.budget.floor();
        self.budget -= n;
        (n as u64).min(dirty)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    #[test]
    fn below_target_nothing_is_cleaned() {
        let mut c = RateController::new(CleanerConfig::default());
        for i in 0..100 {
            assert_eq!(
                c.blocks_to_clean(50, 1000, false, false, secs(i as f64 * 0.05)),
                0
            );
        }
    }

    #[test]
    fn rate_grows_with_error_and_with_time_above_target() {
        let cfg = CleanerConfig::default();
        let c = RateController::new(cfg.clone());
        assert!(c.rate(900, 1000) > c.rate(200, 1000));
        let mut c = RateController::new(cfg);
        let mut total_early = 0;
        for i in 0..20 {
            total_early += c.blocks_to_clean(500, 1000, false, false, secs(i as f64 * 0.05));
        }
        let mut total_late = 0;
        for i in 20..40 {
            total_late += c.blocks_to_clean(500, 1000, false, false, secs(i as f64 * 0.05));
        }
        assert!(total_early > 0);
        assert!(
            total_late >= total_early,
            "integral term raises the rate: {total_early} then {total_late}"
        );
    }

    #[test]
    fn idle_or_drain_cleans_everything() {
        let mut c = RateController::new(CleanerConfig::default());
        assert_eq!(c.blocks_to_clean(123, 1000, true, false, secs(0.0)), 123);
        assert_eq!(c.blocks_to_clean(77, 1000, false, true, secs(0.1)), 77);
    }
}
