//! The volume table: which backing volumes share this cache device, and
//! the encoder and decoder of its blocks.
//!
//! The table has `max_volumes` records of [`VOLUME_RECORD_LEN`] bytes,
//! [`VOLUMES_PER_BLOCK`] per 4 KiB block after the 64-byte block header
//! region. Two copies (A and B) exist; the superblock names the active one
//! and its generation (see `docs/on-disk-format.md`).
//!
//! Volume-table block:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 48 | common header, magic `TCVOLUME`, sequence = table generation |
//! | 48 | 4 | index of this block within the table copy |
//! | 52 | 4 | records in this block (15, fewer in the last block) |
//! | 56 | 8 | reserved, 0 |
//! | 64 + 256 i | 256 | record i (volume index `15 * index + i`) |
//!
//! Volume record (256 bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | generation: the last generation this index was attached with (0: never attached) |
//! | 2 | 1 | state: 0 free, 1 attached, 2 detaching |
//! | 3 | 1 | cache mode: 0 writethrough, 1 writeback, 2 writearound, 3 passthrough |
//! | 4 | 1 | flags: bit 0 fingerprint known, bit 1 sequential cutoff set; other bits 0 |
//! | 5 | 1 | name length, 1..=63 |
//! | 6 | 1 | path hint length, 0..=127 |
//! | 7 | 1 | reserved, 0 |
//! | 8 | 8 | size of the backing volume in bytes (> 0) |
//! | 16 | 16 | volume uuid (random at attach) |
//! | 32 | 4 | fingerprint (0 when unknown) |
//! | 36 | 4 | reserved, 0 |
//! | 40 | 8 | sequential cutoff in bytes (0 when not set) |
//! | 48 | 64 | name, UTF-8 `[A-Za-z0-9._-]`, zero-padded |
//! | 112 | 128 | path hint, UTF-8, zero-padded (advisory) |
//! | 240 | 16 | reserved, 0 |
//!
//! A free record (state 0) is all zero except its generation, which is
//! kept so the next attach of the index gets a new one.

use crate::codec::{
    check_header, mode_code, mode_from, rd_u32, rd_u64, seal, wr_u32, wr_u64, write_header,
    BackingIdentity, DecodeError, Header, META_BLOCK, PAYLOAD_AT,
};
use crate::error::{MetadataError, Result};
pub use crate::geometry::{volume_blocks, MAX_MAX_VOLUMES, VOLUMES_PER_BLOCK, VOLUME_RECORD_LEN};
use tiercache_types::{CacheMode, VolumeId};

pub const VOLUME_MAGIC: [u8; 8] = *b"TCVOLUME";
/// The default `max_volumes` (the largest is [`MAX_MAX_VOLUMES`]).
pub const DEFAULT_MAX_VOLUMES: u32 = 1024;
/// Longest volume name and path hint, in bytes.
pub const MAX_NAME_LEN: usize = 63;
pub const MAX_PATH_HINT_LEN: usize = 127;

const STATE_FREE: u8 = 0;
const STATE_ATTACHED: u8 = 1;
const STATE_DETACHING: u8 = 2;
const FLAG_FINGERPRINT: u8 = 1;
const FLAG_CUTOFF: u8 = 2;

const R_GEN: usize = 0;
const R_STATE: usize = 2;
const R_MODE: usize = 3;
const R_FLAGS: usize = 4;
const R_NAME_LEN: usize = 5;
const R_PATH_LEN: usize = 6;
const R_SIZE: usize = 8;
const R_UUID: usize = 16;
const R_FINGERPRINT: usize = 32;
const R_CUTOFF: usize = 40;
const R_NAME: usize = 48;
const R_PATH: usize = 112;
const R_END: usize = R_PATH + MAX_PATH_HINT_LEN + 1;
const _: () = assert!(R_END + 16 == VOLUME_RECORD_LEN);

/// Where an attached volume stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolumeState {
    /// In use: its blocks are served.
    Attached,
    /// Being detached: its dirty blocks are being written back; its slots
    /// are not yet freed. Its entries are still valid.
    Detaching,
}

/// One attached (or detaching) backing volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    /// Nonzero; bumped every time the index is attached (65535 wraps to 1).
    /// Every entry carries the generation of its volume at claim time; an
    /// entry whose generation differs is stale and never served.
    pub generation: u16,
    pub state: VolumeState,
    /// Random at attach.
    pub uuid: [u8; 16],
    /// 1 to 63 bytes of `[A-Za-z0-9._-]`, unique in the pool.
    pub name: String,
    /// Size of the backing volume in bytes.
    pub size: u64,
    /// crc32c of the backing volume's first and last 64 KiB
    /// ([`crate::fingerprint`]) at the last clean shutdown.
    pub fingerprint: Option<u32>,
    pub mode: CacheMode,
    pub sequential_cutoff: Option<u64>,
    /// Where the volume was found last (advisory), at most 127 bytes.
    pub path_hint: String,
}

/// One index of the volume table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeSlot {
    /// Not attached. `last_generation` is the generation the index had at
    /// its last attachment (0: never attached).
    Free {
        last_generation: u16,
    },
    Used(VolumeRecord),
}

impl VolumeSlot {
    pub fn record(&self) -> Option<&VolumeRecord> {
        match self {
            VolumeSlot::Free { .. } => None,
            VolumeSlot::Used(r) => Some(r),
        }
    }

    /// The generation an attach of this index would get.
    pub fn next_generation(&self) -> u16 {
        let g = match self {
            VolumeSlot::Free { last_generation } => *last_generation,
            VolumeSlot::Used(r) => r.generation,
        };
        if g == u16::MAX {
            1
        } else {
            g + 1
        }
    }
}

/// A volume to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewVolume {
    pub name: String,
    /// Size, path hint and (optional) fingerprint of the backing volume.
    pub identity: BackingIdentity,
    /// `None`: the cache's default mode.
    pub mode: Option<CacheMode>,
    pub sequential_cutoff: Option<u64>,
}

/// Checks a volume name: 1 to 63 bytes of `[A-Za-z0-9._-]`.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(MetadataError::InvalidArgument(format!(
            "volume name '{name}' must be 1 to {MAX_NAME_LEN} bytes long (it is {})",
            name.len()
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(MetadataError::InvalidArgument(format!(
            "volume name '{name}' contains {c:?}; use only letters, digits, '.', '_' and '-'"
        )));
    }
    Ok(())
}

/// A path hint as stored: cut to at most 127 bytes at a char boundary.
pub fn stored_path_hint(s: &str) -> String {
    let mut n = s.len().min(MAX_PATH_HINT_LEN);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    s[..n].to_string()
}

fn describe(path_hint: &str, size: u64, fingerprint: Option<u32>) -> String {
    let path = if path_hint.is_empty() {
        "(path unknown)".to_string()
    } else {
        format!("'{path_hint}'")
    };
    match fingerprint {
        Some(f) => format!("{path} of {size} bytes, fingerprint {f:08x}"),
        None => format!("{path} of {size} bytes"),
    }
}

impl VolumeRecord {
    /// Checks that `found` is this volume's backing device: the size must
    /// match; if both fingerprints are known and differ, that is refused
    /// after a clean shutdown (`was_clean`: a different device, or one
    /// written behind the cache's back) and only a warning (returned)
    /// after an unclean one (writeback legitimately changed it).
    pub fn check_backing(
        &self,
        found: &BackingIdentity,
        was_clean: bool,
    ) -> Result<Option<String>> {
        let expected = || {
            format!(
                "volume '{}': {}",
                self.name,
                describe(&self.path_hint, self.size, self.fingerprint)
            )
        };
        let found_desc = || describe(&found.path_hint, found.size, found.fingerprint);
        if found.size != self.size {
            return Err(MetadataError::WrongBackingDevice {
                expected: expected(),
                found: found_desc(),
            });
        }
        if let (Some(want), Some(got)) = (self.fingerprint, found.fingerprint) {
            if want != got {
                if was_clean {
                    return Err(MetadataError::WrongBackingDevice {
                        expected: expected(),
                        found: format!(
                            "{} (same size, but its first and last 64 KiB differ from those seen at the last clean shutdown)",
                            found_desc()
                        ),
                    });
                }
                return Ok(Some(format!(
                    "volume '{}': backing device fingerprint {got:08x} differs from {want:08x} \
                     recorded at the last clean shutdown; expected after an unclean shutdown \
                     with writeback, otherwise check that this is the right backing device",
                    self.name
                )));
            }
        }
        Ok(None)
    }

    /// The identity recorded for this volume.
    pub fn identity(&self) -> BackingIdentity {
        BackingIdentity {
            size: self.size,
            path_hint: self.path_hint.clone(),
            fingerprint: self.fingerprint,
        }
    }
}

/// Encodes one 256-byte record.
pub fn encode_volume_slot(slot: &VolumeSlot, out: &mut [u8]) {
    assert_eq!(out.len(), VOLUME_RECORD_LEN);
    out.fill(0);
    let r = match slot {
        VolumeSlot::Free { last_generation } => {
            out[R_GEN..R_GEN + 2].copy_from_slice(&last_generation.to_le_bytes());
            return;
        }
        VolumeSlot::Used(r) => r,
    };
    out[R_GEN..R_GEN + 2].copy_from_slice(&r.generation.to_le_bytes());
    out[R_STATE] = match r.state {
        VolumeState::Attached => STATE_ATTACHED,
        VolumeState::Detaching => STATE_DETACHING,
    };
    out[R_MODE] = mode_code(r.mode);
    out[R_FLAGS] = if r.fingerprint.is_some() {
        FLAG_FINGERPRINT
    } else {
        0
    } | if r.sequential_cutoff.is_some() {
        FLAG_CUTOFF
    } else {
        0
    };
    // Names are validated before they get here; a longer one is cut.
    let name = &r.name.as_bytes()[..r.name.len().min(MAX_NAME_LEN)];
    let path = stored_path_hint(&r.path_hint);
    out[R_NAME_LEN] = name.len() as u8;
    out[R_PATH_LEN] = path.len() as u8;
    wr_u64(out, R_SIZE, r.size);
    out[R_UUID..R_UUID + 16].copy_from_slice(&r.uuid);
    wr_u32(out, R_FINGERPRINT, r.fingerprint.unwrap_or(0));
    wr_u64(out, R_CUTOFF, r.sequential_cutoff.unwrap_or(0));
    out[R_NAME..R_NAME + name.len()].copy_from_slice(name);
    out[R_PATH..R_PATH + path.len()].copy_from_slice(path.as_bytes());
}

/// Decodes one 256-byte record. Every reserved byte, every byte of a free
/// record but its generation, and the padding after the name and path
/// must be zero; the name must be valid.
pub fn decode_volume_slot(b: &[u8]) -> std::result::Result<VolumeSlot, DecodeError> {
    let inv = |m: String| Err(DecodeError::Invalid(m));
    if b.len() != VOLUME_RECORD_LEN {
        return Err(DecodeError::WrongLength(b.len()));
    }
    let generation = u16::from_le_bytes([b[R_GEN], b[R_GEN + 1]]);
    let state = match b[R_STATE] {
        STATE_FREE => {
            if b[R_GEN + 2..].iter().any(|&c| c != 0) {
                return inv("free volume record with stray bytes".into());
            }
            return Ok(VolumeSlot::Free {
                last_generation: generation,
            });
        }
        STATE_ATTACHED => VolumeState::Attached,
        STATE_DETACHING => VolumeState::Detaching,
        x => return inv(format!("volume record state {x} (expected 0, 1 or 2)")),
    };
    if generation == 0 {
        return inv("attached volume record with generation 0".into());
    }
    let Some(mode) = mode_from(b[R_MODE]) else {
        return inv(format!("unknown cache mode code {}", b[R_MODE]));
    };
    let flags = b[R_FLAGS];
    if flags & !(FLAG_FINGERPRINT | FLAG_CUTOFF) != 0 {
        return inv(format!("unknown volume record flags {flags:#04x}"));
    }
    let (name_len, path_len) = (usize::from(b[R_NAME_LEN]), usize::from(b[R_PATH_LEN]));
    if name_len == 0 || name_len > MAX_NAME_LEN || path_len > MAX_PATH_HINT_LEN {
        return inv(format!(
            "volume name of {name_len} bytes or path hint of {path_len} bytes out of range"
        ));
    }
    let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&c| c == 0);
    if b[7] != 0
        || !zero(36..40)
        || !zero(R_NAME + name_len..R_PATH)
        || !zero(R_PATH + path_len..VOLUME_RECORD_LEN)
    {
        return inv("volume record with stray bytes in reserved fields or padding".into());
    }
    let name = std::str::from_utf8(&b[R_NAME..R_NAME + name_len])
        .map_err(|_| DecodeError::Invalid("volume name is not UTF-8".into()))?;
    validate_name(name).map_err(|e| DecodeError::Invalid(e.to_string()))?;
    let path_hint = std::str::from_utf8(&b[R_PATH..R_PATH + path_len])
        .map_err(|_| DecodeError::Invalid("volume path hint is not UTF-8".into()))?;
    let size = rd_u64(b, R_SIZE);
    if size == 0 {
        return inv(format!("volume '{name}' has size 0"));
    }
    let fingerprint = rd_u32(b, R_FINGERPRINT);
    if flags & FLAG_FINGERPRINT == 0 && fingerprint != 0 {
        return inv("fingerprint without its flag".into());
    }
    let cutoff = rd_u64(b, R_CUTOFF);
    if flags & FLAG_CUTOFF == 0 && cutoff != 0 {
        return inv("sequential cutoff without its flag".into());
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[R_UUID..R_UUID + 16]);
    Ok(VolumeSlot::Used(VolumeRecord {
        generation,
        state,
        uuid,
        name: name.to_string(),
        size,
        fingerprint: (flags & FLAG_FINGERPRINT != 0).then_some(fingerprint),
        mode,
        sequential_cutoff: (flags & FLAG_CUTOFF != 0).then_some(cutoff),
        path_hint: path_hint.to_string(),
    }))
}

/// Records expected in table block `index` of a table of `max_volumes`.
pub fn volumes_in_block(max_volumes: u32, index: u64) -> usize {
    let first = index * VOLUMES_PER_BLOCK as u64;
    u64::from(max_volumes)
        .saturating_sub(first)
        .min(VOLUMES_PER_BLOCK as u64) as usize
}

/// A decoded volume-table block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeBlock {
    /// `header.seq` is the table generation.
    pub header: Header,
    /// Position of this block within its table copy.
    pub index: u32,
    /// Records `15 * index ..`, at most 15.
    pub slots: Vec<VolumeSlot>,
}

/// Encodes table block `index` (generation `seq`, device block `block`).
pub fn encode_volume_block(
    uuid: [u8; 16],
    seq: u64,
    block: u64,
    index: u32,
    slots: &[VolumeSlot],
    out: &mut [u8],
) {
    assert!(slots.len() <= VOLUMES_PER_BLOCK && out.len() == META_BLOCK);
    out.fill(0);
    write_header(out, &VOLUME_MAGIC, &Header { block, uuid, seq });
    wr_u32(out, 48, index);
    wr_u32(out, 52, slots.len() as u32);
    for (i, s) in slots.iter().enumerate() {
        let at = PAYLOAD_AT + VOLUME_RECORD_LEN * i;
        encode_volume_slot(s, &mut out[at..at + VOLUME_RECORD_LEN]);
    }
    seal(out);
}

/// Decodes a volume-table block read from device block `block`. Checks
/// header, count, reserved bytes and every record; the caller checks uuid,
/// generation, index, count and that names are unique.
pub fn decode_volume_block(b: &[u8], block: u64) -> std::result::Result<VolumeBlock, DecodeError> {
    let header = check_header(b, &VOLUME_MAGIC, block)?;
    let index = rd_u32(b, 48);
    let count = rd_u32(b, 52) as usize;
    if count == 0 || count > VOLUMES_PER_BLOCK {
        return Err(DecodeError::Invalid(format!(
            "volume-table block holds {count} records (1 to {VOLUMES_PER_BLOCK})"
        )));
    }
    if rd_u64(b, 56) != 0
        || b[PAYLOAD_AT + VOLUME_RECORD_LEN * count..]
            .iter()
            .any(|&c| c != 0)
    {
        return Err(DecodeError::Invalid(
            "volume-table block with stray bytes outside its records".into(),
        ));
    }
    let slots = (0..count)
        .map(|i| {
            let at = PAYLOAD_AT + VOLUME_RECORD_LEN * i;
            decode_volume_slot(&b[at..at + VOLUME_RECORD_LEN])
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(VolumeBlock {
        header,
        index,
        slots,
    })
}

/// Names used twice in a table: (name, indices).
pub fn duplicate_names(table: &[VolumeSlot]) -> Vec<(String, Vec<VolumeId>)> {
    let mut seen: std::collections::BTreeMap<&str, Vec<VolumeId>> = Default::default();
    for (i, s) in table.iter().enumerate() {
        if let Some(r) = s.record() {
            seen.entry(&r.name).or_default().push(VolumeId(i as u16));
        }
    }
    seen.into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(n, v)| (n.to_string(), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> VolumeRecord {
        VolumeRecord {
            generation: 7,
            state: VolumeState::Detaching,
            uuid: [5; 16],
            name: "vm-42.disk_0".into(),
            size: 10 << 30,
            fingerprint: Some(0xdead_beef),
            mode: CacheMode::WriteAround,
            sequential_cutoff: Some(4 << 20),
            path_hint: "/dev/mapper/vg-vm42".into(),
        }
    }

    #[test]
    fn record_round_trip_and_byte_layout() {
        let mut b = [0u8; VOLUME_RECORD_LEN];
        let s = VolumeSlot::Used(sample());
        encode_volume_slot(&s, &mut b);
        assert_eq!(decode_volume_slot(&b).unwrap(), s);
        assert_eq!(&b[0..8], &[7, 0, 2, 2, 3, 12, 19, 0]);
        assert_eq!(rd_u64(&b, 8), 10 << 30);
        assert_eq!(&b[16..32], &[5; 16]);
        assert_eq!(rd_u32(&b, 32), 0xdead_beef);
        assert_eq!(rd_u64(&b, 40), 4 << 20);
        assert_eq!(&b[48..60], b"vm-42.disk_0");
        assert_eq!(&b[112..131], b"/dev/mapper/vg-vm42");
        let bare = VolumeSlot::Used(VolumeRecord {
            generation: u16::MAX,
            state: VolumeState::Attached,
            fingerprint: None,
            sequential_cutoff: None,
            path_hint: String::new(),
            name: "a".repeat(63),
            ..sample()
        });
        encode_volume_slot(&bare, &mut b);
        assert_eq!(decode_volume_slot(&b).unwrap(), bare);
        assert_eq!(bare.next_generation(), 1, "65535 wraps to 1");
        let free = VolumeSlot::Free { last_generation: 9 };
        encode_volume_slot(&free, &mut b);
        assert_eq!(&b[..2], &[9, 0]);
        assert!(b[2..].iter().all(|&c| c == 0));
        assert_eq!(decode_volume_slot(&b).unwrap(), free);
        assert_eq!(free.next_generation(), 10);
        assert_eq!(VolumeSlot::Free { last_generation: 0 }.next_generation(), 1);
    }

    #[test]
    fn record_corruption_is_rejected() {
        let mut good = [0u8; VOLUME_RECORD_LEN];
        encode_volume_slot(&VolumeSlot::Used(sample()), &mut good);
        let bad = |f: &dyn Fn(&mut [u8])| {
            let mut b = good;
            f(&mut b);
            decode_volume_slot(&b).is_err()
        };
        assert!(bad(&|b| b[R_STATE] = 3), "state");
        assert!(bad(&|b| b[0..2].fill(0)), "generation 0");
        assert!(bad(&|b| b[R_MODE] = 4), "mode");
        assert!(bad(&|b| b[R_FLAGS] |= 4), "flags");
        assert!(
            bad(&|b| b[R_FLAGS] &= !FLAG_FINGERPRINT),
            "fingerprint flag"
        );
        assert!(bad(&|b| b[R_FLAGS] &= !FLAG_CUTOFF), "cutoff flag");
        assert!(bad(&|b| b[R_NAME_LEN] = 0), "empty name");
        assert!(bad(&|b| b[R_NAME_LEN] = 64), "long name");
        assert!(bad(&|b| b[R_NAME_LEN] = 13), "name length past the name");
        assert!(bad(&|b| b[R_PATH_LEN] = 128), "long path");
        assert!(bad(&|b| b[R_NAME] = b' '), "bad name char");
        assert!(bad(&|b| b[R_PATH] = 0xff), "path not UTF-8");
        assert!(bad(&|b| b[7] = 1), "reserved");
        assert!(bad(&|b| b[37] = 1), "reserved 36..40");
        assert!(bad(&|b| b[250] = 1), "reserved tail");
        assert!(bad(&|b| b[R_SIZE..R_SIZE + 8].fill(0)), "size 0");
        let mut free = [0u8; VOLUME_RECORD_LEN];
        free[0] = 3;
        assert!(decode_volume_slot(&free).is_ok());
        free[100] = 1;
        assert!(decode_volume_slot(&free).is_err(), "free with stray bytes");
        assert!(decode_volume_slot(&free[..10]).is_err());
    }

    #[test]
    fn names_are_validated() {
        for ok in ["a", "vm-1.disk_0", &"x".repeat(63)] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(64)] {
            let e = validate_name(bad).unwrap_err().to_string();
            assert!(e.contains("volume name"), "{e}");
        }
    }

    #[test]
    fn block_round_trip_and_corruption() {
        assert_eq!(VOLUMES_PER_BLOCK, 15);
        assert_eq!(volume_blocks(1024), 69);
        assert_eq!(volumes_in_block(1024, 68), 4);
        let slots: Vec<VolumeSlot> = (0..15u16)
            .map(|i| {
                if i % 3 == 0 {
                    VolumeSlot::Free { last_generation: i }
                } else {
                    VolumeSlot::Used(VolumeRecord {
                        generation: i,
                        name: format!("v{i}"),
                        ..sample()
                    })
                }
            })
            .collect();
        let mut b = vec![0u8; META_BLOCK];
        encode_volume_block([1; 16], 42, 9, 3, &slots, &mut b);
        let d = decode_volume_block(&b, 9).unwrap();
        assert_eq!((d.header.seq, d.header.uuid, d.index), (42, [1; 16], 3));
        assert_eq!(d.slots, slots);
        assert!(matches!(
            decode_volume_block(&b, 10),
            Err(DecodeError::WrongBlockNumber { .. })
        ));
        let mut c = b.clone();
        c[200] ^= 1;
        assert!(matches!(
            decode_volume_block(&c, 9),
            Err(DecodeError::BadCrc { .. })
        ));
        let mut c = b.clone();
        c[..8].copy_from_slice(b"TCSNAPSH");
        seal(&mut c);
        assert!(matches!(
            decode_volume_block(&c, 9),
            Err(DecodeError::WrongMagic { .. })
        ));
        for count in [0u32, 16] {
            let mut c = b.clone();
            wr_u32(&mut c, 52, count);
            seal(&mut c);
            assert!(decode_volume_block(&c, 9).is_err(), "count {count}");
        }
        let mut c = b.clone();
        c[60] = 1;
        seal(&mut c);
        assert!(decode_volume_block(&c, 9).is_err(), "reserved header bytes");
        let mut c = b.clone();
        c[PAYLOAD_AT + VOLUME_RECORD_LEN + R_STATE] = 9;
        seal(&mut c);
        assert!(decode_volume_block(&c, 9).is_err(), "bad record");
        // A short block: bytes after its records must be zero.
        encode_volume_block([1; 16], 42, 9, 3, &slots[..4], &mut b);
        assert_eq!(decode_volume_block(&b, 9).unwrap().slots, &slots[..4]);
        b[PAYLOAD_AT + 4 * VOLUME_RECORD_LEN] = 1;
        seal(&mut b);
        assert!(
            decode_volume_block(&b, 9).is_err(),
            "stray bytes after records"
        );
    }

    #[test]
    fn duplicates_and_backing_checks() {
        let t = vec![
            VolumeSlot::Used(sample()),
            VolumeSlot::Free { last_generation: 1 },
            VolumeSlot::Used(sample()),
        ];
        assert_eq!(
            duplicate_names(&t),
            vec![("vm-42.disk_0".to_string(), vec![VolumeId(0), VolumeId(2)])]
        );
        let r = sample();
        let same = r.identity();
        assert_eq!(r.check_backing(&same, true).unwrap(), None);
        let other_size = BackingIdentity {
            size: 1,
            ..same.clone()
        };
        assert!(r.check_backing(&other_size, false).is_err());
        let other_fp = BackingIdentity {
            fingerprint: Some(1),
            ..same.clone()
        };
        let e = r.check_backing(&other_fp, true).unwrap_err().to_string();
        assert!(
            e.contains("differ from those seen at the last clean shutdown"),
            "{e}"
        );
        assert!(r.check_backing(&other_fp, false).unwrap().is_some());
        let unknown = BackingIdentity {
            fingerprint: None,
            ..same
        };
        assert_eq!(r.check_backing(&unknown, true).unwrap(), None);
    }
}
