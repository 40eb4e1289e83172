//! Encoders and decoders for the superblock, snapshot and journal blocks
//! and the packed entry (the volume table's are in `volume.rs`).
//!
//! Every metadata block is [`META_BLOCK`] (4 KiB) long, little-endian, and
//! starts with the same 48-byte header:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic: `TIERCACH` (superblock), `TCSNAPSH` (snapshot), `TCJOURNL` (journal), `TCVOLUME` (volume table) |
//! | 8 | 4 | crc32c of the whole block with these 4 bytes taken as zero |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | the block's own number on the device, in 4 KiB units |
//! | 24 | 16 | cache uuid (chosen at format time) |
//! | 40 | 8 | sequence: superblock generation, snapshot sequence, journal sequence or volume-table generation |
//!
//! Decoders check, in this order, the magic, the crc, the block number and
//! then the type's own fields; the uuid and sequence are returned for the
//! caller to compare with what it expects. Decoders never panic, whatever
//! the bytes (a property test and the fuzz targets check this).

pub use crate::geometry::{valid_block_size, Area, ENTRY_LEN, META_BLOCK, PAYLOAD_AT};
use crate::layout::{Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
use tiercache_types::{CacheMode, VolumeId};

/// Length of the common header.
pub const HEADER_LEN: usize = 48;

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TIERCACH";
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"TCSNAPSH";
pub const JOURNAL_MAGIC: [u8; 8] = *b"TCJOURNL";

/// The on-disk format version this crate reads and writes.
pub const FORMAT_VERSION: u32 = 3;
/// The previous format version: recognised and refused with
/// [`crate::MetadataError::OldFormat`].
pub const FORMAT_VERSION_2: u32 = 2;

/// Feature bits this version understands (none yet). A superblock with an
/// unknown `incompat` bit is refused; with an unknown `ro_compat` bit it is
/// refused for writing (and this crate always writes when opening); unknown
/// `compat` bits are ignored and preserved.
pub const KNOWN_COMPAT: u64 = 0;
pub const KNOWN_RO_COMPAT: u64 = 0;
pub const KNOWN_INCOMPAT: u64 = 0;

/// Length of a journal record: slot u32 then a packed entry.
pub const RECORD_LEN: usize = 4 + ENTRY_LEN;
/// Journal records per journal block: `(4096 - 64) / 20` = 201.
pub const JOURNAL_RECORDS_PER_BLOCK: usize = (META_BLOCK - PAYLOAD_AT) / RECORD_LEN;

/// Largest origin block number an entry can hold (48 bits).
pub const MAX_OBLOCK: u64 = (1 << 48) - 1;
/// Largest hint an entry can hold (6 bits); larger hints saturate.
pub const MAX_HINT: u8 = 63;

const VALID_BIT: u64 = 1 << 48;
const DIRTY_BIT: u64 = 1 << 49;
const HINT_SHIFT: u32 = 50;
/// The entry carries a crc (bytes 8..12 of the packed entry).
const HAS_CRC_BIT: u64 = 1 << 56;

/// Sequence numbers and generations stay below this (a decoder refuses
/// larger ones), so arithmetic on them cannot overflow. At one journal
/// block per microsecond it lasts 146,000 years.
pub const MAX_SEQ: u64 = 1 << 62;

/// Journal block flag: this block is the last one of its commit.
pub const JOURNAL_FLAG_LAST: u32 = 1;

const SB_FLAG_CLEAN: u8 = 1;
const SB_FLAG_DETACHED: u8 = 2;
/// Lengths of the fixed-size string fields of the superblock.
pub const POLICY_LEN: usize = 32;

/// One cache slot's mapping: which block of which volume it holds, whether
/// the cache copy is newer than the origin (dirty), and for clean claims a
/// checksum of the content they vouch for.
///
/// `oblock` and `dirty` are authoritative; `hint` is the replacement
/// policy's advisory value (`Replacement::hint` in tiercache-policy),
/// saturated to 6 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The backing volume the block belongs to. On disk the entry also
    /// carries the volume's generation at claim time (filled in by
    /// `MetadataStore::record`), so that it can never be taken for a block
    /// of a later attachment of the same volume index.
    pub volume: VolumeId,
    pub oblock: u64,
    pub dirty: bool,
    pub hint: u8,
    /// crc32c (the `crc32c` crate's `crc32c()`, see [`content_crc`]) of the
    /// block content when the claim was made: over the slot's full
    /// `block_size` bytes, or over the first bytes of the slot only for the
    /// backing device's short last block ([`claim_len`]). Meaningful for
    /// clean entries. `None` = unknown: a clean entry without a crc is
    /// trusted only after a clean shutdown.
    pub crc: Option<u32>,
}

/// The on-disk form of an optional entry: the little-endian entry word
/// (bytes 0..8), the little-endian crc (bytes 8..12), the volume index
/// (bytes 12..14) and the volume generation at claim time (bytes 14..16).
/// See [`Entry::pack`].
pub type PackedEntry = [u8; ENTRY_LEN];

/// A free slot: 16 zero bytes.
pub const FREE_ENTRY: PackedEntry = [0; ENTRY_LEN];

impl Entry {
    /// Packs into the on-disk 16-byte form. The u64 word: origin block in
    /// bits 0..48, valid bit 48, dirty bit 49, hint in bits 50..56, has-crc
    /// bit 56, bits 57..64 zero; then the u32 crc (zero without a crc),
    /// the u16 volume index and the u16 volume `generation` (nonzero).
    /// `oblock` above [`MAX_OBLOCK`] is the caller's bug (checked by
    /// `MetadataStore::record`); here it is masked.
    pub fn pack(self, generation: u16) -> PackedEntry {
        let word = (self.oblock & MAX_OBLOCK)
            | VALID_BIT
            | if self.dirty { DIRTY_BIT } else { 0 }
            | (u64::from(self.hint.min(MAX_HINT)) << HINT_SHIFT)
            | if self.crc.is_some() { HAS_CRC_BIT } else { 0 };
        let mut p = FREE_ENTRY;
        p[..8].copy_from_slice(&word.to_le_bytes());
        p[8..12].copy_from_slice(&self.crc.unwrap_or(0).to_le_bytes());
        p[12..14].copy_from_slice(&self.volume.0.to_le_bytes());
        p[14..16].copy_from_slice(&generation.to_le_bytes());
        p
    }
}

/// Packs an optional entry with its volume's `generation`; `None` (a free
/// slot) is all zeros.
pub fn pack(entry: Option<Entry>, generation: u16) -> PackedEntry {
    entry.map_or(FREE_ENTRY, |e| e.pack(generation))
}

/// The volume generation a packed entry was claimed with (0 for a free
/// slot).
pub fn entry_generation(p: &PackedEntry) -> u16 {
    u16::from_le_bytes([p[14], p[15]])
}

/// Unpacks a 16-byte entry. A free slot must be all zeros; a non-zero crc
/// needs the has-crc bit; a valid entry needs a nonzero generation. The
/// spare bits 57..64 of a valid entry are ignored (reserved for compat
/// features). The generation is read with [`entry_generation`].
pub fn unpack(p: PackedEntry) -> Result<Option<Entry>, DecodeError> {
    let word = rd_u64(&p, 0);
    let crc = rd_u32(&p, 8);
    let volume = u16::from_le_bytes([p[12], p[13]]);
    let generation = entry_generation(&p);
    if word & VALID_BIT == 0 {
        if word != 0 || crc != 0 || volume != 0 || generation != 0 {
            return Err(DecodeError::Invalid(format!(
                "free entry with stray bits {word:#018x} / crc {crc:#010x} / volume {volume} / generation {generation}"
            )));
        }
        return Ok(None);
    }
    if generation == 0 {
        return Err(DecodeError::Invalid(format!(
            "entry of volume {volume} with volume generation 0"
        )));
    }
    let has_crc = word & HAS_CRC_BIT != 0;
    if !has_crc && crc != 0 {
        return Err(DecodeError::Invalid(format!(
            "entry without the has-crc bit carries crc {crc:#010x}"
        )));
    }
    Ok(Some(Entry {
        volume: VolumeId(volume),
        oblock: word & MAX_OBLOCK,
        dirty: word & DIRTY_BIT != 0,
        hint: ((word >> HINT_SHIFT) & 0x3f) as u8,
        crc: has_crc.then_some(crc),
    }))
}

/// The crc a clean claim carries: crc32c of the claimed bytes of the slot
/// (`claim_len` bytes from the slot's start).
pub fn content_crc(claimed: &[u8]) -> u32 {
    crc32c::crc32c(claimed)
}

/// Bytes of a slot a claim on origin block `oblock` covers: the whole
/// block, or the part of the backing device's short last block that
/// exists. Zero for a block at or beyond the end of the backing device.
pub fn claim_len(block_size: u32, backing_size: u64, oblock: u64) -> usize {
    let bs = u64::from(block_size);
    let start = oblock.saturating_mul(bs);
    backing_size.saturating_sub(start).min(bs) as usize
}

/// Why a block did not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("buffer is {0} bytes, not a 4096-byte metadata block")]
    WrongLength(usize),
    #[error("wrong magic {found:?} (expected {expected:?})")]
    WrongMagic { expected: String, found: String },
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadCrc { stored: u32, computed: u32 },
    #[error(
        "block says it is block {found}, but was read from block {expected} (misplaced write)"
    )]
    WrongBlockNumber { expected: u64, found: u64 },
    #[error("unsupported format version {found} (this build reads version {FORMAT_VERSION})")]
    UnsupportedVersion { found: u32 },
    #[error("{0}")]
    Invalid(String),
}

/// The common header of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub block: u64,
    pub uuid: [u8; 16],
    pub seq: u64,
}

pub(crate) fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn rd_entry(b: &[u8], at: usize) -> PackedEntry {
    b[at..at + ENTRY_LEN].try_into().expect("12 bytes")
}
pub(crate) fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn wr_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// crc32c of a block with its crc field (bytes 8..12) taken as zero.
pub fn block_crc(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[..8]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[12..])
}

/// Stores the crc of `block` in its crc field. Used by every encoder (and
/// by tests and fuzz targets that edit a block and want it to stay valid).
pub fn seal(block: &mut [u8]) {
    let c = block_crc(block);
    wr_u32(block, 8, c);
}

pub(crate) fn write_header(b: &mut [u8], magic: &[u8; 8], h: &Header) {
    b[..8].copy_from_slice(magic);
    wr_u32(b, 8, 0);
    wr_u32(b, 12, 0);
    wr_u64(b, 16, h.block);
    b[24..40].copy_from_slice(&h.uuid);
    wr_u64(b, 40, h.seq);
}

/// Checks length, magic, crc and block number; returns the header.
pub fn check_header(b: &[u8], magic: &[u8; 8], block: u64) -> Result<Header, DecodeError> {
    if b.len() != META_BLOCK {
        return Err(DecodeError::WrongLength(b.len()));
    }
    if &b[..8] != magic {
        return Err(DecodeError::WrongMagic {
            expected: String::from_utf8_lossy(magic).into_owned(),
            found: String::from_utf8_lossy(&b[..8]).into_owned(),
        });
    }
    let stored = rd_u32(b, 8);
    let computed = block_crc(b);
    if stored != computed {
        return Err(DecodeError::BadCrc { stored, computed });
    }
    let found = rd_u64(b, 16);
    if found != block {
        return Err(DecodeError::WrongBlockNumber {
            expected: block,
            found,
        });
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[24..40]);
    Ok(Header {
        block,
        uuid,
        seq: rd_u64(b, 40),
    })
}

/// What a backing device looked like, to recognise it again.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BackingIdentity {
    /// Size in bytes.
    pub size: u64,
    /// Where it was found last time (advisory: paths change; at most 127
    /// bytes are stored in a volume record).
    pub path_hint: String,
    /// crc32c of the first and last 64 KiB ([`crate::fingerprint`]), taken
    /// at the last clean shutdown; `None` if unknown.
    pub fingerprint: Option<u32>,
}

/// The decoded superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Increases by one with every superblock write; written to block
    /// `generation % 2`.
    pub generation: u64,
    pub uuid: [u8; 16],
    pub version: u32,
    pub compat: u64,
    pub ro_compat: u64,
    pub incompat: u64,
    /// The default mode of new volumes.
    pub mode: CacheMode,
    /// Set by a clean shutdown, cleared (durably) by the next open.
    pub clean_shutdown: bool,
    /// The whole cache was detached from its volumes (all clean).
    pub detached: bool,
    /// The replacement policy's name (for hints), at most 32 bytes.
    pub policy: String,
    pub layout: Layout,
    /// Which volume-table copy is authoritative, and its generation (the
    /// sequence every block of that copy carries).
    pub volumes_active: Area,
    pub volumes_generation: u64,
    /// Which area holds the authoritative snapshot, and its sequence.
    pub active: Area,
    pub snapshot_seq: u64,
    /// Sequence of the first journal block that follows the snapshot;
    /// it lives at journal position `journal_start_seq % journal_blocks`.
    pub journal_start_seq: u64,
}

pub(crate) fn mode_code(m: CacheMode) -> u8 {
    match m {
        CacheMode::WriteThrough => 0,
        CacheMode::WriteBack => 1,
        CacheMode::WriteAround => 2,
        CacheMode::PassThrough => 3,
    }
}

pub(crate) fn mode_from(code: u8) -> Option<CacheMode> {
    Some(match code {
        0 => CacheMode::WriteThrough,
        1 => CacheMode::WriteBack,
        2 => CacheMode::WriteAround,
        3 => CacheMode::PassThrough,
        _ => return None,
    })
}

/// Copies `s` into a zero-padded field, cut at a char boundary.
fn put_str(field: &mut [u8], s: &str) {
    let mut n = s.len().min(field.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    field.fill(0);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(field: &[u8]) -> String {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Truncates a string the way the superblock stores it.
pub fn stored_str(s: &str, len: usize) -> String {
    let mut f = vec![0u8; len];
    put_str(&mut f, s);
    get_str(&f)
}

// Superblock field offsets (after the 48-byte header).
const SB_VERSION: usize = 48;
const SB_META_BLOCK: usize = 52;
const SB_COMPAT: usize = 56;
const SB_RO_COMPAT: usize = 64;
const SB_INCOMPAT: usize = 72;
const SB_BLOCK_SIZE: usize = 80;
const SB_MODE: usize = 84;
const SB_FLAGS: usize = 85;
const SB_ACTIVE: usize = 86;
const SB_CAPACITY: usize = 88;
const SB_DATA_OFFSET: usize = 96;
const SB_SNAP_A: usize = 104;
const SB_SNAP_B: usize = 112;
const SB_SNAP_BLOCKS: usize = 120;
const SB_JOURNAL: usize = 128;
const SB_JOURNAL_BLOCKS: usize = 136;
const SB_SNAP_SEQ: usize = 144;
const SB_JOURNAL_SEQ: usize = 152;
const SB_JOURNAL_POS: usize = 160;
const SB_VOLUMES_ACTIVE: usize = 87;
const SB_VOLUMES_A: usize = 168;
const SB_VOLUMES_B: usize = 176;
const SB_VOLUME_BLOCKS: usize = 184;
const SB_MAX_VOLUMES: usize = 192;
const SB_VOLUMES_GEN: usize = 200;
const SB_POLICY: usize = 208;
/// End of the used part of the superblock; the rest is zero.
pub const SB_END: usize = SB_POLICY + POLICY_LEN;

fn area_code(a: Area) -> u8 {
    match a {
        Area::A => 0,
        Area::B => 1,
    }
}

/// Encodes `sb` as the block it is written to (`generation % 2`).
pub fn encode_superblock(sb: &Superblock) -> Vec<u8> {
    let mut b = vec![0u8; META_BLOCK];
    let l = &sb.layout;
    write_header(
        &mut b,
        &SUPERBLOCK_MAGIC,
        &Header {
            block: sb.generation % 2,
            uuid: sb.uuid,
            seq: sb.generation,
        },
    );
    wr_u32(&mut b, SB_VERSION, sb.version);
    wr_u32(&mut b, SB_META_BLOCK, META_BLOCK as u32);
    wr_u64(&mut b, SB_COMPAT, sb.compat);
    wr_u64(&mut b, SB_RO_COMPAT, sb.ro_compat);
    wr_u64(&mut b, SB_INCOMPAT, sb.incompat);
    wr_u32(&mut b, SB_BLOCK_SIZE, l.block_size);
    b[SB_MODE] = mode_code(sb.mode);
    b[SB_FLAGS] = if sb.clean_shutdown { SB_FLAG_CLEAN } else { 0 }
        | if sb.detached { SB_FLAG_DETACHED } else { 0 };
    b[SB_ACTIVE] = area_code(sb.active);
    b[SB_VOLUMES_ACTIVE] = area_code(sb.volumes_active);
    wr_u64(&mut b, SB_VOLUMES_A, l.volumes_a);
    wr_u64(&mut b, SB_VOLUMES_B, l.volumes_b);
    wr_u64(&mut b, SB_VOLUME_BLOCKS, l.volume_blocks);
    wr_u32(&mut b, SB_MAX_VOLUMES, l.max_volumes);
    wr_u64(&mut b, SB_VOLUMES_GEN, sb.volumes_generation);
    wr_u64(&mut b, SB_CAPACITY, u64::from(l.capacity));
    wr_u64(&mut b, SB_DATA_OFFSET, l.data_offset);
    wr_u64(&mut b, SB_SNAP_A, l.snapshot_a);
    wr_u64(&mut b, SB_SNAP_B, l.snapshot_b);
    wr_u64(&mut b, SB_SNAP_BLOCKS, l.snapshot_blocks);
    wr_u64(&mut b, SB_JOURNAL, l.journal_first);
    wr_u64(&mut b, SB_JOURNAL_BLOCKS, l.journal_blocks);
    wr_u64(&mut b, SB_SNAP_SEQ, sb.snapshot_seq);
    wr_u64(&mut b, SB_JOURNAL_SEQ, sb.journal_start_seq);
    wr_u64(
        &mut b,
        SB_JOURNAL_POS,
        sb.journal_start_seq % l.journal_blocks.max(1),
    );
    put_str(&mut b[SB_POLICY..SB_POLICY + POLICY_LEN], &sb.policy);
    seal(&mut b);
    b
}

/// Decodes the superblock copy read from block `block` (0 or 1).
///
/// Checks the header, the version, and that the layout is self-consistent
/// (regions in order, inside the metadata area, sizes matching the
/// capacity). Feature bits are returned as found; the caller decides.
pub fn decode_superblock(b: &[u8], block: u64) -> Result<Superblock, DecodeError> {
    let h = check_header(b, &SUPERBLOCK_MAGIC, block)?;
    let version = rd_u32(b, SB_VERSION);
    if version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion { found: version });
    }
    if h.seq % 2 != block {
        return Err(DecodeError::Invalid(format!(
            "superblock generation {} belongs in block {}, found in block {block}",
            h.seq,
            h.seq % 2
        )));
    }
    let inv = |m: String| Err(DecodeError::Invalid(m));
    let (snap_seq, jseq) = (rd_u64(b, SB_SNAP_SEQ), rd_u64(b, SB_JOURNAL_SEQ));
    if h.seq >= MAX_SEQ || snap_seq >= MAX_SEQ || jseq >= MAX_SEQ {
        return inv(format!(
            "generation {} / snapshot {snap_seq} / journal {jseq} sequence out of range",
            h.seq
        ));
    }
    if rd_u32(b, SB_META_BLOCK) != META_BLOCK as u32 {
        return inv(format!(
            "metadata block size {} (expected {META_BLOCK})",
            rd_u32(b, SB_META_BLOCK)
        ));
    }
    let Some(mode) = mode_from(b[SB_MODE]) else {
        return inv(format!("unknown cache mode code {}", b[SB_MODE]));
    };
    let flags = b[SB_FLAGS];
    if flags & !(SB_FLAG_CLEAN | SB_FLAG_DETACHED) != 0 {
        return inv(format!("unknown superblock flags {flags:#04x}"));
    }
    let active = match b[SB_ACTIVE] {
        0 => Area::A,
        1 => Area::B,
        x => return inv(format!("active snapshot area {x} (expected 0 or 1)")),
    };
    let volumes_active = match b[SB_VOLUMES_ACTIVE] {
        0 => Area::A,
        1 => Area::B,
        x => return inv(format!("active volume-table copy {x} (expected 0 or 1)")),
    };
    let volumes_generation = rd_u64(b, SB_VOLUMES_GEN);
    if volumes_generation == 0 || volumes_generation >= MAX_SEQ {
        return inv(format!(
            "volume-table generation {volumes_generation} out of range"
        ));
    }
    let policy = &b[SB_POLICY..SB_END];
    let policy_len = policy.iter().position(|&c| c == 0).unwrap_or(POLICY_LEN);
    if policy[policy_len..].iter().any(|&c| c != 0)
        || std::str::from_utf8(&policy[..policy_len]).is_err()
    {
        return inv("policy name is not zero-padded UTF-8".into());
    }
    if rd_u32(b, SB_MAX_VOLUMES + 4) != 0 || b[SB_END..].iter().any(|&c| c != 0) {
        return inv("stray bytes after the superblock's fields".into());
    }
    let capacity = rd_u64(b, SB_CAPACITY);
    if capacity == 0 || capacity >= u64::from(u32::MAX) {
        return inv(format!("capacity {capacity} blocks out of range"));
    }
    let layout = Layout {
        max_volumes: rd_u32(b, SB_MAX_VOLUMES),
        volumes_a: rd_u64(b, SB_VOLUMES_A),
        volumes_b: rd_u64(b, SB_VOLUMES_B),
        volume_blocks: rd_u64(b, SB_VOLUME_BLOCKS),
        block_size: rd_u32(b, SB_BLOCK_SIZE),
        capacity: capacity as u32,
        snapshot_a: rd_u64(b, SB_SNAP_A),
        snapshot_b: rd_u64(b, SB_SNAP_B),
        snapshot_blocks: rd_u64(b, SB_SNAP_BLOCKS),
        journal_first: rd_u64(b, SB_JOURNAL),
        journal_blocks: rd_u64(b, SB_JOURNAL_BLOCKS),
        data_offset: rd_u64(b, SB_DATA_OFFSET),
    };
    layout.validate().map_err(DecodeError::Invalid)?;
    let journal_start_seq = rd_u64(b, SB_JOURNAL_SEQ);
    let pos = rd_u64(b, SB_JOURNAL_POS);
    if pos != journal_start_seq % layout.journal_blocks {
        return inv(format!(
            "journal start position {pos} does not match sequence {journal_start_seq}"
        ));
    }
    Ok(Superblock {
        generation: h.seq,
        uuid: h.uuid,
        version,
        compat: rd_u64(b, SB_COMPAT),
        ro_compat: rd_u64(b, SB_RO_COMPAT),
        incompat: rd_u64(b, SB_INCOMPAT),
        mode,
        clean_shutdown: flags & SB_FLAG_CLEAN != 0,
        detached: flags & SB_FLAG_DETACHED != 0,
        policy: get_str(&b[SB_POLICY..SB_POLICY + POLICY_LEN]),
        layout,
        volumes_active,
        volumes_generation,
        active,
        snapshot_seq: rd_u64(b, SB_SNAP_SEQ),
        journal_start_seq,
    })
}

/// A decoded snapshot block: entries `index * 252 ..` of the mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotBlock {
    pub header: Header,
    /// Position of this block within its area.
    pub index: u32,
    /// Packed entries (see [`Entry::pack`]), at most 252.
    pub entries: Vec<PackedEntry>,
}

/// Encodes snapshot block `index` of snapshot `seq`, stored at device block
/// `block`. `entries` holds at most [`SNAPSHOT_ENTRIES_PER_BLOCK`] packed
/// entries.
pub fn encode_snapshot_block(
    uuid: [u8; 16],
    seq: u64,
    block: u64,
    index: u32,
    entries: &[PackedEntry],
    out: &mut [u8],
) {
    assert!(entries.len() <= SNAPSHOT_ENTRIES_PER_BLOCK && out.len() == META_BLOCK);
    out.fill(0);
    write_header(out, &SNAPSHOT_MAGIC, &Header { block, uuid, seq });
    wr_u32(out, 48, index);
    wr_u32(out, 52, entries.len() as u32);
    for (i, e) in entries.iter().enumerate() {
        let at = PAYLOAD_AT + ENTRY_LEN * i;
        out[at..at + ENTRY_LEN].copy_from_slice(e);
    }
    seal(out);
}

/// Decodes a snapshot block read from device block `block`. Checks that
/// every entry unpacks; the caller checks uuid, sequence, index and count.
pub fn decode_snapshot_block(b: &[u8], block: u64) -> Result<SnapshotBlock, DecodeError> {
    let header = check_header(b, &SNAPSHOT_MAGIC, block)?;
    let index = rd_u32(b, 48);
    let count = rd_u32(b, 52) as usize;
    if count > SNAPSHOT_ENTRIES_PER_BLOCK {
        return Err(DecodeError::Invalid(format!(
            "snapshot block holds {count} entries (at most {SNAPSHOT_ENTRIES_PER_BLOCK})"
        )));
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let w = rd_entry(b, PAYLOAD_AT + ENTRY_LEN * i);
        unpack(w)?;
        entries.push(w);
    }
    Ok(SnapshotBlock {
        header,
        index,
        entries,
    })
}

/// One journal record: slot `slot` now holds the packed entry `entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub slot: u32,
    pub entry: PackedEntry,
}

/// A decoded journal block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalBlock {
    /// `header.seq` is the journal sequence number.
    pub header: Header,
    /// Sequence of the first block of the commit this block belongs to.
    pub commit_start: u64,
    /// The last block of its commit.
    pub last: bool,
    pub records: Vec<Record>,
}

/// Encodes a journal block. `records` holds 1 to
/// [`JOURNAL_RECORDS_PER_BLOCK`] records.
pub fn encode_journal_block(jb: &JournalBlock, out: &mut [u8]) {
    assert!(
        !jb.records.is_empty()
            && jb.records.len() <= JOURNAL_RECORDS_PER_BLOCK
            && out.len() == META_BLOCK
    );
    out.fill(0);
    write_header(out, &JOURNAL_MAGIC, &jb.header);
    wr_u64(out, 48, jb.commit_start);
    wr_u32(out, 56, jb.records.len() as u32);
    wr_u32(out, 60, if jb.last { JOURNAL_FLAG_LAST } else { 0 });
    for (i, r) in jb.records.iter().enumerate() {
        let at = PAYLOAD_AT + RECORD_LEN * i;
        wr_u32(out, at, r.slot);
        out[at + 4..at + RECORD_LEN].copy_from_slice(&r.entry);
    }
    seal(out);
}

/// Decodes a journal block read from device block `block`. Checks that
/// the commit start is not after the block's own sequence and every
/// record's entry unpacks; the caller checks uuid, sequence and slots.
pub fn decode_journal_block(b: &[u8], block: u64) -> Result<JournalBlock, DecodeError> {
    let header = check_header(b, &JOURNAL_MAGIC, block)?;
    let commit_start = rd_u64(b, 48);
    let count = rd_u32(b, 56) as usize;
    let flags = rd_u32(b, 60);
    if count == 0 || count > JOURNAL_RECORDS_PER_BLOCK {
        return Err(DecodeError::Invalid(format!(
            "journal block holds {count} records (1 to {JOURNAL_RECORDS_PER_BLOCK})"
        )));
    }
    if flags & !JOURNAL_FLAG_LAST != 0 {
        return Err(DecodeError::Invalid(format!(
            "unknown journal flags {flags:#x}"
        )));
    }
    if header.seq >= MAX_SEQ {
        return Err(DecodeError::Invalid(format!(
            "journal sequence {} out of range",
            header.seq
        )));
    }
    if commit_start > header.seq {
        return Err(DecodeError::Invalid(format!(
            "commit start {commit_start} after the block's own sequence {}",
            header.seq
        )));
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let at = PAYLOAD_AT + RECORD_LEN * i;
        let r = Record {
            slot: rd_u32(b, at),
            entry: rd_entry(b, at + 4),
        };
        unpack(r.entry)?;
        records.push(r);
    }
    Ok(JournalBlock {
        header,
        commit_start,
        last: flags & JOURNAL_FLAG_LAST != 0,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_sb() -> Superblock {
        Superblock {
            generation: 7,
            uuid: [9; 16],
            version: FORMAT_VERSION,
            compat: 0,
            ro_compat: 0,
            incompat: 0,
            mode: CacheMode::WriteBack,
            clean_shutdown: true,
            detached: false,
            policy: "smq+hotspot".into(),
            layout: Layout::compute(64 << 20, 4096, 1024, None).unwrap(),
            volumes_active: Area::A,
            volumes_generation: 77,
            active: Area::B,
            snapshot_seq: 3,
            journal_start_seq: 12345,
        }
    }

    fn packed(word: u64, crc: u32) -> PackedEntry {
        packed_v(word, crc, 0, if word == 0 { 0 } else { 1 })
    }

    fn packed_v(word: u64, crc: u32, volume: u16, generation: u16) -> PackedEntry {
        let mut p = FREE_ENTRY;
        p[..8].copy_from_slice(&word.to_le_bytes());
        p[8..12].copy_from_slice(&crc.to_le_bytes());
        p[12..14].copy_from_slice(&volume.to_le_bytes());
        p[14..16].copy_from_slice(&generation.to_le_bytes());
        p
    }

    #[test]
    fn entry_round_trip_and_layout() {
        let e = Entry {
            volume: VolumeId(0),
            oblock: MAX_OBLOCK,
            dirty: true,
            hint: 63,
            crc: Some(u32::MAX),
        };
        assert_eq!(unpack(e.pack(1)).unwrap(), Some(e));
        // valid, dirty, hint 63 and has-crc: bits 48..57.
        assert_eq!(e.pack(1), packed(MAX_OBLOCK | (0x1ff << 48), u32::MAX));
        assert_eq!(unpack(FREE_ENTRY).unwrap(), None);
        assert_eq!(pack(None, 0), [0u8; 16]);
        assert_eq!(pack(None, 9), [0u8; 16], "a free slot has no generation");
        let e = Entry {
            volume: VolumeId(0),
            oblock: 5,
            dirty: false,
            hint: 200,
            crc: None,
        };
        assert_eq!(e.pack(1), packed(5 | (1 << 48) | (63 << 50), 0));
        assert_eq!(unpack(e.pack(1)).unwrap().unwrap().hint, 63);
        // A clean claim with a crc: has-crc bit 56, crc in bytes 8..12,
        // little-endian.
        let c = Entry {
            volume: VolumeId(0x0201),
            oblock: 0x0102_0304_0506,
            dirty: false,
            hint: 1,
            crc: Some(0xa1b2_c3d4),
        };
        // Then the volume (0x0201) and the generation (0xfffe), little-endian.
        assert_eq!(
            c.pack(0xfffe),
            [
                0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x05, 0x01, 0xd4, 0xc3, 0xb2, 0xa1, 0x01, 0x02,
                0xfe, 0xff
            ]
        );
        assert_eq!(unpack(c.pack(0xfffe)).unwrap(), Some(c));
        assert_eq!(entry_generation(&c.pack(0xfffe)), 0xfffe);
        // A zero crc is a crc, not "no crc".
        let z = Entry { crc: Some(0), ..c };
        assert_eq!(unpack(z.pack(3)).unwrap(), Some(z));
        assert_ne!(z.pack(3), Entry { crc: None, ..c }.pack(3));

        assert!(unpack(packed(1, 0)).is_err(), "free entry with stray bits");
        assert!(
            unpack(packed(1 << 56, 0)).is_err(),
            "free entry with has-crc bit"
        );
        assert!(unpack(packed(0, 7)).is_err(), "free entry with a crc");
        assert!(
            unpack(packed(5 | (1 << 48), 7)).is_err(),
            "crc without has-crc bit"
        );
        assert!(
            unpack(packed_v(0, 0, 1, 0)).is_err(),
            "free entry with a volume"
        );
        assert!(
            unpack(packed_v(0, 0, 0, 1)).is_err(),
            "free entry with a generation"
        );
        assert!(
            unpack(packed_v(5 | (1 << 48), 0, 0, 0)).is_err(),
            "entry with generation 0"
        );
        // Spare bits 57..64 are ignored.
        let word = u64::from_le_bytes(c.pack(1)[..8].try_into().unwrap());
        assert_eq!(
            unpack(packed_v(word | (0x7f << 57), 0xa1b2_c3d4, 0x0201, 1)).unwrap(),
            Some(c)
        );
    }

    #[test]
    fn claim_length_and_content_crc() {
        // Whole blocks, the short last block, blocks past the end.
        assert_eq!(claim_len(4096, 3 * 4096 + 100, 0), 4096);
        assert_eq!(claim_len(4096, 3 * 4096 + 100, 2), 4096);
        assert_eq!(claim_len(4096, 3 * 4096 + 100, 3), 100);
        assert_eq!(claim_len(4096, 3 * 4096 + 100, 4), 0);
        assert_eq!(claim_len(4096, 8192, 1), 4096);
        assert_eq!(claim_len(1 << 20, u64::MAX, u64::MAX), 0);
        // The crc32c crate's crc32c (Castagnoli), check value of "123456789".
        assert_eq!(content_crc(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn format_version_is_3_and_capacities_follow_the_entry_size() {
        assert_eq!(FORMAT_VERSION, 3);
        assert_eq!(ENTRY_LEN, 16);
        assert_eq!(SNAPSHOT_ENTRIES_PER_BLOCK, 252);
        assert_eq!(JOURNAL_RECORDS_PER_BLOCK, 201);
        // Version-1 and version-2 superblocks are refused as such (their
        // layout is not even looked at).
        for v in [1, 2] {
            let mut b = encode_superblock(&sample_sb());
            wr_u32(&mut b, SB_VERSION, v);
            seal(&mut b);
            assert_eq!(
                decode_superblock(&b, 1),
                Err(DecodeError::UnsupportedVersion { found: v })
            );
        }
    }

    #[test]
    fn superblock_byte_layout() {
        let sb = sample_sb();
        let b = encode_superblock(&sb);
        let l = sb.layout;
        assert_eq!(rd_u32(&b, 48), 3);
        assert_eq!(b[86], 1, "snapshot area B");
        assert_eq!(b[87], 0, "volume table copy A");
        assert_eq!(rd_u64(&b, 168), 2);
        assert_eq!(rd_u64(&b, 176), 2 + 69);
        assert_eq!(rd_u64(&b, 184), 69);
        assert_eq!(rd_u32(&b, 192), 1024);
        assert_eq!(rd_u64(&b, 200), 77);
        assert_eq!(&b[208..219], b"smq+hotspot");
        assert_eq!(SB_END, 240);
        assert!(b[SB_END..].iter().all(|&c| c == 0));
        assert_eq!(rd_u64(&b, 104), l.snapshot_a);
        assert_eq!(l.snapshot_a, 2 + 2 * 69);
    }

    #[test]
    fn superblock_round_trip() {
        let sb = sample_sb();
        let b = encode_superblock(&sb);
        assert_eq!(decode_superblock(&b, 1).unwrap(), sb);
        let mut sb2 = sb.clone();
        sb2.generation = 8;
        sb2.volumes_active = Area::B;
        sb2.active = Area::A;
        sb2.mode = CacheMode::PassThrough;
        sb2.detached = true;
        sb2.clean_shutdown = false;
        assert_eq!(decode_superblock(&encode_superblock(&sb2), 0).unwrap(), sb2);
    }

    #[test]
    fn superblock_rejects_corruption() {
        let sb = sample_sb();
        let b = encode_superblock(&sb);
        // Any flipped bit is caught by the crc.
        for at in [0usize, 9, 20, 100, 300, 4095] {
            let mut c = b.clone();
            c[at] ^= 0x10;
            assert!(decode_superblock(&c, 1).is_err(), "flip at {at}");
        }
        let mut c = b.clone();
        c[200] ^= 1;
        assert!(matches!(
            decode_superblock(&c, 1),
            Err(DecodeError::BadCrc { .. })
        ));
        // Read from the wrong place.
        assert!(matches!(
            decode_superblock(&b, 0),
            Err(DecodeError::WrongBlockNumber {
                expected: 0,
                found: 1
            })
        ));
        // Wrong magic, wrong length, a future version.
        assert!(matches!(
            decode_superblock(&vec![0u8; META_BLOCK], 1),
            Err(DecodeError::WrongMagic { .. })
        ));
        assert!(matches!(
            decode_superblock(&b[..100], 1),
            Err(DecodeError::WrongLength(100))
        ));
        let mut c = b.clone();
        wr_u32(&mut c, SB_VERSION, 4);
        seal(&mut c);
        assert_eq!(
            decode_superblock(&c, 1),
            Err(DecodeError::UnsupportedVersion { found: 4 })
        );
        // A sealed but inconsistent layout, volume table fields, or stray
        // bytes after the fields.
        for (at, v) in [
            (SB_SNAP_B, 3u64),
            (SB_VOLUMES_A, 3),
            (SB_VOLUMES_B, 70),
            (SB_VOLUME_BLOCKS, 68),
            (SB_VOLUMES_GEN, 0),
            (SB_VOLUMES_GEN, MAX_SEQ),
            (SB_END, 1),
            (4088, 1),
        ] {
            let mut c = b.clone();
            wr_u64(&mut c, at, v);
            seal(&mut c);
            assert!(
                matches!(decode_superblock(&c, 1), Err(DecodeError::Invalid(_))),
                "{at} = {v}"
            );
        }
        for (at, v) in [
            (SB_MAX_VOLUMES, 0u32),
            (SB_MAX_VOLUMES, 1036),
            (SB_MAX_VOLUMES + 4, 1),
        ] {
            let mut c = b.clone();
            wr_u32(&mut c, at, v);
            seal(&mut c);
            assert!(decode_superblock(&c, 1).is_err(), "max volumes {v}");
        }
        for bad in [&b"ab\0c"[..], &[0xff, 0xfe]] {
            let mut c = b.clone();
            c[SB_POLICY..SB_END].fill(0);
            c[SB_POLICY..SB_POLICY + bad.len()].copy_from_slice(bad);
            seal(&mut c);
            assert!(decode_superblock(&c, 1).is_err(), "policy {bad:?}");
        }
        let mut c = b.clone();
        c[SB_VOLUMES_ACTIVE] = 2;
        seal(&mut c);
        assert!(decode_superblock(&c, 1).is_err(), "volume copy 2");
        let mut c = b;
        c[SB_MODE] = 9;
        seal(&mut c);
        assert!(matches!(
            decode_superblock(&c, 1),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn long_strings_are_cut_at_char_boundaries() {
        let mut sb = sample_sb();
        sb.policy = "é".repeat(40);
        let d = decode_superblock(&encode_superblock(&sb), 1).unwrap();
        assert_eq!(d.policy, "é".repeat(16));
        sb.policy = "x".repeat(40);
        let d = decode_superblock(&encode_superblock(&sb), 1).unwrap();
        assert_eq!(d.policy, "x".repeat(32));
        assert_eq!(stored_str(&sb.policy, POLICY_LEN), d.policy);
    }

    #[test]
    fn snapshot_block_round_trip_and_errors() {
        let entries: Vec<PackedEntry> = (0..SNAPSHOT_ENTRIES_PER_BLOCK as u64)
            .map(|i| {
                pack(
                    (i % 3 != 0).then_some(Entry {
                        volume: VolumeId(i as u16 % 5),
                        oblock: i * 7,
                        dirty: i % 2 == 0,
                        hint: (i % 64) as u8,
                        crc: (i % 4 != 0).then_some((i as u32).wrapping_mul(0x9e37_79b9)),
                    }),
                    i as u16 + 1,
                )
            })
            .collect();
        let mut b = vec![0u8; META_BLOCK];
        encode_snapshot_block([1; 16], 42, 17, 3, &entries, &mut b);
        let d = decode_snapshot_block(&b, 17).unwrap();
        assert_eq!(d.header.seq, 42);
        assert_eq!(d.header.uuid, [1; 16]);
        assert_eq!(d.index, 3);
        assert_eq!(d.entries, entries);
        assert!(matches!(
            decode_snapshot_block(&b, 18),
            Err(DecodeError::WrongBlockNumber { .. })
        ));
        let mut c = b.clone();
        c[PAYLOAD_AT + 5] ^= 4;
        assert!(matches!(
            decode_snapshot_block(&c, 17),
            Err(DecodeError::BadCrc { .. })
        ));
        // A journal block is not a snapshot block.
        assert!(matches!(
            decode_journal_block(&b, 17),
            Err(DecodeError::WrongMagic { .. })
        ));
        let mut c = b.clone();
        wr_u32(&mut c, 52, 253);
        seal(&mut c);
        assert!(decode_snapshot_block(&c, 17).is_err());
        // The last entry sits at 64 + 251 * 16 = 4080..4096; a crc without
        // the has-crc bit there, sealed, is refused.
        let mut c = b.clone();
        let last = PAYLOAD_AT + ENTRY_LEN * (SNAPSHOT_ENTRIES_PER_BLOCK - 1);
        assert_eq!(last + ENTRY_LEN, META_BLOCK);
        assert_eq!(&c[last..], &entries[SNAPSHOT_ENTRIES_PER_BLOCK - 1]);
        c[last + 7] &= !1; // clear the has-crc bit (bit 56)
        seal(&mut c);
        assert!(matches!(
            decode_snapshot_block(&c, 17),
            Err(DecodeError::Invalid(_))
        ));
        // A generation of 0 in an entry, sealed, is refused.
        let mut c = b.clone();
        c[last + 14..last + 16].fill(0);
        seal(&mut c);
        assert!(matches!(
            decode_snapshot_block(&c, 17),
            Err(DecodeError::Invalid(_))
        ));
        // Short block.
        encode_snapshot_block([1; 16], 1, 2, 0, &entries[..3], &mut b);
        assert_eq!(decode_snapshot_block(&b, 2).unwrap().entries, &entries[..3]);
    }

    #[test]
    fn journal_block_round_trip_and_errors() {
        let jb = JournalBlock {
            header: Header {
                block: 99,
                uuid: [3; 16],
                seq: 1000,
            },
            commit_start: 998,
            last: true,
            records: (0..JOURNAL_RECORDS_PER_BLOCK as u32)
                .map(|i| Record {
                    slot: i * 3,
                    entry: pack(
                        (i % 2 == 0).then_some(Entry {
                            volume: VolumeId(i as u16),
                            oblock: u64::from(i) << 20,
                            dirty: i % 4 == 0,
                            hint: 1,
                            crc: (i % 4 == 2).then_some(i.wrapping_mul(0x0101_0101)),
                        }),
                        7,
                    ),
                })
                .collect(),
        };
        let mut b = vec![0u8; META_BLOCK];
        encode_journal_block(&jb, &mut b);
        assert_eq!(decode_journal_block(&b, 99).unwrap(), jb);
        assert!(matches!(
            decode_journal_block(&b, 98),
            Err(DecodeError::WrongBlockNumber { .. })
        ));
        let mut c = b.clone();
        c[4000] ^= 0x80;
        assert!(matches!(
            decode_journal_block(&c, 99),
            Err(DecodeError::BadCrc { .. })
        ));
        let mut c = b.clone();
        wr_u64(&mut c, 48, 1001);
        seal(&mut c);
        assert!(decode_journal_block(&c, 99).is_err());
        let mut c = b.clone();
        wr_u32(&mut c, 56, 0);
        seal(&mut c);
        assert!(decode_journal_block(&c, 99).is_err());
        // Records are 20 bytes: the last one ends at 64 + 201 * 20 = 4084.
        let last = PAYLOAD_AT + RECORD_LEN * (JOURNAL_RECORDS_PER_BLOCK - 1);
        assert_eq!(last + RECORD_LEN, 4084);
        assert_eq!(rd_u32(&b, last), jb.records.last().unwrap().slot);
        assert_eq!(
            &b[last + 4..last + RECORD_LEN],
            &jb.records.last().unwrap().entry
        );
        // A free record with a stray crc, sealed, is refused.
        let mut c = b.clone();
        c[last + 4 + 8] = 1;
        seal(&mut c);
        assert!(matches!(
            decode_journal_block(&c, 99),
            Err(DecodeError::Invalid(_))
        ));
        let mut one = jb.clone();
        one.records.truncate(1);
        one.last = false;
        encode_journal_block(&one, &mut b);
        assert_eq!(decode_journal_block(&b, 99).unwrap(), one);
    }
}
