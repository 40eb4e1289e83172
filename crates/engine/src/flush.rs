//! Client flushes: every completed write made durable, on the cache
//! device (dirty data and its claims) and on the backing device.

use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::{Engine, EngineError, Result};
use tiercache_device::BlockDevice;

impl Engine {
    /// Makes every write completed before this call durable: on the cache
    /// device (dirty data) and on the backing device.
    pub fn flush(&self) -> Result<()> {
        self.flush_in(&self.first_volume())
    }

    /// [`Engine::flush`] for volume `vol`: the cache device and its
    /// metadata (shared by the pool), then `vol`'s backing device.
    pub(crate) fn flush_in(&self, vol: &Volume) -> Result<()> {
        IoCounters::add(&vol.io.flushes, 1);
        if self.persist.is_some() {
            // Flushes the cache device, then commits the dirty claims.
            self.commit_inner(true)?;
            return vol.backing.flush().map_err(|e| vol.backing_err(e, true));
        }
        if let Err(e) = self.cache.flush() {
            self.cache_error(&e, true);
            if self.director.lock().dirty_len() > 0 {
                return Err(EngineError::CacheDirty {
                    device: self.cache.describe(),
                    source: e,
                });
            }
        }
        vol.backing.flush().map_err(|e| vol.backing_err(e, true))
    }

    /// Dirty blocks now.
    pub fn dirty_blocks(&self) -> u64 {
        self.director.lock().dirty_len() as u64
    }

    /// Flushes every attached volume's backing device (before a clean
    /// claim, which says a backing device holds the data, becomes durable;
    /// and at shutdown).
    pub(crate) fn flush_backing_devices(&self) -> Result<()> {
        for vol in self.all_volumes() {
            vol.backing.flush().map_err(|e| vol.backing_err(e, true))?;
        }
        Ok(())
    }
}
