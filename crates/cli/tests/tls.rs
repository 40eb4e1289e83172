//! `tiercache serve` on the network: TCP needs TLS or an explicit
//! `--insecure`; X.509 and pre-shared-key TLS with libnbd's tools as the
//! clients; the control socket stays a private Unix socket and no TCP port
//! but `--listen`'s is opened; thousands of idle connections do not grow
//! the server's threads or lock a client out.

use std::collections::HashSet;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;

use common::*;
use tiercache_testkit::Pki;

/// `tiercache serve` with `args` on RAM devices (a 16 MiB backing device,
/// a 4 MiB cache), in `dir`, once every listener is up.
fn serve(dir: &Path, args: &[&str]) -> Served {
    let mut s = Served::spawn(bin(), dir, "mem:16M", "mem:4M", args);
    s.wait_for_log("tiercache: serving");
    s
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn listen_needs_tls_or_insecure_and_tls_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("x.sock");
    let fails_with = |args: &[&str], needle: &str| {
        let out = tiercache()
            .args(["serve", "--backing", "mem:1M", "--socket"])
            .arg(&sock)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    fails_with(&["--listen", "127.0.0.1:1"], "--insecure");
    fails_with(&["--listen", "127.0.0.1:1", "--tls", "off"], "--insecure");
    fails_with(
        &["--listen", "127.0.0.1:1", "--tls", "on", "--tls-psk", "k"],
        "--insecure",
    );
    fails_with(&["--tls-cert", "c.pem"], "--tls-key");
    fails_with(&["--tls-key", "k.pem"], "--tls-key");
    fails_with(&["--tls", "require"], "needs credentials");
    fails_with(&["--tls-psk", "k", "--tls-ca", "ca.pem"], "--tls-ca");
    fails_with(
        &["--tls-cert", "c", "--tls-key", "k", "--tls-psk", "p"],
        "exclude each other",
    );
    fails_with(&["--tls-psk", "k", "--tls", "off"], "contradicts");
    // The same keys in a config file.
    let cfg = dir.path().join("t.toml");
    std::fs::write(
        &cfg,
        "backing = \"mem:1M\"\nlisten = \"127.0.0.1:1\"\ntls = \"on\"\n\
         tls_psk = \"/nonexistent/from-config.psk\"\n",
    )
    .unwrap();
    fails_with(&["--config", cfg.to_str().unwrap()], "--insecure");
    fails_with(
        &["--config", cfg.to_str().unwrap(), "--insecure"],
        "/nonexistent/from-config.psk",
    );
    // Credentials are read at start: a missing file is named.
    fails_with(
        &[
            "--listen",
            "127.0.0.1:1",
            "--tls-psk",
            "/nonexistent/keys.psk",
        ],
        "/nonexistent/keys.psk",
    );
}

#[test]
fn insecure_listen_serves_plain_nbd_with_a_warning() {
    if !have("nbdinfo", "insecure_listen") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut s = serve(dir.path(), &["--listen", &addr, "--insecure"]);
    assert!(s.log().contains("WARNING"), "{}", s.log());
    let size = run(Command::new("nbdinfo").args(["--size", &format!("nbd://{addr}/default")]));
    assert_eq!(size.trim(), (16 * MIB).to_string());
    s.stop();
}

#[test]
fn x509_tls_serves_nbdinfo_and_nbdcopy_and_refuses_plain_clients() {
    if !have("nbdinfo", "x509_tls") || !have("nbdcopy", "x509_tls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pki");
    let (cert, key) = pki.server_files();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut s = serve(
        dir.path(),
        &[
            "--listen",
            &addr,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(!s.log().contains("WARNING"), "{}", s.log());
    assert!(
        s.log().contains(&format!("nbds://{addr}/default")),
        "{}",
        s.log()
    );
    let uri = format!(
        "nbds://{addr}/default?tls-certificates={}",
        pki.client_dir("client", None).display()
    );
    let size = run(Command::new("nbdinfo").args(["--size", &uri]));
    assert_eq!(size.trim(), (16 * MIB).to_string());

    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    run(Command::new("nbdcopy").arg(&uri).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "data differs after the round trip"
    );

    assert!(!succeeds(
        Command::new("nbdinfo").arg(format!("nbd://{addr}/default"))
    ));
    let other = Pki::new(dir.path(), "other");
    assert!(!succeeds(Command::new("nbdinfo").arg(format!(
        "nbds://{addr}/default?tls-certificates={}",
        other.client_dir("client", None).display()
    ))));
    // Only --listen's port is open; the control socket is a private Unix
    // socket.
    assert_eq!(s.listening_tcp_ports(), HashSet::from([port]));
    s.stop();
}

#[test]
fn psk_tls_serves_the_right_key_only() {
    if !have("nbdinfo", "psk_tls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.psk");
    let alice = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    std::fs::write(&keys, format!("alice:{alice}\n")).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    let wrong = dir.path().join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", "ab".repeat(32))).unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut s = serve(
        dir.path(),
        &["--listen", &addr, "--tls-psk", keys.to_str().unwrap()],
    );
    let uri = |k: &Path| format!("nbds://alice@{addr}/default?tls-psk-file={}", k.display());
    let size = run(Command::new("nbdinfo").args(["--size", &uri(&keys)]));
    assert_eq!(size.trim(), (16 * MIB).to_string());
    assert!(!succeeds(Command::new("nbdinfo").arg(uri(&wrong))));
    assert!(!succeeds(
        Command::new("nbdinfo").arg(format!("nbd://{addr}/default"))
    ));
    s.stop();
}

#[test]
fn unix_sockets_are_private_no_tcp_port_opens_and_idle_crowds_stay_bounded() {
    if !have("nbdinfo", "unix_private") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path(), &[]);
    // SAFETY: getuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    for f in ["nbd.sock", "nbd.ctl"] {
        let md = std::fs::symlink_metadata(dir.path().join(f)).unwrap();
        assert!(md.file_type().is_socket(), "{f}");
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{f} mode");
        assert_eq!(md.uid(), me, "{f} owner");
    }
    assert!(
        s.listening_tcp_ports().is_empty(),
        "no TCP port without --listen"
    );

    // 1500 connections that never speak: the server keeps at most its
    // connection limit of them (one thread each while negotiating), and a
    // real client still gets in.
    let base = s.threads();
    let sock = dir.path().join("nbd.sock");
    let idle: Vec<UnixStream> = (0..1500)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    let uri = format!("nbd+unix:///default?socket={}", sock.display());
    // While the server is still accepting the crowd, a newcomer can be the
    // one a later arrival displaces: like any client of a flooded server,
    // nbdinfo may need another try (a bounded few).
    let mut size = String::new();
    for attempt in 0..10 {
        let out = Command::new("nbdinfo")
            .args(["--size", &uri])
            .output()
            .unwrap();
        if out.status.success() {
            size = String::from_utf8(out.stdout).unwrap();
            break;
        }
        eprintln!(
            "nbdinfo attempt {attempt}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(size.trim(), (16 * MIB).to_string());
    let peak = s.threads();
    // 64 connection slots, at most 64 more on their way out, slack.
    assert!(peak <= base + 2 * 64 + 16, "{peak} threads (from {base})");
    // The oldest were closed by the server (after the greeting at most).
    let mut first = &idle[0];
    let mut buf = [0u8; 64];
    let mut got = 0;
    first
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    loop {
        match first.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => panic!("the oldest idle connection was left open: {e}"),
        }
    }
    assert!(got <= 18);
    drop(idle);
    assert!(s.listening_tcp_ports().is_empty());
    s.stop();
}
