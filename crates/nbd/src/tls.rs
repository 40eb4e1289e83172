//! TLS for NBD (`NBD_OPT_STARTTLS`): server credentials ([`TlsConfig`]) and
//! the encrypted stream a connection switches to after the option's ACK.
//!
//! Two credential kinds, as nbdkit, qemu-nbd and libnbd offer them:
//!
//! - **X.509** certificates, served with rustls (TLS 1.2 and 1.3), with
//!   optional verification of client certificates against a CA.
//! - **Pre-shared keys** in GnuTLS `psktool` format (`identity:hexkey` per
//!   line), served with OpenSSL: rustls (0.23) implements no external PSK,
//!   and libnbd, nbdkit and qemu speak TLS-PSK through GnuTLS, which OpenSSL
//!   interoperates with (TLS 1.3 external PSK with (EC)DHE, or TLS 1.2
//!   `ECDHE-PSK`/`PSK` suites).
//!
//! Both sit behind one internal interface (`Session`): a TLS state machine
//! fed with ciphertext and drained of ciphertext, never touching the socket
//! itself. `TlsStream` puts it on a socket so that one thread can read
//! while others write: the connection's reader blocks in the socket read
//! without holding the session lock, and writers encrypt under the lock but
//! send under a separate one. That keeps the server's threading (a reader
//! and several workers writing replies) unchanged with TLS.

use openssl::ex_data::Index;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslStream, SslVersion,
};
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

/// Bytes of ciphertext read from the socket at once.
const READ_CHUNK: usize = 64 << 10;
/// Plaintext encrypted at once by a writer (then sent before the next).
const WRITE_CHUNK: usize = 64 << 10;
/// Unprocessed ciphertext a session may hold; more means the peer floods us
/// with records the TLS library refuses to take (a bug or an attack).
const MAX_PENDING_CIPHERTEXT: usize = 1 << 20;
/// Shortest pre-shared key accepted (128 bits).
pub const MIN_PSK_LEN: usize = 16;
/// Longest pre-shared key accepted (OpenSSL's `PSK_MAX_PSK_LEN`).
pub const MAX_PSK_LEN: usize = 512;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

/// Server-side TLS credentials: X.509 (rustls) or pre-shared keys
/// (OpenSSL). Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    X509 {
        config: Arc<rustls::ServerConfig>,
        verifies_clients: bool,
    },
    Psk {
        ctx: SslContext,
        identities: usize,
        /// Where the PSK callback records the identity it accepted.
        identity_slot: Index<Ssl, String>,
    },
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never prints key material.
        f.write_str(&self.describe())
    }
}

impl TlsConfig {
    /// X.509 credentials from PEM files: the server's certificate chain
    /// (leaf first) and its private key; with `client_ca`, clients must
    /// present a certificate signed by one of the CA certificates in that
    /// file. Warns (log) if the key file is readable by others.
    pub fn x509_from_files(
        cert_chain: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> io::Result<TlsConfig> {
        let read = |p: &Path, what: &str| {
            std::fs::read(p)
                .map_err(|e| io::Error::new(e.kind(), format!("{what} {}: {e}", p.display())))
        };
        warn_if_readable_by_others(key, "TLS private key");
        let ca = match client_ca {
            Some(p) => Some(read(p, "reading CA certificates")?),
            None => None,
        };
        TlsConfig::x509_from_pem(
            &read(cert_chain, "reading certificate")?,
            &read(key, "reading private key")?,
            ca.as_deref(),
        )
    }

    /// X.509 credentials from PEM text (see [`TlsConfig::x509_from_files`]).
    pub fn x509_from_pem(
        cert_chain_pem: &[u8],
        key_pem: &[u8],
        client_ca_pem: Option<&[u8]>,
    ) -> io::Result<TlsConfig> {
        let chain = certificates(cert_chain_pem, "server certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| invalid(format!("no usable private key in the key file: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS setup: {e}")))?;
        let builder = match client_ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certificates(pem, "CA certificate")? {
                    roots
                        .add(c)
                        .map_err(|e| invalid(format!("unusable CA certificate: {e}")))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .map_err(|e| invalid(format!("client certificate verifier: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| invalid(format!("certificate and key do not go together: {e}")))?;
        // NBD clients do not resume sessions; tickets would only cost a
        // round of work and state per connection.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(TlsConfig {
            backend: Backend::X509 {
                config: Arc::new(config),
                verifies_clients: client_ca_pem.is_some(),
            },
        })
    }

    /// Pre-shared keys from a GnuTLS `psktool` keys file (`identity:hexkey`
    /// per line, as libnbd's `tls-psk-file` and nbdkit's `--tls-psk` read).
    /// Warns (log) if the file is readable by others.
    pub fn psk_from_file(path: &Path) -> io::Result<TlsConfig> {
        warn_if_readable_by_others(path, "PSK keys file");
        let text = std::fs::read_to_string(path)
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
        let keys =
            parse_psk_file(&text).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        TlsConfig::psk(keys)
    }

    /// Pre-shared keys: (identity, key) pairs; identities must be unique,
    /// keys [`MIN_PSK_LEN`]..=[`MAX_PSK_LEN`] bytes.
    pub fn psk(keys: Vec<(String, Vec<u8>)>) -> io::Result<TlsConfig> {
        if keys.is_empty() {
            return Err(invalid("no pre-shared keys"));
        }
        let mut table: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for (identity, key) in keys {
            if !(MIN_PSK_LEN..=MAX_PSK_LEN).contains(&key.len()) {
                return Err(invalid(format!(
                    "the key of {identity:?} is {} bytes; keys must be {MIN_PSK_LEN} to {MAX_PSK_LEN} bytes",
                    key.len()
                )));
            }
            if table.insert(identity.clone().into_bytes(), key).is_some() {
                return Err(invalid(format!("identity {identity:?} appears twice")));
            }
        }
        let identities = table.len();
        let ssl_err = |e: openssl::error::ErrorStack| invalid(format!("TLS-PSK setup: {e}"));
        let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(ssl_err)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(ssl_err)?;
        // The server's suite order (AES-GCM first: hardware-accelerated on
        // most servers) rather than the client's.
        b.set_options(
            SslOptions::NO_RENEGOTIATION
                | SslOptions::NO_TICKET
                | SslOptions::CIPHER_SERVER_PREFERENCE,
        );
        // TLS 1.2: PSK suites with forward secrecy first, then plain PSK
        // (what GnuTLS clients offer). TLS 1.3: external PSKs are bound to
        // SHA-256 (OpenSSL's and GnuTLS's default), so SHA-256 suites.
        b.set_cipher_list("ECDHE-PSK+AESGCM:ECDHE-PSK+CHACHA20:ECDHE-PSK:PSK+AESGCM:PSK")
            .map_err(ssl_err)?;
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")
            .map_err(ssl_err)?;
        b.set_num_tickets(0).map_err(ssl_err)?;
        let identity_slot = Ssl::new_ex_index::<String>().map_err(ssl_err)?;
        b.set_psk_server_callback(move |ssl, identity, out| {
            // Unknown identity: 0 bytes, which OpenSSL treats as failure
            // (the handshake ends with an alert).
            let Some((identity, key)) = identity.and_then(|i| table.get_key_value(i)) else {
                return Ok(0);
            };
            if key.len() > out.len() {
                return Ok(0);
            }
            out[..key.len()].copy_from_slice(key);
            ssl.set_ex_data(
                identity_slot,
                String::from_utf8_lossy(identity).into_owned(),
            );
            Ok(key.len())
        });
        Ok(TlsConfig {
            backend: Backend::Psk {
                ctx: b.build(),
                identities,
                identity_slot,
            },
        })
    }

    /// One line for logs, without secrets.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::X509 {
                verifies_clients, ..
            } => format!(
                "X.509 (rustls){}",
                if *verifies_clients {
                    ", client certificates required"
                } else {
                    ""
                }
            ),
            Backend::Psk { identities, .. } => {
                format!("pre-shared keys (OpenSSL), {identities} identities")
            }
        }
    }

    fn new_session(&self) -> io::Result<Box<dyn Session>> {
        match &self.backend {
            Backend::X509 { config, .. } => {
                let conn = rustls::ServerConnection::new(config.clone())
                    .map_err(|e| io::Error::other(format!("TLS session: {e}")))?;
                Ok(Box::new(RustlsSession {
                    conn,
                    pending: Vec::new(),
                }))
            }
            Backend::Psk {
                ctx, identity_slot, ..
            } => {
                let ssl_err =
                    |e: openssl::error::ErrorStack| io::Error::other(format!("TLS session: {e}"));
                let ssl = Ssl::new(ctx).map_err(ssl_err)?;
                let stream = SslStream::new(ssl, MemIo::default()).map_err(ssl_err)?;
                Ok(Box::new(OpensslSession {
                    stream,
                    handshaking: true,
                    identity_slot: *identity_slot,
                }))
            }
        }
    }
}

fn certificates(pem: &[u8], what: &str) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("unreadable {what} PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(format!("no {what} found in the PEM file")));
    }
    Ok(certs)
}

fn warn_if_readable_by_others(path: &Path, what: &str) {
    if let Ok(md) = std::fs::metadata(path) {
        if md.permissions().mode() & 0o077 != 0 {
            log::warn!(
                "{what} {} is accessible to group or others (mode {:o}); chmod 600 it",
                path.display(),
                md.permissions().mode() & 0o777
            );
        }
    }
}

/// Parses a GnuTLS `psktool` keys file: one `identity:hexkey` per line;
/// blank lines and lines starting with `#` are skipped. The identity may
/// not contain `:`; the key is hexadecimal (even length).
pub fn parse_psk_file(text: &str) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| invalid(format!("line {}: {why}", i + 1));
        let Some((identity, hex)) = line.split_once(':') else {
            return Err(bad("expected identity:hexkey"));
        };
        if identity.is_empty() {
            return Err(bad("empty identity"));
        }
        let key = decode_hex(hex).ok_or_else(|| bad("the key is not hexadecimal"))?;
        keys.push((identity.to_string(), key));
    }
    if keys.is_empty() {
        return Err(invalid("no keys (expected identity:hexkey lines)"));
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

// ---------------------------------------------------------------------------
// The TLS state machine behind one interface.

/// A server-side TLS session that never touches a socket: ciphertext goes
/// in through `receive`, comes out through `take_outgoing`.
trait Session: Send {
    /// Takes ciphertext read from the peer and processes what it can. An
    /// error ends the session (an alert may be waiting in `take_outgoing`).
    fn receive(&mut self, ciphertext: &[u8]) -> io::Result<()>;
    /// Decrypted data: `Ok(n > 0)`; `Ok(0)` once the peer closed the TLS
    /// session (close_notify); `WouldBlock` when more ciphertext is needed.
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Encrypts a prefix of `data` and returns its length (0 only if
    /// nothing fits until `take_outgoing` is called).
    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Appends the ciphertext waiting to be sent to `out`.
    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()>;
    fn is_handshaking(&self) -> bool;
    /// Queues a close_notify alert.
    fn close(&mut self);
    /// Protocol, cipher and peer identity, for the log.
    fn describe(&self) -> String;
}

struct RustlsSession {
    conn: rustls::ServerConnection,
    /// Ciphertext received and not yet taken by rustls (it takes no more
    /// while decrypted data waits to be read).
    pending: Vec<u8>,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl RustlsSession {
    fn process(&mut self) -> io::Result<()> {
        while !self.pending.is_empty() && self.conn.wants_read() {
            let n = self.conn.read_tls(&mut &self.pending[..])?;
            self.pending.drain(..n);
            self.conn.process_new_packets().map_err(tls_error)?;
            if n == 0 {
                break;
            }
        }
        if self.pending.len() > MAX_PENDING_CIPHERTEXT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS: the peer sends more than can be processed",
            ));
        }
        Ok(())
    }
}

impl Session for RustlsSession {
    fn receive(&mut self, ciphertext: &[u8]) -> io::Result<()> {
        self.pending.extend_from_slice(ciphertext);
        self.process()
    }

    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.pending.is_empty() => {
                    let before = self.pending.len();
                    self.process()?;
                    if self.pending.len() == before {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize> {
        self.conn.writer().write(data)
    }

    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(out)?;
        }
        Ok(())
    }

    fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
    }

    fn describe(&self) -> String {
        let version = self
            .conn
            .protocol_version()
            .map(|v| format!("{v:?}"))
            .unwrap_or_default();
        let suite = self
            .conn
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
            .unwrap_or_default();
        let client = match self.conn.peer_certificates() {
            Some(c) if !c.is_empty() => ", client certificate verified",
            _ => "",
        };
        format!("{version} {suite}{client}")
    }
}

/// An in-memory transport for OpenSSL: reads what was received (or
/// `WouldBlock`), collects what it writes.
#[derive(Default)]
struct MemIo {
    inbound: Vec<u8>,
    read_pos: usize,
    outbound: Vec<u8>,
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = &self.inbound[self.read_pos..];
        if avail.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.read_pos += n;
        if self.read_pos == self.inbound.len() {
            self.inbound.clear();
            self.read_pos = 0;
        }
        Ok(n)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outbound.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct OpensslSession {
    stream: SslStream<MemIo>,
    handshaking: bool,
    identity_slot: Index<Ssl, String>,
}

fn ssl_error(e: openssl::ssl::Error) -> io::Error {
    match e.into_io_error() {
        Ok(io) => io,
        Err(e) => io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")),
    }
}

impl Session for OpensslSession {
    fn receive(&mut self, ciphertext: &[u8]) -> io::Result<()> {
        self.stream.get_mut().inbound.extend_from_slice(ciphertext);
        if self.handshaking {
            match self.stream.accept() {
                Ok(()) => self.handshaking = false,
                Err(e) if e.code() == ErrorCode::WANT_READ => {}
                Err(e) => return Err(ssl_error(e)),
            }
        }
        let io = self.stream.get_ref();
        if io.inbound.len() - io.read_pos > MAX_PENDING_CIPHERTEXT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS: the peer sends more than can be processed",
            ));
        }
        Ok(())
    }

    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.handshaking {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match self.stream.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(0),
            Err(e) if e.code() == ErrorCode::WANT_READ => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(ssl_error(e)),
        }
    }

    fn write_plain(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        // MemIo never refuses a write, so SSL_write takes all of `data`.
        self.stream.ssl_write(data).map_err(ssl_error)
    }

    fn take_outgoing(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        out.append(&mut self.stream.get_mut().outbound);
        Ok(())
    }

    fn is_handshaking(&self) -> bool {
        self.handshaking
    }

    fn close(&mut self) {
        let _ = self.stream.shutdown();
    }

    fn describe(&self) -> String {
        let ssl = self.stream.ssl();
        let cipher = ssl.current_cipher().map(|c| c.name()).unwrap_or("");
        let identity = ssl
            .ex_data(self.identity_slot)
            .map(String::as_str)
            .unwrap_or("");
        format!("{} {cipher}, PSK identity {identity:?}", ssl.version_str())
    }
}

// ---------------------------------------------------------------------------
// The stream.

/// Runs the server side of a TLS handshake on a socket: `early` is
/// ciphertext the caller already read past the STARTTLS option. Reads go
/// through `r` (so the caller's deadline applies), writes to `w`. On
/// failure, the alert (if any) is sent before returning the error.
pub(crate) fn handshake<R: Read, W: Write>(
    config: &TlsConfig,
    r: &mut R,
    w: &mut W,
    early: &[u8],
) -> io::Result<HandshakeDone> {
    let mut session = config.new_session()?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    let mut input: &[u8] = early;
    loop {
        if !input.is_empty() {
            if let Err(e) = session.receive(input) {
                let _ = session.take_outgoing(&mut out);
                let _ = w.write_all(&out).and_then(|_| w.flush());
                return Err(e);
            }
        }
        session.take_outgoing(&mut out)?;
        if !out.is_empty() {
            w.write_all(&out)?;
            w.flush()?;
            out.clear();
        }
        if !session.is_handshaking() {
            break;
        }
        let n = loop {
            match r.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client closed the connection during the TLS handshake",
            ));
        }
        input = &buf[..n];
    }
    Ok(HandshakeDone { session })
}

/// A finished TLS handshake, to be put on a socket with [`TlsStream::new`].
pub(crate) struct HandshakeDone {
    session: Box<dyn Session>,
}

impl HandshakeDone {
    pub(crate) fn describe(&self) -> String {
        self.session.describe()
    }
}

/// A TLS connection on a socket `S`. Clones share the session: any number
/// of threads may write (each `write` goes out whole, records in order)
/// while one reads; a reader blocked on the socket holds no lock writers
/// need.
pub(crate) struct TlsStream<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for TlsStream<S> {
    fn clone(&self) -> Self {
        TlsStream {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<S> {
    session: Mutex<Box<dyn Session>>,
    /// The socket reads come from and the ciphertext buffer; held for a
    /// whole `read`, so only one thread reads at a time.
    reader: Mutex<(S, Vec<u8>)>,
    /// The socket writes go to and a reusable ciphertext buffer; held from
    /// encrypting until the ciphertext is on the wire, so records leave in
    /// the order they were made. Lock order: `writer`, then `session`.
    writer: Mutex<(S, Vec<u8>)>,
    /// For shutdown and timeouts, which need no lock.
    control: S,
}

impl<S: Read + Write> TlsStream<S> {
    /// `reader`, `writer` and `control` are handles on the same socket.
    pub(crate) fn new(done: HandshakeDone, reader: S, writer: S, control: S) -> TlsStream<S> {
        TlsStream {
            shared: Arc::new(Shared {
                session: Mutex::new(done.session),
                reader: Mutex::new((reader, vec![0u8; READ_CHUNK])),
                writer: Mutex::new((writer, Vec::new())),
                control,
            }),
        }
    }

    /// The socket handle for shutdown and timeouts (not for IO).
    pub(crate) fn socket(&self) -> &S {
        &self.shared.control
    }

    /// Sends a close_notify alert (best effort: skipped if a writer is
    /// stuck on the socket).
    pub(crate) fn close(&self) {
        if let Some(mut w) = self.shared.writer.try_lock() {
            let (sock, out) = &mut *w;
            {
                let mut s = self.shared.session.lock();
                s.close();
                let _ = s.take_outgoing(out);
            }
            let _ = sock.write_all(out);
            out.clear();
        }
    }

    /// Sends what the session has queued on its own (alerts, key update
    /// replies) unless a writer is busy, in which case that writer's next
    /// send carries it.
    fn send_queued(&self) {
        if let Some(mut w) = self.shared.writer.try_lock() {
            let (sock, out) = &mut *w;
            if self.shared.session.lock().take_outgoing(out).is_ok() && !out.is_empty() {
                let _ = sock.write_all(out);
            }
            out.clear();
        }
    }

    fn send_plain(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut w = self.shared.writer.lock();
        let (sock, out) = &mut *w;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        // Coalesce small slices (a reply header and its data) into one
        // record instead of one per slice.
        let mut staged: Vec<u8> = Vec::with_capacity(total.min(WRITE_CHUNK));
        let mut flush_staged = |staged: &mut Vec<u8>| -> io::Result<()> {
            let mut rest: &[u8] = staged;
            while !rest.is_empty() {
                let n = {
                    let mut s = self.shared.session.lock();
                    let n = s.write_plain(rest)?;
                    s.take_outgoing(out)?;
                    n
                };
                if n == 0 && out.is_empty() {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                sock.write_all(out)?;
                out.clear();
                rest = &rest[n..];
            }
            staged.clear();
            Ok(())
        };
        for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() {
                let k = b.len().min(WRITE_CHUNK - staged.len());
                staged.extend_from_slice(&b[..k]);
                b = &b[k..];
                if staged.len() == WRITE_CHUNK {
                    flush_staged(&mut staged)?;
                }
            }
        }
        flush_staged(&mut staged)?;
        Ok(total)
    }
}

impl<S: Read + Write> Read for TlsStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut r = self.shared.reader.lock();
        let (sock, cbuf) = &mut *r;
        loop {
            match self.shared.session.lock().read_plain(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            // The session needs ciphertext: wait for it without the
            // session lock, so writers keep going meanwhile.
            let n = sock.read(cbuf)?;
            if n == 0 {
                // The peer closed the socket without close_notify; for
                // NBD that is the same as a plain disconnect.
                return Ok(0);
            }
            let received = self.shared.session.lock().receive(&cbuf[..n]);
            self.send_queued();
            received?;
        }
    }
}

impl<S: Read + Write> Write for TlsStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_plain(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.send_plain(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_parse_like_psktool_writes_them() {
        let keys = parse_psk_file(
            "# comment\nalice:000102030405060708090a0b0c0d0e0f\n\nbob:FFEEDDCCBBAA99887766554433221100aa\n",
        )
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0, "alice");
        assert_eq!(keys[0].1, (0u8..16).collect::<Vec<_>>());
        assert_eq!(keys[1].1[0], 0xff);
        assert_eq!(keys[1].1.len(), 17);
        for bad in ["alice", ":00ff", "alice:0g", "alice:abc", "alice:", ""] {
            assert!(parse_psk_file(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn psk_configs_refuse_short_keys_and_duplicates() {
        assert!(TlsConfig::psk(vec![("a".into(), vec![1; 8])]).is_err());
        assert!(
            TlsConfig::psk(vec![("a".into(), vec![1; 16]), ("a".into(), vec![2; 16])]).is_err()
        );
        assert!(TlsConfig::psk(vec![]).is_err());
        let c = TlsConfig::psk(vec![("a".into(), vec![1; 32])]).unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains("1 identities"), "{shown}");
    }

    #[test]
    fn x509_configs_refuse_garbage() {
        assert!(TlsConfig::x509_from_pem(b"not pem", b"not pem", None).is_err());
    }
}
