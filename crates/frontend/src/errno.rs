//! The one mapping from an export's error to a Linux errno.

use std::io;

/// The Linux errno for an error returned by an [`crate::Export`]: what
/// ublk completes the request with (negated), and what the NBD server
/// narrows to the values its wire allows.
///
/// * An errno the error carries, or the first error of its source chain
///   that has one (an export may wrap the device's error, as the engine
///   does), is kept as it is: a device's `EIO` stays `EIO`, a full device's
///   `ENOSPC` stays `ENOSPC`, `EROFS` stays `EROFS`.
/// * Otherwise the error's kind decides: `InvalidInput` (a request out of
///   range or misaligned, e.g. a [`crate::RequestError`] or the engine's
///   `OutOfRange`/`Misaligned`) -> `EINVAL`; `PermissionDenied` -> `EPERM`;
///   `OutOfMemory` -> `ENOMEM`; anything else (a device failure without an
///   errno, a panicking export) -> `EIO`.
///
/// `ENOSPC` therefore only ever comes from a device that is full; an
/// out-of-range request is `EINVAL`.
pub fn errno(e: &io::Error) -> i32 {
    if let Some(code) = os_error_code(e) {
        return code;
    }
    match e.kind() {
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::PermissionDenied => libc::EPERM,
        io::ErrorKind::OutOfMemory => libc::ENOMEM,
        _ => libc::EIO,
    }
}

/// The operating system's error code of `e` or of the first error in its
/// source chain that has one.
fn os_error_code(e: &io::Error) -> Option<i32> {
    if let Some(code) = e.raw_os_error() {
        return Some(code);
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = e
        .get_ref()
        .map(|inner| inner as &(dyn std::error::Error + 'static));
    while let Some(err) = next {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(|io| io.raw_os_error())
        {
            return Some(code);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An export's error wrapping a device's, as the engine's do.
    #[derive(Debug)]
    struct Wrapped(Option<io::Error>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "backing device: {:?}", self.0)
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.0.as_ref().map(|e| e as _)
        }
    }

    #[test]
    fn carried_errnos_are_kept() {
        for code in [
            libc::EIO,
            libc::ENOSPC,
            libc::EROFS,
            libc::EDQUOT,
            libc::ENOENT,
        ] {
            assert_eq!(errno(&io::Error::from_raw_os_error(code)), code);
        }
        let full = io::Error::other(Wrapped(Some(io::Error::from_raw_os_error(libc::ENOSPC))));
        assert_eq!(errno(&full), libc::ENOSPC);
        // The kind of the outer error does not hide the device's errno.
        let failed = io::Error::new(
            io::ErrorKind::InvalidInput,
            Wrapped(Some(io::Error::from_raw_os_error(libc::EIO))),
        );
        assert_eq!(errno(&failed), libc::EIO);
    }

    #[test]
    fn kinds_decide_without_an_errno() {
        // The engine's OutOfRange/Misaligned become InvalidInput errors.
        let out_of_range = io::Error::new(io::ErrorKind::InvalidInput, Wrapped(None));
        assert_eq!(errno(&out_of_range), libc::EINVAL);
        assert_eq!(
            errno(&io::Error::new(io::ErrorKind::PermissionDenied, "x")),
            libc::EPERM
        );
        assert_eq!(
            errno(&io::Error::new(io::ErrorKind::OutOfMemory, "x")),
            libc::ENOMEM
        );
        assert_eq!(errno(&io::Error::other("export panicked")), libc::EIO);
        assert_eq!(errno(&io::Error::other(Wrapped(None))), libc::EIO);
    }
}
