//! Writeback: dirty blocks copied to the backing device in runs, in
//! backing-device order, flushed, claimed clean, then marked clean.

use crate::claims;
use crate::director_lock::DirectorLock;
use crate::scratch::RunBuf;
use crate::stats::IoCounters;
use crate::{Engine, EngineError, Result};
use tiercache_device::BlockDevice;
use tiercache_policy::writeback::{choose_writeback, writeback_runs, MAX_WRITEBACK_RUN_BYTES};
use tiercache_policy::writeback_sweep::DirtySource;
use tiercache_types::{CacheBlock, OriginBlock};

impl Engine {
    /// Writes back up to `max_blocks` dirty blocks, in backing-device order,
    /// merging neighbours into one write, then flushes the backing device
    /// and marks them clean. Returns how many were cleaned.
    ///
    /// Which blocks: the next of the sweep over the dirty blocks
    /// (`tiercache_policy::writeback_sweep`, as the simulator's cleaner).
    pub fn clean(&self, max_blocks: usize) -> Result<usize> {
        let dirty = self
            .sweep
            .lock()
            .next_batch(max_blocks, &LockedDirector(&self.director));
        self.clean_sorted(dirty, max_blocks)
    }

    /// Cleans up to `max_blocks` of `dirty` in pool-key order (volume by
    /// volume, each in backing-device order), merging neighbours.
    pub(crate) fn clean_sorted(
        &self,
        dirty: Vec<(OriginBlock, CacheBlock)>,
        max_blocks: usize,
    ) -> Result<usize> {
        // Chosen (sorted: backing-device order) outside the director's lock.
        let dirty = choose_writeback(dirty, max_blocks);
        if dirty.is_empty() {
            return Ok(0);
        }
        let max_run = (MAX_WRITEBACK_RUN_BYTES / self.block_size).max(1) as usize;
        let mut cleaned = 0;
        let mut i = 0;
        for len in writeback_runs(&dirty, max_run) {
            cleaned += self.clean_run(&dirty[i..i + len])?;
            i += len;
        }
        Ok(cleaned)
    }

    /// Cleans one run of consecutive dirty blocks.
    fn clean_run(&self, run: &[(OriginBlock, CacheBlock)]) -> Result<usize> {
        // A run is one volume's (`clean` splits runs at volume changes).
        let vol = self.volume(run[0].0.volume())?;
        let b0 = run[0].0.block();
        let b1 = run[run.len() - 1].0.block();
        // Shared: no write may change these blocks until they are marked clean.
        let _locked = self.locks.shared(vol.keys(b0..b1 + 1));
        let mut still = Vec::with_capacity(run.len());
        {
            let d = self.director.lock();
            for &(o, c) in run {
                let ok = d.lookup(o) == Some(c) && d.is_dirty(o) && self.slots.try_pin(c);
                still.push(ok);
            }
        }
        let full_start = b0 * self.block_size;
        let full_end = vol.block_span(b1).1;
        let mut tmp = RunBuf::take((full_end - full_start) as usize);
        let mut read_ok = vec![false; run.len()];
        let mut first_error = None;
        for (k, &(o, c)) in run.iter().enumerate() {
            if !still[k] {
                continue;
            }
            let (bs, be) = vol.block_span(o.block());
            let r = self.cache.read_at(
                &mut tmp[(bs - full_start) as usize..(be - full_start) as usize],
                self.slot_offset(c),
            );
            self.slots.unpin(c);
            match r {
                Ok(()) => read_ok[k] = true,
                Err(e) => {
                    self.cache_error(&e, false);
                    first_error.get_or_insert(EngineError::CacheDirty {
                        device: self.cache.describe(),
                        source: e,
                    });
                }
            }
        }
        // Write each contiguous stretch of successfully read blocks.
        self.settle_zombies(vol.keys(b0..b1 + 1))?;
        let mut k = 0;
        while k < run.len() {
            if !read_ok[k] {
                k += 1;
                continue;
            }
            let mut m = k;
            while m < run.len() && read_ok[m] {
                m += 1;
            }
            let s = vol.block_span(run[k].0.block()).0;
            let e = vol.block_span(run[m - 1].0.block()).1;
            let r = vol.backing.write_at(
                &tmp[(s - full_start) as usize..(e - full_start) as usize],
                s,
            );
            if let Err(err) = r {
                first_error.get_or_insert(vol.backing_err(err, true));
                for ok in &mut read_ok[k..m] {
                    *ok = false;
                }
            } else {
                IoCounters::add(&vol.io.writeback_bytes, e - s);
            }
            k = m;
        }
        if read_ok.iter().any(|&x| x) {
            vol.backing.flush().map_err(|e| vol.backing_err(e, true))?;
            if self.persist.is_some() {
                // The dirty claims must be replaced on disk (by clean claims
                // of the data written back) before the blocks count as clean
                // and their slots may be reused. The stripe lock and the
                // dirty state keep the slots unchanged meanwhile, so the
                // claims cannot be dropped by the commit.
                // The checksums first: the director's lock, which every
                // IO takes, is not held while a run of up to 4 MiB is
                // checksummed.
                let crcs: Vec<Option<u32>> = run
                    .iter()
                    .enumerate()
                    .map(|(k, &(o, _))| {
                        read_ok[k].then(|| {
                            let (bs, be) = vol.block_span(o.block());
                            crc32c::crc32c(
                                &tmp[(bs - full_start) as usize..(be - full_start) as usize],
                            )
                        })
                    })
                    .collect();
                {
                    let d = self.director.lock();
                    for (k, &(o, c)) in run.iter().enumerate() {
                        if let Some(crc) = crcs[k] {
                            let gen = claims::generation(self.claims.load(c));
                            self.record_clean_claim(&d, o, c, gen, crc);
                            if self.claims.load(c) & claims::CLAIMED == 0 {
                                // Not claimable (cannot happen, see above):
                                // withdraw the dirty claim instead.
                                self.record(c, None);
                            }
                        }
                    }
                }
                self.commit()?;
            }
        }
        let mut cleaned = 0;
        {
            let mut d = self.director.lock();
            for (k, &(o, _)) in run.iter().enumerate() {
                if read_ok[k] {
                    d.mark_clean(o);
                    cleaned += 1;
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(cleaned),
        }
    }

    /// Writes back every dirty block, calling `progress(cleaned, total)` as
    /// it goes. Returns when no block is dirty.
    pub fn drain(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        let total = self.dirty_blocks();
        let mut done = 0;
        progress(0, total);
        loop {
            let n = self.clean(1024)?;
            if n == 0 {
                if self.dirty_blocks() == 0 {
                    break;
                }
                // Blocks were busy; let their writers finish.
                std::thread::yield_now();
                continue;
            }
            done += n as u64;
            progress(done, total.max(done));
        }
        Ok(())
    }
}

/// The director behind the engine's lock, as the sweep's source: each
/// call takes the lock once.
struct LockedDirector<'a>(&'a DirectorLock);

impl DirtySource for LockedDirector<'_> {
    fn dirty_unordered(&self) -> Vec<(OriginBlock, CacheBlock)> {
        self.0.lock().dirty_blocks_unordered()
    }
    fn retain_dirty(&self, blocks: &mut Vec<(OriginBlock, CacheBlock)>) {
        self.0.lock().retain_dirty(blocks)
    }
}
