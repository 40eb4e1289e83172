//! Fixed newstyle negotiation (option haggling), generic over the byte
//! stream so it can run over a socket, or over in-memory buffers in tests
//! and fuzz targets.

use crate::proto::{self, ClientFlags, ClientOption, InfoRequest, TransmissionContext};
use crate::wire::transmission_flags;
use std::fmt;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_frontend::{BlockSizes, Export};

/// One named export offered by a server.
#[derive(Clone)]
pub struct ExportEntry {
    /// Name clients ask for. The empty name (the spec's "default export")
    /// selects the entry named "" if there is one, else the first entry.
    pub name: String,
    /// Free text shown by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub description: String,
    pub export: Arc<dyn Export>,
}

impl ExportEntry {
    pub fn new(name: impl Into<String>, export: Arc<dyn Export>) -> ExportEntry {
        ExportEntry {
            name: name.into(),
            description: String::new(),
            export,
        }
    }

    pub fn with_description(mut self, d: impl Into<String>) -> Self {
        self.description = d.into();
        self
    }
}

impl fmt::Debug for ExportEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportEntry")
            .field("name", &self.name)
            .field("size", &self.export.size())
            .finish()
    }
}

/// The block sizes actually advertised for `export` by a server whose cap
/// on request length is `server_max`: the export's maximum lowered to the
/// cap, rounded down to a multiple of the minimum (never below it).
pub fn effective_block_sizes(export: &dyn Export, server_max: u32) -> BlockSizes {
    let b = export.block_size_constraints();
    let min = b.min.max(1);
    let max = b.max.min(server_max);
    let max = (max - max % min).max(min);
    BlockSizes {
        min,
        preferred: b.preferred,
        max,
    }
}

/// Inputs of a negotiation.
pub struct HandshakeParams<'a> {
    pub exports: &'a [ExportEntry],
    /// Server-wide cap on request length.
    pub max_block: u32,
    /// When set, options other than `NBD_OPT_ABORT` get
    /// `NBD_REP_ERR_SHUTDOWN`.
    pub shutting_down: &'a AtomicBool,
    /// Options accepted before the client is deemed abusive.
    pub max_options: usize,
    /// Where this connection stands with TLS.
    pub tls: TlsPhase,
}

/// The connection's TLS state, as the spec's server modes see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPhase {
    /// NOTLS: `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_POLICY`.
    Unavailable,
    /// SELECTIVETLS with no TLS-only export: the client may upgrade with
    /// `NBD_OPT_STARTTLS` or go on in plain text.
    Optional,
    /// FORCEDTLS before the upgrade: every option but `NBD_OPT_STARTTLS`
    /// and `NBD_OPT_ABORT` gets `NBD_REP_ERR_TLS_REQD`
    /// (`NBD_OPT_EXPORT_NAME`, which cannot be refused, disconnects).
    Required,
    /// TLS is running: `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_INVALID`.
    Active,
}

/// A successful negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Index into `HandshakeParams::exports`.
    pub export: usize,
    pub structured_replies: bool,
    pub ctx: TransmissionContext,
}

/// How a negotiation ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEnd {
    Transmission(Negotiated),
    /// The client sent `NBD_OPT_ABORT` (soft disconnect).
    Aborted,
    /// `NBD_OPT_STARTTLS` was acknowledged: the caller runs the TLS
    /// handshake, then [`negotiate_options`] over TLS with these client
    /// flags and [`TlsPhase::Active`]. Nothing negotiated before carries
    /// over (the spec: structured replies must be asked for again).
    StartTls(ClientFlags),
}

/// Why a negotiation failed: the connection must be closed.
#[derive(Debug)]
pub enum HandshakeError {
    Io(io::Error),
    /// The client broke a MUST of the spec, or asked for something that can
    /// only be refused by disconnecting.
    Protocol(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Io(e) => write!(f, "I/O error during handshake: {e}"),
            HandshakeError::Protocol(s) => write!(f, "protocol violation during handshake: {s}"),
        }
    }
}

impl std::error::Error for HandshakeError {}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

fn protocol(s: impl Into<String>) -> HandshakeError {
    HandshakeError::Protocol(s.into())
}

fn reply<W: Write>(w: &mut W, option: u32, typ: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(&proto::encode_option_reply_header(
        option,
        typ,
        data.len() as u32,
    ))?;
    w.write_all(data)
}

fn find_export(exports: &[ExportEntry], name: &str) -> Option<usize> {
    let default = (name.is_empty() && !exports.is_empty()).then_some(0);
    exports.iter().position(|e| e.name == name).or(default)
}

/// Runs the server side of fixed newstyle negotiation: sends the greeting,
/// then answers options until the client enters transmission
/// (`NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`), aborts, or misbehaves.
///
/// `w` is flushed after every reply, except the last one when entering
/// transmission: the caller flushes it, after recording that the client is
/// past negotiation, so that nothing it does once it has the reply can
/// find the connection still negotiating. Never panics, whatever `r` yields;
/// memory use is bounded by [`proto::MAX_OPTION_DATA_LEN`] per option.
pub fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    p: &HandshakeParams<'_>,
) -> Result<HandshakeEnd, HandshakeError> {
    w.write_all(&proto::encode_greeting(proto::SERVER_HANDSHAKE_FLAGS))?;
    w.flush()?;
    let mut cf = [0u8; 4];
    r.read_exact(&mut cf)?;
    let client_flags = proto::parse_client_flags(&cf, proto::SERVER_HANDSHAKE_FLAGS)
        .map_err(|e| protocol(e.to_string()))?;
    negotiate_options(r, w, p, client_flags)
}

/// The option haggling part of [`negotiate`], after the greeting and the
/// client flags: on its own, it continues a negotiation over TLS after
/// [`HandshakeEnd::StartTls`].
pub fn negotiate_options<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    p: &HandshakeParams<'_>,
    client_flags: ClientFlags,
) -> Result<HandshakeEnd, HandshakeError> {
    let mut structured = false;
    for _ in 0..p.max_options {
        let mut hb = [0u8; proto::OPTION_HEADER_LEN];
        r.read_exact(&mut hb)?;
        let h = proto::parse_option_header(&hb).map_err(|e| protocol(e.to_string()))?;
        if h.length > proto::MAX_OPTION_DATA_LEN {
            return Err(protocol(format!(
                "option {} carries {} bytes of data (limit {})",
                h.option,
                h.length,
                proto::MAX_OPTION_DATA_LEN
            )));
        }
        let mut data = vec![0u8; h.length as usize];
        r.read_exact(&mut data)?;
        let opt = h.option;

        if p.shutting_down.load(Ordering::Relaxed) && opt != proto::OPT_ABORT {
            if opt == proto::OPT_EXPORT_NAME {
                return Err(protocol("server is shutting down"));
            }
            reply(w, opt, proto::REP_ERR_SHUTDOWN, b"server is shutting down")?;
            w.flush()?;
            continue;
        }

        if p.tls == TlsPhase::Required && opt != proto::OPT_STARTTLS && opt != proto::OPT_ABORT {
            if opt == proto::OPT_EXPORT_NAME {
                return Err(protocol(
                    "NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS on a server that requires TLS",
                ));
            }
            reply(
                w,
                opt,
                proto::REP_ERR_TLS_REQD,
                b"this server requires TLS: send NBD_OPT_STARTTLS first",
            )?;
            w.flush()?;
            continue;
        }

        let parsed = match proto::parse_option(opt, &data) {
            Ok(o) => o,
            Err(inv) => {
                if opt == proto::OPT_EXPORT_NAME {
                    return Err(protocol(format!("NBD_OPT_EXPORT_NAME: {inv}")));
                }
                reply(w, opt, proto::REP_ERR_INVALID, inv.0.as_bytes())?;
                w.flush()?;
                continue;
            }
        };
        match parsed {
            ClientOption::ExportName(name) => {
                let Some(i) = find_export(p.exports, &name) else {
                    return Err(protocol(format!("NBD_OPT_EXPORT_NAME: no export {name:?}")));
                };
                let export = &*p.exports[i].export;
                let flags = transmission_flags(export, structured);
                w.write_all(&export.size().to_be_bytes())?;
                w.write_all(&flags.to_be_bytes())?;
                if !client_flags.no_zeroes {
                    w.write_all(&[0u8; 124])?;
                }
                // Not flushed: see the contract.
                return Ok(HandshakeEnd::Transmission(negotiated(
                    i, export, structured, flags, p,
                )));
            }
            ClientOption::Abort => {
                // The client may already have closed; its loss.
                let _ = reply(w, opt, proto::REP_ACK, &[]).and_then(|_| w.flush());
                return Ok(HandshakeEnd::Aborted);
            }
            ClientOption::List => {
                for e in p.exports {
                    let mut d = Vec::with_capacity(4 + e.name.len() + e.description.len());
                    d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    reply(w, opt, proto::REP_SERVER, &d)?;
                }
                reply(w, opt, proto::REP_ACK, &[])?;
            }
            ClientOption::StartTls => match p.tls {
                TlsPhase::Unavailable => {
                    reply(
                        w,
                        opt,
                        proto::REP_ERR_POLICY,
                        b"TLS is not enabled on this server",
                    )?;
                }
                TlsPhase::Active => {
                    reply(w, opt, proto::REP_ERR_INVALID, b"TLS is already running")?;
                }
                TlsPhase::Optional | TlsPhase::Required => {
                    reply(w, opt, proto::REP_ACK, &[])?;
                    w.flush()?;
                    return Ok(HandshakeEnd::StartTls(client_flags));
                }
            },
            ClientOption::Info(req) | ClientOption::Go(req) => {
                let go = opt == proto::OPT_GO;
                match find_export(p.exports, &req.name) {
                    None => {
                        let msg = format!("no export named {:?}", req.name);
                        reply(w, opt, proto::REP_ERR_UNKNOWN, msg.as_bytes())?;
                    }
                    Some(i) => {
                        let flags = send_info(w, opt, &p.exports[i], &req, structured, p)?;
                        reply(w, opt, proto::REP_ACK, &[])?;
                        if go {
                            // Not flushed: see the contract.
                            let export = &*p.exports[i].export;
                            return Ok(HandshakeEnd::Transmission(negotiated(
                                i, export, structured, flags, p,
                            )));
                        }
                    }
                }
            }
            ClientOption::StructuredReply => {
                if structured {
                    reply(
                        w,
                        opt,
                        proto::REP_ERR_INVALID,
                        b"structured replies already negotiated",
                    )?;
                } else {
                    structured = true;
                    reply(w, opt, proto::REP_ACK, &[])?;
                }
            }
            ClientOption::Unsupported(_) => {
                reply(w, opt, proto::REP_ERR_UNSUP, b"option not supported")?;
            }
        }
        w.flush()?;
    }
    Err(protocol(format!(
        "more than {} options without entering transmission",
        p.max_options
    )))
}

fn negotiated(
    i: usize,
    export: &dyn Export,
    structured: bool,
    flags: u16,
    p: &HandshakeParams<'_>,
) -> Negotiated {
    let b = effective_block_sizes(export, p.max_block);
    Negotiated {
        export: i,
        structured_replies: structured,
        ctx: TransmissionContext {
            size: export.size(),
            flags,
            min_block: b.min,
            max_block: b.max,
        },
    }
}

/// Sends the `NBD_REP_INFO` replies for one `NBD_OPT_INFO`/`NBD_OPT_GO`
/// and returns the transmission flags it advertised. `NBD_INFO_EXPORT` and
/// `NBD_INFO_BLOCK_SIZE` are always sent (clients must ignore unrequested
/// info); the name and description only when asked for.
fn send_info<W: Write>(
    w: &mut W,
    opt: u32,
    e: &ExportEntry,
    req: &InfoRequest,
    structured: bool,
    p: &HandshakeParams<'_>,
) -> io::Result<u16> {
    let export = &*e.export;
    let flags = transmission_flags(export, structured);
    reply(
        w,
        opt,
        proto::REP_INFO,
        &proto::encode_info_export(export.size(), flags),
    )?;
    let b = effective_block_sizes(export, p.max_block);
    reply(
        w,
        opt,
        proto::REP_INFO,
        &proto::encode_info_block_size(b.min, b.preferred, b.max),
    )?;
    if req.requests.contains(&proto::INFO_NAME) {
        let mut d = proto::INFO_NAME.to_be_bytes().to_vec();
        d.extend_from_slice(e.name.as_bytes());
        reply(w, opt, proto::REP_INFO, &d)?;
    }
    if req.requests.contains(&proto::INFO_DESCRIPTION) && !e.description.is_empty() {
        let mut d = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
        d.extend_from_slice(e.description.as_bytes());
        reply(w, opt, proto::REP_INFO, &d)?;
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;
    use std::io::Cursor;
    use tiercache_frontend::MemExport;

    fn run(client: &[u8]) -> (Result<HandshakeEnd, HandshakeError>, Vec<u8>) {
        run_tls(client, TlsPhase::Unavailable)
    }

    fn run_tls(client: &[u8], tls: TlsPhase) -> (Result<HandshakeEnd, HandshakeError>, Vec<u8>) {
        let exports = vec![
            ExportEntry::new("a", Arc::new(MemExport::new(1 << 20))),
            ExportEntry::new("b", Arc::new(MemExport::new(4096).with_read_only(true)))
                .with_description("read-only"),
        ];
        let stop = AtomicBool::new(false);
        let p = HandshakeParams {
            exports: &exports,
            max_block: 1 << 20,
            shutting_down: &stop,
            max_options: 16,
            tls,
        };
        let mut out = Vec::new();
        let r = negotiate(&mut Cursor::new(client), &mut out, &p);
        (r, out)
    }

    /// Splits the server's output after the 18-byte greeting into option
    /// replies: (option, type, data).
    fn replies(out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        let mut b = &out[18..];
        while b.len() >= 20 {
            let h = parse_option_reply_header(b).unwrap();
            let n = h.length as usize;
            v.push((h.option, h.reply_type, b[20..20 + n].to_vec()));
            b = &b[20 + n..];
        }
        v
    }

    fn client(opts: &[ClientOption]) -> Vec<u8> {
        let mut c = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        }
        .encode()
        .to_vec();
        for o in opts {
            c.extend_from_slice(&o.encode());
        }
        c
    }

    #[test]
    fn go_with_structured_replies() {
        let c = client(&[
            ClientOption::StructuredReply,
            ClientOption::Unsupported(OPT_SET_META_CONTEXT),
            ClientOption::StartTls,
            ClientOption::Go(InfoRequest {
                name: "b".into(),
                requests: vec![INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
            }),
        ]);
        let (r, out) = run(&c);
        let Ok(HandshakeEnd::Transmission(n)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(n.export, 1);
        assert!(n.structured_replies);
        assert_ne!(n.ctx.flags & FLAG_READ_ONLY, 0);
        assert_ne!(n.ctx.flags & FLAG_SEND_DF, 0);
        let rs = replies(&out);
        let types: Vec<u32> = rs.iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            vec![
                REP_ACK,
                REP_ERR_UNSUP,
                REP_ERR_POLICY,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_INFO,
                REP_ACK
            ]
        );
        assert_eq!(rs[3].2, encode_info_export(4096, n.ctx.flags).to_vec());
        assert_eq!(&rs[5].2[2..], b"b");
        assert_eq!(&rs[6].2[2..], b"read-only");
    }

    #[test]
    fn unknown_export_and_list() {
        let c = client(&[
            ClientOption::Info(InfoRequest {
                name: "nope".into(),
                requests: vec![],
            }),
            ClientOption::List,
            ClientOption::Abort,
        ]);
        let (r, out) = run(&c);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)));
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            vec![REP_ERR_UNKNOWN, REP_SERVER, REP_SERVER, REP_ACK, REP_ACK]
        );
    }

    #[test]
    fn export_name_default_and_zeroes() {
        let mut c = ClientFlags {
            fixed_newstyle: true,
            no_zeroes: false,
        }
        .encode()
        .to_vec();
        c.extend_from_slice(&ClientOption::ExportName(String::new()).encode());
        let (r, out) = run(&c);
        let Ok(HandshakeEnd::Transmission(n)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(n.export, 0);
        assert_eq!(out.len(), 18 + 8 + 2 + 124);
        assert_eq!(&out[18..26], &(1u64 << 20).to_be_bytes());
    }

    #[test]
    fn malformed_input_is_refused() {
        // Unknown client flag.
        assert!(matches!(
            run(&8u32.to_be_bytes()).0,
            Err(HandshakeError::Protocol(_))
        ));
        // Bad option magic.
        let mut c = client(&[]);
        c.extend_from_slice(&[0u8; 16]);
        assert!(matches!(run(&c).0, Err(HandshakeError::Protocol(_))));
        // Truncated option data.
        let mut c = client(&[]);
        c.extend_from_slice(
            &OptionHeader {
                option: OPT_GO,
                length: 100,
            }
            .encode(),
        );
        assert!(matches!(run(&c).0, Err(HandshakeError::Io(_))));
        // Oversized option.
        let mut c = client(&[]);
        c.extend_from_slice(
            &OptionHeader {
                option: 99,
                length: MAX_OPTION_DATA_LEN + 1,
            }
            .encode(),
        );
        assert!(matches!(run(&c).0, Err(HandshakeError::Protocol(_))));
        // Malformed GO gets ERR_INVALID, then the session continues.
        let mut c = client(&[]);
        c.extend_from_slice(
            &OptionHeader {
                option: OPT_GO,
                length: 3,
            }
            .encode(),
        );
        c.extend_from_slice(&[0, 0, 0]);
        c.extend_from_slice(&ClientOption::Abort.encode());
        let (r, out) = run(&c);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)));
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        // Unknown export via EXPORT_NAME: disconnect.
        let c = client(&[ClientOption::ExportName("zz".into())]);
        assert!(matches!(run(&c).0, Err(HandshakeError::Protocol(_))));
        // Too many options.
        let c = client(&vec![ClientOption::Unsupported(99); 17]);
        assert!(matches!(run(&c).0, Err(HandshakeError::Protocol(_))));
    }
    #[test]
    fn starttls_follows_the_servers_tls_phase() {
        let c = client(&[ClientOption::StartTls, ClientOption::Abort]);
        // NOTLS: refused by policy, negotiation goes on.
        let (r, out) = run_tls(&c, TlsPhase::Unavailable);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)));
        assert_eq!(replies(&out)[0].1, REP_ERR_POLICY);
        // Optional and required: ACK, and the caller takes over.
        for phase in [TlsPhase::Optional, TlsPhase::Required] {
            let (r, out) = run_tls(&c, phase);
            let Ok(HandshakeEnd::StartTls(flags)) = r else {
                panic!("{r:?}")
            };
            assert!(flags.no_zeroes);
            let rs = replies(&out);
            assert_eq!((rs.len(), rs[0].0, rs[0].1), (1, OPT_STARTTLS, REP_ACK));
        }
        // Already running: invalid.
        let (r, out) = run_tls(&c, TlsPhase::Active);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)));
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        // STARTTLS with data is invalid too.
        let mut c = client(&[]);
        c.extend_from_slice(
            &OptionHeader {
                option: OPT_STARTTLS,
                length: 1,
            }
            .encode(),
        );
        c.push(0);
        c.extend_from_slice(&ClientOption::Abort.encode());
        let (r, out) = run_tls(&c, TlsPhase::Optional);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)));
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
    }

    #[test]
    fn required_tls_refuses_every_other_option_first() {
        let go = ClientOption::Go(InfoRequest {
            name: "a".into(),
            requests: vec![],
        });
        let c = client(&[
            ClientOption::List,
            ClientOption::StructuredReply,
            ClientOption::Info(InfoRequest {
                name: "a".into(),
                requests: vec![],
            }),
            ClientOption::Unsupported(1234),
            go.clone(),
            ClientOption::Abort,
        ]);
        let (r, out) = run_tls(&c, TlsPhase::Required);
        assert!(matches!(r, Ok(HandshakeEnd::Aborted)), "{r:?}");
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            vec![REP_ERR_TLS_REQD; 5]
                .into_iter()
                .chain([REP_ACK])
                .collect::<Vec<_>>()
        );
        // EXPORT_NAME cannot be refused: disconnect.
        let c = client(&[ClientOption::ExportName("a".into())]);
        assert!(matches!(
            run_tls(&c, TlsPhase::Required).0,
            Err(HandshakeError::Protocol(_))
        ));
        // The same options are served once TLS runs, and in optional mode.
        for phase in [TlsPhase::Active, TlsPhase::Optional] {
            let (r, _) = run_tls(&client(std::slice::from_ref(&go)), phase);
            assert!(
                matches!(r, Ok(HandshakeEnd::Transmission(_))),
                "{phase:?}: {r:?}"
            );
        }
    }

    #[test]
    fn options_continue_after_the_upgrade_without_earlier_state() {
        // Structured replies negotiated before STARTTLS do not carry over.
        let c = client(&[ClientOption::StructuredReply, ClientOption::StartTls]);
        let (r, _) = run_tls(&c, TlsPhase::Optional);
        let Ok(HandshakeEnd::StartTls(flags)) = r else {
            panic!("{r:?}")
        };
        let exports = vec![ExportEntry::new("a", Arc::new(MemExport::new(1 << 20)))];
        let stop = AtomicBool::new(false);
        let p = HandshakeParams {
            exports: &exports,
            max_block: 1 << 20,
            shutting_down: &stop,
            max_options: 16,
            tls: TlsPhase::Active,
        };
        let mut after = Vec::new();
        after.extend_from_slice(&ClientOption::ExportName("a".into()).encode());
        let mut out = Vec::new();
        let r = negotiate_options(&mut Cursor::new(after), &mut out, &p, flags);
        let Ok(HandshakeEnd::Transmission(n)) = r else {
            panic!("{r:?}")
        };
        assert!(!n.structured_replies);
        // No greeting the second time: just size and flags.
        assert_eq!(out.len(), 8 + 2);
    }
}
