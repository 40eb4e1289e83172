//! [`KernelDevice`]: an export of a running server attached to the
//! kernel's NBD client as /dev/nbdN, by the server itself, so that the
//! device outlives the server: configured through netlink with a
//! dead-connection timeout, taken over by the next server with
//! RECONFIGURE, and given a new connection whenever its connection closes.
//!
//! Lifecycle (docs/RESTART.md):
//! - [`KernelDevice::attach`]: if STATUS says device N has no
//!   configuration, CONNECT with one local connection (a socket pair
//!   negotiated in-process, see [`crate::LocalConnector`]); if it has one
//!   (a previous server died or handed over: its requests wait), check
//!   that it is ours (backend identifier, size) and RECONFIGURE it with a
//!   new connection; the held requests then reach this server.
//! - while serving, a watcher thread gives the kernel a new connection
//!   whenever the current one closed (the server ended it);
//! - [`KernelDevice::detach`] (a plain stop): DISCONNECT, the device is
//!   free again; [`KernelDevice::leave`] (a hand-over): nothing is said to
//!   the kernel, the device waits for the next server.
//!
//! Requests the dead server had taken but not answered stay in flight in
//! the kernel until their timer fires; with no request timeout set through
//! netlink, the driver then re-queues them if the socket changed (a new
//! connection), else re-arms the timer, and never fails them for
//! slowness. The timer's period is the queue's `io_timeout`, which
//! [`KernelDevice::attach`] sets to `requeue_check`: the longest a held
//! request waits after the new connection is there.

use super::commands::{Connect, DeviceStatus, NbdNetlink};
use super::negotiate::{negotiate, ExportInfo};
use crate::server::{LocalConnection, LocalConnector};
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to attach where.
#[derive(Debug, Clone)]
pub struct KernelDeviceConfig {
    /// The N of /dev/nbdN.
    pub index: u32,
    /// The export of the server to attach.
    pub export: String,
    /// Who serves the device: recorded by the kernel at CONNECT, and a
    /// takeover is refused unless it matches (another cache's server
    /// cannot take the device).
    pub backend: String,
    /// Seconds the kernel holds the device's IO while no server serves it
    /// (then the IO fails).
    pub dead_conn_timeout: u64,
    /// The period of the requests' timer (the queue's `io_timeout`): how
    /// long a request taken by a dead server waits, at most, once the next
    /// server is there.
    pub requeue_check: Duration,
}

/// The default of [`KernelDeviceConfig::requeue_check`].
pub const DEFAULT_REQUEUE_CHECK: Duration = Duration::from_secs(2);

/// How [`KernelDevice::attach`] found the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attached {
    /// It was free: connected anew.
    Connected,
    /// A previous server had left it waiting: taken over, in this time
    /// (STATUS to the kernel holding the new connection).
    TookOver(Duration),
}

/// The block size the device is given: 4 KiB (what file systems use), or
/// the export's minimum when that is larger than the kernel allows.
const BLOCK_SIZE: u32 = 4096;

/// How long a takeover retries while the old connection is not yet dead
/// (its process exiting) before it concludes a live process serves it.
const TAKEOVER_PATIENCE: Duration = Duration::from_secs(5);

/// Between two checks of the watcher.
const WATCH_PERIOD: Duration = Duration::from_millis(50);

/// An export served as /dev/nbdN (see the module comment).
pub struct KernelDevice {
    cfg: Arc<KernelDeviceConfig>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

fn sys_path(index: u32, file: &str) -> PathBuf {
    PathBuf::from(format!("/sys/block/nbd{index}/{file}"))
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// A connection to the server, negotiated for `cfg.export`.
fn open_connection(
    connector: &LocalConnector,
    cfg: &KernelDeviceConfig,
) -> io::Result<(LocalConnection, ExportInfo)> {
    let mut conn = connector.connect(&format!("kernel /dev/nbd{}", cfg.index))?;
    conn.client
        .set_read_timeout(Some(Duration::from_secs(30)))?;
    let info = negotiate(&mut conn.client, &cfg.export)?;
    // The kernel's own reads honour the socket's timeout: none.
    conn.client.set_read_timeout(None)?;
    Ok((conn, info))
}

/// Whether the client end of `server_end`'s connection is closed
/// everywhere (reads end-of-file), without consuming anything.
fn client_closed(server_end: &std::os::unix::net::UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: `b` is valid for one byte; the fd is open for the call
    // (borrowed from `server_end`).
    let n = unsafe {
        libc::recv(
            server_end.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0
}

/// Hands device `cfg.index` a new connection with RECONFIGURE. Err
/// (`WouldBlock`) when the kernel did not take it: its connection is not
/// dead (yet).
fn reconnect(
    nl: &mut NbdNetlink,
    connector: &LocalConnector,
    cfg: &KernelDeviceConfig,
) -> io::Result<JoinHandle<()>> {
    let (conn, info) = open_connection(connector, cfg)?;
    let device_sectors = read_u64(&sys_path(cfg.index, "size"))?;
    if device_sectors != info.size >> 9 {
        return Err(other(format!(
            "/dev/nbd{} has {} bytes, the export {:?} {}: not this export's device",
            cfg.index,
            device_sectors << 9,
            cfg.export,
            info.size
        )));
    }
    nl.reconfigure(
        cfg.index,
        &cfg.backend,
        cfg.dead_conn_timeout,
        &[conn.client.as_raw_fd()],
    )?;
    let LocalConnection {
        client,
        server_end,
        thread,
    } = conn;
    // The kernel holds its own reference if it took the socket; if it did
    // not (RECONFIGURE replaces dead sockets only, and says nothing when
    // it found none), this closes it, and its server end reads EOF at once.
    drop(client);
    if client_closed(&server_end) {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("/dev/nbd{}'s connection is not dead", cfg.index),
        ));
    }
    Ok(thread)
}

fn read_u64(path: &std::path::Path) -> io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|_| other(format!("{}: not a number: {text:?}", path.display())))
}

/// Sets the period of the requests' timer (see the module comment), if
/// it is not set already: the queue keeps it across configurations, and
/// the kernel freezes the queue to write it (waiting for every request in
/// flight), which a takeover should not wait for.
fn set_requeue_check(cfg: &KernelDeviceConfig) {
    let path = sys_path(cfg.index, "queue/io_timeout");
    let ms = cfg.requeue_check.as_millis().max(1000) as u64;
    if read_u64(&path).ok() == Some(ms) {
        return;
    }
    if let Err(e) = std::fs::write(&path, ms.to_string()) {
        log::warn!(
            "{}: {e}: requests held across a restart wait for the kernel's default timer (30 s)",
            path.display()
        );
    }
}

impl KernelDevice {
    /// Attaches `cfg.export` of the server `connector` reaches as
    /// /dev/nbd`cfg.index` (see the module comment); a device left waiting
    /// by a previous server of the same backend is taken over. Refused: a
    /// device configured by another backend or of another size, one whose
    /// connection is alive, or one that is open (and so configured by the
    /// kernel for its opener).
    pub fn attach(
        connector: LocalConnector,
        cfg: KernelDeviceConfig,
    ) -> io::Result<(KernelDevice, Attached)> {
        let t0 = Instant::now();
        let mut nl = NbdNetlink::open()?;
        let index = cfg.index;
        let (thread, attached) = match nl.status(index)? {
            DeviceStatus::Configured => {
                match std::fs::read_to_string(sys_path(index, "backend")) {
                    Ok(b) if b.trim_end_matches('\n') != cfg.backend => {
                        return Err(other(format!(
                            "/dev/nbd{index} is in use by another client (backend {:?}, this \
                             server is {:?})",
                            b.trim_end_matches('\n'),
                            cfg.backend
                        )))
                    }
                    _ => {}
                }
                let deadline = Instant::now() + TAKEOVER_PATIENCE;
                let thread = loop {
                    match reconnect(&mut nl, &connector, &cfg) {
                        Ok(t) => break t,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                return Err(other(format!(
                                    "/dev/nbd{index} is being served by a live process (its \
                                     connection is alive after {} s)",
                                    TAKEOVER_PATIENCE.as_secs()
                                )));
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        Err(e) => return Err(other(format!("taking /dev/nbd{index} over: {e}"))),
                    }
                };
                (thread, Attached::TookOver(t0.elapsed()))
            }
            DeviceStatus::Absent | DeviceStatus::Free => {
                let (conn, info) = open_connection(&connector, &cfg)?;
                if info.min_block > BLOCK_SIZE || BLOCK_SIZE % info.min_block != 0 {
                    return Err(other(format!(
                        "export {:?} needs blocks of {} bytes; the kernel's NBD client takes {BLOCK_SIZE}",
                        cfg.export, info.min_block
                    )));
                }
                let connect = Connect {
                    index,
                    size: info.size,
                    block_size: u64::from(BLOCK_SIZE),
                    server_flags: info.flags,
                    dead_conn_timeout: cfg.dead_conn_timeout,
                    backend: cfg.backend.clone(),
                    sockets: vec![conn.client.as_raw_fd()],
                };
                nl.connect(&connect).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EBUSY) {
                        other(format!(
                            "/dev/nbd{index} is in use (configured by another client, or open)"
                        ))
                    } else {
                        e
                    }
                })?;
                (conn.thread, Attached::Connected)
            }
        };
        set_requeue_check(&cfg);
        tiercache_frontend::prefer_no_scheduler(&format!("nbd{index}"));
        let cfg = Arc::new(cfg);
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (cfg, stop) = (cfg.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("nbd{index}-watch"))
                .spawn(move || watch(nl, connector, &cfg, thread, &stop))?
        };
        Ok((
            KernelDevice {
                cfg,
                stop,
                watcher: Some(watcher),
            },
            attached,
        ))
    }

    /// /dev/nbdN.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/nbd{}", self.cfg.index))
    }

    /// The export attached.
    pub fn export(&self) -> &str {
        &self.cfg.export
    }

    fn stop_watching(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }

    /// A plain stop: the kernel disconnects the device (it sends a
    /// disconnect on the connection and fails what is still in flight)
    /// and it is free again. Unmount first.
    pub fn detach(mut self) -> io::Result<()> {
        self.stop_watching();
        NbdNetlink::open()?.disconnect(self.cfg.index)
    }

    /// A hand-over: stops giving the kernel new connections and leaves
    /// the device configured; when the server's connections close, its IO
    /// waits (up to the dead-connection timeout) for the next server.
    pub fn leave(mut self) {
        self.stop_watching();
    }
}

impl Drop for KernelDevice {
    fn drop(&mut self) {
        self.stop_watching();
    }
}

/// The watcher: while not stopped, gives the kernel a new connection each
/// time the current one (`thread`) ended.
fn watch(
    mut nl: NbdNetlink,
    connector: LocalConnector,
    cfg: &KernelDeviceConfig,
    mut thread: JoinHandle<()>,
    stop: &AtomicBool,
) {
    let mut failures = 0u32;
    loop {
        std::thread::sleep(WATCH_PERIOD);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if !thread.is_finished() {
            continue;
        }
        log::warn!(
            "/dev/nbd{}: its connection closed; giving the kernel a new one",
            cfg.index
        );
        match reconnect(&mut nl, &connector, cfg) {
            Ok(t) => {
                thread = t;
                failures = 0;
                log::info!("/dev/nbd{}: reconnected", cfg.index);
            }
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    log::error!(
                        "/dev/nbd{}: cannot give the kernel a new connection ({failures} tries): {e}",
                        cfg.index
                    );
                }
                std::thread::sleep(Duration::from_millis(100 * u64::from(failures.min(10))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_client_end_counts_as_closed_only_when_no_handle_is_left() {
        let (client, server) = UnixStream::pair().unwrap();
        assert!(!client_closed(&server));
        // Another holder (the kernel, after RECONFIGURE) keeps it open.
        let held = client.try_clone().unwrap();
        drop(client);
        assert!(!client_closed(&server));
        // Data waiting is not end-of-file, and is not consumed.
        (&held).write_all(b"x").unwrap();
        assert!(!client_closed(&server));
        drop(held);
        // Closed everywhere: end-of-file at once, after the data.
        let mut b = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &server, &mut b).unwrap(), 1);
        assert!(client_closed(&server));
    }
}
