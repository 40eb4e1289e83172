//! A connection's byte streams: [`Socket`] (Unix or TCP) and [`Stream`]
//! (the socket, or TLS on it). Both `Read` and `Write`; `flush` does
//! nothing (every reply goes out with its own `writev`). And
//! [`recv_now`], a read of a socket that never waits.

use crate::tls::TlsStream;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Reads what socket `fd` holds into `buf` without waiting (`recv` with
/// `MSG_DONTWAIT`, whatever the socket's mode): `Err(WouldBlock)` when it
/// holds nothing, `Ok(0)` at its end (or for an empty `buf`).
pub(crate) fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A connected socket, Unix or TCP.
#[derive(Debug)]
pub(crate) enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    /// Another handle on the same socket (to read and write from different
    /// threads, or to shut it down from the server).
    pub(crate) fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }
    /// shutdown(2): wakes every thread blocked on the socket in the
    /// directions shut down (what the server's stop path relies on).
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tcp(s) => s.shutdown(how),
        }
    }
    /// Bounds every read (None: no bound).
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_read_timeout(t),
            Socket::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.read(buf),
            Socket::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write(buf),
            Socket::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write_vectored(bufs),
            Socket::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection's byte stream: the socket itself, or TLS on it.
pub(crate) enum Stream {
    /// Plain text.
    Plain(Socket),
    /// TLS, after `NBD_OPT_STARTTLS`.
    Tls(TlsStream<Socket>),
}

impl Stream {
    /// The socket underneath.
    pub(crate) fn socket(&self) -> &Socket {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.socket(),
        }
    }
    /// The socket's fd when the stream is the socket itself (no TLS): what
    /// is read from the stream is what the socket shows.
    pub(crate) fn plain_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Plain(Socket::Unix(s)) => Some(s.as_raw_fd()),
            Stream::Plain(Socket::Tcp(s)) => Some(s.as_raw_fd()),
            Stream::Tls(_) => None,
        }
    }
    /// The socket's fd when the stream is a Unix socket itself (no TLS):
    /// where replies may be spliced ([`crate::splice_out`]).
    pub(crate) fn plain_unix_fd(&self) -> Option<RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Plain(Socket::Unix(s)) => Some(s.as_raw_fd()),
            _ => None,
        }
    }
    /// shutdown(2) on the socket underneath.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket().shutdown(how)
    }
    /// Bounds every read of the socket underneath.
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)
    }
    /// Ends the connection: a TLS close_notify if TLS runs, then shutdown.
    pub(crate) fn close(&self) {
        if let Stream::Tls(t) = self {
            t.close();
        }
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            Stream::Tls(t) => t.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
