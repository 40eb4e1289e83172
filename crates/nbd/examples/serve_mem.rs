//! Serves a RAM export over NBD until stdin closes or Ctrl-C.
//!
//! Usage: `serve_mem SOCKET_PATH|ADDR:PORT SIZE_MIB [WORKERS]`
//! (a path containing '/' is a Unix socket, anything else is TCP).

use std::sync::Arc;
use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};

fn main() {
    env_logger::init();
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!(
            "usage: {} SOCKET_PATH|ADDR:PORT SIZE_MIB [WORKERS]",
            args[0]
        );
        std::process::exit(2);
    }
    let size: u64 = args[2].parse::<u64>().expect("SIZE_MIB") << 20;
    let mut cfg = ServerConfig::default();
    if let Some(w) = args.get(3) {
        cfg.workers = w.parse().expect("WORKERS");
    }
    let listener = if args[1].contains('/') {
        Listener::bind_unix(&args[1]).expect("bind unix socket")
    } else {
        eprintln!("warning: plain TCP is unencrypted and unauthenticated");
        Listener::bind_tcp(&args[1]).expect("bind tcp")
    };
    let server = Server::single("", Arc::new(MemExport::new(size)), cfg).unwrap();
    let running = server.spawn(listener).unwrap();
    eprintln!("serving {} MiB; close stdin to stop", size >> 20);
    let mut sink = String::new();
    while std::io::stdin()
        .read_line(&mut sink)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    running.shutdown().unwrap();
}
