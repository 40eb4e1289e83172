//! Metadata benchmarks.
//!
//! 1. Write amplification: metadata bytes written per slot update, for a
//!    1M-slot cache (4 GiB of 4 KiB blocks), when each commit covers 1, 8
//!    or 64 random slot updates; with the default journal (2x the mapping)
//!    and with a journal of 1/64 of the mapping (at least 1 MiB).
//! 2. Recovery: `open` time for the same cache after a crash with a full
//!    journal (one block short of the snapshot threshold), on memory and on
//!    a sparse file in /var/tmp (O_DIRECT where the filesystem allows).
//!
//! Run: `cargo bench -p tiercache-metadata --bench metadata`. Set
//! `METADATA_BENCH_SLOTS` for another cache size, `METADATA_BENCH_DIR` for
//! another file directory.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tiercache_device::{BlockDevice, CountingDevice, FileDevice, MemDevice};
use tiercache_metadata::codec::{ENTRY_LEN, JOURNAL_RECORDS_PER_BLOCK};
use tiercache_metadata::{
    default_journal_bytes, BackingIdentity, Entry, FormatParams, Layout, MetadataStore, NewVolume,
    VolumeId, DEFAULT_MAX_VOLUMES,
};
use tiercache_types::CacheMode;

const BS: u32 = 4096;

/// A device of `size` bytes of which only the first `meta` bytes (the
/// metadata) are stored; the cache-slot region reads as zeros and ignores
/// writes. Lets a 4 GiB cache be benchmarked in RAM.
struct MetaOnly {
    inner: MemDevice,
    size: u64,
}

impl BlockDevice for MetaOnly {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        tiercache_device::check_range(self, offset, buf.len() as u64)?;
        let meta = self.inner.size();
        if offset >= meta {
            buf.fill(0);
            return Ok(());
        }
        let n = ((meta - offset) as usize).min(buf.len());
        self.inner.read_at(&mut buf[..n], offset)?;
        buf[n..].fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        tiercache_device::check_range(self, offset, buf.len() as u64)?;
        let meta = self.inner.size();
        if offset >= meta {
            return Ok(());
        }
        let n = ((meta - offset) as usize).min(buf.len());
        self.inner.write_at(&buf[..n], offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        format!("meta-only-memory:{}B", self.size)
    }
}

fn backing(slots: u64) -> BackingIdentity {
    BackingIdentity {
        size: slots * 16 * u64::from(BS),
        path_hint: "/dev/bench".into(),
        fingerprint: None,
    }
}

fn params(slots: u64, journal_bytes: Option<u64>) -> FormatParams {
    FormatParams {
        block_size: BS,
        mode: CacheMode::WriteBack,
        policy: "smq".into(),
        journal_bytes,
        max_volumes: None,
        volumes: vec![NewVolume {
            name: "bench".into(),
            identity: backing(slots),
            mode: None,
            sequential_cutoff: None,
        }],
    }
}

fn cache_size(slots: u64, journal_bytes: Option<u64>) -> u64 {
    // Grow until the layout holds `slots` slots.
    let mut size = slots * u64::from(BS);
    loop {
        let l = Layout::compute(size, BS, DEFAULT_MAX_VOLUMES, journal_bytes).unwrap();
        if u64::from(l.capacity) >= slots {
            return size;
        }
        size += (slots - u64::from(l.capacity)) * u64::from(BS);
    }
}

fn mem_device(slots: u64, journal_bytes: Option<u64>) -> Arc<CountingDevice<MetaOnly>> {
    let size = cache_size(slots, journal_bytes);
    let l = Layout::compute(size, BS, DEFAULT_MAX_VOLUMES, journal_bytes).unwrap();
    Arc::new(CountingDevice::new(MetaOnly {
        inner: MemDevice::new(l.data_offset),
        size,
    }))
}

/// An entry for `slot` that stays unique per slot: origin blocks congruent
/// to the slot modulo the capacity.
fn entry_for(slot: u32, slots: u64, rng: &mut StdRng) -> Option<Entry> {
    Some(Entry {
        volume: VolumeId(0),
        oblock: u64::from(slot) + slots * rng.gen_range(0..16),
        dirty: rng.gen_bool(0.5),
        hint: rng.gen_range(0..64),
        crc: rng.gen_bool(0.5).then(|| rng.gen()),
    })
}

fn write_amplification(slots: u64) {
    println!("== metadata bytes written per slot update ({slots} slots, 4 KiB blocks) ==");
    let mapping_bytes = slots * ENTRY_LEN as u64;
    let one_64th = (mapping_bytes / 64).max(1 << 20);
    for (name, journal) in [
        ("default journal (2x mapping)", None),
        ("journal 1/64 of mapping, >= 1 MiB", Some(one_64th)),
    ] {
        let jbytes = journal.unwrap_or_else(|| default_journal_bytes(slots));
        println!(
            "-- {name}: {} MiB journal, {:.1} MiB mapping snapshot",
            jbytes >> 20,
            mapping_bytes as f64 / (1 << 20) as f64
        );
        for batch in [1u64, 8, 64] {
            let dev = mem_device(slots, journal);
            let mut s = MetadataStore::format(dev.clone(), &params(slots, journal)).unwrap();
            let half = s.layout().journal_blocks / 2;
            // About four snapshot cycles.
            let commits = 4 * half * batch.div_ceil(JOURNAL_RECORDS_PER_BLOCK as u64);
            let mut rng = StdRng::seed_from_u64(batch);
            let before = dev.snapshot();
            let st0 = s.stats();
            let t = Instant::now();
            for _ in 0..commits {
                for _ in 0..batch {
                    let slot = rng.gen_range(0..slots as u32);
                    s.record(slot, entry_for(slot, slots, &mut rng)).unwrap();
                }
                s.commit().unwrap();
            }
            let el = t.elapsed();
            let io = dev.snapshot().since(&before);
            let st = s.stats();
            let updates = commits * batch;
            let journal_b = (st.journal_blocks_written - st0.journal_blocks_written) * 4096;
            let snap_b = (st.snapshot_blocks_written - st0.snapshot_blocks_written) * 4096;
            let sb_b = (st.superblocks_written - st0.superblocks_written) * 4096;
            assert_eq!(io.bytes_written, journal_b + snap_b + sb_b);
            println!(
                "batch {batch:>3}: {:>9.0} bytes/update (journal {:>7.0}, snapshot {:>8.0}, superblock {:>4.0}); \
                 {:.2} flushes/commit; {updates} updates, {} snapshots; {:.0} commits/s in memory",
                io.bytes_written as f64 / updates as f64,
                journal_b as f64 / updates as f64,
                snap_b as f64 / updates as f64,
                sb_b as f64 / updates as f64,
                io.flushes as f64 / commits as f64,
                st.snapshots_written - st0.snapshots_written,
                commits as f64 / el.as_secs_f64()
            );
        }
    }
}

/// Formats, fills the journal to one block below the snapshot threshold
/// with full commits, "crashes" (drops the store without a clean
/// shutdown), then times `open`.
fn recovery(name: &str, dev: Arc<dyn BlockDevice>, slots: u64) {
    let mut s = MetadataStore::format(dev.clone(), &params(slots, None)).unwrap();
    let half = s.layout().journal_blocks / 2;
    let mut rng = StdRng::seed_from_u64(1);
    let t = Instant::now();
    while s.journal_used() + 1 < half {
        for _ in 0..JOURNAL_RECORDS_PER_BLOCK {
            let slot = rng.gen_range(0..slots as u32);
            s.record(slot, entry_for(slot, slots, &mut rng)).unwrap();
        }
        let st = s.commit().unwrap();
        assert!(!st.snapshot);
    }
    let fill = t.elapsed();
    let used = s.journal_used();
    let want = s.mapping();
    drop(s); // crash: no clean shutdown
    let t = Instant::now();
    let (s, rec) = MetadataStore::open(dev.clone()).unwrap();
    let unclean = t.elapsed();
    assert_eq!(rec.mapping, want);
    assert_eq!(rec.journal_blocks_replayed, used);
    let fin = s.mapping();
    s.mark_clean_shutdown(&fin, &[(VolumeId(0), backing(slots))])
        .unwrap();
    let t = Instant::now();
    let (mut s, rec2) = MetadataStore::open(dev).unwrap();
    let clean = t.elapsed();
    assert!(rec2.was_clean_shutdown);
    // The stall a commit sees when it triggers a snapshot.
    let t = Instant::now();
    s.snapshot().unwrap();
    let snap = t.elapsed();
    println!(
        "{name}: open after crash {:.1} ms ({used} journal blocks, {} records replayed, \
         then a checkpoint snapshot written); open after clean shutdown {:.1} ms; \
         one snapshot (commit stall) {:.1} ms; (journal fill: {:.1} s, {:.2} ms per {JOURNAL_RECORDS_PER_BLOCK}-record commit)",
        unclean.as_secs_f64() * 1e3,
        rec.journal_records_replayed,
        clean.as_secs_f64() * 1e3,
        snap.as_secs_f64() * 1e3,
        fill.as_secs_f64(),
        fill.as_secs_f64() * 1e3 / used as f64
    );
}

fn main() {
    let slots: u64 = std::env::var("METADATA_BENCH_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20);
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists benches; nothing to list
    }
    write_amplification(slots);

    println!("== recovery time ({slots} slots, default journal) ==");
    recovery("memory", mem_device(slots, None), slots);
    let dir = std::env::var("METADATA_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let tmp = tempfile::Builder::new()
        .prefix("tiercache-metadata-bench")
        .tempfile_in(&dir)
        .unwrap();
    let f = FileDevice::create(tmp.path(), cache_size(slots, None)).unwrap();
    let name = format!(
        "file {} ({})",
        tmp.path().display(),
        if f.direct_io() {
            "O_DIRECT"
        } else {
            "buffered"
        }
    );
    recovery(&name, Arc::new(f), slots);
}
