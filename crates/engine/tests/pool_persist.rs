//! A persistent pool: several backing volumes in one cache device's volume
//! table. Each volume's blocks come back to it, and only to it, after a
//! clean shutdown and after a crash; a pool opens only with every volume
//! it holds; volumes attached or detached while it runs stay so.

mod common;

use common::pattern;
use std::sync::Arc;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig, OpenOptions, PoolVolume};
use tiercache_types::{CacheMode, ManualClock, VolumeId};

const MIB: u64 = 1 << 20;
const BS: usize = 64 * 1024;

fn config() -> EngineConfig {
    EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: BS as u32,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    }
}

fn volume(name: &str, dev: &Arc<MemDevice>) -> PoolVolume {
    PoolVolume {
        name: Some(name.to_string()),
        backing: dev.clone() as Arc<dyn BlockDevice>,
        path: format!("/dev/{name}"),
    }
}

fn open(cache: &Arc<MemDevice>, vols: &[PoolVolume]) -> tiercache_engine::Result<Arc<Engine>> {
    Engine::open_pool(
        vols,
        cache.clone() as Arc<dyn BlockDevice>,
        &OpenOptions::default(),
        Arc::new(ManualClock::default()),
    )
    .map(|(e, _)| Arc::new(e))
}

fn read(e: &Arc<Engine>, id: VolumeId, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    e.volume_handle(id).unwrap().read(offset, &mut buf).unwrap();
    buf
}

#[test]
fn each_volume_gets_its_own_blocks_back_after_a_restart_and_a_crash() {
    let cache = Arc::new(MemDevice::new(64 * MIB));
    let a = Arc::new(MemDevice::new(16 * MIB));
    let b = Arc::new(MemDevice::new(16 * MIB));
    let vols = [volume("vm-a", &a), volume("vm-b", &b)];
    let e = Arc::new(
        Engine::create_pool(
            &vols,
            cache.clone() as Arc<dyn BlockDevice>,
            &config(),
            Arc::new(ManualClock::default()),
            None,
        )
        .unwrap(),
    );
    assert_eq!(
        e.volume_names(),
        vec![(VolumeId(0), "vm-a".into()), (VolumeId(1), "vm-b".into())]
    );
    // The same offsets on both volumes, different data, dirty in the cache.
    let da = pattern(0, 4 * BS, 1);
    let db = pattern(0, 4 * BS, 2);
    e.volume_handle(VolumeId(0))
        .unwrap()
        .write(0, &da, false)
        .unwrap();
    e.volume_handle(VolumeId(1))
        .unwrap()
        .write(0, &db, true)
        .unwrap();
    assert_eq!(e.stats().decisions.dirty, 8);
    e.shutdown(false).unwrap();
    drop(e);

    // A clean restart, the volumes given in another order.
    let e = open(&cache, &[volume("vm-b", &b), volume("vm-a", &a)]).unwrap();
    assert_eq!(e.volume_stats(VolumeId(0)).unwrap().decisions.dirty, 4);
    assert_eq!(e.volume_stats(VolumeId(1)).unwrap().decisions.dirty, 4);
    assert_eq!(read(&e, VolumeId(0), 0, da.len()), da);
    assert_eq!(read(&e, VolumeId(1), 0, db.len()), db);
    // New dirty data on b, flushed, then a crash (no shutdown).
    let db2 = pattern(0, 2 * BS, 3);
    e.volume_handle(VolumeId(1))
        .unwrap()
        .write(BS as u64 * 8, &db2, true)
        .unwrap();
    drop(e);

    let e = open(&cache, &vols).unwrap();
    assert_eq!(read(&e, VolumeId(0), 0, da.len()), da);
    assert_eq!(read(&e, VolumeId(1), 0, db.len()), db);
    assert_eq!(read(&e, VolumeId(1), BS as u64 * 8, db2.len()), db2);
    assert_eq!(e.volume_stats(VolumeId(1)).unwrap().decisions.dirty, 6);
    e.shutdown(false).unwrap();
}

#[test]
fn a_pool_opens_only_with_all_of_its_volumes_and_remembers_attach_and_detach() {
    let cache = Arc::new(MemDevice::new(64 * MIB));
    let a = Arc::new(MemDevice::new(8 * MIB));
    let b = Arc::new(MemDevice::new(8 * MIB));
    let c = Arc::new(MemDevice::new(8 * MIB));
    let e = Arc::new(
        Engine::create_pool(
            &[volume("a", &a)],
            cache.clone() as Arc<dyn BlockDevice>,
            &config(),
            Arc::new(ManualClock::default()),
            None,
        )
        .unwrap(),
    );
    let idb = e
        .attach_volume(
            "b",
            "/dev/b",
            b.clone() as Arc<dyn BlockDevice>,
            CacheMode::WriteBack,
            0,
        )
        .unwrap();
    let dbb = pattern(0, 2 * BS, 9);
    e.volume_handle(idb).unwrap().write(0, &dbb, true).unwrap();
    e.shutdown(false).unwrap();
    drop(e);

    // b is in the pool now: opening without it is refused, clearly, and
    // so are an unknown name and one device given twice.
    let err = open(&cache, &[volume("a", &a)]).err().unwrap().to_string();
    assert!(
        err.contains("\"b\"") && err.contains("--volume b="),
        "{err}"
    );
    let err = open(&cache, &[volume("a", &a), volume("b", &b), volume("c", &c)])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no volume named \"c\""), "{err}");
    let err = open(&cache, &[volume("a", &a), volume("a", &a)])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("given twice"), "{err}");
    // Another device of another size as b: refused before anything is
    // written (the next open with the right devices still works).
    let small = Arc::new(MemDevice::new(4 * MIB));
    let err = open(&cache, &[volume("a", &a), volume("b", &small)])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("volume 'b'") && err.contains("4194304 bytes"),
        "{err}"
    );

    let e = open(&cache, &[volume("a", &a), volume("b", &b)]).unwrap();
    assert_eq!(read(&e, idb, 0, dbb.len()), dbb);
    // Detach b: its dirty blocks go to its backing device, and the pool
    // then opens without it.
    e.detach_volume(idb, |_, _| {}).unwrap();
    let mut back = vec![0u8; dbb.len()];
    b.read_at(&mut back, 0).unwrap();
    assert_eq!(back, dbb);
    e.shutdown(false).unwrap();
    drop(e);
    let e = open(&cache, &[volume("a", &a)]).unwrap();
    assert_eq!(e.volume_names(), vec![(VolumeId(0), "a".into())]);
    // A new volume on b's old index reads its own data, not b's.
    let id = e
        .attach_volume(
            "c",
            "/dev/c",
            c.clone() as Arc<dyn BlockDevice>,
            CacheMode::WriteBack,
            0,
        )
        .unwrap();
    assert_eq!(id, idb);
    assert!(read(&e, id, 0, dbb.len()).iter().all(|&x| x == 0));
    drop(e); // a crash
    let e = open(&cache, &[volume("a", &a), volume("c", &c)]).unwrap();
    assert!(read(&e, id, 0, dbb.len()).iter().all(|&x| x == 0));
}

#[test]
fn a_volume_whose_backing_device_fails_holds_up_no_other_volume() {
    use tiercache_device::FaultDevice;
    let cache = Arc::new(MemDevice::new(64 * MIB));
    let good = Arc::new(MemDevice::new(8 * MIB));
    let flaky = Arc::new(FaultDevice::new(MemDevice::new(8 * MIB)));
    let vols = [
        volume("good", &good),
        PoolVolume {
            name: Some("flaky".into()),
            backing: flaky.clone() as Arc<dyn BlockDevice>,
            path: "/dev/flaky".into(),
        },
    ];
    let cfg = EngineConfig {
        mode: CacheMode::WriteThrough,
        ..config()
    };
    let e = Arc::new(
        Engine::create_pool(
            &vols,
            cache.clone() as Arc<dyn BlockDevice>,
            &cfg,
            Arc::new(ManualClock::default()),
            None,
        )
        .unwrap(),
    );
    let (g, f) = (
        e.volume_handle(VolumeId(0)).unwrap(),
        e.volume_handle(VolumeId(1)).unwrap(),
    );
    // Reads promote clean blocks on both: clean claims of both volumes
    // wait for the next commit, which flushes the backing devices.
    let mut buf = vec![0u8; 4 * BS];
    g.read(0, &mut buf).unwrap();
    f.read(0, &mut buf).unwrap();
    flaky.fail_all();
    g.write(8 * BS as u64, &pattern(0, BS, 4), false).unwrap();
    g.flush()
        .expect("the good volume's flush does not depend on the failing one");
    assert!(f.flush().is_err());
    flaky.heal();
    f.flush().unwrap();
}
