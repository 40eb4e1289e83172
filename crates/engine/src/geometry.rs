//! Where a client IO falls: the byte ranges of origin blocks on the
//! backing device, the part of each block an IO covers, and where a cache
//! slot lies on the cache device. Pure arithmetic over the device sizes.

use crate::{Engine, EngineError, Result};
use tiercache_types::{CacheBlock, SECTOR_SIZE};

impl Engine {
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset % SECTOR_SIZE != 0 || len % SECTOR_SIZE != 0 {
            return Err(EngineError::Misaligned { offset, len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(EngineError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    pub(crate) fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.block_size..(offset + len).div_ceil(self.block_size)
    }

    /// Byte range of origin block `b` on the backing device (the last block
    /// may be short).
    pub(crate) fn block_span(&self, b: u64) -> (u64, u64) {
        let start = b * self.block_size;
        (start, (start + self.block_size).min(self.size))
    }

    pub(crate) fn slot_offset(&self, c: CacheBlock) -> u64 {
        self.data_offset + c.0 as u64 * self.block_size
    }

    /// The part of block `b` that the IO [offset, offset+len) covers, as
    /// (device offset, offset into the IO buffer, length).
    pub(crate) fn piece(&self, b: u64, offset: u64, len: u64) -> (u64, usize, usize) {
        let (bstart, bend) = self.block_span(b);
        let start = bstart.max(offset);
        let end = bend.min(offset + len);
        (start, (start - offset) as usize, (end - start) as usize)
    }
}
