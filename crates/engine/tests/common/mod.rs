//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig};
use tiercache_policy::PolicyConfig;
use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

pub struct Rig {
    pub engine: Engine,
    pub backing: Arc<MemDevice>,
    pub cache: Arc<MemDevice>,
    pub clock: Arc<ManualClock>,
}

pub fn config(
    mode: CacheMode,
    replacement: ReplacementKind,
    admission: AdmissionKind,
    block_size: u32,
    cutoff: u64,
) -> EngineConfig {
    EngineConfig {
        mode,
        block_size,
        sequential_cutoff: cutoff,
        policy: PolicyConfig {
            replacement,
            admission,
            nhit_threshold: 2,
            ..PolicyConfig::default()
        },
        cache_data_offset: 0,
        max_cache_blocks: None,
        cache_error_limit: 16,
    }
}

pub fn rig(backing_size: u64, cache_blocks: u32, cfg: &EngineConfig) -> Rig {
    let backing = Arc::new(MemDevice::new(backing_size));
    let cache = Arc::new(MemDevice::new(cache_blocks as u64 * cfg.block_size as u64));
    let clock = Arc::new(ManualClock::new(Time(1)));
    let engine = Engine::new(
        backing.clone() as Arc<dyn BlockDevice>,
        cache.clone() as Arc<dyn BlockDevice>,
        cfg,
        clock.clone(),
    )
    .expect("engine");
    Rig {
        engine,
        backing,
        cache,
        clock,
    }
}

/// Deterministic content for a write: depends on the byte offset and a seed.
pub fn pattern(offset: u64, len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (offset + i as u64)
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(seed.wrapping_mul(0x85EB_CA6B));
            (x ^ (x >> 13)) as u8
        })
        .collect()
}

/// All mode x replacement x admission combinations.
pub fn all_stacks() -> Vec<(CacheMode, ReplacementKind, AdmissionKind)> {
    let mut v = Vec::new();
    for &m in CacheMode::ALL {
        for &r in ReplacementKind::ALL {
            for &a in AdmissionKind::ALL {
                v.push((m, r, a));
            }
        }
    }
    v
}

/// The file behind a device's fd (`raw_read_fd`, `raw_write_fd`),
/// borrowed: not closed when dropped.
pub fn borrowed_file(fd: std::os::fd::RawFd) -> std::mem::ManuallyDrop<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: the fd is an engine's open device file, which outlives every
    // use in the tests; ManuallyDrop never closes it.
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// An engine (not persistent, clock at 1) over `backing` and `cache`.
pub fn engine_over(
    backing: Arc<dyn BlockDevice>,
    cache: Arc<dyn BlockDevice>,
    cfg: &EngineConfig,
) -> Engine {
    Engine::new(backing, cache, cfg, Arc::new(ManualClock::new(Time(1)))).expect("engine")
}

/// An engine over two real files in a temporary directory (the front
/// ends' io_uring paths need file descriptors): a cache file of 16
/// blocks and a backing file of 64 blocks holding [`pattern`]`(seed)`.
pub struct FileRig {
    pub engine: Engine,
    pub cache_path: std::path::PathBuf,
    /// The backing file's bytes.
    pub data: Vec<u8>,
    pub _dir: tempfile::TempDir,
}

pub fn file_rig(cfg: &EngineConfig, seed: u64) -> FileRig {
    let block = u64::from(cfg.block_size);
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("cache");
    std::fs::File::create(&cache_path)
        .unwrap()
        .set_len(16 * block)
        .unwrap();
    let backing_path = dir.path().join("backing");
    let data = pattern(0, (64 * block) as usize, seed);
    std::fs::write(&backing_path, &data).unwrap();
    let cache = Arc::new(tiercache_device::FileDevice::open(&cache_path).unwrap());
    let backing = Arc::new(tiercache_device::FileDevice::open(&backing_path).unwrap());
    FileRig {
        engine: engine_over(backing, cache, cfg),
        cache_path,
        data,
        _dir: dir,
    }
}
