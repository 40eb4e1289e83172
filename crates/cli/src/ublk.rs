//! `serve --ublk`: the export as `/dev/ublkbN` instead of an NBD socket
//! (crates/ublk; behind the cargo feature `ublk`, on by default).
//!
//! The device outlives the server (user recovery, docs/RESTART.md): its
//! number is recorded in a state file next to the control socket, so the
//! next `serve` with the same control socket finds a device left waiting
//! and takes it over. A plain stop deletes the device and the file; a
//! hand-over ([`UblkFrontEnd::hand_over`]) and a crash leave both.

use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_frontend::Export;

/// `--ublk-queues`, `--ublk-depth`, `--ublk-id` (None: the defaults of
/// `tiercache_ublk::UblkConfig`, i.e. CPUs up to 4 queues, depth 64, the
/// device number in `state_file`, else one the kernel picks),
/// `--ublk-no-recovery` (`recovery` false).
#[derive(Debug, Clone, Default)]
pub struct UblkSettings {
    pub queues: Option<u16>,
    pub depth: Option<u16>,
    pub id: Option<u32>,
    pub recovery: bool,
    /// Holds the device number of the last device served for this control
    /// socket (see [`state_file`]).
    pub state_file: PathBuf,
}

/// The state file of the server whose control socket is `control`:
/// `<control without extension>.ublk-id`, one line with N of /dev/ublkbN.
pub fn state_file(control: &Path) -> PathBuf {
    control.with_extension("ublk-id")
}

/// The device number recorded in `file`, if any.
#[cfg_attr(not(feature = "ublk"), allow(dead_code))]
fn recorded_id(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    match text.trim().parse() {
        Ok(id) => Some(id),
        Err(_) => {
            log::warn!("ignoring {}: not a device number", file.display());
            None
        }
    }
}

/// Records `id` in `file` (written aside, then renamed).
#[cfg_attr(not(feature = "ublk"), allow(dead_code))]
fn record_id(file: &Path, id: u32) -> std::io::Result<()> {
    let tmp = file.with_extension("ublk-id.tmp");
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(&tmp, file)
}

/// A running ublk device.
pub struct UblkFrontEnd {
    #[cfg(feature = "ublk")]
    server: tiercache_ublk::UblkServer,
    #[cfg(feature = "ublk")]
    state_file: PathBuf,
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
            dev_id: s.id.or_else(|| recorded_id(&s.state_file)),
            recovery: s.recovery,
            ..defaults
        };
        let t0 = std::time::Instant::now();
        let server =
            tiercache_ublk::UblkServer::start(export, &cfg).context("starting the ublk device")?;
        let g = server.geometry();
        log::info!(
            "ublk: {} with {} queues of depth {}, {}-byte logical blocks, IO up to {} KiB{}",
            server.device_path().display(),
            cfg.queues,
            cfg.depth,
            g.logical_block,
            g.max_io_bytes >> 10,
            if cfg.recovery {
                ", user recovery on"
            } else {
                ""
            }
        );
        if server.recovered() {
            log::info!(
                "ublk: took over {} from the previous server in {} ms",
                server.device_path().display(),
                t0.elapsed().as_millis()
            );
        }
        if let Some(dir) = s.state_file.parent() {
            crate::control::socket_dir(dir)?;
        }
        record_id(&s.state_file, server.dev_id()).with_context(|| {
            format!("recording the device number in {}", s.state_file.display())
        })?;
        Ok(UblkFrontEnd {
            server,
            state_file: s.state_file.clone(),
        })
    }

    impl UblkFrontEnd {
        pub fn device_path(&self) -> PathBuf {
            self.server.device_path()
        }
        pub fn has_exited(&self) -> bool {
            self.server.has_exited()
        }
        /// True if the device was made with user recovery.
        pub fn can_hand_over(&self) -> bool {
            self.server.can_hand_over()
        }
        /// Deletes the device (requests in flight finish first) and the
        /// state file.
        pub fn stop(self) -> Result<()> {
            self.server
                .stop()
                .map_err(|e| anyhow::anyhow!("stopping the ublk device: {e}"))?;
            let _ = std::fs::remove_file(&self.state_file);
            Ok(())
        }
        /// Leaves the device waiting for the next server (see
        /// `tiercache_ublk::UblkServer::hand_over`): once this returns the
        /// export gets no more calls; the state file stays.
        pub fn hand_over(self) -> Result<()> {
            self.server
                .hand_over()
                .map_err(|e| anyhow::anyhow!("handing the ublk device over: {e}"))
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
        pub fn can_hand_over(&self) -> bool {
            false
        }
        pub fn stop(self) -> Result<()> {
            Ok(())
        }
        pub fn hand_over(self) -> Result<()> {
            Ok(())
        }
    }
}

pub use imp::{check_available, start};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_sits_next_to_the_control_socket() {
        assert_eq!(
            state_file(Path::new("/run/tiercache/data.ctl")),
            PathBuf::from("/run/tiercache/data.ublk-id")
        );
    }

    #[test]
    fn a_recorded_device_number_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data.ublk-id");
        assert_eq!(recorded_id(&file), None);
        record_id(&file, 7).unwrap();
        assert_eq!(recorded_id(&file), Some(7));
        record_id(&file, 3).unwrap();
        assert_eq!(recorded_id(&file), Some(3));
        std::fs::write(&file, "not a number\n").unwrap();
        assert_eq!(recorded_id(&file), None);
    }
}
