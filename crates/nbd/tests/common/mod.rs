//! Shared helpers for the integration tests: start a server on a Unix socket
//! in a temporary directory, check for external tools, and a minimal raw
//! NBD client for the error-path tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use tiercache_nbd::proto::{self, ClientFlags, ClientOption, InfoRequest, ReplyHeader};
use tiercache_nbd::{Export, Listener, RunningServer, Server, ServerConfig};

pub struct TestServer {
    pub running: Option<RunningServer>,
    pub sock: PathBuf,
    pub dir: tempfile::TempDir,
}

impl TestServer {
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
    pub fn shutdown(&mut self) -> std::io::Result<()> {
        self.running.take().expect("already shut down").shutdown()
    }
    pub fn running(&self) -> &RunningServer {
        self.running.as_ref().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.shutdown();
        }
    }
}

pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

pub fn start(export: Arc<dyn Export>, config: ServerConfig) -> TestServer {
    init_log();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let server = Server::single("", export, config).unwrap();
    let running = server.spawn(Listener::bind_unix(&sock).unwrap()).unwrap();
    TestServer {
        running: Some(running),
        sock,
        dir,
    }
}

#[allow(unused_imports)] // not every test file uses them
pub use tiercache_testkit::{have, run, succeeds};

/// A reply as seen by the raw client: errno and (for reads) data.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub handle: u64,
    pub errno: u32,
    pub data: Vec<u8>,
    pub message: String,
}

/// A minimal blocking NBD client speaking the raw protocol, over a Unix
/// socket or any other byte stream (TCP, TLS).
pub struct RawClient<S: Read + Write = UnixStream> {
    pub s: S,
    pub structured: bool,
    pub size: u64,
    pub flags: u16,
    pub block: (u32, u32, u32),
    /// Lengths of outstanding reads, by handle (simple replies need them).
    pending_reads: std::collections::HashMap<u64, u32>,
}

impl RawClient {
    pub fn connect(sock: &std::path::Path, structured: bool) -> RawClient {
        let s = greet(UnixStream::connect(sock).unwrap());
        RawClient::negotiate(s, structured)
    }
}

/// Reads the server's greeting and sends the client flags.
pub fn greet<S: Read + Write>(mut s: S) -> S {
    let mut greet = [0u8; 18];
    s.read_exact(&mut greet).unwrap();
    assert_eq!(&greet[..8], &proto::NBDMAGIC.to_be_bytes());
    s.write_all(
        &ClientFlags {
            fixed_newstyle: true,
            no_zeroes: true,
        }
        .encode(),
    )
    .unwrap();
    s
}

impl<S: Read + Write> RawClient<S> {
    /// Option haggling on a greeted stream: structured replies if asked
    /// for, then `NBD_OPT_GO` for the default export.
    pub fn negotiate(s: S, structured: bool) -> RawClient<S> {
        let mut c = RawClient {
            s,
            structured: false,
            size: 0,
            flags: 0,
            block: (0, 0, 0),
            pending_reads: Default::default(),
        };
        if structured {
            let r = c.option(&ClientOption::StructuredReply);
            assert_eq!(r.last().unwrap().0, proto::REP_ACK);
            c.structured = true;
        }
        let replies = c.option(&ClientOption::Go(InfoRequest {
            name: String::new(),
            requests: vec![proto::INFO_BLOCK_SIZE],
        }));
        assert_eq!(replies.last().unwrap().0, proto::REP_ACK, "{replies:?}");
        for (t, d) in &replies {
            if *t == proto::REP_INFO && d[..2] == proto::INFO_EXPORT.to_be_bytes() {
                c.size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                c.flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
            }
            if *t == proto::REP_INFO && d[..2] == proto::INFO_BLOCK_SIZE.to_be_bytes() {
                let g = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                c.block = (g(2), g(6), g(10));
            }
        }
        c
    }

    /// Sends an option and collects replies up to the final one.
    pub fn option(&mut self, o: &ClientOption) -> Vec<(u32, Vec<u8>)> {
        self.s.write_all(&o.encode()).unwrap();
        read_option_replies(&mut self.s)
    }

    pub fn send(&mut self, kind: u16, flags: u16, handle: u64, offset: u64, len: u32) {
        let h = proto::RequestHeader {
            flags,
            kind,
            handle,
            offset,
            length: len,
        };
        self.s.write_all(&h.encode()).unwrap();
        if kind == proto::CMD_READ {
            self.pending_reads.insert(handle, len);
        }
    }

    pub fn write(&mut self, handle: u64, offset: u64, data: &[u8], flags: u16) {
        self.send(proto::CMD_WRITE, flags, handle, offset, data.len() as u32);
        self.s.write_all(data).unwrap();
    }

    /// Reads one complete reply (all chunks of a structured reply).
    pub fn reply(&mut self) -> Reply {
        let mut data = Vec::new();
        let mut message = String::new();
        let mut errno = 0;
        loop {
            let mut b = [0u8; 20];
            self.s.read_exact(&mut b[..16]).unwrap();
            if b[..4] == proto::STRUCTURED_REPLY_MAGIC.to_be_bytes() {
                self.s.read_exact(&mut b[16..20]).unwrap();
            }
            let (h, _) = proto::parse_reply_header(&b).unwrap();
            match h {
                ReplyHeader::Simple { errno, handle } => {
                    let len = self.pending_reads.remove(&handle).unwrap_or(0);
                    let mut data = vec![0u8; if errno == 0 { len as usize } else { 0 }];
                    self.s.read_exact(&mut data).unwrap();
                    return Reply {
                        handle,
                        errno,
                        data,
                        message,
                    };
                }
                ReplyHeader::Structured {
                    flags,
                    reply_type,
                    handle,
                    length,
                } => {
                    let mut p = vec![0u8; length as usize];
                    self.s.read_exact(&mut p).unwrap();
                    match reply_type {
                        proto::REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&p[8..]),
                        proto::REPLY_TYPE_ERROR => {
                            errno = u32::from_be_bytes(p[..4].try_into().unwrap());
                            let n = u16::from_be_bytes(p[4..6].try_into().unwrap()) as usize;
                            message = String::from_utf8_lossy(&p[6..6 + n]).into_owned();
                        }
                        proto::REPLY_TYPE_NONE => {}
                        t => panic!("unexpected chunk type {t}"),
                    }
                    if flags & proto::REPLY_FLAG_DONE != 0 {
                        self.pending_reads.remove(&handle);
                        return Reply {
                            handle,
                            errno,
                            data,
                            message,
                        };
                    }
                }
            }
        }
    }

    pub fn disc(mut self) {
        self.send(proto::CMD_DISC, 0, 0, 0, 0);
        // The server closes after NBD_CMD_DISC.
        let mut b = [0u8; 1];
        assert_eq!(self.s.read(&mut b).unwrap(), 0);
    }

    /// True once the server has closed the connection.
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

pub fn read_option_replies<S: Read>(s: &mut S) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let h = proto::parse_option_reply_header(&h).unwrap();
        let mut d = vec![0u8; h.length as usize];
        s.read_exact(&mut d).unwrap();
        let t = h.reply_type;
        out.push((t, d));
        if t != proto::REP_INFO && t != proto::REP_SERVER {
            return out;
        }
    }
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
