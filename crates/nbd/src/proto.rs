//! Wire format of the NBD protocol: constants, and pure parsers and
//! encoders over byte slices.
//!
//! Nothing in this module performs I/O or allocates more than the input it
//! was given, so every function here can be fuzzed and property-tested
//! directly. The contract of every `parse_*` function is: for *any* input it
//! returns `Ok` or `Err` and never panics; for any value produced by the
//! matching `encode*` function it returns that value back.
//!
//! Reference: `doc/proto.md` of the NetworkBlockDevice/nbd repository.

use std::fmt;
use tiercache_frontend::{check_request, Access, Limits, RequestError};

// ---------------------------------------------------------------------------
// Magic numbers.

/// `NBDMAGIC`, first 8 bytes sent by the server.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, sent by the server after `NBDMAGIC` and by the client before
/// every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply during fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request (compact headers).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------
// Handshake flags (server, 16 bits) and client flags (32 bits).

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// The handshake flags this server always sends.
pub const SERVER_HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;

pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------------------
// Transmission flags (16 bits).

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------
// Options.

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_PLATFORM: u32 = 0x8000_0004;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = 0x8000_0008;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

// Information types for `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------
// Commands, command flags, structured reply types.

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;

pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = 0x8002;

// ---------------------------------------------------------------------------
// Error values (the only ones the spec allows on the wire).

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// A Linux errno (e.g. from [`tiercache_frontend::errno`]) as one of the
/// wire values above: `EPERM`/`EACCES`/`EROFS` -> `EPERM`,
/// `ENOSPC`/`EDQUOT`/`EFBIG` -> `ENOSPC`, `EIO`, `ENOMEM`, `EINVAL`,
/// `EOVERFLOW`, `ESHUTDOWN` as they are, anything else -> `EIO`.
pub fn wire_errno(code: i32) -> u32 {
    match code {
        libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
        libc::EIO => EIO,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

// ---------------------------------------------------------------------------
// Limits.

/// Longest string (export name, description, message) the spec allows.
pub const MAX_STRING_LEN: usize = 4096;
/// Largest option payload this server reads. A valid `NBD_OPT_GO` with a
/// maximal name and a generous list of info requests fits comfortably; a
/// client sending more is treated as a denial of service (hard disconnect).
pub const MAX_OPTION_DATA_LEN: u32 = 64 * 1024;
/// The spec says any payload below 2^25 bytes SHOULD NOT be considered a
/// denial of service, whatever maximum block size was advertised.
pub const SPEC_DOS_THRESHOLD: u32 = 1 << 25;

pub const OPTION_HEADER_LEN: usize = 16;
pub const REQUEST_HEADER_LEN: usize = 28;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const STRUCTURED_HEADER_LEN: usize = 20;
pub const OPTION_REPLY_HEADER_LEN: usize = 20;

// ---------------------------------------------------------------------------
// Big-endian helpers. Callers guarantee the slice is long enough.

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// A malformed message that cannot be answered with an error reply: the
/// only correct reaction is a hard disconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the fixed-size message needs.
    Truncated { need: usize, got: usize },
    /// A magic number did not match.
    BadMagic { expected: u64, got: u64 },
    /// The client set flags the server did not advertise.
    UnknownClientFlags(u32),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Truncated { need, got } => {
                write!(f, "truncated message: need {need} bytes, got {got}")
            }
            ProtoError::BadMagic { expected, got } => {
                write!(f, "bad magic {got:#x} (expected {expected:#x})")
            }
            ProtoError::UnknownClientFlags(x) => write!(f, "unknown client flags {x:#x}"),
        }
    }
}

impl std::error::Error for ProtoError {}

fn need(b: &[u8], n: usize) -> Result<(), ProtoError> {
    if b.len() < n {
        Err(ProtoError::Truncated {
            need: n,
            got: b.len(),
        })
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Handshake.

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// The client's flags, as accepted by this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Parses the 32-bit client flags. Any bit the server did not advertise
/// (`advertised` holds the handshake flags) is an error: the spec says the
/// server MUST drop the connection.
pub fn parse_client_flags(b: &[u8], advertised: u16) -> Result<ClientFlags, ProtoError> {
    need(b, 4)?;
    let v = be32(b);
    let mut allowed = 0u32;
    if advertised & FLAG_FIXED_NEWSTYLE != 0 {
        allowed |= FLAG_C_FIXED_NEWSTYLE;
    }
    if advertised & FLAG_NO_ZEROES != 0 {
        allowed |= FLAG_C_NO_ZEROES;
    }
    if v & !allowed != 0 {
        return Err(ProtoError::UnknownClientFlags(v));
    }
    Ok(ClientFlags {
        fixed_newstyle: v & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: v & FLAG_C_NO_ZEROES != 0,
    })
}

impl ClientFlags {
    pub fn encode(&self) -> [u8; 4] {
        let mut v = 0u32;
        if self.fixed_newstyle {
            v |= FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            v |= FLAG_C_NO_ZEROES;
        }
        v.to_be_bytes()
    }
}

/// The fixed 16-byte header of every client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    /// Length of the option data that follows.
    pub length: u32,
}

/// Parses an option header; a wrong magic is a protocol violation.
pub fn parse_option_header(b: &[u8]) -> Result<OptionHeader, ProtoError> {
    need(b, OPTION_HEADER_LEN)?;
    let magic = be64(b);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            expected: IHAVEOPT,
            got: magic,
        });
    }
    Ok(OptionHeader {
        option: be32(&b[8..]),
        length: be32(&b[12..]),
    })
}

impl OptionHeader {
    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// The payload of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    /// Requested `NBD_INFO_*` types, in the order sent.
    pub requests: Vec<u16>,
}

/// A parsed client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    /// Any option this server does not implement; its data is ignored and
    /// the server answers `NBD_REP_ERR_UNSUP`.
    Unsupported(u32),
}

/// Why a known option's data was rejected; the server answers
/// `NBD_REP_ERR_INVALID` (or, for `NBD_OPT_EXPORT_NAME`, which cannot be
/// answered with an error, disconnects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidOption(pub &'static str);

impl fmt::Display for InvalidOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Validates an NBD string: UTF-8, no NUL, at most 4096 bytes.
pub fn parse_string(b: &[u8]) -> Result<String, InvalidOption> {
    if b.len() > MAX_STRING_LEN {
        return Err(InvalidOption("string longer than 4096 bytes"));
    }
    if b.contains(&0) {
        return Err(InvalidOption("string contains NUL"));
    }
    match std::str::from_utf8(b) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(InvalidOption("string is not UTF-8")),
    }
}

fn parse_info_request(data: &[u8]) -> Result<InfoRequest, InvalidOption> {
    if data.len() < 6 {
        return Err(InvalidOption("option data shorter than 6 bytes"));
    }
    let name_len = be32(data) as usize;
    if name_len > data.len() - 6 {
        return Err(InvalidOption("export name length exceeds option length"));
    }
    let name = parse_string(&data[4..4 + name_len])?;
    let rest = &data[4 + name_len..];
    let n = be16(rest) as usize;
    let list = &rest[2..];
    if list.len() != 2 * n {
        return Err(InvalidOption(
            "number of information requests does not match option length",
        ));
    }
    let requests = list.chunks_exact(2).map(be16).collect();
    Ok(InfoRequest { name, requests })
}

/// Parses the data of option `option`. Unknown options are not an error
/// (they become [`ClientOption::Unsupported`]); malformed data of a known
/// option is.
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, InvalidOption> {
    let no_data = |o: ClientOption| {
        if data.is_empty() {
            Ok(o)
        } else {
            Err(InvalidOption("option takes no data"))
        }
    };
    match option {
        OPT_EXPORT_NAME => Ok(ClientOption::ExportName(parse_string(data)?)),
        // The spec: a server SHOULD ignore data sent with NBD_OPT_ABORT.
        OPT_ABORT => Ok(ClientOption::Abort),
        OPT_LIST => no_data(ClientOption::List),
        OPT_STARTTLS => no_data(ClientOption::StartTls),
        OPT_INFO => Ok(ClientOption::Info(parse_info_request(data)?)),
        OPT_GO => Ok(ClientOption::Go(parse_info_request(data)?)),
        OPT_STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
        other => Ok(ClientOption::Unsupported(other)),
    }
}

impl ClientOption {
    /// The option number on the wire.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => OPT_EXPORT_NAME,
            ClientOption::Abort => OPT_ABORT,
            ClientOption::List => OPT_LIST,
            ClientOption::StartTls => OPT_STARTTLS,
            ClientOption::Info(_) => OPT_INFO,
            ClientOption::Go(_) => OPT_GO,
            ClientOption::StructuredReply => OPT_STRUCTURED_REPLY,
            ClientOption::Unsupported(c) => *c,
        }
    }

    /// The option data on the wire (what a client sends after the header).
    pub fn encode_data(&self) -> Vec<u8> {
        match self {
            ClientOption::ExportName(n) => n.as_bytes().to_vec(),
            ClientOption::Info(r) | ClientOption::Go(r) => {
                let mut v = Vec::with_capacity(6 + r.name.len() + 2 * r.requests.len());
                v.extend_from_slice(&(r.name.len() as u32).to_be_bytes());
                v.extend_from_slice(r.name.as_bytes());
                v.extend_from_slice(&(r.requests.len() as u16).to_be_bytes());
                for q in &r.requests {
                    v.extend_from_slice(&q.to_be_bytes());
                }
                v
            }
            _ => Vec::new(),
        }
    }

    /// Header plus data, exactly as a client sends it.
    pub fn encode(&self) -> Vec<u8> {
        let data = self.encode_data();
        let mut v = OptionHeader {
            option: self.code(),
            length: data.len() as u32,
        }
        .encode()
        .to_vec();
        v.extend_from_slice(&data);
        v
    }
}

/// Header of an option reply (data, if any, follows).
pub fn encode_option_reply_header(option: u32, reply_type: u32, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply_type.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A parsed option reply header (used by tests and clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

pub fn parse_option_reply_header(b: &[u8]) -> Result<OptionReplyHeader, ProtoError> {
    need(b, OPTION_REPLY_HEADER_LEN)?;
    let magic = be64(b);
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: OPTION_REPLY_MAGIC,
            got: magic,
        });
    }
    Ok(OptionReplyHeader {
        option: be32(&b[8..]),
        reply_type: be32(&b[12..]),
        length: be32(&b[16..]),
    })
}

/// Data of `NBD_REP_INFO` / `NBD_INFO_EXPORT`.
pub fn encode_info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Data of `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`.
pub fn encode_info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&min.to_be_bytes());
    b[6..10].copy_from_slice(&preferred.to_be_bytes());
    b[10..14].copy_from_slice(&max.to_be_bytes());
    b
}

// ---------------------------------------------------------------------------
// Transmission.

/// A request header exactly as sent, before any semantic validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a 28-byte request header. A wrong magic (including the extended
/// header magic, which this server never negotiates) is a protocol
/// violation.
pub fn parse_request_header(b: &[u8]) -> Result<RequestHeader, ProtoError> {
    need(b, REQUEST_HEADER_LEN)?;
    let magic = be32(b);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            expected: REQUEST_MAGIC as u64,
            got: magic as u64,
        });
    }
    Ok(RequestHeader {
        flags: be16(&b[4..]),
        kind: be16(&b[6..]),
        handle: be64(&b[8..]),
        offset: be64(&b[16..]),
        length: be32(&b[24..]),
    })
}

impl RequestHeader {
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire, whatever the
    /// server thinks of the request. Only `NBD_CMD_WRITE` carries one.
    pub fn payload_len(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// What the server negotiated for one connection, needed to judge a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionContext {
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags sent to the client.
    pub flags: u16,
    /// Advertised minimum block size (alignment of offset and length).
    pub min_block: u32,
    /// Advertised maximum block size: the cap on READ and WRITE, the
    /// commands with a payload. TRIM and WRITE_ZEROES carry none and are
    /// not capped (Linux's nbd client sends write-zeroes of up to 4 GiB).
    pub max_block: u32,
}

impl TransmissionContext {
    /// The largest write payload the server reads and discards in order to
    /// answer an error; above this it disconnects instead. The spec lets a
    /// server treat large payloads as a denial of service, but says lengths
    /// below 2^25 SHOULD NOT be.
    pub fn discard_limit(&self) -> u32 {
        self.max_block.max(SPEC_DOS_THRESHOLD)
    }
}

/// A validated command, ready to execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
    },
    /// The payload (`len` bytes) follows the header.
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    },
    /// `NBD_CMD_DISC`: finish in-flight requests, then close.
    Disconnect,
}

impl Command {
    /// A read, write, trim or write-zeroes of zero bytes, which
    /// [`tiercache_frontend::check_request`] accepted as asking nothing
    /// ([`tiercache_frontend::Checked::Empty`]): it is answered with success
    /// without calling the export.
    pub fn is_empty(&self) -> bool {
        match *self {
            Command::Read { len, .. }
            | Command::Write { len, .. }
            | Command::Trim { len, .. }
            | Command::WriteZeroes { len, .. } => len == 0,
            Command::Flush | Command::Disconnect => false,
        }
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Execute(Command),
    /// Answer with `errno` after reading and discarding `discard` payload
    /// bytes (so the stream stays in sync).
    Reject {
        errno: u32,
        discard: u32,
        reason: &'static str,
    },
    /// The request cannot be answered safely: hard disconnect.
    Disconnect(&'static str),
}

/// Decides what to do with a request, following the spec's error rules:
/// unknown command or flag -> `EINVAL`; write, trim or write-zeroes on a
/// read-only export -> `EPERM`; then the range, checked by
/// [`tiercache_frontend::check_request`] (the check ublk makes too): a read
/// or write over the maximum length, or unaligned -> `EINVAL`; write or
/// write-zeroes beyond the end -> `ENOSPC`; read or trim beyond the end ->
/// `EINVAL`. A zero-length command inside the export is executed as one
/// that asks nothing ([`Command::is_empty`]).
/// A write payload larger than [`TransmissionContext::discard_limit`] leads
/// to a hard disconnect. Pure; never panics.
pub fn validate_request(h: &RequestHeader, ctx: &TransmissionContext) -> Verdict {
    let discard = h.payload_len();
    if discard > ctx.discard_limit() {
        return Verdict::Disconnect("write payload exceeds the maximum block size");
    }
    let reject = |errno, reason| Verdict::Reject {
        errno,
        discard,
        reason,
    };
    let f = ctx.flags;
    let advertised = |flag: u16| f & flag != 0;
    let (needed_flag, allowed_cmd_flags) = match h.kind {
        CMD_DISC => return Verdict::Execute(Command::Disconnect),
        CMD_READ => (
            0,
            if advertised(FLAG_SEND_DF) {
                CMD_FLAG_DF
            } else {
                0
            },
        ),
        CMD_WRITE => (0, 0),
        CMD_FLUSH => (FLAG_SEND_FLUSH, 0),
        CMD_TRIM => (FLAG_SEND_TRIM, 0),
        CMD_WRITE_ZEROES => (FLAG_SEND_WRITE_ZEROES, CMD_FLAG_NO_HOLE),
        _ => return reject(EINVAL, "unknown command"),
    };
    // Before the capability check: a read-only export advertises neither
    // TRIM nor WRITE_ZEROES, yet the spec wants EPERM for them.
    let writes = matches!(h.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && advertised(FLAG_READ_ONLY) {
        return reject(EPERM, "export is read-only");
    }
    if needed_flag != 0 && !advertised(needed_flag) {
        return reject(EINVAL, "command not advertised");
    }
    let fua_allowed = if advertised(FLAG_SEND_FUA) {
        CMD_FLAG_FUA
    } else {
        0
    };
    if h.flags & !(allowed_cmd_flags | fua_allowed) != 0 {
        return reject(EINVAL, "unknown or inapplicable command flag");
    }
    let fua = h.flags & CMD_FLAG_FUA != 0;
    if h.kind == CMD_FLUSH {
        return Verdict::Execute(Command::Flush);
    }
    // The range: the one check both front ends share.
    let access = match h.kind {
        CMD_READ => Access::Read,
        CMD_WRITE => Access::Write,
        CMD_TRIM => Access::Trim,
        _ => Access::WriteZeroes,
    };
    let limits = Limits {
        size: ctx.size,
        min_block: ctx.min_block,
        max_data: ctx.max_block,
    };
    if let Err(e) = check_request(&limits, access, h.offset, u64::from(h.length)) {
        // The spec asks for ENOSPC for a write beyond the end (nbdkit's
        // validate_request does the same); every other refusal is the
        // frontend's errno (EINVAL).
        let errno = match e {
            RequestError::OutOfRange { .. } if matches!(h.kind, CMD_WRITE | CMD_WRITE_ZEROES) => {
                ENOSPC
            }
            _ => wire_errno(e.errno()),
        };
        return reject(errno, e.reason());
    }
    let (offset, len) = (h.offset, h.length);
    Verdict::Execute(match h.kind {
        CMD_READ => Command::Read { offset, len },
        CMD_WRITE => Command::Write { offset, len, fua },
        CMD_TRIM => Command::Trim { offset, len, fua },
        _ => Command::WriteZeroes {
            offset,
            len,
            fua,
            may_trim: h.flags & CMD_FLAG_NO_HOLE == 0,
        },
    })
}

/// A simple reply (16 bytes; read data, if any, follows).
pub fn encode_simple_reply(errno: u32, handle: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&errno.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Header of a structured reply chunk (payload of `len` bytes follows).
pub fn encode_structured_header(
    flags: u16,
    reply_type: u16,
    handle: u64,
    len: u32,
) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut b = [0u8; STRUCTURED_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// A reply header as seen by a client (used by tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        errno: u32,
        handle: u64,
    },
    Structured {
        flags: u16,
        reply_type: u16,
        handle: u64,
        length: u32,
    },
}

/// Parses a reply header: 16 bytes for a simple reply, 20 for a structured
/// chunk. Returns the header and the number of bytes it occupied.
pub fn parse_reply_header(b: &[u8]) -> Result<(ReplyHeader, usize), ProtoError> {
    need(b, 4)?;
    match be32(b) {
        SIMPLE_REPLY_MAGIC => {
            need(b, SIMPLE_REPLY_LEN)?;
            Ok((
                ReplyHeader::Simple {
                    errno: be32(&b[4..]),
                    handle: be64(&b[8..]),
                },
                SIMPLE_REPLY_LEN,
            ))
        }
        STRUCTURED_REPLY_MAGIC => {
            need(b, STRUCTURED_HEADER_LEN)?;
            Ok((
                ReplyHeader::Structured {
                    flags: be16(&b[4..]),
                    reply_type: be16(&b[6..]),
                    handle: be64(&b[8..]),
                    length: be32(&b[16..]),
                },
                STRUCTURED_HEADER_LEN,
            ))
        }
        m => Err(ProtoError::BadMagic {
            expected: SIMPLE_REPLY_MAGIC as u64,
            got: m as u64,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> TransmissionContext {
        TransmissionContext {
            size: 1 << 20,
            flags: FLAG_HAS_FLAGS
                | FLAG_SEND_FLUSH
                | FLAG_SEND_FUA
                | FLAG_SEND_TRIM
                | FLAG_SEND_WRITE_ZEROES,
            min_block: 512,
            max_block: 1 << 16,
        }
    }

    fn req(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            handle: 7,
            offset,
            length,
        }
    }

    fn errno_of(v: Verdict) -> u32 {
        match v {
            Verdict::Reject { errno, .. } => errno,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn out_of_range_errors_follow_the_spec() {
        let c = ctx();
        assert_eq!(
            errno_of(validate_request(&req(CMD_READ, 0, 1 << 20, 512), &c)),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_WRITE, 0, 1 << 20, 512), &c)),
            ENOSPC
        );
        assert_eq!(
            errno_of(validate_request(
                &req(CMD_WRITE_ZEROES, 0, (1 << 20) - 512, 1024),
                &c
            )),
            ENOSPC
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_TRIM, 0, u64::MAX - 511, 512), &c)),
            EINVAL
        );
        assert_eq!(
            validate_request(&req(CMD_READ, 0, (1 << 20) - 512, 512), &c),
            Verdict::Execute(Command::Read {
                offset: (1 << 20) - 512,
                len: 512
            })
        );
    }

    #[test]
    fn flags_commands_and_lengths() {
        let c = ctx();
        assert_eq!(errno_of(validate_request(&req(99, 0, 0, 0), &c)), EINVAL);
        assert_eq!(
            errno_of(validate_request(&req(CMD_BLOCK_STATUS, 0, 0, 512), &c)),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_READ, CMD_FLAG_DF, 0, 512), &c)),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(
                &req(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512),
                &c
            )),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_READ, 0, 1, 512), &c)),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_READ, 0, 0, 1 << 17), &c)),
            EINVAL
        );
        // Over-max write below the DoS threshold: read and discard the payload.
        assert_eq!(
            validate_request(&req(CMD_WRITE, 0, 0, 1 << 17), &c),
            Verdict::Reject {
                errno: EINVAL,
                discard: 1 << 17,
                reason: "length exceeds the maximum block size"
            }
        );
        // Above both the maximum and 2^25: disconnect.
        assert!(matches!(
            validate_request(&req(CMD_WRITE, 0, 0, (1 << 25) + 512), &c),
            Verdict::Disconnect(_)
        ));
        // Trim and write-zeroes (no payload) have no maximum.
        assert_eq!(
            validate_request(&req(CMD_WRITE_ZEROES, 0, 0, 1 << 19), &c),
            Verdict::Execute(Command::WriteZeroes {
                offset: 0,
                len: 1 << 19,
                fua: false,
                may_trim: true
            })
        );
        assert_eq!(
            validate_request(&req(CMD_TRIM, CMD_FLAG_FUA, 0, 1 << 20), &c),
            Verdict::Execute(Command::Trim {
                offset: 0,
                len: 1 << 20,
                fua: true
            })
        );
        assert_eq!(
            validate_request(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 512, 512), &c),
            Verdict::Execute(Command::WriteZeroes {
                offset: 512,
                len: 512,
                fua: false,
                may_trim: false
            })
        );
        let ro = TransmissionContext {
            flags: c.flags | FLAG_READ_ONLY,
            ..c
        };
        assert_eq!(
            errno_of(validate_request(&req(CMD_WRITE, 0, 0, 512), &ro)),
            EPERM
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_TRIM, 0, 0, 512), &ro)),
            EPERM
        );
        let ro_bare = TransmissionContext {
            flags: FLAG_HAS_FLAGS | FLAG_READ_ONLY,
            ..c
        };
        assert_eq!(
            errno_of(validate_request(
                &req(CMD_WRITE_ZEROES, 0, 0, 512),
                &ro_bare
            )),
            EPERM
        );
        assert_eq!(
            errno_of(validate_request(&req(CMD_TRIM, 0, 0, 512), &ro_bare)),
            EPERM
        );
        let no_flush = TransmissionContext {
            flags: FLAG_HAS_FLAGS,
            ..c
        };
        assert_eq!(
            errno_of(validate_request(&req(CMD_FLUSH, 0, 0, 0), &no_flush)),
            EINVAL
        );
        assert_eq!(
            errno_of(validate_request(
                &req(CMD_WRITE, CMD_FLAG_FUA, 0, 512),
                &no_flush
            )),
            EINVAL
        );
    }

    #[test]
    fn info_request_parsing() {
        let go = ClientOption::Go(InfoRequest {
            name: "disk".into(),
            requests: vec![INFO_BLOCK_SIZE, INFO_NAME],
        });
        let data = go.encode_data();
        assert_eq!(parse_option(OPT_GO, &data), Ok(go));
        // Name length pointing past the end.
        let mut bad = data.clone();
        bad[3] = 200;
        assert!(parse_option(OPT_GO, &bad).is_err());
        // Trailing garbage.
        let mut bad = data.clone();
        bad.push(0);
        assert!(parse_option(OPT_INFO, &bad).is_err());
        assert!(parse_option(OPT_LIST, &[1]).is_err());
        assert_eq!(parse_option(OPT_ABORT, &[1, 2]), Ok(ClientOption::Abort));
        assert_eq!(parse_option(42, &[1, 2]), Ok(ClientOption::Unsupported(42)));
    }

    #[test]
    fn headers_round_trip() {
        let h = req(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        assert_eq!(parse_request_header(&h.encode()), Ok(h));
        let o = OptionHeader {
            option: 7,
            length: 99,
        };
        assert_eq!(parse_option_header(&o.encode()), Ok(o));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(parse_request_header(&bad).is_err());
        assert!(parse_request_header(&bad[..10]).is_err());
        assert!(matches!(
            parse_client_flags(&7u32.to_be_bytes(), SERVER_HANDSHAKE_FLAGS),
            Err(ProtoError::UnknownClientFlags(7))
        ));
        assert!(parse_client_flags(&2u32.to_be_bytes(), FLAG_FIXED_NEWSTYLE).is_err());
    }
}
