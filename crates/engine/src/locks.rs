//! Striped per-origin-block locks.
//!
//! Reads of a block hold its stripe shared, writes (and anything that must
//! not race with a write, such as writeback) hold it exclusive. An IO locks
//! every stripe it touches, in ascending stripe order, before it plans
//! anything, so lock order is global and there is no deadlock.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

/// Number of stripes. Consecutive blocks fall on consecutive stripes.
pub const STRIPES: usize = 4096;

pub struct StripeLocks {
    stripes: Vec<RwLock<()>>,
}

/// Stripes an IO of up to this many blocks locks without a heap
/// allocation (a 4 KiB IO touches one block, one of up to a block size two).
const INLINE: usize = 4;

/// Guards for every stripe of one IO; dropping it unlocks.
pub enum StripeGuard<'a> {
    Shared(#[allow(dead_code)] SmallVec<[RwLockReadGuard<'a, ()>; INLINE]>),
    Exclusive(#[allow(dead_code)] SmallVec<[RwLockWriteGuard<'a, ()>; INLINE]>),
}

impl StripeLocks {
    pub fn new() -> Self {
        StripeLocks {
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        }
    }

    /// The stripes of `blocks`, ascending, each once.
    fn indices(blocks: std::ops::Range<u64>) -> SmallVec<[usize; INLINE]> {
        if blocks.end - blocks.start >= STRIPES as u64 {
            return (0..STRIPES).collect();
        }
        let mut v: SmallVec<[usize; INLINE]> =
            blocks.map(|b| (b % STRIPES as u64) as usize).collect();
        if v.len() > 1 {
            v.sort_unstable();
            v.dedup();
        }
        v
    }

    /// Locks the stripes of `blocks` for reading.
    pub fn shared(&self, blocks: std::ops::Range<u64>) -> StripeGuard<'_> {
        StripeGuard::Shared(
            Self::indices(blocks)
                .into_iter()
                .map(|i| self.stripes[i].read())
                .collect(),
        )
    }

    /// Locks the stripes of `blocks` for reading if none of them is locked
    /// for writing (or waited for by a writer); None instead of waiting.
    pub fn try_shared(&self, blocks: std::ops::Range<u64>) -> Option<StripeGuard<'_>> {
        let mut guards = SmallVec::new();
        for i in Self::indices(blocks) {
            guards.push(self.stripes[i].try_read()?);
        }
        Some(StripeGuard::Shared(guards))
    }

    /// Locks the stripes of `blocks` for writing.
    pub fn exclusive(&self, blocks: std::ops::Range<u64>) -> StripeGuard<'_> {
        StripeGuard::Exclusive(
            Self::indices(blocks)
                .into_iter()
                .map(|i| self.stripes[i].write())
                .collect(),
        )
    }
}
