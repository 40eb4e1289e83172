//! Raw-socket tests of the protocol's error paths, pipelining, multi-conn,
//! listener behaviour and graceful shutdown.

mod common;

use common::*;
use parking_lot::{Condvar, Mutex};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use tiercache_nbd::proto::{self, *};
use tiercache_nbd::{BlockSizes, Export, Listener, MemExport, Server, ServerConfig};

const MIB: u64 = 1 << 20;

fn mem(size: u64) -> Arc<MemExport> {
    Arc::new(MemExport::new(size))
}

#[test]
fn out_of_range_requests_get_the_spec_errnos() {
    let srv = start(mem(MIB), ServerConfig::default());
    for structured in [false, true] {
        let mut c = RawClient::connect(&srv.sock, structured);
        assert_eq!(c.size, MIB);
        c.send(CMD_READ, 0, 1, MIB - 512, 1024);
        let r = c.reply();
        assert_eq!((r.handle, r.errno), (1, proto::EINVAL));
        assert!(r.data.is_empty());
        if structured {
            assert!(r.message.contains("beyond the end"), "{r:?}");
        }
        // The payload of a refused write is consumed: the stream stays in sync.
        c.write(2, MIB, &[7u8; 4096], 0);
        assert_eq!(c.reply().errno, proto::ENOSPC);
        c.send(CMD_WRITE_ZEROES, 0, 3, MIB - 4096, 8192);
        assert_eq!(c.reply().errno, proto::ENOSPC);
        c.send(CMD_TRIM, 0, 4, u64::MAX - 4095, 4096);
        assert_eq!(c.reply().errno, proto::EINVAL);
        c.send(CMD_READ, 0, 5, MIB - 512, 512);
        let r = c.reply();
        assert_eq!((r.handle, r.errno, r.data.len()), (5, 0, 512));
        c.disc();
    }
}

#[test]
fn unknown_commands_and_flags_get_einval() {
    let srv = start(mem(MIB), ServerConfig::default());
    let mut c = RawClient::connect(&srv.sock, true);
    c.send(42, 0, 1, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_BLOCK_STATUS, 0, 2, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_CACHE, 0, 3, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_READ, CMD_FLAG_NO_HOLE, 4, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 5, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_READ, 0x8000, 6, 0, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    // DF is advertised with structured replies and accepted.
    assert_ne!(c.flags & FLAG_SEND_DF, 0);
    c.send(CMD_READ, CMD_FLAG_DF | CMD_FLAG_FUA, 7, 0, 512);
    assert_eq!(c.reply().errno, 0);
    // Zero-length requests succeed without disconnecting.
    c.send(CMD_READ, 0, 8, 0, 0);
    assert_eq!(
        c.reply(),
        Reply {
            handle: 8,
            errno: 0,
            data: vec![],
            message: String::new()
        }
    );
    c.write(9, 0, &[], 0);
    assert_eq!(c.reply().errno, 0);
    c.disc();
}

#[test]
fn over_max_lengths_are_refused_without_unbounded_reads() {
    let cfg = ServerConfig {
        max_block: 64 << 10,
        ..ServerConfig::default()
    };
    let srv = start(Arc::new(MemExport::new(64 * MIB)), cfg);
    let mut c = RawClient::connect(&srv.sock, false);
    assert_eq!(c.block.2, 64 << 10, "advertised maximum");
    c.send(CMD_READ, 0, 1, 0, 128 << 10);
    assert_eq!(c.reply().errno, proto::EINVAL);
    // Write-zeroes carries no payload and has no maximum (Linux's nbd
    // client sends them far above it).
    c.send(CMD_WRITE_ZEROES, 0, 2, 0, 16 << 20);
    assert_eq!(c.reply().errno, 0);
    // Below 2^25 the spec says not to treat it as DoS: payload is discarded.
    let data = pattern(1, 128 << 10);
    c.write(3, 0, &data, 0);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.send(CMD_READ, 0, 4, 0, 4096);
    assert_eq!(
        c.reply().data,
        vec![0u8; 4096],
        "refused write must not land"
    );
    // Trim has no maximum.
    c.send(CMD_TRIM, 0, 5, 0, 32 << 20);
    assert_eq!(c.reply().errno, 0);
    // Above 2^25 and the maximum: hard disconnect before any payload.
    c.send(CMD_WRITE, 0, 6, 0, (1 << 25) + 4096);
    assert!(c.closed_by_server());
    // Other clients are unaffected.
    let mut d = RawClient::connect(&srv.sock, true);
    d.send(CMD_READ, 0, 1, 0, 4096);
    assert_eq!(d.reply().errno, 0);
    d.disc();
}

#[test]
fn minimum_block_size_is_enforced() {
    let ex = MemExport::new(MIB).with_block_sizes(BlockSizes {
        min: 4096,
        preferred: 4096,
        max: 1 << 20,
    });
    let srv = start(Arc::new(ex), ServerConfig::default());
    let mut c = RawClient::connect(&srv.sock, true);
    assert_eq!(c.block, (4096, 4096, 1 << 20));
    c.send(CMD_READ, 0, 1, 512, 4096);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.write(2, 0, &[1u8; 512], 0);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.write(3, 4096, &[1u8; 4096], 0);
    assert_eq!(c.reply().errno, 0);
    c.disc();
}

#[test]
fn pipelined_requests_all_complete_with_correct_data() {
    let cfg = ServerConfig {
        workers: 4,
        max_inflight: 8,
        ..ServerConfig::default()
    };
    let srv = start(mem(4 * MIB), cfg);
    let mut c = RawClient::connect(&srv.sock, true);
    let n = 300u64;
    for i in 0..n {
        c.write(
            i,
            i * 8192,
            &pattern(i, 8192),
            if i % 7 == 0 { CMD_FLAG_FUA } else { 0 },
        );
    }
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let r = c.reply();
        assert_eq!(r.errno, 0);
        assert!(
            !std::mem::replace(&mut seen[r.handle as usize], true),
            "duplicate reply"
        );
    }
    for i in 0..n {
        c.send(CMD_READ, 0, 1000 + i, i * 8192, 8192);
    }
    for _ in 0..n {
        let r = c.reply();
        let i = r.handle - 1000;
        assert_eq!(r.errno, 0);
        assert!(r.data == pattern(i, 8192), "data mismatch for block {i}");
    }
    c.send(CMD_FLUSH, 0, 9, 0, 0);
    assert_eq!(c.reply().errno, 0);
    c.disc();
}

#[test]
fn multi_conn_flush_is_visible_across_connections() {
    let ex = mem(MIB);
    let srv = start(ex.clone(), ServerConfig::default());
    let mut a = RawClient::connect(&srv.sock, true);
    let mut b = RawClient::connect(&srv.sock, false);
    assert_ne!(a.flags & FLAG_CAN_MULTI_CONN, 0);
    let data = pattern(9, 65536);
    a.write(1, 4096, &data, 0);
    assert_eq!(a.reply().errno, 0);
    let before = ex.flush_count();
    b.send(CMD_FLUSH, 0, 2, 0, 0);
    assert_eq!(b.reply().errno, 0);
    assert!(ex.flush_count() > before);
    b.send(CMD_READ, 0, 3, 4096, 65536);
    assert!(b.reply().data == data);
    a.disc();
    b.disc();

    // An export that does not promise cross-connection flush visibility.
    let srv = start(
        Arc::new(MemExport::new(MIB).with_multi_conn(false)),
        ServerConfig::default(),
    );
    let c = RawClient::connect(&srv.sock, true);
    assert_eq!(c.flags & FLAG_CAN_MULTI_CONN, 0);
    c.disc();
}

#[test]
fn read_only_exports_refuse_writes_with_eperm() {
    let srv = start(
        Arc::new(MemExport::new(MIB).with_read_only(true)),
        ServerConfig::default(),
    );
    let mut c = RawClient::connect(&srv.sock, false);
    assert_ne!(c.flags & FLAG_READ_ONLY, 0);
    assert_eq!(
        c.flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FUA),
        0
    );
    c.write(1, 0, &[1u8; 512], 0);
    assert_eq!(c.reply().errno, proto::EPERM);
    c.send(CMD_TRIM, 0, 3, 0, 512);
    assert_eq!(c.reply().errno, proto::EPERM);
    c.send(CMD_WRITE_ZEROES, 0, 4, 0, 512);
    assert_eq!(c.reply().errno, proto::EPERM);
    c.send(CMD_READ, 0, 2, 0, 512);
    assert_eq!(c.reply().errno, 0);
    c.disc();
}

/// Fails reads at offset 0 with EIO and writes with EDQUOT.
struct Faulty(MemExport);
impl Export for Faulty {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset == 0 {
            return Err(io::Error::from_raw_os_error(libc_eio()));
        }
        self.0.read(offset, buf)
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(122)) // EDQUOT on Linux
    }
    fn flush(&self) -> io::Result<()> {
        Err(io::Error::other("flush exploded"))
    }
}
fn libc_eio() -> i32 {
    5
}

#[test]
fn export_errors_are_mapped_to_nbd_errnos() {
    let mut srv = start(
        Arc::new(Faulty(MemExport::new(MIB))),
        ServerConfig::default(),
    );
    for structured in [true, false] {
        let mut c = RawClient::connect(&srv.sock, structured);
        c.send(CMD_READ, 0, 1, 0, 4096);
        assert_eq!(c.reply().errno, proto::EIO);
        c.send(CMD_READ, 0, 2, 4096, 4096);
        assert_eq!(c.reply().errno, 0);
        c.write(3, 0, &[1u8; 4096], 0);
        assert_eq!(c.reply().errno, proto::ENOSPC);
        c.send(CMD_FLUSH, 0, 4, 0, 0);
        let r = c.reply();
        assert_eq!(r.errno, proto::EIO);
        if structured {
            assert!(r.message.contains("flush exploded"), "{r:?}");
        }
        c.disc();
    }
    // The shutdown flush error is reported.
    assert!(srv.shutdown().is_err());
}

#[test]
fn malformed_handshakes_are_refused_and_do_not_disturb_others() {
    let srv = start(mem(MIB), ServerConfig::default());
    // A long-lived good client in transmission throughout.
    let mut good = RawClient::connect(&srv.sock, true);
    good.write(1, 0, &[5u8; 4096], 0);
    assert_eq!(good.reply().errno, 0);

    // Truncated handshake: client leaves after two bytes of flags.
    {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s.write_all(&[0, 0]).unwrap();
    }
    // Unknown client flags: the server must drop the connection.
    {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(
            u16::from_be_bytes([g[16], g[17]]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        s.write_all(&0x80u32.to_be_bytes()).unwrap();
        assert_eq!(s.read(&mut g).unwrap_or(0), 0);
    }
    // Option haggling: errors for unknown/unsupported/malformed options,
    // then a bad magic ends it.
    {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = |o: &ClientOption| {
            s.write_all(&o.encode()).unwrap();
            read_option_replies(&mut s)
        };
        assert_eq!(opt(&ClientOption::Unsupported(1234))[0].0, REP_ERR_UNSUP);
        assert_eq!(
            opt(&ClientOption::Unsupported(OPT_SET_META_CONTEXT))[0].0,
            REP_ERR_UNSUP
        );
        assert_eq!(opt(&ClientOption::StartTls)[0].0, REP_ERR_POLICY);
        let list = opt(&ClientOption::List);
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].0, &list[0].1[..4]),
            (REP_SERVER, &[0u8, 0, 0, 0][..])
        );
        let info = opt(&ClientOption::Info(InfoRequest {
            name: "missing".into(),
            requests: vec![],
        }));
        assert_eq!(info.last().unwrap().0, REP_ERR_UNKNOWN);
        // GO with a name length pointing past the option data.
        let mut bad = OptionHeader {
            option: OPT_GO,
            length: 8,
        }
        .encode()
        .to_vec();
        bad.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 0]);
        s.write_all(&bad).unwrap();
        assert_eq!(read_option_replies(&mut s)[0].0, REP_ERR_INVALID);
        s.write_all(&[0xffu8; 16]).unwrap();
        assert_eq!(
            s.read(&mut g).unwrap_or(0),
            0,
            "bad option magic must disconnect"
        );
    }
    // An option claiming 4 GiB of data: disconnect without reading it.
    {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s.write_all(&1u32.to_be_bytes()).unwrap();
        s.write_all(
            &OptionHeader {
                option: 99,
                length: u32::MAX,
            }
            .encode(),
        )
        .unwrap();
        assert_eq!(s.read(&mut g).unwrap_or(0), 0);
    }
    // Bad request magic in transmission: that client is cut off.
    {
        let mut c = RawClient::connect(&srv.sock, false);
        c.s.write_all(&[0x42u8; 28]).unwrap();
        assert!(c.closed_by_server());
    }
    good.send(CMD_READ, 0, 2, 0, 4096);
    assert_eq!(good.reply().data, vec![5u8; 4096]);
    good.disc();
}

#[test]
fn client_vanishing_mid_write_does_not_apply_it_or_disturb_others() {
    let srv = start(mem(MIB), ServerConfig::default());
    let mut other = RawClient::connect(&srv.sock, true);
    {
        let mut c = RawClient::connect(&srv.sock, false);
        c.send(CMD_WRITE, 0, 1, 0, 65536);
        c.s.write_all(&[9u8; 1000]).unwrap();
        // Dropped here: the server sees EOF in the middle of the payload.
    }
    {
        // And one that vanishes with requests in flight.
        let mut c = RawClient::connect(&srv.sock, false);
        for i in 0..32 {
            c.send(CMD_READ, 0, i, 0, 65536);
        }
    }
    other.send(CMD_READ, 0, 2, 0, 65536);
    let r = other.reply();
    assert_eq!(r.errno, 0);
    assert!(
        r.data.iter().all(|&b| b == 0),
        "partial write must not be applied"
    );
    let mut fresh = RawClient::connect(&srv.sock, false);
    fresh.write(3, 0, &[1u8; 512], 0);
    assert_eq!(fresh.reply().errno, 0);
    fresh.disc();
    other.disc();
}

#[test]
fn tcp_listener_serves_too() {
    init_log();
    let listener = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let addr = listener.tcp_addr().unwrap();
    let server = Server::single("disk", mem(MIB), ServerConfig::default()).unwrap();
    let running = server.spawn(listener).unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(&ClientOption::ExportName("disk".into()).encode())
        .unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    assert_eq!(u64::from_be_bytes(info[..8].try_into().unwrap()), MIB);
    let h = RequestHeader {
        flags: 0,
        kind: CMD_READ,
        handle: 77,
        offset: 0,
        length: 512,
    };
    s.write_all(&h.encode()).unwrap();
    let mut r = [0u8; 16 + 512];
    s.read_exact(&mut r).unwrap();
    assert_eq!(&r[..16], &encode_simple_reply(0, 77));
    drop(s);
    running.shutdown().unwrap();
}

#[test]
fn unix_socket_is_private_and_stale_sockets_are_replaced() {
    init_log();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    // A stale socket: bound, then its listener went away.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let l = Listener::bind_unix(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Someone listens: refuse, and leave the socket alone.
    let e = Listener::bind_unix(&path).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    assert!(path.exists());
    drop(l);
    assert!(!path.exists(), "listener removes its socket when dropped");
    // Not a socket: refuse.
    std::fs::write(&path, b"data").unwrap();
    let e = Listener::bind_unix(&path).err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
    // No temporary directories were left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// Write blocks until the test opens the gate; signals when entered.
struct Gated {
    inner: Arc<MemExport>,
    state: Mutex<(bool, bool)>, // (entered, open)
    cv: Condvar,
}
impl Export for Gated {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, o: u64, b: &mut [u8]) -> io::Result<()> {
        self.inner.read(o, b)
    }
    fn write(&self, o: u64, d: &[u8], f: bool) -> io::Result<()> {
        let mut s = self.state.lock();
        s.0 = true;
        self.cv.notify_all();
        while !s.1 {
            self.cv.wait(&mut s);
        }
        drop(s);
        self.inner.write(o, d, f)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[test]
fn graceful_shutdown_finishes_in_flight_requests_and_flushes() {
    let mem = mem(MIB);
    let gated = Arc::new(Gated {
        inner: mem.clone(),
        state: Mutex::new((false, false)),
        cv: Condvar::new(),
    });
    let mut srv = start(gated.clone(), ServerConfig::default());
    let mut c = RawClient::connect(&srv.sock, false);
    c.write(1, 0, &[3u8; 4096], 0);
    {
        let mut s = gated.state.lock();
        while !s.0 {
            gated.cv.wait(&mut s);
        }
    }
    let running = srv.running.take().unwrap();
    let handle = running.handle();
    let waiter = std::thread::spawn(move || running.shutdown());
    while !handle.is_shutting_down() {
        std::thread::yield_now();
    }
    gated.state.lock().1 = true;
    gated.cv.notify_all();
    let r = c.reply();
    assert_eq!((r.handle, r.errno), (1, 0), "in-flight write answered");
    assert!(c.closed_by_server());
    waiter.join().unwrap().unwrap();
    assert!(mem.flush_count() >= 1, "export flushed on shutdown");
    let mut back = [0u8; 4096];
    mem.read(0, &mut back).unwrap();
    assert_eq!(back, [3u8; 4096]);
    assert!(!srv.sock.exists(), "socket removed");
}

#[test]
fn connection_cap_refuses_extra_clients() {
    let cfg = ServerConfig {
        max_connections: 1,
        ..ServerConfig::default()
    };
    let srv = start(mem(MIB), cfg);
    let first = RawClient::connect(&srv.sock, false);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    let mut g = [0u8; 18];
    assert_eq!(
        s.read(&mut g).unwrap_or(0),
        0,
        "second connection closed at once"
    );
    first.disc();
    // The slot frees once the first connection's thread has finished
    // (bounded only so that a bug fails instead of hanging).
    let mut waited = 0;
    while srv.running().active_connections() > 0 {
        waited += 1;
        assert!(waited < 12_000, "connection slot never freed");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let c = RawClient::connect(&srv.sock, false);
    c.disc();
}

#[test]
fn a_client_that_stops_reading_replies_does_not_block_others() {
    let cfg = ServerConfig {
        shutdown_grace: std::time::Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let mut srv = start(mem(64 * MIB), cfg);
    // Ask for far more reply data than socket buffers hold, never read it:
    // this connection's workers end up blocked in write.
    let mut stuck = RawClient::connect(&srv.sock, false);
    for i in 0..48 {
        stuck.send(CMD_READ, 0, i, i * MIB, MIB as u32);
    }
    // Meanwhile other clients are served normally.
    for k in 0..3 {
        let mut c = RawClient::connect(&srv.sock, true);
        c.write(1, k * MIB, &pattern(k, 65536), 0);
        assert_eq!(c.reply().errno, 0);
        c.send(CMD_READ, 0, 2, k * MIB, 65536);
        assert!(c.reply().data == pattern(k, 65536));
        c.disc();
    }
    // Shutdown cannot finish the stuck connection's requests; after the
    // grace period it cuts the connection and still completes.
    srv.shutdown().unwrap();
    drop(stuck);
}

#[test]
fn idle_clients_are_dropped_after_the_handshake_timeout() {
    let cfg = ServerConfig {
        handshake_timeout: Some(std::time::Duration::from_millis(100)),
        ..ServerConfig::default()
    };
    let srv = start(mem(MIB), cfg);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    // Say nothing: the server gives up on us.
    assert_eq!(s.read(&mut g).unwrap_or(0), 0);
    // The timeout does not apply in transmission.
    let mut c = RawClient::connect(&srv.sock, false);
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.send(CMD_READ, 0, 1, 0, 512);
    assert_eq!(c.reply().errno, 0);
    c.disc();
}

/// Panics on reads at offset 0.
struct Panicky(MemExport);
impl Export for Panicky {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        assert!(offset != 0, "deliberate test panic in Export::read");
        self.0.read(offset, buf)
    }
    fn write(&self, o: u64, d: &[u8], f: bool) -> io::Result<()> {
        self.0.write(o, d, f)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_panicking_export_fails_the_request_not_the_server() {
    let cfg = ServerConfig {
        workers: 1,
        max_inflight: 1,
        ..ServerConfig::default()
    };
    let mut srv = start(Arc::new(Panicky(MemExport::new(MIB))), cfg);
    let mut c = RawClient::connect(&srv.sock, true);
    // With one worker and one slot, a lost worker or slot would hang here.
    for i in 0..4 {
        c.send(CMD_READ, 0, i, 0, 512);
        assert_eq!(c.reply().errno, proto::EIO);
    }
    c.send(CMD_READ, 0, 9, 512, 512);
    assert_eq!(c.reply().errno, 0);
    c.disc();
    srv.shutdown().unwrap();
}

/// Deterministic xorshift generator for the stress test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a reply must look like.
enum Expect {
    Errno(u32),
    Data(Vec<u8>),
}

#[test]
fn concurrent_clients_with_mixed_valid_and_invalid_requests_match_a_model() {
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 64;
    let clients = 4u64;
    let size = clients * BLOCKS * BLOCK as u64;
    let srv = start(
        mem(size),
        ServerConfig {
            workers: 3,
            max_inflight: 8,
            ..ServerConfig::default()
        },
    );
    let sock = srv.sock.clone();
    std::thread::scope(|s| {
        // An abusive client alongside: bad requests, then garbage.
        let sock2 = sock.clone();
        s.spawn(move || {
            for round in 0..20u64 {
                let mut c = RawClient::connect(&sock2, round % 2 == 0);
                c.send(CMD_READ, 0, 1, u64::MAX - 10, 512);
                assert_eq!(c.reply().errno, proto::EINVAL);
                c.s.write_all(&[round as u8; 40]).unwrap();
                assert!(c.closed_by_server());
            }
        });
        for id in 0..clients {
            let sock = sock.clone();
            s.spawn(move || {
                let mut rng = Rng(0x1234_5678 + id);
                let base = id * BLOCKS * BLOCK as u64;
                // None: contents unspecified (trimmed).
                let mut model: Vec<Option<Vec<u8>>> = vec![Some(vec![0u8; BLOCK]); BLOCKS as usize];
                let mut c = RawClient::connect(&sock, id % 2 == 0);
                let mut handle = 0u64;
                for _batch in 0..30 {
                    // Distinct blocks per batch: replies may come in any order
                    // and requests may execute in any order.
                    let mut blocks: Vec<u64> = (0..BLOCKS).collect();
                    for i in 0..blocks.len() {
                        let j = i + rng.below((blocks.len() - i) as u64) as usize;
                        blocks.swap(i, j);
                    }
                    let mut expect = std::collections::HashMap::new();
                    let mut updates = Vec::new();
                    for &b in &blocks[..12] {
                        handle += 1;
                        let off = base + b * BLOCK as u64;
                        match rng.below(6) {
                            0 | 1 => {
                                let d = pattern(rng.next(), BLOCK);
                                let fua = if rng.below(2) == 0 { CMD_FLAG_FUA } else { 0 };
                                c.write(handle, off, &d, fua);
                                expect.insert(handle, Expect::Errno(0));
                                updates.push((b, Some(d)));
                            }
                            2 | 3 => {
                                c.send(CMD_READ, 0, handle, off, BLOCK as u32);
                                expect.insert(
                                    handle,
                                    match &model[b as usize] {
                                        Some(d) => Expect::Data(d.clone()),
                                        None => Expect::Errno(0),
                                    },
                                );
                            }
                            4 => {
                                c.send(
                                    CMD_WRITE_ZEROES,
                                    CMD_FLAG_NO_HOLE,
                                    handle,
                                    off,
                                    BLOCK as u32,
                                );
                                expect.insert(handle, Expect::Errno(0));
                                updates.push((b, Some(vec![0u8; BLOCK])));
                            }
                            _ => {
                                c.send(CMD_TRIM, 0, handle, off, BLOCK as u32);
                                expect.insert(handle, Expect::Errno(0));
                                updates.push((b, None));
                            }
                        }
                        // Sprinkle invalid requests in between.
                        if rng.below(4) == 0 {
                            handle += 1;
                            let (kind, errno) = match rng.below(3) {
                                0 => (CMD_READ, proto::EINVAL),
                                1 => (CMD_WRITE_ZEROES, proto::ENOSPC),
                                _ => (99, proto::EINVAL),
                            };
                            c.send(kind, 0, handle, size + rng.below(1 << 20), 4096);
                            expect.insert(handle, Expect::Errno(errno));
                        }
                    }
                    while !expect.is_empty() {
                        let r = c.reply();
                        match expect
                            .remove(&r.handle)
                            .expect("unknown or duplicate handle")
                        {
                            Expect::Errno(e) => assert_eq!(r.errno, e, "handle {}", r.handle),
                            Expect::Data(d) => {
                                assert_eq!(r.errno, 0);
                                assert!(
                                    r.data == d,
                                    "client {id}: wrong data for handle {}",
                                    r.handle
                                );
                            }
                        }
                    }
                    for (b, d) in updates {
                        model[b as usize] = d;
                    }
                }
                c.send(CMD_FLUSH, 0, 0, 0, 0);
                assert_eq!(c.reply().errno, 0);
                c.disc();
            });
        }
    });
}

#[test]
fn the_handshake_deadline_is_total_not_per_read() {
    let cfg = ServerConfig {
        handshake_timeout: Some(std::time::Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let srv = start(mem(MIB), cfg);
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    // Valid bytes (flags, then NBD_OPT_LIST after NBD_OPT_LIST), one every
    // 20 ms: each read is quick, but the negotiation never ends.
    let mut bytes = 1u32.to_be_bytes().to_vec();
    for _ in 0..100 {
        bytes.extend_from_slice(&ClientOption::List.encode());
    }
    let mut cut_off = false;
    for b in bytes {
        if s.write_all(&[b]).is_err() {
            cut_off = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        cut_off,
        "a dribbling client must be disconnected at the deadline"
    );
}

#[test]
fn one_server_can_serve_unix_and_tcp_at_once() {
    init_log();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let server = Server::single("", mem(MIB), ServerConfig::default()).unwrap();
    let unix = Listener::bind_unix(&sock).unwrap();
    let tcp = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let addr = tcp.tcp_addr().unwrap();
    let handle = server.shutdown_handle();
    let (s1, s2) = (server.clone(), server.clone());
    let t1 = std::thread::spawn(move || s1.serve(unix));
    let t2 = std::thread::spawn(move || s2.serve(tcp));
    let mut c = RawClient::connect(&sock, false);
    c.write(1, 0, &[4u8; 512], 0);
    assert_eq!(c.reply().errno, 0);
    c.disc();
    let mut t = std::net::TcpStream::connect(addr).unwrap();
    let mut g = [0u8; 18];
    t.read_exact(&mut g).unwrap();
    drop(t);
    handle.shutdown();
    t1.join().unwrap().unwrap();
    t2.join().unwrap().unwrap();
}

#[test]
fn unix_socket_paths_near_the_length_limit_work() {
    init_log();
    let dir = tempfile::tempdir().unwrap();
    // sun_path holds 107 bytes plus NUL. A long directory and a short name:
    // the final path fits, a temporary one beside it would not.
    let room = 98usize.saturating_sub(dir.path().as_os_str().len() + 1);
    let long_dir = dir.path().join("d".repeat(room.max(1)));
    std::fs::create_dir(&long_dir).unwrap();
    let path = long_dir.join("s");
    assert!(path.as_os_str().len() <= 107);
    let l = Listener::bind_unix(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let server = Server::single("", mem(MIB), ServerConfig::default()).unwrap();
    let running = server.spawn(l).unwrap();
    let c = RawClient::connect(&path, false);
    c.disc();
    running.shutdown().unwrap();
    assert!(!path.exists());
}
