//! The sizes the on-disk format is measured in, below the layout and the
//! codecs that share them: the metadata block, the packed entry, the
//! volume record and table, the supported cache block sizes, and the two
//! copies (A and B) of a region. Depends on nothing else in the crate.

use tiercache_types::{MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};

/// Size of every metadata block, in bytes.
pub const META_BLOCK: usize = 4096;
/// Offset of the payload of snapshot, journal and volume-table blocks.
pub const PAYLOAD_AT: usize = 64;

/// Length of a packed entry on disk.
pub const ENTRY_LEN: usize = 16;

/// Bytes per volume record.
pub const VOLUME_RECORD_LEN: usize = 256;
/// Volume records per table block: `(4096 - 64) / 256` = 15.
pub const VOLUMES_PER_BLOCK: usize = (META_BLOCK - PAYLOAD_AT) / VOLUME_RECORD_LEN;
/// The largest `max_volumes` (records per volume-table copy; the smallest is 1).
pub const MAX_MAX_VOLUMES: u32 = 65535;

/// Table blocks per copy for `max_volumes` records.
pub fn volume_blocks(max_volumes: u32) -> u64 {
    u64::from(max_volumes).div_ceil(VOLUMES_PER_BLOCK as u64)
}

/// Whether a block size is one tiercache supports.
pub fn valid_block_size(bs: u32) -> bool {
    bs.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs)
}

/// Which of the two copies of a region: snapshot area A or B, volume
/// table A or B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Area {
    A,
    B,
}

impl Area {
    /// The other copy.
    pub fn other(self) -> Area {
        match self {
            Area::A => Area::B,
            Area::B => Area::A,
        }
    }
}
