//! Bad input is logged once per connection and kind (later occurrences go to
//! debug level). Own test binary: it installs a capturing logger.

mod common;

use common::RawClient;
use std::sync::{Arc, Mutex};
use tiercache_nbd::proto::{self, CMD_READ};
use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};

struct Capture(Mutex<Vec<(log::Level, String)>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        if r.target().starts_with("tiercache_nbd") {
            self.0
                .lock()
                .unwrap()
                .push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

#[test]
fn repeated_bad_requests_are_warned_about_once() {
    let cap: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
    log::set_logger(cap).unwrap();
    log::set_max_level(log::LevelFilter::Debug);

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let server = Server::single(
        "",
        Arc::new(MemExport::new(1 << 20)),
        ServerConfig::default(),
    );
    let running = server
        .unwrap()
        .spawn(Listener::bind_unix(&sock).unwrap())
        .unwrap();
    let mut c = RawClient::connect(&sock, true);
    for i in 0..50 {
        c.send(CMD_READ, 0, i, 1 << 20, 512);
        assert_eq!(c.reply().errno, proto::EINVAL);
    }
    c.send(77, 0, 99, 0, 0);
    assert_eq!(c.reply().errno, proto::EINVAL);
    c.disc();
    running.shutdown().unwrap();

    let logs = cap.0.lock().unwrap();
    let count = |lvl: log::Level, needle: &str| {
        logs.iter()
            .filter(|(l, m)| *l == lvl && m.contains(needle))
            .count()
    };
    assert_eq!(count(log::Level::Warn, "beyond the end"), 1, "{logs:#?}");
    assert_eq!(count(log::Level::Debug, "beyond the end"), 49, "{logs:#?}");
    assert_eq!(count(log::Level::Warn, "unknown command"), 1, "{logs:#?}");
}
