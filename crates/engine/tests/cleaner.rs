//! The background cleaner with a real clock: an idle device is drained, a
//! drain request is honoured, and writeback order leaves the backing device
//! whole.

mod common;

use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Cleaner, CleanerConfig, Engine};
use tiercache_types::{AdmissionKind, CacheMode, MonotonicClock, ReplacementKind};

fn engine(capacity_blocks: u64) -> (Arc<Engine>, Arc<MemDevice>) {
    let cfg = config(
        CacheMode::WriteBack,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        4096,
        0,
    );
    let backing = Arc::new(MemDevice::new(8 << 20));
    let cache = Arc::new(MemDevice::new(capacity_blocks * 4096));
    let e = Engine::new(
        backing.clone() as Arc<dyn BlockDevice>,
        cache as Arc<dyn BlockDevice>,
        &cfg,
        Arc::new(MonotonicClock::new()),
    )
    .unwrap();
    (Arc::new(e), backing)
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

#[test]
fn idle_device_is_drained_in_the_background() {
    let (e, backing) = engine(256);
    let data = pattern(0, 200 * 4096, 9);
    e.write(0, &data, false).unwrap();
    assert_eq!(e.dirty_blocks(), 200);
    let cfg = CleanerConfig {
        idle_after: Duration::from_millis(100),
        ..CleanerConfig::default()
    };
    let cleaner = Cleaner::spawn(e.clone(), cfg);
    assert!(
        wait_until(Duration::from_secs(20), || e.dirty_blocks() == 0),
        "dirty {}",
        e.dirty_blocks()
    );
    cleaner.stop();
    let mut back = vec![0u8; data.len()];
    backing.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}

#[test]
fn under_load_the_cleaner_paces_and_drain_finishes_the_job() {
    let (e, _) = engine(1000);
    let cfg = CleanerConfig {
        idle_after: Duration::from_secs(3600),
        target_dirty: 0.5,
        ..CleanerConfig::default()
    };
    let cleaner = Cleaner::spawn(e.clone(), cfg);
    // 300 dirty blocks of 1000 is under the 50% target: left alone.
    e.write(0, &pattern(0, 300 * 4096, 1), false).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        e.dirty_blocks(),
        300,
        "below target nothing is written back"
    );
    // Over target: the controller starts writing back, but not everything.
    e.write(300 * 4096, &pattern(300 * 4096, 500 * 4096, 2), false)
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || e.dirty_blocks() < 800),
        "cleaning started"
    );
    cleaner.set_drain(true);
    assert!(
        wait_until(Duration::from_secs(20), || e.dirty_blocks() == 0),
        "drain finished"
    );
}
