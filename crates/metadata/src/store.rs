//! The metadata store: format, open (with crash recovery), journal commits,
//! snapshots, clean shutdown.

use crate::codec::{
    encode_journal_block, encode_snapshot_block, encode_superblock, pack, unpack, Area,
    BackingIdentity, Entry, Header, JournalBlock, PackedEntry, Record, Superblock, FORMAT_VERSION,
    FREE_ENTRY, JOURNAL_RECORDS_PER_BLOCK, MAX_OBLOCK, META_BLOCK,
};
use crate::error::{MetadataError, Result};
use crate::layout::{Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
use crate::read::{
    check_features, choose_superblock, entries_in_block, find_conflicts, flush, read_snapshot,
    read_superblocks, replay_journal, scan_beyond, write_blocks, CHUNK_BLOCKS,
};
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_types::CacheMode;

/// The mapping table: entry `i` describes cache slot `i`.
pub type Mapping = Vec<Option<Entry>>;

/// How to format a cache device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatParams {
    /// Cache block size in bytes (power of two, 4 KiB to 1 MiB).
    pub block_size: u32,
    pub mode: CacheMode,
    /// Replacement policy name, so saved hints are used only by the policy
    /// that wrote them (at most 32 bytes stored).
    pub policy: String,
    /// Journal size in bytes; `None` for [`crate::default_journal_bytes`].
    pub journal_bytes: Option<u64>,
    /// The backing device this cache is for.
    pub backing: BackingIdentity,
}

/// What `open` found.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The mapping as of the last durable commit, snapshot or clean shutdown.
    pub mapping: Mapping,
    /// The previous user shut down cleanly (`mark_clean_shutdown`). When
    /// false, the mapping and dirty bits are still exact (the journal makes
    /// every commit durable); only hints written since the last commit and
    /// anything never committed are lost.
    pub was_clean_shutdown: bool,
    /// The superblock as found on disk (before `open` rewrote it).
    pub superblock: Superblock,
    /// Journal blocks (and records) of complete commits replayed.
    pub journal_blocks_replayed: u64,
    pub journal_records_replayed: u64,
    /// Journal blocks of a commit that was torn by the crash (never
    /// acknowledged), ignored.
    pub torn_commit_blocks_ignored: u64,
    /// Things a user may want to know that did not stop the open (a damaged
    /// superblock copy, a changed backing device fingerprint after an
    /// unclean shutdown).
    pub warnings: Vec<String>,
}

/// What one commit wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub records: u64,
    pub journal_blocks: u64,
    /// A snapshot was written (the journal was half full, or the commit
    /// did not fit in the journal and went into the snapshot instead).
    pub snapshot: bool,
    /// Metadata bytes written by this commit, snapshot included.
    pub bytes_written: u64,
}

/// Running totals of metadata IO, for write amplification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetadataStats {
    pub commits: u64,
    pub records: u64,
    pub journal_blocks_written: u64,
    pub snapshots_written: u64,
    pub snapshot_blocks_written: u64,
    pub superblocks_written: u64,
    pub flushes: u64,
}

impl MetadataStats {
    /// Every metadata byte written.
    pub fn bytes_written(&self) -> u64 {
        (self.journal_blocks_written + self.snapshot_blocks_written + self.superblocks_written)
            * META_BLOCK as u64
    }
}

/// The persistent metadata of one cache device.
///
/// Not internally synchronised: `&mut self` methods are called by one
/// thread at a time (the engine holds its own lock around them).
///
/// Durability contract: a mapping change is durable once a `commit` that
/// covers it returned `Ok`. After any IO error the store refuses further
/// changes ([`MetadataError::Failed`]): the disk then holds some state
/// between the last acknowledged commit and the failed one, and `open`
/// recovers it.
pub struct MetadataStore {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    map: Vec<PackedEntry>,
    pending: Vec<Record>,
    /// Sequence of the next journal block to write.
    next_seq: u64,
    backing_blocks: u64,
    stats: MetadataStats,
    failed: bool,
}

impl std::fmt::Debug for MetadataStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataStore")
            .field("device", &self.dev.describe())
            .field("generation", &self.sb.generation)
            .field("snapshot_seq", &self.sb.snapshot_seq)
            .field("journal_start_seq", &self.sb.journal_start_seq)
            .field("next_seq", &self.next_seq)
            .field("pending", &self.pending.len())
            .field("failed", &self.failed)
            .finish()
    }
}

fn backing_blocks(size: u64, block_size: u32) -> u64 {
    size.div_ceil(u64::from(block_size))
}

fn describe_backing(b: &BackingIdentity) -> String {
    let path = if b.path_hint.is_empty() {
        "(path unknown)".to_string()
    } else {
        format!("'{}'", b.path_hint)
    };
    match b.fingerprint {
        Some(f) => format!("{path} of {} bytes, fingerprint {f:08x}", b.size),
        None => format!("{path} of {} bytes", b.size),
    }
}

/// crc32c of the first and the last 64 KiB of `dev` (the whole device
/// twice if it is smaller), to recognise a backing device again.
pub fn fingerprint(dev: &dyn BlockDevice) -> std::io::Result<u32> {
    let size = dev.size();
    let len = size.min(64 << 10);
    let mut buf = vec![0u8; len as usize];
    dev.read_at(&mut buf, 0)?;
    let c = crc32c::crc32c(&buf);
    dev.read_at(&mut buf, size - len)?;
    Ok(crc32c::crc32c_append(c, &buf))
}

impl BackingIdentity {
    /// The identity of `dev` now: its size and fingerprint.
    pub fn of(dev: &dyn BlockDevice, path_hint: &str) -> std::io::Result<BackingIdentity> {
        Ok(BackingIdentity {
            size: dev.size(),
            path_hint: path_hint.to_string(),
            fingerprint: Some(fingerprint(dev)?),
        })
    }
}

impl MetadataStore {
    /// Formats `dev` as an empty cache and returns the open store.
    ///
    /// Order: both superblocks are zeroed and flushed first, so a crash
    /// during format leaves a device that `open` calls `NotFormatted`; then
    /// snapshot A (all slots free) and both superblock copies are written
    /// and flushed. The journal region is not cleared: blocks left by an
    /// earlier format carry another uuid and are never replayed.
    pub fn format(dev: Arc<dyn BlockDevice>, params: &FormatParams) -> Result<MetadataStore> {
        if dev.alignment() > META_BLOCK as u64 {
            return Err(MetadataError::InvalidArgument(format!(
                "{} needs {}-byte alignment; metadata blocks are 4096 bytes",
                dev.describe(),
                dev.alignment()
            )));
        }
        let layout = Layout::compute(dev.size(), params.block_size, params.journal_bytes)?;
        if backing_blocks(params.backing.size, params.block_size) > MAX_OBLOCK + 1 {
            return Err(MetadataError::InvalidArgument(format!(
                "backing device of {} bytes has more than 2^48 blocks",
                params.backing.size
            )));
        }
        if params.backing.size == 0 {
            return Err(MetadataError::InvalidArgument(
                "backing device size is 0".into(),
            ));
        }
        let uuid: [u8; 16] = rand::random();
        let sb = Superblock {
            generation: 0,
            uuid,
            version: FORMAT_VERSION,
            compat: 0,
            ro_compat: 0,
            incompat: 0,
            mode: params.mode,
            clean_shutdown: false,
            detached: false,
            policy: params.policy.clone(),
            layout,
            backing: params.backing.clone(),
            active: Area::B,
            snapshot_seq: 0,
            journal_start_seq: 1,
        };
        let mut store = MetadataStore {
            backing_blocks: backing_blocks(params.backing.size, params.block_size),
            map: vec![FREE_ENTRY; layout.capacity as usize],
            pending: Vec::new(),
            next_seq: 1,
            stats: MetadataStats::default(),
            failed: false,
            dev,
            sb,
        };
        let r = (|| {
            write_blocks(&*store.dev, 0, &[0u8; 2 * META_BLOCK])?;
            store.flush()?;
            // Snapshot 1 into area A with superblock generation 1 (block
            // 1), then generation 2 into block 0 so both copies are valid.
            store.write_snapshot(|_| {})?;
            let sb = store.sb.clone();
            store.write_superblock(sb)
        })();
        r.map(|()| store)
    }

    /// Opens a formatted cache device, recovering the mapping.
    ///
    /// `expected` identifies the backing device the caller is about to use:
    /// its size must match; its fingerprint (if both are known) must match
    /// when the cache was shut down cleanly (after an unclean shutdown
    /// writeback may have changed the backing device, so a mismatch is only
    /// a warning). The path hint is advisory and only updated.
    ///
    /// Before returning, `open` makes the on-disk state "in use": after a
    /// clean shutdown it clears the flag (so a later crash is seen as
    /// unclean); after an unclean one it writes the recovered mapping as a
    /// new snapshot and starts a new journal epoch past every sequence the
    /// crashed run could have written, so leftovers of a torn commit can
    /// never be mistaken for new commits.
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        expected: &BackingIdentity,
    ) -> Result<(MetadataStore, Recovered)> {
        let device = dev.describe();
        let copies = read_superblocks(&*dev)?;
        let (sb, _block, mut warnings) = choose_superblock(&device, &copies)?;
        check_features(&device, &sb, true)?;
        let l = sb.layout;
        if dev.size() < l.required_device_size() {
            return Err(MetadataError::corrupt(
                format!(
                    "the superblock describes a cache device of at least {} bytes but {device} has {} bytes",
                    l.required_device_size(),
                    dev.size()
                ),
                0,
            ));
        }
        if expected.size != sb.backing.size {
            return Err(MetadataError::WrongBackingDevice {
                expected: describe_backing(&sb.backing),
                found: describe_backing(expected),
            });
        }
        if let (Some(want), Some(got)) = (sb.backing.fingerprint, expected.fingerprint) {
            if want != got {
                if sb.clean_shutdown {
                    return Err(MetadataError::WrongBackingDevice {
                        expected: describe_backing(&sb.backing),
                        found: format!(
                            "{} (same size, but its first and last 64 KiB differ from those seen at the last clean shutdown)",
                            describe_backing(expected)
                        ),
                    });
                }
                warnings.push(format!(
                    "backing device fingerprint {got:08x} differs from {want:08x} recorded at the \
                     last clean shutdown; expected after an unclean shutdown with writeback, \
                     otherwise check that this is the right backing device"
                ));
            }
        }
        let mut map = read_snapshot(&*dev, &sb, None)?;
        let replay = replay_journal(&*dev, &sb, &mut map, true, |_, _| {})?;
        if !sb.clean_shutdown {
            // A crash explains a torn last commit, never a lost block
            // followed by later commits: that lost acknowledged updates
            // (perhaps dirty ones), which must not pass silently.
            let gap = replay.end_seq + replay.discarded;
            let (beyond, _) = scan_beyond(&*dev, &sb, gap)?;
            if let Some(b) = beyond.iter().find(|b| b.later) {
                let dirty: usize = beyond
                    .iter()
                    .filter(|b| b.later)
                    .map(|b| b.dirty_records)
                    .sum();
                return Err(MetadataError::corrupt(
                    format!(
                        "journal block of sequence {gap} is lost but later committed blocks \
                         exist (first: sequence {}, {dirty} records marking slots dirty); \
                         acknowledged updates cannot be replayed",
                        b.seq
                    ),
                    l.journal_block_of(gap),
                ));
            }
        }
        let bblocks = backing_blocks(sb.backing.size, l.block_size);
        let conflicts = find_conflicts(&map, bblocks);
        if let Some((oblock, slots)) = conflicts.duplicates.first() {
            return Err(MetadataError::corrupt(
                format!(
                    "origin block {oblock} is mapped by slots {slots:?} ({} such conflicts)",
                    conflicts.duplicates.len()
                ),
                l.area_start(sb.active) + u64::from(slots[1]) / SNAPSHOT_ENTRIES_PER_BLOCK as u64,
            ));
        }
        if let Some(&slot) = conflicts.beyond.first() {
            return Err(MetadataError::corrupt(
                format!(
                    "slot {slot} maps an origin block beyond the end of the {}-byte backing device ({} such slots)",
                    sb.backing.size,
                    conflicts.beyond.len()
                ),
                l.area_start(sb.active) + u64::from(slot) / SNAPSHOT_ENTRIES_PER_BLOCK as u64,
            ));
        }
        let was_clean = sb.clean_shutdown;
        let mut store = MetadataStore {
            dev,
            sb: sb.clone(),
            map,
            pending: Vec::new(),
            next_seq: sb.journal_start_seq,
            backing_blocks: bblocks,
            stats: MetadataStats::default(),
            failed: false,
        };
        let path = expected.path_hint.clone();
        let set_in_use = move |s: &mut Superblock| {
            s.clean_shutdown = false;
            if !path.is_empty() {
                s.backing.path_hint = path;
            }
        };
        if was_clean && replay.blocks == 0 && replay.discarded == 0 {
            let mut new = store.sb.clone();
            set_in_use(&mut new);
            store.write_superblock(new)?;
        } else {
            // Every block of the crashed epoch has a sequence below
            // start + journal_blocks (a commit never overfills the ring).
            store.next_seq = sb.journal_start_seq + l.journal_blocks;
            store.write_snapshot(set_in_use)?;
        }
        let mapping = store.mapping();
        Ok((
            store,
            Recovered {
                mapping,
                was_clean_shutdown: was_clean,
                superblock: sb,
                journal_blocks_replayed: replay.blocks,
                journal_records_replayed: replay.records,
                torn_commit_blocks_ignored: replay.discarded,
                warnings,
            },
        ))
    }

    /// Buffers "slot `slot` now holds `entry`" (`None`: the slot is free)
    /// for the next `commit`. Later records for a slot override earlier
    /// ones. Hints above 63 saturate.
    pub fn record(&mut self, slot: u32, entry: Option<Entry>) -> Result<()> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        self.validate_entry(slot, entry)?;
        self.pending.push(Record {
            slot,
            entry: pack(entry),
        });
        Ok(())
    }

    fn validate_entry(&self, slot: u32, entry: Option<Entry>) -> Result<()> {
        if slot >= self.sb.layout.capacity {
            return Err(MetadataError::InvalidArgument(format!(
                "slot {slot} is beyond the cache's {} slots",
                self.sb.layout.capacity
            )));
        }
        if let Some(e) = entry {
            if e.oblock >= self.backing_blocks {
                return Err(MetadataError::InvalidArgument(format!(
                    "origin block {} is beyond the backing device's {} blocks",
                    e.oblock, self.backing_blocks
                )));
            }
        }
        Ok(())
    }

    /// Number of records buffered since the last commit.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Makes every buffered record durable, in order, as one atomic unit:
    /// after a crash, `open` sees either all of this commit or none of it.
    ///
    /// Ordering contract: the caller must have flushed the cache *data*
    /// the records describe (the block contents in the slots) before
    /// calling `commit`, and must not reuse a slot whose old mapping is
    /// still durable until the commit that unmaps it returned. Otherwise a
    /// crash could leave a durable mapping that points at stale data.
    ///
    /// Writes the records as journal blocks and flushes; writes a snapshot
    /// when the journal is half full (or when the records do not fit in
    /// what is left of it). With no buffered records, does nothing.
    pub fn commit(&mut self) -> Result<CommitStats> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let r = self.commit_inner();
        self.poison_on_io(r)
    }

    fn commit_inner(&mut self) -> Result<CommitStats> {
        if self.pending.is_empty() {
            return Ok(CommitStats::default());
        }
        let records = std::mem::take(&mut self.pending);
        for r in &records {
            self.map[r.slot as usize] = r.entry;
        }
        let before = self.stats.bytes_written();
        let l = self.sb.layout;
        let blocks = records.len().div_ceil(JOURNAL_RECORDS_PER_BLOCK) as u64;
        let used = self.next_seq - self.sb.journal_start_seq;
        let mut snapshot = false;
        let mut journal_blocks = 0;
        if used + blocks > l.journal_blocks {
            // Does not fit: the snapshot itself makes the records durable.
            self.write_snapshot(|_| {})?;
            snapshot = true;
        } else {
            self.write_journal(&records)?;
            journal_blocks = blocks;
            if self.next_seq - self.sb.journal_start_seq >= l.journal_blocks / 2 {
                self.write_snapshot(|_| {})?;
                snapshot = true;
            }
        }
        self.stats.commits += 1;
        self.stats.records += records.len() as u64;
        Ok(CommitStats {
            records: records.len() as u64,
            journal_blocks,
            snapshot,
            bytes_written: self.stats.bytes_written() - before,
        })
    }

    /// Commits the buffered records and writes a snapshot now, emptying the
    /// journal (as `commit` does when the journal is half full).
    pub fn snapshot(&mut self) -> Result<CommitStats> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let r = (|| {
            let before = self.stats.bytes_written();
            let records = std::mem::take(&mut self.pending);
            for r in &records {
                self.map[r.slot as usize] = r.entry;
            }
            self.write_snapshot(|_| {})?;
            self.stats.commits += u64::from(!records.is_empty());
            self.stats.records += records.len() as u64;
            Ok(CommitStats {
                records: records.len() as u64,
                journal_blocks: 0,
                snapshot: true,
                bytes_written: self.stats.bytes_written() - before,
            })
        })();
        self.poison_on_io(r)
    }

    /// Writes `mapping` (the engine's final, complete mapping, hints
    /// included) as a snapshot, records `backing` (with the fingerprint
    /// taken now) and sets the clean-shutdown flag. Buffered records are
    /// dropped: `mapping` supersedes them. Contract: all cache data is
    /// flushed and no IO will follow. Consumes the store.
    pub fn mark_clean_shutdown(
        mut self,
        mapping: &[Option<Entry>],
        backing: &BackingIdentity,
    ) -> Result<()> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        if mapping.len() != self.map.len() {
            return Err(MetadataError::InvalidArgument(format!(
                "final mapping has {} slots, the cache has {}",
                mapping.len(),
                self.map.len()
            )));
        }
        if backing.size != self.sb.backing.size {
            return Err(MetadataError::InvalidArgument(format!(
                "backing device size {} differs from the cache's {}",
                backing.size, self.sb.backing.size
            )));
        }
        for (slot, e) in mapping.iter().enumerate() {
            self.validate_entry(slot as u32, *e)?;
        }
        self.pending.clear();
        for (w, e) in self.map.iter_mut().zip(mapping) {
            *w = pack(*e);
        }
        let backing = backing.clone();
        self.write_snapshot(move |s| {
            s.clean_shutdown = true;
            if !backing.path_hint.is_empty() {
                s.backing.path_hint = backing.path_hint;
            }
            s.backing.fingerprint = backing.fingerprint;
        })
    }

    /// Durably records that the cache is (or is no longer) detached from
    /// its backing device.
    pub fn set_detached(&mut self, detached: bool) -> Result<()> {
        self.edit_superblock(|s| s.detached = detached)
    }

    /// Durably records the cache mode.
    pub fn set_mode(&mut self, mode: CacheMode) -> Result<()> {
        self.edit_superblock(|s| s.mode = mode)
    }

    /// Durably records the replacement policy's name (at most 32 bytes are
    /// stored). Saved hints belong to the policy named here; a caller that
    /// changes policy should record the new name and ignore old hints.
    pub fn set_policy(&mut self, policy: &str) -> Result<()> {
        let policy = policy.to_string();
        self.edit_superblock(move |s| s.policy = policy)
    }

    fn edit_superblock(&mut self, f: impl FnOnce(&mut Superblock)) -> Result<()> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let mut new = self.sb.clone();
        f(&mut new);
        let r = self.write_superblock(new);
        self.poison_on_io(r)
    }

    /// The committed mapping (buffered records not included).
    pub fn mapping(&self) -> Mapping {
        self.map
            .iter()
            .map(|&w| unpack(w).expect("the store only holds valid entries"))
            .collect()
    }

    /// The committed entry of one slot.
    pub fn entry(&self, slot: u32) -> Option<Entry> {
        self.map
            .get(slot as usize)
            .and_then(|&w| unpack(w).expect("the store only holds valid entries"))
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn layout(&self) -> &Layout {
        &self.sb.layout
    }

    /// Metadata IO done by this store since it was formatted or opened.
    pub fn stats(&self) -> MetadataStats {
        self.stats
    }

    /// Journal blocks written since the last snapshot.
    pub fn journal_used(&self) -> u64 {
        self.next_seq - self.sb.journal_start_seq
    }

    /// Used by `repair`: writes `map` as a fresh snapshot of the cache
    /// described by `sb`, with the journal restarting at `next_seq` and the
    /// clean flag cleared, then the superblock once more so both copies are
    /// valid.
    pub(crate) fn rewrite_for_repair(
        dev: Arc<dyn BlockDevice>,
        sb: Superblock,
        map: Vec<PackedEntry>,
        next_seq: u64,
    ) -> Result<MetadataStore> {
        let mut store = MetadataStore {
            backing_blocks: backing_blocks(sb.backing.size, sb.layout.block_size),
            dev,
            sb,
            map,
            pending: Vec::new(),
            next_seq,
            stats: MetadataStats::default(),
            failed: false,
        };
        store.write_snapshot(|s| s.clean_shutdown = false)?;
        let sb = store.sb.clone();
        store.write_superblock(sb)?;
        Ok(store)
    }

    fn poison_on_io<T>(&mut self, r: Result<T>) -> Result<T> {
        if matches!(r, Err(MetadataError::Io { .. })) {
            self.failed = true;
        }
        r
    }

    fn flush(&mut self) -> Result<()> {
        self.stats.flushes += 1;
        flush(&*self.dev)
    }

    /// Writes `records` as one commit at `next_seq..`, then flushes.
    fn write_journal(&mut self, records: &[Record]) -> Result<()> {
        let l = self.sb.layout;
        let start = self.next_seq;
        let nblocks = records.len().div_ceil(JOURNAL_RECORDS_PER_BLOCK);
        let mut buf = vec![0u8; nblocks * META_BLOCK];
        for (i, (chunk, out)) in records
            .chunks(JOURNAL_RECORDS_PER_BLOCK)
            .zip(buf.chunks_mut(META_BLOCK))
            .enumerate()
        {
            let seq = start + i as u64;
            let jb = JournalBlock {
                header: Header {
                    block: l.journal_block_of(seq),
                    uuid: self.sb.uuid,
                    seq,
                },
                commit_start: start,
                last: i + 1 == nblocks,
                records: chunk.to_vec(),
            };
            encode_journal_block(&jb, out);
        }
        // One write per contiguous run of the ring.
        let mut i = 0usize;
        while i < nblocks {
            let pos = (start + i as u64) % l.journal_blocks;
            let run = ((l.journal_blocks - pos) as usize).min(nblocks - i);
            write_blocks(
                &*self.dev,
                l.journal_first + pos,
                &buf[i * META_BLOCK..(i + run) * META_BLOCK],
            )?;
            i += run;
        }
        self.stats.journal_blocks_written += nblocks as u64;
        self.flush()?;
        self.next_seq = start + nblocks as u64;
        Ok(())
    }

    /// Writes the in-memory mapping as the next snapshot into the inactive
    /// area, flushes, then writes a superblock naming it (journal starting
    /// at `next_seq`, further edited by `edit`) and flushes. Until that
    /// superblock is durable the previous snapshot and journal stay
    /// authoritative and untouched.
    fn write_snapshot(&mut self, edit: impl FnOnce(&mut Superblock)) -> Result<()> {
        let l = self.sb.layout;
        let area = self.sb.active.other();
        let seq = self.sb.snapshot_seq + 1;
        let first = l.area_start(area);
        let mut buf = vec![0u8; CHUNK_BLOCKS as usize * META_BLOCK];
        let mut index = 0u64;
        while index < l.snapshot_blocks {
            let n = (l.snapshot_blocks - index).min(CHUNK_BLOCKS);
            for k in 0..n {
                let i = index + k;
                let at = i as usize * SNAPSHOT_ENTRIES_PER_BLOCK;
                let count = entries_in_block(l.capacity, i);
                encode_snapshot_block(
                    self.sb.uuid,
                    seq,
                    first + i,
                    i as u32,
                    &self.map[at..at + count],
                    &mut buf[k as usize * META_BLOCK..(k as usize + 1) * META_BLOCK],
                );
            }
            write_blocks(&*self.dev, first + index, &buf[..n as usize * META_BLOCK])?;
            index += n;
        }
        self.stats.snapshot_blocks_written += l.snapshot_blocks;
        self.stats.snapshots_written += 1;
        self.flush()?;
        let mut new = self.sb.clone();
        new.active = area;
        new.snapshot_seq = seq;
        new.journal_start_seq = self.next_seq;
        edit(&mut new);
        self.write_superblock(new)
    }

    /// Writes `new` as the next generation (into block `generation % 2`,
    /// so the previous copy survives a torn write) and flushes.
    fn write_superblock(&mut self, mut new: Superblock) -> Result<()> {
        new.generation = self.sb.generation + 1;
        let b = encode_superblock(&new);
        write_blocks(&*self.dev, new.generation % 2, &b)?;
        self.stats.superblocks_written += 1;
        self.flush()?;
        self.sb = new;
        Ok(())
    }
}
