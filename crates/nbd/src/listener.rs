//! [`Listener`]: the listening sockets a server accepts connections on
//! (Unix sockets bound safely, TCP).

use crate::sockets::Socket;
use crate::wake::Waker;
use std::fs;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

enum ListenerKind {
    Unix {
        listener: UnixListener,
        path: PathBuf,
        /// (device, inode) of the socket file we created, so we only ever
        /// remove our own socket.
        id: (u64, u64),
    },
    Tcp(TcpListener),
}

/// A bound listening socket for [`crate::Server::serve`]. A Unix socket listener
/// removes its socket file when dropped (if the file is still its own).
pub struct Listener {
    kind: ListenerKind,
}

impl Listener {
    /// Binds a Unix socket at `path` with mode 0600.
    ///
    /// If `path` exists and is a socket nobody listens on (connecting is
    /// refused), it is a stale leftover and is removed. If something
    /// listens there, fails with `AddrInUse`; if `path` is not a socket,
    /// fails with `AlreadyExists`. The socket is created inside a private
    /// (0700) temporary directory next to `path`, chmod'ed, then renamed
    /// into place, so no other user can ever connect to it (unless that
    /// temporary path would be too long for a socket address, in which case
    /// it is bound in place and chmod'ed at once).
    pub fn bind_unix(path: impl AsRef<Path>) -> io::Result<Listener> {
        let path = path.as_ref();
        match fs::symlink_metadata(path) {
            Ok(md) => {
                if !md.file_type().is_socket() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                match UnixStream::connect(path) {
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("a server is already listening on {}", path.display()),
                        ))
                    }
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        log::info!("removing stale socket {}", path.display());
                        match fs::remove_file(path) {
                            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                            _ => {}
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmpdir = dir.join(format!(
            ".nbd-sock-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::DirBuilder::new().mode(0o700).create(&tmpdir)?;
        let tmp = tmpdir.join("s");
        let result = (|| -> io::Result<UnixListener> {
            let listener = UnixListener::bind(&tmp)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
            fs::rename(&tmp, path)?;
            Ok(listener)
        })();
        let _ = fs::remove_file(&tmp);
        let _ = fs::remove_dir(&tmpdir);
        let listener = match result {
            Ok(l) => l,
            // The temporary path is ~25 bytes longer than `path` and may
            // exceed sun_path; bind in place instead (the socket then has
            // umask permissions until the chmod right after).
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                let l = UnixListener::bind(path)?;
                fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
                l
            }
            Err(e) => return Err(e),
        };
        let md = fs::symlink_metadata(path)?;
        Ok(Listener {
            kind: ListenerKind::Unix {
                listener,
                path: path.to_owned(),
                id: (md.dev(), md.ino()),
            },
        })
    }

    /// Binds a TCP listener (e.g. `"127.0.0.1:10809"`). Plain TCP is
    /// unencrypted and unauthenticated; warning about that is the caller's
    /// job.
    pub fn bind_tcp(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Ok(Listener::from_tcp(TcpListener::bind(addr)?))
    }

    /// Serves on an already bound TCP listener.
    pub fn from_tcp(l: TcpListener) -> Listener {
        Listener {
            kind: ListenerKind::Tcp(l),
        }
    }

    /// The socket path, for a Unix listener.
    pub fn unix_path(&self) -> Option<&Path> {
        match &self.kind {
            ListenerKind::Unix { path, .. } => Some(path),
            ListenerKind::Tcp(_) => None,
        }
    }

    /// The bound address, for a TCP listener.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match &self.kind {
            ListenerKind::Tcp(l) => l.local_addr().ok(),
            ListenerKind::Unix { .. } => None,
        }
    }

    /// The next connection and a description of its peer.
    pub(crate) fn accept(&self) -> io::Result<(Socket, String)> {
        match &self.kind {
            ListenerKind::Unix { listener, path, .. } => {
                let (s, _) = listener.accept()?;
                // Blocking, whatever the listener is (some systems pass
                // O_NONBLOCK on to accepted sockets).
                s.set_nonblocking(false)?;
                Ok((Socket::Unix(s), format!("unix:{}", path.display())))
            }
            ListenerKind::Tcp(l) => {
                let (s, a) = l.accept()?;
                s.set_nonblocking(false)?;
                let _ = s.set_nodelay(true);
                Ok((Socket::Tcp(s), a.to_string()))
            }
        }
    }

    /// Puts the listening socket in non-blocking mode, as
    /// [`Listener::accept_or_wake`] needs.
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        match &self.kind {
            ListenerKind::Unix { listener, .. } => listener.set_nonblocking(true),
            ListenerKind::Tcp(l) => l.set_nonblocking(true),
        }
    }

    /// Waits for the next connection (see [`Listener::accept`]) or for
    /// `waker`, whichever comes first: Ok(None) once `waker` was woken.
    /// Polls the listening socket and the waker's descriptor, so a stop
    /// needs neither the socket file (which may have been removed) nor a
    /// connection to ourselves. The listener must be non-blocking
    /// ([`Listener::set_nonblocking`]): a connection that goes away between
    /// the poll and the accept then only means polling again.
    pub(crate) fn accept_or_wake(&self, waker: &Waker) -> io::Result<Option<(Socket, String)>> {
        let fd = match &self.kind {
            ListenerKind::Unix { listener, .. } => listener.as_raw_fd(),
            ListenerKind::Tcp(l) => l.as_raw_fd(),
        };
        loop {
            let mut fds = [
                libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: waker.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid, writable array of `fds.len()`
            // pollfd structs for the whole call, and both descriptors stay
            // open (owned by `self` and `waker`, borrowed for the call).
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if fds[1].revents != 0 {
                return Ok(None);
            }
            if fds[0].revents != 0 {
                match self.accept() {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => return r.map(Some),
                }
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let ListenerKind::Unix { path, id, .. } = &self.kind {
            if let Ok(md) = fs::symlink_metadata(path) {
                if (md.dev(), md.ino()) == *id {
                    let _ = fs::remove_file(path);
                }
            }
        }
    }
}
