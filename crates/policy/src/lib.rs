//! Cache policies: they decide, they never do IO.
//!
//! Three independent parts, composed by the [`Director`]:
//! - [`Replacement`]: which resident block leaves when room is needed, and
//!   the mapping of origin blocks to cache slots ([`SlotTable`]);
//! - [`Admission`]: whether a missed block may enter at all (and the
//!   replacement policy may still decline the fill,
//!   [`Replacement::declines_fill`]: the default's [`FillGate`] does for
//!   classes of requests whose fills are rarely hit);
//! - [`SequentialDetector`]: whether an IO belongs to a sequential stream
//!   that should bypass the cache.
//!
//! Replacement policies: [`Adaptive`] (the default: S3-FIFO whose small
//! FIFO's share and move-to-main threshold miniature simulations choose), [`Smq`], [`Lru`], [`S3Fifo`], [`Arc`],
//! [`Fifo`], [`Sieve`] (the last four match libCacheSim's miss counts
//! exactly on read-only traces: `tools/compare_libcachesim.py`). Admission:
//! [`AlwaysAdmit`] (the default), [`NHitAdmit`] (Open CAS), [`HotspotAdmit`]
//! (after smq's hotspot queue). RAM per cache block at 1M blocks: adaptive
//! 25.0 B (S3-FIFO with the [`CompactGhost`], plus its mini-caches and
//! fill gate), smq +
//! hotspot 22.1 B, lru 21.0 B, fifo 21.0 B, sieve 21.1 B, s3fifo 40.1 B,
//! arc 42.6 B (`cargo bench -p tiercache-policy`).
//!
//! Time is always an argument. Nothing here reads a clock, sleeps, locks or
//! touches a device, so the live engine and the simulator run exactly this
//! code and get exactly the same decisions for the same request stream.

pub mod adaptive;
pub mod admission;
pub mod arc;
pub mod demotion;
pub mod director;
pub mod fifo;
pub mod fill_gate;
pub mod first_turnover;
pub mod ghost;
mod list_ids;
pub mod lru;
pub mod minis;
pub mod s3fifo;
pub mod seeded_hash;
pub mod sequential;
pub mod sharing;
pub mod sieve;
pub mod slot_bits;
pub mod slots;
pub mod smooth_curve;
pub mod smq;
pub mod utility;
mod volumes;
pub mod writeback;
pub mod writeback_sweep;

pub use adaptive::Adaptive;
pub use admission::{Admission, AlwaysAdmit, HotspotAdmit, NHitAdmit};
pub use arc::Arc;
pub use director::{Before, BlockPlan, Counters, Director, DirectorConfig, IoPlan, IoRequest};
pub use fifo::Fifo;
pub use fill_gate::{FillGate, RequestClass};
pub use ghost::{CompactGhost, GhostLifetime};
pub use lru::Lru;
pub use minis::DeferredMinis;
pub use s3fifo::S3Fifo;
pub use sequential::SequentialDetector;
pub use sharing::VolumeLimits;
pub use sieve::Sieve;
pub use slots::SlotTable;
pub use smq::Smq;

use tiercache_types::{Access, AdmissionKind, CacheBlock, OriginBlock, ReplacementKind, Time};

/// Result of inserting a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insertion {
    /// The slot the new block now occupies.
    pub cblock: CacheBlock,
    /// The clean block that was evicted to make room, if any. Its slot is
    /// `cblock`: the caller must not overwrite that slot's data while a
    /// reader of the evicted block may still be copying it out.
    pub evicted: Option<OriginBlock>,
}

/// A replacement policy over a fixed number of cache slots.
///
/// Contract shared by every implementation:
/// - it owns the mapping origin block -> slot (through a [`SlotTable`]);
/// - dirty blocks are never evicted by [`Replacement::insert`]; when the
///   cache is full and every block is dirty, `insert` returns `None` and
///   changes nothing;
/// - no method does IO, blocks or reads a clock; `now` is the only time.
pub trait Replacement: Send {
    fn kind(&self) -> ReplacementKind;

    /// The resident set (mapping, dirty bits, lists) the policy keeps.
    fn slots(&self) -> &SlotTable;

    /// The slots managed (the cache size in blocks).
    fn capacity(&self) -> u32 {
        self.slots().capacity()
    }

    /// The resident blocks, clean and dirty.
    fn len(&self) -> u32 {
        self.slots().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot holding `oblock`, without recording an access.
    fn lookup(&self, oblock: OriginBlock) -> Option<CacheBlock> {
        self.slots().lookup(oblock)
    }

    /// The block held in slot `cblock`, if any.
    fn oblock_of(&self, cblock: CacheBlock) -> Option<OriginBlock> {
        self.slots().oblock_of(cblock)
    }

    /// Records an access to a resident block. Caller guarantees `oblock` is
    /// resident.
    fn touch(&mut self, oblock: OriginBlock, access: Access, now: Time);

    /// [`Replacement::touch`] for a caller that has just looked `oblock`
    /// up and found it in slot `cblock` (the director's hits): the same
    /// decision, without a second lookup where the policy can do without.
    fn touch_at(&mut self, oblock: OriginBlock, cblock: CacheBlock, access: Access, now: Time) {
        let _ = cblock;
        self.touch(oblock, access, now);
    }

    /// Every block reference the director plans, hit or miss, before it is
    /// served: `fills_on_miss` says whether a miss of it would be filled
    /// (a read not bypassed; a write covering the whole block that the
    /// mode lets allocate). For a policy that models the request stream
    /// as the cache sees it ([`crate::Adaptive`]'s mini-caches, which
    /// must also see the write misses that fill nothing); the others
    /// ignore it.
    fn observe(&mut self, oblock: OriginBlock, fills_on_miss: bool, now: Time) {
        let _ = (oblock, fills_on_miss, now);
    }

    /// Called by the director just before it fills a miss of `oblock`
    /// (a read promotion, or a write allocation) for a request of `class`,
    /// once admission has let it through. With `optional` (every fill but
    /// a writeback allocation, which must absorb the write) the policy may
    /// decline: it returns true, the miss is served from the backing
    /// device, and the policy has recorded it as it sees fit (the default
    /// remembers it in its ghost, `fill_gate.rs`). Otherwise, or when it
    /// returns false, [`Replacement::insert`] follows for this block.
    /// Default: never declines.
    fn declines_fill(&mut self, oblock: OriginBlock, class: RequestClass, optional: bool) -> bool {
        let _ = (oblock, class, optional);
        false
    }

    /// Makes `oblock` resident. Caller guarantees it is not resident. Evicts
    /// a clean block first when the cache is full.
    fn insert(&mut self, oblock: OriginBlock, now: Time) -> Option<Insertion>;

    /// Makes `oblock` resident in slot `cblock`, as saved in metadata.
    /// `hint` is the value [`Replacement::hint`] gave when it was saved (0
    /// when unknown). Returns false, changing nothing, if the slot is taken
    /// or the block is already resident.
    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, hint: u8) -> bool;

    /// Unmaps `oblock` (invalidation), returning the slot it held.
    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock>;

    /// Marks a resident block dirty (must not be evicted) or clean.
    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool);

    fn is_dirty(&self, oblock: OriginBlock) -> bool {
        let s = self.slots();
        s.lookup(oblock).is_some_and(|c| s.is_dirty(c))
    }

    /// The number of dirty blocks.
    fn dirty_len(&self) -> u32 {
        self.slots().dirty_count()
    }

    /// The block the next `insert` would most likely evict, without side
    /// effects. A hint for admission; `None` when a slot is free.
    fn peek_victim(&self) -> Option<OriginBlock>;

    /// A small policy-specific value worth saving with the mapping (a queue
    /// level, a frequency) so a restart keeps the ordering roughly right.
    fn hint(&self, oblock: OriginBlock) -> u8 {
        let _ = oblock;
        0
    }

    /// Calls `f(oblock, cblock, dirty)` for every resident block.
    fn for_each_resident(&self, f: &mut dyn FnMut(OriginBlock, CacheBlock, bool)) {
        self.slots().for_each_resident(f)
    }

    /// Bytes of RAM the policy uses, for reporting bytes per cache block.
    fn memory_bytes(&self) -> usize;

    /// Work the policy has put off so that its caller can do it after
    /// releasing the lock it holds the policy under (the adaptive policy's
    /// mini-caches: `minis.rs`). Running it or not, and when, changes no
    /// decision: work not taken runs inline when it is next needed.
    fn take_deferred(&mut self) -> Option<DeferredMinis> {
        None
    }
}

/// Everything needed to build a policy stack.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyConfig {
    pub replacement: ReplacementKind,
    pub admission: AdmissionKind,
    /// For `nhit`: misses needed before a block is promoted.
    pub nhit_threshold: u32,
    /// For `nhit`: below this occupancy (0..1) every miss is promoted (OCF uses 0.8).
    pub nhit_free_occupancy: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            replacement: ReplacementKind::Adaptive,
            admission: AdmissionKind::Always,
            nhit_threshold: 3,
            nhit_free_occupancy: 0.8,
        }
    }
}

/// The policy's label, `replacement+admission` (e.g. `adaptive+always`):
/// shown in stats, written to the cache's superblock, and read back by
/// its `FromStr`, the one parser of labels.
impl std::fmt::Display for PolicyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.replacement, self.admission)
    }
}

/// Parses `REPLACEMENT[+ADMISSION]` (admission `always` when left out) or
/// `default` (the default stack), case-insensitively; the other fields are
/// the defaults'.
impl std::str::FromStr for PolicyConfig {
    type Err = tiercache_types::ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("default") {
            return Ok(PolicyConfig::default());
        }
        let (r, a) = t.split_once('+').unwrap_or((t, "always"));
        Ok(PolicyConfig {
            replacement: r.parse()?,
            admission: a.parse()?,
            ..PolicyConfig::default()
        })
    }
}

/// A policy that cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy '{0}' is not available in this build")]
    Unavailable(String),
    #[error("invalid policy parameter: {0}")]
    Invalid(String),
}

impl PolicyConfig {
    /// Builds the replacement policy for a cache of `capacity` slots.
    pub fn build_replacement(&self, capacity: u32) -> Result<Box<dyn Replacement>, PolicyError> {
        Ok(match self.replacement {
            ReplacementKind::Smq => Box::new(Smq::new(capacity)),
            ReplacementKind::Lru => Box::new(Lru::new(capacity)),
            ReplacementKind::S3Fifo => Box::new(S3Fifo::new(capacity)),
            ReplacementKind::Arc => Box::new(Arc::new(capacity)),
            ReplacementKind::Fifo => Box::new(Fifo::new(capacity)),
            ReplacementKind::Sieve => Box::new(Sieve::new(capacity)),
            ReplacementKind::Adaptive => Box::new(Adaptive::new(capacity)),
        })
    }

    /// Builds the admission policy. `block_size` is the cache block size in
    /// bytes; `capacity` the cache size in blocks.
    pub fn build_admission(
        &self,
        capacity: u32,
        block_size: u32,
    ) -> Result<Box<dyn Admission>, PolicyError> {
        Ok(match self.admission {
            AdmissionKind::Always => Box::new(AlwaysAdmit),
            AdmissionKind::NHit => {
                if !(0.0..=1.0).contains(&self.nhit_free_occupancy) {
                    return Err(PolicyError::Invalid(format!(
                        "nhit_free_occupancy {} must be between 0 and 1",
                        self.nhit_free_occupancy
                    )));
                }
                if self.nhit_threshold == 0 {
                    return Err(PolicyError::Invalid(
                        "nhit_threshold must be at least 1".into(),
                    ));
                }
                Box::new(NHitAdmit::new(
                    self.nhit_threshold,
                    self.nhit_free_occupancy,
                    capacity,
                ))
            }
            AdmissionKind::Hotspot => Box::new(HotspotAdmit::new(capacity, block_size)),
        })
    }
}

/// One read of `o` through `p` for unit tests: a touch when resident, else
/// an insertion (which must succeed). Returns whether it was a hit.
#[cfg(test)]
pub(crate) fn test_access(p: &mut dyn Replacement, o: u64) -> bool {
    let o = OriginBlock(o);
    p.observe(o, true, Time(0));
    if p.lookup(o).is_some() {
        p.touch(o, Access::Read, Time(0));
        true
    } else {
        p.insert(o, Time(0)).expect("an insertion");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stack_label_parses_back() {
        for &replacement in ReplacementKind::ALL {
            for &admission in AdmissionKind::ALL {
                let p = PolicyConfig {
                    replacement,
                    admission,
                    ..PolicyConfig::default()
                };
                assert_eq!(p.to_string().parse::<PolicyConfig>().unwrap(), p);
            }
        }
        assert_eq!(
            "default".parse::<PolicyConfig>().unwrap(),
            PolicyConfig::default()
        );
        assert_eq!(PolicyConfig::default().to_string(), "adaptive+always");
        let lru: PolicyConfig = " LRU ".parse().unwrap();
        assert_eq!(
            (lru.replacement, lru.admission),
            (ReplacementKind::Lru, AdmissionKind::Always)
        );
        assert!("lru+maybe".parse::<PolicyConfig>().is_err());
        assert!("mru".parse::<PolicyConfig>().is_err());
    }
}
