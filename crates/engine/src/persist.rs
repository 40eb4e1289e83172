//! Persistence: the engine's state on the cache device, through
//! `tiercache-metadata`.
//!
//! What is durable, and when (the invariant everything below keeps):
//! **while the engine runs, the only durable claims are dirty ones.** A
//! claim "slot c holds block b, dirty" is committed (after the cache data is
//! flushed) at every client FLUSH/FUA, every second, and by the cleaner; it
//! is authoritative after a crash. A dirty claim is only withdrawn (a
//! committed "slot c is free") *before* the block is marked clean in memory,
//! so a slot is never refilled while the disk still says it holds dirty data.
//! Clean blocks are never claimed while running, so writes to them and reuse
//! of their slots need no ordering at all.
//!
//! A clean shutdown writes the whole mapping (clean blocks and policy hints
//! too) with the clean-shutdown flag: the next start is warm. Opening then
//! withdraws the clean claims (one commit) before any IO, restoring the
//! invariant. After a crash, the dirty blocks come back (and are written
//! back by the cleaner in time); clean blocks warm up again.
//! docs/ARCHITECTURE.md describes the next step, clean claims that survive
//! a crash.

use crate::{Engine, EngineConfig, EngineError, Result};
use parking_lot::Mutex;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_metadata::{BackingIdentity, Entry, FormatParams, MetadataStore};
use tiercache_policy::PolicyConfig;
use tiercache_types::{CacheBlock, CacheMode, Clock, OriginBlock};

/// The engine's link to its metadata.
pub(crate) struct Persistence {
    /// `None` after a clean shutdown.
    store: Mutex<Option<MetadataStore>>,
    /// Records not yet handed to the store, in order. Taken under the
    /// director's lock so their order is the order of the changes.
    pending: Mutex<Vec<(u32, Option<Entry>)>>,
    backing_path: String,
}

/// What opening an existing cache found.
#[derive(Clone, Debug)]
pub struct OpenReport {
    pub was_clean_shutdown: bool,
    pub restored_blocks: u64,
    pub restored_dirty: u64,
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
}

fn policy_label(p: &PolicyConfig) -> String {
    format!("{}+{}", p.replacement, p.admission)
}

fn parse_policy_label(s: &str) -> Option<PolicyConfig> {
    let (r, a) = s.split_once('+')?;
    Some(PolicyConfig {
        replacement: r.parse().ok()?,
        admission: a.parse().ok()?,
        ..PolicyConfig::default()
    })
}

impl Engine {
    /// Formats `cache` for `backing` (the backing device is only read, for
    /// its identity) and returns an engine with an empty, persistent cache.
    /// `backing_path` is stored as a hint for error messages.
    pub fn create(
        backing: Arc<dyn BlockDevice>,
        cache: Arc<dyn BlockDevice>,
        config: &EngineConfig,
        clock: Arc<dyn Clock>,
        backing_path: &str,
        journal_bytes: Option<u64>,
    ) -> Result<Engine> {
        let identity = identity(&*backing, backing_path)?;
        let store = MetadataStore::format(
            cache.clone(),
            &FormatParams {
                block_size: config.block_size,
                mode: config.mode,
                policy: policy_label(&config.policy),
                journal_bytes,
                backing: identity,
            },
        )?;
        let layout = *store.layout();
        let cfg = EngineConfig {
            cache_data_offset: layout.data_offset,
            max_cache_blocks: Some(layout.capacity),
            ..config.clone()
        };
        let mut engine = Engine::new(backing, cache, &cfg, clock)?;
        engine.persist = Some(Persistence {
            store: Mutex::new(Some(store)),
            pending: Mutex::new(Vec::new()),
            backing_path: backing_path.to_string(),
        });
        Ok(engine)
    }

    /// Opens a cache device formatted by [`Engine::create`] for `backing`,
    /// restoring its blocks. Refuses (with the metadata's error) the wrong
    /// backing device, unknown formats and corrupt metadata.
    pub fn open(
        backing: Arc<dyn BlockDevice>,
        cache: Arc<dyn BlockDevice>,
        options: &OpenOptions,
        clock: Arc<dyn Clock>,
        backing_path: &str,
    ) -> Result<(Engine, OpenReport)> {
        let expected = identity(&*backing, backing_path)?;
        let (mut store, rec) = MetadataStore::open(cache.clone(), &expected)?;
        let sb = rec.superblock.clone();
        let saved_policy = parse_policy_label(&sb.policy);
        let policy = options
            .policy
            .clone()
            .or_else(|| saved_policy.clone())
            .unwrap_or_default();
        let hints_valid = saved_policy.as_ref().map(policy_label) == Some(policy_label(&policy));
        let defaults = EngineConfig::default();
        let mode = options.mode.unwrap_or(sb.mode);
        let cfg = EngineConfig {
            mode,
            block_size: sb.layout.block_size,
            sequential_cutoff: options
                .sequential_cutoff
                .unwrap_or(defaults.sequential_cutoff),
            policy: policy.clone(),
            cache_data_offset: sb.layout.data_offset,
            max_cache_blocks: Some(sb.layout.capacity),
            cache_error_limit: options
                .cache_error_limit
                .unwrap_or(defaults.cache_error_limit),
        };
        let mut engine = Engine::new(backing, cache, &cfg, clock)?;
        let mut report = OpenReport {
            was_clean_shutdown: rec.was_clean_shutdown,
            restored_blocks: 0,
            restored_dirty: 0,
            was_detached: sb.detached,
            journal_records_replayed: rec.journal_records_replayed,
            warnings: rec.warnings.clone(),
        };
        // Withdraw every clean claim (and, after a detach, everything),
        // keeping the blocks in memory: see the module comment.
        let mut withdraw = 0u64;
        {
            let mut d = engine.director.lock();
            for (slot, entry) in rec.mapping.iter().enumerate() {
                let Some(e) = entry else { continue };
                if sb.detached {
                    if e.dirty {
                        return Err(EngineError::Config(format!(
                            "the cache is marked detached but slot {slot} holds dirty data; run `tiercache check --repair`"
                        )));
                    }
                    store.record(slot as u32, None)?;
                    withdraw += 1;
                    continue;
                }
                let hint = if hints_valid { e.hint } else { 0 };
                let ok = d.replacement_mut().restore(
                    OriginBlock(e.oblock),
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
                } else {
                    store.record(slot as u32, None)?;
                    withdraw += 1;
                }
            }
        }
        if withdraw > 0 {
            store.commit()?;
        }
        if sb.detached {
            store.set_detached(false)?;
        }
        if options.mode.is_some_and(|m| m != sb.mode) {
            store.set_mode(mode)?;
        }
        if options.policy.is_some() && !hints_valid {
            store.set_policy(&policy_label(&policy))?;
        }
        engine.persist = Some(Persistence {
            store: Mutex::new(Some(store)),
            pending: Mutex::new(Vec::new()),
            backing_path: backing_path.to_string(),
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
        if let Some(p) = &self.persist {
            p.pending.lock().push((c.0, entry));
        }
    }

    /// The record for a block that just became dirty in slot `c`.
    pub(crate) fn dirty_entry(&self, d: &tiercache_policy::Director, b: OriginBlock) -> Entry {
        Entry {
            oblock: b.0,
            dirty: true,
            hint: d.replacement().hint(b),
        }
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
        let batch = std::mem::take(&mut *p.pending.lock());
        if batch.is_empty() && !always_flush {
            return Ok(());
        }
        let r = (|| {
            self.flush_cache_device()?;
            if batch.is_empty() {
                return Ok(());
            }
            for &(slot, entry) in &batch {
                store.record(slot, entry)?;
            }
            store.commit()?;
            Ok(())
        })();
        if r.is_err() {
            // Keep the records (in front of newer ones) for the next try.
            let mut pending = p.pending.lock();
            let newer = std::mem::replace(&mut *pending, batch);
            pending.extend(newer);
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

    /// Durably records the mode (persistent engines only).
    pub(crate) fn persist_mode(&self, mode: CacheMode) -> Result<()> {
        if let Some(p) = &self.persist {
            if let Some(store) = p.store.lock().as_mut() {
                store.set_mode(mode)?;
            }
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
        self.cache.flush().map_err(|e| EngineError::CacheDirty {
            device: self.cache.describe(),
            source: e,
        })?;
        self.backing
            .flush()
            .map_err(|e| self.backing_err(e, true))?;
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
            if detach && d.replacement().dirty_len() > 0 {
                return Err(EngineError::Config(format!(
                    "cannot detach: {} dirty blocks are not written back",
                    d.replacement().dirty_len()
                )));
            }
            if !detach {
                let r = d.replacement();
                r.for_each_resident(&mut |o, c, dirty| {
                    mapping[c.index()] = Some(Entry {
                        oblock: o.0,
                        dirty,
                        hint: r.hint(o),
                    });
                });
            }
        }
        if detach {
            store.set_detached(true)?;
        }
        let identity = identity(&*self.backing, &p.backing_path)?;
        store.mark_clean_shutdown(&mapping, &identity)?;
        Ok(())
    }
}

fn identity(backing: &dyn BlockDevice, path: &str) -> Result<BackingIdentity> {
    BackingIdentity::of(backing, path).map_err(|e| EngineError::Backing {
        device: backing.describe(),
        source: e,
    })
}
