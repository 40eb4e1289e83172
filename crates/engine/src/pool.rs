//! The pool: one cache shared by many backing volumes. Volumes are
//! attached and detached while IO runs; each is served through a
//! [`VolumeHandle`], whose IO can only ever reach that volume's blocks
//! (their pool keys carry the volume, see
//! [`OriginBlock::of`](tiercache_types::OriginBlock::of)).
//!
//! Detaching writes the volume's dirty blocks back, then, with every
//! stripe locked (no IO of any volume in flight), drops its clean blocks
//! and marks it detached, so that IO through a handle still held fails
//! instead of filling the cache for a volume that is gone.

use crate::stats::SharingStats;
use crate::volume::Volume;
use crate::Engine;
use crate::{EngineError, EngineStats, Result, TracedOp};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_policy::VolumeLimits;
use tiercache_types::{CacheMode, VolumeId};

/// Longest volume name.
pub const MAX_VOLUME_NAME: usize = 63;

/// Client IO on one volume of an engine's pool.
#[derive(Clone)]
pub struct VolumeHandle {
    engine: Arc<Engine>,
    volume: Arc<Volume>,
}

impl VolumeHandle {
    pub fn id(&self) -> VolumeId {
        self.volume.id
    }

    pub fn name(&self) -> &str {
        &self.volume.name
    }

    /// Size of the volume in bytes (its backing device's size).
    pub fn size(&self) -> u64 {
        self.volume.size
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Cache block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.engine.block_size()
    }

    /// As [`Engine::begin_cached_read`], on this volume.
    pub fn begin_cached_read(&self, offset: u64, len: u64) -> Option<crate::CachedRange<'_>> {
        let range = self
            .engine
            .begin_cached_read_in(self.volume.clone(), offset, len)?;
        self.note(TracedOp::Read, offset, len);
        Some(range)
    }

    /// A read the caller does itself from the devices' files: a hit (as
    /// [`Engine::begin_cached_read`]) or else a read that surely bypasses
    /// the cache (as [`Engine::begin_bypass_read`]), decided under one
    /// lock; None, having changed nothing, when neither: then call
    /// [`VolumeHandle::read`] (or try [`VolumeHandle::begin_uncached_read`]).
    pub fn begin_direct_read(&self, offset: u64, len: u64) -> Option<crate::DirectPlan<'_>> {
        let plan = self
            .engine
            .begin_direct_read_in(self.volume.clone(), offset, len, true)?;
        self.note(TracedOp::Read, offset, len);
        Some(plan)
    }

    /// A read miss within one cache block that the caller serves itself
    /// (`uncached_read.rs`): None, having changed nothing, when it cannot
    /// be served so; then call [`VolumeHandle::read`].
    pub fn begin_uncached_read(&self, offset: u64, len: u64) -> Option<crate::UncachedRead<'_>> {
        let read = self
            .engine
            .begin_uncached_read_in(self.volume.clone(), offset, len)?;
        self.note(TracedOp::Read, offset, len);
        Some(read)
    }

    /// As [`Engine::read`], on this volume.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.note(TracedOp::Read, offset, buf.len() as u64);
        self.engine.read_in(&self.volume, offset, buf)
    }

    /// As [`Engine::read_if_cached`], on this volume.
    pub fn read_if_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        let done = self.engine.read_if_cached_in(&self.volume, offset, buf)?;
        self.note(TracedOp::Read, offset, buf.len() as u64);
        Some(done)
    }

    /// As [`Engine::write`], on this volume.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.note(TracedOp::Write, offset, data.len() as u64);
        self.engine.write_in(&self.volume, offset, data, fua)
    }

    /// As [`Engine::write_zeroes`], on this volume.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.note(TracedOp::WriteZeroes, offset, len);
        self.engine.write_zeroes_in(&self.volume, offset, len, fua)
    }

    /// As [`Engine::trim`], on this volume.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.note(TracedOp::Trim, offset, len);
        self.engine.trim_in(&self.volume, offset, len)
    }

    /// As [`Engine::flush`], for this volume (the cache device, then this
    /// volume's backing device).
    pub fn flush(&self) -> Result<()> {
        self.engine.flush_in(&self.volume)
    }

    /// This volume's counters.
    pub fn stats(&self) -> EngineStats {
        self.engine.stats_of(&self.volume)
    }

    /// The request recorder's hook (`recorder.rs`): one relaxed load when
    /// nothing is recorded.
    #[inline]
    fn note(&self, op: TracedOp, offset: u64, len: u64) {
        self.engine.recorder.note(self.volume.id, op, offset, len);
    }
}

impl Engine {
    /// Attaches a backing volume to the pool and returns its id. `name`
    /// (1 to 63 of `A-Z a-z 0-9 . _ -`) must be unused in the pool; `path`
    /// is where `backing` was opened from (a hint in its record). In a
    /// persistent pool the volume is recorded in the cache's volume table
    /// first, which gives its id.
    pub fn attach_volume(
        &self,
        name: &str,
        path: &str,
        backing: Arc<dyn BlockDevice>,
        mode: CacheMode,
        sequential_cutoff: u64,
    ) -> Result<VolumeId> {
        check_name(name)?;
        if self.all_volumes().iter().any(|v| v.name == name) {
            return Err(EngineError::Config(format!(
                "a volume named {name:?} is already in the pool"
            )));
        }
        let id = match self.persist_attach(name, path, &*backing, mode, sequential_cutoff)? {
            Some(id) => id,
            None => {
                let volumes = self.volumes.read();
                match volumes.iter().position(|v| v.is_none()) {
                    Some(i) => VolumeId(i as u16),
                    None if volumes.len() <= u16::MAX as usize => VolumeId(volumes.len() as u16),
                    None => {
                        return Err(EngineError::Config(
                            "the pool has 65536 volumes already".into(),
                        ))
                    }
                }
            }
        };
        self.attach_at(id, name, path, backing, mode, sequential_cutoff)?;
        Ok(id)
    }

    /// Puts volume `id` in the engine's table and the director's, with its
    /// mode and cutoff (volume 0, there since [`Engine::new`], is renamed
    /// and given its path).
    pub(crate) fn attach_at(
        &self,
        id: VolumeId,
        name: &str,
        path: &str,
        backing: Arc<dyn BlockDevice>,
        mode: CacheMode,
        sequential_cutoff: u64,
    ) -> Result<()> {
        let volume = Arc::new(Volume::new(
            id,
            name,
            path,
            backing,
            self.block_size as u32,
        )?);
        let mut volumes = self.volumes.write();
        let mut d = self.director.lock();
        if id == VolumeId(0) {
            d.set_mode(id, mode);
            d.set_sequential_cutoff(id, sequential_cutoff);
        } else if !d.attach_volume(id, mode, sequential_cutoff) {
            return Err(EngineError::Config(format!(
                "volume {id} is still known to the policy"
            )));
        }
        if volumes.len() <= id.index() {
            volumes.resize(id.index() + 1, None);
        }
        volumes[id.index()] = Some(volume);
        Ok(())
    }

    /// A volatile engine (a RAM cache, nothing recorded) over a pool of
    /// `volumes`, the first as volume 0, the others attached in order, each
    /// with the configured mode and cutoff. Names default to `default`
    /// for the first and `vol<N>` for the others.
    pub fn new_pool(
        volumes: &[crate::PoolVolume],
        cache: Arc<dyn BlockDevice>,
        config: &crate::EngineConfig,
        clock: Arc<dyn tiercache_types::Clock>,
    ) -> Result<Engine> {
        let Some(first) = volumes.first() else {
            return Err(EngineError::Config(
                "a pool needs at least one volume".into(),
            ));
        };
        let engine = Engine::new(first.backing.clone(), cache, config, clock)?;
        let (mode, cutoff) = (config.mode, config.sequential_cutoff);
        let name0 = first.name.clone().unwrap_or_else(|| "default".into());
        check_name(&name0)?;
        engine.attach_at(
            VolumeId(0),
            &name0,
            &first.path,
            first.backing.clone(),
            mode,
            cutoff,
        )?;
        for (i, v) in volumes.iter().enumerate().skip(1) {
            let name = v.name.clone().unwrap_or_else(|| format!("vol{i}"));
            engine.attach_volume(&name, &v.path, v.backing.clone(), mode, cutoff)?;
        }
        Ok(engine)
    }

    /// A handle for client IO on volume `id`.
    pub fn volume_handle(self: &Arc<Self>, id: VolumeId) -> Result<VolumeHandle> {
        Ok(VolumeHandle {
            engine: self.clone(),
            volume: self.volume(id)?,
        })
    }

    /// The attached volumes: id and name, in id order.
    pub fn volume_names(&self) -> Vec<(VolumeId, String)> {
        self.all_volumes()
            .iter()
            .map(|v| (v.id, v.name.clone()))
            .collect()
    }

    /// Counters of volume `id`.
    pub fn volume_stats(&self, id: VolumeId) -> Result<EngineStats> {
        Ok(self.stats_of(&*self.volume(id)?))
    }

    pub(crate) fn stats_of(&self, vol: &Volume) -> EngineStats {
        let mut s = self.pool_stats();
        let d = self.director.lock();
        s.mode = d.mode(vol.id);
        s.sequential_cutoff = d.sequential_cutoff(vol.id);
        s.decisions = d.volume_counters(vol.id).unwrap_or_default();
        drop(d);
        let io = EngineStats::io_part(&vol.io);
        s.backing_bytes = vol.size;
        s.read_bytes = io[0];
        s.write_bytes = io[1];
        s.read_hit_bytes = io[2];
        s.writeback_bytes = io[3];
        s.backing_read_errors = io[6];
        s.backing_write_errors = io[7];
        s.flushes = io[8];
        s.trims = io[9];
        // The recorder is the engine's, shown once in the pool's stats.
        s.trace = None;
        s
    }

    /// Sets volume `id`'s guaranteed share and cap in the shared cache
    /// (blocks). Refused when the share is above the cap or the shares add
    /// up to more than the cache. Not recorded on the cache device: give
    /// them again at each start (`serve --volume NAME=BACKING,share=..`).
    pub fn set_volume_limits(&self, id: VolumeId, limits: VolumeLimits) -> Result<()> {
        self.volume(id)?;
        self.director
            .lock()
            .set_volume_limits(id, limits)
            .map_err(|e| EngineError::Config(e.to_string()))
    }

    /// Volume `id`'s place in the shared cache.
    pub(crate) fn sharing_of(&self, id: VolumeId) -> SharingStats {
        let d = self.director.lock();
        let limits = d.volume_limits(id).unwrap_or_default();
        let more = (d.capacity() as u64).div_ceil(4);
        SharingStats {
            share_blocks: limits.share,
            cap_blocks: limits.cap,
            target_blocks: d.volume_target(id),
            more_blocks: more,
            gain: d.volume_gain(id, more),
        }
    }

    /// Changes volume `id`'s mode for IOs from now on (dirty blocks stay
    /// dirty and keep being served).
    pub fn set_volume_mode(&self, id: VolumeId, mode: CacheMode) -> Result<()> {
        self.volume(id)?;
        self.director.lock().set_mode(id, mode);
        self.persist_mode(id, mode)
    }

    /// Detaches volume `id`: writes its dirty blocks back (reporting
    /// `progress(cleaned, total)`), drops its clean blocks, frees its id.
    /// IO through a handle still held fails from then on. Volume 0, the
    /// one the engine was built with, stays.
    pub fn detach_volume(&self, id: VolumeId, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        if id == VolumeId(0) {
            return Err(EngineError::Config(
                "volume 0 is the engine's own; stop the engine instead".into(),
            ));
        }
        let vol = self.volume(id)?;
        let total = self.volume_dirty(id);
        let mut done = 0;
        progress(0, total);
        loop {
            // Dirty blocks first, without holding up other volumes' IO.
            while self.volume_dirty(id) > 0 {
                let n = self.clean_volume(id, 1024)?;
                done += n as u64;
                progress(done, total.max(done));
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            // Then, with no IO in flight anywhere, the rest.
            let _all = self.locks.exclusive(0..u64::MAX);
            if self.volume_dirty(id) > 0 {
                continue; // written again meanwhile
            }
            vol.detached.store(true, Ordering::Release);
            let mut d = self.director.lock();
            let mut mine = Vec::new();
            d.for_each_resident(&mut |o, c, _| {
                if o.volume() == id {
                    mine.push((o, c));
                }
            });
            for (o, c) in mine {
                d.invalidate(o);
                self.slot_dropped(Some(o), c);
                // Free in the metadata too, after any claim still buffered
                // for it: the store detaches no volume that maps a slot.
                self.record(c, None);
            }
            d.detach_volume(id)
                .map_err(|e| EngineError::Config(e.to_string()))?;
            drop(d);
            self.volumes.write()[id.index()] = None;
            return self.persist_detach(id);
        }
    }

    /// Dirty blocks of volume `id` now.
    fn volume_dirty(&self, id: VolumeId) -> u64 {
        self.director
            .lock()
            .volume_counters(id)
            .map_or(0, |c| c.dirty)
    }

    /// [`Engine::clean`], only for volume `id`'s blocks.
    fn clean_volume(&self, id: VolumeId, max_blocks: usize) -> Result<usize> {
        let mut dirty = self.director.lock().dirty_blocks_unordered();
        dirty.retain(|(o, _)| o.volume() == id);
        self.clean_sorted(dirty, max_blocks)
    }
}

/// Refuses a volume name that could not be an NBD export name, a file
/// name or a Prometheus label as it is.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EngineError::Config(format!(
            "volume name {name:?}: use 1 to {MAX_VOLUME_NAME} letters, digits, '.', '_' or '-'"
        )))
    }
}
