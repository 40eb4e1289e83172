//! Persistence: the engine's state on the cache device, through
//! `tiercache-metadata`.
//!
//! What is durable, and when (the invariant everything below keeps):
//! **a durable dirty claim is always true, and a durable clean claim is
//! true or fails its crc.** A claim "slot c holds block b, dirty" is
//! committed (after the cache data is flushed) before the write that made
//! the block dirty is acknowledged (`write.rs`), so no acknowledged write
//! is forgotten by a killed server; it is authoritative after a crash. A
//! dirty claim is only replaced (by a committed clean claim or "slot c is
//! free") *before* the block is marked clean in memory, so a slot is never
//! refilled while the disk still says it holds dirty data.
//!
//! Clean blocks are claimed too, with a crc32c of the slot content (see
//! `claims.rs` for the rules that keep such a claim true). After a crash,
//! dirty claims come back as they are (and the cleaner writes them back in
//! time); clean claims come back if the slot still matches their crc,
//! checked before the block is first used or in the background
//! (`verify.rs`), so that opening does not wait for reading every slot.
//! A clean shutdown writes the whole mapping (clean blocks and policy hints
//! too) with the clean-shutdown flag: the next start is warm without
//! reading anything.
//!
//! The cache device is a pool (format version 3): the engine's volumes
//! are the volume table's, with the same ids; every entry records the
//! volume of its block (the pool key's, [`OriginBlock::volume`]), and each
//! volume's mode and its backing device's fingerprint live in its record.

use crate::{claims, Engine, EngineConfig, EngineError, Result};
use parking_lot::Mutex;
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_metadata::{
    BackingIdentity, Entry, FormatParams, MetadataStore, NewVolume, VolumeId,
};
use tiercache_policy::PolicyConfig;
use tiercache_types::{CacheBlock, CacheMode, Clock, OriginBlock};

/// A backing volume of a persistent pool, as [`Engine::create_pool`] and
/// [`Engine::open_pool`] take it.
#[derive(Clone)]
pub struct PoolVolume {
    /// Its name in the pool. `None`: for `create_pool`, a name made from
    /// the path; for `open_pool`, the cache's only volume.
    pub name: Option<String>,
    pub backing: Arc<dyn BlockDevice>,
    /// Where it was opened from (stored as a hint, used in messages).
    pub path: String,
}

/// The pool's first volume: the engine's own, which stays attached.
const FIRST: VolumeId = VolumeId(0);

/// Records in the volume table of a new cache of `cache_size` bytes: the
/// metadata crate's default (1024, 552 KiB of tables) from 64 MiB up;
/// smaller caches (tests, demos) get 15 (one 4 KiB block per copy).
fn max_volumes(cache_size: u64) -> u32 {
    if cache_size >= 64 << 20 {
        tiercache_metadata::DEFAULT_MAX_VOLUMES
    } else {
        15
    }
}

/// The volume name for a backing device at `path`: its file name with
/// characters a volume name cannot hold replaced by '_' (at most 63
/// bytes), or `default`.
fn volume_name(path: &str) -> String {
    let base = std::path::Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(63);
    if tiercache_metadata::validate_name(&name).is_ok() {
        name
    } else {
        "default".to_string()
    }
}

/// The engine's link to its metadata.
pub(crate) struct Persistence {
    /// `None` after a clean shutdown.
    store: Mutex<Option<MetadataStore>>,
    /// Records not yet handed to the store, in order. Taken under the
    /// director's lock so their order is the order of the changes.
    pending: Mutex<Vec<Pending>>,
}

/// A record waiting for the next commit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    slot: u32,
    entry: Option<Entry>,
    /// For a clean claim with a crc: the slot generation it describes.
    claim_gen: Option<u32>,
    /// For "slot free" records that end a zombie: the zombie block.
    zombie: Option<u64>,
}

/// What opening an existing cache found.
#[derive(Clone, Debug)]
pub struct OpenReport {
    pub was_clean_shutdown: bool,
    pub restored_blocks: u64,
    pub restored_dirty: u64,
    /// Clean blocks whose crc was checked against the slot while opening
    /// (after a crash, with [`OpenOptions::verify_clean_at_open`]).
    pub verified_clean: u64,
    /// Clean blocks restored after a crash whose crc is checked later:
    /// before their first use, or in the background
    /// ([`Engine::restore_check`], `verify.rs`).
    pub unverified_clean: u64,
    /// Clean claims dropped while opening after a crash: crc mismatch
    /// (checked at open) or no crc.
    pub dropped_clean: u64,
    /// The cache had been detached: it starts empty.
    pub was_detached: bool,
    pub journal_records_replayed: u64,
    pub warnings: Vec<String>,
}

/// Settings that may differ from what the cache device recorded.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Mode to run in (default: the recorded one).
    pub mode: Option<CacheMode>,
    /// Policy to run (default: the recorded one; hints are used only if it
    /// is the same).
    pub policy: Option<PolicyConfig>,
    pub sequential_cutoff: Option<u64>,
    pub cache_error_limit: Option<u64>,
    /// After a crash, read every clean-claimed slot and check its crc
    /// before returning (the start then takes as long as reading them).
    /// Default: restore them at once and check each before its first use
    /// or in the background (`verify.rs`).
    pub verify_clean_at_open: bool,
}

impl Engine {
    /// Formats `cache` for `backing` (the backing device is only read, for
    /// its identity) and returns an engine with an empty, persistent cache:
    /// a pool of one ([`Engine::create_pool`]). `backing_path` is stored as
    /// a hint for error messages.
    pub fn create(
        backing: Arc<dyn BlockDevice>,
        cache: Arc<dyn BlockDevice>,
        config: &EngineConfig,
        clock: Arc<dyn Clock>,
        backing_path: &str,
        journal_bytes: Option<u64>,
    ) -> Result<Engine> {
        let volume = PoolVolume {
            name: None,
            backing,
            path: backing_path.to_string(),
        };
        Engine::create_pool(&[volume], cache, config, clock, journal_bytes)
    }

    /// Formats `cache` as a pool of `volumes` (at least one; the first
    /// becomes volume 0) and returns an engine serving them all, with an
    /// empty, persistent cache. Backing devices are only read, for their
    /// identity.
    pub fn create_pool(
        volumes: &[PoolVolume],
        cache: Arc<dyn BlockDevice>,
        config: &EngineConfig,
        clock: Arc<dyn Clock>,
        journal_bytes: Option<u64>,
    ) -> Result<Engine> {
        let Some(first) = volumes.first() else {
            return Err(EngineError::Config(
                "a pool needs at least one volume".into(),
            ));
        };
        let mut new = Vec::with_capacity(volumes.len());
        for v in volumes {
            new.push(NewVolume {
                name: v.name.clone().unwrap_or_else(|| volume_name(&v.path)),
                identity: identity(&*v.backing, &v.path)?,
                mode: None,
                sequential_cutoff: None,
            });
        }
        let store = MetadataStore::format(
            cache.clone(),
            &FormatParams {
                block_size: config.block_size,
                mode: config.mode,
                policy: config.policy.to_string(),
                journal_bytes,
                max_volumes: Some(max_volumes(cache.size()).max(volumes.len() as u32)),
                volumes: new,
            },
        )?;
        let layout = *store.layout();
        let cfg = EngineConfig {
            cache_data_offset: layout.data_offset,
            max_cache_blocks: Some(layout.capacity),
            ..config.clone()
        };
        let mut engine = Engine::new(first.backing.clone(), cache, &cfg, clock)?;
        for (id, record) in store.volumes() {
            let v = volumes
                .iter()
                .find(|v| v.name.clone().unwrap_or_else(|| volume_name(&v.path)) == record.name)
                .expect("the store holds the volumes it was formatted with");
            engine.attach_at(
                id,
                &record.name,
                &v.path,
                v.backing.clone(),
                config.mode,
                config.sequential_cutoff,
            )?;
        }
        engine.persist = Some(Persistence {
            store: Mutex::new(Some(store)),
            pending: Mutex::new(Vec::new()),
        });
        Ok(engine)
    }

    /// Opens a cache device formatted by [`Engine::create`] for `backing`,
    /// restoring its blocks: [`Engine::open_pool`] of a pool of one.
    pub fn open(
        backing: Arc<dyn BlockDevice>,
        cache: Arc<dyn BlockDevice>,
        options: &OpenOptions,
        clock: Arc<dyn Clock>,
        backing_path: &str,
    ) -> Result<(Engine, OpenReport)> {
        let volume = PoolVolume {
            name: None,
            backing,
            path: backing_path.to_string(),
        };
        Engine::open_pool(&[volume], cache, options, clock)
    }

    /// Opens the pool on `cache`, restoring its blocks. Every volume of the
    /// pool must be given (its dirty blocks belong on its backing device),
    /// matched by name, and each backing device must be the one its record
    /// describes. Refuses (with the metadata's error) a wrong backing
    /// device, unknown formats and corrupt metadata, before anything is
    /// written.
    pub fn open_pool(
        volumes: &[PoolVolume],
        cache: Arc<dyn BlockDevice>,
        options: &OpenOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<(Engine, OpenReport)> {
        let attached = MetadataStore::peek_volumes(&*cache)?;
        let names = || {
            attached
                .iter()
                .map(|(_, r)| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut given: Vec<(VolumeId, &PoolVolume)> = Vec::with_capacity(volumes.len());
        for v in volumes {
            let id = match &v.name {
                Some(name) => attached
                    .iter()
                    .find(|(_, r)| &r.name == name)
                    .map(|(id, _)| *id)
                    .ok_or_else(|| {
                        EngineError::Config(format!(
                            "the cache has no volume named {name:?} (it holds: {}); attach it to \
                             the running server with `tiercache attach`",
                            names()
                        ))
                    })?,
                None if attached.len() == 1 => attached[0].0,
                None => {
                    return Err(EngineError::Config(format!(
                        "the cache is a pool of {} volumes ({}): name each one's backing device \
                         with --volume NAME=PATH",
                        attached.len(),
                        names()
                    )))
                }
            };
            if given.iter().any(|(g, _)| *g == id) {
                return Err(EngineError::Config(format!(
                    "volume {} is given twice",
                    v.name.as_deref().unwrap_or("of the pool")
                )));
            }
            given.push((id, v));
        }
        if let Some((_, missing)) = attached
            .iter()
            .find(|(id, _)| !given.iter().any(|(g, _)| g == id))
        {
            return Err(EngineError::Config(format!(
                "the cache holds volume {:?} too (last at {}), whose cached blocks belong on its \
                 backing device: give --volume {}=PATH as well",
                missing.name, missing.path_hint, missing.name
            )));
        }
        let Some(&(_, first)) = given.iter().find(|(id, _)| *id == FIRST) else {
            return Err(EngineError::Config(
                "the pool's volume 0 is missing from its volume table".into(),
            ));
        };
        let mut expected = Vec::with_capacity(given.len());
        for (id, v) in &given {
            expected.push((*id, identity(&*v.backing, &v.path)?));
        }
        let started = std::time::Instant::now();
        let (mut store, rec) = MetadataStore::open_with(cache.clone(), &expected)?;
        let metadata_read = started.elapsed();
        let sb = rec.superblock.clone();
        let record = |id: VolumeId| {
            rec.volume(id)
                .cloned()
                .ok_or(tiercache_metadata::MetadataError::NotAttached { volume: id.0 })
        };
        let volume = record(FIRST)?;
        let saved_policy = sb.policy.parse::<PolicyConfig>().ok();
        let policy = options
            .policy
            .clone()
            .or_else(|| saved_policy.clone())
            .unwrap_or_default();
        let hints_valid =
            saved_policy.as_ref().map(ToString::to_string) == Some(policy.to_string());
        let defaults = EngineConfig::default();
        let mode = options.mode.unwrap_or(volume.mode);
        let cfg = EngineConfig {
            mode,
            block_size: sb.layout.block_size,
            sequential_cutoff: options
                .sequential_cutoff
                .or(volume.sequential_cutoff)
                .unwrap_or(defaults.sequential_cutoff),
            policy: policy.clone(),
            cache_data_offset: sb.layout.data_offset,
            max_cache_blocks: Some(sb.layout.capacity),
            cache_error_limit: options
                .cache_error_limit
                .unwrap_or(defaults.cache_error_limit),
        };
        let mut engine = Engine::new(first.backing.clone(), cache, &cfg, clock)?;
        for (id, v) in &given {
            let r = record(*id)?;
            engine.attach_at(
                *id,
                &r.name,
                &v.path,
                v.backing.clone(),
                options.mode.unwrap_or(r.mode),
                options
                    .sequential_cutoff
                    .or(r.sequential_cutoff)
                    .unwrap_or(defaults.sequential_cutoff),
            )?;
        }
        let mut report = OpenReport {
            was_clean_shutdown: rec.was_clean_shutdown,
            restored_blocks: 0,
            restored_dirty: 0,
            verified_clean: 0,
            unverified_clean: 0,
            dropped_clean: 0,
            was_detached: sb.detached,
            journal_records_replayed: rec.journal_records_replayed,
            warnings: rec.warnings.clone(),
        };
        // Which entries to keep. After a detach: none. After a clean
        // shutdown: all. After a crash: dirty ones, and clean ones with a
        // crc (checked against the slot here with `verify_clean_at_open`,
        // else lazily: `verify.rs`).
        let engine_built = started.elapsed();
        let mut keep: Vec<Option<Entry>> = rec.mapping.clone();
        let mut withdraw = 0u64;
        if sb.detached {
            for (slot, e) in rec.mapping.iter().enumerate() {
                let Some(e) = e else { continue };
                if e.dirty {
                    return Err(EngineError::Config(format!(
                        "the cache is marked detached but slot {slot} holds dirty data; run `tiercache check --repair`"
                    )));
                }
                keep[slot] = None;
            }
        } else if !rec.was_clean_shutdown {
            // Two entries for one block never get here: the store refuses
            // them as corrupt (`tiercache check --repair` sorts them out).
            for e in keep.iter_mut() {
                if e.is_some_and(|e| !e.dirty && e.crc.is_none()) {
                    *e = None;
                }
            }
            if options.verify_clean_at_open {
                report.verified_clean = engine.verify_clean_claims(&mut keep)?;
            }
        }
        let checked = started.elapsed();
        let lazy = !rec.was_clean_shutdown && !options.verify_clean_at_open;
        {
            let mut d = engine.director.lock();
            for (slot, entry) in rec.mapping.iter().enumerate() {
                let Some(_) = entry else { continue };
                let Some(e) = keep[slot] else {
                    if !entry.is_some_and(|e| e.dirty) && !sb.detached {
                        report.dropped_clean += 1;
                    }
                    store.record(slot as u32, None)?;
                    withdraw += 1;
                    continue;
                };
                let hint = if hints_valid { e.hint } else { 0 };
                let ok = d.restore(
                    OriginBlock::of(e.volume, e.oblock),
                    CacheBlock(slot as u32),
                    e.dirty,
                    hint,
                );
                if !ok {
                    return Err(EngineError::Config(format!(
                        "cannot restore slot {slot} (origin block {}): already in use",
                        e.oblock
                    )));
                }
                report.restored_blocks += 1;
                if e.dirty {
                    report.restored_dirty += 1;
                } else if let Some(crc) = e.crc {
                    if lazy {
                        engine
                            .claims
                            .restore_unverified(CacheBlock(slot as u32), crc);
                        report.unverified_clean += 1;
                    } else {
                        engine.claims.set_restored(CacheBlock(slot as u32));
                    }
                }
            }
        }
        let restored = started.elapsed();
        if withdraw > 0 {
            store.commit()?;
        }
        log::debug!(
            "open: metadata read in {} ms, engine built at {} ms, claims checked at {} ms, \
             blocks restored at {} ms, withdrawals committed at {} ms",
            metadata_read.as_millis(),
            engine_built.as_millis(),
            checked.as_millis(),
            restored.as_millis(),
            started.elapsed().as_millis()
        );
        if sb.detached {
            store.set_detached(false)?;
        }
        if let Some(m) = options.mode {
            for (id, _) in &given {
                if record(*id)?.mode != m {
                    store.set_volume_mode(*id, m)?;
                }
            }
        }
        if options.policy.is_some() && !hints_valid {
            store.set_policy(&policy.to_string())?;
        }
        engine.persist = Some(Persistence {
            store: Mutex::new(Some(store)),
            pending: Mutex::new(Vec::new()),
        });
        Ok((engine, report))
    }

    /// Whether this engine keeps its state on the cache device.
    pub fn is_persistent(&self) -> bool {
        self.persist.is_some()
    }

    /// Buffers a metadata record. Call with the director's lock held, so
    /// records are ordered like the changes they describe.
    pub(crate) fn record(&self, c: CacheBlock, entry: Option<Entry>) {
        self.push_pending(Pending {
            slot: c.0,
            entry,
            claim_gen: None,
            zombie: None,
        });
    }

    fn push_pending(&self, p: Pending) {
        if let Some(persist) = &self.persist {
            persist.pending.lock().push(p);
        }
    }

    /// Claims slot `c` for clean block `b` whose content of generation
    /// `gen` has crc `crc` (see `claims.rs`). Does nothing if the slot
    /// changed since (returns false). Call with the director's lock held.
    pub(crate) fn record_clean_claim(
        &self,
        d: &tiercache_policy::Director,
        b: OriginBlock,
        c: CacheBlock,
        gen: u32,
        crc: u32,
    ) -> bool {
        if self.persist.is_none() || !self.claims.set_claimed(c, gen) {
            return false;
        }
        self.push_pending(Pending {
            slot: c.0,
            entry: Some(Entry {
                volume: b.volume(),
                oblock: b.block(),
                dirty: false,
                hint: d.hint(b),
                crc: Some(crc),
            }),
            claim_gen: Some(gen),
            zombie: None,
        });
        true
    }

    /// Block `b` (`None`: nothing) left slot `c`, by eviction or
    /// invalidation, or the free slot `c` is being handed out: moves the
    /// slot's generation on and, if a clean claim may be durable there,
    /// withdraws it, with `b` a zombie until that commits. Call with the
    /// director's lock held, in the critical section of the mapping change.
    pub(crate) fn slot_dropped(&self, b: Option<OriginBlock>, c: CacheBlock) {
        let prev = self.claims.bump(c);
        if prev & claims::DURABLE != 0 && self.persist.is_some() {
            if let Some(b) = b {
                self.claims.add_zombie(b.0, c.0);
            }
            self.push_pending(Pending {
                slot: c.0,
                entry: None,
                claim_gen: None,
                zombie: b.map(|b| b.0),
            });
        }
    }

    /// Before writing `blocks` on the backing device: commits while any of
    /// them is a zombie (rule 3 in `claims.rs`).
    pub(crate) fn settle_zombies(&self, blocks: std::ops::Range<u64>) -> Result<()> {
        let mut tries = 0;
        while self.claims.any_zombie(blocks.clone()) {
            self.commit_inner(false)?;
            tries += 1;
            if tries > 3 {
                // Commits are serialised: after one that started after the
                // zombie's record was buffered, it is gone. Yield to the
                // commit in flight.
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// The record for a block that just became dirty in slot `c`.
    pub(crate) fn dirty_entry(&self, d: &tiercache_policy::Director, b: OriginBlock) -> Entry {
        Entry {
            volume: b.volume(),
            oblock: b.block(),
            dirty: true,
            hint: d.hint(b),
            crc: None,
        }
    }

    /// After a crash, with [`OpenOptions::verify_clean_at_open`]: reads
    /// every slot with a clean claim and drops (sets
    /// to `None`) those whose content no longer matches the crc. Reads runs
    /// of neighbouring slots as one IO. Returns how many were checked.
    fn verify_clean_claims(&self, keep: &mut [Option<Entry>]) -> Result<u64> {
        const MAX_RUN_BYTES: u64 = 4 << 20;
        let bs = self.block_size;
        let max_run = (MAX_RUN_BYTES / bs).max(1) as usize;
        let candidates: Vec<usize> = (0..keep.len())
            .filter(|&s| keep[s].is_some_and(|e| !e.dirty && e.crc.is_some()))
            .collect();
        let mut buf = AlignedBuf::new((max_run as u64 * bs) as usize);
        let mut i = 0;
        while i < candidates.len() {
            let mut j = i + 1;
            while j < candidates.len() && j - i < max_run && candidates[j] == candidates[j - 1] + 1
            {
                j += 1;
            }
            let first = candidates[i];
            let n = (j - i) as u64 * bs;
            let off = self.slot_offset(CacheBlock(first as u32));
            let n = n.min(self.cache.size().saturating_sub(off));
            let read = self.cache.read_at(&mut buf[..n as usize], off);
            for &slot in &candidates[i..j] {
                let e = keep[slot].expect("candidate");
                let Ok(vol) = self.volume(e.volume) else {
                    keep[slot] = None;
                    continue;
                };
                let (s, end) = vol.block_span(e.oblock);
                let at = (slot - first) as u64 * bs;
                let ok = read.is_ok()
                    && at + (end - s) <= n
                    && Some(crc32c::crc32c(&buf[at as usize..(at + end - s) as usize])) == e.crc;
                if !ok {
                    keep[slot] = None;
                }
            }
            i = j;
        }
        Ok(candidates.len() as u64)
    }

    /// Makes every buffered record durable: flushes the cache device (the
    /// data the records describe), then commits the journal. Returns
    /// quickly when nothing is buffered or the engine is not persistent.
    pub fn commit(&self) -> Result<()> {
        self.commit_inner(false)
    }

    /// [`Engine::commit`], flushing the cache device even when no record is
    /// buffered (a client FLUSH needs the dirty data in place durable too).
    pub(crate) fn commit_inner(&self, always_flush: bool) -> Result<()> {
        let Some(p) = &self.persist else {
            return Ok(());
        };
        let mut guard = p.store.lock();
        let Some(store) = guard.as_mut() else {
            return self.flush_cache_device();
        };
        // Take the records first: only data written before they were made
        // is covered by the flush below.
        let mut batch = std::mem::take(&mut *p.pending.lock());
        if batch.is_empty() && !always_flush {
            return Ok(());
        }
        // Rule 1 of claims.rs: announce the clean claims (DURABLE) before
        // the flush, then drop those whose slot changed.
        let mut has_claims = false;
        for r in batch.iter().filter(|r| r.claim_gen.is_some()) {
            self.claims.set_durable(r.slot);
            has_claims = true;
        }
        let r = (|| {
            self.flush_cache_device()?;
            if batch.is_empty() {
                return Ok(());
            }
            if has_claims {
                // A clean claim says the backing device holds this data:
                // flush the backing devices of the volumes claimed, those
                // written to since their last flush (`backing_flush.rs`:
                // a read miss's data was on the device already). A volume
                // whose device fails keeps its claims out of this commit
                // (its blocks stay as they were: dirty in memory, and the
                // durable dirty claim still true), so one failing volume
                // holds up no other.
                let mut claimed: Vec<VolumeId> = batch
                    .iter()
                    .filter(|r| r.claim_gen.is_some())
                    .filter_map(|r| r.entry.map(|e| e.volume))
                    .collect();
                claimed.sort_unstable();
                claimed.dedup();
                let mut failed = Vec::new();
                for id in claimed {
                    let Ok(vol) = self.volume(id) else { continue };
                    if let Err(e) = vol.backing.flush_if_written() {
                        let e = vol.backing_err(e, true);
                        log::warn!("volume {}: {e}; its clean claims wait", vol.name);
                        failed.push(id);
                    }
                }
                if !failed.is_empty() {
                    batch.retain(|r| {
                        r.claim_gen.is_none()
                            || !r.entry.is_some_and(|e| failed.contains(&e.volume))
                    });
                }
            }
            for r in batch.iter_mut() {
                if let Some(gen) = r.claim_gen {
                    if claims::generation(self.claims.load(CacheBlock(r.slot))) != gen {
                        r.entry = None;
                        r.claim_gen = None;
                    }
                }
            }
            for r in &batch {
                store.record(r.slot, r.entry)?;
            }
            store.commit()?;
            Ok(())
        })();
        match &r {
            Ok(()) => {
                let mut last: std::collections::HashMap<u32, bool> =
                    std::collections::HashMap::new();
                for r in &batch {
                    last.insert(r.slot, r.claim_gen.is_some());
                    if let Some(b) = r.zombie {
                        self.claims.remove_zombie(b, r.slot);
                    }
                }
                for (slot, clean_claim) in last {
                    if !clean_claim {
                        self.claims.clear_durable(slot);
                    }
                }
            }
            Err(_) => {
                // Keep the records (in front of newer ones) for the next
                // try; DURABLE stays set, which is only cautious.
                let mut pending = p.pending.lock();
                let newer = std::mem::replace(&mut *pending, batch);
                pending.extend(newer);
            }
        }
        r
    }

    fn flush_cache_device(&self) -> Result<()> {
        self.cache.flush().map_err(|e| {
            self.cache_error(&e, true);
            EngineError::CacheDirty {
                device: self.cache.describe(),
                source: e,
            }
        })
    }

    /// Durably records the mode of volume `id` (persistent engines only).
    pub(crate) fn persist_mode(&self, id: VolumeId, mode: CacheMode) -> Result<()> {
        if let Some(p) = &self.persist {
            if let Some(store) = p.store.lock().as_mut() {
                store.set_volume_mode(id, mode)?;
            }
        }
        Ok(())
    }

    /// Records a new volume in the pool's table (persistent engines) and
    /// returns its id; `None` for a volatile engine.
    pub(crate) fn persist_attach(
        &self,
        name: &str,
        path: &str,
        backing: &dyn BlockDevice,
        mode: CacheMode,
        cutoff: u64,
    ) -> Result<Option<VolumeId>> {
        let Some(p) = &self.persist else {
            return Ok(None);
        };
        let mut store = p.store.lock();
        let Some(store) = store.as_mut() else {
            return Err(EngineError::Config("the cache was shut down".into()));
        };
        let id = store.attach(&NewVolume {
            name: name.to_string(),
            identity: identity(backing, path)?,
            mode: Some(mode),
            sequential_cutoff: Some(cutoff),
        })?;
        Ok(Some(id))
    }

    /// Takes volume `id` out of the pool's table once its slots are free:
    /// commits the buffered records (its blocks' "slot free" among them),
    /// then detaches it in the store.
    pub(crate) fn persist_detach(&self, id: VolumeId) -> Result<()> {
        if self.persist.is_none() {
            return Ok(());
        }
        self.commit_inner(true)?;
        let p = self.persist.as_ref().expect("persistent");
        if let Some(store) = p.store.lock().as_mut() {
            store.detach(id)?;
        }
        Ok(())
    }

    /// Clean shutdown: flushes both devices and writes the whole mapping
    /// (clean blocks, dirty blocks and policy hints) so the next open is
    /// warm. With `detach`, the cache must hold no dirty block; the mapping
    /// written is empty and the cache is marked detached, so a later open
    /// starts cold (the backing device may be used alone meanwhile).
    /// Afterwards the engine must not serve IO.
    pub fn shutdown(&self, detach: bool) -> Result<()> {
        // The mapping written below is trusted without a check at the next
        // open: check the blocks restored after a crash that are not yet
        // (those that fail leave the cache; any left unchecked are not
        // written).
        if self.persist.is_some() && !detach {
            self.verify_all_restored();
        }
        // Commit what is buffered first: the clean claims' crcs then sit in
        // the store, ready to go into the final mapping.
        if self.persist.is_some() {
            self.commit_inner(true)?;
        }
        self.cache.flush().map_err(|e| EngineError::CacheDirty {
            device: self.cache.describe(),
            source: e,
        })?;
        self.flush_backing_devices()?;
        let Some(p) = &self.persist else {
            return Ok(());
        };
        let Some(mut store) = p.store.lock().take() else {
            return Ok(());
        };
        let capacity = store.layout().capacity as usize;
        let mut mapping = vec![None; capacity];
        {
            let d = self.director.lock();
            if detach && d.dirty_len() > 0 {
                return Err(EngineError::Config(format!(
                    "cannot detach: {} dirty blocks are not written back",
                    d.dirty_len()
                )));
            }
            if !detach {
                d.for_each_resident(&mut |o, c, dirty| {
                    if self.claims.is_unverified(c) {
                        return;
                    }
                    // The committed claim's crc, if it describes the slot's
                    // current content.
                    let crc = if dirty || self.claims.load(c) & claims::CLAIMED == 0 {
                        None
                    } else {
                        store
                            .entry(c.0)
                            .filter(|e| e.volume == o.volume() && e.oblock == o.block() && !e.dirty)
                            .and_then(|e| e.crc)
                    };
                    mapping[c.index()] = Some(Entry {
                        volume: o.volume(),
                        oblock: o.block(),
                        dirty,
                        hint: d.hint(o),
                        crc,
                    });
                });
            }
        }
        if detach {
            store.set_detached(true)?;
        }
        let mut identities = Vec::new();
        for v in self.all_volumes() {
            identities.push((v.id, identity(&*v.backing, &v.path)?));
        }
        store.mark_clean_shutdown(&mapping, &identities)?;
        Ok(())
    }
}

fn identity(backing: &dyn BlockDevice, path: &str) -> Result<BackingIdentity> {
    BackingIdentity::of(backing, path).map_err(|e| EngineError::Backing {
        device: backing.describe(),
        source: e,
    })
}
