//! TLS (`NBD_OPT_STARTTLS`): X.509 and pre-shared keys against libnbd's
//! tools (nbdinfo, nbdcopy, nbdsh) as the client, and against a raw client
//! over rustls for the protocol details (state reset, a second STARTTLS,
//! required mode refusing plain clients).

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use tiercache_nbd::proto::{self, ClientOption, InfoRequest, CMD_READ};
use tiercache_nbd::{Listener, MemExport, RunningServer, Server, ServerConfig, TlsConfig, TlsMode};
use tiercache_testkit::Pki;

const MIB: u64 = 1 << 20;

/// The server's TLS credentials: a certificate from `pki` for localhost,
/// and with `client_ca` client certificates required and checked against
/// that CA.
fn server_config(pki: &Pki, client_ca: Option<&Pki>) -> TlsConfig {
    let (cert, key) = pki.server_pem();
    let ca = client_ca.map(Pki::ca_pem);
    TlsConfig::x509_from_pem(
        cert.as_bytes(),
        key.as_bytes(),
        ca.as_deref().map(str::as_bytes),
    )
    .unwrap()
}

fn serve_tcp(export: Arc<MemExport>, tls: TlsMode) -> (RunningServer, u16) {
    init_log();
    let listener = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let port = listener.tcp_addr().unwrap().port();
    let cfg = ServerConfig {
        tls,
        ..ServerConfig::default()
    };
    let server = Server::single("", export, cfg).unwrap();
    (server.spawn(listener).unwrap(), port)
}

fn nbdinfo_size(uri: &str) -> u64 {
    let out = run(Command::new("nbdinfo").args(["--size", uri]));
    out.trim().parse().unwrap()
}

/// Writes `len` bytes of pattern `seed` to the export at `uri` with nbdcopy
/// and reads them back the same way (several connections, requests in
/// flight); panics if what comes back differs.
fn nbdcopy_round_trip(dir: &Path, uri: &str, seed: u64, len: u64) {
    let src = dir.join("src.img");
    let back = dir.join("back.img");
    let data = pattern(seed, len as usize);
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(uri));
    run(Command::new("nbdcopy").arg(uri).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data differs after the round trip"
    );
}

#[test]
fn x509_nbdinfo_and_nbdcopy_round_trip_and_wrong_ca_fails() {
    if !have("nbdinfo", "x509_nbdinfo") || !have("nbdcopy", "x509_nbdinfo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "good");
    let (srv, port) = serve_tcp(
        Arc::new(MemExport::new(8 * MIB)),
        TlsMode::Required(server_config(&pki, None)),
    );
    let certs = pki.client_dir("client", None);
    let uri = format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={}",
        certs.display()
    );
    assert_eq!(nbdinfo_size(&uri), 8 * MIB);

    // Data through TLS both ways, with nbdcopy's several connections and
    // requests in flight.
    nbdcopy_round_trip(tmp.path(), &uri, 7, 8 * MIB);

    // A client that trusts another CA refuses the server.
    let other = Pki::new(tmp.path(), "other");
    let wrong = other.client_dir("client", None);
    assert!(!succeeds(Command::new("nbdinfo").arg(format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={}",
        wrong.display()
    ))));
    // Plain NBD is refused: TLS is required.
    assert!(!succeeds(
        Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/"))
    ));
    // And the server still serves.
    assert_eq!(nbdinfo_size(&uri), 8 * MIB);
    srv.shutdown().unwrap();
}

#[test]
fn client_certificates_are_verified_when_a_ca_is_given() {
    if !have("nbdinfo", "client_certificates") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let server_pki = Pki::new(tmp.path(), "server");
    let client_pki = Pki::new(tmp.path(), "clients");
    let stranger_pki = Pki::new(tmp.path(), "strangers");
    let (srv, port) = serve_tcp(
        Arc::new(MemExport::new(MIB)),
        TlsMode::Required(server_config(&server_pki, Some(&client_pki))),
    );
    let uri = |d: &Path| format!("nbds://127.0.0.1:{port}/?tls-certificates={}", d.display());
    let member = server_pki.client_dir("member", Some(&client_pki));
    let anonymous = server_pki.client_dir("anonymous", None);
    let stranger = server_pki.client_dir("stranger", Some(&stranger_pki));
    assert_eq!(nbdinfo_size(&uri(&member)), MIB);
    assert!(!succeeds(Command::new("nbdinfo").arg(uri(&anonymous))));
    assert!(!succeeds(Command::new("nbdinfo").arg(uri(&stranger))));
    assert_eq!(nbdinfo_size(&uri(&member)), MIB);
    srv.shutdown().unwrap();
}

fn write_psk_file(path: &Path, lines: &[(&str, &[u8])]) {
    let text: String = lines
        .iter()
        .map(|(user, key)| {
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            format!("{user}:{hex}\n")
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

#[test]
fn psk_nbdinfo_and_nbdsh_data_and_wrong_keys_fail() {
    if !have("nbdinfo", "psk_nbdinfo") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let alice_key = pattern(1, 32);
    let server_keys = tmp.path().join("server.psk");
    write_psk_file(
        &server_keys,
        &[("alice", &alice_key), ("bob", &pattern(2, 32))],
    );
    let tls = TlsConfig::psk_from_file(&server_keys).unwrap();
    let (srv, port) = serve_tcp(Arc::new(MemExport::new(4 * MIB)), TlsMode::Required(tls));
    let client_keys = tmp.path().join("alice.psk");
    write_psk_file(&client_keys, &[("alice", &alice_key)]);
    let uri = format!(
        "nbds://alice@127.0.0.1:{port}/?tls-psk-file={}",
        client_keys.display()
    );
    assert_eq!(nbdinfo_size(&uri), 4 * MIB);

    // Data over PSK-TLS.
    if have("nbdcopy", "psk data") {
        nbdcopy_round_trip(tmp.path(), &uri, 3, 4 * MIB);
    }

    // Wrong key for alice; unknown identity.
    let wrong_keys = tmp.path().join("wrong.psk");
    write_psk_file(&wrong_keys, &[("alice", &pattern(9, 32))]);
    assert!(!succeeds(Command::new("nbdinfo").arg(format!(
        "nbds://alice@127.0.0.1:{port}/?tls-psk-file={}",
        wrong_keys.display()
    ))));
    let mallory_keys = tmp.path().join("mallory.psk");
    write_psk_file(&mallory_keys, &[("mallory", &alice_key)]);
    assert!(!succeeds(Command::new("nbdinfo").arg(format!(
        "nbds://mallory@127.0.0.1:{port}/?tls-psk-file={}",
        mallory_keys.display()
    ))));
    assert!(!succeeds(
        Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/"))
    ));
    assert_eq!(nbdinfo_size(&uri), 4 * MIB);
    srv.shutdown().unwrap();
}

#[test]
fn optional_tls_serves_plain_and_tls_clients() {
    if !have("nbdinfo", "optional_tls") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "ca");
    let (srv, port) = serve_tcp(
        Arc::new(MemExport::new(MIB)),
        TlsMode::Optional(server_config(&pki, None)),
    );
    let certs = pki.client_dir("client", None);
    assert_eq!(
        nbdinfo_size(&format!(
            "nbds://127.0.0.1:{port}/?tls-certificates={}",
            certs.display()
        )),
        MIB
    );
    assert_eq!(nbdinfo_size(&format!("nbd://127.0.0.1:{port}/")), MIB);
    srv.shutdown().unwrap();
}

// ---------------------------------------------------------------------------
// A raw client over rustls, for the protocol details.

type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Connects, greets, sends the options `before` (each must be ACKed), then
/// NBD_OPT_STARTTLS and (on ACK) runs the TLS handshake trusting `pki`'s
/// CA.
fn starttls(port: u16, pki: &Pki, before: &[ClientOption]) -> TlsClient {
    let mut s = greet(TcpStream::connect(("127.0.0.1", port)).unwrap());
    for o in before {
        s.write_all(&o.encode()).unwrap();
        assert_eq!(read_option_replies(&mut s)[0].0, proto::REP_ACK, "{o:?}");
    }
    s.write_all(&ClientOption::StartTls.encode()).unwrap();
    let r = read_option_replies(&mut s);
    assert_eq!(r, vec![(proto::REP_ACK, vec![])]);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der().into()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    rustls::StreamOwned::new(conn, s)
}

#[test]
fn raw_tls_client_state_reset_second_starttls_and_pipelining() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "ca");
    let (srv, port) = serve_tcp(
        Arc::new(MemExport::new(16 * MIB)),
        TlsMode::Required(server_config(&pki, None)),
    );

    // Before STARTTLS, in required mode, every option is refused with
    // TLS_REQD; after it, the same options work.
    let mut s = greet(TcpStream::connect(("127.0.0.1", port)).unwrap());
    for o in [
        ClientOption::StructuredReply,
        ClientOption::List,
        ClientOption::Go(InfoRequest {
            name: String::new(),
            requests: vec![],
        }),
    ] {
        s.write_all(&o.encode()).unwrap();
        assert_eq!(read_option_replies(&mut s)[0].0, proto::REP_ERR_TLS_REQD);
    }
    // EXPORT_NAME cannot be refused: the server hangs up.
    s.write_all(&ClientOption::ExportName(String::new()).encode())
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap_or(0), 0);

    // Over TLS: a second STARTTLS is invalid, then a normal session with
    // structured replies and many pipelined requests, some of them large.
    let mut t = starttls(port, &pki, &[]);
    t.write_all(&ClientOption::StartTls.encode()).unwrap();
    assert_eq!(read_option_replies(&mut t)[0].0, proto::REP_ERR_INVALID);
    let mut c = RawClient::negotiate(t, true);
    assert_eq!(c.size, 16 * MIB);
    let blocks: Vec<(u64, Vec<u8>)> = (0..16u64)
        .map(|i| (i * MIB, pattern(100 + i, MIB as usize)))
        .collect();
    for (i, (off, data)) in blocks.iter().enumerate() {
        c.write(i as u64, *off, data, 0);
    }
    for _ in 0..blocks.len() {
        assert_eq!(c.reply().errno, 0);
    }
    for (i, (off, _)) in blocks.iter().enumerate() {
        c.send(CMD_READ, 0, 100 + i as u64, *off, MIB as u32);
    }
    let mut seen = 0;
    for _ in 0..blocks.len() {
        let r = c.reply();
        let i = (r.handle - 100) as usize;
        assert_eq!(r.errno, 0);
        assert!(r.data == blocks[i].1, "block {i} differs");
        seen += 1;
    }
    assert_eq!(seen, 16);
    // Errors still come back over TLS.
    c.write(999, 16 * MIB, &[1u8; 512], 0);
    assert_eq!(c.reply().errno, proto::ENOSPC);
    c.send(CMD_READ, 0, 1000, 16 * MIB, 512);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.disc();

    srv.shutdown().unwrap();

    // Structured replies asked for before STARTTLS do not carry over: the
    // server answers a read with a simple reply (the raw client would
    // fail on a structured one it did not ask for).
    let (srv2, port2) = serve_tcp(
        Arc::new(MemExport::new(MIB)),
        TlsMode::Optional(server_config(&pki, None)),
    );
    let t = starttls(port2, &pki, &[ClientOption::StructuredReply]);
    let mut c = RawClient::negotiate(t, false);
    c.send(CMD_READ, 0, 1, 0, 512);
    let mut hdr = [0u8; 16];
    c.s.read_exact(&mut hdr).unwrap();
    assert_eq!(hdr, proto::encode_simple_reply(0, 1), "a simple reply");
    let mut data = [0u8; 512];
    c.s.read_exact(&mut data).unwrap();
    c.disc();
    srv2.shutdown().unwrap();
}

#[test]
fn a_failed_tls_handshake_closes_only_that_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "ca");
    let (srv, port) = serve_tcp(
        Arc::new(MemExport::new(MIB)),
        TlsMode::Required(server_config(&pki, None)),
    );
    let mut good = RawClient::negotiate(starttls(port, &pki, &[]), true);
    // Garbage where the ClientHello should be.
    let mut s = greet(TcpStream::connect(("127.0.0.1", port)).unwrap());
    s.write_all(&ClientOption::StartTls.encode()).unwrap();
    assert_eq!(read_option_replies(&mut s)[0].0, proto::REP_ACK);
    s.write_all(&[0x16, 3, 3, 0, 5, 1, 2, 3, 4, 5, 0xff, 0xff])
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // A TLS alert record at most, then the server hung up.
    assert!(rest.is_empty() || rest[0] == 0x15, "{rest:?}");
    good.write(1, 0, &[3u8; 4096], 0);
    assert_eq!(good.reply().errno, 0);
    good.send(CMD_READ, 0, 2, 0, 4096);
    assert_eq!(good.reply().data, vec![3u8; 4096]);
    good.disc();
    srv.shutdown().unwrap();
}
