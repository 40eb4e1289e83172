//! `serve --ublk`: the export as `/dev/ublkbN` instead of an NBD socket
//! (crates/ublk; behind the cargo feature `ublk`, on by default).

use anyhow::Result;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_frontend::Export;

/// `--ublk-queues`, `--ublk-depth`, `--ublk-id` (None: the defaults of
/// `tiercache_ublk::UblkConfig`, i.e. CPUs up to 4 queues, depth 64, a
/// device number the kernel picks).
#[derive(Debug, Clone, Default)]
pub struct UblkSettings {
    pub queues: Option<u16>,
    pub depth: Option<u16>,
    pub id: Option<u32>,
}

/// A running ublk device.
pub struct UblkFrontEnd {
    #[cfg(feature = "ublk")]
    server: tiercache_ublk::UblkServer,
}

#[cfg(feature = "ublk")]
mod imp {
    use super::*;
    use anyhow::Context;

    /// Fails early, before any device is opened, when the kernel has no
    /// ublk or this process may not use it.
    pub fn check_available() -> Result<()> {
        Ok(tiercache_ublk::check_kernel_support()?)
    }

    pub fn start(s: &UblkSettings, export: Arc<dyn Export>) -> Result<UblkFrontEnd> {
        let defaults = tiercache_ublk::UblkConfig::default();
        let cfg = tiercache_ublk::UblkConfig {
            queues: s.queues.unwrap_or(defaults.queues),
            depth: s.depth.unwrap_or(defaults.depth),
            dev_id: s.id,
            ..defaults
        };
        let server =
            tiercache_ublk::UblkServer::start(export, &cfg).context("starting the ublk device")?;
        let g = server.geometry();
        log::info!(
            "ublk: {} with {} queues of depth {}, {}-byte logical blocks, IO up to {} KiB",
            server.device_path().display(),
            cfg.queues,
            cfg.depth,
            g.logical_block,
            g.max_io_bytes >> 10
        );
        Ok(UblkFrontEnd { server })
    }

    impl UblkFrontEnd {
        pub fn device_path(&self) -> PathBuf {
            self.server.device_path()
        }
        pub fn has_exited(&self) -> bool {
            self.server.has_exited()
        }
        /// Deletes the device (requests in flight finish first).
        pub fn stop(self) -> Result<()> {
            self.server
                .stop()
                .map_err(|e| anyhow::anyhow!("stopping the ublk device: {e}"))
        }
    }
}

#[cfg(not(feature = "ublk"))]
mod imp {
    use super::*;

    pub fn check_available() -> Result<()> {
        anyhow::bail!("this tiercache was built without ublk support (cargo feature `ublk`)")
    }

    pub fn start(_: &UblkSettings, _: Arc<dyn Export>) -> Result<UblkFrontEnd> {
        check_available().map(|()| UblkFrontEnd {})
    }

    impl UblkFrontEnd {
        pub fn device_path(&self) -> PathBuf {
            PathBuf::new()
        }
        pub fn has_exited(&self) -> bool {
            true
        }
        pub fn stop(self) -> Result<()> {
            Ok(())
        }
    }
}

pub use imp::{check_available, start};
