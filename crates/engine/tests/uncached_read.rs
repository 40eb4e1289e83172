//! `Engine::begin_uncached_read`: the ublk front end's miss path, where the
//! caller reads the backing file and writes the promotion itself. The
//! client's bytes must be the block's, a promotion must end as `read`'s
//! would (a hit afterwards), and every way of not finishing it (a failed
//! read, a fill that cannot begin, a dropped read) must give the promotion
//! up and leave the engine serving.

mod common;

use common::{borrowed_file, config, engine_over, file_rig, pattern, FileRig};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice, FileDevice, MemDevice};
use tiercache_engine::{Engine, UncachedRead};
use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

const BLOCK: u32 = 64 << 10;
const BLOCKS: u64 = 64;

fn rig(mode: CacheMode, replacement: ReplacementKind) -> FileRig {
    file_rig(
        &config(mode, replacement, AdmissionKind::Always, BLOCK, 0),
        11,
    )
}

/// Does the caller's IO as the contract says, through the fds it gives:
/// the source into a scratch buffer, the client's bytes out of it, the
/// fill if it may begin. Returns the client's bytes, the scratch buffer
/// and whether the fill was written.
fn serve(read: &mut UncachedRead<'_>, len: usize) -> (Vec<u8>, AlignedBuf, bool) {
    let (fd, at, n) = read.source;
    // Aligned: the device files may be open with O_DIRECT.
    let mut scratch = AlignedBuf::new(n.max(read.fill.map_or(0, |f| f.2)));
    borrowed_file(fd)
        .read_exact_at(&mut scratch[..n], at)
        .unwrap();
    let client = scratch[read.data_at..read.data_at + len].to_vec();
    let mut filled = false;
    if let Some((fd, at, n)) = read.fill {
        if read.begin_fill() {
            borrowed_file(fd).write_all_at(&scratch[..n], at).unwrap();
            filled = true;
        }
    }
    (client, scratch, filled)
}

#[test]
fn a_miss_is_served_promoted_and_then_hit() {
    let r = rig(CacheMode::WriteThrough, ReplacementKind::Lru);
    let (offset, len) = (3 * u64::from(BLOCK) + 8192, 4096usize);
    let before = r.engine.stats();
    let mut read = r
        .engine
        .begin_uncached_read(offset, len as u64)
        .expect("a miss");
    let fill = read.fill.expect("a promotion");
    assert_eq!(fill.2, BLOCK as usize, "the whole block is filled");
    assert_eq!(
        read.source.1,
        3 * u64::from(BLOCK),
        "read from the block's start"
    );
    assert_eq!(read.data_at, 8192);
    let (client, scratch, filled) = serve(&mut read, len);
    assert!(filled, "nothing holds the slot");
    read.finish(Ok(()), Some(Ok(())), &scratch).unwrap();
    assert_eq!(client, r.data[offset as usize..offset as usize + len]);

    let after = r.engine.stats();
    assert_eq!(after.read_bytes, before.read_bytes + len as u64);
    assert_eq!(after.read_hit_bytes, before.read_hit_bytes);
    assert_eq!(
        after.decisions.read_misses,
        before.decisions.read_misses + 1
    );
    // Promoted: the whole block is a ready hit with the block's data.
    let range = r
        .engine
        .begin_cached_read(3 * u64::from(BLOCK), u64::from(BLOCK))
        .expect("promoted");
    let mut got = vec![0u8; BLOCK as usize];
    let f = std::fs::File::open(&r.cache_path).unwrap();
    for &(at, off, n) in &range.pieces {
        f.read_exact_at(&mut got[off..off + n], at).unwrap();
    }
    range.finish(Ok(())).unwrap();
    assert_eq!(got, r.data[3 * BLOCK as usize..4 * BLOCK as usize]);
    // And a hit is not offered as a miss.
    let mut buf = vec![0u8; 4096];
    r.engine.read(3 * u64::from(BLOCK), &mut buf).unwrap();
    let mut again = r
        .engine
        .begin_uncached_read(3 * u64::from(BLOCK), 4096)
        .expect("planned");
    assert!(again.fill.is_none(), "a hit needs no fill");
    assert!(!again.begin_fill());
}

#[test]
fn a_failed_source_read_gives_the_promotion_up() {
    let r = rig(CacheMode::WriteThrough, ReplacementKind::Lru);
    let read = r.engine.begin_uncached_read(0, 4096).expect("a miss");
    let e = read
        .finish(Err(std::io::Error::from_raw_os_error(5)), None, &[])
        .unwrap_err();
    assert!(e.to_string().contains("backing"), "{e}");
    assert_eq!(r.engine.stats().backing_read_errors, 1);
    assert!(
        r.engine.begin_cached_read(0, 4096).is_none(),
        "nothing was promoted"
    );
    let mut got = vec![0u8; 4096];
    r.engine.read(0, &mut got).unwrap();
    assert_eq!(got, r.data[..4096]);
}

#[test]
fn a_fill_waits_for_no_reader_and_a_skipped_fill_gives_the_promotion_up() {
    // FIFO: a hit does not move its block, so block 0 stays the next victim.
    let r = rig(CacheMode::WriteThrough, ReplacementKind::Fifo);
    let capacity = r.engine.stats().decisions.capacity;
    assert!((2..BLOCKS).contains(&capacity), "{capacity} slots");
    let mut buf = vec![0u8; 4096];
    for b in 0..capacity {
        r.engine.read(b * u64::from(BLOCK), &mut buf).unwrap();
    }
    // A reader of block 0 holds its slot; the next miss takes that slot.
    let reader = r.engine.begin_cached_read(0, 4096).expect("a hit");
    let next = capacity * u64::from(BLOCK);
    let mut read = r.engine.begin_uncached_read(next, 4096).expect("a miss");
    assert!(read.fill.is_some());
    assert!(!read.begin_fill(), "the fill must not wait for the reader");
    let (client, scratch, filled) = serve(&mut read, 4096);
    assert!(!filled);
    read.finish(Ok(()), None, &scratch).unwrap();
    assert_eq!(client, r.data[next as usize..next as usize + 4096]);
    reader.finish(Ok(())).unwrap();
    assert!(
        r.engine.begin_cached_read(next, 4096).is_none(),
        "the promotion was given up"
    );
    // Once the reader is gone, the same miss fills.
    let mut read = r.engine.begin_uncached_read(next, 4096).expect("a miss");
    let (_, scratch, filled) = serve(&mut read, 4096);
    assert!(filled);
    read.finish(Ok(()), Some(Ok(())), &scratch).unwrap();
    assert!(r.engine.begin_cached_read(next, 4096).is_some(), "promoted");
}

#[test]
fn a_dropped_read_gives_the_promotion_up_and_unlocks() {
    let r = rig(CacheMode::WriteBack, ReplacementKind::Lru);
    let read = r.engine.begin_uncached_read(0, 4096).expect("a miss");
    drop(read);
    assert!(r.engine.begin_cached_read(0, 4096).is_none());
    let new = pattern(0, 4096, 5);
    r.engine.write(0, &new, false).unwrap();
    let mut got = vec![0u8; 4096];
    r.engine.read(0, &mut got).unwrap();
    assert_eq!(got, new);
}

#[test]
fn the_block_cannot_be_written_while_it_is_served() {
    let r = Arc::new(rig(CacheMode::WriteBack, ReplacementKind::Lru));
    let mut read = r.engine.begin_uncached_read(0, 4096).expect("a miss");
    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (r, written) = (r.clone(), written.clone());
        std::thread::spawn(move || {
            r.engine.write(0, &pattern(0, 4096, 2), false).unwrap();
            written.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (client, scratch, filled) = serve(&mut read, 4096);
    assert!(filled);
    assert!(
        !written.load(Ordering::SeqCst),
        "a write of the block finished while its miss was served"
    );
    read.finish(Ok(()), Some(Ok(())), &scratch).unwrap();
    assert_eq!(client, r.data[..4096]);
    writer.join().unwrap();
    let mut got = vec![0u8; 4096];
    r.engine.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(0, 4096, 2), "the write landed after the fill");
}

#[test]
fn what_it_cannot_serve_changes_nothing() {
    let r = rig(CacheMode::WriteThrough, ReplacementKind::Lru);
    let before = r.engine.stats();
    // Across a block boundary, empty, beyond the end.
    assert!(r
        .engine
        .begin_uncached_read(u64::from(BLOCK) - 4096, 8192)
        .is_none());
    assert!(r.engine.begin_uncached_read(0, 0).is_none());
    assert!(r
        .engine
        .begin_uncached_read(BLOCKS * u64::from(BLOCK), 4096)
        .is_none());
    let after = r.engine.stats();
    assert_eq!(
        (after.read_bytes, after.decisions.read_misses),
        (before.read_bytes, before.decisions.read_misses)
    );
    // A device without a file: memory.
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        BLOCK,
        0,
    );
    let mem = common::rig(BLOCKS * u64::from(BLOCK), 16, &cfg);
    assert!(mem.engine.begin_uncached_read(0, 4096).is_none());
    let backing = Arc::new(MemDevice::new(BLOCKS * u64::from(BLOCK)));
    let cache_path = r.cache_path.with_file_name("cache2");
    std::fs::File::create(&cache_path)
        .unwrap()
        .set_len(16 * u64::from(BLOCK))
        .unwrap();
    let cache = Arc::new(FileDevice::open(&cache_path).unwrap());
    let engine = engine_over(backing, cache, &cfg);
    assert!(
        engine.begin_uncached_read(0, 4096).is_none(),
        "no backing fd"
    );
}

#[test]
fn a_promotion_it_served_is_warm_after_a_crash() {
    // A persistent engine with 4 KiB blocks over two files: the fill's
    // claim carries the crc the caller's scratch buffer gave, which the
    // check after a crash compares with the slot.
    const BS: u64 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let (backing_path, cache_path) = (dir.path().join("backing"), dir.path().join("cache"));
    let data = pattern(0, (64 * BS) as usize, 21);
    std::fs::write(&backing_path, &data).unwrap();
    std::fs::File::create(&cache_path)
        .unwrap()
        .set_len((1 << 20) + (6 + 32) * BS)
        .unwrap();
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        BS as u32,
        0,
    );
    let clock = Arc::new(ManualClock::new(Time(1)));
    let open =
        |path: &std::path::Path| Arc::new(FileDevice::open(path).unwrap()) as Arc<dyn BlockDevice>;
    let e = Engine::create(
        open(&backing_path),
        open(&cache_path),
        &cfg,
        clock.clone(),
        "backing",
        Some(1 << 20),
    )
    .unwrap();
    let mut read = e.begin_uncached_read(3 * BS, BS).expect("a miss");
    let (client, scratch, filled) = serve(&mut read, BS as usize);
    assert!(filled);
    read.finish(Ok(()), Some(Ok(())), &scratch).unwrap();
    assert_eq!(client, data[3 * BS as usize..4 * BS as usize]);
    e.flush().unwrap(); // commits the clean claim
                        // The crash: the files as they are now, opened by the next engine.
    let (backing_copy, cache_copy) = (dir.path().join("backing2"), dir.path().join("cache2"));
    std::fs::copy(&backing_path, &backing_copy).unwrap();
    std::fs::copy(&cache_path, &cache_copy).unwrap();
    drop(e);
    let (e, report) = Engine::open(
        open(&backing_copy),
        open(&cache_copy),
        &tiercache_engine::OpenOptions::default(),
        clock,
        "backing",
    )
    .unwrap();
    assert!(!report.was_clean_shutdown);
    assert_eq!(
        (report.restored_blocks, report.unverified_clean),
        (1, 1),
        "{report:?}"
    );
    let mut got = vec![0u8; BS as usize];
    e.read(3 * BS, &mut got).unwrap();
    assert_eq!(got, data[3 * BS as usize..4 * BS as usize]);
    let checked = e.restore_check();
    assert_eq!(
        (checked.verified, checked.dropped),
        (1, 0),
        "the slot matches its claim's crc"
    );
    assert_eq!(e.stats().decisions.read_hits, 1);
}
