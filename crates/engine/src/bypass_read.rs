//! A read that bypasses the cache (a sequential stream past the cutoff, or
//! a volume in passthrough), read by the front end itself: ublk's queues
//! and NBD connections read the devices' fds through io_uring, as they do
//! hits, so a scan's requests need no worker thread and no copy.
//!
//! Such a read never promotes, so whatever it spans, each of its blocks is
//! read from where its data is: a cached block from its slot (it may be
//! dirty), any other straight from the backing device. The engine plans
//! and pins; the caller reads [`BypassRead::pieces`] into its buffer and
//! calls [`BypassRead::finish`]. Until then the range cannot be written
//! and its slots cannot be reused, on the thread that began it (the
//! stripe guard belongs to that thread). Nothing waits: the stripes are
//! only tried.

use crate::director_lock::DirectorGuard;
use crate::locks;
use crate::read::{ReadStep, INLINE_BLOCKS};
use crate::stats::IoCounters;
use crate::volume::Volume;
use crate::Engine;
use smallvec::SmallVec;
use std::os::fd::RawFd;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_types::{Access, CacheBlock, Time};

/// A bypassed read being served by the caller (see the module
/// documentation).
pub struct BypassRead<'a> {
    engine: &'a Engine,
    volume: Arc<Volume>,
    _locked: locks::StripeGuard<'a>,
    pinned: SmallVec<[CacheBlock; INLINE_BLOCKS]>,
    /// Bytes of the read that come from the cache device.
    hit_bytes: u64,
    /// (file, offset in it, offset in the caller's buffer, bytes),
    /// covering the whole range in buffer order; neighbouring blocks read
    /// from the backing device are one piece.
    pub pieces: Vec<(RawFd, u64, usize, usize)>,
}

impl BypassRead<'_> {
    /// Ends the read with the outcome of reading every piece. Ok: the
    /// caller's buffer holds the range. Err: it does not; read the range
    /// with [`Engine::read`] instead, which counts and handles the failing
    /// device (the range's bytes then count twice in `read_bytes`, as for
    /// a failed [`crate::CachedRange`]).
    pub fn finish(self, result: std::io::Result<()>) -> std::io::Result<()> {
        if result.is_ok() {
            IoCounters::add(&self.volume.io.read_hit_bytes, self.hit_bytes);
        }
        result
    }
}

impl Drop for BypassRead<'_> {
    fn drop(&mut self) {
        for &c in &self.pinned {
            self.engine.slots.unpin(c);
        }
    }
}

impl Engine {
    /// For a front end that reads the devices itself: a read of
    /// `offset..offset + len` that surely bypasses the cache
    /// ([`Director::read_never_promotes`]), planned and counted as
    /// [`Engine::read`] would, with the pieces to read left to the caller
    /// (see the module documentation). None, having changed nothing, when
    /// it may not bypass, its stripes are locked for writing, a block may
    /// wait for its check after a crash, a device has no fd, or the range
    /// is not aligned for them: then call `read`.
    ///
    /// [`Director::read_never_promotes`]: tiercache_policy::Director::read_never_promotes
    pub fn begin_bypass_read(&self, offset: u64, len: u64) -> Option<BypassRead<'_>> {
        self.begin_bypass_read_in(self.first_volume(), offset, len)
    }

    /// [`Engine::begin_bypass_read`] on volume `vol`.
    pub(crate) fn begin_bypass_read_in(
        &self,
        vol: Arc<Volume>,
        offset: u64,
        len: u64,
    ) -> Option<BypassRead<'_>> {
        if len == 0 || vol.check(offset, len).is_err() {
            return None;
        }
        let locked = self
            .locks
            .try_shared(vol.keys(vol.blocks_of(offset, len)))?;
        vol.check_attached().ok()?;
        let now = self.clock.now();
        self.plan_bypass(vol, self.director.lock(), locked, offset, len, now)
    }

    /// Plans a read of `offset..offset + len` on `vol` (checked, its
    /// stripes `locked` shared) that surely bypasses the cache, under the
    /// director `d` (released before it returns); None, having changed
    /// nothing, if it may not bypass or cannot be served so (see
    /// [`Engine::begin_bypass_read`]).
    pub(crate) fn plan_bypass<'e>(
        &'e self,
        vol: Arc<Volume>,
        mut d: DirectorGuard<'e>,
        locked: locks::StripeGuard<'e>,
        offset: u64,
        len: u64,
        now: Time,
    ) -> Option<BypassRead<'e>> {
        let cache_fd = self.cache.raw_read_fd()?;
        let backing_fd = vol.backing.raw_read_fd()?;
        let align = vol.backing.alignment().max(self.cache.alignment());
        if offset % align != 0 || len % align != 0 || self.claims.unverified_count() > 0 {
            return None;
        }
        if !d.read_never_promotes(vol.id, offset, len, now) {
            return None;
        }
        IoCounters::add(&vol.io.read_bytes, len);
        self.note_client_io(now);
        let mut steps: SmallVec<[(u64, ReadStep); INLINE_BLOCKS]> = SmallVec::new();
        d.plan_io(
            &vol.request(offset, len, Access::Read),
            now,
            |b, _, plan| steps.push((b, self.read_step(plan))),
        );
        drop(d);
        let mut read = BypassRead {
            engine: self,
            volume: vol,
            _locked: locked,
            pinned: SmallVec::new(),
            hit_bytes: 0,
            pieces: Vec::with_capacity(1),
        };
        for (b, step) in steps {
            let (dev_off, buf_off, n) = read.volume.piece(b, offset, len);
            match step {
                ReadStep::Cache(c) => {
                    read.pinned.push(c);
                    read.hit_bytes += n as u64;
                    let within = dev_off - b * self.block_size;
                    read.pieces
                        .push((cache_fd, self.slot_offset(c) + within, buf_off, n));
                }
                ReadStep::Backing | ReadStep::Promote(..) => {
                    if let ReadStep::Promote(c, ticket) = step {
                        // Not planned for a read that never promotes; if
                        // it were, the promotion is given up, as a failed
                        // fill's (the director is released by now).
                        debug_assert!(false, "a bypassed read promoted block {b}");
                        self.end_fill(&read.volume, b, c, ticket, None);
                    }
                    match read.pieces.last_mut() {
                        Some((fd, at, into, m))
                            if *fd == backing_fd
                                && *into + *m == buf_off
                                && *at + *m as u64 == dev_off =>
                        {
                            *m += n;
                        }
                        _ => read.pieces.push((backing_fd, dev_off, buf_off, n)),
                    }
                }
            }
        }
        Some(read)
    }
}
