//! A backing volume of the pool: its device, its size, where a client IO
//! on it falls (the byte ranges of its blocks, the part of each block an
//! IO covers) and its own counters. The cache device, the mapping and the
//! policy are the engine's, shared by every volume; a volume's blocks are
//! told apart from every other volume's by their pool keys
//! ([`OriginBlock::of`]), never by their numbers alone.

use crate::backing_flush::FlushTracked;
use crate::stats::IoCounters;
use crate::{EngineError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_policy::IoRequest;
use tiercache_types::{Access, OriginBlock, VolumeId, MAX_VOLUME_BLOCKS, SECTOR_SIZE};

/// One backing volume attached to the engine.
pub(crate) struct Volume {
    pub(crate) id: VolumeId,
    pub(crate) name: String,
    /// Where the backing device was opened from (a hint, for messages and
    /// the volume's record).
    pub(crate) path: String,
    /// The backing device; every write and discard goes through it, so it
    /// knows when a flush has nothing to make durable.
    pub(crate) backing: Arc<FlushTracked>,
    /// Size of the exported device in bytes (the backing device's size).
    pub(crate) size: u64,
    block_size: u64,
    /// Client IO on this volume: bytes, hits, backing errors, writeback.
    pub(crate) io: IoCounters,
    /// Set, with every stripe locked, when the volume leaves the pool: IO
    /// through a handle still held then fails (see [`Volume::check_attached`]).
    pub(crate) detached: AtomicBool,
}

impl Volume {
    /// A volume over `backing`, refused when its size is not a multiple of
    /// 512 bytes or it has more blocks than a pool key can address.
    pub(crate) fn new(
        id: VolumeId,
        name: &str,
        path: &str,
        backing: Arc<dyn BlockDevice>,
        block_size: u32,
    ) -> Result<Volume> {
        let size = backing.size();
        if size % SECTOR_SIZE != 0 {
            return Err(EngineError::Config(format!(
                "backing device {} is {size} bytes, not a multiple of 512",
                backing.describe(),
            )));
        }
        let block_size = block_size as u64;
        if size.div_ceil(block_size) > MAX_VOLUME_BLOCKS {
            return Err(EngineError::Config(format!(
                "backing device {} has more than 2^48 blocks of {block_size} bytes",
                backing.describe(),
            )));
        }
        Ok(Volume {
            id,
            name: name.to_string(),
            path: path.to_string(),
            backing: Arc::new(FlushTracked::new(backing)),
            size,
            block_size,
            io: IoCounters::default(),
            detached: AtomicBool::new(false),
        })
    }

    /// The pool key of this volume's block `b`.
    pub(crate) fn key(&self, b: u64) -> OriginBlock {
        OriginBlock::of(self.id, b)
    }

    /// The pool keys of this volume's blocks `blocks`, as a range (what the
    /// stripe locks and zombie checks take: keys, so that two volumes'
    /// blocks with one number are different locks).
    pub(crate) fn keys(&self, blocks: std::ops::Range<u64>) -> std::ops::Range<u64> {
        self.key(blocks.start).0..self.key(blocks.end).0
    }

    /// Refuses an IO that is not sector-aligned or not inside the volume.
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

    /// An IO of this volume as the director plans it.
    pub(crate) fn request(&self, offset: u64, len: u64, access: Access) -> IoRequest {
        IoRequest {
            volume: self.id,
            offset,
            len,
            access,
            volume_size: self.size,
        }
    }

    /// Refuses IO on a detached volume. Call with the IO's stripes locked:
    /// the detach sets the flag holding every stripe, so an IO that passed
    /// this check finishes before the volume's blocks are dropped.
    pub(crate) fn check_attached(&self) -> Result<()> {
        if self.detached.load(Ordering::Acquire) {
            return Err(EngineError::Detached {
                volume: self.name.clone(),
            });
        }
        Ok(())
    }

    /// The volume's blocks an IO of `len` bytes at `offset` touches.
    pub(crate) fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        offset / self.block_size..(offset + len).div_ceil(self.block_size)
    }

    /// Byte range of block `b` on the backing device (the last block may be
    /// short).
    pub(crate) fn block_span(&self, b: u64) -> (u64, u64) {
        let start = b * self.block_size;
        (start, (start + self.block_size).min(self.size))
    }

    /// The part of block `b` that the IO [offset, offset+len) covers, as
    /// (device offset, offset into the IO buffer, length).
    pub(crate) fn piece(&self, b: u64, offset: u64, len: u64) -> (u64, usize, usize) {
        let (bstart, bend) = self.block_span(b);
        let start = bstart.max(offset);
        let end = bend.min(offset + len);
        (start, (start - offset) as usize, (end - start) as usize)
    }

    /// Counts a backing device error and names the device.
    pub(crate) fn backing_err(&self, e: std::io::Error, write: bool) -> EngineError {
        let c = if write {
            &self.io.backing_write_errors
        } else {
            &self.io.backing_read_errors
        };
        IoCounters::add(c, 1);
        EngineError::Backing {
            device: self.backing.describe(),
            source: e,
        }
    }
}
