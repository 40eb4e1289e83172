//! tiercache-nbd: a Network Block Device server library.
//!
//! Serves anything implementing [`Export`] (the front-end contract of
//! `tiercache-frontend`, shared with the ublk front end) over the NBD
//! protocol (fixed newstyle handshake only) on a Unix or TCP socket.
//! Independent of the cache engine: the CLI adapts the engine to
//! [`Export`], binds a [`Listener`] and runs a [`Server`]. Every request's
//! range is checked by `tiercache_frontend::check_request` and every export
//! error mapped by `tiercache_frontend::errno` (then narrowed to the wire's
//! values, [`nbd_errno`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};
//! let export = Arc::new(MemExport::new(64 << 20));
//! let server = Server::single("", export, ServerConfig::default()).unwrap();
//! let running = server.spawn(Listener::bind_unix("/tmp/nbd.sock").unwrap()).unwrap();
//! // ... clients use nbd+unix:///?socket=/tmp/nbd.sock ...
//! running.shutdown().unwrap(); // finishes in-flight requests, flushes
//! ```
//!
//! Protocol coverage: options `NBD_OPT_GO`, `NBD_OPT_INFO` (with
//! `NBD_INFO_EXPORT`, `NBD_INFO_BLOCK_SIZE`, `NBD_INFO_NAME`,
//! `NBD_INFO_DESCRIPTION`), `NBD_OPT_LIST`, `NBD_OPT_ABORT`,
//! `NBD_OPT_EXPORT_NAME`, `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_STARTTLS`
//! (TLS with X.509 certificates or pre-shared keys, optional or required:
//! see [`TlsMode`] and [`tls`]; refused with `NBD_REP_ERR_POLICY` when TLS
//! is off); anything else gets `NBD_REP_ERR_UNSUP`. Commands READ, WRITE (FUA), FLUSH, TRIM,
//! WRITE_ZEROES (NO_HOLE), DISC; simple and structured replies. Requests are
//! pipelined and executed concurrently.
//!
//! [`kernel_client`] attaches an export to the kernel's NBD client as
//! /dev/nbdN from inside the server (generic netlink, through a
//! [`LocalConnector`] connection), so that the device outlives the server
//! process: the next server takes it over (docs/RESTART.md).
//!
//! The wire parsing lives in [`proto`] as pure functions over byte slices
//! (fuzzed by `crates/nbd/fuzz`), the negotiation in [`handshake`] is generic
//! over `Read`/`Write`.
//!
//! The server, by file (each depends only on those listed before it):
//! `config.rs` ([`ServerConfig`], [`TlsMode`]), `sockets.rs` (a
//! connection's socket and its TLS stream), `inbuf.rs` (a connection's
//! read buffer, which the reader can top up without waiting), `wire.rs` ([`nbd_errno`],
//! [`transmission_flags`]), `wake.rs` (what wakes the accept loops on
//! shutdown, without the file system), `listener.rs` ([`Listener`]: binding and
//! accepting), `slots.rs` (admission and the live connections),
//! `shutdown.rs` ([`ShutdownHandle`] and the stop sequence),
//! `hit_ring.rs` (a connection's io_uring for cache hits read from
//! a file), `replies.rs` (read replies sent in batches), `transmission.rs` (a negotiated connection's reader, workers
//! and replies), `connection.rs` (a connection from handshake to close) and
//! `server.rs` ([`Server`], its accept loop, [`RunningServer`]).

mod config;
mod connection;
mod fixed_bufs;
pub mod handshake;
mod hit_ring;
mod inbuf;
pub mod kernel_client;
mod listener;
mod parts;
pub mod proto;
mod replies;
mod server;
mod shutdown;
mod slots;
mod sockets;
mod splice_out;
pub mod tls;
mod transmission;
mod wake;
mod wire;

pub use config::{ServerConfig, TlsMode};
pub use handshake::{ExportEntry, HandshakeEnd, HandshakeError, Negotiated, TlsPhase};
pub use listener::Listener;
pub use server::{Exports, LocalConnection, LocalConnector, RunningServer, Server};
pub use shutdown::ShutdownHandle;
/// The front-end contract, from `tiercache-frontend` (re-exported so that
/// users of this crate alone need no second import).
pub use tiercache_frontend::{BlockSizes, Export, MemExport, DEFAULT_MAX_BLOCK};
pub use tls::TlsConfig;
pub use wire::{nbd_errno, transmission_flags};
