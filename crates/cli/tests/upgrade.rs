//! `tiercache upgrade`: a format-2 cache with dirty blocks (in its
//! snapshot and in its journal, one of them the backing device's short last
//! block) is written back to its backing device and re-created as format 3.

mod common;

use common::*;
use tiercache_metadata::codec::seal;

const BS: u64 = 4096;
/// Backing device: 64 whole blocks and a last block of 1024 bytes.
const BACKING_SIZE: u64 = 64 * BS + 1024;
const SLOTS: u64 = 8;
const JOURNAL_BLOCKS: u64 = 2;

fn header(b: &mut [u8], magic: &[u8; 8], block: u64, seq: u64) {
    b[..8].copy_from_slice(magic);
    b[16..24].copy_from_slice(&block.to_le_bytes());
    b[24..40].copy_from_slice(&[9; 16]);
    b[40..48].copy_from_slice(&seq.to_le_bytes());
}

fn entry(oblock: u64, dirty: bool) -> [u8; 12] {
    let w = oblock | 1 << 48 | if dirty { 1 << 49 } else { 0 };
    let mut p = [0u8; 12];
    p[..8].copy_from_slice(&w.to_le_bytes());
    p
}

/// A tiny format-2 writer (tests only): superblock generation 2, snapshot
/// 1 in area A holding `snap`, one journal commit (sequence 3) holding
/// `journal`, slot contents `data`; shut down uncleanly.
fn v2_cache(
    snap: &[(u64, u64, bool)],
    journal: &[(u64, u64, bool)],
    data: &[(u64, Vec<u8>)],
) -> Vec<u8> {
    let data_offset = (2 + 2 + JOURNAL_BLOCKS) * BS;
    // The device is larger than the version-2 layout needs (it used only
    // its first slots): room for version 3's metadata (1 MiB journal).
    let mut img = vec![0u8; (data_offset + SLOTS * BS).max(2 << 20) as usize];
    let blk = |img: &mut Vec<u8>, n: u64| -> std::ops::Range<usize> {
        let _ = img;
        (n * BS) as usize..((n + 1) * BS) as usize
    };
    // Snapshot block 0 of area A (block 2).
    let r = blk(&mut img, 2);
    let b = &mut img[r];
    header(b, b"TCSNAPSH", 2, 1);
    b[52..56].copy_from_slice(&(SLOTS as u32).to_le_bytes());
    for &(slot, ob, d) in snap {
        let at = 64 + 12 * slot as usize;
        b[at..at + 12].copy_from_slice(&entry(ob, d));
    }
    seal(b);
    // Journal sequence 3 at position 3 % 2 = 1 (block 4 + 1).
    let r = blk(&mut img, 5);
    let b = &mut img[r];
    header(b, b"TCJOURNL", 5, 3);
    b[48..56].copy_from_slice(&3u64.to_le_bytes());
    b[56..60].copy_from_slice(&(journal.len() as u32).to_le_bytes());
    b[60..64].copy_from_slice(&1u32.to_le_bytes());
    for (k, &(slot, ob, d)) in journal.iter().enumerate() {
        let at = 64 + 16 * k;
        b[at..at + 4].copy_from_slice(&(slot as u32).to_le_bytes());
        b[at + 4..at + 16].copy_from_slice(&entry(ob, d));
    }
    seal(b);
    // Superblock generation 2 in block 0.
    let r = blk(&mut img, 0);
    let b = &mut img[r];
    header(b, b"TIERCACH", 0, 2);
    let put = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    b[48..52].copy_from_slice(&2u32.to_le_bytes());
    b[52..56].copy_from_slice(&4096u32.to_le_bytes());
    b[80..84].copy_from_slice(&(BS as u32).to_le_bytes());
    b[84] = 1; // writeback
    put(b, 88, SLOTS);
    put(b, 96, data_offset);
    put(b, 104, 2);
    put(b, 112, 3);
    put(b, 120, 1);
    put(b, 128, 4);
    put(b, 136, JOURNAL_BLOCKS);
    put(b, 144, 1);
    put(b, 152, 3);
    put(b, 160, 3 % JOURNAL_BLOCKS);
    put(b, 168, BACKING_SIZE);
    b[184..187].copy_from_slice(b"lru");
    seal(b);
    for (slot, content) in data {
        let at = (data_offset + slot * BS) as usize;
        img[at..at + content.len()].copy_from_slice(content);
    }
    img
}

#[test]
fn upgrade_writes_dirty_blocks_back_then_formats_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    let cache = dir.path().join("cache.img");
    let original = pattern(1, BACKING_SIZE as usize);
    std::fs::write(&backing, &original).unwrap();
    let (b3, c5, e7, d_last) = (
        pattern(3, BS as usize),
        pattern(5, BS as usize),
        pattern(7, BS as usize),
        pattern(64, BS as usize),
    );
    let img = v2_cache(
        // slot 0: block 3 dirty; slot 1: block 5 clean (stale content: must
        // not be written); slot 2: the short last block, dirty; slot 3:
        // block 9 dirty, then freed by the journal.
        &[(0, 3, true), (1, 5, false), (2, 64, true), (3, 9, true)],
        // The journal: slot 4 now holds block 7 dirty; slot 3 is free.
        &[(4, 7, true), (3, 0, false)],
        &[
            (0, b3.clone()),
            (1, c5),
            (2, d_last.clone()),
            (3, pattern(9, BS as usize)),
            (4, e7.clone()),
        ],
    );
    // The journal's "slot 3 free" record: 12 zero bytes, not an entry.
    let mut img = img;
    let rec = (5 * BS + 64 + 16 + 4) as usize;
    img[rec..rec + 12].fill(0);
    seal(&mut img[(5 * BS) as usize..(6 * BS) as usize]);
    std::fs::write(&cache, &img).unwrap();

    // This build refuses it and says what to run.
    let out = output(tiercache().args(["check", "--cache"]).arg(&cache));
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("tiercache upgrade"), "{text}");

    let said = run(tiercache()
        .args(["upgrade", "--cache"])
        .arg(&cache)
        .arg("--backing")
        .arg(&backing));
    assert!(said.contains("wrote 3 dirty blocks"), "{said}");

    let after = std::fs::read(&backing).unwrap();
    assert_eq!(after.len() as u64, BACKING_SIZE);
    let block = |n: u64| &after[(n * BS) as usize..((n + 1) * BS).min(BACKING_SIZE) as usize];
    assert_eq!(
        block(3),
        &b3[..],
        "dirty block of the snapshot written back"
    );
    assert_eq!(block(7), &e7[..], "dirty block of the journal written back");
    assert_eq!(
        block(64),
        &d_last[..1024],
        "the short last block, its 1024 bytes"
    );
    assert_eq!(
        block(5),
        &original[(5 * BS) as usize..(6 * BS) as usize],
        "clean block untouched"
    );
    assert_eq!(
        block(9),
        &original[(9 * BS) as usize..(10 * BS) as usize],
        "freed slot not written"
    );
    for n in [0u64, 1, 2, 4, 6, 8, 10, 63] {
        assert_eq!(
            block(n),
            &original[(n * BS) as usize..((n + 1) * BS) as usize],
            "block {n}"
        );
    }

    // Now a format-3 cache with one volume, named after the backing file.
    let report = run(tiercache().args(["check", "--cache"]).arg(&cache));
    assert!(report.contains("volume 0: 'backing.img'"), "{report}");
    assert!(report.contains("0 blocks mapped"), "{report}");
    // Running it again is harmless.
    let again = run(tiercache()
        .args(["upgrade", "--cache"])
        .arg(&cache)
        .arg("--backing")
        .arg(&backing));
    assert!(again.contains("already format 3"), "{again}");
}

#[test]
fn upgrade_refuses_another_backing_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("other.img");
    let cache = dir.path().join("cache.img");
    sparse_file(&backing, BACKING_SIZE + BS);
    std::fs::write(&cache, v2_cache(&[(0, 3, true)], &[], &[])).unwrap();
    let out = output(
        tiercache()
            .args(["upgrade", "--cache"])
            .arg(&cache)
            .arg("--backing")
            .arg(&backing),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to a backing device of"), "{err}");
    // Nothing was written: still format 2.
    assert_eq!(std::fs::read(&cache).unwrap()[48], 2);
}
