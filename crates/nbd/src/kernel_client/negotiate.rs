//! The client's side of fixed newstyle negotiation, as the kernel needs it
//! done before it takes a socket: the kernel only transmits, so whoever
//! hands it a socket negotiates first (as nbd-client does). This asks for
//! one export with `NBD_OPT_GO` (no structured replies: the kernel reads
//! simple replies only) and returns its size, transmission flags and
//! minimum block size.

use crate::proto;
use std::io::{self, Read, Write};

/// What the server said of the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// The minimum block size (1 when the server gave none).
    pub min_block: u32,
}

fn protocol(s: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, s.into())
}

fn read_u16<R: Read>(r: &mut R) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32<R: Read>(r: &mut R) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64<R: Read>(r: &mut R) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Longest option reply data accepted (a server's description or name).
const MAX_REPLY_DATA: u32 = 64 << 10;

/// Negotiates export `name` on `s` up to transmission.
pub fn negotiate<S: Read + Write>(s: &mut S, name: &str) -> io::Result<ExportInfo> {
    if read_u64(s)? != proto::NBDMAGIC || read_u64(s)? != proto::IHAVEOPT {
        return Err(protocol("not an NBD server (no fixed newstyle greeting)"));
    }
    let server_flags = read_u16(s)?;
    if server_flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol("the server does not speak fixed newstyle"));
    }
    let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
    if server_flags & proto::FLAG_NO_ZEROES != 0 {
        client_flags |= proto::FLAG_C_NO_ZEROES;
    }
    let mut msg = Vec::with_capacity(40 + name.len());
    msg.extend_from_slice(&client_flags.to_be_bytes());
    // NBD_OPT_GO: name, then the one information request (block sizes).
    let data_len = 4 + name.len() + 2 + 2;
    msg.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    msg.extend_from_slice(&(data_len as u32).to_be_bytes());
    msg.extend_from_slice(&(name.len() as u32).to_be_bytes());
    msg.extend_from_slice(name.as_bytes());
    msg.extend_from_slice(&1u16.to_be_bytes());
    msg.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
    s.write_all(&msg)?;
    s.flush()?;

    let mut export: Option<(u64, u16)> = None;
    let mut min_block = 1;
    loop {
        if read_u64(s)? != proto::OPTION_REPLY_MAGIC {
            return Err(protocol("bad option reply magic"));
        }
        let option = read_u32(s)?;
        let typ = read_u32(s)?;
        let len = read_u32(s)?;
        if option != proto::OPT_GO {
            return Err(protocol(format!(
                "a reply to option {option}, not to NBD_OPT_GO"
            )));
        }
        if len > MAX_REPLY_DATA {
            return Err(protocol(format!("an option reply of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        match typ {
            proto::REP_ACK => break,
            proto::REP_INFO if data.len() >= 2 => {
                let info = u16::from_be_bytes([data[0], data[1]]);
                let body = &data[2..];
                match info {
                    proto::INFO_EXPORT if body.len() >= 10 => {
                        let size = u64::from_be_bytes(body[0..8].try_into().expect("8 bytes"));
                        export = Some((size, u16::from_be_bytes([body[8], body[9]])));
                    }
                    proto::INFO_BLOCK_SIZE if body.len() >= 12 => {
                        min_block = u32::from_be_bytes(body[0..4].try_into().expect("4 bytes"));
                    }
                    _ => {}
                }
            }
            t if t & 0x8000_0000 != 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "the server refused export {name:?} (reply {t:#x}: {})",
                        String::from_utf8_lossy(&data)
                    ),
                ))
            }
            _ => {}
        }
    }
    let (size, flags) =
        export.ok_or_else(|| protocol("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT"))?;
    Ok(ExportInfo {
        size,
        flags,
        min_block: min_block.max(1),
    })
}
