//! The engine (and a bare device) as an [`Export`], the front-end contract
//! both `serve` front ends (NBD, ublk) serve.

use std::io;
use std::sync::Arc;
use tiercache_engine::{DirectPlan, UncachedRead, VolumeHandle};
use tiercache_frontend::{
    BlockSizes, DirectMiss, DirectRead, Export, FileRange, MissOps, ReadPiece,
};

/// Serves one volume of the engine's pool (over NBD or ublk). Flush and
/// FUA reach the shared cache device and this volume's backing device, so
/// every connection sees them (multi-conn is safe).
pub struct VolumeExport {
    pub volume: VolumeHandle,
    pub rotational: bool,
}

/// The engine's miss served by the front end, as the front-end contract
/// has it.
struct Uncached<'a>(UncachedRead<'a>);

impl MissOps for Uncached<'_> {
    fn begin_fill(&mut self) -> bool {
        self.0.begin_fill()
    }
    fn finish(
        self: Box<Self>,
        read: io::Result<()>,
        fill: Option<io::Result<()>>,
        scratch: &[u8],
    ) -> io::Result<()> {
        self.0.finish(read, fill, scratch)
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.volume.size()
    }
    fn block_size_constraints(&self) -> BlockSizes {
        BlockSizes {
            min: 512,
            preferred: self.volume.block_size().max(4096),
            max: 32 << 20,
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        Ok(self.volume.read(offset, buf)?)
    }
    fn begin_direct_read(&self, offset: u64, len: u32) -> Option<DirectRead<'_>> {
        Some(
            match self.volume.begin_direct_read(offset, u64::from(len))? {
                DirectPlan::Hit(range) => {
                    let (fd, pieces) = (range.fd, range.pieces.clone());
                    DirectRead::new(fd, pieces, move |r| range.finish(r))
                }
                DirectPlan::Bypass(read) => {
                    let pieces = read
                        .pieces
                        .iter()
                        .map(|&(fd, at, into, len)| ReadPiece { fd, at, into, len })
                        .collect();
                    DirectRead::of_pieces(pieces, move |r| read.finish(r))
                }
            },
        )
    }
    fn begin_direct_miss(&self, offset: u64, len: u32) -> Option<DirectMiss<'_>> {
        let read = self.volume.begin_uncached_read(offset, u64::from(len))?;
        let range = |(fd, offset, len)| FileRange { fd, offset, len };
        Some(DirectMiss::new(
            range(read.source),
            read.data_at,
            read.fill.map(range),
            Uncached(read),
        ))
    }
    fn read_if_quick(&self, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
        self.volume
            .read_if_cached(offset, buf)
            .map(|r| r.map_err(io::Error::from))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        Ok(self.volume.write(offset, data, fua)?)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(self.volume.flush()?)
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        Ok(self.volume.trim(offset, len)?)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        Ok(self.volume.write_zeroes(offset, len, fua)?)
    }
    fn can_trim(&self) -> bool {
        true
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    fn is_rotational(&self) -> bool {
        self.rotational
    }
}

/// Serves a device directly, without a cache: the baselines of `bench`
/// ("fast device alone", "slow device alone") go through the same front
/// end as the cache.
pub struct DeviceExport {
    pub device: Arc<dyn tiercache_device::BlockDevice>,
    pub rotational: bool,
}

impl Export for DeviceExport {
    fn size(&self) -> u64 {
        self.device.size()
    }
    fn block_size_constraints(&self) -> BlockSizes {
        BlockSizes {
            min: 512,
            preferred: 4096,
            max: 32 << 20,
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        tiercache_device::check_range(&*self.device, offset, buf.len() as u64)?;
        self.device.read_at(buf, offset)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        tiercache_device::check_range(&*self.device, offset, data.len() as u64)?;
        self.device.write_at(data, offset)?;
        if fua {
            self.device.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.device.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        tiercache_device::check_range(&*self.device, offset, len)?;
        self.device.discard(offset, len)
    }
    fn can_trim(&self) -> bool {
        true
    }
    fn can_multi_conn(&self) -> bool {
        true
    }
    fn is_rotational(&self) -> bool {
        self.rotational
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use tiercache_engine::EngineError;

    /// The engine's errors reach both front ends through the one mapping:
    /// out of range is EINVAL (not ENOSPC), a full device ENOSPC, a failed
    /// device its own errno.
    #[test]
    fn engine_errors_map_to_the_right_errno() {
        let errno = |e: EngineError| tiercache_frontend::errno(&io::Error::from(e));
        assert_eq!(
            errno(EngineError::OutOfRange {
                offset: 1 << 30,
                len: 512,
                size: 1 << 20
            }),
            libc::EINVAL
        );
        assert_eq!(
            errno(EngineError::Misaligned { offset: 1, len: 1 }),
            libc::EINVAL
        );
        assert_eq!(
            errno(EngineError::Backing {
                device: "b".into(),
                source: io::Error::from_raw_os_error(libc::ENOSPC)
            }),
            libc::ENOSPC
        );
        assert_eq!(
            errno(EngineError::CacheDirty {
                device: "c".into(),
                source: io::Error::from_raw_os_error(libc::EIO)
            }),
            libc::EIO
        );
        assert_eq!(
            errno(EngineError::Backing {
                device: "b".into(),
                source: io::Error::other("no errno")
            }),
            libc::EIO
        );
    }
}
