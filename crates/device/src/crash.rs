//! Crash simulation: an in-memory device that can lose its unflushed writes.
//!
//! The device keeps the durable image (what survived the last `flush`) and,
//! per 512-byte sector, the versions written since. Reads see the newest
//! version. [`CrashDevice::crash`] forgets the unflushed versions, as a power
//! cut with a volatile write cache would; [`CrashDevice::crash_keep_random`]
//! instead keeps a seeded random choice per sector (the old content or any of
//! the versions written since), modelling a disk that persisted some writes
//! out of order and tore others at sector boundaries.

use crate::{check_range, BlockDevice};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io;

const SECTOR: u64 = 512;

/// At most this many unflushed versions are kept per sector; older ones are
/// forgotten (a crash then cannot bring them back, which is still a state a
/// real disk could be left in).
const MAX_VERSIONS: usize = 8;

type Sector = Box<[u8; SECTOR as usize]>;

struct State {
    durable: Vec<u8>,
    /// Sector index -> versions written since the last flush, oldest first
    /// (never empty).
    pending: BTreeMap<u64, Vec<Sector>>,
}

/// What a crash did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Sectors that had unflushed writes.
    pub unflushed_sectors: u64,
    /// Of those, sectors that kept one of their unflushed versions.
    pub kept_sectors: u64,
}

/// An in-memory device whose unflushed writes a test can throw away.
///
/// Discards behave as writes of zeros (and so are volatile until a flush too).
/// After a crash the device reads as its new durable state and keeps working.
pub struct CrashDevice {
    size: u64,
    state: Mutex<State>,
}

impl CrashDevice {
    /// A zero-filled device of `size` bytes; panics unless `size` is a
    /// multiple of 512.
    pub fn new(size: u64) -> Self {
        assert!(
            size % SECTOR == 0,
            "CrashDevice size must be a multiple of 512"
        );
        CrashDevice::from_image(vec![0u8; size as usize])
    }

    /// A device whose durable content is `image`; panics unless its length
    /// is a multiple of 512.
    pub fn from_image(image: Vec<u8>) -> Self {
        assert!(
            image.len() as u64 % SECTOR == 0,
            "CrashDevice size must be a multiple of 512"
        );
        CrashDevice {
            size: image.len() as u64,
            state: Mutex::new(State {
                durable: image,
                pending: BTreeMap::new(),
            }),
        }
    }

    /// A copy of the durable image: what a crash that keeps nothing would
    /// leave.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// Number of sectors with writes not yet made durable.
    pub fn unflushed_sectors(&self) -> u64 {
        self.state.lock().pending.len() as u64
    }

    /// Simulates a power cut that loses every unflushed write.
    pub fn crash(&self) -> CrashReport {
        let mut st = self.state.lock();
        let report = CrashReport {
            unflushed_sectors: st.pending.len() as u64,
            kept_sectors: 0,
        };
        st.pending.clear();
        report
    }

    /// Simulates a power cut after which each sector with unflushed writes
    /// holds, chosen uniformly with an RNG seeded by `seed`, either its
    /// durable content or one of the (last 8) versions written to it since
    /// the last flush.
    pub fn crash_keep_random(&self, seed: u64) -> CrashReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut st = self.state.lock();
        let State { durable, pending } = &mut *st;
        let mut report = CrashReport {
            unflushed_sectors: pending.len() as u64,
            kept_sectors: 0,
        };
        for (sector, versions) in std::mem::take(pending) {
            let pick = rng.gen_range(0..=versions.len());
            if pick > 0 {
                let at = (sector * SECTOR) as usize;
                durable[at..at + SECTOR as usize].copy_from_slice(&versions[pick - 1][..]);
                report.kept_sectors += 1;
            }
        }
        report
    }

    fn write_sectors(&self, offset: u64, len: u64, mut fill: impl FnMut(usize, &mut [u8])) {
        let mut st = self.state.lock();
        let first = offset / SECTOR;
        for i in 0..len / SECTOR {
            let mut s: Sector = Box::new([0u8; SECTOR as usize]);
            fill((i * SECTOR) as usize, &mut s[..]);
            let v = st.pending.entry(first + i).or_default();
            if v.len() == MAX_VERSIONS {
                v.remove(0);
            }
            v.push(s);
        }
    }
}

impl BlockDevice for CrashDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        let st = self.state.lock();
        let start = offset as usize;
        buf.copy_from_slice(&st.durable[start..start + buf.len()]);
        let first = offset / SECTOR;
        let end = (offset + buf.len() as u64) / SECTOR;
        for (&sector, versions) in st.pending.range(first..end) {
            let at = ((sector - first) * SECTOR) as usize;
            let newest = versions.last().expect("pending versions are never empty");
            buf[at..at + SECTOR as usize].copy_from_slice(&newest[..]);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.write_sectors(offset, buf.len() as u64, |at, s| {
            s.copy_from_slice(&buf[at..at + SECTOR as usize])
        });
        Ok(())
    }

    /// Makes every write so far durable.
    fn flush(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        let State { durable, pending } = &mut *st;
        for (sector, versions) in std::mem::take(pending) {
            let at = (sector * SECTOR) as usize;
            let newest = versions.last().expect("pending versions are never empty");
            durable[at..at + SECTOR as usize].copy_from_slice(&newest[..]);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, offset, len)?;
        self.write_sectors(offset, len, |_, s| s.fill(0));
        Ok(())
    }

    fn describe(&self) -> String {
        format!("crash-memory:{}B", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(d: &CrashDevice, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        d.read_at(&mut b, off).unwrap();
        b
    }

    #[test]
    fn crash_drops_unflushed_writes_only() {
        let d = CrashDevice::new(8192);
        d.write_at(&[1u8; 1024], 0).unwrap();
        d.flush().unwrap();
        d.write_at(&[2u8; 1024], 512).unwrap();
        assert_eq!(
            read(&d, 0, 1536),
            [[1u8; 512], [2u8; 512], [2u8; 512]].concat()
        );
        assert_eq!(d.unflushed_sectors(), 2);
        let r = d.crash();
        assert_eq!(
            r,
            CrashReport {
                unflushed_sectors: 2,
                kept_sectors: 0
            }
        );
        assert_eq!(
            read(&d, 0, 1536),
            [vec![1u8; 1024], vec![0u8; 512]].concat()
        );
        // Still works after the crash.
        d.write_at(&[3u8; 512], 4096).unwrap();
        d.flush().unwrap();
        d.crash();
        assert_eq!(read(&d, 4096, 512), vec![3u8; 512]);
    }

    #[test]
    fn discard_is_volatile_until_flush() {
        let d = CrashDevice::new(4096);
        d.write_at(&[9u8; 4096], 0).unwrap();
        d.flush().unwrap();
        d.discard(0, 2048).unwrap();
        assert_eq!(read(&d, 0, 2048), vec![0u8; 2048]);
        d.crash();
        assert_eq!(read(&d, 0, 4096), vec![9u8; 4096]);
        d.discard(0, 2048).unwrap();
        d.flush().unwrap();
        d.crash();
        assert_eq!(
            read(&d, 0, 4096),
            [vec![0u8; 2048], vec![9u8; 2048]].concat()
        );
    }

    #[test]
    fn keep_random_keeps_only_written_versions() {
        let d = CrashDevice::new(64 * 512);
        for v in 1..=3u8 {
            d.write_at(&vec![v; 64 * 512], 0).unwrap();
        }
        let r = d.crash_keep_random(7);
        assert_eq!(r.unflushed_sectors, 64);
        // With 64 sectors and 4 choices each, some keep and some drop.
        assert!(r.kept_sectors > 0 && r.kept_sectors < 64, "{r:?}");
        let img = read(&d, 0, 64 * 512);
        let mut kept = 0;
        for s in img.chunks(512) {
            assert!(s.iter().all(|&b| b == s[0]), "torn inside a sector");
            assert!(s[0] <= 3);
            kept += (s[0] != 0) as u64;
        }
        assert_eq!(kept, r.kept_sectors);
        assert_eq!(d.unflushed_sectors(), 0);
        // Same seed, same outcome.
        let d2 = CrashDevice::new(64 * 512);
        for v in 1..=3u8 {
            d2.write_at(&vec![v; 64 * 512], 0).unwrap();
        }
        d2.crash_keep_random(7);
        assert_eq!(read(&d2, 0, 64 * 512), img);
    }

    #[test]
    fn rejects_bad_ranges() {
        let d = CrashDevice::new(4096);
        assert!(d.write_at(&[0u8; 512], 4096).is_err());
        assert!(d.write_at(&[0u8; 100], 0).is_err());
        assert!(d.discard(512, 4096).is_err());
        assert_eq!(d.unflushed_sectors(), 0);
    }
}
