//! Reading the metadata back: superblock choice, snapshot loading, journal
//! replay. Shared by `MetadataStore::open` (strict: any damage that a crash
//! cannot explain is an error) and `check` / `repair` (lenient: damage is
//! reported and reading goes on).

use crate::codec::{
    decode_journal_block, decode_snapshot_block, decode_superblock, entry_generation, unpack,
    DecodeError, PackedEntry, Record, Superblock, FORMAT_VERSION, FORMAT_VERSION_2, FREE_ENTRY,
    KNOWN_INCOMPAT, KNOWN_RO_COMPAT, META_BLOCK,
};
use crate::error::{MetadataError, Result};
use crate::layout::SNAPSHOT_ENTRIES_PER_BLOCK;
use crate::volume::{
    decode_volume_block, duplicate_names, volumes_in_block, VolumeSlot, VOLUMES_PER_BLOCK,
};
use tiercache_device::BlockDevice;
use tiercache_types::VolumeId;

/// Blocks read or written per IO when streaming a region.
pub(crate) const CHUNK_BLOCKS: u64 = 256;

pub(crate) fn read_blocks(dev: &dyn BlockDevice, first: u64, buf: &mut [u8]) -> Result<()> {
    dev.read_at(buf, first * META_BLOCK as u64).map_err(|e| {
        MetadataError::io(
            format!(
                "reading metadata blocks {first}..{} of {}",
                first + (buf.len() / META_BLOCK) as u64,
                dev.describe()
            ),
            e,
        )
    })
}

pub(crate) fn write_blocks(dev: &dyn BlockDevice, first: u64, buf: &[u8]) -> Result<()> {
    dev.write_at(buf, first * META_BLOCK as u64).map_err(|e| {
        MetadataError::io(
            format!(
                "writing metadata blocks {first}..{} of {}",
                first + (buf.len() / META_BLOCK) as u64,
                dev.describe()
            ),
            e,
        )
    })
}

pub(crate) fn flush(dev: &dyn BlockDevice) -> Result<()> {
    dev.flush()
        .map_err(|e| MetadataError::io(format!("flushing {}", dev.describe()), e))
}

/// Both superblock copies as decoded (block 0, block 1).
pub(crate) type Copies = [std::result::Result<Superblock, DecodeError>; 2];

pub(crate) fn read_superblocks(dev: &dyn BlockDevice) -> Result<Copies> {
    if dev.size() < 2 * META_BLOCK as u64 {
        return Err(MetadataError::NotFormatted {
            device: dev.describe(),
        });
    }
    let mut buf = vec![0u8; 2 * META_BLOCK];
    read_blocks(dev, 0, &mut buf)?;
    Ok([
        decode_superblock(&buf[..META_BLOCK], 0),
        decode_superblock(&buf[META_BLOCK..], 1),
    ])
}

/// Picks the valid copy with the highest generation. Returns it, the block
/// it came from, and warnings about the other copy.
///
/// A copy of an unsupported version wins over everything (refused with
/// `UnsupportedVersion`, or `OldFormat` for version 2): another tiercache
/// has written this device.
pub(crate) fn choose_superblock(
    device: &str,
    copies: &Copies,
) -> Result<(Superblock, u64, Vec<String>)> {
    for c in copies {
        if let Err(DecodeError::UnsupportedVersion { found }) = c {
            if *found == FORMAT_VERSION_2 {
                return Err(MetadataError::OldFormat {
                    device: device.to_string(),
                });
            }
            return Err(MetadataError::UnsupportedVersion {
                device: device.to_string(),
                found: *found,
                supported: FORMAT_VERSION,
            });
        }
    }
    let best = (0..2u64)
        .filter_map(|i| copies[i as usize].as_ref().ok().map(|sb| (i, sb)))
        .max_by_key(|(_, sb)| sb.generation);
    let Some((block, sb)) = best else {
        let magic = |c: &std::result::Result<Superblock, DecodeError>| {
            matches!(c, Err(DecodeError::WrongMagic { .. }))
        };
        if magic(&copies[0]) && magic(&copies[1]) {
            return Err(MetadataError::NotFormatted {
                device: device.to_string(),
            });
        }
        let err = |i: usize| match &copies[i] {
            Err(e) => e.to_string(),
            Ok(_) => "valid".to_string(),
        };
        return Err(MetadataError::corrupt(
            format!(
                "no valid superblock copy (copy 0: {}; copy 1: {})",
                err(0),
                err(1)
            ),
            0,
        ));
    };
    let mut warnings = Vec::new();
    let other = 1 - block;
    match &copies[other as usize] {
        Err(e) => warnings.push(format!(
            "superblock copy {other} is not valid ({e}); using copy {block} (generation {})",
            sb.generation
        )),
        Ok(o) if o.uuid != sb.uuid => warnings.push(format!(
            "superblock copy {other} belongs to another cache (uuid differs); using copy {block}"
        )),
        Ok(_) => {}
    }
    Ok((sb.clone(), block, warnings))
}

/// Refuses unknown incompat bits always and unknown ro_compat bits when the
/// caller will write.
pub(crate) fn check_features(device: &str, sb: &Superblock, writing: bool) -> Result<()> {
    let incompat = sb.incompat & !KNOWN_INCOMPAT;
    let ro_compat = sb.ro_compat & !KNOWN_RO_COMPAT;
    if incompat != 0 || (writing && ro_compat != 0) {
        return Err(MetadataError::IncompatibleFeatures {
            device: device.to_string(),
            incompat,
            ro_compat,
            read_only_ok: incompat == 0,
        });
    }
    Ok(())
}

/// Entries expected in snapshot block `index` of a mapping of `capacity`.
pub(crate) fn entries_in_block(capacity: u32, index: u64) -> usize {
    let first = index * SNAPSHOT_ENTRIES_PER_BLOCK as u64;
    (u64::from(capacity).saturating_sub(first)).min(SNAPSHOT_ENTRIES_PER_BLOCK as u64) as usize
}

/// Reads the active snapshot of `sb` into a packed mapping.
///
/// `bad` is `None` for strict reading (the first bad block is a `Corrupt`
/// error). With `Some(f)`, a bad block's slots read as free and
/// `f(block, index, why)` is called.
pub(crate) fn read_snapshot(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    mut bad: Option<&mut dyn FnMut(u64, u64, String)>,
) -> Result<Vec<PackedEntry>> {
    let l = &sb.layout;
    let first = l.area_start(sb.active);
    let mut map = vec![FREE_ENTRY; l.capacity as usize];
    let mut buf = vec![0u8; (CHUNK_BLOCKS as usize) * META_BLOCK];
    let mut index = 0u64;
    while index < l.snapshot_blocks {
        let n = (l.snapshot_blocks - index).min(CHUNK_BLOCKS);
        let chunk = &mut buf[..n as usize * META_BLOCK];
        read_blocks(dev, first + index, chunk)?;
        for (k, b) in chunk.chunks(META_BLOCK).enumerate() {
            let i = index + k as u64;
            let block = first + i;
            let want = entries_in_block(l.capacity, i);
            let problem = match decode_snapshot_block(b, block) {
                Err(e) => Some(e.to_string()),
                Ok(s) if s.header.uuid != sb.uuid => {
                    Some("block belongs to another cache (uuid differs)".to_string())
                }
                Ok(s) if s.header.seq != sb.snapshot_seq => Some(format!(
                    "block is from snapshot {} but the superblock names snapshot {}",
                    s.header.seq, sb.snapshot_seq
                )),
                Ok(s) if u64::from(s.index) != i || s.entries.len() != want => Some(format!(
                    "block says it is snapshot block {} with {} entries; expected block {i} with {want}",
                    s.index,
                    s.entries.len()
                )),
                Ok(s) => {
                    let at = i as usize * SNAPSHOT_ENTRIES_PER_BLOCK;
                    map[at..at + want].copy_from_slice(&s.entries);
                    None
                }
            };
            if let Some(why) = problem {
                match bad.as_mut() {
                    None => {
                        return Err(MetadataError::corrupt(
                            format!("snapshot {:?} block {i}: {why}", sb.active),
                            block,
                        ))
                    }
                    Some(f) => f(block, i, why),
                }
            }
        }
        index += n;
    }
    Ok(map)
}

/// Reads the active volume-table copy of `sb`.
///
/// `bad` is `None` for strict reading (the first bad block, or a name used
/// twice, is a `Corrupt` error). With `Some(f)`, a bad block's records
/// read as free (last generation 0) and `f(block, why)` is called; names
/// used twice are left for the caller to report.
pub(crate) fn read_volume_table(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    mut bad: Option<&mut dyn FnMut(u64, String)>,
) -> Result<Vec<VolumeSlot>> {
    let l = &sb.layout;
    let first = l.volumes_start(sb.volumes_active);
    let mut table = vec![VolumeSlot::Free { last_generation: 0 }; l.max_volumes as usize];
    let mut buf = vec![0u8; l.volume_blocks as usize * META_BLOCK];
    read_blocks(dev, first, &mut buf)?;
    for (i, b) in buf.chunks(META_BLOCK).enumerate() {
        let i = i as u64;
        let block = first + i;
        let want = volumes_in_block(l.max_volumes, i);
        let problem = match decode_volume_block(b, block) {
            Err(e) => Some(e.to_string()),
            Ok(v) if v.header.uuid != sb.uuid => {
                Some("block belongs to another cache (uuid differs)".to_string())
            }
            Ok(v) if v.header.seq != sb.volumes_generation => Some(format!(
                "block is from volume-table generation {} but the superblock names generation {}",
                v.header.seq, sb.volumes_generation
            )),
            Ok(v) if u64::from(v.index) != i || v.slots.len() != want => Some(format!(
                "block says it is volume-table block {} with {} records; expected block {i} with {want}",
                v.index,
                v.slots.len()
            )),
            Ok(v) => {
                let at = i as usize * VOLUMES_PER_BLOCK;
                for (k, slot) in v.slots.into_iter().enumerate() {
                    table[at + k] = slot;
                }
                None
            }
        };
        if let Some(why) = problem {
            match bad.as_mut() {
                None => {
                    return Err(MetadataError::corrupt(
                        format!("volume table {:?} block {i}: {why}", sb.volumes_active),
                        block,
                    ))
                }
                Some(f) => f(block, why),
            }
        }
    }
    if bad.is_none() {
        if let Some((name, ids)) = duplicate_names(&table).first() {
            return Err(MetadataError::corrupt(
                format!("volume name '{name}' is used by volumes {ids:?}"),
                first,
            ));
        }
    }
    Ok(table)
}

/// Whether a packed entry belongs to the current attachment of its volume
/// (an attached or detaching record with the generation the entry was
/// claimed with). Free slots are not live.
pub(crate) fn is_live(table: &[VolumeSlot], w: &PackedEntry) -> bool {
    match unpack(*w) {
        Ok(Some(e)) => table
            .get(e.volume.index())
            .and_then(VolumeSlot::record)
            .is_some_and(|r| r.generation == entry_generation(w)),
        _ => false,
    }
}

/// Frees every mapped slot of `map` whose entry is stale (its volume is not
/// attached, or was attached again since the claim: another generation).
/// Returns the slots freed. This is the isolation rule: a block recorded
/// for one attachment of a volume index is never returned for another.
pub(crate) fn drop_stale(table: &[VolumeSlot], map: &mut [PackedEntry]) -> Vec<u32> {
    let mut dropped = Vec::new();
    for (slot, w) in map.iter_mut().enumerate() {
        if *w != FREE_ENTRY && !is_live(table, w) {
            *w = FREE_ENTRY;
            dropped.push(slot as u32);
        }
    }
    dropped
}

/// What a journal replay found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Replay {
    /// Blocks of complete commits applied.
    pub blocks: u64,
    /// Records applied.
    pub records: u64,
    /// Blocks of a trailing incomplete commit, ignored.
    pub discarded: u64,
    /// First sequence not applied (the end of the log).
    pub end_seq: u64,
    /// Why the log ended there (`None` when the whole ring was live).
    pub stop: Option<(u64, String)>,
    /// A crc-valid block of this cache whose content is impossible
    /// (lenient mode only; strict mode returns an error instead).
    pub corrupt: Option<(u64, String)>,
}

/// Replays the journal of `sb` onto `map`: complete commits from
/// `journal_start_seq` on, in order, while each block is valid, of this
/// cache, has exactly the next sequence and belongs to the commit in
/// progress. `applied(seq, slot)` is called for every applied record with
/// the sequence of its commit's last block.
pub(crate) fn replay_journal(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    map: &mut [PackedEntry],
    strict: bool,
    mut applied: impl FnMut(u64, u32),
) -> Result<Replay> {
    let l = &sb.layout;
    let n = l.journal_blocks;
    let start = sb.journal_start_seq;
    let mut r = Replay {
        end_seq: start,
        ..Replay::default()
    };
    let mut pending: Vec<Record> = Vec::new();
    let mut pending_blocks = 0u64;
    let mut open_commit: Option<u64> = None;
    let mut buf = vec![0u8; (CHUNK_BLOCKS as usize) * META_BLOCK];
    // Ring positions [chunk_pos, chunk_pos + chunk_len) are in `buf`.
    let (mut chunk_pos, mut chunk_len) = (0u64, 0u64);
    let mut seq = start;
    'log: while seq < start.saturating_add(n) {
        let pos = seq % n;
        if pos < chunk_pos || pos >= chunk_pos + chunk_len {
            chunk_pos = pos;
            chunk_len = (n - pos).min(CHUNK_BLOCKS);
            read_blocks(
                dev,
                l.journal_first + pos,
                &mut buf[..chunk_len as usize * META_BLOCK],
            )?;
        }
        let at = ((pos - chunk_pos) as usize) * META_BLOCK;
        let b = &buf[at..at + META_BLOCK];
        let block = l.journal_first + pos;
        let stop = |why: String| Some((block, why));
        let jb = match decode_journal_block(b, block) {
            Err(e) => {
                r.stop = stop(e.to_string());
                break;
            }
            Ok(jb) => jb,
        };
        if jb.header.uuid != sb.uuid {
            r.stop = stop("journal block of another cache (uuid differs)".into());
            break;
        }
        if jb.header.seq != seq {
            r.stop = stop(format!(
                "journal block has sequence {}, expected {seq}",
                jb.header.seq
            ));
            break;
        }
        let commit = open_commit.unwrap_or(seq);
        if jb.commit_start != commit {
            r.stop = stop(format!(
                "journal block {seq} belongs to the commit starting at {}, expected {commit}",
                jb.commit_start
            ));
            break;
        }
        for rec in &jb.records {
            if rec.slot >= l.capacity {
                let why = format!(
                    "journal block {seq} has a record for slot {} but the cache has {} slots",
                    rec.slot, l.capacity
                );
                if strict {
                    return Err(MetadataError::corrupt(why, block));
                }
                r.corrupt = stop(why.clone());
                r.stop = stop(why);
                break 'log;
            }
        }
        pending.extend_from_slice(&jb.records);
        pending_blocks += 1;
        if jb.last {
            for rec in pending.drain(..) {
                map[rec.slot as usize] = rec.entry;
                applied(seq, rec.slot);
                r.records += 1;
            }
            r.blocks += pending_blocks;
            pending_blocks = 0;
            open_commit = None;
            r.end_seq = seq + 1;
        } else {
            open_commit = Some(commit);
        }
        seq += 1;
    }
    r.discarded = pending_blocks;
    Ok(r)
}

/// A valid journal block of the current epoch found at or after the end of
/// the log.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Beyond {
    pub seq: u64,
    pub block: u64,
    /// Belongs to a commit that started after the gap. Commits run one at
    /// a time, each flushed before the next starts, so such a block proves
    /// the block at the gap was once durable (acknowledged) and was lost.
    /// Otherwise it is part of the commit spanning the gap: torn by a crash.
    pub later: bool,
    /// Its records that mark a slot dirty.
    pub dirty_records: usize,
}

/// Reads the whole journal ring; returns the valid blocks of this cache
/// with sequences in `[gap, journal_start_seq + journal_blocks)`, sorted,
/// and the highest journal sequence of this cache seen anywhere.
pub(crate) fn scan_beyond(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    gap: u64,
) -> Result<(Vec<Beyond>, u64)> {
    let l = &sb.layout;
    let n = l.journal_blocks;
    let mut buf = vec![0u8; CHUNK_BLOCKS as usize * META_BLOCK];
    let mut found = Vec::new();
    let mut max_seq = 0;
    let mut pos = 0;
    while pos < n {
        let k = (n - pos).min(CHUNK_BLOCKS);
        let chunk = &mut buf[..k as usize * META_BLOCK];
        read_blocks(dev, l.journal_first + pos, chunk)?;
        for (i, b) in chunk.chunks(META_BLOCK).enumerate() {
            let block = l.journal_first + pos + i as u64;
            let Ok(jb) = decode_journal_block(b, block) else {
                continue;
            };
            if jb.header.uuid != sb.uuid {
                continue;
            }
            max_seq = max_seq.max(jb.header.seq);
            if jb.header.seq >= gap && jb.header.seq < sb.journal_start_seq + n {
                found.push(Beyond {
                    seq: jb.header.seq,
                    block,
                    later: jb.commit_start > gap,
                    dirty_records: jb
                        .records
                        .iter()
                        .filter(|r| matches!(crate::codec::unpack(r.entry), Ok(Some(e)) if e.dirty))
                        .count(),
                });
            }
        }
        pos += k;
    }
    found.sort_unstable();
    Ok((found, max_seq))
}

/// Blocks of one volume claimed by more than one slot, and slots whose
/// origin block lies beyond the end of their volume.
pub(crate) struct Conflicts {
    /// ((volume, origin block), slots claiming it), slots ascending.
    pub duplicates: Vec<((VolumeId, u64), Vec<u32>)>,
    pub beyond: Vec<u32>,
}

/// Blocks of each volume of `table`, in cache blocks of `block_size`.
pub(crate) fn volume_blocks_of(table: &[VolumeSlot], block_size: u32, v: VolumeId) -> u64 {
    table
        .get(v.index())
        .and_then(VolumeSlot::record)
        .map_or(0, |r| r.size.div_ceil(u64::from(block_size)))
}

/// Conflicts among the live entries of `map` (stale ones are ignored).
pub(crate) fn find_conflicts(
    map: &[PackedEntry],
    table: &[VolumeSlot],
    block_size: u32,
) -> Conflicts {
    let mut owned: Vec<((VolumeId, u64), u32)> = Vec::new();
    let mut beyond = Vec::new();
    for (slot, &w) in map.iter().enumerate() {
        if !is_live(table, &w) {
            continue;
        }
        if let Ok(Some(e)) = unpack(w) {
            if e.oblock >= volume_blocks_of(table, block_size, e.volume) {
                beyond.push(slot as u32);
            }
            owned.push(((e.volume, e.oblock), slot as u32));
        }
    }
    owned.sort_unstable();
    let mut duplicates = Vec::new();
    let mut i = 0;
    while i < owned.len() {
        let mut j = i + 1;
        while j < owned.len() && owned[j].0 == owned[i].0 {
            j += 1;
        }
        if j - i > 1 {
            duplicates.push((owned[i].0, owned[i..j].iter().map(|p| p.1).collect()));
        }
        i = j;
    }
    Conflicts { duplicates, beyond }
}
