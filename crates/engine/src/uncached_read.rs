//! A read miss served by the front end itself (ublk's queues read the
//! backing device and write the promotion through io_uring): the engine
//! plans the read as [`Engine::read`] would, the caller does the device IO,
//! the engine ends it. No thread hand-off for a miss.
//!
//! Contract with the caller, in order:
//! 1. read [`UncachedRead::source`] into a scratch buffer aligned to 4096
//!    bytes;
//! 2. if that worked, copy the request's bytes out of the scratch buffer
//!    (they start at [`UncachedRead::data_at`]);
//! 3. if [`UncachedRead::fill`] is Some and [`UncachedRead::begin_fill`]
//!    says yes, write the scratch buffer's first `fill.2` bytes there;
//! 4. [`UncachedRead::finish`] with both outcomes.
//!
//! Until it is finished or dropped the block cannot be written (its stripe
//! is held shared) and its slot cannot be reused, on the thread that began
//! it: the guards belong to that thread. Nothing in it waits for another
//! request: the stripe is only tried, and so is the slot's fill lock
//! (`slot_state.rs`), so a caller that serves many requests on one thread
//! never waits for one of its own.

use crate::locks;
use crate::read::ReadStep;
use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::Engine;
use parking_lot::MutexGuard;
use std::os::fd::RawFd;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_types::Access;

/// A read miss of one cache block being served by the caller (see the
/// module documentation).
pub struct UncachedRead<'a> {
    engine: &'a Engine,
    volume: Arc<Volume>,
    _locked: locks::StripeGuard<'a>,
    /// The block read and what the director planned for it.
    block: u64,
    step: ReadStep,
    /// Bytes the client asked for.
    len: usize,
    /// The slot's fill lock, once [`UncachedRead::begin_fill`] took it.
    fill_guard: Option<MutexGuard<'a, ()>>,
    finished: bool,
    /// (fd, offset, bytes): what to read into the scratch buffer first
    /// (the backing device, or the cache device if the block turned out
    /// to be a hit).
    pub source: (RawFd, u64, usize),
    /// Where the client's bytes start in the scratch buffer.
    pub data_at: usize,
    /// (fd, offset, bytes): where a promotion writes the scratch buffer's
    /// first bytes (the block's slot on the cache device).
    pub fill: Option<(RawFd, u64, usize)>,
}

impl UncachedRead<'_> {
    /// Whether the caller may write the fill now: the slot is still this
    /// promotion's, no other fill holds its lock and no reader of the
    /// block evicted from it is still reading. No: the promotion is given
    /// up at [`UncachedRead::finish`] (the client's read still succeeds).
    pub fn begin_fill(&mut self) -> bool {
        let ReadStep::Promote(c, ticket) = self.step else {
            return false;
        };
        if self.fill_guard.is_none() {
            self.fill_guard = self.engine.slots.try_begin_fill(c, ticket);
        }
        self.fill_guard.is_some()
    }

    /// Ends the read. `read`: the outcome of reading the source; `fill`:
    /// of writing the fill (None if it was not written); `scratch`: the
    /// scratch buffer (the fill's checksum is taken from it). Ok: the
    /// client's bytes are the block's. Err: they are not (the error is
    /// counted); read the range with [`Engine::read`] instead.
    pub fn finish(
        mut self,
        read: std::io::Result<()>,
        fill: Option<std::io::Result<()>>,
        scratch: &[u8],
    ) -> std::io::Result<()> {
        self.finished = true;
        let (engine, vol) = (self.engine, &self.volume);
        if let Err(e) = read {
            if let ReadStep::Promote(c, ticket) = self.step {
                engine.end_fill(vol, self.block, c, ticket, None);
            }
            // Counted here, and again if the caller's `read` fails too (its
            // bytes count twice in `read_bytes` then, as for a failed
            // `CachedRange`).
            return Err(match self.step {
                ReadStep::Cache(_) => {
                    engine.cache_error(&e, false);
                    e
                }
                _ => std::io::Error::other(vol.backing_err(e, false)),
            });
        }
        match self.step {
            ReadStep::Cache(_) => IoCounters::add(&vol.io.read_hit_bytes, self.len as u64),
            ReadStep::Backing => {}
            ReadStep::Promote(c, ticket) => {
                let crc = match fill {
                    // (Only a fill written under the lock counts; a
                    // scratch buffer shorter than the fill gives it up.)
                    Some(Ok(())) if self.fill_guard.is_some() => {
                        let n = self.fill.map_or(0, |f| f.2);
                        scratch.get(..n).map(|data| match engine.persist {
                            Some(_) => crc32c::crc32c(data),
                            None => 0,
                        })
                    }
                    Some(Err(e)) => {
                        engine.cache_error(&e, true);
                        None
                    }
                    _ => None,
                };
                // Under the fill lock, as `Engine::fill` ends a fill.
                engine.end_fill(vol, self.block, c, ticket, crc);
            }
        }
        Ok(())
    }
}

impl Drop for UncachedRead<'_> {
    fn drop(&mut self) {
        match self.step {
            ReadStep::Cache(c) => self.engine.slots.unpin(c),
            ReadStep::Promote(c, ticket) if !self.finished => {
                self.engine
                    .end_fill(&self.volume, self.block, c, ticket, None);
            }
            _ => {}
        }
    }
}

impl Engine {
    /// For a front end that reads and writes the devices itself (ublk's
    /// io_uring): a read of `offset..offset + len` within one cache block
    /// that is not a ready hit, planned and counted as [`Engine::read`]
    /// would (a miss, a promotion, or a hit found since), with the IO left
    /// to the caller (see the module documentation). None, having changed
    /// nothing, when the range spans blocks, its stripe is locked for
    /// writing, its block waits for its check after a crash, a device has
    /// no fd ([`BlockDevice::raw_read_fd`]),
    /// or the range is not aligned for them: then call `read`.
    pub fn begin_uncached_read(&self, offset: u64, len: u64) -> Option<UncachedRead<'_>> {
        self.begin_uncached_read_in(self.first_volume(), offset, len)
    }

    /// [`Engine::begin_uncached_read`] on volume `vol`.
    pub(crate) fn begin_uncached_read_in(
        &self,
        vol: Arc<Volume>,
        offset: u64,
        len: u64,
    ) -> Option<UncachedRead<'_>> {
        let cache_fd = self.cache.raw_read_fd()?;
        let cache_write_fd = self.cache.raw_write_fd()?;
        let backing_fd = vol.backing.raw_read_fd()?;
        if len == 0 || vol.check(offset, len).is_err() {
            return None;
        }
        let align = vol.backing.alignment().max(self.cache.alignment());
        if offset % align != 0 || len % align != 0 {
            return None;
        }
        let blocks = vol.blocks_of(offset, len);
        if blocks.end - blocks.start != 1 {
            return None;
        }
        let b = blocks.start;
        let locked = self.locks.try_shared(vol.keys(blocks))?;
        vol.check_attached().ok()?;
        let now = self.clock.now();
        let mut step = None;
        {
            let mut d = self.director.lock();
            if self.claims.unverified_count() > 0
                && d.lookup(vol.key(b))
                    .is_some_and(|c| self.claims.is_unverified(c))
            {
                return None;
            }
            IoCounters::add(&vol.io.read_bytes, len);
            self.note_client_io(now);
            d.plan_io(
                &vol.request(offset, len, Access::Read),
                now,
                |_, _, plan| {
                    step = Some(self.read_step(plan));
                },
            );
        }
        let step = step.expect("a read of one block plans one step");
        let (block_start, block_end) = vol.block_span(b);
        let (source, data_at, fill) = match step {
            ReadStep::Cache(c) => {
                let within = offset - b * self.block_size;
                ((cache_fd, self.slot_offset(c) + within, len), 0, None)
            }
            ReadStep::Backing => ((backing_fd, offset, len), 0, None),
            ReadStep::Promote(c, _) => {
                let n = (block_end - block_start) as usize;
                (
                    (backing_fd, block_start, n as u64),
                    (offset - block_start) as usize,
                    Some((cache_write_fd, self.slot_offset(c), n)),
                )
            }
        };
        Some(UncachedRead {
            engine: self,
            volume: vol,
            _locked: locked,
            block: b,
            step,
            len: len as usize,
            fill_guard: None,
            finished: false,
            source: (source.0, source.1, source.2 as usize),
            data_at,
            fill,
        })
    }
}
