//! The NBD server: listeners, connection threads, per-connection worker
//! pools, replies, graceful shutdown.
//!
//! Threads per connection: one reader (handshake, then parses requests and
//! reads write payloads into reusable buffers) and `workers` executors
//! sharing a queue. Executors send their own replies under the connection's
//! writer lock, so replies go out in completion order, one `writev` each.
//! A slow or stuck client only ever blocks its own threads. Memory per
//! connection is bounded by `max_inflight_bytes` (plus one maximum-size
//! request) and the reader stops reading while the bound is reached.

use crate::handshake::{
    negotiate, negotiate_options, ExportEntry, HandshakeEnd, HandshakeError, HandshakeParams,
    TlsPhase,
};
use crate::proto::{self, Command, TransmissionContext, Verdict};
use crate::tls::{TlsConfig, TlsStream};
use crate::wire::nbd_errno;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io::{self, BufReader, BufWriter, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use tiercache_frontend::Export;

/// Tunables of a [`Server`]. `Default` gives sensible values.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once. When all are taken, a new connection
    /// replaces the oldest one still negotiating (so idle or slow
    /// handshakes cannot lock clients out); if every connection is past
    /// its handshake, the new one is accepted and closed at once (and
    /// logged).
    pub max_connections: usize,
    /// Worker threads per connection executing requests concurrently.
    pub workers: usize,
    /// Requests in flight per connection before the reader stops reading.
    pub max_inflight: usize,
    /// Bytes of request/reply buffers in flight per connection before the
    /// reader stops reading (a single request may always proceed alone).
    pub max_inflight_bytes: u64,
    /// Cap on the length of READ/WRITE/WRITE_ZEROES requests; advertised as
    /// the maximum block size (lowered to the export's own maximum).
    pub max_block: u32,
    /// A client must finish negotiating within this time in total (None:
    /// no limit).
    pub handshake_timeout: Option<Duration>,
    /// Options a client may send before entering transmission.
    pub max_options: usize,
    /// On shutdown, how long to let connections finish in-flight requests
    /// before forcibly closing them.
    pub shutdown_grace: Duration,
    /// TLS (`NBD_OPT_STARTTLS`), on every listener of the server.
    pub tls: TlsMode,
}

/// Whether and how clients use TLS (nbdkit's `--tls=off|on|require`).
#[derive(Debug, Clone, Default)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused (`NBD_REP_ERR_POLICY`).
    #[default]
    Off,
    /// Clients may upgrade with `NBD_OPT_STARTTLS` or stay in plain text
    /// (the spec's SELECTIVETLS with no TLS-only export). Anyone who can
    /// connect can still use the export without TLS.
    Optional(TlsConfig),
    /// Clients must upgrade before anything else (the spec's FORCEDTLS).
    Required(TlsConfig),
}

impl TlsMode {
    fn config(&self) -> Option<&TlsConfig> {
        match self {
            TlsMode::Off => None,
            TlsMode::Optional(c) | TlsMode::Required(c) => Some(c),
        }
    }

    fn phase(&self) -> TlsPhase {
        match self {
            TlsMode::Off => TlsPhase::Unavailable,
            TlsMode::Optional(_) => TlsPhase::Optional,
            TlsMode::Required(_) => TlsPhase::Required,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 64,
            workers: 8,
            max_inflight: 64,
            max_inflight_bytes: 64 << 20,
            max_block: tiercache_frontend::DEFAULT_MAX_BLOCK,
            handshake_timeout: Some(Duration::from_secs(30)),
            max_options: 256,
            shutdown_grace: Duration::from_secs(30),
            tls: TlsMode::Off,
        }
    }
}

// ---------------------------------------------------------------------------
// Streams and listeners.

/// A connected socket.
#[derive(Debug)]
enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tcp(s) => s.shutdown(how),
        }
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
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
enum Stream {
    Plain(Socket),
    Tls(TlsStream<Socket>),
}

impl Stream {
    fn socket(&self) -> &Socket {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.socket(),
        }
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket().shutdown(how)
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)
    }
    /// Ends the connection: a TLS close_notify if TLS runs, then shutdown.
    fn close(&self) {
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

/// A bound listening socket for [`Server::serve`]. A Unix socket listener
/// removes its socket file when dropped (if the file is still its own).
pub struct Listener {
    kind: ListenerKind,
}

enum WakeTarget {
    Unix(PathBuf),
    Tcp(SocketAddr),
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

    fn accept(&self) -> io::Result<(Socket, String)> {
        match &self.kind {
            ListenerKind::Unix { listener, path, .. } => {
                let (s, _) = listener.accept()?;
                Ok((Socket::Unix(s), format!("unix:{}", path.display())))
            }
            ListenerKind::Tcp(l) => {
                let (s, a) = l.accept()?;
                let _ = s.set_nodelay(true);
                Ok((Socket::Tcp(s), a.to_string()))
            }
        }
    }

    fn wake_target(&self) -> Option<WakeTarget> {
        match &self.kind {
            ListenerKind::Unix { path, .. } => Some(WakeTarget::Unix(path.clone())),
            ListenerKind::Tcp(l) => {
                let mut a = l.local_addr().ok()?;
                if a.ip().is_unspecified() {
                    a.set_ip(match a {
                        SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                    });
                }
                Some(WakeTarget::Tcp(a))
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

// ---------------------------------------------------------------------------
// Server.

struct Inner {
    exports: Vec<ExportEntry>,
    config: ServerConfig,
    stop: AtomicBool,
    /// Where to connect to wake each running accept loop.
    wake: Mutex<Vec<WakeTarget>>,
    /// Live connections by id (ids grow, so the first negotiating entry is
    /// the oldest): a handle on each socket, to shut it down.
    conns: Mutex<BTreeMap<u64, ConnEntry>>,
    /// Lock order: `active`, then `conns`.
    active: Mutex<Counts>,
    active_cv: Condvar,
    refused: AtomicU64,
    /// The last connection id handed out.
    next_id: AtomicU64,
}

struct ConnEntry {
    socket: Socket,
    /// Still in the handshake (greeting, options, TLS): may be replaced by
    /// a new connection when all slots are taken.
    negotiating: bool,
    /// Shut down to make room; its thread is on its way out.
    evicted: bool,
}

#[derive(Default)]
struct Counts {
    /// Connections with a thread (including evicted ones not yet gone).
    active: usize,
    /// Of those, evicted ones.
    evicted: usize,
}

/// An NBD server over a fixed set of exports. Clones share the server (to
/// `serve` several listeners); run it with [`Server::serve`] (blocking) or
/// [`Server::spawn`].
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Stops a running server: it stops accepting, lets every connection finish
/// its in-flight requests (up to `shutdown_grace`), flushes the exports, and
/// `serve` returns.
#[derive(Clone)]
pub struct ShutdownHandle {
    inner: Arc<Inner>,
}

impl ShutdownHandle {
    /// Starts the shutdown; returns at once (wait on `serve`, or use
    /// [`RunningServer::shutdown`]). Idempotent.
    pub fn shutdown(&self) {
        if self.inner.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept loop by connecting to ourselves.
        for w in self.inner.wake.lock().iter() {
            match w {
                WakeTarget::Unix(p) => drop(UnixStream::connect(p)),
                WakeTarget::Tcp(a) => drop(TcpStream::connect_timeout(a, Duration::from_secs(1))),
            }
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.stop.load(Ordering::SeqCst)
    }
}

/// A server running on its own thread (see [`Server::spawn`]).
pub struct RunningServer {
    handle: ShutdownHandle,
    thread: JoinHandle<io::Result<()>>,
}

impl RunningServer {
    pub fn handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Connections currently open (in handshake or transmission).
    pub fn active_connections(&self) -> usize {
        self.handle.inner.active.lock().active
    }

    /// Gracefully shuts down and waits; returns the first export flush
    /// error, if any.
    pub fn shutdown(self) -> io::Result<()> {
        self.handle.shutdown();
        self.wait()
    }

    /// Waits until the server stops (after someone calls
    /// [`ShutdownHandle::shutdown`]).
    pub fn wait(self) -> io::Result<()> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("NBD server thread panicked")))
    }
}

impl Server {
    /// Creates a server for `exports` (at least one; names must be unique;
    /// block size constraints must satisfy [`tiercache_frontend::BlockSizes::validate`]).
    pub fn new(exports: Vec<ExportEntry>, config: ServerConfig) -> io::Result<Server> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        if exports.is_empty() {
            return Err(invalid("no exports".into()));
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(invalid(format!("duplicate export name {:?}", e.name)));
            }
            if e.name.len() > proto::MAX_STRING_LEN || e.description.len() > proto::MAX_STRING_LEN {
                return Err(invalid(format!(
                    "export name or description too long: {:?}",
                    e.name
                )));
            }
            let b = e.export.block_size_constraints();
            b.validate(e.export.size())
                .map_err(|m| invalid(format!("export {:?}: {m}", e.name)))?;
        }
        if !(512..=1 << 30).contains(&config.max_block)
            || config.workers == 0
            || config.max_inflight == 0
        {
            return Err(invalid(
                "max_block must be in 512..=1 GiB, workers and max_inflight >= 1".into(),
            ));
        }
        Ok(Server {
            inner: Arc::new(Inner {
                exports,
                config,
                stop: AtomicBool::new(false),
                wake: Mutex::new(Vec::new()),
                conns: Mutex::new(BTreeMap::new()),
                active: Mutex::new(Counts::default()),
                active_cv: Condvar::new(),
                refused: AtomicU64::new(0),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// A server with one export, reachable under any name the client uses
    /// for the default export ("") and under `name`.
    pub fn single(name: &str, export: Arc<dyn Export>, config: ServerConfig) -> io::Result<Server> {
        Server::new(vec![ExportEntry::new(name, export)], config)
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            inner: self.inner.clone(),
        }
    }

    /// Runs `serve` on a new thread.
    pub fn spawn(self, listener: Listener) -> io::Result<RunningServer> {
        let handle = self.shutdown_handle();
        let thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || self.serve(listener))?;
        Ok(RunningServer { handle, thread })
    }

    /// Accepts and serves connections until [`ShutdownHandle::shutdown`].
    /// May run concurrently on several listeners (e.g. Unix and TCP) of
    /// the same server; one shutdown stops them all. On shutdown it
    /// stops accepting, stops reading new requests, waits for in-flight
    /// requests (up to `shutdown_grace`, after which connections are cut),
    /// flushes every export, and returns the first flush error.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let inner = &self.inner;
        inner.wake.lock().extend(listener.wake_target());
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut accept_errors = 0u64;
        while !inner.stop.load(Ordering::SeqCst) {
            let (stream, peer) = match listener.accept() {
                Ok(x) => {
                    accept_errors = 0;
                    x
                }
                Err(e) => {
                    match e.kind() {
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                        _ => {
                            // E.g. EMFILE: back off; log the 1st, 2nd, 4th... in a row.
                            accept_errors += 1;
                            if accept_errors.is_power_of_two() {
                                log::error!("accept failed ({accept_errors} in a row): {e}");
                            }
                            thread::sleep(Duration::from_millis(50));
                        }
                    }
                    continue;
                }
            };
            if inner.stop.load(Ordering::SeqCst) {
                break;
            }
            threads.retain(|t| !t.is_finished());
            // Ids are unique across the listeners `serve` runs on.
            let id = inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
            let handle = match stream.try_clone() {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("{peer}: cannot clone socket: {e}");
                    continue;
                }
            };
            if !inner.admit(id, handle, &peer) {
                continue;
            }
            let inner2 = inner.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    // Bookkeeping happens even if the connection panics.
                    let _done = ConnGuard(&inner2, id);
                    run_connection(&inner2, id, stream, &format!("nbd conn #{id} ({peer})"));
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    log::error!("cannot spawn connection thread: {e}");
                    finish_connection(inner, id);
                }
            }
        }
        drop(listener);
        log::info!("NBD server shutting down");

        // Stop reading requests; in-flight ones complete and are answered.
        for c in inner.conns.lock().values() {
            let _ = c.socket.shutdown(Shutdown::Read);
        }
        {
            let mut active = inner.active.lock();
            let deadline = std::time::Instant::now() + inner.config.shutdown_grace;
            while active.active > 0 {
                if inner
                    .active_cv
                    .wait_until(&mut active, deadline)
                    .timed_out()
                {
                    log::warn!(
                        "{} connection(s) did not finish within the grace period; closing them",
                        active.active
                    );
                    for c in inner.conns.lock().values() {
                        let _ = c.socket.shutdown(Shutdown::Both);
                    }
                    break;
                }
            }
        }
        for t in threads {
            let _ = t.join();
        }

        let mut result = Ok(());
        let mut flushed: Vec<*const ()> = Vec::new();
        for e in &inner.exports {
            let ptr = Arc::as_ptr(&e.export) as *const ();
            if flushed.contains(&ptr) || !e.export.can_flush() {
                continue;
            }
            flushed.push(ptr);
            if let Err(err) = e.export.flush() {
                log::error!("flushing export {:?} on shutdown failed: {err}", e.name);
                if result.is_ok() {
                    result = Err(err);
                }
            }
        }
        result
    }
}

struct ConnGuard<'a>(&'a Inner, u64);

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        finish_connection(self.0, self.1);
    }
}

fn finish_connection(inner: &Inner, id: u64) {
    let evicted = inner.conns.lock().remove(&id).is_some_and(|c| c.evicted);
    let mut counts = inner.active.lock();
    counts.active -= 1;
    if evicted {
        counts.evicted -= 1;
    }
    inner.active_cv.notify_all();
}

impl Inner {
    /// Takes a connection slot for connection `id` (whose socket `handle`
    /// is kept to shut it down), replacing the oldest connection still
    /// negotiating if all `max_connections` are taken. False (and the
    /// socket is to be closed) if every slot is past its handshake, or if
    /// replaced connections are slow to go away (never more than
    /// `max_connections` of those at once, which bounds threads).
    fn admit(&self, id: u64, handle: Socket, peer: &str) -> bool {
        let max = self.config.max_connections;
        let mut counts = self.active.lock();
        let mut conns = self.conns.lock();
        if counts.active - counts.evicted >= max {
            let oldest = if counts.evicted < max {
                conns.iter_mut().find(|(_, c)| c.negotiating && !c.evicted)
            } else {
                None
            };
            match oldest {
                Some((old, c)) => {
                    c.evicted = true;
                    counts.evicted += 1;
                    let _ = c.socket.shutdown(Shutdown::Both);
                    log::debug!(
                        "connection #{old} was still negotiating with all {max} slots taken: closed for {peer}"
                    );
                }
                None => {
                    let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        log::warn!(
                            "refusing connection from {peer}: {} connections open (limit); {n} refused so far",
                            counts.active
                        );
                    }
                    return false;
                }
            }
        }
        counts.active += 1;
        conns.insert(
            id,
            ConnEntry {
                socket: handle,
                negotiating: true,
                evicted: false,
            },
        );
        true
    }

    /// After a negotiation ends: if it entered transmission, marks
    /// connection `id` as past negotiation (no longer replaced to make
    /// room), then flushes the final reply to the client.
    fn entered_transmission<W: Write>(
        &self,
        id: u64,
        end: Result<HandshakeEnd, HandshakeError>,
        w: &mut W,
    ) -> Result<HandshakeEnd, HandshakeError> {
        if let Ok(HandshakeEnd::Transmission(_)) = end {
            if let Some(c) = self.conns.lock().get_mut(&id) {
                c.negotiating = false;
            }
            w.flush()?;
        }
        end
    }

    fn is_evicted(&self, id: u64) -> bool {
        self.conns.lock().get(&id).is_some_and(|c| c.evicted)
    }
}

// ---------------------------------------------------------------------------
// One connection.

struct Job {
    handle: u64,
    cmd: Command,
    buf: Vec<u8>,
}

/// Everything the reader and the workers of one connection share, under a
/// single lock so that a request costs the reader one or two lock
/// acquisitions and a worker two (pop; release), not one per structure.
struct State {
    jobs: VecDeque<Job>,
    /// No more jobs will be queued; workers exit once `jobs` is empty.
    closed: bool,
    /// Requests accepted and not yet answered, and their buffer bytes.
    count: usize,
    bytes: u64,
    /// Spare buffers (capacity at most `KEEP_BUF`), reused for payloads.
    bufs: Vec<Vec<u8>>,
}

struct Conn<'a> {
    peer: &'a str,
    export: &'a dyn Export,
    structured: bool,
    writer: Mutex<Stream>,
    /// Set once a reply could not be sent; nothing more is sent.
    broken: AtomicBool,
    state: Mutex<State>,
    /// Signalled when a job is queued or the queue is closed.
    work_cv: Condvar,
    /// Signalled when a request completes (room for the reader).
    room_cv: Condvar,
    /// Rejection reasons already logged at warn level on this connection.
    logged: Mutex<Vec<&'static str>>,
    max_inflight: usize,
    max_bytes: u64,
    stopping: &'a AtomicBool,
}

const KEEP_BUF: usize = 1 << 20;

fn run_connection(inner: &Inner, id: u64, socket: Socket, peer: &str) {
    let cfg = &inner.config;
    let read_half = match socket.try_clone() {
        Ok(s) => ConnReader {
            stream: Stream::Plain(s),
            deadline: cfg.handshake_timeout.map(|t| Instant::now() + t),
        },
        Err(e) => {
            log::warn!("{peer}: cannot clone socket: {e}");
            return;
        }
    };
    let mut reader = BufReader::with_capacity(HANDSHAKE_READ_BUF, read_half);
    let mut writer = Stream::Plain(socket);
    let mut params = HandshakeParams {
        exports: &inner.exports,
        max_block: cfg.max_block,
        shutting_down: &inner.stop,
        max_options: cfg.max_options,
        tls: cfg.tls.phase(),
    };
    // Option replies are flushed by `negotiate`, except the one entering
    // transmission, which is flushed below once the connection is marked
    // as past negotiation; STARTTLS's ACK is flushed.
    let mut end = {
        let mut w = BufWriter::new(&mut writer);
        let end = negotiate(&mut reader, &mut w, &params);
        inner.entered_transmission(id, end, &mut w)
    };
    if let Ok(HandshakeEnd::StartTls(client_flags)) = end {
        let Some(tls) = cfg.tls.config() else {
            log::error!("{peer}: STARTTLS acknowledged without TLS credentials");
            return;
        };
        match start_tls(tls, reader, writer, peer) {
            Ok((r, w)) => {
                (reader, writer) = (r, w);
                params.tls = TlsPhase::Active;
                let mut w = BufWriter::new(&mut writer);
                let e = negotiate_options(&mut reader, &mut w, &params, client_flags);
                end = inner.entered_transmission(id, e, &mut w);
            }
            Err(e) => {
                if inner.is_evicted(id) {
                    log::debug!("{peer}: closed during the TLS handshake to make room");
                } else {
                    log::warn!("{peer}: TLS handshake failed: {e}");
                }
                return;
            }
        }
    }
    let n = match end {
        Ok(HandshakeEnd::Transmission(n)) => n,
        Ok(HandshakeEnd::Aborted) => {
            log::debug!("{peer}: client ended negotiation (NBD_OPT_ABORT)");
            return;
        }
        Ok(HandshakeEnd::StartTls(_)) => {
            log::warn!("{peer}: a second NBD_OPT_STARTTLS was acknowledged; disconnecting");
            return;
        }
        Err(_) if inner.is_evicted(id) => {
            log::debug!("{peer}: closed during the handshake to make room");
            return;
        }
        Err(HandshakeError::Io(e)) => {
            match e.kind() {
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                    log::info!("{peer}: client disconnected during handshake")
                }
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    log::warn!("{peer}: handshake timed out; disconnecting")
                }
                _ => log::warn!("{peer}: handshake failed: {e}"),
            }
            return;
        }
        Err(e @ HandshakeError::Protocol(_)) => {
            log::warn!("{peer}: {e}; disconnecting");
            return;
        }
    };
    reader.get_mut().deadline = None;
    let _ = reader.get_ref().stream.set_read_timeout(None);
    let entry = &inner.exports[n.export];
    log::info!(
        "{peer}: serving export {:?} ({} bytes, flags {:#x}, structured replies {})",
        entry.name,
        n.ctx.size,
        n.ctx.flags,
        n.structured_replies
    );
    let conn = Conn {
        peer,
        export: &*entry.export,
        structured: n.structured_replies,
        writer: Mutex::new(writer),
        broken: AtomicBool::new(false),
        state: Mutex::new(State {
            jobs: VecDeque::new(),
            closed: false,
            count: 0,
            bytes: 0,
            bufs: Vec::new(),
        }),
        work_cv: Condvar::new(),
        room_cv: Condvar::new(),
        logged: Mutex::new(Vec::new()),
        max_inflight: cfg.max_inflight,
        max_bytes: cfg.max_inflight_bytes,
        stopping: &inner.stop,
    };
    thread::scope(|s| {
        for i in 0..cfg.workers {
            let c = &conn;
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn_scoped(s, move || c.work());
            if let Err(e) = spawned {
                log::error!("{peer}: cannot spawn worker: {e}");
                if i == 0 {
                    conn.broken.store(true, Ordering::SeqCst);
                }
                break;
            }
        }
        if !conn.broken.load(Ordering::SeqCst) {
            conn.read_requests(&mut reader, &n.ctx);
        }
        {
            let mut st = conn.state.lock();
            st.closed = true;
        }
        conn.work_cv.notify_all();
    });
    // All workers have exited, so every queued request was answered.
    conn.writer.lock().close();
    log::debug!("{peer}: connection closed");
}

/// Read buffer of a connection (the handshake's, kept for transmission).
const HANDSHAKE_READ_BUF: usize = 256 << 10;

/// Answers `NBD_OPT_STARTTLS` after its ACK: runs the TLS handshake on the
/// connection's socket (under the handshake deadline) and returns the
/// reader and writer over TLS. Bytes the client sent right after the
/// option, already read into `reader`'s buffer, are its first TLS bytes.
fn start_tls(
    tls: &TlsConfig,
    reader: BufReader<ConnReader>,
    writer: Stream,
    peer: &str,
) -> io::Result<(BufReader<ConnReader>, Stream)> {
    let early = reader.buffer().to_vec();
    let mut conn_reader = reader.into_inner();
    let (Stream::Plain(mut write_socket), Stream::Plain(_)) = (writer, &conn_reader.stream) else {
        return Err(io::Error::other("TLS is already running"));
    };
    let done = crate::tls::handshake(tls, &mut conn_reader, &mut write_socket, &early)?;
    log::info!("{peer}: TLS established: {}", done.describe());
    let Stream::Plain(read_socket) = conn_reader.stream else {
        unreachable!("checked above");
    };
    let control = write_socket.try_clone()?;
    let stream = TlsStream::new(done, read_socket, write_socket, control);
    let reader = ConnReader {
        stream: Stream::Tls(stream.clone()),
        deadline: conn_reader.deadline,
    };
    Ok((
        BufReader::with_capacity(HANDSHAKE_READ_BUF, reader),
        Stream::Tls(stream),
    ))
}

/// The read side of a connection. While `deadline` is set (during the
/// handshake), every read is bounded by the time left, so a client cannot
/// stretch the negotiation by dribbling bytes.
struct ConnReader {
    stream: Stream,
    deadline: Option<Instant>,
}

impl Read for ConnReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "handshake deadline passed",
                ));
            }
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the
/// first byte.
fn read_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn discard<R: Read>(r: &mut R, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 8192];
    while n > 0 {
        let k = n.min(scratch.len() as u64) as usize;
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Writes all of `parts` with as few `writev` calls as possible.
fn write_all_parts<W: Write>(w: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        if parts[idx].len() == off {
            idx += 1;
            off = 0;
            continue;
        }
        let mut slices = [IoSlice::new(&[]); 4];
        let mut k = 0;
        for (j, p) in parts[idx..].iter().enumerate().take(4) {
            slices[k] = IoSlice::new(if j == 0 { &p[off..] } else { p });
            k += 1;
        }
        let mut n = match w.write_vectored(&slices[..k]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while n > 0 {
            let rem = parts[idx].len() - off;
            if n >= rem {
                n -= rem;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

fn command_name(kind: u16) -> &'static str {
    match kind {
        proto::CMD_READ => "READ",
        proto::CMD_WRITE => "WRITE",
        proto::CMD_DISC => "DISC",
        proto::CMD_FLUSH => "FLUSH",
        proto::CMD_TRIM => "TRIM",
        proto::CMD_CACHE => "CACHE",
        proto::CMD_WRITE_ZEROES => "WRITE_ZEROES",
        proto::CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

impl Conn<'_> {
    /// Logs at warn level the first time `key` happens on this connection,
    /// at debug level afterwards.
    fn log_once(&self, key: &'static str, msg: impl FnOnce() -> String) {
        let first = {
            let mut l = self.logged.lock();
            if l.contains(&key) {
                false
            } else {
                l.push(key);
                true
            }
        };
        if first {
            log::warn!(
                "{}: {} (further occurrences logged at debug level)",
                self.peer,
                msg()
            );
        } else {
            log::debug!("{}: {}", self.peer, msg());
        }
    }

    fn read_requests<R: Read>(&self, reader: &mut R, ctx: &TransmissionContext) {
        let peer = self.peer;
        loop {
            if self.broken.load(Ordering::Relaxed) {
                return;
            }
            let mut hb = [0u8; proto::REQUEST_HEADER_LEN];
            match read_or_eof(reader, &mut hb) {
                Ok(true) => {}
                Ok(false) => {
                    if !self.stopping.load(Ordering::Relaxed) {
                        log::info!("{peer}: client closed the connection without NBD_CMD_DISC");
                    }
                    return;
                }
                Err(e) => {
                    if !self.broken.load(Ordering::Relaxed) {
                        log::warn!("{peer}: connection lost in a request header: {e}");
                    }
                    return;
                }
            }
            let h = match proto::parse_request_header(&hb) {
                Ok(h) => h,
                Err(e) => {
                    log::warn!("{peer}: malformed request ({e}); disconnecting");
                    return;
                }
            };
            match proto::validate_request(&h, ctx) {
                Verdict::Execute(Command::Disconnect) => {
                    log::debug!("{peer}: NBD_CMD_DISC");
                    return;
                }
                Verdict::Execute(cmd) => {
                    let bytes = match cmd {
                        Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
                        _ => 0,
                    };
                    let handle = h.handle;
                    if let Command::Write { len, offset, .. } = cmd {
                        let mut buf = self.acquire(bytes);
                        buf.resize(len as usize, 0);
                        if let Err(e) = reader.read_exact(&mut buf) {
                            log::warn!(
                                "{peer}: client vanished in the middle of a write payload \
                                 (offset {offset}, {len} bytes): {e}"
                            );
                            self.finish(buf, bytes);
                            return;
                        }
                        self.state.lock().jobs.push_back(Job { handle, cmd, buf });
                    } else if let Command::Read { offset, len } = cmd {
                        // A read the export can answer at once (a cache
                        // hit) is answered here, saving the hand-off to a
                        // worker and back; the rest go to the workers.
                        let mut buf = self.acquire(bytes);
                        buf.resize(len as usize, 0);
                        let quick = if cmd.is_empty() {
                            Some(Ok(())) // asks nothing of the export
                        } else {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                self.export.read_if_quick(offset, &mut buf)
                            }))
                            .unwrap_or_else(|_| Some(Err(io::Error::other("export panicked"))))
                        };
                        if let Some(res) = quick {
                            // Answered: no worker to wake.
                            self.complete(handle, cmd, res, buf, bytes);
                            continue;
                        }
                        buf.clear();
                        self.state.lock().jobs.push_back(Job { handle, cmd, buf });
                    } else {
                        // No payload: take the slot and queue in one go; the
                        // worker picks a buffer if it needs one.
                        let mut st = self.wait_for_room(bytes);
                        st.jobs.push_back(Job {
                            handle,
                            cmd,
                            buf: Vec::new(),
                        });
                    }
                    self.work_cv.notify_one();
                }
                Verdict::Reject {
                    errno,
                    discard: n,
                    reason,
                } => {
                    if n > 0 {
                        if let Err(e) = discard(reader, u64::from(n)) {
                            log::warn!(
                                "{peer}: client vanished in the middle of a rejected write payload: {e}"
                            );
                            return;
                        }
                    }
                    self.log_once(reason, || {
                        format!(
                            "rejecting {} (type {}, flags {:#x}, offset {}, length {}): {reason}; errno {errno}",
                            command_name(h.kind),
                            h.kind,
                            h.flags,
                            h.offset,
                            h.length
                        )
                    });
                    self.send_error(h.handle, errno, reason);
                }
                Verdict::Disconnect(reason) => {
                    log::warn!(
                        "{peer}: {reason} ({} bytes, limit {}); hard disconnect",
                        h.length,
                        ctx.discard_limit()
                    );
                    return;
                }
            }
        }
    }

    /// Blocks until one more request (with `bytes` of buffer) may be in
    /// flight, counts it, and returns the locked state.
    fn wait_for_room(&self, bytes: u64) -> parking_lot::MutexGuard<'_, State> {
        let mut st = self.state.lock();
        while st.count >= self.max_inflight || (st.count > 0 && st.bytes + bytes > self.max_bytes) {
            self.room_cv.wait(&mut st);
        }
        st.count += 1;
        st.bytes += bytes;
        st
    }

    /// Like `wait_for_room`, also handing out a spare buffer.
    fn acquire(&self, bytes: u64) -> Vec<u8> {
        self.wait_for_room(bytes).bufs.pop().unwrap_or_default()
    }

    /// Ends a request: returns its buffer to the pool and its slot.
    fn finish(&self, mut buf: Vec<u8>, bytes: u64) {
        let keep = buf.capacity() <= KEEP_BUF;
        if keep {
            buf.clear();
        }
        let mut st = self.state.lock();
        if keep && st.bufs.len() < self.max_inflight {
            st.bufs.push(buf);
        }
        st.count -= 1;
        st.bytes -= bytes;
        drop(st);
        self.room_cv.notify_one();
    }

    /// Worker loop: executes queued requests until the queue is closed and
    /// empty.
    fn work(&self) {
        loop {
            let job = {
                let mut st = self.state.lock();
                loop {
                    if let Some(mut j) = st.jobs.pop_front() {
                        if matches!(j.cmd, Command::Read { .. }) {
                            j.buf = st.bufs.pop().unwrap_or_default();
                        }
                        break j;
                    }
                    if st.closed {
                        return;
                    }
                    self.work_cv.wait(&mut st);
                }
            };
            self.execute(job);
        }
    }

    fn execute(&self, job: Job) {
        let Job {
            handle,
            cmd,
            mut buf,
        } = job;
        let ex = self.export;
        let bytes = match cmd {
            Command::Read { len, .. } | Command::Write { len, .. } => u64::from(len),
            _ => 0,
        };
        // A panicking export must not take the connection down with it:
        // the request fails with EIO and the slot is released.
        let run = std::panic::AssertUnwindSafe(|| match cmd {
            // Zero bytes: nothing to ask of the export.
            _ if cmd.is_empty() => Ok(()),
            Command::Read { offset, len } => {
                buf.resize(len as usize, 0);
                ex.read(offset, &mut buf)
            }
            Command::Write { offset, fua, .. } => ex.write(offset, &buf, fua),
            Command::Flush => ex.flush(),
            Command::Trim { offset, len, fua } => {
                ex.trim(offset, u64::from(len))
                    .and_then(|()| if fua { ex.flush() } else { Ok(()) })
            }
            Command::WriteZeroes {
                offset,
                len,
                fua,
                may_trim,
            } => ex.write_zeroes(offset, u64::from(len), fua, may_trim),
            Command::Disconnect => Ok(()),
        });
        let res = std::panic::catch_unwind(run).unwrap_or_else(|_| {
            log::error!("{}: export panicked while executing {cmd:?}", self.peer);
            Err(io::Error::other("export panicked"))
        });
        self.complete(handle, cmd, res, buf, bytes);
    }

    /// Answers request `handle` with the export's result (`buf` holds the
    /// data of a read) and releases its slot.
    fn complete(&self, handle: u64, cmd: Command, res: io::Result<()>, buf: Vec<u8>, bytes: u64) {
        match res {
            Ok(()) => match cmd {
                Command::Read { offset, .. } => self.send_read(handle, offset, &buf),
                _ => self.send(&[&proto::encode_simple_reply(0, handle)]),
            },
            Err(e) => {
                let errno = nbd_errno(&e);
                self.log_once("export error", || {
                    format!("export error on {cmd:?}: {e}; answering errno {errno}")
                });
                self.send_error(handle, errno, &e.to_string());
            }
        }
        self.finish(buf, bytes);
    }

    fn send(&self, parts: &[&[u8]]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.writer.lock();
        if let Err(e) = write_all_parts(&mut *w, parts) {
            if !self.broken.swap(true, Ordering::SeqCst) {
                log::warn!("{}: cannot send reply ({e}); closing connection", self.peer);
            }
            // Makes the reader see EOF, so the connection winds down.
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    fn send_read(&self, handle: u64, offset: u64, data: &[u8]) {
        if !self.structured {
            self.send(&[&proto::encode_simple_reply(0, handle), data]);
        } else if data.is_empty() {
            self.send(&[&proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_NONE,
                handle,
                0,
            )]);
        } else {
            let hdr = proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_OFFSET_DATA,
                handle,
                8 + data.len() as u32,
            );
            self.send(&[&hdr, &offset.to_be_bytes(), data]);
        }
    }

    /// An error reply: a structured `NBD_REPLY_TYPE_ERROR` chunk carrying
    /// `msg` when structured replies were negotiated (mandatory for reads),
    /// else a simple reply without payload.
    fn send_error(&self, handle: u64, errno: u32, msg: &str) {
        if !self.structured {
            self.send(&[&proto::encode_simple_reply(errno, handle)]);
            return;
        }
        let mut end = msg.len().min(proto::MAX_STRING_LEN);
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &msg.as_bytes()[..end];
        let hdr = proto::encode_structured_header(
            proto::REPLY_FLAG_DONE,
            proto::REPLY_TYPE_ERROR,
            handle,
            6 + msg.len() as u32,
        );
        self.send(&[
            &hdr,
            &errno.to_be_bytes(),
            &(msg.len() as u16).to_be_bytes(),
            msg,
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that accepts at most 3 bytes per call.
    struct Dribble(Vec<u8>);
    impl Write for Dribble {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(3);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn write_all_parts_handles_short_writes() {
        let mut d = Dribble(Vec::new());
        write_all_parts(&mut d, &[b"abcd", b"", b"efghij", b"k"]).unwrap();
        assert_eq!(d.0, b"abcdefghijk");
    }
}
