//! Finding a device that a previous server left behind, and deciding
//! whether this server may take it over (the kernel's user recovery,
//! `UBLK_F_USER_RECOVERY`).
//!
//! A device created with user recovery outlives its server: when the
//! process dies (or hands over, [`crate::UblkServer::hand_over`]) the
//! kernel quiesces the device, holds new requests and, with
//! `UBLK_F_USER_RECOVERY_REISSUE`, puts the requests the dead server had
//! taken but not completed back in the queue. The next server sends
//! START_USER_RECOVERY, serves the queues again and sends
//! END_USER_RECOVERY; the held requests then reach it.

use crate::start_error::{describe, StartError};
use libublk::ctrl::UblkCtrl;
use libublk::{sys, UblkError};
use std::time::{Duration, Instant};

/// The flags a device is created with when it is to outlive its server.
pub const RECOVERY_FLAGS: u64 =
    (sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE) as u64;

/// How long a device whose server has died may stay LIVE before the kernel
/// has quiesced it (the dying process's io_uring is torn down first).
const QUIESCE_WAIT: Duration = Duration::from_secs(30);

/// What exists under a device number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// No such device: add a new one.
    Absent,
    /// A device whose server is gone, quiesced, holding its requests: this
    /// server may take it over with the same queues.
    Recoverable {
        queues: u16,
        depth: u16,
        max_io_bytes: u32,
        /// Its size in bytes, as the previous server gave it.
        size: u64,
        /// Its logical block size in bytes.
        logical_block: u32,
    },
}

/// Looks at device `dev_id`: absent, or quiesced and free to take over.
/// Fails (with the reason) when it exists but may not be taken: served by
/// a live process, made without user recovery, or stuck.
pub fn probe(dev_id: u32) -> Result<Existing, StartError> {
    if !std::path::Path::new(&format!("/sys/class/ublk-char/ublkc{dev_id}")).exists() {
        return Ok(Existing::Absent);
    }
    let deadline = Instant::now() + QUIESCE_WAIT;
    loop {
        let ctrl = match UblkCtrl::new_simple(dev_id as i32) {
            Ok(c) => c,
            // Deleted between the look and the query.
            Err(UblkError::OtherError(e)) if e == -libc::ENODEV || e == -libc::ENOENT => {
                return Ok(Existing::Absent)
            }
            Err(e) => {
                return Err(StartError::Driver(format!(
                    "reading ublk device {dev_id}: {}",
                    describe(&e)
                )))
            }
        };
        let info = ctrl.dev_info();
        // Not ours to delete: a control made for a query never deletes.
        let pid = info.ublksrv_pid;
        let alive = pid > 0 && pid != std::process::id() as i32 && process_alive(pid);
        match u32::from(info.state) {
            sys::UBLK_S_DEV_QUIESCED => {
                if info.flags & u64::from(sys::UBLK_F_USER_RECOVERY) == 0 {
                    return Err(StartError::Driver(format!(
                        "/dev/ublkb{dev_id} is quiesced but was made without user recovery"
                    )));
                }
                let mut params = sys::ublk_params::default();
                ctrl.get_params(&mut params).map_err(|e| {
                    StartError::Driver(format!(
                        "reading the parameters of /dev/ublkb{dev_id}: {}",
                        describe(&e)
                    ))
                })?;
                return Ok(Existing::Recoverable {
                    queues: info.nr_hw_queues,
                    depth: info.queue_depth,
                    max_io_bytes: info.max_io_buf_bytes,
                    size: params.basic.dev_sectors << crate::request::SECTOR_SHIFT,
                    logical_block: 1 << params.basic.logical_bs_shift,
                });
            }
            sys::UBLK_S_DEV_LIVE if alive => {
                return Err(StartError::Busy(format!(
                    "/dev/ublkb{dev_id} is being served by a live process (pid {pid}); \
                     stop it first (SIGTERM), or hand it over (SIGUSR1)"
                )))
            }
            sys::UBLK_S_DEV_LIVE if info.flags & RECOVERY_FLAGS == 0 => {
                return Err(StartError::Busy(format!(
                    "/dev/ublkb{dev_id} exists, its server (pid {pid}) is gone, and it was \
                     made without user recovery: delete it first"
                )))
            }
            // The server just died: the kernel quiesces the device once
            // the process's io_uring is gone.
            sys::UBLK_S_DEV_LIVE if Instant::now() < deadline => {}
            state => {
                return Err(StartError::Busy(format!(
                    "/dev/ublkb{dev_id} exists in state {state} (not quiesced) and its \
                     server (pid {pid}) is gone; delete it first"
                )))
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True if a process `pid` exists (signal 0).
fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the
    // process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// START_USER_RECOVERY for a device [`probe`] found recoverable: after it
/// the kernel waits for the queues of a new server.
pub fn start(dev_id: u32) -> Result<(), StartError> {
    let ctrl = UblkCtrl::new_simple(dev_id as i32).map_err(|e| {
        StartError::Driver(format!("reading ublk device {dev_id}: {}", describe(&e)))
    })?;
    match ctrl.start_user_recover() {
        Ok(r) if r >= 0 => Ok(()),
        Ok(r) => Err(StartError::Driver(format!(
            "START_USER_RECOVERY of /dev/ublkb{dev_id}: {}",
            std::io::Error::from_raw_os_error(-r)
        ))),
        Err(e) => Err(StartError::Driver(format!(
            "START_USER_RECOVERY of /dev/ublkb{dev_id}: {}",
            describe(&e)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_number_nobody_uses_is_absent() {
        // /sys/class/ublk-char has no ublkc4000000 (the driver's ids stop
        // far below): a new device is to be added.
        assert_eq!(probe(4_000_000).unwrap(), Existing::Absent);
    }

    #[test]
    fn recovery_flags_ask_for_reissue() {
        assert_ne!(RECOVERY_FLAGS & u64::from(sys::UBLK_F_USER_RECOVERY), 0);
        assert_ne!(
            RECOVERY_FLAGS & u64::from(sys::UBLK_F_USER_RECOVERY_REISSUE),
            0
        );
    }
}
