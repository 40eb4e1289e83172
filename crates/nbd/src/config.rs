//! The server's tunables: [`ServerConfig`] and [`TlsMode`].

use crate::handshake::TlsPhase;
use crate::tls::TlsConfig;
use std::time::Duration;

/// Tunables of a [`crate::Server`]. `Default` gives sensible values.
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
    /// The credentials, when TLS is on.
    pub(crate) fn config(&self) -> Option<&TlsConfig> {
        match self {
            TlsMode::Off => None,
            TlsMode::Optional(c) | TlsMode::Required(c) => Some(c),
        }
    }

    /// Where a new connection starts with TLS.
    pub(crate) fn phase(&self) -> TlsPhase {
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
