//! The tiercache engine.
//!
//! An [`Engine`] sits between clients and two [`BlockDevice`]s, a large slow
//! *backing* device and a small fast *cache* device. For each IO it asks the
//! [`Director`] (the policy stack, which never does IO) what to do with each
//! block, then performs the reads, writes, promotions and writebacks. Any
//! number of threads may call it at once.
//!
//! Concurrency contract: a read returns, for every sector, the data of the
//! last write to that sector that completed before the read started, or of
//! a write that overlaps the read in time; never a torn sector from a cache
//! slot being refilled, never data older than a completed write. See
//! `locks.rs` and `slot_state.rs` for how.

//!
//! The engine's files, one idea each: [`EngineConfig`] (`config.rs`);
//! a backing volume and where an IO on it falls (`volume.rs`); reads (`read.rs`), and hits and
//! misses served by the front end itself (`cached_read.rs`,
//! `uncached_read.rs`); writes and trims (`write.rs`);
//! flushes (`flush.rs`); the pool's volumes and their handles (`pool.rs`); slot fills (`fill.rs`); writeback (`writeback.rs`)
//! and the background [`Cleaner`] (`cleaner.rs`); device errors
//! (`failure.rs`); the thread's buffer for whole blocks read by promotions
//! and writeback (`scratch.rs`); persistence (`persist.rs`, `claims.rs`, and the lazy check of
//! restored blocks, `verify.rs`); the locks that
//! order concurrent IO (`locks.rs`, `slot_state.rs`); counters
//! (`stats.rs`); recording the requests served (`recorder.rs`,
//! `trace_ring.rs`).

mod backing_flush;
mod bypass_read;
mod cached_read;
mod claims;
mod cleaner;
mod config;
mod director_lock;
mod error;
mod failure;
mod fill;
mod flush;
mod locks;
mod persist;
mod pool;
mod read;
mod reclaim;
mod recorder;
mod scratch;
mod slot_state;
mod stats;
mod trace_ring;
mod uncached_read;
mod verify;
mod volume;
mod write;
mod writeback;

pub use bypass_read::BypassRead;
pub use cached_read::{CachedRange, DirectPlan};
pub use cleaner::{Cleaner, CleanerConfig, RateController};
pub use config::{default_block_size, EngineConfig, DEFAULT_MAX_BLOCKS};
pub use error::{EngineError, Result};
pub use persist::{OpenOptions, OpenReport, PoolVolume};
pub use pool::{VolumeHandle, MAX_VOLUME_NAME};
pub use recorder::{
    Recording, TraceStats, TracedOp, TracedRequest, DEFAULT_TRACE_BUFFER, MAX_TRACED_LEN,
};
pub use stats::{EngineStats, SharingStats, VolumeStats};
pub use tiercache_policy::VolumeLimits;
pub use uncached_read::UncachedRead;
pub use verify::{RestoreCheck, RestoreVerifier};

use director_lock::DirectorLock;
use locks::StripeLocks;
use parking_lot::{Mutex, RwLock};
use slot_state::SlotStates;
use stats::IoCounters;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_policy::{Director, DirectorConfig};
use tiercache_types::{CacheBlock, CacheMode, Clock, Time, VolumeId};
use volume::Volume;

/// A block cache over a backing and a cache device.
pub struct Engine {
    /// The attached backing volumes, indexed by [`VolumeId`]; volume 0 is
    /// the one [`Engine::new`] was given.
    volumes: RwLock<Vec<Option<Arc<Volume>>>>,
    cache: Arc<dyn BlockDevice>,
    block_size: u64,
    data_offset: u64,
    /// Every request's decisions (`director_lock.rs`).
    director: DirectorLock,
    /// Which dirty blocks the cleaner writes back next (`writeback.rs`).
    sweep: Mutex<tiercache_policy::writeback_sweep::WritebackSweep>,
    policy_name: String,
    locks: StripeLocks,
    slots: SlotStates,
    /// Crash-survival state of clean claims (see `claims.rs`).
    claims: claims::Claims,
    /// Where [`Engine::reclaim`] goes on (`reclaim.rs`).
    reclaim: reclaim::ReclaimWalk,
    clock: Arc<dyn Clock>,
    io: IoCounters,
    cache_failure: Mutex<Option<String>>,
    cache_error_limit: u64,
    /// Time of the last client read or write, in clock nanoseconds.
    last_client_io: std::sync::atomic::AtomicU64,
    /// Metadata on the cache device; `None` for a volatile cache.
    persist: Option<persist::Persistence>,
    /// `tiercache trace`: the requests the volumes receive (`recorder.rs`).
    recorder: recorder::Recorder,
}

impl Engine {
    /// Builds an engine with an empty cache.
    pub fn new(
        backing: Arc<dyn BlockDevice>,
        cache: Arc<dyn BlockDevice>,
        config: &EngineConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Engine> {
        let bs = config.block_size as u64;
        let volume = Volume::new(VolumeId(0), "default", "", backing, config.block_size)?;
        let room = cache.size().saturating_sub(config.cache_data_offset);
        let mut capacity = (room / bs).min(u32::MAX as u64 - 1) as u32;
        if let Some(max) = config.max_cache_blocks {
            capacity = capacity.min(max);
        }
        if capacity == 0 {
            return Err(EngineError::Config(format!(
                "cache device {} ({} bytes, data from offset {}) holds no {}-byte block",
                cache.describe(),
                cache.size(),
                config.cache_data_offset,
                bs
            )));
        }
        let dcfg = DirectorConfig {
            mode: config.mode,
            block_size: config.block_size,
            capacity,
            sequential_cutoff: config.sequential_cutoff,
            policy: config.policy.clone(),
            utility_sharing: true,
        };
        let director = Director::new(&dcfg).map_err(|e| EngineError::Config(e.to_string()))?;
        Ok(Engine {
            volumes: RwLock::new(vec![Some(Arc::new(volume))]),
            cache,
            block_size: bs,
            data_offset: config.cache_data_offset,
            director: DirectorLock::new(director),
            sweep: Mutex::new(Default::default()),
            policy_name: config.policy.to_string(),
            locks: StripeLocks::new(),
            slots: SlotStates::new(capacity),
            claims: claims::Claims::new(capacity),
            reclaim: reclaim::ReclaimWalk::default(),
            clock,
            io: IoCounters::default(),
            cache_failure: Mutex::new(None),
            cache_error_limit: config.cache_error_limit,
            last_client_io: std::sync::atomic::AtomicU64::new(0),
            persist: None,
            recorder: recorder::Recorder::new(),
        })
    }

    /// The engine's clock.
    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// Nanoseconds since the last client read or write.
    pub fn idle_for(&self, now: Time) -> u64 {
        now.0.saturating_sub(
            self.last_client_io
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    fn note_client_io(&self, now: Time) {
        self.last_client_io
            .store(now.0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Volume `id`, if attached.
    pub(crate) fn volume(&self, id: VolumeId) -> Result<Arc<Volume>> {
        self.volumes
            .read()
            .get(id.index())
            .and_then(|v| v.clone())
            .ok_or_else(|| EngineError::Config(format!("volume {id} is not attached")))
    }

    /// Volume 0, the one the engine was built with (the pool of one that
    /// the single-volume API serves).
    pub(crate) fn first_volume(&self) -> Arc<Volume> {
        self.volume(VolumeId(0))
            .expect("volume 0 stays attached for the engine's life")
    }

    /// Every attached volume, in id order.
    pub(crate) fn all_volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes.read().iter().flatten().cloned().collect()
    }

    /// Byte offset of slot `c` on the cache device.
    pub(crate) fn slot_offset(&self, c: CacheBlock) -> u64 {
        self.data_offset + c.0 as u64 * self.block_size
    }

    /// Size of the exported device in bytes (the backing device's size).
    pub fn size(&self) -> u64 {
        self.first_volume().size
    }

    pub fn block_size(&self) -> u32 {
        self.block_size as u32
    }

    /// Cache size in blocks.
    pub fn capacity(&self) -> u32 {
        self.director.lock().capacity()
    }

    pub fn mode(&self) -> CacheMode {
        self.director.lock().mode(VolumeId(0))
    }

    /// RAM used per cache block by the mapping, policy and slot states.
    pub fn memory_bytes_per_block(&self) -> f64 {
        let d = self.director.lock();
        (d.memory_bytes() + self.slots.memory_bytes() + self.claims.memory_bytes()) as f64
            / d.capacity() as f64
    }

    /// RAM used by the pool's volumes beyond the per-block structures: the
    /// director's per-volume state and the engine's volume records.
    pub fn volumes_memory_bytes(&self) -> usize {
        let volumes = self.all_volumes();
        self.director.lock().volumes_memory_bytes()
            + volumes.len() * std::mem::size_of::<volume::Volume>()
    }

    /// Switches the cache mode online. Dirty blocks stay dirty and keep
    /// being served from the cache; call [`Engine::drain`] to clean them.
    /// Fails when the cache device was taken out of use.
    pub fn set_mode(&self, mode: CacheMode) -> Result<()> {
        if let Some(reason) = self.cache_failure.lock().clone() {
            if mode != CacheMode::PassThrough {
                return Err(EngineError::Config(format!(
                    "the cache device was taken out of use ({reason}); only passthrough is possible"
                )));
            }
        }
        self.director.lock().set_mode(VolumeId(0), mode);
        self.persist_mode(VolumeId(0), mode)
    }

    pub fn set_sequential_cutoff(&self, bytes: u64) {
        self.director
            .lock()
            .set_sequential_cutoff(VolumeId(0), bytes);
    }

    /// A snapshot of all counters: the pool's, and in a pool of several
    /// volumes each volume's ([`EngineStats::volumes`]). Takes the
    /// director's lock briefly.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.pool_stats();
        let volumes = self.all_volumes();
        if volumes.len() > 1 {
            s.volumes = volumes
                .iter()
                .map(|v| stats::VolumeStats {
                    id: v.id.0,
                    name: v.name.clone(),
                    stats: self.stats_of(v),
                    sharing: self.sharing_of(v.id),
                })
                .collect();
        }
        s
    }

    /// The pool's counters alone.
    pub(crate) fn pool_stats(&self) -> EngineStats {
        let (decisions, mode, cutoff) = {
            let d = self.director.lock();
            (
                d.counters(),
                d.mode(VolumeId(0)),
                d.sequential_cutoff(VolumeId(0)),
            )
        };
        // The pool's counters: the engine's own (cache device errors) and
        // every volume's.
        let volumes = self.all_volumes();
        let mut io = EngineStats::io_part(&self.io);
        for v in &volumes {
            for (sum, n) in io.iter_mut().zip(EngineStats::io_part(&v.io)) {
                *sum += n;
            }
        }
        EngineStats {
            mode,
            policy: self.policy_name.clone(),
            block_size: self.block_size as u32,
            sequential_cutoff: cutoff,
            cache_state: match &*self.cache_failure.lock() {
                None => "ok".to_string(),
                Some(r) => format!("failed: {r}"),
            },
            backing_bytes: volumes.iter().map(|v| v.size).sum(),
            decisions,
            read_bytes: io[0],
            write_bytes: io[1],
            read_hit_bytes: io[2],
            writeback_bytes: io[3],
            cache_read_errors: io[4],
            cache_write_errors: io[5],
            backing_read_errors: io[6],
            backing_write_errors: io[7],
            flushes: io[8],
            trims: io[9],
            trace: self.recorder.stats(),
            volumes: Vec::new(),
        }
    }
}
