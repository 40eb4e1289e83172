//! Generic netlink messages as bytes: a request builder (netlink header,
//! generic netlink header, attributes, nested attributes) and the decoders
//! of what the kernel sends back (messages, attributes, error/ack codes).
//! Pure functions over byte slices, so they are unit tested and fuzzed
//! without a kernel; the socket is `socket.rs`.
//!
//! Layout (linux/netlink.h, linux/genetlink.h): every message is a 16-byte
//! `nlmsghdr` (length, type, flags, sequence, port id; host byte order),
//! then for generic netlink a 4-byte `genlmsghdr` (command, version, 0),
//! then attributes: a 4-byte `nlattr` (length including itself, type) and
//! the payload, each padded to 4 bytes.

use std::fmt;

/// `NLMSG_ERROR`: an error code (0: the acknowledgement of a request).
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a multipart answer.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 1;
/// `NLM_F_ACK`: answer with an `NLMSG_ERROR` of 0 on success.
pub const NLM_F_ACK: u16 = 4;
/// The generic netlink controller's family (`GENL_ID_CTRL`).
pub const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_GETFAMILY`: a family's id by its name.
pub const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16).
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME` (NUL-terminated string).
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// `NLA_F_NESTED`, set on attributes that hold attributes.
const NLA_F_NESTED: u16 = 1 << 15;
/// The flag bits of an attribute's type (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
const NLMSG_HDR_LEN: usize = 16;
const GENL_HDR_LEN: usize = 4;
const NLA_HDR_LEN: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One generic netlink request being built. Lengths are filled in by
/// [`Request::finish`] and [`Request::end_nested`].
#[derive(Debug, Clone)]
pub struct Request {
    buf: Vec<u8>,
    /// Offsets of the nested attributes still open.
    open: Vec<usize>,
}

impl Request {
    /// A request (`NLM_F_REQUEST | NLM_F_ACK`) of family `family`, command
    /// `cmd`, family version `version`, sequence number `seq`.
    pub fn new(family: u16, cmd: u8, version: u8, seq: u32) -> Request {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&family.to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        buf.extend_from_slice(&[cmd, version, 0, 0]);
        Request {
            buf,
            open: Vec::new(),
        }
    }

    fn attr(mut self, ty: u16, payload: &[u8]) -> Request {
        let len = NLA_HDR_LEN + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// A u8 attribute.
    pub fn u8(self, ty: u16, v: u8) -> Request {
        self.attr(ty, &[v])
    }

    /// A u32 attribute (host byte order, as the kernel's `nla_get_u32`).
    pub fn u32(self, ty: u16, v: u32) -> Request {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A u64 attribute.
    pub fn u64(self, ty: u16, v: u64) -> Request {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A string attribute, NUL-terminated (`NLA_STRING`/`NLA_NUL_STRING`).
    pub fn string(self, ty: u16, s: &str) -> Request {
        let mut payload = Vec::with_capacity(s.len() + 1);
        payload.extend_from_slice(s.as_bytes());
        payload.push(0);
        self.attr(ty, &payload)
    }

    /// Opens a nested attribute: what follows until [`Request::end_nested`]
    /// is inside it.
    pub fn begin_nested(mut self, ty: u16) -> Request {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        self
    }

    /// Closes the innermost nested attribute.
    ///
    /// # Panics
    /// If none is open (a bug of the caller).
    pub fn end_nested(mut self) -> Request {
        let at = self.open.pop().expect("end_nested without begin_nested");
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// The message's bytes, its length filled in.
    ///
    /// # Panics
    /// If a nested attribute is still open (a bug of the caller).
    pub fn finish(mut self) -> Vec<u8> {
        assert!(self.open.is_empty(), "nested attribute left open");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// Bytes from the kernel that do not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed netlink message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

fn bad(s: impl Into<String>) -> DecodeError {
    DecodeError(s.into())
}

/// One netlink message of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// What follows the netlink header (for a family's message: the
    /// generic netlink header, then attributes).
    pub payload: &'a [u8],
}

/// Splits a datagram into its messages. Never panics, whatever `buf` holds.
pub fn messages(mut buf: &[u8]) -> Result<Vec<Message<'_>>, DecodeError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        if buf.len() < NLMSG_HDR_LEN {
            return Err(bad(format!("{} bytes left, less than a header", buf.len())));
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDR_LEN || len > buf.len() {
            return Err(bad(format!(
                "message length {len} with {} bytes left",
                buf.len()
            )));
        }
        out.push(Message {
            msg_type: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes")),
            payload: &buf[NLMSG_HDR_LEN..len],
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// The errno of an `NLMSG_ERROR` message's payload: 0 for an
/// acknowledgement, else a positive errno (the kernel sends it negated).
pub fn error_code(payload: &[u8]) -> Result<i32, DecodeError> {
    let code = payload
        .get(0..4)
        .ok_or_else(|| bad("error message without its code"))?;
    let code = i32::from_ne_bytes(code.try_into().expect("4 bytes"));
    Ok(code.checked_neg().unwrap_or(i32::MAX))
}

/// The attributes after the generic netlink header of a family message's
/// payload.
pub fn genl_attrs(payload: &[u8]) -> Result<Vec<(u16, &[u8])>, DecodeError> {
    let attrs = payload
        .get(GENL_HDR_LEN..)
        .ok_or_else(|| bad("message shorter than the generic netlink header"))?;
    parse_attrs(attrs)
}

/// The command of a family message's generic netlink header.
pub fn genl_cmd(payload: &[u8]) -> Option<u8> {
    payload.first().copied()
}

/// Splits `buf` into attributes: (type without the flag bits, payload).
/// Never panics, whatever `buf` holds.
pub fn parse_attrs(mut buf: &[u8]) -> Result<Vec<(u16, &[u8])>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HDR_LEN {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDR_LEN || len > buf.len() {
            return Err(bad(format!(
                "attribute {ty} of length {len} with {} bytes left",
                buf.len()
            )));
        }
        out.push((ty, &buf[NLA_HDR_LEN..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    if !buf.is_empty() {
        return Err(bad(format!(
            "{} stray bytes after the attributes",
            buf.len()
        )));
    }
    Ok(out)
}

/// The first attribute of type `ty`.
pub fn find<'a>(attrs: &[(u16, &'a [u8])], ty: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(t, _)| *t == ty).map(|(_, p)| *p)
}

/// A u32 attribute's value.
pub fn as_u32(payload: &[u8]) -> Result<u32, DecodeError> {
    Ok(u32::from_ne_bytes(
        payload
            .get(0..4)
            .ok_or_else(|| bad("short u32 attribute"))?
            .try_into()
            .expect("4 bytes"),
    ))
}

/// A u16 attribute's value.
pub fn as_u16(payload: &[u8]) -> Result<u16, DecodeError> {
    let b = payload
        .get(0..2)
        .ok_or_else(|| bad("short u16 attribute"))?;
    Ok(u16::from_ne_bytes([b[0], b[1]]))
}

/// A u8 attribute's value.
pub fn as_u8(payload: &[u8]) -> Result<u8, DecodeError> {
    payload
        .first()
        .copied()
        .ok_or_else(|| bad("empty u8 attribute"))
}

/// The request asking the controller for family `name`'s id.
pub fn get_family_request(name: &str, seq: u32) -> Vec<u8> {
    Request::new(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, seq)
        .string(CTRL_ATTR_FAMILY_NAME, name)
        .finish()
}

/// The family id in the controller's answer to [`get_family_request`].
pub fn family_id(payload: &[u8]) -> Result<u16, DecodeError> {
    let attrs = genl_attrs(payload)?;
    as_u16(find(&attrs, CTRL_ATTR_FAMILY_ID).ok_or_else(|| bad("no family id in the answer"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_has_its_length_headers_and_padded_attributes() {
        let m = Request::new(0x1234, 5, 1, 77)
            .u32(1, 9)
            .string(2, "nbd")
            .begin_nested(7)
            .begin_nested(1)
            .u32(1, 3)
            .end_nested()
            .end_nested()
            .u64(8, 120)
            .finish();
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x1234);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 77);
        assert_eq!(&m[16..20], &[5, 1, 0, 0]);
        assert_eq!(m.len() % 4, 0);
        let msgs = messages(&m).unwrap();
        assert_eq!(msgs.len(), 1);
        let attrs = genl_attrs(msgs[0].payload).unwrap();
        let types: Vec<u16> = attrs.iter().map(|a| a.0).collect();
        assert_eq!(types, [1, 2, 7, 8]);
        assert_eq!(as_u32(find(&attrs, 1).unwrap()).unwrap(), 9);
        assert_eq!(find(&attrs, 2).unwrap(), b"nbd\0");
        let sockets = parse_attrs(find(&attrs, 7).unwrap()).unwrap();
        assert_eq!(sockets.len(), 1);
        assert_eq!(sockets[0].0, 1);
        let item = parse_attrs(sockets[0].1).unwrap();
        assert_eq!(item, vec![(1, &3u32.to_ne_bytes()[..])]);
        assert_eq!(find(&attrs, 8).unwrap(), &120u64.to_ne_bytes()[..]);
        // The nested flag is on the wire, not in the decoded type.
        let nested_ty = u16::from_ne_bytes([m[20 + 8 + 8 + 2], m[20 + 8 + 8 + 3]]);
        assert_eq!(nested_ty, 7 | NLA_F_NESTED);
    }

    #[test]
    fn family_request_and_answer() {
        let req = get_family_request("nbd", 1);
        let msgs = messages(&req).unwrap();
        assert_eq!(msgs[0].msg_type, GENL_ID_CTRL);
        assert_eq!(genl_cmd(msgs[0].payload), Some(CTRL_CMD_GETFAMILY));
        // An answer as the controller sends it: id and name (and more).
        let answer = Request::new(GENL_ID_CTRL, 1, 2, 1)
            .string(CTRL_ATTR_FAMILY_NAME, "nbd")
            .attr(CTRL_ATTR_FAMILY_ID, &0x1du16.to_ne_bytes())
            .finish();
        let msgs = messages(&answer).unwrap();
        assert_eq!(family_id(msgs[0].payload).unwrap(), 0x1d);
    }

    #[test]
    fn errors_and_acks() {
        let mut ack = (-16i32).to_ne_bytes().to_vec();
        ack.extend_from_slice(&[0; 16]);
        assert_eq!(error_code(&ack).unwrap(), 16);
        assert_eq!(error_code(&0i32.to_ne_bytes()).unwrap(), 0);
        assert!(error_code(&[1, 2]).is_err());
    }

    #[test]
    fn truncated_or_inconsistent_input_is_an_error() {
        assert!(messages(&[0; 8]).is_err());
        let mut m = Request::new(1, 1, 1, 1).u32(1, 1).finish();
        m[0] = 200; // longer than the datagram
        assert!(messages(&m).is_err());
        assert!(parse_attrs(&[8, 0, 1, 0, 1, 2]).is_err()); // says 8, has 6
        assert!(parse_attrs(&[2, 0, 1, 0]).is_err()); // shorter than its header
        assert!(parse_attrs(&[1, 2]).is_err()); // stray bytes
        assert!(genl_attrs(&[1, 2]).is_err());
        assert_eq!(parse_attrs(&[]).unwrap(), vec![]);
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            if let Ok(msgs) = messages(&bytes) {
                for m in msgs {
                    let _ = error_code(m.payload);
                    let _ = family_id(m.payload);
                    if let Ok(attrs) = genl_attrs(m.payload) {
                        for (_, p) in attrs {
                            let _ = parse_attrs(p);
                            let _ = as_u32(p);
                            let _ = as_u8(p);
                        }
                    }
                }
            }
            let _ = parse_attrs(&bytes);
        }

        #[test]
        fn what_is_built_decodes_back(values in proptest::collection::vec((1u16..100, proptest::prelude::any::<u64>()), 0..20)) {
            let mut r = Request::new(42, 3, 1, 9);
            for (ty, v) in &values {
                r = r.u64(*ty, *v);
            }
            let m = r.finish();
            let msgs = messages(&m).unwrap();
            proptest::prop_assert_eq!(msgs.len(), 1);
            let attrs = genl_attrs(msgs[0].payload).unwrap();
            proptest::prop_assert_eq!(attrs.len(), values.len());
            for ((ty, v), (aty, p)) in values.iter().zip(attrs) {
                proptest::prop_assert_eq!(*ty, aty);
                proptest::prop_assert_eq!(p, &v.to_ne_bytes()[..]);
            }
        }
    }
}
