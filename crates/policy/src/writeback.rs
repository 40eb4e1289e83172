//! When and how much to write back: the writeback pacing shared by the
//! live engine's cleaner thread and the simulator (dm-cache's
//! `get_background_work`: the policy side decides, the caller does the IO).
//!
//! Choice (see docs/ARCHITECTURE.md): bcache's proportional-integral rate
//! controller on the dirty share, with Open CAS ALRU's lesson that an idle
//! device should be cleaned at full speed; what to write back is the dirty
//! blocks in pool-key order (volume by volume, each in backing-device
//! order, so neighbours merge into one write: [`choose_writeback`]). Pure
//! functions of their inputs, time included, so the simulator drives them
//! with its virtual clock and tests with a chosen one.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tiercache_types::{CacheBlock, OriginBlock, Time};

/// Settings of the background cleaner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Under load, blocks are written back in batches of at least this
    /// many, or of what is due once `max_batch_wait` has passed since the
    /// last batch: the engine flushes the backing device and commits its
    /// metadata after each run of neighbouring blocks in a batch, so
    /// twenty one-block batches a second would flush both devices twenty
    /// times a second.
    pub min_batch: u64,
    /// The longest a due block waits for its batch to fill (dm-cache
    /// commits its metadata every second).
    pub max_batch_wait: Duration,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            target_dirty: 0.10,
            idle_after: Duration::from_millis(500),
            tick: Duration::from_millis(50),
            min_rate: 8.0,
            max_rate: 100_000.0,
            min_batch: 64,
            max_batch_wait: Duration::from_secs(1),
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
    /// When the last batch under load was handed out.
    last_batch: Option<Time>,
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
            last_batch: None,
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
        let due = self.budget.floor();
        let n = (due as u64).min(dirty);
        let waited = self.last_batch.map_or(u64::MAX, |t| now.saturating_sub(t));
        if n == 0
            || (n < self.cfg.min_batch
                && n < dirty
                && waited < self.cfg.max_batch_wait.as_nanos() as u64)
        {
            // Due blocks wait for their batch (the budget keeps them).
            return 0;
        }
        self.budget -= due;
        self.last_batch = Some(now);
        n
    }
}

/// The longest run of neighbouring dirty blocks written back as one write
/// (the engine's cleaner; the simulator prices its writebacks the same way).
pub const MAX_WRITEBACK_RUN_BYTES: u64 = 4 << 20;

/// The lengths of the runs `blocks` (dirty blocks and their slots, in
/// writeback order) are written back in: neighbours of one volume merge,
/// up to `max_run` blocks a run.
pub fn writeback_runs(
    blocks: &[(OriginBlock, CacheBlock)],
    max_run: usize,
) -> impl Iterator<Item = usize> + '_ {
    let max_run = max_run.max(1);
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= blocks.len() {
            return None;
        }
        let mut j = i + 1;
        while j < blocks.len()
            && j - i < max_run
            && blocks[j].0 .0 == blocks[j - 1].0 .0 + 1
            && blocks[j].0.volume() == blocks[i].0.volume()
        {
            j += 1;
        }
        let len = j - i;
        i = j;
        Some(len)
    })
}

/// Which of `dirty` (in any order) to write back now: the first `n` in
/// pool-key order. Sorting is the caller's cost outside any lock.
pub fn choose_writeback(
    mut dirty: Vec<(OriginBlock, CacheBlock)>,
    n: usize,
) -> Vec<(OriginBlock, CacheBlock)> {
    dirty.sort_unstable();
    dirty.truncate(n);
    dirty
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
    fn under_load_blocks_go_in_batches_of_min_batch_or_after_max_batch_wait() {
        let cfg = CleanerConfig::default();
        // 10 blocks a second due (dirty 500 of 1000, target 100: error
        // 400 / 40), ticks of 50 ms: a block is due every other tick.
        let mut c = RateController::new(cfg.clone());
        let mut batches = Vec::new();
        for i in 0..61 {
            let n = c.blocks_to_clean(500, 1000, false, false, secs(i as f64 * 0.05));
            if n > 0 {
                batches.push((i, n));
            }
        }
        // The first due block goes at once; then what is due waits a
        // second for its batch: 3 batches in 3 s, not 30.
        assert_eq!(batches.len(), 3, "{batches:?}");
        assert_eq!(batches[0].1, 1);
        assert!(batches[1].1 >= 9 && batches[2].1 >= 9, "{batches:?}");
        assert!(batches[1].0 - batches[0].0 >= 20, "{batches:?}");
        // At a high rate a batch goes as soon as min_batch is due.
        let mut c = RateController::new(cfg.clone());
        let mut first_full = None;
        for i in 0..40 {
            let n = c.blocks_to_clean(90_000, 100_000, false, false, secs(i as f64 * 0.05));
            if n >= cfg.min_batch {
                first_full = Some(i);
                break;
            }
        }
        assert!(first_full.is_some_and(|i| i < 20), "{first_full:?}");
        // A batch never waits for more blocks than are dirty: one dirty
        // block over a target of 0 goes as soon as it is due (8 a second,
        // the floor rate), not once a second.
        let mut c = RateController::new(CleanerConfig {
            target_dirty: 0.0,
            ..cfg
        });
        let batches = (0..20)
            .filter(|&i| c.blocks_to_clean(1, 1000, false, false, secs(f64::from(i) * 0.05)) > 0)
            .count();
        assert!(
            batches >= 6,
            "{batches} batches of the one dirty block in 1 s"
        );
    }

    #[test]
    fn idle_or_drain_cleans_everything() {
        let mut c = RateController::new(CleanerConfig::default());
        assert_eq!(c.blocks_to_clean(123, 1000, true, false, secs(0.0)), 123);
        assert_eq!(c.blocks_to_clean(77, 1000, false, true, secs(0.1)), 77);
    }
}
