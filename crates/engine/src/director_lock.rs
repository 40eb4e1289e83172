//! The director behind the engine's lock, which runs the policy's deferred
//! work after each unlock.
//!
//! Every request takes this lock, so what runs under it serializes the
//! front end's threads (NBD connections, ublk queues, the pool's volumes).
//! The adaptive policy's mini-caches do most of a hit's policy work; they
//! take their input in batches ([`Director::take_deferred`]), and the
//! guard's drop runs a batch taken under the lock once the lock is
//! released. The decisions are the same whether and whenever it runs
//! (`tiercache_policy::minis`), so the simulator, which runs none of it
//! early, agrees with the engine (`tests/sim_parity.rs`).
//!
//! The batch runs on the thread that dropped the guard, which may still
//! hold its IO's stripe locks (shared for a read): a writer of those
//! blocks then waits for the batch too, 64 sampled accesses' worth of the
//! minis' work (tens of microseconds natively) once per 64 sampled
//! accesses.

use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};
use tiercache_policy::Director;

/// The engine's director and its lock.
pub(crate) struct DirectorLock(Mutex<Director>);

impl DirectorLock {
    pub(crate) fn new(director: Director) -> Self {
        DirectorLock(Mutex::new(director))
    }

    /// Locks the director; the guard's drop unlocks it, then runs the
    /// policy's deferred work.
    pub(crate) fn lock(&self) -> DirectorGuard<'_> {
        DirectorGuard(Some(self.0.lock()))
    }
}

/// The director, locked. Dropping it unlocks the director, then runs the
/// work the policy put off meanwhile.
pub(crate) struct DirectorGuard<'a>(Option<MutexGuard<'a, Director>>);

impl Deref for DirectorGuard<'_> {
    type Target = Director;
    fn deref(&self) -> &Director {
        self.0
            .as_ref()
            .expect("the guard holds the lock until dropped")
    }
}

impl DerefMut for DirectorGuard<'_> {
    fn deref_mut(&mut self) -> &mut Director {
        self.0
            .as_mut()
            .expect("the guard holds the lock until dropped")
    }
}

impl Drop for DirectorGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut guard) = self.0.take() {
            let deferred = guard.take_deferred();
            drop(guard);
            if let Some(work) = deferred {
                work.run();
            }
        }
    }
}
