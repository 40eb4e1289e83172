//! One connection up to transmission: the handshake (with STARTTLS), then
//! [`crate::transmission::serve`] for its requests. Runs on the
//! connection's own thread; returns when the connection is closed.

use crate::config::ServerConfig;
use crate::handshake::{
    negotiate, negotiate_options, ExportEntry, HandshakeEnd, HandshakeError, HandshakeParams,
    TlsPhase,
};
use crate::slots::Slots;
use crate::sockets::{Socket, Stream};
use crate::tls::{TlsConfig, TlsStream};
use crate::transmission;
use std::io::{self, BufReader, BufWriter, Read};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// What a connection needs of its server.
pub(crate) struct ConnEnv<'a> {
    /// The exports a client may choose from: the server's list when the
    /// connection arrived (exports added or removed later are for later
    /// connections; a removed export's connections keep it).
    pub(crate) exports: std::sync::Arc<Vec<ExportEntry>>,
    /// The server's tunables.
    pub(crate) config: &'a ServerConfig,
    /// Set when the server stops.
    pub(crate) stopping: &'a AtomicBool,
    /// The server's connection slots (this connection holds one).
    pub(crate) slots: &'a Slots,
    /// Where the connection starts with TLS: the server's policy, or
    /// [`TlsPhase::Unavailable`] for a local socket pair
    /// ([`crate::LocalConnector`]).
    pub(crate) tls: TlsPhase,
}

/// Serves connection `id` on `socket` (its slot already taken in
/// `env.slots`): negotiates, upgrades to TLS if asked, then serves requests
/// until the client disconnects or the server stops. `peer` names the
/// connection in logs.
pub(crate) fn run(env: &ConnEnv<'_>, id: u64, socket: Socket, peer: &str) {
    let cfg = env.config;
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
        exports: &env.exports,
        max_block: cfg.max_block,
        shutting_down: env.stopping,
        max_options: cfg.max_options,
        tls: env.tls,
    };
    // Option replies are flushed by `negotiate`, except the one entering
    // transmission, which is flushed below once the connection is marked
    // as past negotiation; STARTTLS's ACK is flushed.
    let mut end = {
        let mut w = BufWriter::new(&mut writer);
        let end = negotiate(&mut reader, &mut w, &params);
        env.slots.entered_transmission(id, end, &mut w)
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
                end = env.slots.entered_transmission(id, e, &mut w);
            }
            Err(e) => {
                if env.slots.is_evicted(id) {
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
        Err(_) if env.slots.is_evicted(id) => {
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
    let entry = &env.exports[n.export];
    log::info!(
        "{peer}: serving export {:?} ({} bytes, flags {:#x}, structured replies {})",
        entry.name,
        n.ctx.size,
        n.ctx.flags,
        n.structured_replies
    );
    transmission::serve(
        peer,
        &*entry.export,
        n.structured_replies,
        writer,
        reader,
        &n.ctx,
        cfg,
        env.stopping,
    );
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
