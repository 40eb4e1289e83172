//! Admission: which missed blocks may enter the cache, apart from which
//! blocks leave it.

use tiercache_types::{Access, AdmissionKind, OriginBlock, Time};

/// Decides whether a missed block is promoted.
///
/// Contract: never does IO or reads a clock; `now` is the only time.
pub trait Admission: Send {
    fn kind(&self) -> AdmissionKind;

    /// Records a miss on `oblock` and says whether to promote it now.
    /// `occupancy` is the resident share of the cache (0..=1); `victim` is
    /// the block a promotion would most likely evict (None when a slot is
    /// free), so an admission rule can compare the candidate with it.
    fn admit(
        &mut self,
        oblock: OriginBlock,
        access: Access,
        now: Time,
        occupancy: f64,
        victim: Option<OriginBlock>,
    ) -> bool;

    /// Records a hit on a resident block (some rules track all accesses).
    fn on_hit(&mut self, oblock: OriginBlock, now: Time) {
        let _ = (oblock, now);
    }

    /// Bytes of RAM used.
    fn memory_bytes(&self) -> usize {
        0
    }
}

/// Promotes every miss (bcache, nbdkit's cache filter with cache-on-read).
#[derive(Clone, Copy, Debug, Default)]
pub struct AlwaysAdmit;

impl Admission for AlwaysAdmit {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Always
    }
    fn admit(
        &mut self,
        _: OriginBlock,
        _: Access,
        _: Time,
        _: f64,
        _: Option<OriginBlock>,
    ) -> bool {
        true
    }
}
