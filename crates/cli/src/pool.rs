//! A pool's volumes added and removed while `serve` runs over NBD: the
//! control socket's `attach` and `detach-volume` ([`crate::control`]) reach
//! the engine and the NBD server's export list through [`NbdPool`].

use crate::control::PoolControl;
use crate::export::VolumeExport;
use anyhow::{Context, Result};
use std::sync::Arc;
use tiercache_engine::Engine;
use tiercache_nbd::{ExportEntry, Exports};
use tiercache_types::CacheMode;

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
        crate::devices::ensure_distinct(backing, &self.cache)?;
        let device = crate::devices::open(backing).context("backing device")?;
        let size = device.size();
        let id =
            self.engine
                .attach_volume(name, backing, device, self.mode, self.sequential_cutoff)?;
        let export = VolumeExport {
            volume: self.engine.volume_handle(id)?,
            rotational: backing.starts_with("hdd:"),
        };
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
