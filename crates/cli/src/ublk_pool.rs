//! A pool's volumes added and removed while `serve --ublk` runs: the
//! control socket's `attach` and `detach-volume` ([`crate::control`]) reach
//! the engine and the ublk devices ([`crate::ublk::UblkFrontEnd`]) through
//! [`UblkPool`]. Attach adds a `/dev/ublkbN`; detach deletes the volume's
//! device first (its requests in flight finish), then the engine writes
//! its dirty blocks back and frees its slots.

use crate::control::PoolControl;
use crate::pool::NewVolume;
use crate::ublk::UblkFrontEnd;
use anyhow::Result;
use std::sync::Arc;
use tiercache_engine::Engine;
use tiercache_types::CacheMode;

/// The engine and the ublk devices of a running pool.
pub struct UblkPool {
    pub engine: Arc<Engine>,
    pub devices: Arc<UblkFrontEnd>,
    /// The cache device's spec (a new volume may not be it).
    pub cache: String,
    /// Mode and sequential cutoff of a new volume.
    pub mode: CacheMode,
    pub sequential_cutoff: u64,
}

impl PoolControl for UblkPool {
    fn attach(&self, name: &str, backing: &str, ublk_id: Option<u32>) -> Result<String> {
        let NewVolume { id, size, export } = NewVolume::attach(
            &self.engine,
            &self.cache,
            name,
            backing,
            self.mode,
            self.sequential_cutoff,
        )?;
        let path = match self
            .devices
            .add(Some(name.to_string()), Arc::new(export), ublk_id)
        {
            Ok(path) => path,
            Err(e) => {
                // Nothing was served from it: take it out again.
                let _ = self.engine.detach_volume(id, |_, _| {});
                return Err(e);
            }
        };
        Ok(format!(
            "volume {name} attached ({size} bytes, mode {}): {}",
            self.mode,
            path.display()
        ))
    }

    fn unexport(&self, name: &str) {
        if let Err(e) = self.devices.remove(name) {
            log::warn!("volume {name}: {e:#}");
        }
    }
}
