//! One device queue's command channel with the kernel's ublk driver,
//! spoken over a queue thread's io_uring: `FETCH_REQ` posts a tag's
//! buffer and resolves when the kernel hands that tag a request;
//! `COMMIT_AND_FETCH_REQ` completes the request and waits for the tag's
//! next one. The request itself is read from the queue's IO descriptors,
//! which the driver shares with the server (a read-only mapping of
//! `/dev/ublkcN`).
//!
//! Contract: every command of a queue comes from the one thread serving
//! it (the driver refuses others); a tag has at most one command in
//! flight; the buffer a command names is the tag's, and lives until the
//! queue is down.

use crate::ring::QueueRing;
use crate::zero_copy;
use io_uring::{opcode, squeue, types};
use libublk::io::UblkDev;
use libublk::sys;
use std::io;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;

/// The queue has been stopped: no request will come for the tag.
#[derive(Debug)]
pub(crate) struct QueueDown(pub(crate) i32);

/// One queue of one device, as its serving thread sees it.
pub(crate) struct DeviceQueue {
    /// Holds `/dev/ublkcN` open for the mapping and the commands.
    dev: Arc<UblkDev>,
    qid: u16,
    depth: u16,
    /// The driver's IO descriptors, one per tag.
    iods: *const sys::ublksrv_io_desc,
    map_len: usize,
    /// Commands take the ioctl-encoded opcodes.
    ioctl_encode: bool,
    /// Zero copy (`zero_copy.rs`): tag `t`'s requests are registered at
    /// index `base + t` of the thread's buffer table. None: the kernel
    /// copies each request's data through the tag's buffer.
    zero_copy_base: Option<u16>,
    /// With zero copy, file reads may land in the requests' pages
    /// ([`zero_copy::reads_into_requests_are_safe`]).
    reads_into_requests: bool,
}

impl DeviceQueue {
    /// Maps queue `qid`'s IO descriptors of `dev`; with `zero_copy_base`,
    /// its commands ask the kernel to register each request at that base
    /// plus its tag.
    pub(crate) fn map(
        dev: Arc<UblkDev>,
        qid: u16,
        zero_copy_base: Option<u16>,
    ) -> io::Result<DeviceQueue> {
        let depth = dev.dev_info.queue_depth;
        let page = 4096usize;
        let desc = std::mem::size_of::<sys::ublksrv_io_desc>();
        let map_len = (usize::from(depth) * desc).div_ceil(page) * page;
        let stride = (sys::UBLK_MAX_QUEUE_DEPTH as usize * desc).div_ceil(page) * page;
        let offset = sys::UBLKSRV_CMD_BUF_OFFSET as usize + usize::from(qid) * stride;
        // SAFETY: a fresh read-only shared mapping of the character
        // device's descriptor area for this queue (the layout the driver
        // documents: UBLKSRV_CMD_BUF_OFFSET, a maximal queue's area per
        // queue); the result is checked, and unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                dev.tgt.fds[0],
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DeviceQueue {
            ioctl_encode: dev.dev_info.flags & u64::from(sys::UBLK_F_CMD_IOCTL_ENCODE) != 0,
            dev,
            qid,
            depth,
            iods: p.cast(),
            map_len,
            zero_copy_base,
            reads_into_requests: zero_copy_base.is_some() && zero_copy::running_kernel().1,
        })
    }

    pub(crate) fn qid(&self) -> u16 {
        self.qid
    }

    pub(crate) fn depth(&self) -> u16 {
        self.depth
    }

    pub(crate) fn dev_id(&self) -> u32 {
        self.dev.dev_info.dev_id
    }

    /// Tag `tag`'s current request (valid from its fetch's completion to
    /// its commit).
    pub(crate) fn iod(&self, tag: u16) -> sys::ublksrv_io_desc {
        assert!(tag < self.depth);
        // SAFETY: `tag < depth`, within the mapping; the driver writes a
        // descriptor before completing the tag's fetch, so it is stable
        // while we read it.
        unsafe { std::ptr::read_volatile(self.iods.add(usize::from(tag))) }
    }

    /// Posts tag `tag` with its buffer `buf`, and waits for its first
    /// request.
    ///
    /// # Safety
    /// `buf` is the tag's buffer of `max_io_buf_bytes`, alive until the
    /// queue is down; the kernel copies a request's data into and out of
    /// it.
    pub(crate) async unsafe fn fetch(
        &self,
        ring: &Rc<QueueRing>,
        tag: u16,
        buf: *mut u8,
    ) -> Result<(), QueueDown> {
        // SAFETY: the caller's.
        unsafe { self.command(ring, sys::UBLK_U_IO_FETCH_REQ, tag, buf, 0) }.await
    }

    /// Completes tag `tag`'s request with `result` (bytes or `-errno`) and
    /// waits for its next request.
    ///
    /// # Safety
    /// As [`DeviceQueue::fetch`].
    pub(crate) async unsafe fn commit_and_fetch(
        &self,
        ring: &Rc<QueueRing>,
        tag: u16,
        buf: *mut u8,
        result: i32,
    ) -> Result<(), QueueDown> {
        // SAFETY: the caller's.
        unsafe { self.command(ring, sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ, tag, buf, result) }.await
    }

    /// The SQE of [`DeviceQueue::commit_and_fetch`], for a caller that
    /// chains it after the request's reads ([`QueueRing::push_chain`]);
    /// [`next_request`] reads its result.
    ///
    /// # Safety
    /// As [`DeviceQueue::fetch`], once the SQE is pushed.
    pub(crate) unsafe fn commit_sqe(&self, tag: u16, buf: *mut u8, result: i32) -> squeue::Entry {
        self.command_sqe(sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ, tag, buf, result)
    }

    async unsafe fn command(
        &self,
        ring: &Rc<QueueRing>,
        op: u32,
        tag: u16,
        buf: *mut u8,
        result: i32,
    ) -> Result<(), QueueDown> {
        let sqe = self.command_sqe(op, tag, buf, result);
        // SAFETY: the command names the tag's buffer, which the caller
        // keeps alive until the queue is down; the device file lives in
        // `self.dev`, which the tasks keep until then too.
        next_request(unsafe { ring.push(sqe) }.await)
    }

    fn command_sqe(&self, op: u32, tag: u16, buf: *mut u8, result: i32) -> squeue::Entry {
        let op = if self.ioctl_encode { op } else { op & 0xff };
        // With zero copy the command names no buffer (the driver refuses
        // one) and the SQE's own `addr` says where to register the request.
        let (buf_addr, auto) = match self.zero_copy_base {
            Some(base) => (0, Some(zero_copy::auto_buf_reg_addr(base + tag))),
            None => (buf as u64, None),
        };
        let mut cmd = [0u8; 16];
        cmd[0..2].copy_from_slice(&self.qid.to_ne_bytes());
        cmd[2..4].copy_from_slice(&tag.to_ne_bytes());
        cmd[4..8].copy_from_slice(&result.to_ne_bytes());
        cmd[8..16].copy_from_slice(&buf_addr.to_ne_bytes());
        opcode::UringCmd16::new(types::Fd(self.cdev()), op)
            .cmd(cmd)
            .addr(auto)
            .build()
    }

    fn cdev(&self) -> RawFd {
        self.dev.tgt.fds[0]
    }

    /// With zero copy, tag `tag`'s request's index in the thread's buffer
    /// table, if the kernel registered it there (see `op_flags`) and reads
    /// may land there on this kernel.
    pub(crate) fn request_index(&self, tag: u16, op_flags: u32) -> Option<u16> {
        let base = self.zero_copy_base.filter(|_| self.reads_into_requests)?;
        (op_flags & zero_copy::NEED_REG_BUF == 0).then_some(base + tag)
    }

    /// True if requests' data does not pass through the tags' buffers by
    /// itself (zero copy): see [`DeviceQueue::copy_to_request`].
    pub(crate) fn zero_copy(&self) -> bool {
        self.zero_copy_base.is_some()
    }

    /// With zero copy, puts a read's `data` into tag `tag`'s request.
    pub(crate) fn copy_to_request(&self, tag: u16, data: &[u8]) -> io::Result<()> {
        zero_copy::copy_to_request(self.cdev(), self.qid, tag, data)
    }

    /// With zero copy, takes a write's data from tag `tag`'s request.
    pub(crate) fn copy_from_request(&self, tag: u16, buf: &mut [u8]) -> io::Result<()> {
        zero_copy::copy_from_request(self.cdev(), self.qid, tag, buf)
    }
}

/// What a fetch's or commit's result says: Ok, the tag has a request.
pub(crate) fn next_request(r: i32) -> Result<(), QueueDown> {
    if r == sys::UBLK_IO_RES_OK as i32 {
        Ok(())
    } else {
        Err(QueueDown(r))
    }
}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.iods as *mut libc::c_void, self.map_len);
        }
    }
}
