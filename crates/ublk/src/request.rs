//! The pure half of the front end: a ublk IO descriptor decoded into a
//! [`Request`], and a [`Request`] carried out on an [`Export`]. Nothing here
//! talks to the kernel, so all of it is tested on any host.

use std::io;
use tiercache_frontend::{check_request, errno, Access, Checked, Export, Limits, RequestError};

/// ublk IO opcodes and flags (`include/uapi/linux/ublk_cmd.h`; stable ABI
/// since Linux 6.0). Spelled out here so that this module, and its tests,
/// do not depend on the generated bindings.
pub mod op {
    pub const READ: u32 = 0;
    pub const WRITE: u32 = 1;
    pub const FLUSH: u32 = 2;
    pub const DISCARD: u32 = 3;
    pub const WRITE_SAME: u32 = 4;
    pub const WRITE_ZEROES: u32 = 5;
    /// The request must be on stable media when it completes.
    pub const F_FUA: u32 = 1 << 13;
    /// WRITE_ZEROES must leave the range allocated (no deallocation).
    pub const F_NOUNMAP: u32 = 1 << 15;
}

/// Sectors in ublk descriptors are always 512 bytes, whatever the
/// device's logical block size.
pub const SECTOR_SHIFT: u32 = 9;

/// One request from `/dev/ublkbN`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Read `len` bytes at `offset` into the tag's buffer.
    Read { offset: u64, len: u32 },
    /// Write `len` bytes at `offset` from the tag's buffer; `fua`: durable
    /// before completion.
    Write { offset: u64, len: u32, fua: bool },
    /// Make every completed write durable.
    Flush,
    /// The range is no longer needed.
    Discard { offset: u64, len: u64 },
    /// Make the range read as zeroes; `may_trim` unless the kernel said
    /// NOUNMAP.
    WriteZeroes {
        offset: u64,
        len: u64,
        fua: bool,
        may_trim: bool,
    },
}

/// Decodes a ublk IO descriptor's `op_flags`, `start_sector` and
/// `nr_sectors`. Unknown or unsupported opcodes (WRITE_SAME, the zoned
/// operations) give `Err(-EOPNOTSUPP)`, the value to complete them with.
///
/// FLUSH ignores the sector fields (the kernel sends a start sector of
/// `u64::MAX` with it).
pub fn decode(op_flags: u32, start_sector: u64, nr_sectors: u32) -> Result<Request, i32> {
    let op = op_flags & 0xff;
    if op == op::FLUSH {
        return Ok(Request::Flush);
    }
    let offset = start_sector
        .checked_mul(1 << SECTOR_SHIFT)
        .ok_or(-libc::EINVAL)?;
    let bytes = u64::from(nr_sectors) << SECTOR_SHIFT;
    let fua = op_flags & op::F_FUA != 0;
    match op {
        op::READ => Ok(Request::Read {
            offset,
            len: u32::try_from(bytes).map_err(|_| -libc::EINVAL)?,
        }),
        op::WRITE => Ok(Request::Write {
            offset,
            len: u32::try_from(bytes).map_err(|_| -libc::EINVAL)?,
            fua,
        }),
        op::DISCARD => Ok(Request::Discard { offset, len: bytes }),
        op::WRITE_ZEROES => Ok(Request::WriteZeroes {
            offset,
            len: bytes,
            fua,
            may_trim: op_flags & op::F_NOUNMAP == 0,
        }),
        _ => Err(-libc::EOPNOTSUPP),
    }
}

impl Request {
    /// What the request does with which range (`(access, offset, len)`);
    /// None for a flush, which has no range.
    pub fn range(&self) -> Option<(Access, u64, u64)> {
        match *self {
            Request::Read { offset, len } => Some((Access::Read, offset, len.into())),
            Request::Write { offset, len, .. } => Some((Access::Write, offset, len.into())),
            Request::Flush => None,
            Request::Discard { offset, len } => Some((Access::Trim, offset, len)),
            Request::WriteZeroes { offset, len, .. } => Some((Access::WriteZeroes, offset, len)),
        }
    }
}

/// Checks `req` with the one validation both front ends share
/// ([`check_request`]) against `export`'s limits, a read or write also
/// against the tag's buffer of `buf_len` bytes. A flush has no range to
/// check: `Ok(Checked::Empty)` (for a flush, [`execute`] still calls the
/// export). Pure: [`execute`] logs refusals.
pub fn check(export: &dyn Export, req: Request, buf_len: usize) -> Result<Checked, RequestError> {
    match req.range() {
        None => Ok(Checked::Empty),
        Some((access, offset, len)) => {
            let limits = Limits::of(export).with_max_data(buf_len as u64);
            check_request(&limits, access, offset, len)
        }
    }
}

/// Carries out `req` on `export` and returns the value to complete the
/// ublk command with: the byte count for READ and WRITE, 0 for the other
/// operations, a negative errno on failure.
///
/// Errors: a request [`check`] refuses (beyond the device, unaligned,
/// larger than the tag's buffer; the kernel never sends one) completes
/// with the refusal's errno, `-EINVAL`, without calling the export; an
/// error from the export completes with [`tiercache_frontend::errno`]
/// negated (the errno the device gave, e.g. `-EIO`, `-ENOSPC` for a full
/// device; `-EIO` when there is none), which the block layer turns into
/// the matching status. A zero-length request succeeds without calling
/// the export. Operations the export does not advertise (flush without
/// `can_flush`, discard without `can_trim`) succeed without calling it:
/// the kernel only sends them if the device parameters said so, and they
/// promise nothing then.
pub fn execute(export: &dyn Export, req: Request, buf: &mut [u8]) -> i32 {
    let call = match check(export, req, buf.len()) {
        Ok(Checked::Range { .. }) => true,
        Ok(Checked::Empty) => matches!(req, Request::Flush),
        Err(e) => {
            log::warn!(
                "ublk: {req:?} refused: {e} (device {} bytes, tag buffer {} bytes)",
                export.size(),
                buf.len()
            );
            return -e.errno();
        }
    };
    if !call {
        return 0; // zero bytes: nothing to read or write
    }
    let result: io::Result<i32> = match req {
        Request::Read { offset, len } => export
            .read(offset, &mut buf[..len as usize])
            .map(|()| len as i32),
        Request::Write { offset, len, fua } => export
            .write(offset, &buf[..len as usize], fua && export.can_fua())
            .map(|()| len as i32),
        Request::Flush => {
            if export.can_flush() {
                export.flush().map(|()| 0)
            } else {
                Ok(0)
            }
        }
        Request::Discard { offset, len } => {
            if export.can_trim() {
                export.trim(offset, len).map(|()| 0)
            } else {
                Ok(0)
            }
        }
        Request::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => export
            .write_zeroes(offset, len, fua && export.can_fua(), may_trim)
            .map(|()| 0),
    };
    match result {
        Ok(n) => n,
        Err(e) => {
            log::debug!("ublk: {req:?} failed: {e}");
            -errno(&e)
        }
    }
}

/// [`execute`] for a read the export can answer at once
/// ([`Export::read_if_quick`], a cache hit): the same result `execute`
/// would give. None for any other request, a read [`check`] does not pass
/// as a range (`execute` explains or answers it), or a read that must
/// wait: then `execute` it on a worker thread.
pub fn execute_if_quick(export: &dyn Export, req: Request, buf: &mut [u8]) -> Option<i32> {
    let Request::Read { offset, len } = req else {
        return None;
    };
    let Ok(Checked::Range { .. }) = check(export, req, buf.len()) else {
        return None;
    };
    Some(
        match export.read_if_quick(offset, &mut buf[..len as usize])? {
            Ok(()) => len as i32,
            Err(e) => {
                log::debug!("ublk: {req:?} failed: {e}");
                -errno(&e)
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use tiercache_frontend::MemExport;

    /// Records every call, delegates to a [`MemExport`], and fails on
    /// demand.
    struct Recorder {
        inner: MemExport,
        calls: Mutex<Vec<String>>,
        fail: bool,
        fua: bool,
    }

    impl Recorder {
        fn new(size: u64) -> Recorder {
            Recorder {
                inner: MemExport::new(size),
                calls: Mutex::new(Vec::new()),
                fail: false,
                fua: true,
            }
        }
        fn log(&self, s: String) -> io::Result<()> {
            self.calls.lock().push(s);
            if self.fail {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            } else {
                Ok(())
            }
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock())
        }
    }

    impl Export for Recorder {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.log(format!("read {offset} {}", buf.len()))?;
            self.inner.read(offset, buf)
        }
        fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
            self.log(format!("write {offset} {} fua={fua}", data.len()))?;
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> io::Result<()> {
            self.log("flush".into())
        }
        fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
            self.log(format!("trim {offset} {len}"))?;
            self.inner.trim(offset, len)
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()> {
            self.log(format!(
                "write_zeroes {offset} {len} fua={fua} may_trim={may_trim}"
            ))?;
            self.inner.write_zeroes(offset, len, fua, may_trim)
        }
        fn can_trim(&self) -> bool {
            true
        }
        fn can_fua(&self) -> bool {
            self.fua
        }
    }

    #[test]
    fn opcodes_match_the_kernel_header() {
        use libublk::sys;
        assert_eq!(op::READ, sys::UBLK_IO_OP_READ);
        assert_eq!(op::WRITE, sys::UBLK_IO_OP_WRITE);
        assert_eq!(op::FLUSH, sys::UBLK_IO_OP_FLUSH);
        assert_eq!(op::DISCARD, sys::UBLK_IO_OP_DISCARD);
        assert_eq!(op::WRITE_SAME, sys::UBLK_IO_OP_WRITE_SAME);
        assert_eq!(op::WRITE_ZEROES, sys::UBLK_IO_OP_WRITE_ZEROES);
        assert_eq!(op::F_FUA, sys::UBLK_IO_F_FUA);
        assert_eq!(op::F_NOUNMAP, sys::UBLK_IO_F_NOUNMAP);
    }

    #[test]
    fn decodes_every_supported_operation() {
        assert_eq!(
            decode(op::READ, 8, 16),
            Ok(Request::Read {
                offset: 4096,
                len: 8192
            })
        );
        assert_eq!(
            decode(op::WRITE | op::F_FUA, 1, 1),
            Ok(Request::Write {
                offset: 512,
                len: 512,
                fua: true
            })
        );
        assert_eq!(
            decode(op::WRITE, 0, 8),
            Ok(Request::Write {
                offset: 0,
                len: 4096,
                fua: false
            })
        );
        assert_eq!(decode(op::FLUSH, 0, 0), Ok(Request::Flush));
        // What Linux 6.12 really sends: the flush request's position is -1.
        assert_eq!(decode(op::FLUSH, u64::MAX, 0), Ok(Request::Flush));
        // Read-ahead carries the failfast flags (bits 8-10).
        assert_eq!(
            decode(0x700, 8, 8),
            Ok(Request::Read {
                offset: 4096,
                len: 4096
            })
        );
        assert_eq!(
            decode(op::DISCARD, 2048, 2048),
            Ok(Request::Discard {
                offset: 1 << 20,
                len: 1 << 20
            })
        );
        assert_eq!(
            decode(op::WRITE_ZEROES, 0, 8),
            Ok(Request::WriteZeroes {
                offset: 0,
                len: 4096,
                fua: false,
                may_trim: true
            })
        );
        assert_eq!(
            decode(op::WRITE_ZEROES | op::F_NOUNMAP | op::F_FUA, 0, 8),
            Ok(Request::WriteZeroes {
                offset: 0,
                len: 4096,
                fua: true,
                may_trim: false
            })
        );
    }

    #[test]
    fn refuses_unsupported_and_absurd_requests() {
        assert_eq!(decode(op::WRITE_SAME, 0, 8), Err(-libc::EOPNOTSUPP));
        assert_eq!(decode(13, 0, 8), Err(-libc::EOPNOTSUPP)); // zone append
        assert_eq!(decode(op::READ, u64::MAX / 2, 8), Err(-libc::EINVAL));
        // 2^32 - 1 sectors is more than a u32 byte count can say.
        assert_eq!(decode(op::READ, 0, u32::MAX), Err(-libc::EINVAL));
        // ...but a discard that long is fine.
        assert!(decode(op::DISCARD, 0, u32::MAX).is_ok());
    }

    #[test]
    fn each_request_calls_the_matching_export_method() {
        let e = Recorder::new(1 << 20);
        let mut buf = vec![0xabu8; 65536];
        let run = |req, buf: &mut [u8]| execute(&e, req, buf);
        assert_eq!(
            run(
                Request::Write {
                    offset: 4096,
                    len: 8192,
                    fua: false
                },
                &mut buf
            ),
            8192
        );
        assert_eq!(
            run(
                Request::Write {
                    offset: 0,
                    len: 512,
                    fua: true
                },
                &mut buf
            ),
            512
        );
        assert_eq!(run(Request::Flush, &mut buf), 0);
        assert_eq!(
            run(
                Request::Discard {
                    offset: 0,
                    len: 1 << 20
                },
                &mut buf
            ),
            0
        );
        assert_eq!(
            run(
                Request::WriteZeroes {
                    offset: 512,
                    len: 1024,
                    fua: true,
                    may_trim: false
                },
                &mut buf
            ),
            0
        );
        assert_eq!(
            run(
                Request::WriteZeroes {
                    offset: 0,
                    len: 4096,
                    fua: false,
                    may_trim: true
                },
                &mut buf
            ),
            0
        );
        assert_eq!(
            e.take(),
            [
                "write 4096 8192 fua=false",
                "write 0 512 fua=true",
                "flush",
                "trim 0 1048576",
                "write_zeroes 512 1024 fua=true may_trim=false",
                "write_zeroes 0 4096 fua=false may_trim=true",
            ]
        );
    }

    #[test]
    fn reads_fill_the_buffer_with_what_was_written() {
        let e = Recorder::new(1 << 20);
        let mut data: Vec<u8> = (0..12288u32).map(|i| (i * 7 % 251) as u8).collect();
        let write = Request::Write {
            offset: 65536 - 4096,
            len: 12288,
            fua: false,
        };
        assert_eq!(execute(&e, write, &mut data), 12288);
        let mut back = vec![0u8; 16384];
        let read = Request::Read {
            offset: 65536 - 4096,
            len: 12288,
        };
        assert_eq!(execute(&e, read, &mut back), 12288);
        assert_eq!(back[..12288], data[..]);
        // Only `len` bytes of the (larger) tag buffer are touched.
        assert!(back[12288..].iter().all(|&b| b == 0));
    }

    #[test]
    fn fua_is_dropped_when_the_export_cannot_honour_it() {
        let mut e = Recorder::new(1 << 20);
        e.fua = false;
        let mut buf = vec![0u8; 4096];
        execute(
            &e,
            Request::Write {
                offset: 0,
                len: 4096,
                fua: true,
            },
            &mut buf,
        );
        assert_eq!(e.take(), ["write 0 4096 fua=false"]);
    }

    #[test]
    fn export_errors_keep_their_errno_and_bad_ranges_are_einval() {
        let mut e = Recorder::new(1 << 20);
        e.fail = true;
        let mut buf = vec![0u8; 4096];
        for req in [
            Request::Read {
                offset: 0,
                len: 4096,
            },
            Request::Write {
                offset: 0,
                len: 4096,
                fua: false,
            },
            Request::Flush,
            Request::Discard {
                offset: 0,
                len: 4096,
            },
            Request::WriteZeroes {
                offset: 0,
                len: 4096,
                fua: false,
                may_trim: true,
            },
        ] {
            // The full device's ENOSPC (Recorder's failure) reaches the
            // kernel as it is, not as a blanket EIO.
            assert_eq!(execute(&e, req, &mut buf), -libc::ENOSPC, "{req:?}");
        }
        // An error without an errno is EIO.
        assert_eq!(
            errno(&io::Error::other("device gone")),
            libc::EIO,
            "the one mapping"
        );
        e.fail = false;
        e.take();
        let past_end = Request::Read {
            offset: (1 << 20) - 512,
            len: 1024,
        };
        assert_eq!(execute(&e, past_end, &mut buf), -libc::EINVAL);
        let too_big_for_buffer = Request::Write {
            offset: 0,
            len: 8192,
            fua: false,
        };
        assert_eq!(execute(&e, too_big_for_buffer, &mut buf), -libc::EINVAL);
        let discard_past_end = Request::Discard {
            offset: 0,
            len: 2 << 20,
        };
        assert_eq!(execute(&e, discard_past_end, &mut buf), -libc::EINVAL);
        // Zero bytes ask nothing of the export.
        let empty = Request::Write {
            offset: 4096,
            len: 0,
            fua: true,
        };
        assert_eq!(execute(&e, empty, &mut buf), 0);
        let empty_read = Request::Read {
            offset: 4096,
            len: 0,
        };
        assert_eq!(execute_if_quick(&e, empty_read, &mut buf), None);
        assert!(e.take().is_empty(), "nothing reached the export");
    }

    #[test]
    fn decode_then_execute_round_trip() {
        let e = Recorder::new(1 << 20);
        let mut buf = vec![0x5au8; 4096];
        let req = decode(op::WRITE | op::F_FUA, 16, 8).unwrap();
        assert_eq!(execute(&e, req, &mut buf), 4096);
        let req = decode(op::WRITE_ZEROES | op::F_NOUNMAP, 16, 1).unwrap();
        assert_eq!(execute(&e, req, &mut buf), 0);
        let mut back = vec![0u8; 4096];
        let req = decode(op::READ, 16, 8).unwrap();
        assert_eq!(execute(&e, req, &mut back), 4096);
        assert!(back[..512].iter().all(|&b| b == 0));
        assert!(back[512..].iter().all(|&b| b == 0x5a));
        assert_eq!(
            e.take(),
            [
                "write 8192 4096 fua=true",
                "write_zeroes 8192 512 fua=false may_trim=false",
                "read 8192 4096"
            ]
        );
    }
}
