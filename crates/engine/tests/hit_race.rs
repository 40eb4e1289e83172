//! The front ends' hit paths (`read_if_cached`, `begin_cached_read` with
//! the caller reading the cache file) and miss path (`begin_uncached_read`,
//! the caller reading the backing file and writing the fill) while other
//! threads promote, evict, write and clean on a cache of a few blocks: a
//! read must never serve another block's data or a torn sector, nor a fill
//! put one in the cache. Every sector carries a tag
//! (sector number, write sequence) that a reader checks.

mod common;

use common::{borrowed_file, config, engine_over};
use rand::{Rng, SeedableRng};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, FileDevice};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

const SECTOR: usize = 512;
const BLOCK: u32 = 4096;
const BLOCKS: u64 = 48;
const CACHE_BLOCKS: u64 = 6;
const SECTORS: u64 = BLOCKS * BLOCK as u64 / SECTOR as u64;
const RUN: Duration = Duration::from_secs(3);

fn tag(sector: u64, seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (sector.wrapping_mul(29) ^ seq.wrapping_mul(13)).wrapping_add(i as u64) as u8;
    }
}

/// Panics unless every sector of `data` (read at `first`) is its own,
/// whole: written by one write, to that sector.
fn check(first: u64, data: &[u8], how: &str) {
    let mut want = [0u8; SECTOR];
    for (k, s) in data.chunks(SECTOR).enumerate() {
        let sector = first + k as u64;
        let got = u64::from_le_bytes(s[..8].try_into().unwrap());
        assert_eq!(
            got, sector,
            "{how}: sector {sector} holds sector {got}'s data"
        );
        let seq = u64::from_le_bytes(s[8..16].try_into().unwrap());
        tag(sector, seq, &mut want);
        assert!(s == want, "{how}: sector {sector} is torn (seq {seq})");
    }
}

#[test]
fn hits_and_misses_never_serve_another_blocks_data_while_the_cache_turns() {
    for mode in [CacheMode::WriteBack, CacheMode::WriteThrough] {
        race(mode);
    }
}

fn race(mode: CacheMode) {
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("cache");
    let cache =
        Arc::new(FileDevice::create(&cache_path, CACHE_BLOCKS * BLOCK as u64).expect("cache file"));
    let mut all = vec![0u8; (BLOCKS * BLOCK as u64) as usize];
    for (s, out) in all.chunks_mut(SECTOR).enumerate() {
        tag(s as u64, 0, out);
    }
    let backing_path = dir.path().join("backing");
    std::fs::write(&backing_path, &all).unwrap();
    let backing = Arc::new(FileDevice::open(&backing_path).expect("backing file"));
    let cfg = config(mode, ReplacementKind::Lru, AdmissionKind::Always, BLOCK, 0);
    let engine = engine_over(backing, cache, &cfg);
    let file = std::fs::File::open(&cache_path).unwrap();
    let stop = AtomicBool::new(false);
    let (quick, direct, seq) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(1));
    let (misses, fills) = (AtomicU64::new(0), AtomicU64::new(0));
    let end = Instant::now() + RUN;
    std::thread::scope(|s| {
        // Hit readers: the quick paths, the full read when they decline.
        for id in 0..2u64 {
            let (engine, file, stop) = (&engine, &file, &stop);
            let (quick, direct) = (&quick, &direct);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(id);
                let mut buf = vec![0u8; 2 * BLOCK as usize];
                while !stop.load(Ordering::Relaxed) {
                    // Mostly the first 8 blocks, so hits are frequent.
                    let first = rng.gen_range(0..8 * BLOCK as u64 / SECTOR as u64);
                    let n = rng.gen_range(1..=(2 * BLOCK as usize / SECTOR)) as u64;
                    let len = n as usize * SECTOR;
                    let b = &mut buf[..len];
                    let at = first * SECTOR as u64;
                    if id == 0 {
                        match engine.read_if_cached(at, b) {
                            Some(r) => {
                                r.unwrap();
                                check(first, b, "read_if_cached");
                                quick.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            None => engine.read(at, b).unwrap(),
                        }
                    } else {
                        match engine.begin_cached_read(at, len as u64) {
                            Some(range) => {
                                for &(off, into, n) in &range.pieces {
                                    file.read_exact_at(&mut b[into..into + n], off).unwrap();
                                }
                                range.finish(Ok(())).unwrap();
                                check(first, b, "begin_cached_read");
                                direct.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            None => engine.read(at, b).unwrap(),
                        }
                    }
                    check(first, b, "read");
                }
            });
        }
        // Misses served by the caller: a range within one block anywhere
        // on the volume, read from the backing file, the fill written.
        {
            let (engine, stop, misses, fills) = (&engine, &stop, &misses, &fills);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(3);
                let per_block = BLOCK as u64 / SECTOR as u64;
                while !stop.load(Ordering::Relaxed) {
                    let first = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=per_block - first % per_block);
                    let (at, len) = (first * SECTOR as u64, n as usize * SECTOR);
                    let Some(mut miss) = engine.begin_uncached_read(at, len as u64) else {
                        continue;
                    };
                    let (fd, from, bytes) = miss.source;
                    let mut scratch = AlignedBuf::new(BLOCK as usize);
                    borrowed_file(fd)
                        .read_exact_at(&mut scratch[..bytes], from)
                        .unwrap();
                    let data = scratch[miss.data_at..miss.data_at + len].to_vec();
                    let mut filled = None;
                    if let Some((fd, to, bytes)) = miss.fill {
                        if miss.begin_fill() {
                            filled = Some(borrowed_file(fd).write_all_at(&scratch[..bytes], to));
                            fills.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    miss.finish(Ok(()), filled, &scratch).unwrap();
                    check(first, &data, "begin_uncached_read");
                    misses.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Promotions and evictions: reads all over the volume.
        {
            let (engine, stop) = (&engine, &stop);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                let mut buf = vec![0u8; BLOCK as usize];
                while !stop.load(Ordering::Relaxed) {
                    let b = rng.gen_range(0..BLOCKS);
                    engine.read(b * BLOCK as u64, &mut buf).unwrap();
                    check(b * (BLOCK as u64 / SECTOR as u64), &buf, "read");
                }
            });
        }
        // Writes (whole blocks allocate; parts write in place or around),
        // and cleaning in writeback.
        {
            let (engine, stop, seq) = (&engine, &stop, &seq);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(11);
                while !stop.load(Ordering::Relaxed) {
                    let first = rng.gen_range(0..SECTORS - 16);
                    let n = rng.gen_range(1..=16u64);
                    let s = seq.fetch_add(1, Ordering::Relaxed);
                    let mut buf = vec![0u8; n as usize * SECTOR];
                    for (k, out) in buf.chunks_mut(SECTOR).enumerate() {
                        tag(first + k as u64, s, out);
                    }
                    engine.write(first * SECTOR as u64, &buf, false).unwrap();
                    if s % 8 == 0 {
                        engine.clean(4).unwrap();
                    }
                }
            });
        }
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let (quick, direct) = (quick.into_inner(), direct.into_inner());
    assert!(
        quick > 100 && direct > 100,
        "{mode}: the hit paths ran: {quick} quick hits, {direct} direct hits"
    );
    let (misses, fills) = (misses.into_inner(), fills.into_inner());
    assert!(
        misses > 100 && fills > 50,
        "{mode}: the miss path ran: {misses} misses, {fills} fills"
    );
    // Whatever the fills left in the cache is each block's own.
    for b in 0..BLOCKS {
        let mut buf = vec![0u8; BLOCK as usize];
        engine.read(b * BLOCK as u64, &mut buf).unwrap();
        check(b * (BLOCK as u64 / SECTOR as u64), &buf, "read after");
    }
    let st = engine.stats().decisions;
    assert!(
        st.promotions > 100 && st.demotions > 100,
        "{mode}: the cache turned: {st:?}"
    );
}
