//! An [`Export`] as the NBD wire shows it: its transmission flags, and its
//! errors narrowed to the errno values the protocol allows.

use crate::proto;
use std::io;
use tiercache_frontend::Export;

/// Maps an export error to the NBD errno sent to the client: the Linux
/// errno of [`tiercache_frontend::errno`] (the one mapping both front ends
/// use) narrowed to the values the NBD spec allows (`EPERM`/`EACCES`/
/// `EROFS` -> `EPERM`, `ENOSPC`/`EDQUOT`/`EFBIG` -> `ENOSPC`, `EIO`,
/// `ENOMEM`, `EINVAL`, `EOVERFLOW`, `ESHUTDOWN` as they are, anything else
/// -> `EIO`).
pub fn nbd_errno(e: &io::Error) -> u32 {
    proto::wire_errno(tiercache_frontend::errno(e))
}

/// Transmission flags advertised for `export`, given whether structured
/// replies were negotiated (`NBD_FLAG_SEND_DF` requires them).
pub fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut f = proto::FLAG_HAS_FLAGS;
    if export.read_only() {
        f |= proto::FLAG_READ_ONLY;
    } else {
        if export.can_trim() {
            f |= proto::FLAG_SEND_TRIM;
        }
        if export.can_write_zeroes() {
            f |= proto::FLAG_SEND_WRITE_ZEROES;
        }
    }
    if export.can_flush() {
        f |= proto::FLAG_SEND_FLUSH;
        if export.can_fua() && !export.read_only() {
            f |= proto::FLAG_SEND_FUA;
        }
    }
    if export.is_rotational() {
        f |= proto::FLAG_ROTATIONAL;
    }
    if export.can_multi_conn() {
        f |= proto::FLAG_CAN_MULTI_CONN;
    }
    if structured {
        // Reads are always answered with a single data chunk.
        f |= proto::FLAG_SEND_DF;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::EDQUOT)),
            proto::ENOSPC
        );
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::EROFS)),
            proto::EPERM
        );
        assert_eq!(
            nbd_errno(&io::Error::from_raw_os_error(libc::ENOENT)),
            proto::EIO
        );
        assert_eq!(nbd_errno(&io::Error::other("x")), proto::EIO);
        // A device error wrapped by the export keeps its errno.
        #[derive(Debug)]
        struct Wrapped(io::Error);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "backing device: {}", self.0)
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let full = io::Error::other(Wrapped(io::Error::from_raw_os_error(libc::ENOSPC)));
        assert_eq!(nbd_errno(&full), proto::ENOSPC);
        assert_eq!(
            nbd_errno(&io::Error::new(io::ErrorKind::InvalidInput, "x")),
            proto::EINVAL
        );
        // The frontend's refusal of a range is EINVAL on the wire too.
        let refused = tiercache_frontend::RequestError::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(nbd_errno(&refused.into()), proto::EINVAL);
    }
}
