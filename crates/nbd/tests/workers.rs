//! Requests the reader hands to the workers (misses: reads the export
//! cannot answer at once, writes) run side by side, one worker each, as
//! many as the client sends at once up to the worker count: a worker woken
//! for a job that another worker took must not leave a later job waiting.

mod common;

use common::RawClient;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_nbd::{proto, Export, ServerConfig};

const BLOCK: usize = 4096;

/// A backing device whose reads each wait until `n` of them are in flight
/// at once (at most a generous bound, so the test fails instead of
/// hanging), and record the most seen.
struct Gathering {
    n: usize,
    now: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl Export for Gathering {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut g = self.now.lock();
        g.0 += 1;
        g.1 = g.1.max(g.0);
        self.changed.notify_all();
        while g.1 < self.n && !self.changed.wait_until(&mut g, deadline).timed_out() {}
        g.0 -= 1;
        drop(g);
        buf.fill(0x5a);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rounds of N reads sent at once, each held by the device until all N
/// are in flight: every round must see N at once (N below the worker
/// count), with the right data.
#[test]
fn misses_sent_at_once_run_on_as_many_workers() {
    const N: usize = 6;
    let cfg = ServerConfig {
        workers: 8,
        ..ServerConfig::default()
    };
    for round in 0..20u64 {
        let export = Arc::new(Gathering {
            n: N,
            now: Mutex::new((0, 0)),
            changed: Condvar::new(),
        });
        let srv = common::start(export.clone(), cfg.clone());
        let mut c = RawClient::connect(&srv.sock, true);
        for h in 0..N as u64 {
            c.send(
                proto::CMD_READ,
                0,
                h,
                (round * N as u64 + h) * BLOCK as u64 % (1 << 20),
                BLOCK as u32,
            );
        }
        for _ in 0..N {
            let r = c.reply();
            assert_eq!(r.errno, 0, "{}", r.message);
            assert_eq!(r.data, vec![0x5a; BLOCK]);
        }
        let most = export.now.lock().1;
        assert_eq!(
            most, N,
            "round {round}: only {most} of {N} reads sent at once ran at once"
        );
        c.disc();
    }
}
