//! A read-only decoder of on-disk format version 2 (one backing device per
//! cache, 12-byte entries), kept so that `tiercache upgrade` can write a
//! version-2 cache's dirty blocks back before re-creating the cache as
//! version 3. Nothing here writes.
//!
//! Version 2, briefly (the full description is in the git history of
//! `docs/on-disk-format.md`): the same 48-byte block header as version 3;
//! superblock copies in blocks 0 and 1 (generation `g` in block `g % 2`);
//! snapshot areas A at block 2 and B, `ceil(capacity / 336)` blocks each,
//! of 12-byte entries (the u64 word of version 3, then the u32 crc); a
//! journal ring of 16-byte records (slot u32, entry) after them, 252 per
//! block. Recovery is version 3's without the volume table: the active
//! snapshot, then complete commits of the journal from the start sequence.

use crate::codec::{
    check_header, mode_from, rd_u32, rd_u64, Area, BackingIdentity, DecodeError, JOURNAL_MAGIC,
    META_BLOCK, PAYLOAD_AT, SNAPSHOT_MAGIC, SUPERBLOCK_MAGIC,
};
use crate::error::{MetadataError, Result};
use crate::read::{read_blocks, CHUNK_BLOCKS};
use tiercache_device::BlockDevice;
use tiercache_types::{align_up, CacheMode};

/// Entries per version-2 snapshot block: `(4096 - 64) / 12`.
pub const ENTRIES_PER_BLOCK: usize = 336;
/// Records per version-2 journal block: `(4096 - 64) / 16`.
pub const RECORDS_PER_BLOCK: usize = 252;
const ENTRY_LEN: usize = 12;
const RECORD_LEN: usize = 16;
const VALID_BIT: u64 = 1 << 48;
const DIRTY_BIT: u64 = 1 << 49;
const HAS_CRC_BIT: u64 = 1 << 56;
const OBLOCK_MASK: u64 = (1 << 48) - 1;
const MAX_SEQ: u64 = 1 << 62;

/// One mapped slot of a version-2 cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry2 {
    pub oblock: u64,
    pub dirty: bool,
}

/// What a version-2 cache holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format2Cache {
    pub block_size: u32,
    pub capacity: u32,
    /// Byte offset of cache slot 0.
    pub data_offset: u64,
    pub mode: CacheMode,
    pub policy: String,
    pub clean_shutdown: bool,
    pub detached: bool,
    /// Size, path hint and fingerprint (at the last clean shutdown) of the
    /// backing device.
    pub backing: BackingIdentity,
    /// The mapping as `open` of version 2 recovers it: the active snapshot
    /// and the journal's complete commits.
    pub mapping: Vec<Option<Entry2>>,
}

impl Format2Cache {
    /// The dirty slots: (slot, origin block), slots ascending.
    pub fn dirty(&self) -> Vec<(u32, u64)> {
        self.mapping
            .iter()
            .enumerate()
            .filter_map(|(s, e)| e.filter(|e| e.dirty).map(|e| (s as u32, e.oblock)))
            .collect()
    }
}

struct Sb2 {
    generation: u64,
    uuid: [u8; 16],
    cache: Format2Cache,
    active: Area,
    snap_a: u64,
    snap_b: u64,
    snap_blocks: u64,
    journal_first: u64,
    journal_blocks: u64,
    snapshot_seq: u64,
    journal_start_seq: u64,
}

fn get_str(field: &[u8]) -> String {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn decode_superblock2(b: &[u8], block: u64) -> std::result::Result<Sb2, DecodeError> {
    let inv = |m: String| Err(DecodeError::Invalid(m));
    let h = check_header(b, &SUPERBLOCK_MAGIC, block)?;
    let version = rd_u32(b, 48);
    if version != 2 {
        return Err(DecodeError::UnsupportedVersion { found: version });
    }
    if h.seq % 2 != block || h.seq >= MAX_SEQ {
        return inv(format!("generation {} in block {block}", h.seq));
    }
    if rd_u32(b, 52) != META_BLOCK as u32 {
        return inv("metadata block size".into());
    }
    if rd_u64(b, 64) != 0 || rd_u64(b, 72) != 0 {
        return inv("version 2 defines no ro_compat or incompat feature".into());
    }
    let Some(mode) = mode_from(b[84]) else {
        return inv(format!("unknown cache mode code {}", b[84]));
    };
    let flags = b[85];
    if flags & !3 != 0 {
        return inv(format!("unknown superblock flags {flags:#04x}"));
    }
    let active = match b[86] {
        0 => Area::A,
        1 => Area::B,
        x => return inv(format!("active snapshot area {x}")),
    };
    let block_size = rd_u32(b, 80);
    let capacity = rd_u64(b, 88);
    if !crate::codec::valid_block_size(block_size)
        || capacity == 0
        || capacity >= u64::from(u32::MAX)
    {
        return inv(format!(
            "block size {block_size} or capacity {capacity} out of range"
        ));
    }
    let snap_blocks = capacity.div_ceil(ENTRIES_PER_BLOCK as u64);
    let (snap_a, snap_b, journal_first, journal_blocks) = (
        rd_u64(b, 104),
        rd_u64(b, 112),
        rd_u64(b, 128),
        rd_u64(b, 136),
    );
    if rd_u64(b, 120) != snap_blocks
        || snap_a != 2
        || snap_b != 2 + snap_blocks
        || journal_first != 2 + 2 * snap_blocks
        || !(2..=1 << 40).contains(&journal_blocks)
    {
        return inv("snapshot areas and journal are not laid out as version 2 does".into());
    }
    let data_offset = rd_u64(b, 96);
    let meta_end = (journal_first + journal_blocks) * META_BLOCK as u64;
    if data_offset != align_up(meta_end, u64::from(block_size)) {
        return inv(format!("data offset {data_offset}"));
    }
    let (snapshot_seq, journal_start_seq) = (rd_u64(b, 144), rd_u64(b, 152));
    if snapshot_seq >= MAX_SEQ
        || journal_start_seq >= MAX_SEQ
        || rd_u64(b, 160) != journal_start_seq % journal_blocks
    {
        return inv("snapshot or journal sequence".into());
    }
    let fingerprint = match rd_u32(b, 180) {
        0 => None,
        1 => Some(rd_u32(b, 176)),
        x => return inv(format!("fingerprint-valid field {x}")),
    };
    let backing_size = rd_u64(b, 168);
    if backing_size == 0 {
        return inv("backing device size 0".into());
    }
    Ok(Sb2 {
        generation: h.seq,
        uuid: h.uuid,
        cache: Format2Cache {
            block_size,
            capacity: capacity as u32,
            data_offset,
            mode,
            policy: get_str(&b[184..216]),
            clean_shutdown: flags & 1 != 0,
            detached: flags & 2 != 0,
            backing: BackingIdentity {
                size: backing_size,
                path_hint: get_str(&b[216..472]),
                fingerprint,
            },
            mapping: Vec::new(),
        },
        active,
        snap_a,
        snap_b,
        snap_blocks,
        journal_first,
        journal_blocks,
        snapshot_seq,
        journal_start_seq,
    })
}

fn unpack2(p: &[u8]) -> std::result::Result<Option<Entry2>, DecodeError> {
    let word = rd_u64(p, 0);
    let crc = rd_u32(p, 8);
    if word & VALID_BIT == 0 {
        if word != 0 || crc != 0 {
            return Err(DecodeError::Invalid("free entry with stray bits".into()));
        }
        return Ok(None);
    }
    if word & HAS_CRC_BIT == 0 && crc != 0 {
        return Err(DecodeError::Invalid("crc without the has-crc bit".into()));
    }
    Ok(Some(Entry2 {
        oblock: word & OBLOCK_MASK,
        dirty: word & DIRTY_BIT != 0,
    }))
}

/// Reads a version-2 cache: superblock, active snapshot, journal. Refuses
/// (as `Corrupt`) what version 2's own `open` would refuse: no valid
/// superblock, a damaged snapshot block, a journal block lost with later
/// commits after it (after an unclean shutdown), two dirty slots for one
/// block, or a dirty slot beyond the backing device. `NotFormatted` when
/// there is no tiercache superblock; `UnsupportedVersion` when it is not
/// version 2.
pub fn read(dev: &dyn BlockDevice) -> Result<Format2Cache> {
    let device = dev.describe();
    if dev.size() < 2 * META_BLOCK as u64 {
        return Err(MetadataError::NotFormatted { device });
    }
    let mut buf = vec![0u8; 2 * META_BLOCK];
    read_blocks(dev, 0, &mut buf)?;
    let copies = [
        decode_superblock2(&buf[..META_BLOCK], 0),
        decode_superblock2(&buf[META_BLOCK..], 1),
    ];
    let sb = match copies {
        [Ok(a), Ok(b)] => {
            if a.generation > b.generation {
                a
            } else {
                b
            }
        }
        [Ok(a), Err(_)] | [Err(_), Ok(a)] => a,
        [Err(a), Err(b)] => {
            for e in [&a, &b] {
                if let DecodeError::UnsupportedVersion { found } = e {
                    return Err(MetadataError::UnsupportedVersion {
                        device,
                        found: *found,
                        supported: 2,
                    });
                }
            }
            if matches!(
                (&a, &b),
                (
                    DecodeError::WrongMagic { .. },
                    DecodeError::WrongMagic { .. }
                )
            ) {
                return Err(MetadataError::NotFormatted { device });
            }
            return Err(MetadataError::corrupt(
                format!("no valid version-2 superblock (copy 0: {a}; copy 1: {b})"),
                0,
            ));
        }
    };
    let cap = sb.cache.capacity as usize;
    let need = sb.cache.data_offset + cap as u64 * u64::from(sb.cache.block_size);
    if dev.size() < need {
        return Err(MetadataError::corrupt(
            format!("the superblock describes a cache device of at least {need} bytes"),
            0,
        ));
    }
    // The active snapshot.
    let mut map: Vec<Option<Entry2>> = vec![None; cap];
    let first = match sb.active {
        Area::A => sb.snap_a,
        Area::B => sb.snap_b,
    };
    let mut blocks = vec![0u8; sb.snap_blocks as usize * META_BLOCK];
    read_blocks(dev, first, &mut blocks)?;
    for (i, b) in blocks.chunks(META_BLOCK).enumerate() {
        let block = first + i as u64;
        let want = (cap - i * ENTRIES_PER_BLOCK).min(ENTRIES_PER_BLOCK);
        let bad = |why: String| MetadataError::corrupt(format!("snapshot block {i}: {why}"), block);
        let h = check_header(b, &SNAPSHOT_MAGIC, block).map_err(|e| bad(e.to_string()))?;
        if h.uuid != sb.uuid
            || h.seq != sb.snapshot_seq
            || rd_u32(b, 48) as usize != i
            || rd_u32(b, 52) as usize != want
        {
            return Err(bad("of another cache, snapshot or position".into()));
        }
        for k in 0..want {
            let at = PAYLOAD_AT + ENTRY_LEN * k;
            map[i * ENTRIES_PER_BLOCK + k] =
                unpack2(&b[at..at + ENTRY_LEN]).map_err(|e| bad(e.to_string()))?;
        }
    }
    // The journal: complete commits from the start sequence on.
    let n = sb.journal_blocks;
    let start = sb.journal_start_seq;
    let mut ring = vec![0u8; n.min(CHUNK_BLOCKS * 64) as usize * META_BLOCK];
    let ring_blocks = (ring.len() / META_BLOCK) as u64;
    let read_pos = |pos: u64, ring: &[u8]| -> Result<Vec<u8>> {
        if ring_blocks == n {
            Ok(ring[pos as usize * META_BLOCK..][..META_BLOCK].to_vec())
        } else {
            let mut b = vec![0u8; META_BLOCK];
            read_blocks(dev, sb.journal_first + pos, &mut b)?;
            Ok(b)
        }
    };
    if ring_blocks == n {
        read_blocks(dev, sb.journal_first, &mut ring)?;
    }
    struct J {
        seq: u64,
        commit_start: u64,
        last: bool,
        records: Vec<(u32, Option<Entry2>)>,
    }
    let decode_j = |b: &[u8], block: u64| -> Option<J> {
        let h = check_header(b, &JOURNAL_MAGIC, block).ok()?;
        let count = rd_u32(b, 56) as usize;
        let flags = rd_u32(b, 60);
        let commit_start = rd_u64(b, 48);
        if h.uuid != sb.uuid
            || count == 0
            || count > RECORDS_PER_BLOCK
            || flags & !1 != 0
            || commit_start > h.seq
        {
            return None;
        }
        let mut records = Vec::with_capacity(count);
        for k in 0..count {
            let at = PAYLOAD_AT + RECORD_LEN * k;
            let slot = rd_u32(b, at);
            if slot as usize >= cap {
                return None;
            }
            records.push((slot, unpack2(&b[at + 4..at + RECORD_LEN]).ok()?));
        }
        Some(J {
            seq: h.seq,
            commit_start,
            last: flags & 1 != 0,
            records,
        })
    };
    let mut pending: Vec<(u32, Option<Entry2>)> = Vec::new();
    let mut pending_blocks = 0u64;
    let mut open_commit: Option<u64> = None;
    let mut end = start;
    let mut seq = start;
    while seq < start + n {
        let pos = seq % n;
        let b = read_pos(pos, &ring)?;
        let Some(j) = decode_j(&b, sb.journal_first + pos) else {
            break;
        };
        if j.seq != seq || j.commit_start != open_commit.unwrap_or(seq) {
            break;
        }
        pending.extend(j.records);
        pending_blocks += 1;
        if j.last {
            for (slot, e) in pending.drain(..) {
                map[slot as usize] = e;
            }
            pending_blocks = 0;
            open_commit = None;
            end = seq + 1;
        } else {
            open_commit = Some(j.commit_start);
        }
        seq += 1;
    }
    if !sb.cache.clean_shutdown {
        // A valid block of a commit that started after the end of the log
        // proves an acknowledged block was lost: its updates (perhaps dirty
        // ones) cannot be replayed.
        let gap = end + pending_blocks;
        for pos in 0..n {
            let b = read_pos(pos, &ring)?;
            if let Some(j) = decode_j(&b, sb.journal_first + pos) {
                if j.seq >= gap && j.seq < start + n && j.commit_start > gap {
                    return Err(MetadataError::corrupt(
                        format!(
                            "version-2 journal block of sequence {gap} is lost but later \
                             committed blocks exist; run `tiercache check` with the tiercache \
                             that made this cache"
                        ),
                        sb.journal_first + gap % n,
                    ));
                }
            }
        }
    }
    // Two dirty slots for one block, or a dirty slot beyond the device:
    // which data is right cannot be told.
    let blocks_of_backing = sb
        .cache
        .backing
        .size
        .div_ceil(u64::from(sb.cache.block_size));
    let mut dirty: Vec<(u64, usize)> = map
        .iter()
        .enumerate()
        .filter_map(|(s, e)| e.filter(|e| e.dirty).map(|e| (e.oblock, s)))
        .collect();
    dirty.sort_unstable();
    for w in dirty.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(MetadataError::corrupt(
                format!(
                    "slots {} and {} both hold dirty data for block {}",
                    w[0].1, w[1].1, w[0].0
                ),
                first,
            ));
        }
    }
    if let Some(&(oblock, slot)) = dirty.iter().find(|d| d.0 >= blocks_of_backing) {
        return Err(MetadataError::corrupt(
            format!("dirty slot {slot} maps block {oblock}, beyond the backing device"),
            first,
        ));
    }
    let mut cache = sb.cache;
    cache.mapping = map;
    Ok(cache)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::{seal, wr_u32, wr_u64, write_header, Header};
    use std::sync::Arc;
    use tiercache_device::MemDevice;

    /// A minimal version-2 writer, for tests only: a cache of `slots`
    /// 4 KiB slots and a journal of `jblocks` blocks whose snapshot holds
    /// `snap` and whose journal holds one commit of `journal` records.
    pub(crate) fn v2_image(
        slots: u32,
        jblocks: u64,
        backing_size: u64,
        clean: bool,
        snap: &[(u32, u64, bool)],
        journal: &[(u32, Option<(u64, bool)>)],
    ) -> Arc<MemDevice> {
        let uuid = [7u8; 16];
        let sblocks = u64::from(slots).div_ceil(336);
        let journal_first = 2 + 2 * sblocks;
        let data_offset = (journal_first + jblocks) * 4096;
        let dev = Arc::new(MemDevice::new(data_offset + u64::from(slots) * 4096));
        let entry = |e: Option<(u64, bool)>| -> [u8; 12] {
            let mut p = [0u8; 12];
            if let Some((ob, d)) = e {
                let w = ob | VALID_BIT | if d { DIRTY_BIT } else { 0 };
                p[..8].copy_from_slice(&w.to_le_bytes());
            }
            p
        };
        // Snapshot 1 in area A.
        for i in 0..sblocks {
            let mut b = vec![0u8; 4096];
            let block = 2 + i;
            write_header(
                &mut b,
                &SNAPSHOT_MAGIC,
                &Header {
                    block,
                    uuid,
                    seq: 1,
                },
            );
            let count = (u64::from(slots) - i * 336).min(336);
            wr_u32(&mut b, 48, i as u32);
            wr_u32(&mut b, 52, count as u32);
            for &(slot, ob, d) in snap {
                if u64::from(slot) / 336 == i {
                    let at = 64 + 12 * (slot as usize % 336);
                    b[at..at + 12].copy_from_slice(&entry(Some((ob, d))));
                }
            }
            seal(&mut b);
            dev.write_at(&b, block * 4096).unwrap();
        }
        // One journal commit at sequence 5 (position 5 % jblocks).
        if !journal.is_empty() {
            let block = journal_first + 5 % jblocks;
            let mut b = vec![0u8; 4096];
            write_header(
                &mut b,
                &JOURNAL_MAGIC,
                &Header {
                    block,
                    uuid,
                    seq: 5,
                },
            );
            wr_u64(&mut b, 48, 5);
            wr_u32(&mut b, 56, journal.len() as u32);
            wr_u32(&mut b, 60, 1);
            for (k, &(slot, e)) in journal.iter().enumerate() {
                let at = 64 + 16 * k;
                wr_u32(&mut b, at, slot);
                b[at + 4..at + 16].copy_from_slice(&entry(e));
            }
            seal(&mut b);
            dev.write_at(&b, block * 4096).unwrap();
        }
        // Superblock generation 2 (block 0).
        let mut b = vec![0u8; 4096];
        write_header(
            &mut b,
            &SUPERBLOCK_MAGIC,
            &Header {
                block: 0,
                uuid,
                seq: 2,
            },
        );
        wr_u32(&mut b, 48, 2);
        wr_u32(&mut b, 52, 4096);
        wr_u32(&mut b, 80, 4096);
        b[84] = 1; // writeback
        b[85] = u8::from(clean);
        b[86] = 0; // area A
        wr_u64(&mut b, 88, u64::from(slots));
        wr_u64(&mut b, 96, data_offset);
        wr_u64(&mut b, 104, 2);
        wr_u64(&mut b, 112, 2 + sblocks);
        wr_u64(&mut b, 120, sblocks);
        wr_u64(&mut b, 128, journal_first);
        wr_u64(&mut b, 136, jblocks);
        wr_u64(&mut b, 144, 1);
        wr_u64(&mut b, 152, 5);
        wr_u64(&mut b, 160, 5 % jblocks);
        wr_u64(&mut b, 168, backing_size);
        b[184..187].copy_from_slice(b"lru");
        b[216..221].copy_from_slice(b"/dev/");
        seal(&mut b);
        dev.write_at(&b, 0).unwrap();
        dev
    }

    #[test]
    fn reads_snapshot_and_journal_of_a_version_2_cache() {
        let dev = v2_image(
            400,
            4,
            100 * 4096,
            false,
            &[(0, 10, true), (1, 11, false), (350, 12, true)],
            &[(1, Some((13, true))), (350, None), (399, Some((99, true)))],
        );
        let c = read(&*dev).unwrap();
        assert_eq!(
            (c.capacity, c.block_size, c.mode),
            (400, 4096, CacheMode::WriteBack)
        );
        assert_eq!(c.policy, "lru");
        assert_eq!(c.backing.size, 100 * 4096);
        assert_eq!(c.dirty(), vec![(0, 10), (1, 13), (399, 99)]);
        // Version 3's open refuses it as an old format.
        let e = crate::MetadataStore::open(dev.clone()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::OldFormat);
    }

    #[test]
    fn refuses_what_version_2_refuses() {
        // Two dirty slots for one block.
        let dev = v2_image(8, 2, 100 * 4096, true, &[(0, 5, true), (1, 5, true)], &[]);
        assert_eq!(read(&*dev).unwrap_err().kind(), crate::ErrorKind::Corrupt);
        // A dirty block beyond the backing device.
        let dev = v2_image(8, 2, 4 * 4096, true, &[(0, 5, true)], &[]);
        assert_eq!(read(&*dev).unwrap_err().kind(), crate::ErrorKind::Corrupt);
        // A damaged snapshot block.
        let dev = v2_image(8, 2, 100 * 4096, true, &[(0, 5, true)], &[]);
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, 2 * 4096).unwrap();
        b[100] ^= 1;
        dev.write_at(&b, 2 * 4096).unwrap();
        assert_eq!(read(&*dev).unwrap_err().kind(), crate::ErrorKind::Corrupt);
        // Not formatted; a version-3 cache is not version 2.
        let blank = MemDevice::new(1 << 20);
        assert_eq!(
            read(&blank).unwrap_err().kind(),
            crate::ErrorKind::NotFormatted
        );
    }
}
