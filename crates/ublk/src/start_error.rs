//! Why a ublk device could not be served: [`StartError`], and the
//! driver's errors made readable. Shared by the server and the recovery
//! of a device left by a previous server.

use libublk::UblkError;

/// Where the kernel's ublk driver is reached.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// Why a device could not be served.
#[derive(Debug)]
pub enum StartError {
    /// No `/dev/ublk-control`: the kernel has no ublk driver loaded.
    NoKernelSupport,
    /// `/dev/ublk-control` exists but may not be opened (not root).
    PermissionDenied,
    /// The export cannot be described to the kernel (block sizes, size).
    Geometry(String),
    /// The configuration is out of range.
    Config(String),
    /// The driver refused or failed (creating, starting the device).
    Driver(String),
    /// The device number is taken: a live server serves it, or a device
    /// that cannot be taken over is there.
    Busy(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::NoKernelSupport => write!(
                f,
                "this kernel has no ublk (modprobe ublk_drv; needs Linux >= 6.0 built with \
                 CONFIG_BLK_DEV_UBLK): {CONTROL_PATH} does not exist"
            ),
            StartError::PermissionDenied => write!(
                f,
                "{CONTROL_PATH} may not be opened: creating a ublk device needs root"
            ),
            StartError::Geometry(m) => write!(f, "cannot serve this export over ublk: {m}"),
            StartError::Config(m) => write!(f, "bad ublk configuration: {m}"),
            StartError::Driver(m) => write!(f, "ublk driver: {m}"),
            StartError::Busy(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for StartError {}

pub(crate) fn describe(e: &UblkError) -> String {
    match e {
        UblkError::OtherError(code) | UblkError::UringIOError(code) if *code < 0 => {
            format!("{e} ({})", std::io::Error::from_raw_os_error(-code))
        }
        UblkError::IOError(io) => format!("{io}"),
        _ => format!("{e}"),
    }
}
