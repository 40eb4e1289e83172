//! The director: per-block decisions for every IO, shared verbatim by the
//! live engine and the simulator.
//!
//! The engine asks the director what to do with each block of an IO, then
//! does the IO. The simulator asks the same questions and does nothing. Both
//! therefore count exactly the same hits, misses, promotions and bypasses for
//! the same request stream.
//!
//! Mode rules (what a block plan is, per mode):
//!
//! | mode | read, cached | read, not cached | write, cached | write, not cached |
//! |---|---|---|---|---|
//! | writethrough | Hit | Promote if admitted, else Miss | Through | full block and admitted: Through (allocate), else Backing |
//! | writeback | Hit | Promote if admitted, else Miss | Dirty | full block: Dirty (allocate), else Backing |
//! | writearound | Hit | Promote if admitted, else Miss | Through | Backing |
//! | passthrough | Hit if dirty, else Miss | Miss | Dirty if dirty, else invalidate + Backing | Backing |
//!
//! A bypassed IO (sequential stream past the cutoff) never promotes or
//! allocates; cached blocks are still used so no read is stale.
//!
//! Pools: the director serves any number of volumes (see `volumes.rs`).
//! Blocks are pool keys ([`OriginBlock::of`]); the mode and the sequential
//! cutoff are per volume, the replacement and admission policies are
//! shared. [`Director::new`] attaches volume 0 with the configured mode
//! and cutoff, so a single-device cache is a pool of one. With two volumes
//! or more, or any volume's limits set, insertions are steered so that
//! volumes share the cache by their limits and marginal utility (see
//! `sharing.rs`).

use crate::sharing::{self, VolumeLimits, VolumeShare};
use crate::volumes::{VolumeState, Volumes};
use crate::{
    Admission, Insertion, PolicyConfig, PolicyError, Replacement, RequestClass, SequentialDetector,
};
use serde::{Deserialize, Serialize};
use tiercache_types::{Access, CacheBlock, CacheMode, OriginBlock, Time, VolumeId};

/// Block references between two settings of the pool's targets.
const TARGET_EPOCH: u64 = 4096;

/// Block references before the first setting of the pool's targets: an
/// epoch, or one cache's worth if that is sooner, so that a small cache is
/// steered from about when it first fills (until the first split no volume
/// has a target and nothing is steered).
fn first_target_epoch(capacity: u32) -> u64 {
    TARGET_EPOCH.min(u64::from(capacity).max(1))
}

/// Static parameters of a director.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DirectorConfig {
    pub mode: CacheMode,
    /// Cache block size in bytes (power of two, 4 KiB..1 MiB).
    pub block_size: u32,
    /// Cache size in blocks.
    pub capacity: u32,
    /// Sequential cutoff in bytes; 0 disables sequential bypass.
    pub sequential_cutoff: u64,
    pub policy: PolicyConfig,
    /// In a pool of two volumes or more, share the cache by each volume's
    /// marginal utility (its live hit curve); when false only the volumes'
    /// limits steer.
    #[serde(default = "utility_sharing_default")]
    pub utility_sharing: bool,
}

fn utility_sharing_default() -> bool {
    true
}

impl DirectorConfig {
    pub fn new(capacity: u32, block_size: u32) -> Self {
        DirectorConfig {
            mode: CacheMode::WriteThrough,
            block_size,
            capacity,
            sequential_cutoff: 4 << 20,
            policy: PolicyConfig::default(),
            utility_sharing: true,
        }
    }
}

/// What to do with one block of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// Copy the block from its cache slot.
    Hit(CacheBlock),
    /// Read the backing device only.
    Miss,
    /// Read the backing device, then fill the new slot with the whole block.
    /// The mapping is already in place; the engine must keep readers off the
    /// slot until it is filled, and must wait for readers of the evicted
    /// block to leave the slot before overwriting it.
    Promote(Insertion),
}

/// What to do with one block of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePlan {
    /// Write the backing device only (the block is not cached).
    Backing,
    /// Write the backing device, then the cache slot; the block stays clean.
    /// `evicted` is set when the slot was just allocated by evicting a block.
    Through {
        cblock: CacheBlock,
        evicted: Option<OriginBlock>,
        allocated: bool,
    },
    /// Write the cache slot only; the block is now dirty.
    Dirty {
        cblock: CacheBlock,
        evicted: Option<OriginBlock>,
        allocated: bool,
    },
}

/// Per-IO context returned by [`Director::begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoPlan {
    pub volume: VolumeId,
    pub access: Access,
    pub bypass: bool,
    /// What the IO is, for a policy that fills by class (`fill_gate.rs`).
    class: RequestClass,
    hits: u32,
    misses: u32,
}

/// One client IO, as [`Director::plan_io`] takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoRequest {
    pub volume: VolumeId,
    /// Byte offset and length on the volume.
    pub offset: u64,
    pub len: u64,
    pub access: Access,
    /// The volume's size in bytes (`u64::MAX` when unknown, as for a
    /// trace): its last block may be short, and a write reaching the
    /// volume's end covers that short block whole.
    pub volume_size: u64,
}

/// A block as it was just before its plan: where it was cached and
/// whether it was dirty (computed for writes only; reads get the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Before {
    pub cached: Option<CacheBlock>,
    pub dirty: bool,
}

/// Either kind of block plan, for code that handles both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockPlan {
    Read(ReadPlan),
    Write(WritePlan),
}

/// Decision counters. Block counts unless named `_ios` or `_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_hits: u64,
    pub read_misses: u64,
    pub write_hits: u64,
    pub write_misses: u64,
    /// Read IOs that found some but not all of their blocks cached.
    pub read_partial_hit_ios: u64,
    /// Write IOs that found some but not all of their blocks cached.
    pub write_partial_hit_ios: u64,
    /// Blocks brought into the cache (read promotions and write allocations).
    pub promotions: u64,
    /// Misses admission let through that the replacement policy chose not
    /// to fill (the default's fill gate, `fill_gate.rs`): served from the
    /// backing device, the block remembered in the policy's ghost.
    #[serde(default)]
    pub declined_fills: u64,
    /// Clean blocks evicted to make room.
    pub demotions: u64,
    /// Dirty blocks written back to the backing device.
    pub writebacks: u64,
    /// Blocks dropped from the cache (trim, passthrough writes, cache errors).
    pub invalidations: u64,
    pub bypassed_ios: u64,
    pub bypassed_bytes: u64,
    /// Resident blocks now.
    pub resident: u64,
    /// Dirty blocks now.
    pub dirty: u64,
    /// Cache size in blocks.
    pub capacity: u64,
}

impl Counters {
    /// Share of read blocks served from the cache (0 when nothing was read).
    pub fn read_hit_ratio(&self) -> f64 {
        let total = self.read_hits + self.read_misses;
        if total == 0 {
            0.0
        } else {
            self.read_hits as f64 / total as f64
        }
    }
}

/// Composes replacement, admission and sequential bypass into per-block
/// plans.
pub struct Director {
    replacement: Box<dyn Replacement>,
    admission: Box<dyn Admission>,
    volumes: Volumes,
    block_size: u32,
    /// The pool's counters: every volume's events, detached ones included.
    counters: Counters,
    utility_sharing: bool,
    /// Whether insertions are steered (two volumes or more, or limits).
    steering: bool,
    /// Block references left until the targets are set again.
    epoch_left: u64,
    /// The volume that last gave up blocks for an under-target one.
    donor: Option<VolumeId>,
    /// Bucket edges of every volume's hit curve.
    curve_edges: std::sync::Arc<[u64]>,
}

impl Director {
    pub fn new(cfg: &DirectorConfig) -> Result<Self, PolicyError> {
        if !cfg.block_size.is_power_of_two()
            || !(tiercache_types::MIN_BLOCK_SIZE..=tiercache_types::MAX_BLOCK_SIZE)
                .contains(&cfg.block_size)
        {
            return Err(PolicyError::Invalid(format!(
                "block size {} must be a power of two between 4 KiB and 1 MiB",
                cfg.block_size
            )));
        }
        if cfg.capacity == 0 {
            return Err(PolicyError::Invalid(
                "cache must hold at least one block".into(),
            ));
        }
        let replacement = cfg.policy.build_replacement(cfg.capacity)?;
        let admission = cfg.policy.build_admission(cfg.capacity, cfg.block_size)?;
        Ok(Self::from_parts(cfg, replacement, admission))
    }

    /// A director over explicitly built policies (tests, experiments).
    pub fn from_parts(
        cfg: &DirectorConfig,
        replacement: Box<dyn Replacement>,
        admission: Box<dyn Admission>,
    ) -> Self {
        let counters = Counters {
            capacity: replacement.capacity() as u64,
            ..Counters::default()
        };
        let mut d = Director {
            replacement,
            admission,
            volumes: Volumes::default(),
            block_size: cfg.block_size,
            counters,
            utility_sharing: cfg.utility_sharing,
            steering: false,
            epoch_left: 0,
            donor: None,
            curve_edges: crate::utility::curve_edges(
                sharing::CURVE_REACH * cfg.capacity.max(1) as u64,
            ),
        };
        d.epoch_left = first_target_epoch(cfg.capacity);
        d.attach_volume(VolumeId(0), cfg.mode, cfg.sequential_cutoff);
        d
    }

    /// Attaches a volume with its mode and sequential cutoff. False (and
    /// nothing changes) if it is attached already.
    pub fn attach_volume(&mut self, volume: VolumeId, mode: CacheMode, cutoff: u64) -> bool {
        let counters = Counters {
            capacity: self.replacement.capacity() as u64,
            ..Counters::default()
        };
        let share = VolumeShare::new(self.curve_edges.clone(), VolumeLimits::default());
        let attached = self.volumes.attach(
            volume,
            VolumeState {
                mode,
                sequential: SequentialDetector::new(cutoff),
                counters,
                share,
                last_end: u64::MAX,
            },
        );
        self.update_steering();
        attached
    }

    /// Detaches a volume that has no block in the cache (the caller wrote
    /// its dirty blocks back and invalidated the rest first). Returns its
    /// final counters; an error if it still has blocks or is not attached.
    pub fn detach_volume(&mut self, volume: VolumeId) -> Result<Counters, PolicyError> {
        let c = self
            .volume_counters(volume)
            .ok_or_else(|| PolicyError::Invalid(format!("volume {volume} is not attached")))?;
        if c.resident > 0 {
            return Err(PolicyError::Invalid(format!(
                "volume {volume} still has {} blocks in the cache ({} dirty)",
                c.resident, c.dirty
            )));
        }
        self.volumes.detach(volume);
        if self.donor == Some(volume) {
            self.donor = None;
        }
        self.update_steering();
        Ok(c)
    }

    /// Sets `volume`'s guaranteed share and cap (blocks). Refused when the
    /// share exceeds the cap, or the shares of all volumes together exceed
    /// the cache.
    pub fn set_volume_limits(
        &mut self,
        volume: VolumeId,
        limits: VolumeLimits,
    ) -> Result<(), PolicyError> {
        if limits.cap.is_some_and(|c| c < limits.share) {
            return Err(PolicyError::Invalid(format!(
                "volume {volume}: share of {} blocks above its cap of {}",
                limits.share,
                limits.cap.unwrap_or(0)
            )));
        }
        let others: u64 = self
            .volumes
            .iter()
            .filter(|(id, _)| *id != volume)
            .map(|(_, v)| v.share.limits.share)
            .sum();
        let capacity = self.replacement.capacity() as u64;
        if others + limits.share > capacity {
            return Err(PolicyError::Invalid(format!(
                "volume {volume}: a share of {} blocks leaves too little: the shares would \
                 add up to {} blocks in a cache of {capacity}",
                limits.share,
                others + limits.share
            )));
        }
        let v = self
            .volumes
            .get_mut(volume)
            .ok_or_else(|| PolicyError::Invalid(format!("volume {volume} is not attached")))?;
        v.share.limits = limits;
        self.update_steering();
        self.set_targets();
        Ok(())
    }

    /// `volume`'s limits (None if it is not attached).
    pub fn volume_limits(&self, volume: VolumeId) -> Option<VolumeLimits> {
        Some(self.volumes.get(volume)?.share.limits)
    }

    /// The blocks the sharing gives `volume` now: None when it is not
    /// attached or no target is set (a pool of one without limits, or
    /// before the first epoch).
    pub fn volume_target(&self, volume: VolumeId) -> Option<u64> {
        let t = self.volumes.get(volume)?.share.target;
        (self.steering && t != u64::MAX).then_some(t)
    }

    /// What `extra` more blocks would be worth to `volume`: the share of
    /// its recent block references they would turn from misses into hits
    /// (0..1, from its live hit curve; None when no curve is kept).
    pub fn volume_gain(&self, volume: VolumeId, extra: u64) -> Option<f64> {
        let v = self.volumes.get(volume)?;
        let curve = &v.share.curve;
        if !self.steering || curve.total() <= 0.0 {
            return None;
        }
        let now = v.counters.resident;
        let gain = curve.hits(now + extra) - curve.hits(now);
        Some((gain / curve.total()).max(0.0))
    }

    /// Decides whether the director steers, and sizes every volume's hit
    /// curve for the pool's size; on every attach and detach.
    fn update_steering(&mut self) {
        let volumes = self.volumes.iter().count();
        let samples = crate::utility::samples_per_volume(volumes);
        for v in self.volumes.iter_mut() {
            v.share.curve.set_samples(samples);
        }
        let limited = self
            .volumes
            .iter()
            .any(|(_, v)| v.share.limits != VolumeLimits::default());
        self.steering = volumes >= 2 || limited;
    }

    /// A volume's own references over which its hit curve's shape keeps
    /// half its weight: as many as the curves reach in blocks
    /// ([`sharing::CURVE_REACH`] caches), since a reuse distance of `n`
    /// blocks takes at least `n` references to be seen; a shorter history
    /// would read every distance near the reach as no reuse. (Counted in
    /// the pool's references instead, it was too short for a quiet volume
    /// of a busy pool, whose long distances then read as no reuse.)
    fn shape_span(&self) -> u64 {
        (sharing::CURVE_REACH * self.replacement.capacity() as u64).max(TARGET_EPOCH)
    }

    /// Sets every volume's target (see `sharing.rs`); without utility
    /// sharing a volume's target is its share, capped.
    fn set_targets(&mut self) {
        self.donor = None;
        if self.utility_sharing {
            let mut shares: Vec<&mut VolumeShare> =
                self.volumes.iter_mut().map(|v| &mut v.share).collect();
            sharing::set_targets(self.replacement.capacity(), &mut shares);
        } else {
            for v in self.volumes.iter_mut() {
                let l = v.share.limits;
                v.share.target = l.share;
            }
        }
    }

    /// Records a reference to `oblock` in its volume's hit curve, and ends
    /// the epoch when it is due. A bypassed reference (a sequential stream
    /// past the cutoff) is not recorded: it never takes cache space, so
    /// counting it would stretch the reuse distances of the blocks that do
    /// (a rescanned stream's first cutoff's worth, kept and hit every pass,
    /// would look like a loop too long to cache).
    fn note_reference(&mut self, oblock: OriginBlock, bypass: bool) {
        if !self.steering || bypass {
            return;
        }
        if self.utility_sharing {
            if let Some(v) = self.volumes.get_mut(oblock.volume()) {
                v.share.curve.reference(oblock);
            }
        }
        self.epoch_left -= 1;
        if self.epoch_left == 0 {
            self.epoch_left = TARGET_EPOCH;
            if self.utility_sharing {
                // The rates keep half their weight over as many of the
                // pool's references as a shape does over its volume's.
                let span = self.shape_span();
                let keep = 0.5f64.powf(TARGET_EPOCH as f64 / span as f64);
                for v in self.volumes.iter_mut() {
                    v.share.curve.end_epoch(keep);
                    v.share.curve.age(span);
                }
            }
            self.set_targets();
        }
    }

    fn over_target(&self, volume: VolumeId) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|v| v.counters.resident > v.share.target)
    }

    /// The volume most over its target, if any (the last donor while it
    /// still is one, so the search is rare).
    fn most_over_target(&mut self) -> Option<VolumeId> {
        if let Some(d) = self.donor.filter(|&d| self.over_target(d)) {
            return Some(d);
        }
        self.donor = self
            .volumes
            .iter()
            .filter(|(_, v)| v.counters.resident > v.share.target)
            .max_by_key(|(_, v)| v.counters.resident - v.share.target)
            .map(|(id, _)| id);
        self.donor
    }

    /// Inserts `oblock`, steering the victim's choice when the pool's
    /// sharing asks for it (see `sharing.rs`).
    fn insert(&mut self, oblock: OriginBlock, now: Time) -> Option<Insertion> {
        if self.steering {
            if let Some(steered) = self.steered_insert(oblock, now) {
                return steered;
            }
        }
        self.replacement.insert(oblock, now)
    }

    /// `Some(result)` when the sharing chose the victim, `None` to leave
    /// the choice to the replacement policy.
    fn steered_insert(&mut self, oblock: OriginBlock, now: Time) -> Option<Option<Insertion>> {
        let volume = oblock.volume();
        let full = self.replacement.len() >= self.replacement.capacity();
        let v = self.volumes.get(volume)?;
        let at_cap = v.share.limits.cap.is_some_and(|c| v.counters.resident >= c);
        if full && self.utility_sharing && v.share.target == 0 {
            // The split by utility gives this volume no space: whatever it
            // would displace is worth more hits than it is. Not caching it
            // is the split's own answer (its curve still learns from every
            // reference, so a volume that heats up gets a target again).
            return Some(None);
        }
        let donor = if at_cap {
            volume
        } else if full {
            let victim = self.replacement.peek_victim()?;
            if self.over_target(victim.volume()) {
                return None;
            }
            if self.over_target(volume) {
                volume
            } else {
                self.most_over_target()?
            }
        } else {
            return None;
        };
        let replacement = &*self.replacement;
        let picked = self
            .volumes
            .get_mut(donor)
            .and_then(|d| d.share.pick_victim(donor, replacement, at_cap));
        let Some(gone) = picked else {
            // A capped volume with no clean block found stays at its cap.
            return at_cap.then_some(None);
        };
        // Counted as an eviction by the caller, from the Insertion.
        let slot = self
            .replacement
            .remove(gone)
            .expect("the hand found it resident");
        let placed = if full {
            // The only free slot is the one just freed: insert takes it.
            let ins = self
                .replacement
                .insert(oblock, now)
                .expect("a slot was freed");
            debug_assert_eq!((ins.cblock, ins.evicted), (slot, None));
            ins.cblock == slot && ins.evicted.is_none()
        } else {
            // Other slots are free: put the block exactly in the freed one.
            self.replacement.restore(oblock, slot, false, 0)
        };
        assert!(
            placed,
            "steered insertion of {oblock} did not reuse slot {slot}"
        );
        Some(Some(Insertion {
            cblock: slot,
            evicted: Some(gone),
        }))
    }

    /// The attached volumes, in id order.
    pub fn volume_ids(&self) -> Vec<VolumeId> {
        self.volumes.ids().collect()
    }

    /// The mode of `volume` (passthrough if it is not attached).
    pub fn mode(&self, volume: VolumeId) -> CacheMode {
        self.volumes
            .get(volume)
            .map_or(CacheMode::PassThrough, |v| v.mode)
    }

    /// Whether a read of `volume` planned now would surely never promote,
    /// changing nothing: the volume is in passthrough, or the read surely
    /// bypasses ([`SequentialDetector::surely_bypasses`]). A front end
    /// that serves such reads itself asks this, then plans the read with
    /// [`Director::plan_io`] under the same lock: every block is then a
    /// hit or a miss read from the backing device.
    pub fn read_never_promotes(&self, volume: VolumeId, offset: u64, len: u64, now: Time) -> bool {
        self.volumes.get(volume).is_some_and(|v| {
            v.mode == CacheMode::PassThrough || v.sequential.surely_bypasses(offset, len, now)
        })
    }

    /// Changes `volume`'s mode for IOs planned from now on. Caller
    /// guarantees that leaving writeback for another mode is fine with
    /// dirty blocks present: they stay dirty and are still served from the
    /// cache in every mode.
    pub fn set_mode(&mut self, volume: VolumeId, mode: CacheMode) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.mode = mode;
        }
    }

    /// Every volume's mode at once (the cache device failing: passthrough).
    pub fn set_mode_all(&mut self, mode: CacheMode) {
        for v in self.volumes.iter_mut() {
            v.mode = mode;
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn sequential_cutoff(&self, volume: VolumeId) -> u64 {
        self.volumes
            .get(volume)
            .map_or(0, |v| v.sequential.cutoff())
    }

    pub fn set_sequential_cutoff(&mut self, volume: VolumeId, cutoff: u64) {
        if let Some(v) = self.volumes.get_mut(volume) {
            v.sequential.set_cutoff(cutoff);
        }
    }

    /// Counts an event in the pool's counters and in `volume`'s.
    fn count(&mut self, volume: VolumeId, f: impl Fn(&mut Counters)) {
        f(&mut self.counters);
        if let Some(v) = self.volumes.get_mut(volume) {
            f(&mut v.counters);
        }
    }

    /// Restores a saved mapping entry (cache start): the replacement's
    /// [`Replacement::restore`], keeping the volume's gauges.
    pub fn restore(
        &mut self,
        oblock: OriginBlock,
        cblock: CacheBlock,
        dirty: bool,
        hint: u8,
    ) -> bool {
        let ok = self.replacement.restore(oblock, cblock, dirty, hint);
        if ok {
            if let Some(v) = self.volumes.get_mut(oblock.volume()) {
                v.counters.resident += 1;
                v.counters.dirty += dirty as u64;
            }
        }
        ok
    }

    pub fn replacement(&self) -> &dyn Replacement {
        &*self.replacement
    }

    /// The policy's work put off since the last call, for the caller to
    /// run after releasing its lock on the director
    /// ([`Replacement::take_deferred`]). Whether and when it runs changes
    /// no decision, so the simulator never calls this.
    pub fn take_deferred(&mut self) -> Option<crate::DeferredMinis> {
        self.replacement.take_deferred()
    }

    /// For restoring saved state without per-volume gauges (tests,
    /// experiments); a cache start uses [`Director::restore`].
    pub fn replacement_mut(&mut self) -> &mut dyn Replacement {
        &mut *self.replacement
    }

    /// The blocks an IO of `len` bytes at byte `offset` touches. An IO
    /// that runs past the end of the 64-bit address space (a trace's bad
    /// record) is cut at that end, as [`Director::plan_io`] cuts it: it
    /// neither wraps into an empty range nor overflows.
    pub fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        if len == 0 {
            return 0..0;
        }
        let bs = self.block_size as u64;
        offset / bs..offset.saturating_add(len).div_ceil(bs)
    }

    /// Plans a whole client IO in one call: starts it, plans each block in
    /// order, calling `each(block, before, plan)` with the block's number
    /// on its volume, then finishes it. The live engine and the simulator
    /// both plan through here, so they take every decision alike (a write
    /// over a short last block counts as a full block in both).
    ///
    /// `each` runs with the director borrowed: it records what to do, it
    /// cannot ask the director anything.
    pub fn plan_io(
        &mut self,
        req: &IoRequest,
        now: Time,
        mut each: impl FnMut(u64, Before, BlockPlan),
    ) -> IoPlan {
        let mut io = self.begin(req.volume, req.offset, req.len, req.access, now);
        let end = req.offset.saturating_add(req.len);
        let bs = self.block_size as u64;
        for b in self.blocks_of(req.offset, req.len) {
            let key = OriginBlock::of(req.volume, b);
            match req.access {
                Access::Read => {
                    let plan = self.plan_read(&mut io, key, now);
                    each(b, Before::default(), BlockPlan::Read(plan));
                }
                Access::Write => {
                    let bstart = b * bs;
                    let bend = bstart.saturating_add(bs).min(req.volume_size);
                    let full = req.offset <= bstart && end >= bend;
                    let before = self.before(key);
                    let plan = self.plan_write_from(&mut io, key, full, now, before);
                    each(b, before, BlockPlan::Write(plan));
                }
            }
        }
        self.finish(io);
        io
    }

    /// Starts an IO of `volume` (attached): counts it and decides whether
    /// it bypasses the cache. `offset` is the byte offset on the volume.
    pub fn begin(
        &mut self,
        volume: VolumeId,
        offset: u64,
        len: u64,
        access: Access,
        now: Time,
    ) -> IoPlan {
        let v = self.volumes.of_mut(volume);
        let bypass = v.sequential.observe(offset, len, now);
        let passthrough = v.mode == CacheMode::PassThrough;
        let continues = std::mem::replace(&mut v.last_end, offset.saturating_add(len)) == offset;
        self.count(volume, |c| {
            match access {
                Access::Read => c.read_ios += 1,
                Access::Write => c.write_ios += 1,
            }
            if bypass || passthrough {
                c.bypassed_ios += 1;
                c.bypassed_bytes += len;
            }
        });
        let bs = self.block_size as u64;
        let blocks = offset.saturating_add(len).div_ceil(bs) - offset / bs;
        IoPlan {
            volume,
            access,
            bypass,
            class: RequestClass::of(access, blocks, continues),
            hits: 0,
            misses: 0,
        }
    }

    /// Ends an IO started with [`Director::begin`].
    pub fn finish(&mut self, io: IoPlan) {
        if io.hits > 0 && io.misses > 0 {
            self.count(io.volume, |c| match io.access {
                Access::Read => c.read_partial_hit_ios += 1,
                Access::Write => c.write_partial_hit_ios += 1,
            });
        }
    }

    /// The mode that decides for `oblock` (its volume's).
    fn mode_of(&self, oblock: OriginBlock) -> CacheMode {
        self.mode(oblock.volume())
    }

    fn occupancy(&self) -> f64 {
        self.replacement.len() as f64 / self.replacement.capacity() as f64
    }

    /// Counts an insertion for the inserted block's volume and the
    /// eviction, if any, for the evicted block's (evicted blocks are clean).
    fn note_insertion(&mut self, oblock: OriginBlock, ins: &Insertion) {
        self.count(oblock.volume(), |c| c.promotions += 1);
        if let Some(v) = self.volumes.get_mut(oblock.volume()) {
            v.counters.resident += 1;
        }
        if let Some(e) = ins.evicted {
            self.count(e.volume(), |c| c.demotions += 1);
            self.note_removal(e, false);
        }
    }

    /// A block left the cache: `volume`'s gauges follow.
    fn note_removal(&mut self, oblock: OriginBlock, was_dirty: bool) {
        if let Some(v) = self.volumes.get_mut(oblock.volume()) {
            v.counters.resident = v.counters.resident.saturating_sub(1);
            if was_dirty {
                v.counters.dirty = v.counters.dirty.saturating_sub(1);
            }
        }
    }

    /// `oblock` became dirty (it was clean): its volume's gauge follows.
    fn note_dirtied(&mut self, oblock: OriginBlock) {
        if let Some(v) = self.volumes.get_mut(oblock.volume()) {
            v.counters.dirty += 1;
        }
    }

    /// The slot [`Director::plan_read`] would serve `oblock` from (a hit),
    /// or None (a miss). Changes nothing.
    pub fn read_hit_slot(&self, oblock: OriginBlock) -> Option<CacheBlock> {
        let c = self.replacement.lookup(oblock)?;
        if self.mode_of(oblock) == CacheMode::PassThrough && !self.replacement.is_dirty(oblock) {
            return None;
        }
        Some(c)
    }

    /// Plans one block of a read IO.
    pub fn plan_read(&mut self, io: &mut IoPlan, oblock: OriginBlock, now: Time) -> ReadPlan {
        debug_assert_eq!(oblock.volume(), io.volume, "a block of another volume");
        self.note_reference(oblock, io.bypass);
        let mode = self.mode_of(oblock);
        let fills_on_miss = !io.bypass && mode != CacheMode::PassThrough;
        self.replacement.observe(oblock, fills_on_miss, now);
        if let Some(c) = self.replacement.lookup(oblock) {
            if mode == CacheMode::PassThrough && !self.replacement.is_dirty(oblock) {
                self.count(io.volume, |c| c.read_misses += 1);
                io.misses += 1;
                return ReadPlan::Miss;
            }
            self.record_read_hit(io, oblock, c, now);
            return ReadPlan::Hit(c);
        }
        self.count(io.volume, |c| c.read_misses += 1);
        io.misses += 1;
        if io.bypass || mode == CacheMode::PassThrough {
            return ReadPlan::Miss;
        }
        let victim = self.replacement.peek_victim();
        let occupancy = self.occupancy();
        if !self
            .admission
            .admit(oblock, Access::Read, now, occupancy, victim)
        {
            return ReadPlan::Miss;
        }
        if self.replacement.declines_fill(oblock, io.class, true) {
            self.count(io.volume, |c| c.declined_fills += 1);
            return ReadPlan::Miss;
        }
        match self.insert(oblock, now) {
            Some(ins) => {
                self.note_insertion(oblock, &ins);
                ReadPlan::Promote(ins)
            }
            None => ReadPlan::Miss,
        }
    }

    /// What a read hit on `oblock` changes (after its reference was noted):
    /// the counters, the replacement's and the admission's state. The one
    /// place a read hit is recorded, for [`Director::plan_read`] and
    /// [`Director::plan_read_hits`] alike.
    fn record_read_hit(&mut self, io: &mut IoPlan, oblock: OriginBlock, c: CacheBlock, now: Time) {
        self.count(io.volume, |c| c.read_hits += 1);
        io.hits += 1;
        self.replacement.touch_at(oblock, c, Access::Read, now);
        self.admission.on_hit(oblock, now);
    }

    /// Plans a read IO every block of which is a hit: `slots[i]` is the
    /// slot [`Director::read_hit_slot`] gave for the IO's `i`-th block, in
    /// the same critical section (nothing changed the director between).
    /// Takes exactly the decisions [`Director::plan_io`] takes for `req`
    /// (every block a [`ReadPlan::Hit`] on those slots), with one lookup
    /// per block (the caller's) instead of two: the live engine's hit path.
    pub fn plan_read_hits(&mut self, req: &IoRequest, now: Time, slots: &[CacheBlock]) -> IoPlan {
        assert_eq!(req.access, Access::Read, "a write planned as read hits");
        let blocks = self.blocks_of(req.offset, req.len);
        assert_eq!(
            blocks.end - blocks.start,
            slots.len() as u64,
            "one slot per block of the IO"
        );
        let mut io = self.begin(req.volume, req.offset, req.len, req.access, now);
        for (b, &c) in blocks.zip(slots) {
            let key = OriginBlock::of(req.volume, b);
            debug_assert_eq!(self.read_hit_slot(key), Some(c), "{key} is no hit on {c}");
            self.note_reference(key, io.bypass);
            let fills_on_miss = !io.bypass && self.mode_of(key) != CacheMode::PassThrough;
            self.replacement.observe(key, fills_on_miss, now);
            self.record_read_hit(&mut io, key, c, now);
        }
        self.finish(io);
        io
    }

    /// Plans one block of a write IO. `full_block` says whether the write
    /// covers the whole block (only then may a new slot be allocated, since
    /// nothing else would fill the rest of it).
    pub fn plan_write(
        &mut self,
        io: &mut IoPlan,
        oblock: OriginBlock,
        full_block: bool,
        now: Time,
    ) -> WritePlan {
        let before = self.before(oblock);
        self.plan_write_from(io, oblock, full_block, now, before)
    }

    /// Where `oblock` is cached and whether it is dirty, with one lookup.
    fn before(&self, oblock: OriginBlock) -> Before {
        let cached = self.replacement.lookup(oblock);
        Before {
            cached,
            dirty: cached.is_some_and(|c| self.replacement.slots().is_dirty(c)),
        }
    }

    /// [`Director::plan_write`] of a block found as `before` (the caller's
    /// [`Director::before`] of it, just now).
    fn plan_write_from(
        &mut self,
        io: &mut IoPlan,
        oblock: OriginBlock,
        full_block: bool,
        now: Time,
        before: Before,
    ) -> WritePlan {
        debug_assert_eq!(oblock.volume(), io.volume, "a block of another volume");
        debug_assert_eq!(before, self.before(oblock), "{oblock} changed since");
        self.note_reference(oblock, io.bypass);
        let mode = self.mode_of(oblock);
        let fills_on_miss = !io.bypass
            && full_block
            && matches!(mode, CacheMode::WriteBack | CacheMode::WriteThrough);
        self.replacement.observe(oblock, fills_on_miss, now);
        if let Some(c) = before.cached {
            let dirty = before.dirty;
            let plan = match mode {
                CacheMode::WriteBack if !io.bypass || dirty => {
                    if !dirty {
                        self.replacement.set_dirty(oblock, true);
                        self.note_dirtied(oblock);
                    }
                    WritePlan::Dirty {
                        cblock: c,
                        evicted: None,
                        allocated: false,
                    }
                }
                CacheMode::PassThrough if dirty => WritePlan::Dirty {
                    cblock: c,
                    evicted: None,
                    allocated: false,
                },
                CacheMode::PassThrough => {
                    self.replacement.remove(oblock);
                    self.note_removal(oblock, false);
                    self.count(io.volume, |c| {
                        c.invalidations += 1;
                        c.write_misses += 1;
                    });
                    io.misses += 1;
                    return WritePlan::Backing;
                }
                _ if dirty => WritePlan::Dirty {
                    cblock: c,
                    evicted: None,
                    allocated: false,
                },
                _ => WritePlan::Through {
                    cblock: c,
                    evicted: None,
                    allocated: false,
                },
            };
            self.count(io.volume, |c| c.write_hits += 1);
            io.hits += 1;
            self.replacement.touch(oblock, Access::Write, now);
            self.admission.on_hit(oblock, now);
            return plan;
        }
        self.count(io.volume, |c| c.write_misses += 1);
        io.misses += 1;
        if io.bypass || !full_block {
            return WritePlan::Backing;
        }
        let allocate = match mode {
            // Writeback absorbs every full-block write, as bcache does.
            CacheMode::WriteBack => true,
            CacheMode::WriteThrough => {
                let victim = self.replacement.peek_victim();
                let occupancy = self.occupancy();
                self.admission
                    .admit(oblock, Access::Write, now, occupancy, victim)
            }
            CacheMode::WriteAround | CacheMode::PassThrough => false,
        };
        if !allocate {
            return WritePlan::Backing;
        }
        if self
            .replacement
            .declines_fill(oblock, io.class, mode != CacheMode::WriteBack)
        {
            self.count(io.volume, |c| c.declined_fills += 1);
            return WritePlan::Backing;
        }
        let Some(ins) = self.insert(oblock, now) else {
            return WritePlan::Backing;
        };
        self.note_insertion(oblock, &ins);
        if mode == CacheMode::WriteBack {
            self.replacement.set_dirty(oblock, true);
            self.note_dirtied(oblock);
            WritePlan::Dirty {
                cblock: ins.cblock,
                evicted: ins.evicted,
                allocated: true,
            }
        } else {
            WritePlan::Through {
                cblock: ins.cblock,
                evicted: ins.evicted,
                allocated: true,
            }
        }
    }

    /// Drops `oblock` from the cache (trim, a failed cache write, or a
    /// promotion that could not be completed). Returns its slot. Dirty data
    /// in it is discarded: caller guarantees that is intended.
    pub fn invalidate(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        let dirty = self.replacement.is_dirty(oblock);
        let c = self.replacement.remove(oblock)?;
        self.note_removal(oblock, dirty);
        self.count(oblock.volume(), |c| c.invalidations += 1);
        Some(c)
    }

    /// Undoes a promotion whose fill failed: like invalidate, but the block
    /// is not counted as promoted.
    pub fn abort_promotion(&mut self, oblock: OriginBlock) {
        let dirty = self.replacement.is_dirty(oblock);
        if self.replacement.remove(oblock).is_some() {
            self.note_removal(oblock, dirty);
            self.count(oblock.volume(), |c| {
                c.promotions = c.promotions.saturating_sub(1)
            });
        }
    }

    /// Records that a dirty block was written back and is clean now.
    pub fn mark_clean(&mut self, oblock: OriginBlock) {
        if self.replacement.is_dirty(oblock) {
            self.replacement.set_dirty(oblock, false);
            self.count(oblock.volume(), |c| c.writebacks += 1);
            if let Some(v) = self.volumes.get_mut(oblock.volume()) {
                v.counters.dirty = v.counters.dirty.saturating_sub(1);
            }
        }
    }

    /// Dirty blocks in origin order (the order a cleaner should write them).
    pub fn dirty_blocks(&self) -> Vec<(OriginBlock, CacheBlock)> {
        let mut v = self.dirty_blocks_unordered();
        v.sort_unstable();
        v
    }

    /// [`Director::dirty_blocks`] in no particular order: for a caller that
    /// sorts them after releasing a lock it holds the director under.
    pub fn dirty_blocks_unordered(&self) -> Vec<(OriginBlock, CacheBlock)> {
        let mut v = Vec::with_capacity(self.replacement.dirty_len() as usize);
        self.replacement.for_each_resident(&mut |o, c, dirty| {
            if dirty {
                v.push((o, c));
            }
        });
        v
    }

    /// The slot holding `oblock`, if cached.
    pub fn lookup(&self, oblock: OriginBlock) -> Option<CacheBlock> {
        self.replacement.lookup(oblock)
    }

    /// Whether `oblock` is cached and dirty.
    pub fn is_dirty(&self, oblock: OriginBlock) -> bool {
        self.replacement.is_dirty(oblock)
    }

    /// The block slot `cblock` holds, if any.
    pub fn oblock_of(&self, cblock: CacheBlock) -> Option<OriginBlock> {
        self.replacement.oblock_of(cblock)
    }

    /// The replacement policy's advisory value for `oblock` (saved with the
    /// mapping).
    pub fn hint(&self, oblock: OriginBlock) -> u8 {
        self.replacement.hint(oblock)
    }

    /// Dirty blocks in the whole cache.
    pub fn dirty_len(&self) -> u32 {
        self.replacement.dirty_len()
    }

    /// Blocks in the cache.
    pub fn resident_len(&self) -> u32 {
        self.replacement.len()
    }

    /// Cache size in blocks.
    pub fn capacity(&self) -> u32 {
        self.replacement.capacity()
    }

    /// Calls `f(block, slot, dirty)` for every cached block.
    pub fn for_each_resident(&self, f: &mut dyn FnMut(OriginBlock, CacheBlock, bool)) {
        self.replacement.for_each_resident(f)
    }

    /// Heap bytes of the replacement policy's state (the mapping included).
    pub fn memory_bytes(&self) -> usize {
        self.replacement.memory_bytes()
    }

    /// Bytes of RAM the attached volumes' own state uses (sequential
    /// detectors, counters, hit curves): per volume, not per cache block.
    pub fn volumes_memory_bytes(&self) -> usize {
        self.volumes
            .iter()
            .map(|(_, v)| {
                std::mem::size_of_val(v)
                    + v.sequential.memory_bytes()
                    + v.share.curve.memory_bytes()
            })
            .sum()
    }

    /// The pool's counters, gauges included.
    pub fn counters(&self) -> Counters {
        Counters {
            resident: self.replacement.len() as u64,
            dirty: self.replacement.dirty_len() as u64,
            ..self.counters
        }
    }

    /// `volume`'s counters (its own events, and its blocks' gauges), or
    /// None if it is not attached.
    pub fn volume_counters(&self, volume: VolumeId) -> Option<Counters> {
        self.volumes.get(volume).map(|v| v.counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_types::{AdmissionKind, ReplacementKind};

    fn director(mode: CacheMode, capacity: u32) -> Director {
        let mut cfg = DirectorConfig::new(capacity, 4096);
        cfg.mode = mode;
        cfg.policy.replacement = ReplacementKind::Lru;
        cfg.policy.admission = AdmissionKind::Always;
        Director::new(&cfg).unwrap()
    }

    fn read(d: &mut Director, block: u64) -> ReadPlan {
        let mut io = d.begin(VolumeId(0), block * 4096, 4096, Access::Read, Time(block));
        let p = d.plan_read(&mut io, OriginBlock(block), Time(block));
        d.finish(io);
        p
    }

    fn write(d: &mut Director, block: u64) -> WritePlan {
        let mut io = d.begin(
            VolumeId(0),
            block * 4096 + 7 * 4096 * 1000,
            4096,
            Access::Write,
            Time(block),
        );
        let p = d.plan_write(&mut io, OriginBlock(block), true, Time(block));
        d.finish(io);
        p
    }

    #[test]
    fn writethrough_promotes_on_miss_then_hits() {
        let mut d = director(CacheMode::WriteThrough, 4);
        assert!(matches!(read(&mut d, 10), ReadPlan::Promote(_)));
        assert!(matches!(read(&mut d, 10), ReadPlan::Hit(_)));
        let c = d.counters();
        assert_eq!((c.read_hits, c.read_misses, c.promotions), (1, 1, 1));
    }

    #[test]
    fn writeback_write_makes_dirty_and_passthrough_keeps_serving_it() {
        let mut d = director(CacheMode::WriteBack, 4);
        assert!(matches!(
            write(&mut d, 3),
            WritePlan::Dirty {
                allocated: true,
                ..
            }
        ));
        assert_eq!(d.counters().dirty, 1);
        d.set_mode(VolumeId(0), CacheMode::PassThrough);
        assert!(matches!(read(&mut d, 3), ReadPlan::Hit(_)));
        assert!(matches!(
            write(&mut d, 3),
            WritePlan::Dirty {
                allocated: false,
                ..
            }
        ));
        d.mark_clean(OriginBlock(3));
        assert_eq!(read(&mut d, 3), ReadPlan::Miss);
        assert_eq!(write(&mut d, 3), WritePlan::Backing);
        assert!(d.replacement().lookup(OriginBlock(3)).is_none());
    }

    #[test]
    fn writearound_does_not_allocate_on_write() {
        let mut d = director(CacheMode::WriteAround, 4);
        assert_eq!(write(&mut d, 1), WritePlan::Backing);
        assert!(matches!(read(&mut d, 1), ReadPlan::Promote(_)));
        assert!(matches!(
            write(&mut d, 1),
            WritePlan::Through {
                allocated: false,
                ..
            }
        ));
    }

    #[test]
    fn sequential_stream_bypasses_after_cutoff() {
        let mut cfg = DirectorConfig::new(1024, 4096);
        cfg.sequential_cutoff = 64 * 1024;
        cfg.policy.replacement = ReplacementKind::Lru;
        cfg.policy.admission = AdmissionKind::Always;
        let mut d = Director::new(&cfg).unwrap();
        let mut promoted = 0;
        for i in 0..64u64 {
            let mut io = d.begin(VolumeId(0), i * 16384, 16384, Access::Read, Time(i));
            for b in d.blocks_of(i * 16384, 16384) {
                if matches!(
                    d.plan_read(&mut io, OriginBlock(b), Time(i)),
                    ReadPlan::Promote(_)
                ) {
                    promoted += 1;
                }
            }
            d.finish(io);
        }
        assert_eq!(
            promoted, 16,
            "only the first 64 KiB of the stream is cached"
        );
        assert_eq!(d.counters().bypassed_ios, 60);
    }

    #[test]
    fn partial_hits_are_counted() {
        let mut d = director(CacheMode::WriteThrough, 8);
        read(&mut d, 0);
        let mut io = d.begin(VolumeId(0), 0, 8192, Access::Read, Time(5));
        d.plan_read(&mut io, OriginBlock(0), Time(5));
        d.plan_read(&mut io, OriginBlock(1), Time(5));
        d.finish(io);
        assert_eq!(d.counters().read_partial_hit_ios, 1);
    }

    /// The engine plans all-hit reads with `plan_read_hits`, the simulator
    /// with `plan_io`: the same stream must leave both directors alike.
    #[test]
    fn plan_read_hits_decides_as_plan_io() {
        // A pool of one, and of two volumes (the hits then feed the
        // sharing's hit curves too).
        for volumes in [1, 2] {
            plan_read_hits_as_plan_io(volumes);
        }
    }

    /// A volume's rate follows the pool's recent references, so a volume
    /// that has gone idle gives its space to one that is busy now, even
    /// if the idle one was busy for longer. (The curves' aging once
    /// counted down in pool references and wrapped below zero when the
    /// epochs did not divide the count: the curves never aged again, and
    /// the idle volume here kept 56 of the 64 blocks.)
    #[test]
    fn a_volume_gone_idle_gives_its_space_to_a_busy_one() {
        let cfg = DirectorConfig::new(64, 4096);
        let mut d = Director::new(&cfg).unwrap();
        d.attach_volume(VolumeId(1), cfg.mode, cfg.sequential_cutoff);
        let mut t = 0u64;
        // Each volume loops over 48 blocks: it needs 48 of the 64.
        for (v, refs) in [(0u16, 40_000u64), (1, 20_000)] {
            for i in 0..refs {
                let req = IoRequest {
                    volume: VolumeId(v),
                    offset: (i % 48) * 4096,
                    len: 4096,
                    access: Access::Read,
                    volume_size: u64::MAX,
                };
                d.plan_io(&req, Time(t), |_, _, _| {});
                t += 1;
            }
        }
        let (idle, busy) = (d.volume_target(VolumeId(0)), d.volume_target(VolumeId(1)));
        assert!(
            busy >= Some(48),
            "idle volume {idle:?}, busy volume {busy:?}"
        );
    }

    fn plan_read_hits_as_plan_io(volumes: u16) {
        let cfg = DirectorConfig::new(64, 4096);
        let (mut by_io, mut by_hits) = (Director::new(&cfg).unwrap(), Director::new(&cfg).unwrap());
        for v in 1..volumes {
            for d in [&mut by_io, &mut by_hits] {
                d.attach_volume(VolumeId(v), cfg.mode, cfg.sequential_cutoff);
            }
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut hit_ios = 0;
        for t in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Up to 3 blocks at a skewed place in 160 blocks.
            let first = (x % 160).min(x % 97);
            let len = 4096 * (1 + (x >> 40) % 3);
            let volume = VolumeId((x >> 20) as u16 % volumes);
            let req = IoRequest {
                volume,
                offset: first * 4096,
                len,
                access: Access::Read,
                volume_size: u64::MAX,
            };
            let now = Time(t * 1000);
            let mut plans = Vec::new();
            by_io.plan_io(&req, now, |_, _, p| plans.push(p));
            let slots: Option<Vec<CacheBlock>> = by_hits
                .blocks_of(req.offset, req.len)
                .map(|b| by_hits.read_hit_slot(OriginBlock::of(volume, b)))
                .collect();
            match slots {
                Some(slots) => {
                    hit_ios += 1;
                    by_hits.plan_read_hits(&req, now, &slots);
                    let hits: Vec<_> = slots
                        .iter()
                        .map(|&c| BlockPlan::Read(ReadPlan::Hit(c)))
                        .collect();
                    assert_eq!(plans, hits, "IO {t}");
                }
                None => {
                    let mut other = Vec::new();
                    by_hits.plan_io(&req, now, |_, _, p| other.push(p));
                    assert_eq!(plans, other, "IO {t}");
                }
            }
            assert_eq!(by_io.counters(), by_hits.counters(), "IO {t}");
        }
        assert!(hit_ios > 5_000, "only {hit_ios} all-hit IOs");
        let resident = |d: &Director| {
            let mut v = Vec::new();
            d.for_each_resident(&mut |o, c, dirty| v.push((o, c, dirty, d.hint(o))));
            v
        };
        assert_eq!(resident(&by_io), resident(&by_hits));
    }

    /// An LRU that logs what [`Replacement::observe`] is told.
    struct Observed {
        lru: crate::Lru,
        log: std::sync::Arc<std::sync::Mutex<Vec<(u64, bool)>>>,
    }

    impl Replacement for Observed {
        fn kind(&self) -> ReplacementKind {
            ReplacementKind::Lru
        }
        fn slots(&self) -> &crate::SlotTable {
            self.lru.slots()
        }
        fn observe(&mut self, oblock: OriginBlock, fills_on_miss: bool, _now: Time) {
            self.log.lock().unwrap().push((oblock.0, fills_on_miss));
        }
        fn touch(&mut self, oblock: OriginBlock, access: Access, now: Time) {
            self.lru.touch(oblock, access, now)
        }
        fn insert(&mut self, oblock: OriginBlock, now: Time) -> Option<Insertion> {
            self.lru.insert(oblock, now)
        }
        fn restore(&mut self, o: OriginBlock, c: CacheBlock, dirty: bool, hint: u8) -> bool {
            self.lru.restore(o, c, dirty, hint)
        }
        fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
            self.lru.remove(oblock)
        }
        fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
            self.lru.set_dirty(oblock, dirty)
        }
        fn peek_victim(&self) -> Option<OriginBlock> {
            self.lru.peek_victim()
        }
        fn memory_bytes(&self) -> usize {
            self.lru.memory_bytes()
        }
    }

    /// Every reference reaches `observe`, hits and misses, with whether a
    /// miss of it fills: the write misses that fill nothing too (a stream
    /// model that never saw them would take a write-heavy trace for a
    /// read-mostly one).
    #[test]
    fn every_reference_is_observed_with_whether_a_miss_fills() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let replacement = Box::new(Observed {
            lru: crate::Lru::new(16),
            log: log.clone(),
        });
        let cfg = DirectorConfig::new(16, 4096);
        let mut d = Director::from_parts(&cfg, replacement, Box::new(crate::AlwaysAdmit));
        let now = Time(0);
        let plan = |d: &mut Director, access, block: u64, full: bool| {
            let mut io = d.begin(VolumeId(0), block * 4096, 4096, access, now);
            let o = OriginBlock(block);
            match access {
                Access::Read => drop(d.plan_read(&mut io, o, now)),
                Access::Write => drop(d.plan_write(&mut io, o, full, now)),
            }
            d.finish(io);
        };
        plan(&mut d, Access::Read, 1, true); // a read miss, filled
        plan(&mut d, Access::Read, 1, true); // a read hit
        plan(&mut d, Access::Write, 2, false); // part of a block: no fill
        plan(&mut d, Access::Write, 3, true); // a whole block: filled
        plan(&mut d, Access::Write, 1, false); // a write hit
        assert_eq!(
            *log.lock().unwrap(),
            vec![(1, true), (1, true), (2, false), (3, true), (1, false)]
        );
        assert_eq!(d.counters().write_misses, 2);
        assert!(d.lookup(OriginBlock(3)).is_some() && d.lookup(OriginBlock(2)).is_none());
    }

    /// The default's fill gate through the director: a stream of 16-block
    /// writes never read back is, once the cache is full, mostly not
    /// filled in writethrough (its explorers never hit), always filled in
    /// writeback (which must absorb writes); a declined block written
    /// again soon, while the ghost remembers it, is filled.
    #[test]
    fn writes_never_read_back_are_declined_in_writethrough_not_in_writeback() {
        let capacity = 1024u32;
        let written = 64 * capacity as u64;
        let run = |mode: CacheMode| {
            let mut cfg = DirectorConfig::new(capacity, 4096);
            cfg.mode = mode;
            cfg.sequential_cutoff = 0;
            let mut d = Director::new(&cfg).unwrap();
            for i in 0..written / 16 {
                let req = IoRequest {
                    volume: VolumeId(0),
                    offset: i * 16 * 4096,
                    len: 16 * 4096,
                    access: Access::Write,
                    volume_size: u64::MAX,
                };
                d.plan_io(&req, Time(i), |_, _, _| {});
                if mode == CacheMode::WriteBack {
                    for (o, _) in d.dirty_blocks_unordered() {
                        d.mark_clean(o);
                    }
                }
            }
            d
        };
        let wt = run(CacheMode::WriteThrough);
        let wb = run(CacheMode::WriteBack);
        assert_eq!(wb.counters().promotions, written);
        assert_eq!(wb.counters().declined_fills, 0);
        // Every write missed; each was filled or declined.
        let k = wt.counters();
        assert_eq!(k.write_misses, written);
        assert_eq!(k.promotions + k.declined_fills, written);
        let filled = wt.counters().promotions;
        assert!(
            filled < written / 4,
            "writethrough filled {filled} of {written}"
        );
        // The last blocks written that were declined are in the ghost: a
        // second write of one is filled.
        let mut wt = wt;
        let declined = (written - 256..written)
            .find(|&b| wt.lookup(OriginBlock(b)).is_none())
            .expect("a declined block");
        let mut io = wt.begin(
            VolumeId(0),
            declined * 4096,
            16 * 4096,
            Access::Write,
            Time(0),
        );
        let plan = wt.plan_write(&mut io, OriginBlock(declined), true, Time(0));
        wt.finish(io);
        assert!(
            matches!(
                plan,
                WritePlan::Through {
                    allocated: true,
                    ..
                }
            ),
            "{plan:?}"
        );
    }

    /// A request's fill class says whether it continues its volume's
    /// previous request, whatever another volume did in between.
    #[test]
    fn the_fill_class_says_whether_a_request_continues_its_volumes_last() {
        let cfg = DirectorConfig::new(64, 4096);
        let mut d = Director::new(&cfg).unwrap();
        d.attach_volume(VolumeId(1), cfg.mode, cfg.sequential_cutoff);
        let class = |d: &mut Director, v: u16, offset: u64| {
            let io = d.begin(VolumeId(v), offset, 8192, Access::Read, Time(0));
            let class = io.class;
            d.finish(io);
            class
        };
        let (first, next) = (
            RequestClass::of(Access::Read, 2, false),
            RequestClass::of(Access::Read, 2, true),
        );
        assert_eq!(class(&mut d, 0, 0), first);
        assert_eq!(class(&mut d, 1, 1 << 20), first);
        assert_eq!(class(&mut d, 0, 8192), next, "volume 1 came between");
        assert_eq!(
            class(&mut d, 1, 1 << 20),
            first,
            "a re-read continues nothing"
        );
        assert_eq!(class(&mut d, 1, (1 << 20) + 8192), next);
        assert_eq!(class(&mut d, 0, 3 * 8192), first, "a gap");
    }

    #[test]
    fn rejects_bad_block_sizes() {
        for bs in [512u32, 3000, 2 << 20] {
            let cfg = DirectorConfig::new(8, bs);
            assert!(Director::new(&cfg).is_err(), "{bs}");
        }
    }
}
