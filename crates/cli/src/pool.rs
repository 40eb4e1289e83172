//! A pool's volumes added and removed while `serve` runs over NBD: the
//! control socket's `attach` and `detach-volume` ([`crate::control`]) reach
//! the engine and the NBD server's export list through [`NbdPool`].

use crate::control::PoolControl;
use crate::export::VolumeExport;
use anyhow::{Context, Result};
use std::sync::Arc;
use tiercache_engine::Engine;
use tiercache_nbd::{ExportEntry, Exports};
use tiercache_types::{CacheMode, VolumeId};

/// A volume just attached to a running pool's engine, not yet served.
pub(crate) struct NewVolume {
    pub id: VolumeId,
    /// Bytes of its backing device.
    pub size: u64,
    pub export: VolumeExport,
}

impl NewVolume {
    /// Opens `backing` (refused if it is the cache device, `cache`) and
    /// attaches it to `engine` as volume `name` with the pool's mode and
    /// sequential cutoff for new volumes. The caller serves the export, or
    /// detaches the volume again if it cannot.
    pub(crate) fn attach(
        engine: &Arc<Engine>,
        cache: &str,
        name: &str,
        backing: &str,
        mode: CacheMode,
        sequential_cutoff: u64,
    ) -> Result<NewVolume> {
        crate::devices::ensure_distinct(backing, cache)?;
        let device = crate::devices::open(backing).context("backing device")?;
        let size = device.size();
        let id = engine.attach_volume(name, backing, device, mode, sequential_cutoff)?;
        let export = VolumeExport {
            volume: engine.volume_handle(id)?,
            rotational: backing.starts_with("hdd:"),
        };
        Ok(NewVolume { id, size, export })
    }
}

/// The engine and the NBD exports of a running pool.
pub struct NbdPool {
    pub engine: Arc<Engine>,
    pub exports: Exports,
    /// The cache device's spec (a new volume may not be it).
    pub cache: String,
    /// Mode and sequential cutoff of a new volume.
    pub mode: CacheMode,
    pub sequential_cutoff: u64,
}

impl PoolControl for NbdPool {
    fn attach(&self, name: &str, backing: &str, ublk_id: Option<u32>) -> Result<String> {
        if ublk_id.is_some() {
            anyhow::bail!("ublk-id= is for a server serving over ublk (--ublk)");
        }
        let NewVolume { id, size, export } = NewVolume::attach(
            &self.engine,
            &self.cache,
            name,
            backing,
            self.mode,
            self.sequential_cutoff,
        )?;
        if let Err(e) = self
            .exports
            .add_export(ExportEntry::new(name, Arc::new(export)))
        {
            // Nothing was served from it: take it out again.
            let _ = self.engine.detach_volume(id, |_, _| {});
            return Err(e).context("exporting it");
        }
        Ok(format!(
            "volume {name} attached ({size} bytes, mode {}): NBD export {name}",
            self.mode
        ))
    }

    fn unexport(&self, name: &str) {
        self.exports.remove_export(name);
    }
}
