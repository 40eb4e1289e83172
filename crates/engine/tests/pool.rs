//! The pool: one cache shared by several backing volumes. Every volume's
//! reads are checked against its own plain in-memory disk while the
//! volumes compete for a cache too small for all of them, so that slots
//! are reused from one volume to another all the time; and detaching a
//! volume writes it back and leaves nothing of it to be served to another.

mod common;

use common::*;
use proptest::prelude::*;
use std::sync::Arc;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineError, VolumeHandle};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind, VolumeId};

const BS: u32 = 4096;
const VOLUME_BYTES: u64 = 64 * BS as u64;

/// An engine of `cache_blocks` blocks with volume 0 and `extra` more
/// volumes attached, each over its own memory device filled with its own
/// pattern (so a block served from the wrong volume shows).
fn pool(
    mode: CacheMode,
    cache_blocks: u32,
    extra: u16,
) -> (Arc<Engine>, Vec<VolumeHandle>, Vec<Arc<MemDevice>>) {
    let cfg = config(mode, ReplacementKind::Lru, AdmissionKind::Always, BS, 0);
    let r = rig(VOLUME_BYTES, cache_blocks, &cfg);
    r.backing
        .write_at(&pattern(0, VOLUME_BYTES as usize, 1000), 0)
        .unwrap();
    let engine = Arc::new(r.engine);
    let mut backings = vec![r.backing.clone()];
    for v in 1..=extra {
        let dev = Arc::new(MemDevice::new(VOLUME_BYTES));
        dev.write_at(&pattern(0, VOLUME_BYTES as usize, 1000 + v as u64), 0)
            .unwrap();
        let id = engine
            .attach_volume(
                &format!("vm{v}"),
                "",
                dev.clone() as Arc<dyn BlockDevice>,
                mode,
                0,
            )
            .unwrap();
        assert_eq!(id, VolumeId(v));
        backings.push(dev);
    }
    let handles = (0..=extra)
        .map(|v| engine.volume_handle(VolumeId(v)).unwrap())
        .collect();
    (engine, handles, backings)
}

/// `len` bytes of a device at `offset`.
fn read_dev(dev: &MemDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    dev.read_at(&mut v, offset).unwrap();
    v
}

#[derive(Clone, Debug)]
enum Op {
    Read {
        volume: usize,
        block: u64,
        blocks: u64,
    },
    Write {
        volume: usize,
        block: u64,
        blocks: u64,
        seed: u64,
    },
    Trim {
        volume: usize,
        block: u64,
    },
    Flush {
        volume: usize,
    },
    Clean,
}

fn op() -> impl Strategy<Value = Op> {
    let at = (0usize..3, 0u64..64).prop_flat_map(|(v, b)| (Just(v), Just(b), 1..=(64 - b).min(6)));
    prop_oneof![
        6 => at.clone().prop_map(|(volume, block, blocks)| Op::Read { volume, block, blocks }),
        4 => (at, any::<u64>()).prop_map(|((volume, block, blocks), seed)| Op::Write { volume, block, blocks, seed }),
        1 => (0usize..3, 0u64..64).prop_map(|(volume, block)| Op::Trim { volume, block }),
        1 => (0usize..3).prop_map(|volume| Op::Flush { volume }),
        1 => Just(Op::Clean),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Three volumes, same block numbers, a 16-block cache: every read
    /// returns its own volume's data in every mode.
    #[test]
    fn each_volume_reads_only_its_own_data(
        mode in prop::sample::select(CacheMode::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let (engine, vols, _) = pool(mode, 16, 2);
        let mut model: Vec<Vec<u8>> = (0..3u64)
            .map(|v| pattern(0, VOLUME_BYTES as usize, 1000 + v))
            .collect();
        let bs = BS as u64;
        for op in ops {
            match op {
                Op::Read { volume, block, blocks } => {
                    let mut buf = vec![0u8; (blocks * bs) as usize];
                    vols[volume].read(block * bs, &mut buf).unwrap();
                    let want = &model[volume][(block * bs) as usize..((block + blocks) * bs) as usize];
                    prop_assert!(buf == want, "volume {} block {}: wrong data", volume, block);
                }
                Op::Write { volume, block, blocks, seed } => {
                    let data = pattern(block * bs, (blocks * bs) as usize, seed);
                    vols[volume].write(block * bs, &data, false).unwrap();
                    model[volume][(block * bs) as usize..((block + blocks) * bs) as usize]
                        .copy_from_slice(&data);
                }
                Op::Trim { volume, block } => {
                    // Trimmed data is unspecified until written again:
                    // write it right after, as the model cannot say.
                    vols[volume].trim(block * bs, bs).unwrap();
                    let data = pattern(block * bs, bs as usize, 7);
                    vols[volume].write(block * bs, &data, false).unwrap();
                    model[volume][(block * bs) as usize..((block + 1) * bs) as usize]
                        .copy_from_slice(&data);
                }
                Op::Flush { volume } => vols[volume].flush().unwrap(),
                Op::Clean => {
                    engine.clean(8).unwrap();
                }
            }
        }
        // The pool's counters are the sum of the volumes'.
        let pool = engine.stats();
        let per: Vec<_> = vols.iter().map(|v| v.stats()).collect();
        prop_assert_eq!(pool.read_bytes, per.iter().map(|s| s.read_bytes).sum::<u64>());
        prop_assert_eq!(pool.decisions.read_hits, per.iter().map(|s| s.decisions.read_hits).sum::<u64>());
        prop_assert_eq!(pool.decisions.resident, per.iter().map(|s| s.decisions.resident).sum::<u64>());
        prop_assert_eq!(pool.decisions.dirty, per.iter().map(|s| s.decisions.dirty).sum::<u64>());
    }
}

#[test]
fn detach_writes_back_and_leaves_nothing_behind() {
    let (engine, vols, backings) = pool(CacheMode::WriteBack, 64, 2);
    let bs = BS as u64;
    let mine = pattern(0, 8 * bs as usize, 42);
    vols[1].write(0, &mine, false).unwrap();
    let mut buf = vec![0u8; 8 * bs as usize];
    vols[2].read(0, &mut buf).unwrap(); // volume 2's blocks cached too
    assert_eq!(vols[1].stats().decisions.dirty, 8);
    assert_ne!(
        read_dev(&backings[1], 0, mine.len()),
        mine,
        "still dirty in the cache"
    );

    let mut seen = Vec::new();
    engine
        .detach_volume(VolumeId(1), |done, total| seen.push((done, total)))
        .unwrap();
    assert_eq!(seen.first(), Some(&(0, 8)));
    assert_eq!(seen.last().map(|p| p.0), Some(8));
    assert_eq!(read_dev(&backings[1], 0, mine.len()), mine, "written back");
    assert_eq!(
        engine.stats().decisions.resident,
        8,
        "only volume 2's blocks stay"
    );
    // A handle still held fails; the others serve on.
    let e = vols[1].read(0, &mut buf).unwrap_err();
    assert!(matches!(e, EngineError::Detached { .. }), "{e}");
    assert!(matches!(
        vols[1].write(0, &mine, false),
        Err(EngineError::Detached { .. })
    ));
    vols[2].read(0, &mut buf).unwrap();
    assert_eq!(buf, pattern(0, VOLUME_BYTES as usize, 1002)[..buf.len()]);

    // A new volume takes the freed id and reads its own data, never the
    // old volume's blocks.
    let fresh = Arc::new(MemDevice::new(VOLUME_BYTES));
    let id = engine
        .attach_volume(
            "vm9",
            "",
            fresh.clone() as Arc<dyn BlockDevice>,
            CacheMode::WriteBack,
            0,
        )
        .unwrap();
    assert_eq!(id, VolumeId(1));
    let h = engine.volume_handle(id).unwrap();
    h.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(h.stats().decisions.read_hits, 0);
}

#[test]
fn bad_attachments_are_refused() {
    let (engine, _vols, _) = pool(CacheMode::WriteThrough, 16, 1);
    let dev = || Arc::new(MemDevice::new(VOLUME_BYTES)) as Arc<dyn BlockDevice>;
    for bad in ["", "a/b", "white space", &"x".repeat(64)] {
        let e = engine
            .attach_volume(bad, "", dev(), CacheMode::WriteThrough, 0)
            .unwrap_err();
        assert!(e.to_string().contains("volume name"), "{bad:?}: {e}");
    }
    let e = engine
        .attach_volume("vm1", "", dev(), CacheMode::WriteThrough, 0)
        .unwrap_err();
    assert!(e.to_string().contains("already in the pool"), "{e}");
    let odd = Arc::new(MemDevice::new(VOLUME_BYTES + 512)) as Arc<dyn BlockDevice>;
    engine
        .attach_volume("odd-size", "", odd, CacheMode::WriteThrough, 0)
        .unwrap();
    assert!(engine.detach_volume(VolumeId(0), |_, _| {}).is_err());
    assert!(engine.volume_handle(VolumeId(9)).is_err());
    assert_eq!(
        engine.volume_names(),
        vec![
            (VolumeId(0), "default".to_string()),
            (VolumeId(1), "vm1".to_string()),
            (VolumeId(2), "odd-size".to_string())
        ]
    );
}

#[test]
fn a_failing_backing_device_fails_its_own_volume_alone() {
    use tiercache_device::FaultDevice;
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        BS,
        0,
    );
    let r = rig(VOLUME_BYTES, 16, &cfg);
    let engine = Arc::new(r.engine);
    let faulty = Arc::new(FaultDevice::new(MemDevice::new(VOLUME_BYTES)));
    let id = engine
        .attach_volume(
            "flaky",
            "",
            faulty.clone() as Arc<dyn BlockDevice>,
            CacheMode::WriteThrough,
            0,
        )
        .unwrap();
    let (good, bad) = (
        engine.volume_handle(VolumeId(0)).unwrap(),
        engine.volume_handle(id).unwrap(),
    );
    let data = pattern(0, BS as usize, 5);
    good.write(0, &data, false).unwrap();
    faulty.fail_all();
    let mut buf = vec![0u8; BS as usize];
    assert!(matches!(
        bad.read(BS as u64 * 3, &mut buf),
        Err(EngineError::Backing { .. })
    ));
    assert!(bad.write(BS as u64 * 3, &data, false).is_err());
    // The other volume serves on, and the errors are counted where they
    // happened.
    good.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    good.write(BS as u64, &data, true).unwrap();
    assert!(bad.stats().backing_read_errors > 0 && bad.stats().backing_write_errors > 0);
    assert_eq!(
        good.stats().backing_read_errors + good.stats().backing_write_errors,
        0
    );
    assert_eq!(engine.stats().cache_state, "ok");
    faulty.heal();
    bad.read(BS as u64 * 3, &mut buf).unwrap();
}
