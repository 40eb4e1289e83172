//! Client reads: planned under the director's lock, then served from
//! pinned cache slots and from the backing device in runs, promoting the
//! blocks the policy admits.

use crate::locks;
use crate::scratch::RunBuf;
use crate::slot_state::FillTicket;
use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::{Engine, EngineError, Result};
use smallvec::SmallVec;
use tiercache_device::BlockDevice;
use tiercache_policy::director::ReadPlan;
use tiercache_policy::BlockPlan;
use tiercache_policy::Director;
use tiercache_types::{Access, CacheBlock, Time};

/// Blocks an IO may touch before its per-block plans spill to the heap (a
/// 4 KiB IO touches one block, one of up to a block size two).
pub(crate) const INLINE_BLOCKS: usize = 4;

/// What to do with one block of a read, once planned.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadStep {
    /// Copy from this pinned slot.
    Cache(CacheBlock),
    /// Read the backing device.
    Backing,
    /// Read the backing device, then fill this slot (marked filling).
    Promote(CacheBlock, FillTicket),
}

impl Engine {
    /// Reads `buf.len()` bytes at `offset`. Offset and length must be
    /// multiples of 512 and inside the device.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_in(&self.first_volume(), offset, buf)
    }

    /// [`Engine::read`] on volume `vol`.
    pub(crate) fn read_in(&self, vol: &Volume, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        vol.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let blocks = vol.blocks_of(offset, len);
        let locked = self.locks.shared(vol.keys(blocks.clone()));
        self.verify_before_use(vol, blocks);
        self.read_locked(vol, offset, buf, locked, false)
            .expect("a read that may wait always runs")
    }

    /// [`Engine::read`], but only if it can be served at once: every block
    /// of the range is in the cache (a hit, not being filled) and no write
    /// holds it. Then the read is done, counted and returned exactly as
    /// `read` would; otherwise nothing happens (no counter, no policy
    /// change) and the result is None: call `read` (on a thread that may
    /// wait for the backing device). For front ends whose request thread
    /// must not wait on a slow device (a ublk queue, an NBD connection):
    /// a hit then costs no hand-off to a worker thread. It still reads the
    /// cache device synchronously.
    pub fn read_if_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<()>> {
        self.read_if_cached_in(&self.first_volume(), offset, buf)
    }

    /// [`Engine::read_if_cached`] on volume `vol`.
    pub(crate) fn read_if_cached_in(
        &self,
        vol: &Volume,
        offset: u64,
        buf: &mut [u8],
    ) -> Option<Result<()>> {
        let len = buf.len() as u64;
        if len == 0 || vol.check(offset, len).is_err() {
            return None;
        }
        let blocks = vol.blocks_of(offset, len);
        let locked = self.locks.try_shared(vol.keys(blocks))?;
        self.read_locked(vol, offset, buf, locked, true)
    }

    /// Plans the read of `offset..offset + len` on `vol` if every block of
    /// it is a read hit on a slot that holds its data (not being filled,
    /// not waiting for the check of a block restored after a crash:
    /// `verify.rs`): pins those slots and records the hits with the
    /// director ([`Director::plan_read_hits`], the decisions
    /// `plan_io` would take, one lookup per block). Returns the slots in
    /// block order; None, having changed nothing, when some block is no
    /// ready hit. Call with the range's stripes locked shared and the
    /// director locked (`d`); on Some, call [`Engine::count_ready_hits`]
    /// (after unlocking the director: the counters are atomics).
    pub(crate) fn plan_ready_hits(
        &self,
        vol: &Volume,
        d: &mut Director,
        offset: u64,
        len: u64,
        now: Time,
    ) -> Option<SmallVec<[CacheBlock; INLINE_BLOCKS]>> {
        let slots = vol
            .blocks_of(offset, len)
            .map(|b| {
                d.read_hit_slot(vol.key(b))
                    .filter(|&c| self.slots.is_ready(c) && !self.claims.is_unverified(c))
            })
            .collect::<Option<SmallVec<[CacheBlock; INLINE_BLOCKS]>>>()?;
        for &c in &slots {
            // Ready under the director, and only the director's holder
            // marks a slot filling: the pin holds.
            let pinned = self.slots.try_pin(c);
            assert!(pinned, "a ready slot refused its pin");
        }
        d.plan_read_hits(&vol.request(offset, len, Access::Read), now, &slots);
        Some(slots)
    }

    /// The step for one block of a read as the director planned it
    /// ([`Director::plan_io`]'s callback, under the director): a hit's
    /// slot pinned (the backing device if it is not ready), a promotion's
    /// slot handed to the filler.
    pub(crate) fn read_step(&self, plan: BlockPlan) -> ReadStep {
        let BlockPlan::Read(plan) = plan else {
            unreachable!("a read planned as a write")
        };
        match plan {
            ReadPlan::Hit(c) if self.slots.try_pin(c) => ReadStep::Cache(c),
            ReadPlan::Hit(_) | ReadPlan::Miss => ReadStep::Backing,
            ReadPlan::Promote(ins) => {
                self.slot_dropped(ins.evicted, ins.cblock);
                ReadStep::Promote(ins.cblock, self.slots.mark_filling(ins.cblock))
            }
        }
    }

    /// Counts a read planned by [`Engine::plan_ready_hits`] (its bytes as
    /// read; as hit bytes once read).
    pub(crate) fn count_ready_hits(&self, vol: &Volume, len: u64, now: Time) {
        IoCounters::add(&vol.io.read_bytes, len);
        self.note_client_io(now);
    }

    /// The read with the range's stripes locked shared. With
    /// `only_if_cached`, returns None, having changed nothing, unless every
    /// block is a ready hit (checked under the director, in the same
    /// critical section that plans the read, so the plan finds the same).
    fn read_locked(
        &self,
        vol: &Volume,
        offset: u64,
        buf: &mut [u8],
        _locked: locks::StripeGuard<'_>,
        only_if_cached: bool,
    ) -> Option<Result<()>> {
        if let Err(e) = vol.check_attached() {
            return Some(Err(e));
        }
        let len = buf.len() as u64;
        let blocks = vol.blocks_of(offset, len);
        let now = self.clock.now();
        let first = blocks.start;
        let mut steps: SmallVec<[ReadStep; INLINE_BLOCKS]> = SmallVec::new();
        if only_if_cached {
            let mut d = self.director.lock();
            let slots = self.plan_ready_hits(vol, &mut d, offset, len, now)?;
            drop(d);
            self.count_ready_hits(vol, len, now);
            steps = slots.into_iter().map(ReadStep::Cache).collect();
        } else {
            let mut d = self.director.lock();
            IoCounters::add(&vol.io.read_bytes, len);
            self.note_client_io(now);
            d.plan_io(
                &vol.request(offset, len, Access::Read),
                now,
                |_, _, plan| steps.push(self.read_step(plan)),
            );
        }

        let mut first_error = None;
        // 1. Cached blocks. A failed cache read of a clean block falls back
        //    to the backing device.
        for (i, step) in steps.iter_mut().enumerate() {
            let ReadStep::Cache(c) = *step else { continue };
            let b = first + i as u64;
            let (dev_off, buf_off, n) = vol.piece(b, offset, len);
            let within = dev_off - b * self.block_size;
            let r = self
                .cache
                .read_at(&mut buf[buf_off..buf_off + n], self.slot_offset(c) + within);
            self.slots.unpin(c);
            match r {
                Ok(()) => IoCounters::add(&vol.io.read_hit_bytes, n as u64),
                Err(e) => {
                    self.cache_error(&e, false);
                    let mut d = self.director.lock();
                    if d.is_dirty(vol.key(b)) {
                        first_error.get_or_insert(EngineError::CacheDirty {
                            device: self.cache.describe(),
                            source: e,
                        });
                    } else {
                        if d.lookup(vol.key(b)) == Some(c) {
                            d.invalidate(vol.key(b));
                            self.slot_dropped(Some(vol.key(b)), c);
                        }
                        *step = ReadStep::Backing;
                    }
                }
            }
        }
        // 2. Runs of blocks from the backing device, one IO per run.
        let mut i = 0;
        while i < steps.len() {
            if matches!(steps[i], ReadStep::Cache(_)) {
                i += 1;
                continue;
            }
            let mut j = i;
            let mut promotes = false;
            while j < steps.len() && !matches!(steps[j], ReadStep::Cache(_)) {
                promotes |= matches!(steps[j], ReadStep::Promote(..));
                j += 1;
            }
            let (b0, b1) = (first + i as u64, first + j as u64 - 1);
            if let Err(e) =
                self.read_backing_run(vol, (b0, b1), &steps[i..j], promotes, offset, buf)
            {
                first_error.get_or_insert(e);
            }
            i = j;
        }
        Some(match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        })
    }

    /// Reads blocks `b0..=b1` (none of them served from the cache) into the
    /// client's buffer and fills the slots of those being promoted.
    fn read_backing_run(
        &self,
        vol: &Volume,
        (b0, b1): (u64, u64),
        steps: &[ReadStep],
        promotes: bool,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let len = buf.len() as u64;
        let run_start = (b0 * self.block_size).max(offset);
        let run_end = (vol.block_span(b1).1).min(offset + len);
        if !promotes {
            let s = (run_start - offset) as usize;
            let e = (run_end - offset) as usize;
            return vol
                .backing
                .read_at(&mut buf[s..e], run_start)
                .map_err(|e| vol.backing_err(e, false));
        }
        // Promotions need whole blocks: read the run's full blocks once.
        let full_start = b0 * self.block_size;
        let full_end = vol.block_span(b1).1;
        let full = (full_end - full_start) as usize;
        let mut tmp = RunBuf::take(full);
        if let Err(e) = vol.backing.read_at(&mut tmp[..full], full_start) {
            for (k, step) in steps.iter().enumerate() {
                if let ReadStep::Promote(c, t) = *step {
                    self.end_fill(vol, b0 + k as u64, c, t, None);
                }
            }
            return Err(vol.backing_err(e, false));
        }
        let s = (run_start - full_start) as usize;
        let n = (run_end - run_start) as usize;
        let d = (run_start - offset) as usize;
        buf[d..d + n].copy_from_slice(&tmp[s..s + n]);
        for (k, step) in steps.iter().enumerate() {
            let ReadStep::Promote(c, t) = *step else {
                continue;
            };
            let b = b0 + k as u64;
            let (bs, be) = vol.block_span(b);
            // A failed fill only costs the promotion; the read succeeded.
            let _ = self.fill(
                vol,
                b,
                c,
                t,
                &tmp[(bs - full_start) as usize..(be - full_start) as usize],
            );
        }
        Ok(())
    }
}
