//! The adaptive policy's mini-caches (see `adaptive.rs`), fed in batches
//! so that their work can run outside the lock that guards the live cache.
//!
//! Each sampled access costs the ten minis (eight candidates, two for
//! the step trial) nearly four times what it
//! costs the live cache, and the live cache is under the director's lock,
//! which every request of every connection or queue takes. So the live
//! side ([`MiniFeed`]) only records each sampled access and removal, in
//! order, and every [`BATCH`] records hands the batch over to the minis.
//!
//! Contract, which keeps the simulator and the engine deciding alike:
//! - the minis see every record in the order the live side made them;
//! - at a hand-over the live side first runs whatever earlier batch is
//!   still waiting (so the batches are never more than one behind), then
//!   takes the candidate the minis have chosen from **all earlier
//!   batches** and queues the new one;
//!
//! so the live cache changes candidate at the same points of the request
//! stream, whoever runs a batch and whenever: the simulator never runs one
//! early (each runs at the next hand-over), the engine runs each right
//! after unlocking the director ([`Director::take_deferred`],
//! [`DeferredMinis::run`]). A choice reaches the live cache one batch (64
//! sampled accesses) after the epoch that made it; an epoch is at least
//! 1024 sampled accesses.
//!
//! [`Director::take_deferred`]: crate::director::Director::take_deferred

use crate::s3fifo::S3Fifo;
use crate::Replacement;
use std::sync::{Arc, Mutex, MutexGuard};
use tiercache_types::{OriginBlock, Time};

/// Records per batch handed to the minis.
pub const BATCH: usize = 64;

/// Each mini's miss count is multiplied by this at every epoch's end: the
/// choice weighs about the last ten epochs (twenty turnovers of a mini).
pub const WINDOW_DECAY: f64 = 0.9;

/// Hits per block that main must earn in an epoch (two turnovers of a
/// mini) for a move towards recency to be a step rather than a jump
/// (`StepTrial`). Main's blocks are what a step gives up: until they earn
/// this much, there is little to lose. Measured on the policy panel and
/// its hold-outs (before [`JUMP_Z`]), any value from 0.2 to 0.4 decides
/// alike: the short
/// tencent-cbs-sample trace's main earns at most 0.15 (it jumps, and gains
/// 0.29 points at 4 KiB and 10%), 1and1-linux-mysql's 0.52 by the epoch
/// its minis first favour recency, libCacheSim's CloudPhysics trace 0.75
/// before its passing phase of recency (from 0.5 on, its 4 KiB 10% cell
/// jumps and loses 1.3 points).
pub const MAIN_WORTH: f64 = 0.3;

/// A jump towards recency (`StepTrial`) is taken only if its trial's copy
/// won by more than this many standard deviations of a paired sign test
/// (two: the usual 5% level). It gives up more of main than a step, and
/// on libCacheSim's CloudPhysics trace at 4 KiB and 12% of its footprint
/// a copy that won by 2 misses of 7,615 (3 accesses against 1) jumped
/// into a passing phase and cost a point; tencent-cbs-sample's jumps win
/// by 4.5 to 6.9.
pub const JUMP_Z: f64 = 2.0;

/// Once main has proven its worth ([`MAIN_WORTH`]), a step towards
/// recency gives up blocks that have earned their keep, a loss its trial
/// does not see within the epoch when main's blocks are dormant then and
/// wanted later. So such a step must also cut the live cache's replica's
/// misses over the epoch by more than this share: 1 in 500. On
/// 1and1-linux-mysql at 64 KiB and 25% of its footprint two steps won 5
/// and 6 misses of about 7,000; the next epoch the 10%/2 mini missed 146
/// fewer than the candidate they reached. Measured on the panel and its
/// hold-outs (session 59 in docs/BENCHMARKS.md): 0.2% and 0.3% decide the
/// panel alike; 0.1% leaves mysql stepping, 0.4% holds back steps the
/// 64 KiB tencent-cbs-sample cells need. A cache whose main never proves
/// its worth (tencent-cbs-sample's) is not held back.
pub const STEP_GAIN_FLOOR: f64 = 0.002;

/// The live cache returns towards frequency at once, whatever the window
/// says, when in the epoch just ended a more frequency-minded mini missed
/// fewer than the live cache's replica by more than this many standard
/// deviations (Poisson: the square root of the two counts' sum). The
/// window lags a phase's end: on libCacheSim's CloudPhysics trace at 64
/// KiB and 25% of its footprint, after its phase of recency the 2%/2
/// mini missed 6,702 of 8,192 sampled accesses in an epoch where the live
/// cache, still at 20%/2, missed 7,620, and the window chose 2%/2 only
/// two epochs later. After such a return, the next step towards recency
/// must win beyond noise ([`JUMP_Z`]), or the live cache steps straight
/// back on a lead of a few misses. Measured on the panel and its
/// hold-outs: 4 and 5 decide alike but for a few hundredths of a point;
/// at 3 the return also fires on arc-P3 at 4 KiB and 25% (0.37 points
/// worse), at 8 it fires nowhere it matters (session 56 in
/// docs/BENCHMARKS.md).
pub const RETURN_Z: f64 = 4.0;

/// What the live cache saw of a sampled block.
#[derive(Clone, Copy, Debug)]
enum Record {
    /// A reference, and whether a miss of it fills the cache.
    Access(OriginBlock, bool, Time),
    Remove(OriginBlock),
    /// The minis hold at most this many blocks from now on.
    Limit(u32),
}

/// One candidate's miniature simulation.
#[derive(Clone)]
struct Mini {
    cache: S3Fifo,
    /// Misses in the exponential window (decayed every epoch), or in the
    /// epoch (the step trial's).
    misses: f64,
    /// Misses in the epoch (the fixed minis'; for [`RETURN_Z`]).
    epoch_misses: f64,
}

impl Mini {
    fn new(cache: S3Fifo) -> Self {
        Mini {
            cache,
            misses: 0.0,
            epoch_misses: 0.0,
        }
    }

    /// Applies a record; true if it was an access that hit.
    fn apply(&mut self, r: Record) -> bool {
        match r {
            Record::Access(o, fills, now) => {
                let hit = self.cache.reference(o, fills, now);
                if !hit {
                    self.misses += 1.0;
                    self.epoch_misses += 1.0;
                }
                hit
            }
            Record::Remove(o) => {
                self.cache.remove(o);
                false
            }
            Record::Limit(n) => {
                self.cache.set_limit(n);
                false
            }
        }
    }
}

/// Whether a step towards recency pays, tried on the live cache's own
/// state. `stay` is a mini that follows the live cache's candidates (so
/// its state is the live cache's, sampled); at each epoch's start `step`
/// becomes a copy of it given the candidate `reach` steps towards
/// recency (one, unless the last trial tied). The
/// fixed minis say where a cache that had always run a candidate would
/// be; they cannot say what getting there costs, and a step towards
/// recency costs at once: main is shrunk by evicting its blocks, some of
/// which the next phase of the workload wants (libCacheSim's CloudPhysics
/// trace). So such a step is taken only if `step` missed fewer than
/// `stay` over the epoch: the same requests from the same state, so the
/// two counts differ by the step's effect, not by sampling noise. A tie
/// shows no gain to set against what the step evicts from main (on that
/// trace the steps to the recency end tied, and taking them cost 2.7
/// points at 64 KiB and 25% of its footprint); the next trial then
/// reaches one candidate further, up to the best fixed mini, and once
/// such a trial pays the live cache steps one candidate that way, so that
/// a plateau (the next candidate no better, a further one better: a reuse
/// distance beyond both small FIFOs) is crossed a step at a time. A move
/// towards frequency is not tried, nor made a step at a time: it only
/// shrinks the small FIFO, whose evicted blocks the ghost remembers, so
/// the live cache goes straight to the best mini (trying such steps too
/// lost slightly more than it saved on the panel; on libCacheSim's
/// CloudPhysics trace, coming back from recency a step per epoch cost
/// up to 2.5 points more than the jump).
///
/// Until main has shown it holds blocks worth keeping (its blocks in
/// `stay` earned [`MAIN_WORTH`] hits each in some epoch), a step has
/// nothing of main's to give up, so the trial reaches straight for the
/// best fixed mini instead of one candidate, and the live cache jumps
/// there if the copy won beyond noise (`jump`, [`JUMP_Z`]).
struct StepTrial {
    stay: Mini,
    step: Option<Mini>,
    /// Candidates `step` is ahead of `stay` (one unless a step tied or
    /// the trial is a jump).
    reach: usize,
    /// `step` reaches for the best fixed mini of the last epoch, and the
    /// live cache goes all the way if it wins beyond noise.
    jump: bool,
    /// `stay`'s hits in main when the epoch started.
    main_hits_at_start: u64,
    /// Accesses this epoch that `step` hit and `stay` missed, and the
    /// reverse.
    only_step_hit: u64,
    only_stay_hit: u64,
}

impl StepTrial {
    /// Starts an epoch at candidate `at` (of `count`).
    fn restart(&mut self, at: usize, count: usize, configure: Configure) {
        configure(&mut self.stay.cache, at);
        self.stay.misses = 0.0;
        self.main_hits_at_start = self.stay.cache.main_hits();
        self.only_step_hit = 0;
        self.only_stay_hit = 0;
        let target = (at + self.reach).min(count - 1);
        self.step = (target > at).then(|| {
            let mut step = self.stay.clone();
            configure(&mut step.cache, target);
            step
        });
    }

    /// Whether the step missed fewer than staying this epoch.
    fn paid(&self) -> bool {
        self.step
            .as_ref()
            .is_some_and(|s| s.misses < self.stay.misses)
    }

    /// Hits per block that main earned in `stay` this epoch: what the live
    /// cache's main blocks are worth to the current workload.
    fn main_worth(&self) -> f64 {
        let hits = self.stay.cache.main_hits() - self.main_hits_at_start;
        hits as f64 / self.stay.cache.main_len().max(1) as f64
    }

    /// Misses the step saved over staying this epoch (negative if it
    /// missed more; 0 with no step).
    fn gain(&self) -> f64 {
        self.step
            .as_ref()
            .map_or(0.0, |s| self.stay.misses - s.misses)
    }

    /// Whether the step missed exactly as many as staying.
    fn tied(&self) -> bool {
        self.step
            .as_ref()
            .is_some_and(|s| s.misses == self.stay.misses)
    }

    fn apply(&mut self, r: Record) {
        let stay_hit = self.stay.apply(r);
        if let Some(s) = &mut self.step {
            match (s.apply(r), stay_hit) {
                (true, false) => self.only_step_hit += 1,
                (false, true) => self.only_stay_hit += 1,
                _ => {}
            }
        }
    }

    /// Whether the step missed fewer than staying by more than
    /// [`JUMP_Z`] standard deviations of a paired sign test: of the
    /// accesses where the two differed, the step hit significantly more.
    /// (Their misses differ by exactly `only_step_hit - only_stay_hit`.)
    fn paid_beyond_noise(&self) -> bool {
        let (w, l) = (self.only_step_hit as f64, self.only_stay_hit as f64);
        self.paid() && w - l > JUMP_Z * (w + l).sqrt()
    }

    fn memory_bytes(&self) -> usize {
        self.stay.cache.memory_bytes() + self.step.as_ref().map_or(0, |s| s.cache.memory_bytes())
    }
}

/// Gives a mini the candidate of that index.
pub type Configure = fn(&mut S3Fifo, usize);

/// The minis and the batch waiting for them.
struct Minis {
    /// One per candidate, in the candidates' order.
    minis: Vec<Mini>,
    trial: StepTrial,
    configure: Configure,
    /// The batch handed over and not yet run (empty when none).
    queue: Vec<Record>,
    epoch_len: u64,
    epoch_left: u64,
    /// Index of the candidate the steps have reached.
    chosen: usize,
    /// Main has held blocks worth keeping: its blocks earned
    /// [`MAIN_WORTH`] hits each in some epoch, or the cache was restored
    /// warm (the minis never saw what its main holds). From then on a
    /// move towards recency is a step.
    main_proven: bool,
    /// For each ordered pair of fixed minis `(i, j)`, at `i * count + j`:
    /// the sampled accesses that `i` hit and `j` missed, in the same
    /// exponential window as their misses.
    only_hit: Vec<f64>,
    /// The live cache returned towards frequency on one epoch's lead
    /// ([`RETURN_Z`]) and has not stepped towards recency since: the
    /// next step must win beyond noise.
    returned: bool,
}

impl Minis {
    fn run_queue(&mut self) {
        let mut queue = std::mem::take(&mut self.queue);
        for &r in &queue {
            self.apply(r);
        }
        queue.clear();
        self.queue = queue; // its allocation, for the next batch
    }

    fn apply(&mut self, r: Record) {
        let mut hit = 0u32;
        for (i, m) in self.minis.iter_mut().enumerate() {
            hit |= u32::from(m.apply(r)) << i;
        }
        if hit != 0 {
            let n = self.minis.len();
            let missed = !hit & ((1u32 << n) - 1);
            for i in (0..n).filter(|&i| hit & (1 << i) != 0) {
                for j in (0..n).filter(|&j| missed & (1 << j) != 0) {
                    self.only_hit[i * n + j] += 1.0;
                }
            }
        }
        self.trial.apply(r);
        if matches!(r, Record::Access(..)) {
            self.epoch_left -= 1;
            if self.epoch_left == 0 {
                self.epoch_left = self.epoch_len;
                self.end_epoch();
            }
        }
    }

    /// Moves towards the mini with the fewest windowed misses (ties keep
    /// the chosen one): towards frequency straight to it, towards recency
    /// one candidate, only if the `StepTrial` paid; a tied trial reaches
    /// one candidate further next time, up to the best. While main has
    /// not proven its worth, the trial reaches for the best mini when that
    /// is more than a step away, and the live cache jumps there if it won
    /// beyond noise. A more frequency-minded mini that beat the live
    /// cache's replica in this epoch alone by [`RETURN_Z`] deviations
    /// takes the live cache at once. Then decays the windows and starts
    /// the next trial.
    fn end_epoch(&mut self) {
        self.main_proven |= self.trial.main_worth() >= MAIN_WORTH;
        let mut best = self.chosen;
        for (i, m) in self.minis.iter().enumerate() {
            if m.misses < self.minis[best].misses {
                best = i;
            }
        }
        let jumped = std::mem::take(&mut self.trial.jump);
        if let Some(back) = self.quick_return() {
            self.chosen = back;
            self.trial.reach = 1;
            self.returned = true;
        } else if jumped && self.trial.paid_beyond_noise() && !self.main_proven {
            self.chosen = (self.chosen + self.trial.reach).min(self.minis.len() - 1);
            self.trial.reach = 1;
        } else if jumped && best > self.chosen {
            // The copy did not pay beyond noise, or main proved its worth
            // meanwhile: no single step was tried.
            self.trial.reach = 1;
        } else if best > self.chosen && self.main_proven && !self.leads_beyond_noise(best) {
            // Main holds blocks worth keeping, and the fixed minis do not
            // say beyond noise that recency wins: no step.
            self.trial.reach = 1;
        } else if best > self.chosen {
            let paid = if self.returned {
                self.trial.paid_beyond_noise()
            } else {
                self.trial.paid()
                    && (!self.main_proven
                        || self.trial.gain() > STEP_GAIN_FLOOR * self.trial.stay.misses)
            };
            if paid {
                self.chosen += 1;
                self.trial.reach = 1;
                self.returned = false;
            } else if self.trial.tied() {
                if self.chosen + self.trial.reach < best {
                    self.trial.reach += 1;
                }
            } else {
                self.trial.reach = 1;
            }
        } else {
            self.chosen = best;
            self.trial.reach = 1;
        }
        if !self.main_proven && best > self.chosen + 1 {
            self.trial.reach = best - self.chosen;
            self.trial.jump = true;
        }
        for x in &mut self.only_hit {
            *x *= WINDOW_DECAY;
        }
        for m in &mut self.minis {
            m.misses *= WINDOW_DECAY;
            m.epoch_misses = 0.0;
        }
        self.trial
            .restart(self.chosen, self.minis.len(), self.configure);
    }

    /// Whether fixed mini `best` missed fewer than the live candidate's
    /// over the window by more than [`JUMP_Z`] standard deviations of a
    /// paired sign test: of the sampled accesses where the two differed,
    /// `best` hit significantly more.
    fn leads_beyond_noise(&self, best: usize) -> bool {
        let n = self.minis.len();
        let w = self.only_hit[best * n + self.chosen];
        let l = self.only_hit[self.chosen * n + best];
        w - l > JUMP_Z * (w + l).sqrt()
    }

    /// The more frequency-minded candidate whose mini missed fewest in
    /// this epoch, if it missed fewer than the live cache's replica by
    /// more than [`RETURN_Z`] deviations.
    fn quick_return(&self) -> Option<usize> {
        let back = (0..self.chosen).min_by(|&a, &b| {
            self.minis[a]
                .epoch_misses
                .total_cmp(&self.minis[b].epoch_misses)
        })?;
        let (live, there) = (self.trial.stay.misses, self.minis[back].epoch_misses);
        (live - there > RETURN_Z * (live + there).sqrt()).then_some(back)
    }
}

fn lock(minis: &Mutex<Minis>) -> MutexGuard<'_, Minis> {
    // A panic inside a mini leaves counts, not broken invariants, behind.
    minis.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live cache's side: records sampled accesses and removals, hands
/// them over in batches, and learns the chosen candidate at each hand-over.
pub struct MiniFeed {
    pending: Vec<Record>,
    minis: Arc<Mutex<Minis>>,
    /// A batch was handed over since the last [`MiniFeed::take_deferred`].
    handed: bool,
    /// [`MiniFeed::main_proven`] was called (a restore calls it per block).
    told_main_proven: bool,
}

impl MiniFeed {
    /// Minis built by `build(i)` for candidate `i` (`count` of them, fewer than 32),
    /// `configure` changing a mini's candidate (for the `StepTrial`),
    /// epochs of `epoch_len` sampled accesses, starting at candidate
    /// `start`.
    pub fn new(
        count: usize,
        build: impl Fn(usize) -> S3Fifo,
        configure: Configure,
        epoch_len: u64,
        start: usize,
    ) -> Self {
        assert!(count < 32, "the minis' hits of an access are a 32-bit mask");
        let mut trial = StepTrial {
            stay: Mini::new(build(start)),
            step: None,
            reach: 1,
            jump: false,
            main_hits_at_start: 0,
            only_step_hit: 0,
            only_stay_hit: 0,
        };
        trial.restart(start, count, configure);
        MiniFeed {
            pending: Vec::with_capacity(BATCH),
            minis: Arc::new(Mutex::new(Minis {
                minis: (0..count).map(|i| Mini::new(build(i))).collect(),
                trial,
                configure,
                queue: Vec::with_capacity(BATCH),
                epoch_len,
                epoch_left: epoch_len,
                chosen: start,
                main_proven: false,
                only_hit: vec![0.0; count * count],
                returned: false,
            })),
            handed: false,
            told_main_proven: false,
        }
    }

    /// Records an access of a sampled block. Some(candidate) at a
    /// hand-over: the candidate chosen from every earlier batch.
    pub fn access(&mut self, o: OriginBlock, fills_on_miss: bool, now: Time) -> Option<usize> {
        self.record(Record::Access(o, fills_on_miss, now))
    }

    /// Limits every mini to `blocks` from this point of the stream on.
    pub fn set_limit(&mut self, blocks: u32) {
        self.pending.push(Record::Limit(blocks));
    }

    /// Takes main to hold blocks worth keeping from now on (a cache
    /// restored warm: the minis never saw what its main holds), so moves
    /// towards recency are steps.
    pub fn main_proven(&mut self) {
        if !std::mem::replace(&mut self.told_main_proven, true) {
            lock(&self.minis).main_proven = true;
        }
    }

    /// Each candidate's mini's misses in the window (for tests).
    #[cfg(test)]
    pub(crate) fn windowed_misses(&self) -> Vec<f64> {
        let mut minis = lock(&self.minis);
        minis.run_queue();
        minis.minis.iter().map(|m| m.misses).collect()
    }

    /// Records the removal of a sampled block; as [`MiniFeed::access`].
    pub fn remove(&mut self, o: OriginBlock) -> Option<usize> {
        self.record(Record::Remove(o))
    }

    fn record(&mut self, r: Record) -> Option<usize> {
        self.pending.push(r);
        if self.pending.len() < BATCH {
            return None;
        }
        let mut minis = lock(&self.minis);
        minis.run_queue();
        let chosen = minis.chosen;
        // The queue is empty now; it becomes the next pending batch.
        std::mem::swap(&mut minis.queue, &mut self.pending);
        self.handed = true;
        Some(chosen)
    }

    /// The batch handed over since the last call, to run outside the
    /// caller's lock; None if there is none.
    pub fn take_deferred(&mut self) -> Option<DeferredMinis> {
        std::mem::take(&mut self.handed).then(|| DeferredMinis(self.minis.clone()))
    }

    /// RAM of the minis and the batches.
    pub fn memory_bytes(&self) -> usize {
        let minis = lock(&self.minis);
        minis
            .minis
            .iter()
            .map(|m| m.cache.memory_bytes())
            .sum::<usize>()
            + minis.trial.memory_bytes()
            + (minis.queue.capacity() + self.pending.capacity()) * std::mem::size_of::<Record>()
    }
}

/// A batch of the minis' work, taken under the director's lock and run
/// after it ([`MiniFeed::take_deferred`]).
#[must_use = "run it once the director's lock is released"]
pub struct DeferredMinis(Arc<Mutex<Minis>>);

impl DeferredMinis {
    /// Runs the waiting batch, if the next hand-over has not run it yet.
    pub fn run(self) {
        lock(&self.0).run_queue();
    }
}

impl std::fmt::Debug for DeferredMinis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeferredMinis")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configure(s: &mut S3Fifo, i: usize) {
        s.set_small_ratio(0.05 * (i + 1) as f64);
    }

    /// Candidates as many as `windowed` (their fixed minis' windowed
    /// misses), the live one `at`, and the trial's epoch counts as given
    /// (each fixed mini missed as many as `stay` in the epoch); main has
    /// proven its worth, so moves towards recency are steps.
    fn minis_at(windowed: &[f64], at: usize, stay: f64, step: f64) -> Minis {
        let mut trial = StepTrial {
            stay: Mini::new(S3Fifo::compact_sparse(64, 0.1)),
            step: None,
            reach: 1,
            jump: false,
            main_hits_at_start: 0,
            only_step_hit: 0,
            only_stay_hit: 0,
        };
        trial.restart(at, windowed.len(), configure);
        trial.stay.misses = stay;
        trial.step.as_mut().expect("a step up").misses = step;
        Minis {
            minis: windowed
                .iter()
                .map(|&m| Mini {
                    cache: S3Fifo::compact_sparse(64, 0.1),
                    misses: m,
                    epoch_misses: stay,
                })
                .collect(),
            trial,
            configure,
            queue: Vec::new(),
            epoch_len: 1,
            epoch_left: 1,
            chosen: at,
            main_proven: true,
            only_hit: clean_pairs(windowed),
            returned: false,
        }
    }

    /// Paired counts as if each fixed mini hit every access that one
    /// missing more missed: `only_hit[i][j]` is `windowed[j] - windowed[i]`
    /// where positive, so every lead of over 4 misses is beyond noise.
    fn clean_pairs(windowed: &[f64]) -> Vec<f64> {
        let n = windowed.len();
        (0..n * n)
            .map(|k| (windowed[k % n] - windowed[k / n]).max(0.0))
            .collect()
    }

    /// Keeps `m`'s windows as they are across the next epoch's decay.
    fn undecay(m: &mut Minis) {
        for mini in &mut m.minis {
            mini.misses /= WINDOW_DECAY;
        }
        for x in &mut m.only_hit {
            *x /= WINDOW_DECAY;
        }
    }

    /// Four candidates at candidate 2.
    fn minis(windowed: [f64; 4], stay: f64, step: f64) -> Minis {
        minis_at(&windowed, 2, stay, step)
    }

    /// [`minis`] after its epoch ends.
    fn after_epoch(windowed: [f64; 4], stay: f64, step: f64) -> Minis {
        let mut m = minis(windowed, stay, step);
        m.end_epoch();
        m
    }

    /// Ends another epoch of `m`: the same windowed misses, every fixed
    /// mini missing as many as the replica (100) in it, and the step
    /// trial's copy hitting `only_step` accesses the replica missed and
    /// `only_stay` the reverse.
    fn paired_epoch(m: &mut Minis, only_step: u64, only_stay: u64) {
        undecay(m);
        for mini in &mut m.minis {
            mini.epoch_misses = 100.0;
        }
        m.trial.stay.misses = 100.0;
        m.trial.step.as_mut().expect("a trial").misses =
            100.0 - only_step as f64 + only_stay as f64;
        (m.trial.only_step_hit, m.trial.only_stay_hit) = (only_step, only_stay);
        m.end_epoch();
    }

    #[test]
    fn a_step_towards_recency_is_taken_only_when_the_trial_pays() {
        // The fixed minis point up; the step missed more than staying.
        let m = after_epoch([50.0, 50.0, 50.0, 40.0], 100.0, 101.0);
        assert_eq!(m.chosen, 2);
        // The step missed as many: nothing shows it pays.
        let m = after_epoch([50.0, 50.0, 50.0, 40.0], 100.0, 100.0);
        assert_eq!(m.chosen, 2);
        // The step missed fewer.
        let m = after_epoch([50.0, 50.0, 50.0, 40.0], 100.0, 99.0);
        assert_eq!(m.chosen, 3);
        // At the last candidate there is no step to try.
        assert!(m.trial.step.is_none() && m.trial.stay.misses == 0.0);
    }

    /// Once main has proven its worth, a step towards recency is tried
    /// only when the best fixed mini's lead over the live candidate's is
    /// beyond noise in the window (a paired sign test over the accesses
    /// where the two differed), whatever the trial says.
    #[test]
    fn once_main_is_proven_a_step_needs_the_fixed_minis_lead_beyond_noise() {
        let windowed = [50.0, 50.0, 50.0, 40.0];
        let with_pairs = |w: f64, l: f64, proven: bool| {
            let mut m = minis_at(&windowed, 2, 100.0, 99.0);
            m.main_proven = proven;
            m.only_hit[3 * 4 + 2] = w;
            m.only_hit[2 * 4 + 3] = l;
            m.end_epoch();
            m.chosen
        };
        // 14 against 4: a lead of 10, 2.4 deviations (the root of 18).
        assert_eq!(with_pairs(14.0, 4.0, true), 3);
        // 25 against 15: the same lead, 1.6 deviations.
        assert_eq!(with_pairs(25.0, 15.0, true), 2);
        // Main unproven: the trial alone decides.
        assert_eq!(with_pairs(25.0, 15.0, false), 3);
    }

    /// Once main has proven its worth, a step towards recency must save
    /// more than [`STEP_GAIN_FLOOR`] of the replica's misses in its epoch.
    #[test]
    fn once_main_is_proven_a_step_must_gain_more_than_the_floor() {
        let windowed = [50.0, 50.0, 50.0, 40.0];
        let step = |stay: f64, step: f64, proven: bool| {
            let mut m = minis_at(&windowed, 2, stay, step);
            m.main_proven = proven;
            m.end_epoch();
            m.chosen
        };
        // The floor is 20 of 10,000.
        assert_eq!(step(10_000.0, 9_990.0, true), 2);
        assert_eq!(step(10_000.0, 9_979.0, true), 3);
        assert_eq!(step(10_000.0, 9_990.0, false), 3);
    }

    /// A plateau: the next candidate misses as many as the live one (a
    /// reuse distance longer than both small FIFOs), a further one fewer.
    /// The trial reaches one candidate further each tied epoch, up to the
    /// best fixed mini, and once such a trial pays the live cache steps
    /// one candidate that way (the next trial starts one up again).
    #[test]
    fn a_tied_step_is_tried_further_towards_the_best() {
        let windowed = [50.0, 50.0, 50.0, 50.0, 40.0, 45.0];
        let mut m = minis_at(&windowed, 1, 100.0, 100.0);
        m.end_epoch();
        assert_eq!((m.chosen, m.trial.reach), (1, 2));
        // Another epoch: the same windowed misses, the trial's as given.
        let next_epoch = |m: &mut Minis, step: f64| {
            undecay(m);
            for mini in &mut m.minis {
                mini.epoch_misses = 100.0;
            }
            m.trial.stay.misses = 100.0;
            m.trial.step.as_mut().expect("a trial").misses = step;
            m.end_epoch();
            (m.chosen, m.trial.reach)
        };
        assert_eq!(next_epoch(&mut m, 100.0), (1, 3), "up to the best, 4");
        assert_eq!(next_epoch(&mut m, 100.0), (1, 3), "no further than 4");
        assert_eq!(next_epoch(&mut m, 60.0), (2, 1), "one step that way");
    }

    #[test]
    fn a_move_towards_frequency_goes_straight_to_the_best_untried() {
        let m = after_epoch([40.0, 50.0, 50.0, 50.0], 100.0, 0.0);
        assert_eq!(m.chosen, 0);
        let m = after_epoch([50.0, 40.0, 50.0, 50.0], 100.0, 0.0);
        assert_eq!(m.chosen, 1);
        // The next trial starts from there, its step one candidate up.
        assert_eq!(m.trial.stay.misses, 0.0);
        assert!(m.trial.step.as_ref().is_some_and(|s| s.misses == 0.0));
        // Ties keep the candidate, whatever the trial says.
        let m = after_epoch([50.0; 4], 100.0, 0.0);
        assert_eq!(m.chosen, 2);
    }

    /// Until main has proven its worth, a trial reaches straight for the
    /// best fixed mini when that is more than a step away, and the live
    /// cache goes all the way if the copy won beyond noise; a step away,
    /// it is an ordinary step.
    #[test]
    fn while_main_is_unproven_a_trial_reaches_for_the_best() {
        let windowed = [50.0, 50.0, 50.0, 50.0, 45.0, 40.0];
        let mut m = minis_at(&windowed, 1, 100.0, 101.0);
        m.main_proven = false;
        m.end_epoch();
        assert_eq!((m.chosen, m.trial.reach, m.trial.jump), (1, 4, true));
        let next_epoch = |m: &mut Minis, only_step: u64, only_stay: u64| {
            paired_epoch(m, only_step, only_stay);
            (m.chosen, m.trial.reach, m.trial.jump)
        };
        // Not paid: no move, and the next trial reaches for the best again.
        assert_eq!(next_epoch(&mut m, 5, 5), (1, 4, true));
        // Paid, but within noise (3 against 1 is one deviation): no move.
        assert_eq!(next_epoch(&mut m, 3, 1), (1, 4, true));
        // Paid beyond noise (10 against 1): the live cache jumps to the
        // best; it is the last, so no trial is left.
        assert_eq!(next_epoch(&mut m, 10, 1), (5, 1, false));
        // One step away, the trial is an ordinary step.
        let mut m = minis_at(&windowed[..3], 1, 100.0, 101.0);
        m.main_proven = false;
        m.minis[2].misses = 40.0;
        m.end_epoch();
        assert_eq!((m.chosen, m.trial.reach, m.trial.jump), (1, 1, false));
    }

    /// A phase of recency ends: the window still favours recency, but in
    /// the epoch alone a more frequency-minded mini missed far fewer than
    /// the live cache's replica. The live cache returns at once to the
    /// one that missed fewest, and its next step towards recency must win
    /// beyond noise.
    #[test]
    fn after_a_phase_of_recency_one_epoch_brings_the_live_cache_back() {
        let windowed = [50.0, 50.0, 50.0, 40.0];
        // 1,000 against 870 is 3 deviations: the window decides (the
        // trial did not pay, so no move).
        let mut m = minis_at(&windowed, 2, 1000.0, 1001.0);
        m.minis[0].epoch_misses = 870.0;
        m.end_epoch();
        assert_eq!((m.chosen, m.returned), (2, false));
        // 1,000 against 800 is 4.7: back to the fewest, 0, not 1.
        let mut m = minis_at(&windowed, 2, 1000.0, 1001.0);
        m.minis[0].epoch_misses = 800.0;
        m.minis[1].epoch_misses = 850.0;
        m.end_epoch();
        assert_eq!((m.chosen, m.returned), (0, true));
        // The window still favours 3.
        let next_epoch = |m: &mut Minis, only_step: u64, only_stay: u64| {
            paired_epoch(m, only_step, only_stay);
            (m.chosen, m.returned)
        };
        // Paid within noise (3 against 1): no step.
        assert_eq!(next_epoch(&mut m, 3, 1), (0, true));
        // Beyond noise (10 against 1): a step, and steps are plain again.
        assert_eq!(next_epoch(&mut m, 10, 1), (1, false));
        assert_eq!(next_epoch(&mut m, 3, 1), (2, false));
    }

    #[test]
    fn main_is_proven_by_the_hits_its_blocks_earn_in_an_epoch() {
        let mut m = minis_at(&[50.0, 50.0, 50.0, 40.0], 0, 100.0, 101.0);
        m.main_proven = false;
        let read = |m: &mut Minis, o: u64| {
            m.trial
                .stay
                .apply(Record::Access(OriginBlock(o), true, Time(0)));
        };
        // The stay mini full, ten blocks in its main (read three times).
        for o in 100..300 {
            read(&mut m, o);
        }
        for _ in 0..3 {
            for o in 0..10 {
                read(&mut m, o);
            }
        }
        m.end_epoch();
        let main = m.trial.stay.cache.main_len() as f64;
        assert!(main >= 10.0);
        // Reads `n` hits in main, of those ten blocks.
        let hit_main = |m: &mut Minis, n: u64| {
            let goal = m.trial.stay.cache.main_hits() + n;
            for o in (0..10).cycle() {
                if m.trial.stay.cache.main_hits() == goal {
                    break;
                }
                read(m, o);
            }
        };
        // A little under MAIN_WORTH hits per main block: unproven.
        hit_main(&mut m, (MAIN_WORTH * main).ceil() as u64 - 1);
        assert!(m.trial.main_worth() < MAIN_WORTH);
        m.end_epoch();
        assert!(!m.main_proven);
        // MAIN_WORTH per block: proven for good.
        hit_main(&mut m, (MAIN_WORTH * main).ceil() as u64);
        assert!(
            m.trial.main_worth() >= MAIN_WORTH,
            "{}",
            m.trial.main_worth()
        );
        m.end_epoch();
        assert!(m.main_proven);
        m.end_epoch();
        assert!(m.main_proven, "an epoch without hits changes nothing");
    }

    #[test]
    fn the_trials_paired_counts_differ_as_its_misses() {
        let mut m = minis_at(&[50.0, 50.0, 50.0, 40.0], 0, 0.0, 0.0);
        // Every block read twice, four new blocks apart: the stay mini's
        // small FIFO (3 of its 64 blocks) has evicted it by then, the
        // step's (6) still holds it.
        for i in 0..5000u64 {
            for o in [Some(i), i.checked_sub(4)].into_iter().flatten() {
                m.trial.apply(Record::Access(OriginBlock(o), true, Time(0)));
            }
        }
        let t = &m.trial;
        let step = t.step.as_ref().expect("a step up");
        assert!(
            t.only_step_hit > t.only_stay_hit + 100,
            "{} {}",
            t.only_step_hit,
            t.only_stay_hit
        );
        assert_eq!(
            t.only_step_hit as f64 - t.only_stay_hit as f64,
            t.stay.misses - step.misses
        );
        assert!(t.paid_beyond_noise());
    }

    /// The windows decay every epoch, by WINDOW_DECAY.
    #[test]
    fn the_windows_decay_at_each_epoch() {
        let m = after_epoch([50.0, 50.0, 50.0, 40.0], 100.0, 101.0);
        assert_eq!(m.minis[3].misses, 40.0 * WINDOW_DECAY);
    }
}
