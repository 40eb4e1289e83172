//! Stopping a server: the [`ShutdownHandle`] that asks for it, and
//! [`wind_down`], the stop sequence `serve` runs once its accept loop has
//! ended (in-flight requests finish, connections close, exports flush).

use crate::handshake::ExportEntry;
use crate::slots::Slots;
use crate::wake::Waker;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The stop request every part of a server watches: the accept loops, the
/// handshakes (which refuse new exports once it is set) and the
/// connections (which then log a client's close quietly).
pub(crate) struct StopSignal {
    /// Set once by [`ShutdownHandle::shutdown`].
    pub(crate) stop: AtomicBool,
    /// Wakes every accept loop (they poll it with their listener).
    pub(crate) waker: Waker,
}

impl StopSignal {
    /// Not stopping.
    pub(crate) fn new() -> io::Result<StopSignal> {
        Ok(StopSignal {
            stop: AtomicBool::new(false),
            waker: Waker::new()?,
        })
    }

    /// Whether a stop was asked for.
    pub(crate) fn is_set(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Stops a running server: it stops accepting, lets every connection finish
/// its in-flight requests (up to `shutdown_grace`), flushes the exports, and
/// `serve` returns.
#[derive(Clone)]
pub struct ShutdownHandle {
    pub(crate) signal: Arc<StopSignal>,
}

impl ShutdownHandle {
    /// Starts the shutdown; returns at once (wait on `serve`, or use
    /// [`crate::RunningServer::shutdown`]). Idempotent.
    pub fn shutdown(&self) {
        if self.signal.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept loops through their waker, not by connecting to
        // ourselves: the socket file may be gone (a cleaned /tmp), a TCP
        // connection may be filtered.
        self.signal.waker.wake();
    }

    /// Whether [`ShutdownHandle::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.signal.is_set()
    }
}

/// The stop sequence, after the accept loop ended: stops reading requests
/// (in-flight ones complete and are answered), waits for the connections
/// up to `grace` and then cuts those left, joins the connection `threads`,
/// and flushes every export (each once); the first flush error.
pub(crate) fn wind_down(
    slots: &Slots,
    grace: Duration,
    threads: Vec<JoinHandle<()>>,
    exports: &[ExportEntry],
) -> io::Result<()> {
    slots.shutdown_all(Shutdown::Read);
    let left = slots.wait_idle(Instant::now() + grace);
    if left > 0 {
        log::warn!("{left} connection(s) did not finish within the grace period; closing them");
        slots.shutdown_all(Shutdown::Both);
    }
    for t in threads {
        let _ = t.join();
    }

    let mut result = Ok(());
    let mut flushed: Vec<*const ()> = Vec::new();
    for e in exports {
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
