//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, CrashDevice, MemDevice};
use tiercache_metadata::{
    BackingIdentity, Entry, FormatParams, Mapping, MetadataStore, NewVolume, Recovered, VolumeId,
};
use tiercache_types::CacheMode;

pub const BS: u32 = 4096;
/// Backing device: 2000 blocks.
pub const BACKING_BLOCKS: u64 = 2000;

pub fn backing() -> BackingIdentity {
    BackingIdentity {
        size: BACKING_BLOCKS * u64::from(BS),
        path_hint: "/dev/test-backing".into(),
        fingerprint: Some(0x1234_5678),
    }
}

/// Volume-table records of the test caches: 2 blocks per copy.
pub const MAX_VOLUMES: u32 = 30;

/// The one volume of the test caches (volume 0).
pub fn volume() -> NewVolume {
    NewVolume {
        name: "test".into(),
        identity: backing(),
        mode: None,
        sequential_cutoff: None,
    }
}

pub fn params(journal_blocks: u64) -> FormatParams {
    FormatParams {
        block_size: BS,
        mode: CacheMode::WriteBack,
        policy: "smq".into(),
        journal_bytes: Some(journal_blocks * 4096),
        max_volumes: Some(MAX_VOLUMES),
        volumes: vec![volume()],
    }
}

/// `backing` as volume 0's identity at a clean shutdown.
pub fn vol0(backing: BackingIdentity) -> Vec<(VolumeId, BackingIdentity)> {
    vec![(VolumeId(0), backing)]
}

/// Opens `dev` checking `expected` against volume 0, as a pool-of-one
/// user does.
pub fn open_checked(
    dev: Arc<dyn BlockDevice>,
    expected: &BackingIdentity,
) -> tiercache_metadata::Result<(MetadataStore, Recovered)> {
    MetadataStore::open_with(dev, &vol0(expected.clone()))
}

/// Size of a cache device with `slots` slots and the given journal.
pub fn device_size(slots: u64, journal_blocks: u64) -> u64 {
    let snap = slots.div_ceil(252);
    let vol = u64::from(MAX_VOLUMES).div_ceil(15);
    (2 + 2 * vol + 2 * snap + journal_blocks) * 4096 + slots * u64::from(BS)
}

pub fn mem(slots: u64, journal_blocks: u64) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(device_size(slots, journal_blocks)))
}

pub fn entry(oblock: u64, dirty: bool, hint: u8) -> Option<Entry> {
    Some(Entry {
        volume: VolumeId(0),
        oblock,
        dirty,
        hint,
        crc: None,
    })
}

/// A clean entry carrying a content crc.
pub fn clean_with_crc(oblock: u64, crc: u32) -> Option<Entry> {
    Some(Entry {
        volume: VolumeId(0),
        oblock,
        dirty: false,
        hint: 0,
        crc: Some(crc),
    })
}

/// A device that works for `budget` more writes and flushes, then fails
/// every write and flush (a power cut in the middle of an operation).
///
/// It also remembers the writes issued since the last flush, so a test can
/// crash keeping a random subset of whole 4 KiB blocks
/// ([`FailAfter::crash_keep_blocks`]): writes that reached the media whole
/// but out of order.
pub struct FailAfter {
    pub inner: Arc<CrashDevice>,
    budget: AtomicI64,
    unflushed: parking_lot::Mutex<Vec<(u64, Vec<u8>)>>,
}

impl FailAfter {
    pub fn new(inner: Arc<CrashDevice>, budget: i64) -> Self {
        FailAfter {
            inner,
            budget: AtomicI64::new(budget),
            unflushed: parking_lot::Mutex::new(Vec::new()),
        }
    }
    /// Power cut keeping each unflushed 4 KiB block written since the last
    /// flush with probability 1/2 (in issue order), whole.
    pub fn crash_keep_blocks(&self, seed: u64) -> u64 {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let writes = std::mem::take(&mut *self.unflushed.lock());
        self.inner.crash();
        let mut kept = 0;
        for (off, data) in writes {
            for (i, b) in data.chunks(4096).enumerate() {
                if rng.gen_bool(0.5) {
                    self.inner.write_at(b, off + 4096 * i as u64).unwrap();
                    kept += 1;
                }
            }
        }
        self.inner.flush().unwrap();
        kept
    }

    pub fn set_budget(&self, budget: i64) {
        self.budget.store(budget, Ordering::SeqCst);
    }
    fn spend(&self) -> io::Result<()> {
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            Err(io::Error::other("simulated power cut"))
        } else {
            Ok(())
        }
    }
}

impl BlockDevice for FailAfter {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.spend()?;
        self.inner.write_at(buf, offset)?;
        self.unflushed.lock().push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.spend()?;
        self.inner.flush()?;
        self.unflushed.lock().clear();
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.spend()?;
        self.inner.discard(offset, len)
    }
    fn describe(&self) -> String {
        format!("fail-after({})", self.inner.describe())
    }
}

/// Applies `slot := e` to a mapping, as a commit would.
pub fn apply(map: &mut Mapping, slot: u32, e: Option<Entry>) {
    map[slot as usize] = e;
}
