//! Resource bounds under abuse: thousands of idle connections, a full
//! server, clients sending garbage. Threads and memory stay bounded and
//! well-behaved clients keep being served.
//!
//! The tests count the server's threads in this process, so they run one
//! at a time.

mod common;

use common::*;
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;
use tiercache_nbd::proto::CMD_READ;
use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};

const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// The threads serving NBD connections in this process: a reader per
/// connection (`nbd-conn-N`) and its workers (`nbd-worker-N`). Left out: a
/// connection's thread that has given its slot back and is only exiting
/// (it renames itself `nbd-done`, and may be listed a moment longer on a
/// loaded host), and
/// the test harness's threads (it starts a test's thread whenever one
/// ends, at any point of another test's run) and the listeners' (a new
/// thread names itself only once it runs).
fn threads() -> usize {
    thread_names()
        .iter()
        .filter(|n| n.starts_with("nbd-conn") || n.starts_with("nbd-worker"))
        .count()
}

/// This process's threads by name, for a failure's message.
fn thread_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect();
    names.sort();
    names
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// File descriptors this process may open.
fn fd_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; the resource is valid.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    assert_eq!(rc, 0);
    r.rlim_cur
}

/// Waits (bounded, so that a bug fails instead of hanging) until `f`.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("never happened: {what}; threads: {:?}", thread_names());
}

/// Whether the server has taken the connection on `fd` off its listener's
/// backlog: it sent its greeting, or closed the connection (replaced).
fn accepted(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, whose fd is open for the call; no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Writes, reads back and checks one block through `c`.
fn check_io<S: Read + Write>(c: &mut RawClient<S>, seed: u64) {
    let data = pattern(seed, 65536);
    let offset = (seed % 16) * 65536;
    c.write(seed, offset, &data, 0);
    assert_eq!(c.reply().errno, 0);
    c.send(CMD_READ, 0, seed + 1, offset, 65536);
    let r = c.reply();
    assert_eq!(r.errno, 0);
    assert!(r.data == data, "read back differs");
}

#[test]
fn thousands_of_idle_connections_keep_threads_bounded_and_clients_served() {
    let _serial = SERIAL.lock();
    init_log();
    let cfg = ServerConfig::default();
    let max = cfg.max_connections;
    let workers = cfg.workers;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let server = Server::single("", Arc::new(MemExport::new(16 * MIB)), cfg).unwrap();
    let tcp = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let addr = tcp.tcp_addr().unwrap();
    let tcp_server = server.clone();
    let tcp_thread = std::thread::spawn(move || tcp_server.serve(tcp));
    let running = server.spawn(Listener::bind_unix(&sock).unwrap()).unwrap();

    let base_threads = threads();
    let base_rss = rss_bytes();
    // 2000 connections that never say anything (fewer if this process may
    // not open that many files: each costs one here and up to two in the
    // server while it holds a slot).
    let per_kind = 1000.min((fd_limit().saturating_sub(400) / 2) as usize);
    eprintln!("opening {per_kind} idle Unix and {per_kind} idle TCP connections");
    let mut idle_unix = Vec::with_capacity(per_kind);
    let mut idle_tcp = Vec::with_capacity(per_kind);
    let mut peak = 0;
    for i in 0..per_kind {
        idle_unix.push(UnixStream::connect(&sock).unwrap());
        idle_tcp.push(TcpStream::connect(addr).unwrap());
        if i % 100 == 0 {
            peak = peak.max(threads());
        }
    }
    // The newest connections hold the slots; the older ones were closed.
    // Every one accepted first: a connection still in a listener's backlog
    // would, once accepted, replace the oldest negotiating connection,
    // which could be a well-behaved client below (seen on a loaded host).
    use std::os::fd::AsRawFd;
    eventually("the server has accepted every idle connection", || {
        idle_unix.iter().all(|s| accepted(s.as_raw_fd()))
            && idle_tcp.iter().all(|s| accepted(s.as_raw_fd()))
    });
    eventually("the server holds at most its limit of connections", || {
        running.active_connections() <= max
    });
    peak = peak.max(threads());

    // Well-behaved clients still get in and are served, over both
    // listeners, while the idle ones keep their slots busy.
    let mut unix_client = RawClient::connect(&sock, true);
    let mut tcp_client = RawClient::negotiate(greet(TcpStream::connect(addr).unwrap()), false);
    for k in 0..8 {
        check_io(&mut unix_client, 10 * k + 1);
        check_io(&mut tcp_client, 10 * k + 5);
    }
    peak = peak.max(threads());
    // More idle connections cannot push the served clients out.
    let more: Vec<UnixStream> = (0..2 * max)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    check_io(&mut unix_client, 1001);
    check_io(&mut tcp_client, 1002);
    peak = peak.max(threads());
    let rss_growth = rss_bytes().saturating_sub(base_rss);
    eprintln!(
        "threads: {base_threads} before, peak {peak}; RSS grew by {} KiB",
        rss_growth >> 10
    );

    // Threads: one per connection slot while negotiating, at most `max`
    // more on their way out after being replaced, and a reader plus the
    // workers for each of the two served clients.
    let bound = base_threads + 2 * max + 2 * (1 + workers);
    assert!(peak <= bound, "{peak} threads, bound {bound}");
    // Memory: no per-connection growth for the thousands (a generous
    // bound: slots' buffers are touched only as far as used).
    assert!(rss_growth < 128 * MIB, "RSS grew by {rss_growth} bytes");

    // The oldest idle connections were closed by the server.
    for s in idle_unix.iter_mut().take(10) {
        let mut b = [0u8; 64];
        let mut got = 0;
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        assert!(got <= 18, "at most the greeting before the close");
    }

    drop((idle_unix, idle_tcp, more));
    unix_client.disc();
    tcp_client.disc();
    eventually("every connection has gone", || {
        running.active_connections() == 0
    });
    eventually("threads are back to the baseline", || {
        threads() <= base_threads
    });
    running.shutdown().unwrap();
    tcp_thread.join().unwrap().unwrap();
}

#[test]
fn a_full_server_replaces_idle_handshakes_but_never_served_clients() {
    let _serial = SERIAL.lock();
    let cfg = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let srv = start(Arc::new(MemExport::new(MIB)), cfg);
    let greeted = || {
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s
    };
    let closed = |s: &mut UnixStream| {
        let mut b = [0u8; 1];
        matches!(s.read(&mut b), Ok(0) | Err(_))
    };
    let mut idle1 = greeted();
    let mut idle2 = greeted();
    // A client arriving at a full server takes the oldest idle slot.
    let mut a = RawClient::connect(&srv.sock, true);
    assert!(closed(&mut idle1), "the oldest idle connection makes room");
    check_io(&mut a, 1);
    let mut b = RawClient::connect(&srv.sock, false);
    assert!(closed(&mut idle2));
    check_io(&mut b, 2);
    // Both slots serve clients now: a newcomer is refused at once (no
    // greeting), and the served clients are untouched.
    let mut late = UnixStream::connect(&srv.sock).unwrap();
    let mut g = [0u8; 18];
    assert_eq!(late.read(&mut g).unwrap_or(0), 0, "refused");
    check_io(&mut a, 3);
    check_io(&mut b, 4);
    a.disc();
    eventually("a slot frees", || srv.running().active_connections() < 2);
    let mut c = RawClient::connect(&srv.sock, true);
    check_io(&mut c, 5);
    c.disc();
    b.disc();
}

#[test]
fn clients_sending_garbage_are_dropped_and_others_unaffected() {
    let _serial = SERIAL.lock();
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_secs(5)),
        ..ServerConfig::default()
    };
    let srv = start(Arc::new(MemExport::new(16 * MIB)), cfg);
    let base_threads = threads();
    let mut good = RawClient::connect(&srv.sock, true);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..300u64 {
        let len = (next() % 4096) as usize;
        let junk = pattern(next(), len);
        let mut s = UnixStream::connect(&srv.sock).unwrap();
        match i % 3 {
            // Garbage from the first byte.
            0 => {}
            // A proper greeting, then garbage options.
            1 => s = greet(s),
            // In transmission, then garbage requests.
            _ => {
                let c = RawClient::negotiate(greet(s), i % 2 == 0);
                s = c.s;
            }
        }
        // The server may hang up while we write; that is fine.
        let _ = s.write_all(&junk);
        let _ = s.shutdown(Shutdown::Write);
        // The server must close the connection: at EOF at the latest
        // (garbage can look like the start of a long request).
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut sink = Vec::new();
        match s.read_to_end(&mut sink) {
            Ok(_) => {}
            Err(e) => assert_ne!(
                e.kind(),
                std::io::ErrorKind::WouldBlock,
                "connection {i} left open"
            ),
        }
        if i % 25 == 0 {
            check_io(&mut good, i + 1);
        }
    }
    check_io(&mut good, 7);
    eventually("only the good client is left", || {
        srv.running().active_connections() == 1
    });
    // The good client's reader and its workers.
    let bound = base_threads + 1 + ServerConfig::default().workers;
    eventually("threads are back to where they were", || threads() <= bound);
    good.send(CMD_READ, 0, 9, 0, 512);
    assert_eq!(good.reply().errno, 0);
    good.disc();
}
