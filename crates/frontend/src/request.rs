//! The one validation of a request's range, called by every front end
//! before it touches the export (nbdkit's `backend_valid_range` and the
//! checks of its `validate_request`, done once).

use crate::export::Export;
use std::fmt;
use std::io;

/// What a request does with its range. Reads and writes carry data through
/// the front end's buffers, so they are bounded by [`Limits::max_data`];
/// trims and write-zeroes carry none and are not (Linux's NBD client sends
/// write-zeroes of up to 4 GiB, the kernel discards of up to the device's
/// discard limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// [`Export::read`].
    Read,
    /// [`Export::write`].
    Write,
    /// [`Export::trim`].
    Trim,
    /// [`Export::write_zeroes`].
    WriteZeroes,
}

impl Access {
    /// Whether the request's bytes pass through the front end's buffers
    /// (read, write), which bounds its length.
    pub fn carries_data(self) -> bool {
        matches!(self, Access::Read | Access::Write)
    }
}

/// What a request's range must fit: the export's size and block sizes and
/// what the front end can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes.
    pub size: u64,
    /// Offsets and lengths are multiples of this (the minimum block size;
    /// 0 is taken as 1).
    pub min_block: u32,
    /// The longest read or write: the export's maximum block size, lowered
    /// to what the front end advertised or can buffer.
    pub max_data: u32,
}

impl Limits {
    /// The limits `export` states itself: its size, minimum and maximum
    /// block sizes.
    pub fn of(export: &dyn Export) -> Limits {
        let b = export.block_size_constraints();
        Limits {
            size: export.size(),
            min_block: b.min,
            max_data: b.max,
        }
    }

    /// These limits with reads and writes also bounded by `max` bytes (a
    /// front end's advertised maximum or its buffer).
    pub fn with_max_data(self, max: u64) -> Limits {
        Limits {
            max_data: u64::from(self.max_data).min(max) as u32,
            ..self
        }
    }
}

/// A valid request: what the front end does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Call the export on `offset..offset + len` (`len > 0`).
    Range {
        /// First byte.
        offset: u64,
        /// Bytes, at least one.
        len: u64,
    },
    /// A zero-length request inside the export: it asks for nothing, so the
    /// front end answers it with success without calling the export
    /// (export methods never see a zero length).
    Empty,
}

/// Why a request's range is refused. Every one is `EINVAL`
/// ([`RequestError::errno`]); a protocol may say more (NBD answers a write
/// beyond the end with `ENOSPC`, as its spec asks and nbdkit does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// A read or write longer than [`Limits::max_data`]. Checked first:
    /// such a request is refused whatever its range.
    TooLong {
        /// Requested bytes.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// Offset or length not a multiple of the minimum block size.
    Misaligned {
        /// Requested offset.
        offset: u64,
        /// Requested bytes.
        len: u64,
        /// The minimum block size.
        min_block: u32,
    },
    /// The range reaches past the end of the export (or past 2^64).
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested bytes.
        len: u64,
        /// Export size in bytes.
        size: u64,
    },
}

impl RequestError {
    /// The Linux errno of the refusal: `EINVAL` for all of them.
    pub fn errno(&self) -> i32 {
        libc::EINVAL
    }

    /// A fixed description of the kind of refusal (for rate-limited logs
    /// and protocol messages).
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::TooLong { .. } => "length exceeds the maximum block size",
            RequestError::Misaligned { .. } => "request not aligned to the minimum block size",
            RequestError::OutOfRange { .. } => "request beyond the end of the export",
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RequestError::TooLong { len, max } => {
                write!(f, "{} ({len} bytes, limit {max})", self.reason())
            }
            RequestError::Misaligned {
                offset,
                len,
                min_block,
            } => write!(
                f,
                "{} (offset {offset}, length {len}, minimum block {min_block})",
                self.reason()
            ),
            RequestError::OutOfRange { offset, len, size } => write!(
                f,
                "{} (offset {offset}, length {len}, size {size})",
                self.reason()
            ),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<RequestError> for io::Error {
    /// An `InvalidInput` error carrying the refusal ([`crate::errno`] maps
    /// it to `EINVAL`).
    fn from(e: RequestError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// Checks a request of `access` on `offset..offset + len` against
/// `limits`, in this order: a read or write longer than `max_data`
/// ([`RequestError::TooLong`]), an offset or length not a multiple of
/// `min_block` ([`RequestError::Misaligned`]), a range past the end
/// ([`RequestError::OutOfRange`]); then a zero length inside the export
/// is [`Checked::Empty`]. Pure; never panics.
///
/// Both front ends call it before touching the export, so an export only
/// ever sees requests that passed (see [`Export`]'s contract).
pub fn check_request(
    limits: &Limits,
    access: Access,
    offset: u64,
    len: u64,
) -> Result<Checked, RequestError> {
    if access.carries_data() && len > u64::from(limits.max_data) {
        return Err(RequestError::TooLong {
            len,
            max: limits.max_data,
        });
    }
    let min = u64::from(limits.min_block.max(1));
    if offset % min != 0 || len % min != 0 {
        return Err(RequestError::Misaligned {
            offset,
            len,
            min_block: limits.min_block,
        });
    }
    let in_range = offset
        .checked_add(len)
        .is_some_and(|end| end <= limits.size);
    if !in_range {
        return Err(RequestError::OutOfRange {
            offset,
            len,
            size: limits.size,
        });
    }
    Ok(if len == 0 {
        Checked::Empty
    } else {
        Checked::Range { offset, len }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        size: 1 << 20,
        min_block: 512,
        max_data: 64 << 10,
    };

    #[test]
    fn ranges_inside_the_export_pass() {
        assert_eq!(
            check_request(&L, Access::Read, (1 << 20) - 512, 512),
            Ok(Checked::Range {
                offset: (1 << 20) - 512,
                len: 512
            })
        );
        // No maximum without data: a trim of the whole export.
        assert_eq!(
            check_request(&L, Access::Trim, 0, 1 << 20),
            Ok(Checked::Range {
                offset: 0,
                len: 1 << 20
            })
        );
    }

    #[test]
    fn zero_length_asks_nothing_but_must_be_in_range() {
        assert_eq!(check_request(&L, Access::Read, 0, 0), Ok(Checked::Empty));
        assert_eq!(
            check_request(&L, Access::Write, 1 << 20, 0),
            Ok(Checked::Empty)
        );
        assert!(matches!(
            check_request(&L, Access::Write, 2 << 20, 0),
            Err(RequestError::OutOfRange { .. })
        ));
    }

    #[test]
    fn refusals_in_order() {
        // Too long beats misaligned and out of range.
        assert_eq!(
            check_request(&L, Access::Write, 1, 1 << 30),
            Err(RequestError::TooLong {
                len: 1 << 30,
                max: 64 << 10
            })
        );
        assert!(matches!(
            check_request(&L, Access::WriteZeroes, 1, 512),
            Err(RequestError::Misaligned { .. })
        ));
        assert!(matches!(
            check_request(&L, Access::Read, 0, 100),
            Err(RequestError::Misaligned { .. })
        ));
        let e = check_request(&L, Access::Trim, u64::MAX - 511, 512).unwrap_err();
        assert!(matches!(e, RequestError::OutOfRange { .. }));
        assert_eq!(e.errno(), libc::EINVAL);
        assert_eq!(crate::errno(&io::Error::from(e)), libc::EINVAL);
    }

    #[test]
    fn limits_follow_the_export_and_the_front_end() {
        let m = crate::MemExport::new(1 << 20);
        let l = Limits::of(&m);
        assert_eq!(
            (l.size, l.min_block, l.max_data),
            (1 << 20, 1, crate::DEFAULT_MAX_BLOCK)
        );
        assert_eq!(l.with_max_data(4096).max_data, 4096);
        assert_eq!(l.with_max_data(u64::MAX).max_data, crate::DEFAULT_MAX_BLOCK);
    }
}
