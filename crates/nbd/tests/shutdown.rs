//! Stopping a server never depends on the file system or the network: the
//! accept loops are woken through a descriptor of their own.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};

/// Shuts `running` down on another thread; panics unless it returns within
/// 10 s.
fn shutdown_within_bound(running: tiercache_nbd::RunningServer) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(running.shutdown()).unwrap());
    rx.recv_timeout(Duration::from_secs(10))
        .expect("shutdown hung")
        .unwrap();
}

#[test]
fn shutdown_returns_after_the_socket_file_was_removed() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let server = Server::single(
        "",
        Arc::new(MemExport::new(1 << 20)),
        ServerConfig::default(),
    )
    .unwrap();
    let running = server.spawn(Listener::bind_unix(&sock).unwrap()).unwrap();
    // The server accepts while its file exists...
    drop(std::os::unix::net::UnixStream::connect(&sock).unwrap());
    // ...then someone cleans the directory.
    std::fs::remove_file(&sock).unwrap();
    shutdown_within_bound(running);
}

#[test]
fn shutdown_wakes_every_listener_of_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::single(
        "",
        Arc::new(MemExport::new(1 << 20)),
        ServerConfig::default(),
    )
    .unwrap();
    let handle = server.shutdown_handle();
    let tcp = Listener::bind_tcp("127.0.0.1:0").unwrap();
    let unix = Listener::bind_unix(dir.path().join("a.sock")).unwrap();
    let second = server.clone();
    let t = std::thread::spawn(move || second.serve(tcp));
    let running = server.spawn(unix).unwrap();
    std::fs::remove_file(dir.path().join("a.sock")).unwrap();
    handle.shutdown();
    shutdown_within_bound(running);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(t.join().unwrap()).unwrap());
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the TCP listener's loop hung")
        .unwrap();
}
