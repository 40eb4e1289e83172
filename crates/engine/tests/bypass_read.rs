//! `Engine::begin_bypass_read`: a read that surely bypasses the cache (a
//! sequential stream past the cutoff, a volume in passthrough), read by the
//! front end itself from the pieces the engine names. The client's bytes
//! must be the volume's (a dirty cached block from its slot, the rest from
//! the backing device), nothing may be promoted, and a read that might
//! promote must be refused having changed nothing.

mod common;

use common::{borrowed_file, config, file_rig, pattern, FileRig};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use tiercache_device::AlignedBuf;
use tiercache_engine::{BypassRead, DirectPlan};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind, VolumeId};

const BLOCK: u32 = 64 << 10;
/// Four blocks: the fifth block of an in-order stream bypasses.
const CUTOFF: u64 = 4 * BLOCK as u64;

fn rig(mode: CacheMode) -> FileRig {
    file_rig(
        &config(
            mode,
            ReplacementKind::Lru,
            AdmissionKind::Always,
            BLOCK,
            CUTOFF,
        ),
        7,
    )
}

/// Reads every piece as the contract says (into a buffer aligned for
/// O_DIRECT) and finishes the read; returns the client's bytes.
fn serve(read: BypassRead<'_>, len: usize) -> Vec<u8> {
    let mut buf = AlignedBuf::new(len);
    for &(fd, at, into, n) in &read.pieces {
        borrowed_file(fd)
            .read_exact_at(&mut buf[into..into + n], at)
            .unwrap();
    }
    read.finish(Ok(())).unwrap();
    buf[..len].to_vec()
}

fn block(b: u64) -> u64 {
    b * u64::from(BLOCK)
}

#[test]
fn a_stream_past_the_cutoff_reads_dirty_blocks_from_the_cache_and_the_rest_from_backing() {
    let mut r = rig(CacheMode::WriteBack);
    // Block 6 rewritten: dirty in the cache, stale on the backing device.
    let new = pattern(block(6), BLOCK as usize, 99);
    r.engine.write(block(6), &new, false).unwrap();
    r.data[block(6) as usize..block(7) as usize].copy_from_slice(&new);
    // A random read continues no stream: refused, nothing changed.
    let before = r.engine.stats();
    assert!(r.engine.begin_bypass_read(block(40), block(2)).is_none());
    assert_eq!(r.engine.stats().read_bytes, before.read_bytes);
    assert_eq!(
        r.engine.stats().decisions.read_misses,
        before.decisions.read_misses
    );
    // The stream's first cutoff's worth goes the normal way (promoted).
    let mut buf = vec![0u8; BLOCK as usize];
    for b in 0..4 {
        assert!(
            r.engine.begin_bypass_read(block(b), block(1)).is_none(),
            "block {b} is within the cutoff"
        );
        r.engine.read(block(b), &mut buf).unwrap();
    }
    let before = r.engine.stats();
    let read = r
        .engine
        .begin_bypass_read(block(4), block(4))
        .expect("the stream is past its cutoff");
    let fds: Vec<_> = read.pieces.iter().map(|p| p.0).collect();
    assert_eq!(
        read.pieces.len(),
        3,
        "blocks 4-5 from backing, 6 from the cache, 7 from backing"
    );
    assert_eq!(fds[0], fds[2]);
    assert_ne!(fds[0], fds[1]);
    let got = serve(read, block(4) as usize);
    assert!(
        got == r.data[block(4) as usize..block(8) as usize],
        "the volume's bytes"
    );

    let after = r.engine.stats();
    assert_eq!(after.read_bytes, before.read_bytes + block(4));
    assert_eq!(after.read_hit_bytes, before.read_hit_bytes + block(1));
    assert_eq!(
        after.decisions.bypassed_ios,
        before.decisions.bypassed_ios + 1
    );
    assert_eq!(
        after.decisions.read_misses,
        before.decisions.read_misses + 3
    );
    for b in [4, 5, 7] {
        assert!(
            r.engine.begin_cached_read(block(b), 4096).is_none(),
            "block {b} was promoted"
        );
    }
}

#[test]
fn a_passthrough_volume_reads_everything_from_backing() {
    let r = rig(CacheMode::PassThrough);
    let before = r.engine.stats();
    let read = r
        .engine
        .begin_bypass_read(block(9) + 8192, block(3))
        .expect("passthrough never promotes");
    assert_eq!(read.pieces.len(), 1, "one backing read across the blocks");
    let got = serve(read, block(3) as usize);
    let at = (block(9) + 8192) as usize;
    assert!(got == r.data[at..at + block(3) as usize]);
    let after = r.engine.stats();
    assert_eq!(after.read_hit_bytes, before.read_hit_bytes);
    assert!(r.engine.begin_cached_read(block(9), 4096).is_none());
}

#[test]
fn a_dropped_read_unpins_and_unlocks() {
    let r = rig(CacheMode::PassThrough);
    let read = r.engine.begin_bypass_read(0, block(2)).expect("planned");
    drop(read);
    // The stripes are free again: a write goes through.
    r.engine
        .write(0, &vec![1u8; BLOCK as usize], false)
        .unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    r.engine.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 1));
}

#[test]
fn one_decision_gives_a_hit_a_bypass_or_nothing() {
    let r = rig(CacheMode::WriteThrough);
    let engine = Arc::new(r.engine);
    let volume = engine.volume_handle(VolumeId(0)).unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    // Blocks 0-3 read in order: promoted, and a stream at its cutoff.
    for b in 0..4 {
        volume.read(block(b), &mut buf).unwrap();
    }
    assert!(matches!(
        volume.begin_direct_read(block(2), 4096),
        Some(DirectPlan::Hit(_))
    ));
    // A random miss: nothing planned, nothing counted.
    let before = engine.stats();
    assert!(volume.begin_direct_read(block(30), 4096).is_none());
    assert_eq!(engine.stats().read_bytes, before.read_bytes);
    // The stream's next read, past the cutoff: a bypass.
    match volume.begin_direct_read(block(4), block(2)) {
        Some(DirectPlan::Bypass(read)) => {
            let got = serve(read, block(2) as usize);
            assert!(got == r.data[block(4) as usize..block(6) as usize]);
        }
        _ => panic!("a bypass expected"),
    };
}
