//! `LocalConnector` and the client-side negotiation the kernel NBD client
//! needs (`kernel_client::negotiate`): an in-process connection is served
//! like an accepted one, never asks for TLS (even where TLS is required of
//! network clients), ends when its client end is closed everywhere, and is
//! refused once the server stops. No kernel needed; the VM lab's
//! nbd-restart.sh runs the rest against Linux.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_nbd::kernel_client::negotiate;
use tiercache_nbd::proto::{self, RequestHeader};
use tiercache_nbd::{ExportEntry, Listener, MemExport, Server, ServerConfig, TlsConfig, TlsMode};
use tiercache_testkit::Pki;

const MIB: u64 = 1 << 20;

/// One request with simple replies (what the kernel reads), waits for its
/// reply; the read data for a read.
fn request(
    s: &mut UnixStream,
    kind: u16,
    handle: u64,
    offset: u64,
    data: &[u8],
    len: u32,
) -> Vec<u8> {
    let h = RequestHeader {
        flags: 0,
        kind,
        handle,
        offset,
        length: len,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(data).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[0..4], &proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(
        u32::from_be_bytes(reply[4..8].try_into().unwrap()),
        0,
        "errno"
    );
    assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), handle);
    let mut out = vec![
        0u8;
        if kind == proto::CMD_READ {
            len as usize
        } else {
            0
        }
    ];
    s.read_exact(&mut out).unwrap();
    out
}

fn wait_finished(t: &std::thread::JoinHandle<()>) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.is_finished() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn a_local_connection_negotiates_serves_and_ends_with_its_client() {
    let srv = start(Arc::new(MemExport::new(4 * MIB)), ServerConfig::default());
    let conn = srv.running().local_connector().connect("test").unwrap();
    let mut client = conn.client;
    let info = negotiate(&mut client, "").unwrap();
    assert_eq!(info.size, 4 * MIB);
    assert_ne!(info.flags & proto::FLAG_SEND_FLUSH, 0);
    assert!(info.min_block >= 1 && info.min_block <= 4096);
    let data = pattern(7, 8192);
    request(
        &mut client,
        proto::CMD_WRITE,
        1,
        4096,
        &data,
        data.len() as u32,
    );
    request(&mut client, proto::CMD_FLUSH, 2, 0, &[], 0);
    assert_eq!(
        request(&mut client, proto::CMD_READ, 3, 4096, &[], 8192),
        data
    );
    // A second handle on the client end keeps the connection open...
    let dup = client.try_clone().unwrap();
    drop(client);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !conn.thread.is_finished(),
        "ended while a client handle is open"
    );
    // ...and once none is left, the server's side ends.
    drop(dup);
    assert!(
        wait_finished(&conn.thread),
        "the connection outlived its client"
    );
    assert_eq!(srv.running().active_connections(), 0);
}

#[test]
fn a_local_connection_needs_no_tls_where_network_clients_must_use_it() {
    init_log();
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "server");
    let (cert, key) = pki.server_pem();
    let tls = TlsConfig::x509_from_pem(cert.as_bytes(), key.as_bytes(), None).unwrap();
    let cfg = ServerConfig {
        tls: TlsMode::Required(tls),
        ..ServerConfig::default()
    };
    let server = Server::single("", Arc::new(MemExport::new(MIB)), cfg).unwrap();
    let running = server
        .spawn(Listener::bind_unix(tmp.path().join("s.sock")).unwrap())
        .unwrap();
    // Over the listener, TLS is required: NBD_OPT_GO is refused.
    let mut plain = UnixStream::connect(tmp.path().join("s.sock")).unwrap();
    let err = negotiate(&mut plain, "").unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    // A local connection negotiates in plain text.
    let mut local = running.local_connector().connect("kernel").unwrap().client;
    assert_eq!(negotiate(&mut local, "").unwrap().size, MIB);
    drop(local);
    running.shutdown().unwrap();
}

#[test]
fn an_unknown_export_is_refused_and_a_stopping_server_refuses_connections() {
    init_log();
    let tmp = tempfile::tempdir().unwrap();
    let exports = vec![
        ExportEntry::new("a", Arc::new(MemExport::new(MIB))),
        ExportEntry::new("b", Arc::new(MemExport::new(2 * MIB))),
    ];
    let running = Server::new(exports, ServerConfig::default())
        .unwrap()
        .spawn(Listener::bind_unix(tmp.path().join("s.sock")).unwrap())
        .unwrap();
    let connector = running.local_connector();
    let mut c = connector.connect("x").unwrap().client;
    assert_eq!(negotiate(&mut c, "b").unwrap().size, 2 * MIB);
    let mut c = connector.connect("x").unwrap().client;
    let err = negotiate(&mut c, "c").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    drop(c);
    running.handle().shutdown();
    let err = connector
        .connect("late")
        .err()
        .expect("connected to a stopping server");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    running.wait().unwrap();
}
