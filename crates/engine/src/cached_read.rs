//! A hit read by the front end itself (ublk's queues and NBD connections
//! read the cache device's fd through io_uring): the engine plans and
//! pins, the caller reads the pieces.

use crate::bypass_read::BypassRead;
use crate::locks;
use crate::read::INLINE_BLOCKS;
use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::Engine;
use smallvec::SmallVec;
use std::sync::Arc;
use tiercache_types::CacheBlock;

/// A cache hit being read by the caller (see [`Engine::begin_cached_read`]):
/// until it is finished or dropped, the range cannot be written and its
/// slots cannot be reused.
pub struct CachedRange<'a> {
    engine: &'a Engine,
    volume: Arc<Volume>,
    _locked: locks::StripeGuard<'a>,
    pinned: SmallVec<[CacheBlock; INLINE_BLOCKS]>,
    /// The cache device's file.
    pub fd: std::os::fd::RawFd,
    /// (offset on the cache device, offset in the caller's buffer, bytes),
    /// covering the whole range in buffer order; neighbours in both are
    /// one piece.
    pub pieces: Vec<(u64, usize, usize)>,
}

impl CachedRange<'_> {
    /// Ends the read with the outcome of reading every piece. Ok: the data
    /// is the block's (counted as hit bytes). Err: the error is counted as
    /// a cache read error and the caller must read the range again with
    /// [`Engine::read`], which handles the failing cache device (its
    /// data counts twice in `read_bytes` then).
    pub fn finish(self, result: std::io::Result<()>) -> std::io::Result<()> {
        match result {
            Ok(()) => {
                let n: usize = self.pieces.iter().map(|p| p.2).sum();
                IoCounters::add(&self.volume.io.read_hit_bytes, n as u64);
                Ok(())
            }
            Err(e) => {
                self.engine.cache_error(&e, false);
                Err(e)
            }
        }
    }
}

impl Drop for CachedRange<'_> {
    fn drop(&mut self) {
        for &c in &self.pinned {
            self.engine.slots.unpin(c);
        }
    }
}

/// A read a front end does itself ([`crate::VolumeHandle::begin_direct_read`]).
pub enum DirectPlan<'a> {
    /// Every block a ready hit: read from the cache device.
    Hit(CachedRange<'a>),
    /// A read that bypasses the cache: its pieces from either device.
    Bypass(BypassRead<'a>),
}

impl Engine {
    /// For a front end that reads the cache device itself (ublk's and
    /// NBD's io_uring): if `offset..offset + len` can be served at once (as for
    /// [`Engine::read_if_cached`]), plans and counts the read as `read`
    /// would and returns where the data is: the cache device's fd and the
    /// pieces to read into the caller's buffer. The range stays locked
    /// against writes and its slots pinned until the returned
    /// [`CachedRange`] is finished or dropped. None, having changed
    /// nothing, when the read cannot be served so, or the cache device has
    /// no fd to read ([`BlockDevice::raw_read_fd`](tiercache_device::BlockDevice::raw_read_fd)).
    pub fn begin_cached_read(&self, offset: u64, len: u64) -> Option<CachedRange<'_>> {
        self.begin_cached_read_in(self.first_volume(), offset, len)
    }

    /// [`Engine::begin_cached_read`] on volume `vol`.
    pub(crate) fn begin_cached_read_in(
        &self,
        vol: Arc<Volume>,
        offset: u64,
        len: u64,
    ) -> Option<CachedRange<'_>> {
        match self.begin_direct_read_in(vol, offset, len, false)? {
            DirectPlan::Hit(range) => Some(range),
            DirectPlan::Bypass(_) => unreachable!("a bypass was not asked for"),
        }
    }

    /// What a front end that reads the devices itself does with
    /// `offset..offset + len` on `vol`, decided under one stripe try and
    /// one director critical section: a hit ([`Engine::begin_cached_read`]);
    /// with `or_bypass`, else a read that surely bypasses the cache
    /// ([`Engine::begin_bypass_read`]); else None, having changed nothing.
    pub(crate) fn begin_direct_read_in(
        &self,
        vol: Arc<Volume>,
        offset: u64,
        len: u64,
        or_bypass: bool,
    ) -> Option<DirectPlan<'_>> {
        let fd = self.cache.raw_read_fd()?;
        if len == 0 || vol.check(offset, len).is_err() {
            return None;
        }
        let blocks = vol.blocks_of(offset, len);
        let locked = self.locks.try_shared(vol.keys(blocks.clone()))?;
        vol.check_attached().ok()?;
        let now = self.clock.now();
        let mut d = self.director.lock();
        let pinned = match self.plan_ready_hits(&vol, &mut d, offset, len, now) {
            Some(pinned) => pinned,
            None if or_bypass => {
                return self
                    .plan_bypass(vol, d, locked, offset, len, now)
                    .map(DirectPlan::Bypass)
            }
            None => return None,
        };
        drop(d);
        self.count_ready_hits(&vol, len, now);
        // One piece per run of blocks in consecutive slots: with small
        // blocks a large read is otherwise one device read per block.
        let mut pieces: Vec<(u64, usize, usize)> = Vec::with_capacity(pinned.len());
        for (b, &c) in blocks.zip(&pinned) {
            let (dev_off, buf_off, n) = vol.piece(b, offset, len);
            let at = self.slot_offset(c) + (dev_off - b * self.block_size);
            match pieces.last_mut() {
                Some(last) if last.0 + last.2 as u64 == at && last.1 + last.2 == buf_off => {
                    last.2 += n
                }
                _ => pieces.push((at, buf_off, n)),
            }
        }
        Some(DirectPlan::Hit(CachedRange {
            engine: self,
            volume: vol,
            _locked: locked,
            pinned,
            fd,
            pieces,
        }))
    }
}
