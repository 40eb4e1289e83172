//! [`SpliceOut`]: sends a batch of read replies into a Unix socket without
//! copying their data: `vmsplice(2)` hands the pages of the reply buffers
//! to a pipe, `splice(2)` hands them on to the socket, and the client's
//! read copies them out of those same pages. A `writev` instead copies
//! every byte into pages the socket allocates (and the kernel zeroes) for
//! each reply.
//!
//! The contract this puts on the caller: the pages stay referenced by the
//! socket until the client has read them, so a buffer sent this way must
//! not be written again until then. [`unread_at_most`] bounds what the
//! client has not read yet (`SIOCOUTQ`: the memory the socket still holds
//! for sent data, which is at least the unread bytes), and the caller
//! reuses a buffer only once at least that many bytes were sent after it
//! ([`crate::fixed_bufs::FixedBufs`] keeps that account).
//!
//! Only for Unix stream sockets: there the memory is freed when the client
//! has read the data. Over TCP, `SIOCOUTQ` counts acknowledged data as
//! gone, and on loopback the receiving socket may still hold the pages
//! after the acknowledgement. A client that itself splices the socket's
//! data into a pipe would also keep references to the pages after reading
//! them; NBD clients (the kernel's, libnbd, qemu) copy.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The pipe's size asked for: room for a batch of small replies (a header
/// and a 4 KiB page each, one pipe slot per page piece) in one round.
const PIPE_BYTES: libc::c_int = 256 << 10;
/// Pieces handed to one `vmsplice`.
const MAX_IOVECS: usize = 128;

/// See the module documentation: a connection's pipe.
pub(crate) struct SpliceOut {
    read_end: OwnedFd,
    write_end: OwnedFd,
}

impl SpliceOut {
    /// A pipe for one connection's replies. Its size is raised to
    /// [`PIPE_BYTES`] where the kernel allows (an unprivileged user's pipes
    /// share a limit); a smaller pipe only takes more rounds per batch.
    pub(crate) fn new() -> io::Result<SpliceOut> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors owned by
        // nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ takes an int and touches no memory of ours.
        unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        Ok(SpliceOut {
            read_end,
            write_end,
        })
    }

    /// Sends all of `parts`, in order, into `socket` (a connected Unix
    /// stream socket, blocking). Err with the bytes that reached the
    /// socket before the failure: with 0, nothing was sent and the caller
    /// may send the batch another way.
    pub(crate) fn send(&self, socket: RawFd, parts: &[&[u8]]) -> Result<(), (io::Error, usize)> {
        let mut sent = 0usize;
        let mut idx = 0;
        let mut off = 0;
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOVECS];
        loop {
            while idx < parts.len() && parts[idx].len() == off {
                idx += 1;
                off = 0;
            }
            if idx == parts.len() {
                return Ok(());
            }
            let mut k = 0;
            for (j, p) in parts[idx..].iter().enumerate() {
                if k == MAX_IOVECS {
                    break;
                }
                let piece = if j == 0 { &p[off..] } else { &p[..] };
                if piece.is_empty() {
                    continue;
                }
                iov[k] = libc::iovec {
                    iov_base: piece.as_ptr() as *mut libc::c_void,
                    iov_len: piece.len(),
                };
                k += 1;
            }
            // SAFETY: the iovecs point into `parts`, borrowed for the whole
            // call; vmsplice only takes references to their pages (the
            // module's contract keeps them unwritten until read).
            let n = match sent_by(unsafe {
                libc::vmsplice(self.write_end.as_raw_fd(), iov.as_ptr(), k, 0)
            }) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err((e, sent)),
            };
            let mut left = n;
            while left > 0 {
                // SAFETY: no memory of ours is passed; both are open fds.
                let m = match sent_by(unsafe {
                    libc::splice(
                        self.read_end.as_raw_fd(),
                        std::ptr::null_mut(),
                        socket,
                        std::ptr::null_mut(),
                        left,
                        0,
                    )
                }) {
                    Ok(m) => m,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // What is left in the pipe can no longer be sent in
                    // order: the caller must give the connection up unless
                    // nothing went out at all.
                    Err(e) => return Err((e, sent)),
                };
                left -= m;
                sent += m;
            }
            crate::parts::advance(parts, &mut idx, &mut off, n);
        }
    }
}

/// A system call's count of bytes moved: 0 (nothing could be moved) as
/// `WriteZero`, a negative one as the call's error.
fn sent_by(r: isize) -> io::Result<usize> {
    match r {
        0 => Err(io::ErrorKind::WriteZero.into()),
        r if r < 0 => Err(io::Error::last_os_error()),
        r => Ok(r as usize),
    }
}

/// An upper bound on the bytes sent into `socket` (a Unix stream socket)
/// that its client has not read yet: `SIOCOUTQ`, the memory the socket
/// holds for them, which counts each buffer's overhead too.
pub(crate) fn unread_at_most(socket: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into `n`.
    if unsafe { libc::ioctl(socket, libc::TIOCOUTQ, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    #[test]
    fn parts_arrive_in_order_and_the_unread_bound_falls_as_they_are_read() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let out = SpliceOut::new().unwrap();
        let big = vec![7u8; 300 << 10]; // more than the pipe holds
        let parts: [&[u8]; 5] = [b"head", &[], &big, b"x", b"tail"];
        let want: Vec<u8> = parts.concat();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; want.len()];
            b.read_exact(&mut got).unwrap();
            assert_eq!(got, want);
            b
        });
        out.send(a.as_raw_fd(), &parts).unwrap();
        let _b = reader.join().unwrap();
        assert_eq!(unread_at_most(a.as_raw_fd()).unwrap(), 0);
    }

    #[test]
    fn unread_data_is_counted_until_read() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let out = SpliceOut::new().unwrap();
        let data = vec![1u8; 4096];
        out.send(a.as_raw_fd(), &[b"h", &data]).unwrap();
        assert!(unread_at_most(a.as_raw_fd()).unwrap() >= 4097);
        let mut got = vec![0u8; 4097];
        b.read_exact(&mut got).unwrap();
        assert_eq!(unread_at_most(a.as_raw_fd()).unwrap(), 0);
    }

    #[test]
    fn a_closed_peer_fails_the_send() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let out = SpliceOut::new().unwrap();
        let (e, sent) = out.send(a.as_raw_fd(), &[b"abc"]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        assert_eq!(sent, 0);
    }
}
