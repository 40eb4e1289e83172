//! The kernel's NBD client driven by the server itself: an export attached
//! as /dev/nbdN through the driver's generic netlink interface, so that
//! the device outlives the server process (`tiercache serve
//! --nbd-device`, docs/RESTART.md).
//!
//! By file: `genetlink.rs` (generic netlink messages as bytes, pure),
//! `socket.rs` (the netlink socket), `commands.rs` (the "nbd" family's
//! CONNECT, RECONFIGURE, DISCONNECT, STATUS), `negotiate.rs` (the
//! client's side of the NBD handshake, done before the kernel takes a
//! socket), `device.rs` ([`KernelDevice`]: attach, take over, keep
//! connected, detach or leave).

pub mod commands;
mod device;
pub mod genetlink;
mod negotiate;
mod socket;

pub use device::{Attached, KernelDevice, KernelDeviceConfig, DEFAULT_REQUEUE_CHECK};
pub use negotiate::{negotiate, ExportInfo};
