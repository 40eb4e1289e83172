//! Client flushes: every completed write made durable, on the cache
//! device (dirty data and its claims) and on the backing device.

use crate::stats::IoCounters;
use crate::{Engine, EngineError, Result};

impl Engine {
    /// Makes every write completed before this call durable: on the cache
    /// device (dirty data) and on the backing device.
    pub fn flush(&self) -> Result<()> {
        IoCounters::add(&self.io.flushes, 1);
        if self.persist.is_some() {
            // Flushes the cache device, then commits the dirty claims.
            self.commit_inner(true)?;
            return self.backing.flush().map_err(|e| self.backing_err(e, true));
        }
        if let Err(e) = self.cache.flush() {
            self.cache_error(&e, true);
            if self.director.lock().replacement().dirty_len() > 0 {
                return Err(EngineError::CacheDirty {
                    device: self.cache.describe(),
                    source: e,
                });
            }
        }
        self.backing.flush().map_err(|e| self.backing_err(e, true))
    }

    /// Dirty blocks now.
    pub fn dirty_blocks(&self) -> u64 {
        self.director.lock().replacement().dirty_len() as u64
    }
}
