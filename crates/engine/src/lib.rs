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

mod claims;
mod cleaner;
mod error;
mod locks;
mod persist;
mod slot_state;
mod stats;

pub use cleaner::{Cleaner, CleanerConfig, RateController};
pub use error::{EngineError, Result};
pub use persist::{OpenOptions, OpenReport};
pub use stats::EngineStats;

use locks::StripeLocks;
use parking_lot::Mutex;
use slot_state::{FillTicket, SlotStates};
use stats::IoCounters;
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_policy::director::{ReadPlan, WritePlan};
use tiercache_policy::{Director, DirectorConfig, PolicyConfig};
use tiercache_types::{Access, CacheBlock, CacheMode, Clock, OriginBlock, Time, SECTOR_SIZE};

/// How to build an engine.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    pub mode: CacheMode,
    /// Cache block size in bytes: a power of two from 4 KiB to 1 MiB.
    pub block_size: u32,
    /// Sequential cutoff in bytes (bcache's default 4 MiB); 0 disables.
    pub sequential_cutoff: u64,
    pub policy: PolicyConfig,
    /// Byte offset of cache slot 0 on the cache device; the space before it
    /// belongs to the metadata.
    pub cache_data_offset: u64,
    /// Use at most this many cache blocks (default: all that fit).
    pub max_cache_blocks: Option<u32>,
    /// Cache device errors tolerated before the cache is taken out of use.
    pub cache_error_limit: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mode: CacheMode::WriteThrough,
            block_size: 64 * 1024,
            sequential_cutoff: 4 << 20,
            policy: PolicyConfig::default(),
            cache_data_offset: 0,
            max_cache_blocks: None,
            cache_error_limit: 16,
        }
    }
}

/// A cache hit being read by the caller (see [`Engine::begin_cached_read`]):
/// until it is finished or dropped, the range cannot be written and its
/// slots cannot be reused.
pub struct CachedRange<'a> {
    engine: &'a Engine,
    _locked: locks::StripeGuard<'a>,
    pinned: Vec<CacheBlock>,
    /// The cache device's file.
    pub fd: std::os::fd::RawFd,
    /// (offset on the cache device, offset in the caller's buffer, bytes),
    /// covering the whole range in buffer order.
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
                IoCounters::add(&self.engine.io.read_hit_bytes, n as u64);
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

thread_local! {
    /// A cleaning thread's buffer for runs of blocks, kept between runs: a
    /// fresh one (up to 4 MiB) per run would cost its page faults and
    /// zeroing every time.
    static RUN_BUF: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// The thread's run buffer while a run is cleaned; back in [`RUN_BUF`]
/// when dropped (early returns included).
struct RunBuf(Option<AlignedBuf>);

impl RunBuf {
    /// The thread's buffer, grown to at least `len` bytes (its bytes are
    /// whatever the last run left there).
    fn take(len: usize) -> RunBuf {
        let buf = RUN_BUF
            .with(|b| b.take())
            .filter(|b| b.len() >= len)
            .unwrap_or_else(|| AlignedBuf::new(len));
        RunBuf(Some(buf))
    }
}

impl std::ops::Deref for RunBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        self.0.as_ref().expect("present until dropped")
    }
}

impl std::ops::DerefMut for RunBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.0.as_mut().expect("present until dropped")
    }
}

impl Drop for RunBuf {
    fn drop(&mut self) {
        let buf = self.0.take();
        RUN_BUF.with(|b| b.set(buf));
    }
}

/// What to do with one block of a read, once planned.
#[derive(Clone, Copy, Debug)]
enum ReadStep {
    /// Copy from this pinned slot.
    Cache(CacheBlock),
    /// Read the backing device.
    Backing,
    /// Read the backing device, then fill this slot (marked filling).
    Promote(CacheBlock, FillTicket),
}

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

/// A block cache over a backing and a cache device.
pub struct Engine {
    backing: Arc<dyn BlockDevice>,
    cache: Arc<dyn BlockDevice>,
    size: u64,
    block_size: u64,
    data_offset: u64,
    director: Mutex<Director>,
    policy_name: String,
    locks: StripeLocks,
    slots: SlotStates,
    /// Crash-survival state of clean claims (see `claims.rs`).
    claims: claims::Claims,
    /// Where [`Engine::reclaim`] goes on.
    reclaim_cursor: std::sync::atomic::AtomicU32,
    clock: Arc<dyn Clock>,
    io: IoCounters,
    cache_failure: Mutex<Option<String>>,
    cache_error_limit: u64,
    /// Time of the last client read or write, in clock nanoseconds.
    last_client_io: std::sync::atomic::AtomicU64,
    /// Metadata on the cache device; `None` for a volatile cache.
    persist: Option<persist::Persistence>,
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
        if backing.size() % SECTOR_SIZE != 0 {
            return Err(EngineError::Config(format!(
                "backing device {} is {} bytes, not a multiple of 512",
                backing.describe(),
                backing.size()
            )));
        }
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
        };
        let director = Director::new(&dcfg).map_err(|e| EngineError::Config(e.to_string()))?;
        Ok(Engine {
            size: backing.size(),
            backing,
            cache,
            block_size: bs,
            data_offset: config.cache_data_offset,
            director: Mutex::new(director),
            policy_name: config.policy.to_string(),
            locks: StripeLocks::new(),
            slots: SlotStates::new(capacity),
            claims: claims::Claims::new(capacity),
            reclaim_cursor: std::sync::atomic::AtomicU32::new(0),
            clock,
            io: IoCounters::default(),
            cache_failure: Mutex::new(None),
            cache_error_limit: config.cache_error_limit,
            last_client_io: std::sync::atomic::AtomicU64::new(0),
            persist: None,
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

    /// Size of the exported device in bytes (the backing device's size).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn block_size(&self) -> u32 {
        self.block_size as u32
    }

    /// Cache size in blocks.
    pub fn capacity(&self) -> u32 {
        self.director.lock().replacement().capacity()
    }

    pub fn mode(&self) -> CacheMode {
        self.director.lock().mode()
    }

    /// RAM used per cache block by the mapping, policy and slot states.
    pub fn memory_bytes_per_block(&self) -> f64 {
        let d = self.director.lock();
        let r = d.replacement();
        (r.memory_bytes() + self.slots.memory_bytes() + self.claims.memory_bytes()) as f64
            / r.capacity() as f64
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
        self.director.lock().set_mode(mode);
        self.persist_mode(mode)
    }

    pub fn set_sequential_cutoff(&self, bytes: u64) {
        self.director.lock().set_sequential_cutoff(bytes);
    }

    /// A snapshot of all counters. Takes the director's lock briefly.
    pub fn stats(&self) -> EngineStats {
        let (decisions, mode, cutoff) = {
            let d = self.director.lock();
            (d.counters(), d.mode(), d.sequential_cutoff())
        };
        let io = EngineStats::io_part(&self.io);
        EngineStats {
            mode,
            policy: self.policy_name.clone(),
            block_size: self.block_size as u32,
            sequential_cutoff: cutoff,
            cache_state: match &*self.cache_failure.lock() {
                None => "ok".to_string(),
                Some(r) => format!("failed: {r}"),
            },
            backing_bytes: self.size,
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
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset % SECTOR_SIZE != 0 || len % SECTOR_SIZE != 0 {
            return Err(EngineError::Misaligned { offset, len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(EngineError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.block_size..(offset + len).div_ceil(self.block_size)
    }

    /// Byte range of origin block `b` on the backing device (the last block
    /// may be short).
    fn block_span(&self, b: u64) -> (u64, u64) {
        let start = b * self.block_size;
        (start, (start + self.block_size).min(self.size))
    }

    fn slot_offset(&self, c: CacheBlock) -> u64 {
        self.data_offset + c.0 as u64 * self.block_size
    }

    /// The part of block `b` that the IO [offset, offset+len) covers, as
    /// (device offset, offset into the IO buffer, length).
    fn piece(&self, b: u64, offset: u64, len: u64) -> (u64, usize, usize) {
        let (bstart, bend) = self.block_span(b);
        let start = bstart.max(offset);
        let end = bend.min(offset + len);
        (start, (start - offset) as usize, (end - start) as usize)
    }

    pub(crate) fn backing_err(&self, e: std::io::Error, write: bool) -> EngineError {
        let c = if write {
            &self.io.backing_write_errors
        } else {
            &self.io.backing_read_errors
        };
        IoCounters::add(c, 1);
        EngineError::Backing {
            device: self.backing.describe(),
            source: e,
        }
    }

    /// Counts a cache device error and takes the cache out of use once
    /// there were too many.
    pub(crate) fn cache_error(&self, e: &std::io::Error, write: bool) {
        let c = if write {
            &self.io.cache_write_errors
        } else {
            &self.io.cache_read_errors
        };
        IoCounters::add(c, 1);
        let total = self
            .io
            .cache_read_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            + self
                .io
                .cache_write_errors
                .load(std::sync::atomic::Ordering::Relaxed);
        log::warn!(
            "cache device {}: {} error: {e}",
            self.cache.describe(),
            if write { "write" } else { "read" }
        );
        if total >= self.cache_error_limit {
            let mut failure = self.cache_failure.lock();
            if failure.is_none() {
                let reason = format!("{total} IO errors, last: {e}");
                log::error!(
                    "cache device {} taken out of use ({reason}); serving from the backing device",
                    self.cache.describe()
                );
                *failure = Some(reason);
                self.director.lock().set_mode(CacheMode::PassThrough);
            }
        }
    }

    /// Finishes the fill of slot `c` for block `b`: ready if the ticket is
    /// current, the slot still holds `b` and the fill worked; the promotion
    /// is undone if it failed. A stale ticket changes nothing.
    /// `crc` is the crc32c of the data written (`None`: the fill failed).
    fn end_fill(&self, b: u64, c: CacheBlock, ticket: FillTicket, crc: Option<u32>) {
        let mut d = self.director.lock();
        if self.slots.is_current(c, ticket) && d.replacement().lookup(OriginBlock(b)) == Some(c) {
            if let Some(crc) = crc {
                self.slots.mark_ready(c, ticket);
                if d.replacement().is_dirty(OriginBlock(b)) {
                    let e = self.dirty_entry(&d, OriginBlock(b));
                    self.record(c, Some(e));
                } else {
                    // Nothing wrote the slot since it was handed over (the
                    // fill's generation bump): its generation is the fill's.
                    let gen = claims::generation(self.claims.load(c));
                    self.record_clean_claim(&d, OriginBlock(b), c, gen, crc);
                }
            } else {
                d.abort_promotion(OriginBlock(b));
            }
        }
    }

    /// Fills slot `c` with `data` for block `b`, then ends the fill.
    /// Returns the cache device's error, if any (already counted).
    fn fill(&self, b: u64, c: CacheBlock, ticket: FillTicket, data: &[u8]) -> std::io::Result<()> {
        let Some(_guard) = self.slots.begin_fill(c, ticket) else {
            // The block was evicted before its fill began: nothing to do.
            return Ok(());
        };
        let r = self.cache.write_at(data, self.slot_offset(c));
        if let Err(e) = &r {
            self.cache_error(e, true);
        }
        let crc = match (&r, self.persist.is_some()) {
            (Ok(()), true) => Some(crc32c::crc32c(data)),
            (Ok(()), false) => Some(0),
            (Err(_), _) => None,
        };
        self.end_fill(b, c, ticket, crc);
        r
    }

    /// Reads `buf.len()` bytes at `offset`. Offset and length must be
    /// multiples of 512 and inside the device.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let blocks = self.blocks_of(offset, len);
        let locked = self.locks.shared(blocks.clone());
        self.read_locked(offset, buf, locked, false)
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
        let len = buf.len() as u64;
        if len == 0 || self.check(offset, len).is_err() {
            return None;
        }
        let blocks = self.blocks_of(offset, len);
        let locked = self.locks.try_shared(blocks)?;
        self.read_locked(offset, buf, locked, true)
    }

    /// For a front end that reads the cache device itself (ublk's
    /// io_uring): if `offset..offset + len` can be served at once (as for
    /// [`Engine::read_if_cached`]), plans and counts the read as `read`
    /// would and returns where the data is: the cache device's fd and the
    /// pieces to read into the caller's buffer. The range stays locked
    /// against writes and its slots pinned until the returned
    /// [`CachedRange`] is finished or dropped. None, having changed
    /// nothing, when the read cannot be served so, or the cache device has
    /// no fd to read ([`BlockDevice::raw_read_fd`]).
    pub fn begin_cached_read(&self, offset: u64, len: u64) -> Option<CachedRange<'_>> {
        let fd = self.cache.raw_read_fd()?;
        if len == 0 || self.check(offset, len).is_err() {
            return None;
        }
        let blocks = self.blocks_of(offset, len);
        let locked = self.locks.try_shared(blocks.clone())?;
        let now = self.clock.now();
        let mut pinned = Vec::with_capacity((blocks.end - blocks.start) as usize);
        let mut d = self.director.lock();
        if !self.all_ready_hits(&d, blocks.clone()) {
            return None;
        }
        IoCounters::add(&self.io.read_bytes, len);
        self.note_client_io(now);
        let mut io = d.begin(offset, len, Access::Read, now);
        let mut pieces = Vec::with_capacity(pinned.capacity());
        for b in blocks {
            // Every block was checked a ready hit in this critical section,
            // so the plan is a hit and the pin holds.
            match d.plan_read(&mut io, OriginBlock(b), now) {
                ReadPlan::Hit(c) if self.slots.try_pin(c) => {
                    pinned.push(c);
                    let (dev_off, buf_off, n) = self.piece(b, offset, len);
                    let within = dev_off - b * self.block_size;
                    pieces.push((self.slot_offset(c) + within, buf_off, n));
                }
                _ => unreachable!("a ready hit planned as something else"),
            }
        }
        d.finish(io);
        Some(CachedRange {
            engine: self,
            _locked: locked,
            pinned,
            fd,
            pieces,
        })
    }

    /// Whether every block of `blocks` is a read hit on a slot that holds
    /// its data (not being filled). Call with the director locked; the
    /// answer holds for as long as it stays locked.
    fn all_ready_hits(&self, d: &Director, mut blocks: std::ops::Range<u64>) -> bool {
        blocks.all(|b| {
            d.read_hit_slot(OriginBlock(b))
                .is_some_and(|c| self.slots.is_ready(c))
        })
    }

    /// The read with the range's stripes locked shared. With
    /// `only_if_cached`, returns None, having changed nothing, unless every
    /// block is a ready hit (checked under the director, in the same
    /// critical section that plans the read, so the plan finds the same).
    fn read_locked(
        &self,
        offset: u64,
        buf: &mut [u8],
        _locked: locks::StripeGuard<'_>,
        only_if_cached: bool,
    ) -> Option<Result<()>> {
        let len = buf.len() as u64;
        let blocks = self.blocks_of(offset, len);
        let now = self.clock.now();
        let first = blocks.start;
        let mut steps = Vec::with_capacity((blocks.end - blocks.start) as usize);
        {
            let mut d = self.director.lock();
            if only_if_cached && !self.all_ready_hits(&d, blocks.clone()) {
                return None;
            }
            IoCounters::add(&self.io.read_bytes, len);
            self.note_client_io(now);
            let mut io = d.begin(offset, len, Access::Read, now);
            for b in blocks.clone() {
                steps.push(match d.plan_read(&mut io, OriginBlock(b), now) {
                    ReadPlan::Hit(c) if self.slots.try_pin(c) => ReadStep::Cache(c),
                    ReadPlan::Hit(_) | ReadPlan::Miss => ReadStep::Backing,
                    ReadPlan::Promote(ins) => {
                        self.slot_dropped(ins.evicted, ins.cblock);
                        ReadStep::Promote(ins.cblock, self.slots.mark_filling(ins.cblock))
                    }
                });
            }
            d.finish(io);
        }

        let mut first_error = None;
        // 1. Cached blocks. A failed cache read of a clean block falls back
        //    to the backing device.
        for (i, step) in steps.iter_mut().enumerate() {
            let ReadStep::Cache(c) = *step else { continue };
            let b = first + i as u64;
            let (dev_off, buf_off, n) = self.piece(b, offset, len);
            let within = dev_off - b * self.block_size;
            let r = self
                .cache
                .read_at(&mut buf[buf_off..buf_off + n], self.slot_offset(c) + within);
            self.slots.unpin(c);
            match r {
                Ok(()) => IoCounters::add(&self.io.read_hit_bytes, n as u64),
                Err(e) => {
                    self.cache_error(&e, false);
                    let mut d = self.director.lock();
                    if d.replacement().is_dirty(OriginBlock(b)) {
                        first_error.get_or_insert(EngineError::CacheDirty {
                            device: self.cache.describe(),
                            source: e,
                        });
                    } else {
                        if d.replacement().lookup(OriginBlock(b)) == Some(c) {
                            d.invalidate(OriginBlock(b));
                            self.slot_dropped(Some(OriginBlock(b)), c);
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
            if let Err(e) = self.read_backing_run(b0, b1, &steps[i..j], promotes, offset, buf) {
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
        b0: u64,
        b1: u64,
        steps: &[ReadStep],
        promotes: bool,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let len = buf.len() as u64;
        let run_start = (b0 * self.block_size).max(offset);
        let run_end = (self.block_span(b1).1).min(offset + len);
        if !promotes {
            let s = (run_start - offset) as usize;
            let e = (run_end - offset) as usize;
            return self
                .backing
                .read_at(&mut buf[s..e], run_start)
                .map_err(|e| self.backing_err(e, false));
        }
        // Promotions need whole blocks: read the run's full blocks once.
        let full_start = b0 * self.block_size;
        let full_end = self.block_span(b1).1;
        let mut tmp = AlignedBuf::new((full_end - full_start) as usize);
        if let Err(e) = self.backing.read_at(&mut tmp, full_start) {
            for (k, step) in steps.iter().enumerate() {
                if let ReadStep::Promote(c, t) = *step {
                    self.end_fill(b0 + k as u64, c, t, None);
                }
            }
            return Err(self.backing_err(e, false));
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
            let (bs, be) = self.block_span(b);
            // A failed fill only costs the promotion; the read succeeded.
            let _ = self.fill(
                b,
                c,
                t,
                &tmp[(bs - full_start) as usize..(be - full_start) as usize],
            );
        }
        Ok(())
    }

    /// Writes `data` at `offset`. With `fua`, the data is durable when this
    /// returns. Offset and length must be multiples of 512 and inside the
    /// device.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let len = data.len() as u64;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        IoCounters::add(&self.io.write_bytes, len);
        let blocks = self.blocks_of(offset, len);
        let _locked = self.locks.exclusive(blocks.clone());
        let now = self.clock.now();
        self.note_client_io(now);
        let first = blocks.start;
        let mut steps = Vec::with_capacity((blocks.end - blocks.start) as usize);
        {
            let mut d = self.director.lock();
            let mut io = d.begin(offset, len, Access::Write, now);
            for b in blocks.clone() {
                let (bs, be) = self.block_span(b);
                let full = offset <= bs && offset + len >= be;
                let was_dirty = d.replacement().is_dirty(OriginBlock(b));
                let was_in = d.replacement().lookup(OriginBlock(b));
                let step = match d.plan_write(&mut io, OriginBlock(b), full, now) {
                    WritePlan::Backing => {
                        if let Some(c) = was_in {
                            // Passthrough dropped the clean cached copy.
                            self.slot_dropped(Some(OriginBlock(b)), c);
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
                        let backing = !d.replacement().is_dirty(OriginBlock(b));
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
                                newly_dirty: !backing && !was_dirty,
                            }
                        } else {
                            // Unreachable: we hold the block's stripe
                            // exclusively, so no fill of it is under way.
                            debug_assert!(
                                false,
                                "mapped slot of an exclusively locked block not ready"
                            );
                            d.invalidate(OriginBlock(b));
                            self.slot_dropped(Some(OriginBlock(b)), cblock);
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
            }
            d.finish(io);
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
            let (dev_off, buf_off, n) = self.piece(b, offset, len);
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
                    if d.replacement().lookup(OriginBlock(b)) == Some(c) {
                        let e = self.dirty_entry(&d, OriginBlock(b));
                        self.record(c, Some(e));
                    }
                }
                Ok(()) => {
                    if durable && step.backing {
                        flush_before_backing = true;
                        // Withdraw the old claim, so later writes need no
                        // flush; the block stays cached, unclaimed.
                        let d = self.director.lock();
                        if d.replacement().lookup(OriginBlock(b)) == Some(c) {
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
                        if d.replacement().lookup(OriginBlock(b)) == Some(c) {
                            d.invalidate(OriginBlock(b));
                            self.slot_dropped(Some(OriginBlock(b)), c);
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
            self.settle_zombies(blocks.clone())?;
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
            let (s, _, _) = self.piece(first + i as u64, offset, len);
            let (ls, _, ln) = self.piece(first + j as u64 - 1, offset, len);
            let e = ls + ln as u64;
            let r = self
                .backing
                .write_at(&data[(s - offset) as usize..(e - offset) as usize], s);
            if let Err(err) = r {
                first_error.get_or_insert(self.backing_err(err, true));
                // The backing range is now undefined; do not leave a cached
                // copy that claims otherwise.
                for (k, step) in steps[i..j].iter_mut().enumerate() {
                    let Some(c) = step.cache.take() else { continue };
                    let b = first + (i + k) as u64;
                    match step.ticket {
                        Some(t) => self.end_fill(b, c, t, None),
                        None => {
                            let mut d = self.director.lock();
                            if d.replacement().lookup(OriginBlock(b)) == Some(c) {
                                d.invalidate(OriginBlock(b));
                                self.slot_dropped(Some(OriginBlock(b)), c);
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
            let (dev_off, buf_off, n) = self.piece(b, offset, len);
            let piece = &data[buf_off..buf_off + n];
            if self.fill(b, c, t, piece).is_err() && !step.backing {
                // Writeback allocation failed (the promotion is undone): put
                // the data on the backing device instead.
                self.settle_zombies(b..b + 1)?;
                if let Err(e) = self.backing.write_at(piece, dev_off) {
                    first_error.get_or_insert(self.backing_err(e, true));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes zeros over the range, like a write of a zero buffer.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check(offset, len)?;
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write(offset + done, &zeros[..n as usize], false)?;
            done += n;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Says the range's contents are no longer needed. Whole cached blocks
    /// in it are dropped from the cache (dirty data included); the range is
    /// discarded on the backing device. Reads of it return unspecified data
    /// until it is written again.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        IoCounters::add(&self.io.trims, 1);
        let blocks = self.blocks_of(offset, len);
        let _locked = self.locks.exclusive(blocks.clone());
        {
            let mut d = self.director.lock();
            for b in blocks {
                let (bs, be) = self.block_span(b);
                if offset <= bs && offset + len >= be {
                    let dirty = d.replacement().is_dirty(OriginBlock(b));
                    if let Some(c) = d.invalidate(OriginBlock(b)) {
                        self.slot_dropped(Some(OriginBlock(b)), c);
                        if dirty {
                            // Withdraw the dirty claim; until that commits,
                            // a crash may bring back old data for a range
                            // that was trimmed, which trim allows.
                            self.record(c, None);
                        }
                    }
                }
            }
        }
        self.settle_zombies(self.blocks_of(offset, len))?;
        match self.backing.discard(offset, len) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(()),
            Err(e) => Err(self.backing_err(e, true)),
        }
    }

    /// Makes every write completed before this call durable: on the cache
    /// device (dirty data) and on the backing device.
    pub fn flush(&self) -> Result<()> {
        IoCounters::add(&self.io.flushes, 1);
        if self.persist.is_some() {
            // Flushes the cache device, then commits the dirty claims.
            self.commit_inner(true)?;
            return self.backing.flush().map_err(|e| self.backing_err(e, true));
        }
        if let Err(e) = self.cache.flush() {
            self.cache_error(&e, true);
            if self.director.lock().replacement().dirty_len() > 0 {
                return Err(EngineError::CacheDirty {
                    device: self.cache.describe(),
                    source: e,
                });
            }
        }
        self.backing.flush().map_err(|e| self.backing_err(e, true))
    }

    /// Dirty blocks now.
    pub fn dirty_blocks(&self) -> u64 {
        self.director.lock().replacement().dirty_len() as u64
    }

    /// Writes back up to `max_blocks` dirty blocks, in backing-device order,
    /// merging neighbours into one write, then flushes the backing device
    /// and marks them clean. Returns how many were cleaned.
    pub fn clean(&self, max_blocks: usize) -> Result<usize> {
        // Sorted (backing-device order) outside the director's lock.
        let mut dirty = self.director.lock().dirty_blocks_unordered();
        dirty.sort_unstable();
        dirty.truncate(max_blocks);
        if dirty.is_empty() {
            return Ok(0);
        }
        const MAX_RUN_BYTES: u64 = 4 << 20;
        let max_run = (MAX_RUN_BYTES / self.block_size).max(1) as usize;
        let mut cleaned = 0;
        let mut i = 0;
        while i < dirty.len() {
            let mut j = i + 1;
            while j < dirty.len() && j - i < max_run && dirty[j].0 .0 == dirty[j - 1].0 .0 + 1 {
                j += 1;
            }
            cleaned += self.clean_run(&dirty[i..j])?;
            i = j;
        }
        Ok(cleaned)
    }

    /// Cleans one run of consecutive dirty blocks.
    fn clean_run(&self, run: &[(OriginBlock, CacheBlock)]) -> Result<usize> {
        let b0 = run[0].0 .0;
        let b1 = run[run.len() - 1].0 .0;
        // Shared: no write may change these blocks until they are marked clean.
        let _locked = self.locks.shared(b0..b1 + 1);
        let mut still = Vec::with_capacity(run.len());
        {
            let d = self.director.lock();
            for &(o, c) in run {
                let ok = d.replacement().lookup(o) == Some(c)
                    && d.replacement().is_dirty(o)
                    && self.slots.try_pin(c);
                still.push(ok);
            }
        }
        let full_start = b0 * self.block_size;
        let full_end = self.block_span(b1).1;
        let mut tmp = RunBuf::take((full_end - full_start) as usize);
        let mut read_ok = vec![false; run.len()];
        let mut first_error = None;
        for (k, &(o, c)) in run.iter().enumerate() {
            if !still[k] {
                continue;
            }
            let (bs, be) = self.block_span(o.0);
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
        self.settle_zombies(b0..b1 + 1)?;
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
            let s = self.block_span(run[k].0 .0).0;
            let e = self.block_span(run[m - 1].0 .0).1;
            let r = self.backing.write_at(
                &tmp[(s - full_start) as usize..(e - full_start) as usize],
                s,
            );
            if let Err(err) = r {
                first_error.get_or_insert(self.backing_err(err, true));
                for ok in &mut read_ok[k..m] {
                    *ok = false;
                }
            } else {
                IoCounters::add(&self.io.writeback_bytes, e - s);
            }
            k = m;
        }
        if read_ok.iter().any(|&x| x) {
            self.backing
                .flush()
                .map_err(|e| self.backing_err(e, true))?;
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
                            let (bs, be) = self.block_span(o.0);
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
