//! A recovery killed part-way. A writeback engine is crashed with dirty and
//! clean blocks; the next open runs on devices that stop taking writes and
//! flushes after the open's n-th one, as if its process were killed there;
//! the devices then lose their unflushed writes (a seeded random part of
//! them kept, per sector), and a third open must recover: for every n, every
//! sector reads back its last flushed write or a later one, nothing that was
//! never written, and the cache then drains and restarts clean.

use rand::{Rng, SeedableRng};
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, CountingDevice, CrashDevice};
use tiercache_engine::{Engine, EngineConfig, OpenOptions};
use tiercache_types::{CacheMode, ManualClock, Time};

const SECTOR: u64 = 512;
const BACKING_SECTORS: u64 = 1024;
const CACHE_BYTES: u64 = 64 * 4096 + (2 << 20);

fn tag(sector: u64, seq: u64) -> Vec<u8> {
    let mut out = vec![0u8; SECTOR as usize];
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (sector ^ seq.wrapping_mul(131) ^ i as u64) as u8;
    }
    out
}

/// The seq a sector holds (0 for never written), or None for garbage.
fn decode(sector: u64, data: &[u8]) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
    (data == &tag(sector, seq)[..]).then_some(seq)
}

/// Per sector: the seq durable for sure and every seq written since.
#[derive(Clone, Default)]
struct SectorModel {
    flushed: u64,
    since: Vec<u64>,
}

/// Passes calls on until `writes_left` writes, flushes and discards have
/// been done; every later one fails, as nothing reaches a device from a
/// killed process.
struct Dying {
    inner: Arc<CrashDevice>,
    writes_left: Arc<AtomicI64>,
}

impl Dying {
    fn alive(&self) -> io::Result<()> {
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) > 0 {
            Ok(())
        } else {
            Err(io::Error::other("killed"))
        }
    }
}

impl BlockDevice for Dying {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.alive()?;
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.alive()?;
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.alive()?;
        self.inner.discard(offset, len)
    }
    fn describe(&self) -> String {
        format!("dying({})", self.inner.describe())
    }
}

fn open(
    backing: Arc<dyn BlockDevice>,
    cache: Arc<dyn BlockDevice>,
) -> tiercache_engine::Result<Engine> {
    let clock = Arc::new(ManualClock::new(Time(1)));
    Engine::open(backing, cache, &OpenOptions::default(), clock, "backing").map(|(e, _)| e)
}

/// The devices after a crashed writeback run, and what each sector may hold.
fn crashed_run() -> (Vec<u8>, Vec<u8>, Vec<SectorModel>) {
    let backing = Arc::new(CrashDevice::new(BACKING_SECTORS * SECTOR));
    let cache = Arc::new(CrashDevice::new(CACHE_BYTES));
    let cfg = EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: 4096,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    };
    let clock = Arc::new(ManualClock::new(Time(1)));
    let engine = Engine::create(
        backing.clone(),
        cache.clone(),
        &cfg,
        clock.clone(),
        "backing",
        Some(1 << 20),
    )
    .unwrap();
    let mut model = vec![SectorModel::default(); BACKING_SECTORS as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for seq in 1..=600u64 {
        clock.advance(1_000_000);
        let sectors = rng.gen_range(1..=16u64);
        let first = rng.gen_range(0..BACKING_SECTORS - sectors);
        let buf: Vec<u8> = (first..first + sectors).flat_map(|s| tag(s, seq)).collect();
        let fua = rng.gen_bool(0.05);
        engine.write(first * SECTOR, &buf, fua).unwrap();
        for s in first..first + sectors {
            let m = &mut model[s as usize];
            if fua {
                *m = SectorModel {
                    flushed: seq,
                    since: Vec::new(),
                };
            } else {
                m.since.push(seq);
            }
        }
        if seq % 50 == 0 {
            engine.flush().unwrap();
            for m in &mut model {
                if let Some(&last) = m.since.last() {
                    m.flushed = last;
                }
                m.since.clear();
            }
        }
        if seq % 97 == 0 {
            engine.clean(4).unwrap();
        }
    }
    assert!(
        engine.dirty_blocks() > 0,
        "the crash must leave dirty blocks"
    );
    drop(engine);
    cache.crash_keep_random(1);
    backing.crash_keep_random(2);
    (backing.durable_image(), cache.durable_image(), model)
}

fn check(engine: &Engine, model: &[SectorModel], what: &str) {
    let mut all = vec![0u8; (BACKING_SECTORS * SECTOR) as usize];
    engine.read(0, &mut all).unwrap();
    for s in 0..BACKING_SECTORS {
        let data = &all[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
        let got = decode(s, data).unwrap_or_else(|| panic!("{what}: sector {s}: garbage"));
        let m = &model[s as usize];
        assert!(
            got == m.flushed || m.since.contains(&got),
            "{what}: sector {s} holds seq {got}; flushed {} then {:?}",
            m.flushed,
            m.since
        );
    }
}

#[test]
fn a_recovery_killed_at_any_write_is_recovered_from() {
    let (backing_image, cache_image, model) = crashed_run();

    // How many writes, flushes and discards a whole recovery does.
    let counted_cache = Arc::new(CountingDevice::new(CrashDevice::from_image(
        cache_image.clone(),
    )));
    let counted_backing = Arc::new(CountingDevice::new(CrashDevice::from_image(
        backing_image.clone(),
    )));
    let engine = open(counted_backing.clone(), counted_cache.clone()).expect("first recovery");
    check(&engine, &model, "an uninterrupted recovery");
    drop(engine);
    let ops = |c: tiercache_device::IoCounts| c.writes + c.flushes + c.discards;
    let total = ops(counted_cache.snapshot()) + ops(counted_backing.snapshot());
    assert!(total > 2, "a recovery writes its metadata ({total} ops)");

    let mut interrupted = 0;
    for n in 0..=total {
        let cache = Arc::new(CrashDevice::from_image(cache_image.clone()));
        let backing = Arc::new(CrashDevice::from_image(backing_image.clone()));
        let writes_left = Arc::new(AtomicI64::new(n as i64));
        let dying = |d: &Arc<CrashDevice>| -> Arc<dyn BlockDevice> {
            Arc::new(Dying {
                inner: d.clone(),
                writes_left: writes_left.clone(),
            })
        };
        // Killed after n of its writes: whether this open returned an error
        // or an engine, nothing more reaches the devices.
        let killed = open(dying(&backing), dying(&cache));
        interrupted += usize::from(killed.is_err());
        drop(killed);
        cache.crash_keep_random(n);
        backing.crash_keep_random(n ^ 0xABCD);
        let what = format!("recovery killed after {n} of {total} writes");
        let engine = open(backing.clone(), cache.clone())
            .unwrap_or_else(|e| panic!("{what}: the next open failed: {e}"));
        check(&engine, &model, &what);
        engine.drain(|_, _| {}).unwrap();
        check(&engine, &model, &format!("{what}, drained"));
        assert_eq!(engine.dirty_blocks(), 0, "{what}");
        engine.shutdown(false).unwrap();
        let engine = open(backing.clone(), cache.clone()).unwrap();
        check(&engine, &model, &format!("{what}, restarted clean"));
    }
    eprintln!("a recovery does {total} writes, flushes and discards; {interrupted} opens killed part-way failed");
    assert!(interrupted > 0, "no open was interrupted");
}
