//! A pool of 1024 volumes in one cache: attached one by one to a running
//! engine, each reading back its own data (first from its backing device,
//! then mostly from the shared cache), with no thread per volume and a
//! bounded amount of RAM per volume. Alone in its binary, so the thread
//! count is this test's own.

mod common;

use common::*;
use std::sync::Arc;
use std::time::Instant;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind, VolumeId};

const BS: u32 = 4096;
const VOLUMES: u16 = 1024;
/// Blocks per volume.
const BLOCKS: u64 = 8;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_thousand_volumes_share_one_cache() {
    let bytes = BLOCKS * BS as u64;
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Adaptive,
        AdmissionKind::Always,
        BS,
        4 << 20,
    );
    // Room for half of all the volumes' blocks: slots move between them.
    let r = rig(bytes, (VOLUMES as u32 * BLOCKS as u32) / 2, &cfg);
    r.backing
        .write_at(&pattern(0, bytes as usize, 0), 0)
        .unwrap();
    let engine = Arc::new(r.engine);
    let threads_before = threads();
    let memory_before = engine.volumes_memory_bytes();
    let start = Instant::now();
    for v in 1..VOLUMES {
        let dev = Arc::new(MemDevice::new(bytes));
        dev.write_at(&pattern(0, bytes as usize, v as u64), 0)
            .unwrap();
        let id = engine
            .attach_volume(
                &format!("vm{v}"),
                "",
                dev as Arc<dyn BlockDevice>,
                CacheMode::WriteThrough,
                4 << 20,
            )
            .unwrap();
        assert_eq!(id, VolumeId(v));
    }
    let attach = start.elapsed();
    let handles: Vec<_> = (0..VOLUMES)
        .map(|v| engine.volume_handle(VolumeId(v)).unwrap())
        .collect();
    // Volumes 0..128 are hot (read 8 times), the rest read once: every
    // read returns the volume's own pattern, never another's.
    let mut buf = vec![0u8; bytes as usize];
    for round in 0..8 {
        for (v, h) in handles.iter().enumerate() {
            if round > 0 && v >= 128 {
                continue;
            }
            h.read(0, &mut buf).unwrap();
            assert!(
                buf == pattern(0, bytes as usize, v as u64),
                "volume {v} read another's data in round {round}"
            );
        }
    }
    let stats = engine.stats();
    assert_eq!(stats.volumes.len(), VOLUMES as usize);
    let hot_hits: u64 = stats.volumes[..128]
        .iter()
        .map(|v| v.stats.decisions.read_hits)
        .sum();
    assert!(
        hot_hits >= 128 * BLOCKS * 6,
        "the hot volumes hit {hot_hits} blocks"
    );
    assert_eq!(threads(), threads_before, "a thread per volume");
    let per_volume = (engine.volumes_memory_bytes() - memory_before) / (VOLUMES as usize - 1);
    eprintln!(
        "{VOLUMES} volumes: attached in {attach:?} ({:?} each), {per_volume} bytes of RAM each",
        attach / (VOLUMES as u32 - 1)
    );
    // The sequential tables (104 KiB, once a volume has IO) and the hit
    // curve (about 30 KiB) dominate.
    assert!(per_volume < 160 << 10, "{per_volume} bytes per volume");
}
