//! [`Waker`]: wakes the accept loops of a stopping server through a socket
//! pair of their own, so stopping depends neither on the file system (a
//! Unix socket whose file was removed cannot be connected to) nor on the
//! network (a TCP listener behind a firewall).

use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// A one-shot wake-up every accept loop polls along with its listener
/// ([`crate::listener::Listener::accept_or_wake`]). Once woken, its
/// [`Waker::fd`] stays readable for good (nothing reads it), so every loop,
/// present or future, sees it.
pub(crate) struct Waker {
    tx: UnixStream,
    rx: UnixStream,
}

impl Waker {
    /// Not woken yet.
    pub(crate) fn new() -> io::Result<Waker> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Waker { tx, rx })
    }

    /// Makes [`Waker::fd`] readable. Never blocks; idempotent.
    pub(crate) fn wake(&self) {
        // A full buffer (WouldBlock) means it is readable already.
        let _ = (&self.tx).write(&[1]);
    }

    /// The descriptor to poll for reading.
    pub(crate) fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}
