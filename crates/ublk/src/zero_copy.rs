//! Zero copy (Linux 6.16 and later): the kernel registers each request's
//! own pages in the queue thread's buffer table before it hands the
//! request over (`UBLK_F_AUTO_BUF_REG`), and unregisters them at its
//! commit. A hit or a bypassed read is then read from the cache or
//! backing file straight into the client's pages (`READ_FIXED` at the
//! request's index), with no copy through the tag's buffer: on 6.12 that
//! copy (`ublk_copy_user_pages`, with its page pinning) was a fifth of the
//! queue thread's time in the VM lab's pool.
//!
//! What the engine computes in memory (writes, whose bytes it checksums
//! and journals; reads served by a worker or from a RAM cache; a miss's
//! bytes read into its scratch buffer) moves between the tag's buffer and
//! the request by user copy: `pread`/`pwrite` on `/dev/ublkcN` at the
//! request's offset ([`user_copy_offset`]), one copy, as on 6.12.
//!
//! Contract: a device made in this mode ([`ZERO_COPY_FLAGS`]) is served
//! in it by every server that takes it over (the mode is the device's,
//! read from its flags); its tags' indices in the table are left empty
//! for the kernel; a request the kernel could not register arrives with
//! [`NEED_REG_BUF`] and is served through the tag's buffer alone.
//!
//! On Linux 6.17 a read into a registered request is never issued
//! ([`reads_into_requests_are_safe`]): there every read is served through
//! the tag's buffer and put into the request by user copy.

use std::io;
use std::os::fd::RawFd;

/// Device flags (linux/ublk_cmd.h): `UBLK_F_SUPPORT_ZERO_COPY`.
const F_SUPPORT_ZERO_COPY: u64 = 1 << 0;
/// `UBLK_F_USER_COPY`: `pread`/`pwrite` on the character device.
const F_USER_COPY: u64 = 1 << 7;
/// `UBLK_F_AUTO_BUF_REG`: requests registered in the ring's table.
pub(crate) const F_AUTO_BUF_REG: u64 = 1 << 11;

/// The flag sets to try for a zero-copy device, in order (kernels differ
/// in which combinations they take and which of them allow user copy).
pub(crate) const ZERO_COPY_FLAGS: [u64; 2] = [
    F_AUTO_BUF_REG | F_SUPPORT_ZERO_COPY | F_USER_COPY,
    F_AUTO_BUF_REG | F_SUPPORT_ZERO_COPY,
];

/// `UBLK_AUTO_BUF_REG_FALLBACK`: a request the kernel cannot register
/// is still handed over, flagged [`NEED_REG_BUF`], instead of failed.
const AUTO_BUF_REG_FALLBACK: u64 = 1 << 0;

/// `UBLK_IO_F_NEED_REG_BUF` in a descriptor's `op_flags`.
pub(crate) const NEED_REG_BUF: u32 = 1 << 17;

/// `UBLKSRV_IO_BUF_OFFSET`, `UBLK_TAG_OFF`, `UBLK_QID_OFF`.
const IO_BUF_OFFSET: u64 = 0x8000_0000;
const TAG_OFF: u32 = 25;
const QID_OFF: u32 = TAG_OFF + 16;

/// True if a device with these flags is served in zero-copy mode.
pub(crate) fn is_zero_copy(dev_flags: u64) -> bool {
    dev_flags & F_AUTO_BUF_REG != 0
}

/// The `addr` of a fetch or commit SQE: register tag's next request at
/// `index` of the ring's table (`struct ublk_auto_buf_reg`), with the
/// fallback.
pub(crate) fn auto_buf_reg_addr(index: u16) -> u64 {
    u64::from(index) | AUTO_BUF_REG_FALLBACK << 16
}

/// True if a file read may land in a registered request's pages on the
/// kernel `release` (`uname -r`). Not on 6.17: its block layer's new
/// scatterlist mapping (`__blk_rq_map_sg`) can count fewer segments for
/// such a read than it then maps (its `WARN_ON(nsegs >
/// blk_rq_nr_phys_segments)`), and the read's data lands in the wrong
/// place. In the VM lab, fio's mixed-size verify through a zero-copy
/// device read back other offsets' data, and the guest later oopsed in
/// `ublk_copy_user_pages`; the same job passes on 6.12 (copying) and on
/// 6.18 (zero copy). An unparsable release is trusted.
pub(crate) fn reads_into_requests_are_safe(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    !matches!((major, minor), (Some(6), Some(17)))
}

/// The running kernel's release (`uname -r`, or "" if unknown) and
/// whether reads may land in registered requests on it
/// ([`reads_into_requests_are_safe`]); read once per process.
pub(crate) fn running_kernel() -> &'static (String, bool) {
    static KERNEL: std::sync::OnceLock<(String, bool)> = std::sync::OnceLock::new();
    KERNEL.get_or_init(|| {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let safe = reads_into_requests_are_safe(&release);
        (release, safe)
    })
}

/// Where request (`qid`, `tag`)'s data starts for user copy.
pub(crate) fn user_copy_offset(qid: u16, tag: u16) -> u64 {
    IO_BUF_OFFSET | u64::from(qid) << QID_OFF | u64::from(tag) << TAG_OFF
}

/// Copies `data` into request (`qid`, `tag`)'s pages.
pub(crate) fn copy_to_request(cdev: RawFd, qid: u16, tag: u16, data: &[u8]) -> io::Result<()> {
    let base = user_copy_offset(qid, tag);
    whole(data.len(), "the request took no more bytes", |done| {
        // SAFETY: the pointer and length name the unwritten rest of
        // `data`, which the kernel only reads.
        unsafe {
            libc::pwrite(
                cdev,
                data[done..].as_ptr().cast(),
                data.len() - done,
                (base + done as u64) as libc::off_t,
            )
        }
    })
}

/// Copies request (`qid`, `tag`)'s data into `buf`.
pub(crate) fn copy_from_request(cdev: RawFd, qid: u16, tag: u16, buf: &mut [u8]) -> io::Result<()> {
    let base = user_copy_offset(qid, tag);
    let len = buf.len();
    whole(len, "the request had fewer bytes", |done| {
        // SAFETY: the pointer and length name the unfilled rest of `buf`,
        // which is ours to write.
        unsafe {
            libc::pread(
                cdev,
                buf[done..].as_mut_ptr().cast(),
                len - done,
                (base + done as u64) as libc::off_t,
            )
        }
    })
}

/// Runs `step(bytes done so far)` (a `pread` or `pwrite`) until `len`
/// bytes are moved; a step that moves nothing fails with `short`.
fn whole(len: usize, short: &str, mut step: impl FnMut(usize) -> isize) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        match step(done) {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::other(short.to_string())),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_into_requests_are_refused_on_6_17_alone() {
        for release in ["6.17.13+deb13-amd64", "6.17.0", "6.17-rc3"] {
            assert!(!reads_into_requests_are_safe(release), "{release}");
        }
        for release in [
            "6.16.1",
            "6.18.15+deb13-amd64",
            "6.1.7",
            "6.170.1",
            "7.0",
            "",
            "x",
        ] {
            assert!(reads_into_requests_are_safe(release), "{release}");
        }
    }

    #[test]
    fn user_copy_offsets_follow_the_driver_layout() {
        assert_eq!(user_copy_offset(0, 0), 0x8000_0000);
        assert_eq!(user_copy_offset(0, 1), 0x8000_0000 + (1 << 25));
        assert_eq!(user_copy_offset(1, 0), 0x8000_0000 + (1 << 41));
        assert_eq!(user_copy_offset(3, 7), 0x8000_0000 + (3 << 41) + (7 << 25));
    }

    #[test]
    fn the_auto_registration_carries_index_and_fallback() {
        assert_eq!(auto_buf_reg_addr(5), 5 | 1 << 16);
        assert_eq!(
            auto_buf_reg_addr(u16::MAX) >> 24,
            0,
            "reserved bits stay zero"
        );
        assert!(is_zero_copy(ZERO_COPY_FLAGS[0]) && is_zero_copy(ZERO_COPY_FLAGS[1]));
        assert!(!is_zero_copy(F_SUPPORT_ZERO_COPY | F_USER_COPY));
    }

    #[test]
    fn copies_report_a_file_that_refuses() {
        let f = tempfile::tempfile().unwrap();
        use std::os::fd::AsRawFd;
        // A regular file at the request offset: the write lands (2 GiB in),
        // the read of a hole reads zeroes; a closed descriptor fails.
        assert!(copy_to_request(f.as_raw_fd(), 0, 0, b"abc").is_ok());
        let mut back = [0u8; 3];
        copy_from_request(f.as_raw_fd(), 0, 0, &mut back).unwrap();
        assert_eq!(&back, b"abc");
        assert!(copy_to_request(-1, 0, 0, b"abc").is_err());
        assert!(copy_from_request(-1, 0, 0, &mut back).is_err());
    }
}
