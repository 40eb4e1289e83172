//! Client writes, write-zeroes and trims: planned under the director's
//! lock, then cache slots written in place before the backing device,
//! backing runs, and fills of newly allocated slots (the order `claims.rs`
//! needs for crash safety).

use crate::claims;
use crate::read::INLINE_BLOCKS;
use crate::slot_state::FillTicket;
use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::{Engine, EngineError, Result};
use smallvec::SmallVec;
use tiercache_device::BlockDevice;
use tiercache_policy::director::WritePlan;
use tiercache_policy::BlockPlan;
use tiercache_types::{Access, CacheBlock};

/// What to do with one block of a write, once planned.
#[derive(Clone, Copy, Debug)]
struct WriteStep {
    backing: bool,
    /// The slot to write, pinned (existing mapping) or filling (allocated,
    /// with its ticket).
    cache: Option<CacheBlock>,
    ticket: Option<FillTicket>,
    /// The block was clean and this write makes it dirty in place.
    newly_dirty: bool,
}

impl Engine {
    /// Writes `data` at `offset`. With `fua`, the data is durable when this
    /// returns. Offset and length must be multiples of 512 and inside the
    /// device.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_in(&self.first_volume(), offset, data, fua)
    }

    /// [`Engine::write`] on volume `vol`.
    pub(crate) fn write_in(&self, vol: &Volume, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let len = data.len() as u64;
        vol.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        IoCounters::add(&vol.io.write_bytes, len);
        let blocks = vol.blocks_of(offset, len);
        let _locked = self.locks.exclusive(vol.keys(blocks.clone()));
        vol.check_attached()?;
        // A block restored after a crash is checked before it is written in
        // place (a partial write would keep its unchecked rest).
        self.verify_before_use(vol, blocks.clone());
        let now = self.clock.now();
        self.note_client_io(now);
        let first = blocks.start;
        let mut steps: SmallVec<[WriteStep; INLINE_BLOCKS]> = SmallVec::new();
        {
            let mut d = self.director.lock();
            // A mapped slot found not ready (cannot happen: the block's
            // stripe is held exclusively, so no fill of it is under way).
            let mut not_ready = Vec::new();
            d.plan_io(
                &vol.request(offset, len, Access::Write),
                now,
                |b, before, plan| {
                    let BlockPlan::Write(plan) = plan else {
                        unreachable!("a write planned as a read")
                    };
                    let step = match plan {
                        WritePlan::Backing => {
                            if let Some(c) = before.cached {
                                // Passthrough dropped the clean cached copy.
                                self.slot_dropped(Some(vol.key(b)), c);
                            }
                            WriteStep {
                                backing: true,
                                cache: None,
                                ticket: None,
                                newly_dirty: false,
                            }
                        }
                        WritePlan::Through {
                            cblock,
                            allocated,
                            evicted,
                        }
                        | WritePlan::Dirty {
                            cblock,
                            allocated,
                            evicted,
                        } => {
                            // Through: the block stays clean, so the backing
                            // device gets the data too; Dirty: the cache only.
                            let backing = matches!(plan, WritePlan::Through { .. });
                            if allocated {
                                self.slot_dropped(evicted, cblock);
                                WriteStep {
                                    backing,
                                    cache: Some(cblock),
                                    ticket: Some(self.slots.mark_filling(cblock)),
                                    newly_dirty: false,
                                }
                            } else if self.slots.try_pin(cblock) {
                                WriteStep {
                                    backing,
                                    cache: Some(cblock),
                                    ticket: None,
                                    newly_dirty: !backing && !before.dirty,
                                }
                            } else {
                                debug_assert!(
                                    false,
                                    "mapped slot of an exclusively locked block not ready"
                                );
                                not_ready.push((b, cblock));
                                WriteStep {
                                    backing: true,
                                    cache: None,
                                    ticket: None,
                                    newly_dirty: false,
                                }
                            }
                        }
                    };
                    steps.push(step);
                },
            );
            for (b, cblock) in not_ready {
                d.invalidate(vol.key(b));
                self.slot_dropped(Some(vol.key(b)), cblock);
            }
        }

        let mut first_error = None;
        // 1. Cache writes in place, into pinned slots, before the backing
        //    device (rule 2 of claims.rs) and before any fill (this thread
        //    never waits for a fill while holding pins).
        let mut flush_before_backing = false;
        for (k, step) in steps.iter_mut().enumerate() {
            let (Some(c), None) = (step.cache, step.ticket) else {
                continue;
            };
            let b = first + k as u64;
            let (dev_off, buf_off, n) = vol.piece(b, offset, len);
            let within = dev_off - b * self.block_size;
            let prev = self.claims.bump(c);
            let durable = prev & claims::DURABLE != 0;
            let r = self
                .cache
                .write_at(&data[buf_off..buf_off + n], self.slot_offset(c) + within);
            self.slots.unpin(c);
            match r {
                Ok(()) if step.newly_dirty => {
                    let d = self.director.lock();
                    if d.lookup(vol.key(b)) == Some(c) {
                        let e = self.dirty_entry(&d, vol.key(b));
                        self.record(c, Some(e));
                    }
                }
                Ok(()) => {
                    if durable && step.backing {
                        flush_before_backing = true;
                        // Withdraw the old claim, so later writes need no
                        // flush; the block stays cached, unclaimed.
                        let d = self.director.lock();
                        if d.lookup(vol.key(b)) == Some(c) {
                            self.record(c, None);
                        }
                    }
                }
                Err(e) => {
                    self.cache_error(&e, true);
                    if step.backing {
                        // Writethrough: the backing device gets the data;
                        // drop the now stale cached copy.
                        let mut d = self.director.lock();
                        if d.lookup(vol.key(b)) == Some(c) {
                            d.invalidate(vol.key(b));
                            self.slot_dropped(Some(vol.key(b)), c);
                        }
                        step.cache = None;
                    } else {
                        first_error.get_or_insert(EngineError::CacheDirty {
                            device: self.cache.describe(),
                            source: e,
                        });
                    }
                }
            }
        }
        if flush_before_backing {
            if let Err(e) = self.cache.flush() {
                // Counted; the cache is taken out of use after repeated
                // errors. A crash now could leave an old clean claim that
                // still verifies: the price of a failing cache device.
                self.cache_error(&e, true);
            }
        }
        // 2. Backing writes, one IO per run of consecutive blocks, once no
        //    block of the IO is a zombie (rule 3 of claims.rs).
        if steps.iter().any(|s| s.backing) {
            self.settle_zombies(vol.keys(blocks.clone()))?;
        }
        let mut i = 0;
        while i < steps.len() {
            if !steps[i].backing {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < steps.len() && steps[j].backing {
                j += 1;
            }
            let (s, _, _) = vol.piece(first + i as u64, offset, len);
            let (ls, _, ln) = vol.piece(first + j as u64 - 1, offset, len);
            let e = ls + ln as u64;
            let r = vol
                .backing
                .write_at(&data[(s - offset) as usize..(e - offset) as usize], s);
            if let Err(err) = r {
                first_error.get_or_insert(vol.backing_err(err, true));
                // The backing range is now undefined; do not leave a cached
                // copy that claims otherwise.
                for (k, step) in steps[i..j].iter_mut().enumerate() {
                    let Some(c) = step.cache.take() else { continue };
                    let b = first + (i + k) as u64;
                    match step.ticket {
                        Some(t) => self.end_fill(vol, b, c, t, None),
                        None => {
                            let mut d = self.director.lock();
                            if d.lookup(vol.key(b)) == Some(c) {
                                d.invalidate(vol.key(b));
                                self.slot_dropped(Some(vol.key(b)), c);
                            }
                        }
                    }
                }
            }
            i = j;
        }
        // 3. Fills of newly allocated slots (the write covers each block).
        for (k, step) in steps.iter().enumerate() {
            let (Some(c), Some(t)) = (step.cache, step.ticket) else {
                continue;
            };
            let b = first + k as u64;
            let (dev_off, buf_off, n) = vol.piece(b, offset, len);
            let piece = &data[buf_off..buf_off + n];
            if self.fill(vol, b, c, t, piece).is_err() && !step.backing {
                // Writeback allocation failed (the promotion is undone): put
                // the data on the backing device instead.
                self.settle_zombies(vol.keys(b..b + 1))?;
                if let Err(e) = vol.backing.write_at(piece, dev_off) {
                    first_error.get_or_insert(vol.backing_err(e, true));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        if fua {
            self.flush_in(vol)?;
        } else if steps
            .iter()
            .any(|s| s.newly_dirty || (s.ticket.is_some() && !s.backing))
        {
            // Writeback: a block this write made dirty (a clean cached
            // block written in place, or a new slot) has its dirty claim
            // committed before the write is acknowledged. The client may
            // never flush, and a server killed now must not forget that the
            // cache holds the only copy: the next server would read the old
            // contents from the backing device under a file system that
            // still runs and trusts them (docs/RESTART.md). Writes to blocks
            // already dirty commit nothing; concurrent writers share one
            // commit.
            self.commit()?;
        }
        Ok(())
    }

    /// Writes zeros over the range, like a write of a zero buffer.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.write_zeroes_in(&self.first_volume(), offset, len, fua)
    }

    /// [`Engine::write_zeroes`] on volume `vol`.
    pub(crate) fn write_zeroes_in(
        &self,
        vol: &Volume,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> Result<()> {
        vol.check(offset, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write_in(vol, offset + done, &zeros[..n as usize], false)?;
            done += n;
        }
        if fua {
            self.flush_in(vol)?;
        }
        Ok(())
    }

    /// Says the range's contents are no longer needed. Whole cached blocks
    /// in it are dropped from the cache (dirty data included); the range is
    /// discarded on the backing device. Reads of it return unspecified data
    /// until it is written again.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.trim_in(&self.first_volume(), offset, len)
    }

    /// [`Engine::trim`] on volume `vol`.
    pub(crate) fn trim_in(&self, vol: &Volume, offset: u64, len: u64) -> Result<()> {
        vol.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        IoCounters::add(&vol.io.trims, 1);
        let blocks = vol.blocks_of(offset, len);
        let _locked = self.locks.exclusive(vol.keys(blocks.clone()));
        vol.check_attached()?;
        let mut withdrew_dirty = false;
        {
            let mut d = self.director.lock();
            for b in blocks {
                let (bs, be) = vol.block_span(b);
                if offset <= bs && offset + len >= be {
                    let dirty = d.is_dirty(vol.key(b));
                    if let Some(c) = d.invalidate(vol.key(b)) {
                        self.slot_dropped(Some(vol.key(b)), c);
                        if dirty {
                            // Withdraw the dirty claim; until that commits,
                            // a crash may bring back old data for a range
                            // that was trimmed, which trim allows (the
                            // commit below ends that before the trim is
                            // acknowledged).
                            self.record(c, None);
                            withdrew_dirty = true;
                        }
                    }
                }
            }
        }
        self.settle_zombies(vol.keys(vol.blocks_of(offset, len)))?;
        match vol.backing.discard(offset, len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            Err(e) => return Err(vol.backing_err(e, true)),
        }
        if withdrew_dirty {
            // Once the trim is acknowledged, a write to part of a trimmed
            // block goes to the backing device only; a dirty claim that a
            // killed server left durable would then bring the old cached
            // data back over it. So the withdrawal commits first, as a
            // write's new dirty claim does.
            self.commit()?;
        }
        Ok(())
    }
}
