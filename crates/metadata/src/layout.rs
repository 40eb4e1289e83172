//! Where each metadata region lies on the cache device.

use crate::error::{MetadataError, Result};
use crate::geometry::{
    valid_block_size, volume_blocks, Area, ENTRY_LEN, MAX_MAX_VOLUMES, META_BLOCK,
};
use tiercache_types::align_up;

/// Packed 16-byte entries per snapshot block: `(4096 - 64) / 16` = 252.
pub const SNAPSHOT_ENTRIES_PER_BLOCK: usize = (META_BLOCK - 64) / ENTRY_LEN;

/// Smallest journal: 1 MiB.
pub const MIN_DEFAULT_JOURNAL_BYTES: u64 = 1 << 20;

/// Fewest journal blocks a layout may have.
pub const MIN_JOURNAL_BLOCKS: u64 = 2;

/// The regions of the cache device. Block numbers are in 4 KiB metadata
/// blocks from the start of the device:
///
/// ```text
/// 0: sb copy 0 | 1: sb copy 1 | volume table A | volume table B | snapshot A | snapshot B | journal | pad | slots ...
///                                                                                                     ^ data_offset
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Records per volume-table copy (1 to 65535).
    pub max_volumes: u32,
    /// First block of volume-table copy A (always 2) and B.
    pub volumes_a: u64,
    pub volumes_b: u64,
    /// Blocks per volume-table copy: `ceil(max_volumes / 15)`.
    pub volume_blocks: u64,
    /// Cache block size in bytes.
    pub block_size: u32,
    /// Number of cache slots.
    pub capacity: u32,
    /// First block of snapshot area A and B.
    pub snapshot_a: u64,
    pub snapshot_b: u64,
    /// Blocks per snapshot area: `ceil(capacity / 252)`.
    pub snapshot_blocks: u64,
    /// First block of the circular journal and its length in blocks.
    pub journal_first: u64,
    pub journal_blocks: u64,
    /// Byte offset of cache slot 0: the end of the metadata rounded up to
    /// the block size.
    pub data_offset: u64,
}

/// Default journal size for `capacity` slots: twice the mapping size (16
/// bytes per slot), at least 1 MiB.
///
/// Why twice: a snapshot (16 bytes per slot) is written whenever half the
/// journal is used, so the snapshot's cost per journal block written is
/// `mapping_bytes / (journal_bytes / 2)` blocks; at twice the mapping size
/// that is one extra 4 KiB block per journal block. A journal of 1/64 of the
/// mapping would write 128 snapshot blocks per journal block.
pub fn default_journal_bytes(capacity: u64) -> u64 {
    (capacity * ENTRY_LEN as u64 * 2).max(MIN_DEFAULT_JOURNAL_BYTES)
}

impl Layout {
    /// Lays out a cache device of `cache_size` bytes with cache blocks of
    /// `block_size` bytes, a volume table of `max_volumes` records (1 to
    /// 65535) and a journal of `journal_bytes` (rounded up to 4 KiB, at
    /// least 2 blocks; `None` for [`default_journal_bytes`]). Capacity is
    /// every whole block that fits after the metadata, at most
    /// `u32::MAX - 1`.
    pub fn compute(
        cache_size: u64,
        block_size: u32,
        max_volumes: u32,
        journal_bytes: Option<u64>,
    ) -> Result<Layout> {
        if !(1..=MAX_MAX_VOLUMES).contains(&max_volumes) {
            return Err(MetadataError::InvalidArgument(format!(
                "max_volumes {max_volumes} must be from 1 to {MAX_MAX_VOLUMES}"
            )));
        }
        if !valid_block_size(block_size) {
            return Err(MetadataError::InvalidArgument(format!(
                "block size {block_size} is not a power of two from 4 KiB to 1 MiB"
            )));
        }
        let bs = u64::from(block_size);
        let mut cap = (cache_size / bs).min(u64::from(u32::MAX) - 1);
        // Shrink until the metadata for `cap` slots leaves room for them,
        // then grow while one more slot still fits (the metadata shrank).
        loop {
            let l = Self::for_capacity(cap, block_size, max_volumes, journal_bytes);
            let fits = cache_size.saturating_sub(l.data_offset) / bs;
            if fits >= cap || cap == 0 {
                break;
            }
            cap = fits;
        }
        while cap > 0
            && cap < u64::from(u32::MAX) - 1
            && Self::for_capacity(cap + 1, block_size, max_volumes, journal_bytes)
                .required_device_size()
                <= cache_size
        {
            cap += 1;
        }
        let layout = Self::for_capacity(cap, block_size, max_volumes, journal_bytes);
        if layout.capacity == 0 {
            return Err(MetadataError::InvalidArgument(format!(
                "a cache device of {cache_size} bytes is too small: the metadata alone \
                 needs {} bytes and no {block_size}-byte cache block would fit",
                Self::for_capacity(1, block_size, max_volumes, journal_bytes).data_offset
            )));
        }
        Ok(layout)
    }

    fn for_capacity(
        cap: u64,
        block_size: u32,
        max_volumes: u32,
        journal_bytes: Option<u64>,
    ) -> Layout {
        let vblocks = volume_blocks(max_volumes);
        let snapshot_blocks = cap.div_ceil(SNAPSHOT_ENTRIES_PER_BLOCK as u64).max(1);
        let jbytes = journal_bytes.unwrap_or_else(|| default_journal_bytes(cap));
        let journal_blocks = jbytes.div_ceil(META_BLOCK as u64).max(MIN_JOURNAL_BLOCKS);
        let volumes_a = 2;
        let volumes_b = volumes_a + vblocks;
        let snapshot_a = volumes_b + vblocks;
        let snapshot_b = snapshot_a + snapshot_blocks;
        let journal_first = snapshot_b + snapshot_blocks;
        let meta_end = (journal_first + journal_blocks) * META_BLOCK as u64;
        Layout {
            max_volumes,
            volumes_a,
            volumes_b,
            volume_blocks: vblocks,
            block_size,
            capacity: cap as u32,
            snapshot_a,
            snapshot_b,
            snapshot_blocks,
            journal_first,
            journal_blocks,
            data_offset: align_up(meta_end, u64::from(block_size)),
        }
    }

    /// First block of `area`.
    pub fn area_start(&self, area: Area) -> u64 {
        match area {
            Area::A => self.snapshot_a,
            Area::B => self.snapshot_b,
        }
    }

    /// First block of volume-table copy `copy`.
    pub fn volumes_start(&self, copy: Area) -> u64 {
        match copy {
            Area::A => self.volumes_a,
            Area::B => self.volumes_b,
        }
    }

    /// Device block holding journal sequence `seq`.
    pub fn journal_block_of(&self, seq: u64) -> u64 {
        self.journal_first + seq % self.journal_blocks
    }

    /// Bytes the metadata occupies (up to `data_offset`).
    pub fn metadata_bytes(&self) -> u64 {
        self.data_offset
    }

    /// Smallest cache device this layout fits on.
    pub fn required_device_size(&self) -> u64 {
        self.data_offset + u64::from(self.capacity) * u64::from(self.block_size)
    }

    /// Checks the invariants every layout written by [`Layout::compute`]
    /// has; a superblock whose layout fails this is corrupt.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if !valid_block_size(self.block_size) {
            return Err(format!("block size {} not supported", self.block_size));
        }
        if self.capacity == 0 || self.capacity == u32::MAX {
            return Err(format!("capacity {} out of range", self.capacity));
        }
        let want = u64::from(self.capacity).div_ceil(SNAPSHOT_ENTRIES_PER_BLOCK as u64);
        if self.snapshot_blocks != want {
            return Err(format!(
                "snapshot areas of {} blocks, but {} slots need {want}",
                self.snapshot_blocks, self.capacity
            ));
        }
        if !(1..=MAX_MAX_VOLUMES).contains(&self.max_volumes)
            || self.volume_blocks != volume_blocks(self.max_volumes)
        {
            return Err(format!(
                "volume table of {} blocks for {} volumes",
                self.volume_blocks, self.max_volumes
            ));
        }
        if self.volumes_a != 2
            || self.volumes_b != self.volumes_a + self.volume_blocks
            || self.snapshot_a != self.volumes_b + self.volume_blocks
            || Some(self.snapshot_b) != self.snapshot_a.checked_add(self.snapshot_blocks)
            || Some(self.journal_first) != self.snapshot_b.checked_add(self.snapshot_blocks)
        {
            return Err(
                "volume tables, snapshot areas and journal are not laid out back to back".into(),
            );
        }
        if self.journal_blocks < MIN_JOURNAL_BLOCKS || self.journal_blocks > 1 << 40 {
            return Err(format!("journal of {} blocks", self.journal_blocks));
        }
        let meta_end = (self.journal_first + self.journal_blocks) * META_BLOCK as u64;
        if self.data_offset != align_up(meta_end, u64::from(self.block_size)) {
            return Err(format!(
                "data offset {} does not follow the metadata end {meta_end}",
                self.data_offset
            ));
        }
        if self
            .data_offset
            .checked_add(u64::from(self.capacity) * u64::from(self.block_size))
            .is_none()
        {
            return Err("layout overflows 64 bits".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_fills_the_device() {
        for (size, bs, v, j) in [
            (64u64 << 20, 4096u32, 1024, None),
            (4 << 30, 4096, 65535, None),
            (4 << 30, 65536, 1, Some(3 << 20)),
            (10 << 20, 4096, 15, Some(8192)),
            ((1 << 20) + 3 * 4096, 4096, 16, Some(4096)),
        ] {
            let l = Layout::compute(size, bs, v, j).unwrap();
            l.validate().unwrap();
            assert_eq!(l.volume_blocks, u64::from(v).div_ceil(15));
            assert_eq!(l.snapshot_a, 2 + 2 * l.volume_blocks);
            assert!(l.required_device_size() <= size, "{l:?}");
            // One more block would not fit (or the metadata would grow).
            let bigger = Layout::for_capacity(u64::from(l.capacity) + 1, bs, v, j);
            assert!(bigger.required_device_size() > size, "{l:?}");
            assert_eq!(l.data_offset % u64::from(bs), 0);
        }
    }

    #[test]
    fn default_journal_is_twice_the_mapping() {
        let l = Layout::compute(4 << 30, 4096, 1024, None).unwrap();
        assert_eq!(
            l.journal_blocks,
            (u64::from(l.capacity) * 32).div_ceil(4096)
        );
        let small = Layout::compute(8 << 20, 4096, 1024, None).unwrap();
        assert_eq!(small.journal_blocks, 256);
    }

    #[test]
    fn too_small_and_bad_block_size_are_refused() {
        assert!(Layout::compute(64 << 10, 4096, 1, None).is_err());
        assert!(Layout::compute(1 << 30, 3000, 1, None).is_err());
        assert!(Layout::compute(1 << 30, 2 << 20, 1, None).is_err());
        assert!(Layout::compute(1 << 30, 4096, 0, None).is_err());
        assert!(Layout::compute(1 << 30, 4096, 65536, None).is_err());
        // Every other layout is corruption.
        let l = Layout::compute(64 << 20, 4096, 100, None).unwrap();
        for bad in [
            Layout { volumes_a: 3, ..l },
            Layout {
                volume_blocks: 8,
                ..l
            },
            Layout {
                max_volumes: 0,
                volume_blocks: 0,
                ..l
            },
            Layout {
                snapshot_a: l.snapshot_a + 1,
                ..l
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
