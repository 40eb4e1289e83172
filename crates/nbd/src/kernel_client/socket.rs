//! A generic netlink socket to the kernel: send one request, collect its
//! answer (the messages of its sequence number up to the acknowledgement or
//! the error). Requests run in the calling thread's context, so file
//! descriptors named in a request are this process's.

use super::genetlink::{self, Message, NLMSG_DONE, NLMSG_ERROR};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// How long an answer may take before the request counts as failed: the
/// kernel answers these requests synchronously, so this only bounds a wait
/// that should never happen (every wait of the server has a way out).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// An `AF_NETLINK`/`NETLINK_GENERIC` socket.
pub struct NetlinkSocket {
    fd: OwnedFd,
    seq: u32,
}

fn invalid(e: genetlink::DecodeError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl NetlinkSocket {
    /// Opens a socket (bound by the kernel to a port of its choice on the
    /// first send).
    pub fn open() -> io::Result<NetlinkSocket> {
        // SAFETY: plain syscall with constant arguments; the result is
        // checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by no
        // one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: ANSWER_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid timeval that outlives the call, and its
        // size is passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(NetlinkSocket { fd, seq: 0 })
    }

    /// The sequence number for the next request.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `request` (built with sequence number `seq`, asking for an
    /// acknowledgement) and returns the payloads of the messages answering
    /// it, in order, once the kernel acknowledged it. A negative
    /// acknowledgement is the error, with its errno.
    pub fn request(&mut self, request: &[u8], seq: u32) -> io::Result<Vec<Vec<u8>>> {
        // SAFETY: all-zero is a valid sockaddr_nl; the fields that matter
        // are set below.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `request` and `kernel` are valid for the lengths passed
        // and outlive the call.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut answers = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for m in genetlink::messages(&buf[..n as usize]).map_err(invalid)? {
                if m.seq != seq {
                    continue; // an answer to an earlier request that gave up
                }
                if let Some(done) = Self::ends(&m)? {
                    return done.map(|()| answers);
                }
                answers.push(m.payload.to_vec());
            }
        }
    }

    /// Whether `m` ends an answer: Some(Ok) for the acknowledgement (or
    /// the end of a multipart answer), Some(Err) for an error.
    fn ends(m: &Message<'_>) -> io::Result<Option<io::Result<()>>> {
        match m.msg_type {
            NLMSG_ERROR => match genetlink::error_code(m.payload).map_err(invalid)? {
                0 => Ok(Some(Ok(()))),
                errno => Ok(Some(Err(io::Error::from_raw_os_error(errno)))),
            },
            NLMSG_DONE => Ok(Some(Ok(()))),
            _ => Ok(None),
        }
    }
}
