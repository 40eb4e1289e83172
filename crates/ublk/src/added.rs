//! The first half of starting a device: fixing its number. A new device
//! is added (ADD_DEV, where the kernel picks the lowest free number unless
//! one is asked for); a device a dead server left, found waiting under
//! the number asked for, is only looked at. The second half
//! ([`crate::UblkServer::start_added`]) opens the device, posts its
//! queues' tags and starts it; it may run on another thread, alongside
//! the second halves of other devices, while the first halves run one
//! after another so that the numbers the kernel picks follow their order.

use crate::params::{device_params, Geometry};
use crate::server::{check_kernel_support, ensure_ctrl_ring, UblkConfig};
use crate::start_error::{describe, StartError};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::{sys, UblkFlags};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_frontend::Export;

/// A device whose number is fixed and that does not serve yet: hand it to
/// [`crate::UblkServer::start_added`]. Dropped instead, a device it added
/// is deleted and a device it found waiting is left waiting, untouched.
pub struct AddedDevice {
    pub(crate) export: Arc<dyn Export>,
    /// As asked for, but a device taken over keeps its own queues, depth
    /// and IO size.
    pub(crate) cfg: UblkConfig,
    pub(crate) params: sys::ublk_params,
    pub(crate) geometry: Geometry,
    pub(crate) dev_id: u32,
    /// The device added (ADD_DEV); None for one to take over, whose
    /// START_USER_RECOVERY is left to the second half.
    pub(crate) ctrl: Option<UblkCtrl>,
    /// How long this first half took.
    pub(crate) took: Duration,
}

impl AddedDevice {
    /// Checks `cfg` and the export's geometry, then fixes the device's
    /// number: with `cfg.dev_id` naming a device a dead server left
    /// quiesced, that device is to be taken over (its size and block size
    /// must match the export's; one served by a live process is refused,
    /// [`StartError::Busy`]); otherwise a new device is added, numbered
    /// `cfg.dev_id` or, without one, the lowest number free.
    pub fn add(export: Arc<dyn Export>, cfg: &UblkConfig) -> Result<AddedDevice, StartError> {
        let t0 = Instant::now();
        check_kernel_support()?;
        if !(1..=32).contains(&cfg.queues) {
            return Err(StartError::Config(format!(
                "{} queues (1 to 32)",
                cfg.queues
            )));
        }
        if !(1..=4096).contains(&cfg.depth) {
            return Err(StartError::Config(format!(
                "queue depth {} (1 to 4096)",
                cfg.depth
            )));
        }
        let (params, geometry) = device_params(&*export, cfg.max_io_bytes.min(32 << 20))
            .map_err(StartError::Geometry)?;
        let existing = match cfg.dev_id {
            Some(id) => crate::recovery::probe(id)?,
            None => crate::recovery::Existing::Absent,
        };
        let mut cfg = cfg.clone();
        if let crate::recovery::Existing::Recoverable {
            queues,
            depth,
            max_io_bytes,
            size,
            logical_block,
        } = existing
        {
            let id = cfg.dev_id.unwrap_or_default();
            let want = params.basic.dev_sectors << crate::request::SECTOR_SHIFT;
            if size != want || logical_block != geometry.logical_block {
                return Err(StartError::Busy(format!(
                    "/dev/ublkb{id} waits for a server, but not for this one: it has {size} \
                     bytes in {logical_block}-byte blocks, this export {want} bytes in {}-byte \
                     blocks",
                    geometry.logical_block
                )));
            }
            cfg.queues = queues;
            cfg.depth = depth;
            cfg.max_io_bytes = max_io_bytes;
            return Ok(AddedDevice {
                export,
                cfg,
                params,
                geometry,
                dev_id: id,
                ctrl: None,
                took: t0.elapsed(),
            });
        }
        let ctrl = add_device(&cfg, geometry.max_io_bytes)?;
        Ok(AddedDevice {
            export,
            dev_id: ctrl.dev_info().dev_id,
            cfg,
            params,
            geometry,
            ctrl: Some(ctrl),
            took: t0.elapsed(),
        })
    }

    /// N of `/dev/ublkbN`.
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// True if the device is one a dead server left, to be taken over.
    pub fn recovered(&self) -> bool {
        self.ctrl.is_none()
    }
}

impl Drop for AddedDevice {
    fn drop(&mut self) {
        // Dropping a control that added a device deletes the device, a
        // command sent through the calling thread's control ring.
        if self.ctrl.is_some() {
            if let Err(e) = ensure_ctrl_ring() {
                log::warn!("ublk{}: control ring: {}", self.dev_id, describe(&e));
            }
        }
    }
}

/// ADD_DEV: a new device numbered `cfg.dev_id` (None: the lowest free),
/// with zero copy if asked for and the kernel has it.
fn add_device(cfg: &UblkConfig, max_io_bytes: u32) -> Result<UblkCtrl, StartError> {
    let base_flags = if cfg.recovery {
        crate::recovery::RECOVERY_FLAGS
    } else {
        0
    };
    let add = |flags: u64| {
        UblkCtrlBuilder::default()
            .name("tiercache")
            .id(cfg.dev_id.map_or(-1, |id| id as i32))
            .nr_queues(cfg.queues)
            .depth(cfg.depth)
            .io_buf_bytes(max_io_bytes)
            .ctrl_flags(flags)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
    };
    if cfg.zero_copy {
        let features = UblkCtrl::get_features().unwrap_or(0);
        if features & crate::zero_copy::F_AUTO_BUF_REG == 0 {
            log::info!("ublk: this kernel cannot register requests' pages (Linux 6.16); copying");
        } else {
            for flags in crate::zero_copy::ZERO_COPY_FLAGS {
                match add(base_flags | flags) {
                    Ok(ctrl) => return Ok(ctrl),
                    Err(e) => {
                        log::info!("ublk: zero-copy flags {flags:#x} refused: {}", describe(&e))
                    }
                }
            }
        }
    }
    add(base_flags).map_err(|e| StartError::Driver(format!("adding the device: {}", describe(&e))))
}
