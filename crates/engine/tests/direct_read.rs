//! `Engine::begin_cached_read`: the ublk front end's hit path, where the
//! caller reads the cache file itself. The pieces must point at the right
//! data, the range must stay stable while the read runs, and anything but
//! a ready hit must change nothing.

mod common;

use common::{config, engine_over, pattern};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::{FileDevice, MemDevice};
use tiercache_engine::Engine;
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

const BLOCK: u32 = 64 << 10;

struct FileRig {
    engine: Engine,
    cache_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn file_rig(mode: CacheMode) -> FileRig {
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("cache");
    std::fs::File::create(&cache_path)
        .unwrap()
        .set_len(16 * u64::from(BLOCK))
        .unwrap();
    let cache = Arc::new(FileDevice::open(&cache_path).unwrap());
    let backing = Arc::new(MemDevice::new(64 * u64::from(BLOCK)));
    let cfg = config(mode, ReplacementKind::Lru, AdmissionKind::Always, BLOCK, 0);
    let engine = engine_over(backing, cache, &cfg);
    FileRig {
        engine,
        cache_path,
        _dir: dir,
    }
}

/// Reads the pieces from the cache file as a front end would.
fn read_pieces(path: &std::path::Path, pieces: &[(u64, usize, usize)], buf: &mut [u8]) {
    let f = std::fs::File::open(path).unwrap();
    for &(at, off, n) in pieces {
        f.read_exact_at(&mut buf[off..off + n], at).unwrap();
    }
}

#[test]
fn a_hit_gives_pieces_that_hold_the_data_and_counts_as_a_read() {
    let r = file_rig(CacheMode::WriteThrough);
    // Two whole blocks written through, then read once: both promoted.
    let data = pattern(0, 2 * BLOCK as usize, 7);
    r.engine.write(0, &data, false).unwrap();
    let mut buf = vec![0u8; data.len()];
    r.engine.read(0, &mut buf).unwrap();
    assert!(
        r.engine
            .begin_cached_read(0, 2 * u64::from(BLOCK))
            .is_some(),
        "both blocks are cached"
    );
    // A range across the block boundary, not block aligned.
    let (offset, len) = (u64::from(BLOCK) - 8192, 12288u64);
    let before = r.engine.stats();
    let range = r.engine.begin_cached_read(offset, len).expect("a hit");
    let covered: usize = range.pieces.iter().map(|p| p.2).sum();
    assert_eq!(covered as u64, len, "the pieces cover the range");
    // The two blocks were promoted into neighbouring slots: one read.
    assert_eq!(
        range.pieces.len(),
        1,
        "blocks in consecutive slots are one piece: {:?}",
        range.pieces
    );
    let mut got = vec![0u8; len as usize];
    read_pieces(&r.cache_path, &range.pieces, &mut got);
    range.finish(Ok(())).unwrap();
    assert_eq!(got, data[offset as usize..(offset + len) as usize]);
    let after = r.engine.stats();
    assert_eq!(after.read_bytes, before.read_bytes + len);
    assert_eq!(after.read_hit_bytes, before.read_hit_bytes + len);
    assert_eq!(after.decisions.read_hits, before.decisions.read_hits + 2);
}

#[test]
fn a_miss_or_a_memory_cache_changes_nothing() {
    let r = file_rig(CacheMode::WriteThrough);
    let before = r.engine.stats();
    assert!(
        r.engine.begin_cached_read(0, 4096).is_none(),
        "nothing cached yet"
    );
    let after = r.engine.stats();
    assert_eq!(
        (
            after.read_bytes,
            after.decisions.read_hits,
            after.decisions.read_misses
        ),
        (
            before.read_bytes,
            before.decisions.read_hits,
            before.decisions.read_misses
        )
    );
    // Half cached: still no.
    let mut buf = vec![0u8; BLOCK as usize];
    r.engine.read(0, &mut buf).unwrap();
    assert!(r
        .engine
        .begin_cached_read(0, 2 * u64::from(BLOCK))
        .is_none());
    // Beyond the end or empty: no.
    assert!(r.engine.begin_cached_read(r.engine.size(), 4096).is_none());
    assert!(r.engine.begin_cached_read(0, 0).is_none());

    // A cache in memory has no file to read.
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        BLOCK,
        0,
    );
    let rig = common::rig(64 * u64::from(BLOCK), 16, &cfg);
    rig.engine.read(0, &mut buf).unwrap();
    assert!(rig.engine.read_if_cached(0, &mut buf).is_some(), "a hit");
    assert!(rig.engine.begin_cached_read(0, 4096).is_none(), "but no fd");
}

#[test]
fn the_range_cannot_be_written_while_it_is_read() {
    let r = Arc::new(file_rig(CacheMode::WriteBack));
    let old = pattern(0, BLOCK as usize, 1);
    r.engine.write(0, &old, false).unwrap();
    let range = r.engine.begin_cached_read(0, 4096).expect("a dirty hit");
    let written = Arc::new(AtomicBool::new(false));
    let writer = {
        let (r, written) = (r.clone(), written.clone());
        std::thread::spawn(move || {
            r.engine.write(0, &pattern(0, 4096, 2), false).unwrap();
            written.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut got = vec![0u8; 4096];
    read_pieces(&r.cache_path, &range.pieces, &mut got);
    assert!(
        !written.load(Ordering::SeqCst),
        "a write of the range finished while it was being read"
    );
    assert_eq!(
        got,
        old[..4096],
        "the read sees the data it was planned for"
    );
    range.finish(Ok(())).unwrap();
    writer.join().unwrap();
    assert!(written.load(Ordering::SeqCst));
    // Another reader is not held up by a reader.
    let a = r.engine.begin_cached_read(0, 4096).expect("a hit");
    let b = r
        .engine
        .begin_cached_read(0, 4096)
        .expect("shared with a reader");
    drop(a);
    drop(b);
}

#[test]
fn a_failed_file_read_is_counted_and_the_normal_read_still_answers() {
    let r = file_rig(CacheMode::WriteThrough);
    let data = pattern(0, BLOCK as usize, 3);
    r.engine.write(0, &data, false).unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    r.engine.read(0, &mut buf).unwrap();
    let range = r.engine.begin_cached_read(0, 4096).expect("a hit");
    let e = range
        .finish(Err(std::io::Error::from_raw_os_error(5)))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(5), "EIO");
    assert_eq!(r.engine.stats().cache_read_errors, 1);
    let mut got = vec![0u8; 4096];
    r.engine.read(0, &mut got).unwrap();
    assert_eq!(got, data[..4096]);
    // Pins were released: the block can still be evicted and written.
    r.engine.trim(0, u64::from(BLOCK)).unwrap();
    assert!(
        r.engine.begin_cached_read(0, 4096).is_none(),
        "trimmed away"
    );
}
