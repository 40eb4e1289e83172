//! The metadata store: format, open (with crash recovery), journal commits,
//! snapshots, the volume table, clean shutdown.

use crate::codec::{
    encode_journal_block, encode_snapshot_block, encode_superblock, pack, unpack, Area,
    BackingIdentity, Entry, Header, JournalBlock, PackedEntry, Record, Superblock, FORMAT_VERSION,
    FREE_ENTRY, JOURNAL_RECORDS_PER_BLOCK, MAX_OBLOCK, META_BLOCK,
};
use crate::error::{MetadataError, Result};
use crate::layout::{Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
use crate::read::{
    check_features, choose_superblock, drop_stale, entries_in_block, find_conflicts, flush,
    read_snapshot, read_superblocks, read_volume_table, replay_journal, scan_beyond,
    volume_blocks_of, write_blocks, CHUNK_BLOCKS,
};
use crate::volume::{
    encode_volume_block, stored_path_hint, validate_name, volumes_in_block, NewVolume,
    VolumeRecord, VolumeSlot, VolumeState, DEFAULT_MAX_VOLUMES, VOLUMES_PER_BLOCK,
};
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_types::{CacheMode, VolumeId};

/// The mapping table: entry `i` describes cache slot `i`.
pub type Mapping = Vec<Option<Entry>>;

/// How to format a cache device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatParams {
    /// Cache block size in bytes (power of two, 4 KiB to 1 MiB).
    pub block_size: u32,
    /// The default mode of new volumes.
    pub mode: CacheMode,
    /// Replacement policy name, so saved hints are used only by the policy
    /// that wrote them (at most 32 bytes stored).
    pub policy: String,
    /// Journal size in bytes; `None` for [`crate::default_journal_bytes`].
    pub journal_bytes: Option<u64>,
    /// Records in the volume table (1 to 65535); `None` for 1024.
    pub max_volumes: Option<u32>,
    /// Volumes attached at format time, as indices 0, 1, ...
    pub volumes: Vec<NewVolume>,
}

/// What `open` found.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The mapping as of the last durable commit, snapshot or clean
    /// shutdown, stale entries removed: every entry belongs to the current
    /// attachment of an attached (or detaching) volume.
    pub mapping: Mapping,
    /// The volume table, indexed by `VolumeId`.
    pub volumes: Vec<VolumeSlot>,
    /// Entries dropped because their volume is not attached or was attached
    /// again since they were recorded (another generation).
    pub stale_entries: u64,
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
    /// superblock copy, stale entries dropped).
    pub warnings: Vec<String>,
}

impl Recovered {
    /// The record of volume `id`, if attached (or detaching).
    pub fn volume(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.volumes.get(id.index()).and_then(VolumeSlot::record)
    }

    /// Checks that `found` is the backing device of volume `id` (see
    /// [`VolumeRecord::check_backing`]); returns a warning to show, if any.
    pub fn check_backing(&self, id: VolumeId, found: &BackingIdentity) -> Result<Option<String>> {
        self.volume(id)
            .ok_or(MetadataError::NotAttached { volume: id.0 })?
            .check_backing(found, self.was_clean_shutdown)
    }
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
    pub volume_blocks_written: u64,
    pub flushes: u64,
}

impl MetadataStats {
    /// Every metadata byte written.
    pub fn bytes_written(&self) -> u64 {
        (self.journal_blocks_written
            + self.snapshot_blocks_written
            + self.superblocks_written
            + self.volume_blocks_written)
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
    /// The volume table as last written.
    table: Vec<VolumeSlot>,
    pending: Vec<Record>,
    /// Sequence of the next journal block to write.
    next_seq: u64,
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

/// Checks a volume to attach against `table`; returns its record (with
/// the next generation of index `id`).
fn new_record(
    table: &[VolumeSlot],
    id: usize,
    v: &NewVolume,
    default_mode: CacheMode,
    block_size: u32,
) -> Result<VolumeRecord> {
    validate_name(&v.name)?;
    if let Some(i) = table
        .iter()
        .position(|s| s.record().is_some_and(|r| r.name == v.name))
    {
        return Err(MetadataError::InvalidArgument(format!(
            "a volume named '{}' is already attached (volume {i})",
            v.name
        )));
    }
    if v.identity.size == 0 {
        return Err(MetadataError::InvalidArgument(format!(
            "volume '{}': backing device size is 0",
            v.name
        )));
    }
    if backing_blocks(v.identity.size, block_size) > MAX_OBLOCK + 1 {
        return Err(MetadataError::InvalidArgument(format!(
            "volume '{}': backing device of {} bytes has more than 2^48 blocks",
            v.name, v.identity.size
        )));
    }
    Ok(VolumeRecord {
        generation: table[id].next_generation(),
        state: VolumeState::Attached,
        uuid: rand::random(),
        name: v.name.clone(),
        size: v.identity.size,
        fingerprint: v.identity.fingerprint,
        mode: v.mode.unwrap_or(default_mode),
        sequential_cutoff: v.sequential_cutoff,
        path_hint: stored_path_hint(&v.identity.path_hint),
    })
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
        let layout = Layout::compute(
            dev.size(),
            params.block_size,
            params.max_volumes.unwrap_or(DEFAULT_MAX_VOLUMES),
            params.journal_bytes,
        )?;
        if params.volumes.len() > layout.max_volumes as usize {
            return Err(MetadataError::InvalidArgument(format!(
                "{} volumes do not fit in a volume table of {}",
                params.volumes.len(),
                layout.max_volumes
            )));
        }
        let mut table = vec![VolumeSlot::Free { last_generation: 0 }; layout.max_volumes as usize];
        for (i, v) in params.volumes.iter().enumerate() {
            table[i] = VolumeSlot::Used(new_record(&table, i, v, params.mode, params.block_size)?);
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
            volumes_active: Area::B,
            volumes_generation: 1,
            active: Area::B,
            snapshot_seq: 0,
            journal_start_seq: 1,
        };
        let mut store = MetadataStore {
            map: vec![FREE_ENTRY; layout.capacity as usize],
            table: table.clone(),
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
            // Snapshot 1 into area A and volume table generation 2 into
            // copy A with superblock generation 1 (block 1), then
            // generation 2 into block 0 so both copies are valid.
            store.write_state(true, Some(table), |_| {})?;
            let sb = store.sb.clone();
            store.write_superblock(sb)
        })();
        r.map(|()| store)
    }

    /// Opens a formatted cache device, recovering the volume table and the
    /// mapping.
    ///
    /// Entries whose volume is not attached, or whose volume generation
    /// differs from the volume's current one (the index was detached and
    /// attached again), are stale: dropped, counted in
    /// [`Recovered::stale_entries`], never returned.
    ///
    /// A caller about to use backing devices checks them with
    /// [`MetadataStore::open_with`] (before anything is written).
    ///
    /// Before returning, `open` makes the on-disk state "in use": after a
    /// clean shutdown it clears the flag (so a later crash is seen as
    /// unclean); after an unclean one it writes the recovered mapping as a
    /// new snapshot and starts a new journal epoch past every sequence the
    /// crashed run could have written, so leftovers of a torn commit can
    /// never be mistaken for new commits.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<(MetadataStore, Recovered)> {
        Self::open_with(dev, &[])
    }

    /// The attached volumes of the cache on `dev`, read without writing
    /// anything (to find which volume a backing device given by name is,
    /// before [`MetadataStore::open_with`] checks it).
    pub fn peek_volumes(dev: &dyn BlockDevice) -> Result<Vec<(VolumeId, VolumeRecord)>> {
        let device = dev.describe();
        let copies = read_superblocks(dev)?;
        let (sb, _block, _warnings) = choose_superblock(&device, &copies)?;
        check_features(&device, &sb, true)?;
        let table = read_volume_table(dev, &sb, None)?;
        Ok(table
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.record().map(|r| (VolumeId(i as u16), r.clone())))
            .collect())
    }

    /// [`MetadataStore::open`], checking first that each `(volume,
    /// identity)` of `backing` is attached and matches its record
    /// ([`VolumeRecord::check_backing`]: the size must match; a differing
    /// fingerprint is refused after a clean shutdown and a warning after an
    /// unclean one). The checks are made before `open` writes anything, so
    /// a refused open leaves the device as it was (a clean shutdown stays
    /// recorded as clean).
    pub fn open_with(
        dev: Arc<dyn BlockDevice>,
        backing: &[(VolumeId, BackingIdentity)],
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
        let table = read_volume_table(&*dev, &sb, None)?;
        for (id, found) in backing {
            let Some(r) = table.get(id.index()).and_then(VolumeSlot::record) else {
                return Err(MetadataError::NotAttached { volume: id.0 });
            };
            if let Some(w) = r.check_backing(found, sb.clean_shutdown)? {
                warnings.push(w);
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
        let stale = drop_stale(&table, &mut map).len() as u64;
        if stale > 0 {
            warnings.push(format!(
                "{stale} cache entries belong to volumes that are no longer attached (or were \
                 attached again since); dropped as stale"
            ));
        }
        let conflicts = find_conflicts(&map, &table, l.block_size);
        if let Some(((volume, oblock), slots)) = conflicts.duplicates.first() {
            return Err(MetadataError::corrupt(
                format!(
                    "block {oblock} of volume {volume} is mapped by slots {slots:?} ({} such conflicts)",
                    conflicts.duplicates.len()
                ),
                l.area_start(sb.active) + u64::from(slots[1]) / SNAPSHOT_ENTRIES_PER_BLOCK as u64,
            ));
        }
        if let Some(&slot) = conflicts.beyond.first() {
            return Err(MetadataError::corrupt(
                format!(
                    "slot {slot} maps an origin block beyond the end of its volume ({} such slots)",
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
            table: table.clone(),
            pending: Vec::new(),
            next_seq: sb.journal_start_seq,
            stats: MetadataStats::default(),
            failed: false,
        };
        let set_in_use = |s: &mut Superblock| s.clean_shutdown = false;
        if was_clean && replay.blocks == 0 && replay.discarded == 0 && stale == 0 {
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
                volumes: table,
                stale_entries: stale,
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
    /// ones. Hints above 63 saturate. The entry is stored with its volume's
    /// current generation; a volume that is not attached (or detaching) is
    /// refused with [`MetadataError::NotAttached`].
    pub fn record(&mut self, slot: u32, entry: Option<Entry>) -> Result<()> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let generation = self.validate_entry(slot, entry)?;
        self.pending.push(Record {
            slot,
            entry: pack(entry, generation),
        });
        Ok(())
    }

    /// Checks a record; returns the generation to store it with (0 for a
    /// free slot).
    fn validate_entry(&self, slot: u32, entry: Option<Entry>) -> Result<u16> {
        if slot >= self.sb.layout.capacity {
            return Err(MetadataError::InvalidArgument(format!(
                "slot {slot} is beyond the cache's {} slots",
                self.sb.layout.capacity
            )));
        }
        let Some(e) = entry else {
            return Ok(0);
        };
        let Some(r) = self.volume(e.volume) else {
            return Err(MetadataError::NotAttached { volume: e.volume.0 });
        };
        let blocks = volume_blocks_of(&self.table, self.sb.layout.block_size, e.volume);
        if e.oblock >= blocks {
            return Err(MetadataError::InvalidArgument(format!(
                "origin block {} is beyond the {} blocks of volume '{}'",
                e.oblock, blocks, r.name
            )));
        }
        Ok(r.generation)
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
    /// included) as a snapshot, records for each volume of `backing` its
    /// identity (fingerprint taken now; path hint when not empty; the size
    /// must match) in the volume table, and sets the clean-shutdown flag.
    /// Volumes not listed keep their record but lose their fingerprint
    /// (unknown). Buffered records are dropped: `mapping` supersedes them.
    /// Contract: all cache data is flushed and no IO will follow. Consumes
    /// the store.
    pub fn mark_clean_shutdown(
        mut self,
        mapping: &[Option<Entry>],
        backing: &[(VolumeId, BackingIdentity)],
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
        let mut table = self.table.clone();
        for slot in table.iter_mut() {
            if let VolumeSlot::Used(r) = slot {
                r.fingerprint = None;
            }
        }
        for (id, b) in backing {
            let Some(VolumeSlot::Used(r)) = table.get_mut(id.index()) else {
                return Err(MetadataError::NotAttached { volume: id.0 });
            };
            if b.size != r.size {
                return Err(MetadataError::InvalidArgument(format!(
                    "backing device size {} differs from the {} bytes of volume '{}'",
                    b.size, r.size, r.name
                )));
            }
            r.fingerprint = b.fingerprint;
            if !b.path_hint.is_empty() {
                r.path_hint = stored_path_hint(&b.path_hint);
            }
        }
        let mut packed = Vec::with_capacity(mapping.len());
        for (slot, e) in mapping.iter().enumerate() {
            packed.push(pack(*e, self.validate_entry(slot as u32, *e)?));
        }
        self.pending.clear();
        self.map = packed;
        self.write_state(true, Some(table), |s| s.clean_shutdown = true)
    }

    /// The volume table, indexed by `VolumeId`.
    pub fn volume_table(&self) -> &[VolumeSlot] {
        &self.table
    }

    /// The attached (and detaching) volumes.
    pub fn volumes(&self) -> Vec<(VolumeId, &VolumeRecord)> {
        self.table
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((VolumeId(i as u16), s.record()?)))
            .collect()
    }

    /// The record of volume `id`, if attached (or detaching).
    pub fn volume(&self, id: VolumeId) -> Option<&VolumeRecord> {
        self.table.get(id.index()).and_then(VolumeSlot::record)
    }

    /// Durably attaches a volume at the lowest free index, with that
    /// index's next generation. Refuses an invalid or duplicate name, a
    /// size of 0 and a full table.
    pub fn attach(&mut self, volume: &NewVolume) -> Result<VolumeId> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let Some(id) = self.table.iter().position(|s| s.record().is_none()) else {
            return Err(MetadataError::InvalidArgument(format!(
                "the volume table is full ({} volumes); format the cache with a larger max_volumes",
                self.table.len()
            )));
        };
        let r = new_record(
            &self.table,
            id,
            volume,
            self.sb.mode,
            self.sb.layout.block_size,
        )?;
        self.edit_table(|t| t[id] = VolumeSlot::Used(r))?;
        Ok(VolumeId(id as u16))
    }

    /// Durably sets the cache mode of volume `id`.
    pub fn set_volume_mode(&mut self, id: VolumeId, mode: CacheMode) -> Result<()> {
        self.edit_record(id, |r| r.mode = mode)
    }

    /// Durably sets the sequential cutoff of volume `id`.
    pub fn set_volume_cutoff(&mut self, id: VolumeId, cutoff: Option<u64>) -> Result<()> {
        self.edit_record(id, |r| r.sequential_cutoff = cutoff)
    }

    /// Durably sets the state of volume `id` (`Detaching`: its dirty
    /// blocks are being written back; its entries stay valid).
    pub fn set_volume_state(&mut self, id: VolumeId, state: VolumeState) -> Result<()> {
        self.edit_record(id, |r| r.state = state)
    }

    /// Durably detaches volume `id`: its index becomes free (keeping its
    /// generation, so a later attach gets a new one). Refuses while any
    /// committed or buffered entry maps the volume: the caller writes its
    /// dirty blocks back and frees (and commits) its slots first.
    pub fn detach(&mut self, id: VolumeId) -> Result<()> {
        let Some(r) = self.volume(id) else {
            return Err(MetadataError::NotAttached { volume: id.0 });
        };
        let generation = r.generation;
        let of_volume = |w: &PackedEntry| matches!(unpack(*w), Ok(Some(e)) if e.volume == id);
        let committed = self.map.iter().filter(|w| of_volume(w)).count();
        let pending = self.pending.iter().filter(|r| of_volume(&r.entry)).count();
        if committed + pending > 0 {
            return Err(MetadataError::InvalidArgument(format!(
                "cannot detach volume '{}': {committed} committed and {pending} buffered \
                 entries still map it; write its dirty blocks back, free its slots and commit \
                 first",
                r.name
            )));
        }
        self.edit_table(|t| {
            t[id.index()] = VolumeSlot::Free {
                last_generation: generation,
            }
        })
    }

    fn edit_record(&mut self, id: VolumeId, f: impl FnOnce(&mut VolumeRecord)) -> Result<()> {
        if self.volume(id).is_none() {
            return Err(MetadataError::NotAttached { volume: id.0 });
        }
        self.edit_table(|t| {
            if let VolumeSlot::Used(r) = &mut t[id.index()] {
                f(r)
            }
        })
    }

    /// Writes the edited table into the inactive copy, flushes, then a
    /// superblock naming it, flushes.
    fn edit_table(&mut self, f: impl FnOnce(&mut Vec<VolumeSlot>)) -> Result<()> {
        if self.failed {
            return Err(MetadataError::Failed);
        }
        let mut table = self.table.clone();
        f(&mut table);
        let r = self.write_state(false, Some(table), |_| {});
        self.poison_on_io(r)
    }

    /// Durably records that the cache is (or is no longer) detached from
    /// its backing device.
    pub fn set_detached(&mut self, detached: bool) -> Result<()> {
        self.edit_superblock(|s| s.detached = detached)
    }

    /// Durably records the default mode of new volumes.
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
        table: Vec<VolumeSlot>,
        map: Vec<PackedEntry>,
        next_seq: u64,
    ) -> Result<MetadataStore> {
        let mut store = MetadataStore {
            dev,
            sb,
            map,
            table: table.clone(),
            pending: Vec::new(),
            next_seq,
            stats: MetadataStats::default(),
            failed: false,
        };
        store.write_state(true, Some(table), |s| s.clean_shutdown = false)?;
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
        self.write_state(true, None, edit)
    }

    /// With `snapshot`, writes the in-memory mapping as the next snapshot
    /// into the inactive snapshot area; with `table`, writes it as the next
    /// volume-table generation into the inactive table copy. Then flushes,
    /// and writes a superblock naming what was written (edited by `edit`)
    /// and flushes. Until that superblock is durable the previous snapshot,
    /// journal and table stay authoritative and untouched.
    fn write_state(
        &mut self,
        snapshot: bool,
        table: Option<Vec<VolumeSlot>>,
        edit: impl FnOnce(&mut Superblock),
    ) -> Result<()> {
        let mut new = self.sb.clone();
        if snapshot {
            self.write_snapshot_blocks()?;
            new.active = self.sb.active.other();
            new.snapshot_seq = self.sb.snapshot_seq + 1;
            new.journal_start_seq = self.next_seq;
        }
        if let Some(t) = &table {
            self.write_table_blocks(t)?;
            new.volumes_active = self.sb.volumes_active.other();
            new.volumes_generation = self.sb.volumes_generation + 1;
        }
        self.flush()?;
        edit(&mut new);
        self.write_superblock(new)?;
        if let Some(t) = table {
            self.table = t;
        }
        Ok(())
    }

    /// Writes `table` as generation `volumes_generation + 1` into the
    /// inactive copy (no flush).
    fn write_table_blocks(&mut self, table: &[VolumeSlot]) -> Result<()> {
        let l = self.sb.layout;
        let copy = self.sb.volumes_active.other();
        let seq = self.sb.volumes_generation + 1;
        let first = l.volumes_start(copy);
        let mut buf = vec![0u8; l.volume_blocks as usize * META_BLOCK];
        for (i, out) in buf.chunks_mut(META_BLOCK).enumerate() {
            let at = i * VOLUMES_PER_BLOCK;
            let n = volumes_in_block(l.max_volumes, i as u64);
            encode_volume_block(
                self.sb.uuid,
                seq,
                first + i as u64,
                i as u32,
                &table[at..at + n],
                out,
            );
        }
        write_blocks(&*self.dev, first, &buf)?;
        self.stats.volume_blocks_written += l.volume_blocks;
        Ok(())
    }

    /// Writes the in-memory mapping as snapshot `snapshot_seq + 1` into the
    /// inactive area (no flush).
    fn write_snapshot_blocks(&mut self) -> Result<()> {
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
        Ok(())
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
