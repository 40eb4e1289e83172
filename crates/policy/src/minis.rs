//! The adaptive policy's mini-caches (see `adaptive.rs`), fed in batches
//! so that their work can run outside the lock that guards the live cache.
//!
//! Each sampled access costs the eight minis about three times what it
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

/// What the live cache saw of a sampled block.
#[derive(Clone, Copy, Debug)]
enum Record {
    Access(OriginBlock, Time),
    Remove(OriginBlock),
}

/// One candidate's miniature simulation.
struct Mini {
    cache: S3Fifo,
    /// Misses in the exponential window (decayed every epoch).
    misses: f64,
}

/// The minis and the batch waiting for them.
struct Minis {
    /// One per candidate, in the candidates' order.
    minis: Vec<Mini>,
    /// The batch handed over and not yet run (empty when none).
    queue: Vec<Record>,
    epoch_len: u64,
    epoch_left: u64,
    /// Index of the candidate the steps have reached.
    chosen: usize,
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
        match r {
            Record::Access(o, now) => {
                for m in &mut self.minis {
                    if !m.cache.access(o, now) {
                        m.misses += 1.0;
                    }
                }
                self.epoch_left -= 1;
                if self.epoch_left == 0 {
                    self.epoch_left = self.epoch_len;
                    self.end_epoch();
                }
            }
            Record::Remove(o) => {
                for m in &mut self.minis {
                    m.cache.remove(o);
                }
            }
        }
    }

    /// Steps one candidate towards the mini with the fewest windowed
    /// misses (ties keep the chosen one), then decays the windows.
    fn end_epoch(&mut self) {
        let mut best = self.chosen;
        for (i, m) in self.minis.iter().enumerate() {
            if m.misses < self.minis[best].misses {
                best = i;
            }
        }
        if best > self.chosen {
            self.chosen += 1;
        } else if best < self.chosen {
            self.chosen -= 1;
        }
        for m in &mut self.minis {
            m.misses *= WINDOW_DECAY;
        }
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
}

impl MiniFeed {
    /// Minis built by `build(i)` for candidate `i` (`count` of them),
    /// epochs of `epoch_len` sampled accesses, starting at candidate
    /// `start`.
    pub fn new(
        count: usize,
        build: impl Fn(usize) -> S3Fifo,
        epoch_len: u64,
        start: usize,
    ) -> Self {
        MiniFeed {
            pending: Vec::with_capacity(BATCH),
            minis: Arc::new(Mutex::new(Minis {
                minis: (0..count)
                    .map(|i| Mini {
                        cache: build(i),
                        misses: 0.0,
                    })
                    .collect(),
                queue: Vec::with_capacity(BATCH),
                epoch_len,
                epoch_left: epoch_len,
                chosen: start,
            })),
            handed: false,
        }
    }

    /// Records an access of a sampled block. Some(candidate) at a
    /// hand-over: the candidate chosen from every earlier batch.
    pub fn access(&mut self, o: OriginBlock, now: Time) -> Option<usize> {
        self.record(Record::Access(o, now))
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
