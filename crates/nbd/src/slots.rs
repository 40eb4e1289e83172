//! [`Slots`]: the server's connection slots. Admission (with the oldest
//! negotiating connection replaced when all are taken), the count of live
//! connections, and a handle on each connection's socket so that the
//! server can shut them down when it stops.

use crate::handshake::{HandshakeEnd, HandshakeError};
use crate::sockets::Socket;
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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

/// The live connections of a server (of every listener it serves), at most
/// `max_connections` of them past their handshake.
pub(crate) struct Slots {
    max_connections: usize,
    /// Live connections by id (ids grow, so the first negotiating entry is
    /// the oldest): a handle on each socket, to shut it down.
    conns: Mutex<BTreeMap<u64, ConnEntry>>,
    /// Lock order: `active`, then `conns`.
    active: Mutex<Counts>,
    active_cv: Condvar,
    refused: AtomicU64,
}

impl Slots {
    /// No connections yet; `max_connections` slots.
    pub(crate) fn new(max_connections: usize) -> Slots {
        Slots {
            max_connections,
            conns: Mutex::new(BTreeMap::new()),
            active: Mutex::new(Counts::default()),
            active_cv: Condvar::new(),
            refused: AtomicU64::new(0),
        }
    }

    /// Connections currently open (in handshake or transmission).
    pub(crate) fn active(&self) -> usize {
        self.active.lock().active
    }

    /// Takes a connection slot for connection `id` (whose socket `handle`
    /// is kept to shut it down), replacing the oldest connection still
    /// negotiating if all `max_connections` are taken. False (and the
    /// socket is to be closed) if every slot is past its handshake, or if
    /// replaced connections are slow to go away (never more than
    /// `max_connections` of those at once, which bounds threads). A true
    /// admission must be ended by [`Slots::finish`].
    pub(crate) fn admit(&self, id: u64, handle: Socket, peer: &str) -> bool {
        let max = self.max_connections;
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

    /// Gives connection `id`'s slot back (its thread is done) and wakes
    /// [`Slots::wait_idle`].
    pub(crate) fn finish(&self, id: u64) {
        let evicted = self.conns.lock().remove(&id).is_some_and(|c| c.evicted);
        let mut counts = self.active.lock();
        counts.active -= 1;
        if evicted {
            counts.evicted -= 1;
        }
        self.active_cv.notify_all();
    }

    /// After a negotiation ends: if it entered transmission, marks
    /// connection `id` as past negotiation (no longer replaced to make
    /// room), then flushes the final reply to the client.
    pub(crate) fn entered_transmission<W: Write>(
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

    /// Whether connection `id` was shut down to make room.
    pub(crate) fn is_evicted(&self, id: u64) -> bool {
        self.conns.lock().get(&id).is_some_and(|c| c.evicted)
    }

    /// shutdown(2) on every live connection's socket in direction `how`:
    /// `Read` lets in-flight requests finish and be answered, `Both` cuts
    /// the connections. Works on the sockets themselves, whatever became
    /// of the listener or the file system.
    pub(crate) fn shutdown_all(&self, how: Shutdown) {
        for c in self.conns.lock().values() {
            let _ = c.socket.shutdown(how);
        }
    }

    /// Waits until no connection is live or `deadline` passes; the number
    /// still live (0: all gone).
    pub(crate) fn wait_idle(&self, deadline: Instant) -> usize {
        let mut active = self.active.lock();
        while active.active > 0 {
            if self.active_cv.wait_until(&mut active, deadline).timed_out() {
                return active.active;
            }
        }
        0
    }
}
