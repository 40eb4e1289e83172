//! Lazy verification of the clean blocks restored after a crash.
//!
//! After an unclean shutdown, a clean claim is true or fails its crc
//! (`persist.rs`). Opening the cache no longer reads every claimed slot:
//! the blocks come back at once, marked UNVERIFIED (`claims.rs`), and each
//! is checked against its crc before it is first served or written in
//! place ([`Engine::verify_before_use`]), or by a background pass
//! ([`RestoreVerifier`], [`Engine::verify_restored`]), whichever comes
//! first. A block that fails is dropped from the cache (its claim is
//! withdrawn) and the IO that wanted it reads the backing device: **a block
//! whose crc does not match is never served as a hit**.
//!
//! The trade: the first start after a crash serves at once instead of
//! after reading every claimed slot; a first hit on a block not yet
//! checked costs one extra read of the slot, and the background pass
//! reads the slots while clients may be running. A clean shutdown checks
//! what is left first (the mapping it writes is trusted without a check).
//!
//! Every change of a slot's content or owner bumps its generation, which
//! ends UNVERIFIED (new content needs no check); a check acts only if the
//! generation it read is still current, so it never judges content that
//! changed under it.

use crate::claims;
use crate::volume::Volume;
use crate::Engine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::AlignedBuf;
use tiercache_types::{CacheBlock, OriginBlock};

/// The most one check reads at once.
const MAX_RUN_BYTES: u64 = 4 << 20;

/// What verification of the restored clean blocks has found so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreCheck {
    /// Blocks still waiting for their check.
    pub unverified: u64,
    /// Blocks whose slot matched the crc.
    pub verified: u64,
    /// Blocks dropped: the slot did not match (or could not be read).
    pub dropped: u64,
}

impl Engine {
    /// Progress of the check of the clean blocks restored after a crash.
    pub fn restore_check(&self) -> RestoreCheck {
        RestoreCheck {
            unverified: self.claims.unverified_count() as u64,
            verified: self.claims.verified.load(Ordering::Relaxed),
            dropped: self.claims.dropped.load(Ordering::Relaxed),
        }
    }

    /// Before an IO uses `blocks` of `vol` from the cache: checks those
    /// still unverified (dropping those that fail). Call with the blocks'
    /// stripes locked, so that no other IO of them plans in between.
    pub(crate) fn verify_before_use(&self, vol: &Volume, blocks: std::ops::Range<u64>) {
        if self.claims.unverified_count() == 0 {
            return;
        }
        let mut slots: Vec<u32> = {
            let d = self.director.lock();
            blocks
                .filter_map(|b| d.lookup(vol.key(b)))
                .filter(|&c| self.claims.is_unverified(c))
                .map(|c| c.0)
                .collect()
        };
        slots.sort_unstable();
        let max_run = (MAX_RUN_BYTES / self.block_size).max(1) as u32;
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 && slots[j] - slots[i] < max_run {
                j += 1;
            }
            self.verify_slots(slots[i], slots[j - 1] + 1);
            i = j;
        }
    }

    /// Checks the unverified slots among the next `max_bytes` worth of
    /// slots from where the last call stopped (the background pass).
    /// Returns how many slots are still unverified.
    pub fn verify_restored(&self, max_bytes: u64) -> usize {
        if self.claims.unverified_count() == 0 {
            return 0;
        }
        let capacity = self.slots.len() as u32;
        let step = (max_bytes.min(MAX_RUN_BYTES) / self.block_size).max(1) as u32;
        let first = self.claims.verify_cursor.load(Ordering::Relaxed) % capacity;
        let end = first.saturating_add(step).min(capacity);
        self.claims
            .verify_cursor
            .store(end % capacity, Ordering::Relaxed);
        self.verify_slots(first, end);
        self.claims.unverified_count()
    }

    /// Checks every restored block still unverified (two passes over the
    /// slots at most: one settles every slot it reaches, so a second only
    /// finishes what the first began mid-way).
    pub fn verify_all_restored(&self) -> RestoreCheck {
        let step = (MAX_RUN_BYTES / self.block_size).max(1) as usize;
        let runs = 2 * self.slots.len().div_ceil(step) + 1;
        for _ in 0..runs {
            if self.verify_restored(MAX_RUN_BYTES) == 0 {
                break;
            }
        }
        self.restore_check()
    }

    /// Checks the unverified slots in `first..end` (one read of the span
    /// from the first to the last of them): settles those that match their
    /// crc, drops from the cache those that do not.
    fn verify_slots(&self, first: u32, end: u32) {
        // Pinned under the director: the slots cannot be refilled while
        // they are read.
        let mut todo: Vec<(CacheBlock, OriginBlock, u32, u32)> = Vec::new();
        {
            let d = self.director.lock();
            for s in first..end {
                let c = CacheBlock(s);
                let Some((gen, crc)) = self.claims.expected(c) else {
                    continue;
                };
                let Some(o) = d.oblock_of(c) else { continue };
                if d.is_dirty(o) || !self.slots.try_pin(c) {
                    continue;
                }
                todo.push((c, o, gen, crc));
            }
        }
        let (Some(lo), Some(hi)) = (todo.first(), todo.last()) else {
            return;
        };
        let off = self.slot_offset(lo.0);
        let n = ((hi.0 .0 - lo.0 .0 + 1) as u64 * self.block_size)
            .min(self.cache.size().saturating_sub(off));
        let mut buf = AlignedBuf::new(n as usize);
        let read = self.cache.read_at(&mut buf[..n as usize], off);
        for t in &todo {
            self.slots.unpin(t.0);
        }
        if let Err(e) = &read {
            self.cache_error(e, false);
        }
        let matches = |c: CacheBlock, o: OriginBlock, crc: u32| {
            let Ok(vol) = self.volume(o.volume()) else {
                return false;
            };
            let (s, e) = vol.block_span(o.block());
            let at = (c.0 - lo.0 .0) as u64 * self.block_size;
            read.is_ok()
                && at + (e - s) <= n
                && crc32c::crc32c(&buf[at as usize..(at + e - s) as usize]) == crc
        };
        let results: Vec<bool> = todo.iter().map(|t| matches(t.0, t.1, t.3)).collect();
        let mut d = self.director.lock();
        for (&(c, o, gen, _), ok) in todo.iter().zip(results) {
            if ok {
                if self.claims.settle_verified(c, gen) {
                    self.claims.verified.fetch_add(1, Ordering::Relaxed);
                }
            } else if claims::generation(self.claims.load(c)) == gen
                && self.claims.load(c) & claims::UNVERIFIED != 0
                && d.lookup(o) == Some(c)
                && !d.is_dirty(o)
            {
                // The claim was stale (or unreadable): the block leaves the
                // cache, its claim is withdrawn (a zombie until that
                // commits), and its next read goes to the backing device.
                d.invalidate(o);
                self.slot_dropped(Some(o), c);
                self.claims.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A background thread that checks the restored clean blocks, a run at a
/// time, until none is left (then it ends), or until it is stopped.
pub struct RestoreVerifier {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RestoreVerifier {
    /// Starts checking `engine`'s restored blocks; does nothing when none
    /// waits.
    pub fn spawn(engine: Arc<Engine>) -> RestoreVerifier {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = (engine.claims.unverified_count() > 0).then(|| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("tiercache-verify".into())
                .spawn(move || {
                    let t = std::time::Instant::now();
                    while !stop.load(Ordering::SeqCst) {
                        if engine.verify_restored(MAX_RUN_BYTES) == 0 {
                            let r = engine.restore_check();
                            log::info!(
                                "restored clean blocks checked in {:.1} s: {} match their crc, {} dropped",
                                t.elapsed().as_secs_f64(),
                                r.verified,
                                r.dropped
                            );
                            break;
                        }
                    }
                })
                .expect("spawn the verification thread")
        });
        RestoreVerifier { stop, thread }
    }

    /// Stops the thread and waits for it (what is left is checked on use,
    /// or by a clean shutdown).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RestoreVerifier {
    fn drop(&mut self) {
        self.halt();
    }
}
