//! [`Server`]: an NBD server over a fixed set of exports, its accept loop
//! ([`Server::serve`]) and its lifecycle ([`Server::spawn`],
//! [`RunningServer`]).
//!
//! Threads: one accept loop per listener; per connection, one thread for
//! the handshake that then reads requests ([`crate::connection`]) and
//! `workers` executors ([`crate::transmission`]). A slow or stuck client
//! only ever blocks its own threads. Stopping: [`crate::ShutdownHandle`]
//! and [`crate::shutdown::wind_down`].

use crate::config::ServerConfig;
use crate::connection::{self, ConnEnv};
use crate::handshake::{ExportEntry, TlsPhase};
use crate::listener::Listener;
use crate::proto;
use crate::shutdown::{wind_down, ShutdownHandle, StopSignal};
use crate::slots::Slots;
use crate::sockets::Socket;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;
use tiercache_frontend::Export;

struct Inner {
    /// Replaced whole when an export is added or removed (connections
    /// keep the list they started with).
    exports: parking_lot::RwLock<Arc<Vec<ExportEntry>>>,
    config: ServerConfig,
    signal: Arc<StopSignal>,
    slots: Slots,
    /// The last connection id handed out.
    next_id: AtomicU64,
}

impl Inner {
    /// What a connection needs of its server.
    fn env(&self) -> ConnEnv<'_> {
        ConnEnv {
            exports: self.exports.read().clone(),
            config: &self.config,
            stopping: &self.signal.stop,
            slots: &self.slots,
            tls: self.config.tls.phase(),
        }
    }
}

/// An NBD server over a fixed set of exports. Clones share the server (to
/// `serve` several listeners); run it with [`Server::serve`] (blocking) or
/// [`Server::spawn`].
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// The export list of a running server ([`RunningServer::exports`]):
/// changes apply to connections that arrive afterwards.
#[derive(Clone)]
pub struct Exports {
    inner: Arc<Inner>,
}

impl Exports {
    /// Adds an export for connections from now on. Refused (nothing
    /// changes) if its name is taken or its block sizes are invalid.
    pub fn add_export(&self, entry: ExportEntry) -> io::Result<()> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let mut exports = self.inner.exports.write();
        if exports.iter().any(|e| e.name == entry.name) {
            return Err(invalid(format!("duplicate export name {:?}", entry.name)));
        }
        if entry.name.len() > proto::MAX_STRING_LEN {
            return Err(invalid(format!("export name too long: {:?}", entry.name)));
        }
        entry
            .export
            .block_size_constraints()
            .validate(entry.export.size())
            .map_err(|m| invalid(format!("export {:?}: {m}", entry.name)))?;
        let mut next = (**exports).clone();
        next.push(entry);
        *exports = Arc::new(next);
        Ok(())
    }

    /// Removes export `name` for connections from now on (those already
    /// using it keep it). False if there is no such export.
    pub fn remove_export(&self, name: &str) -> bool {
        let mut exports = self.inner.exports.write();
        if !exports.iter().any(|e| e.name == name) {
            return false;
        }
        let next: Vec<ExportEntry> = exports.iter().filter(|e| e.name != name).cloned().collect();
        *exports = Arc::new(next);
        true
    }
}

/// Opens connections to a running server from inside the process
/// ([`RunningServer::local_connector`]): a socket pair, whose one end the
/// server serves as it serves an accepted connection (handshake included)
/// and whose other end goes to the caller, e.g. to hand to the kernel's
/// NBD client. Never TLS (the pair never leaves the host); counted in the
/// server's connection slots, and stopped with the server.
#[derive(Clone)]
pub struct LocalConnector {
    inner: Arc<Inner>,
}

/// A connection made by [`LocalConnector::connect`].
pub struct LocalConnection {
    /// The client's end, to negotiate on and hand on.
    pub client: UnixStream,
    /// Another handle on the server's end (e.g. to see whether the client
    /// end is still open somewhere: it reads end-of-file once it is not).
    pub server_end: UnixStream,
    /// The server's thread for it: finished once the connection closed
    /// and its requests were answered.
    pub thread: JoinHandle<()>,
}

impl LocalConnector {
    /// A new connection, its server side running; `peer` names it in logs.
    /// Refused (`ConnectionRefused`) when the server stops or every slot is
    /// taken.
    pub fn connect(&self, peer: &str) -> io::Result<LocalConnection> {
        let inner = &self.inner;
        if inner.signal.is_set() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the NBD server is stopping",
            ));
        }
        let (client, server) = UnixStream::pair()?;
        let server_end = server.try_clone()?;
        let handle = Socket::Unix(server.try_clone()?);
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        if !inner.slots.admit(id, handle, peer) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "every NBD connection slot is taken",
            ));
        }
        let inner2 = inner.clone();
        let peer = format!("nbd conn #{id} ({peer})");
        let spawned = thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let _done = SlotGuard(&inner2.slots, id);
                let env = ConnEnv {
                    tls: TlsPhase::Unavailable,
                    ..inner2.env()
                };
                connection::run(&env, id, Socket::Unix(server), &peer);
            });
        match spawned {
            Ok(thread) => Ok(LocalConnection {
                client,
                server_end,
                thread,
            }),
            Err(e) => {
                inner.slots.finish(id);
                Err(e)
            }
        }
    }
}

/// A server running on its own thread (see [`Server::spawn`]).
pub struct RunningServer {
    handle: ShutdownHandle,
    inner: Arc<Inner>,
    thread: JoinHandle<io::Result<()>>,
}

impl RunningServer {
    /// A handle to stop the server from elsewhere.
    pub fn handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// A handle to add and remove exports while the server runs.
    pub fn exports(&self) -> Exports {
        Exports {
            inner: self.inner.clone(),
        }
    }

    /// Opens connections to this server from inside the process.
    pub fn local_connector(&self) -> LocalConnector {
        LocalConnector {
            inner: self.inner.clone(),
        }
    }

    /// Connections currently open (in handshake or transmission).
    pub fn active_connections(&self) -> usize {
        self.inner.slots.active()
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
                slots: Slots::new(config.max_connections),
                exports: parking_lot::RwLock::new(Arc::new(exports)),
                config,
                signal: Arc::new(StopSignal::new()?),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// A server with one export, reachable under any name the client uses
    /// for the default export ("") and under `name`.
    pub fn single(name: &str, export: Arc<dyn Export>, config: ServerConfig) -> io::Result<Server> {
        Server::new(vec![ExportEntry::new(name, export)], config)
    }

    /// A handle to stop the server (every listener it serves).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            signal: self.inner.signal.clone(),
        }
    }

    /// Runs `serve` on a new thread.
    pub fn spawn(self, listener: Listener) -> io::Result<RunningServer> {
        let handle = self.shutdown_handle();
        let inner = self.inner.clone();
        let thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || self.serve(listener))?;
        Ok(RunningServer {
            handle,
            inner,
            thread,
        })
    }

    /// Accepts and serves connections until [`ShutdownHandle::shutdown`].
    /// May run concurrently on several listeners (e.g. Unix and TCP) of
    /// the same server; one shutdown stops them all. On shutdown it
    /// stops accepting, stops reading new requests, waits for in-flight
    /// requests (up to `shutdown_grace`, after which connections are cut),
    /// flushes every export, and returns the first flush error.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let inner = &self.inner;
        listener.set_nonblocking()?;
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut accept_errors = 0u64;
        while !inner.signal.is_set() {
            let (stream, peer) = match listener.accept_or_wake(&inner.signal.waker) {
                Ok(Some(x)) => {
                    accept_errors = 0;
                    x
                }
                // Woken: only a shutdown does that.
                Ok(None) => break,
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
            if inner.signal.is_set() {
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
            if !inner.slots.admit(id, handle, &peer) {
                continue;
            }
            let inner2 = inner.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    // Bookkeeping happens even if the connection panics.
                    let _done = SlotGuard(&inner2.slots, id);
                    let peer = format!("nbd conn #{id} ({peer})");
                    connection::run(&inner2.env(), id, stream, &peer);
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    log::error!("cannot spawn connection thread: {e}");
                    inner.slots.finish(id);
                }
            }
        }
        drop(listener);
        log::info!("NBD server shutting down");
        wind_down(
            &inner.slots,
            inner.config.shutdown_grace,
            threads,
            &inner.exports.read().clone(),
        )
    }
}

/// Gives a connection's slot back when its thread ends, even by a panic.
struct SlotGuard<'a>(&'a Slots, u64);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        mark_thread_done();
        self.0.finish(self.1);
    }
}

/// Renames the calling thread `nbd-done`: it is giving its slot back and
/// has only to exit. The slots bound the threads that hold one; a thread
/// past that point may still be listed for a moment (until the scheduler
/// runs it to its end), and its name tells it apart in `ps -L`, `top -H`
/// and the thread-count test (`tests/limits.rs`).
fn mark_thread_done() {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (at most 16 bytes
    // with the NUL) from a pointer that is valid for the call, and renames
    // only the calling thread.
    unsafe {
        libc::prctl(
            libc::PR_SET_NAME,
            c"nbd-done".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
    }
}
