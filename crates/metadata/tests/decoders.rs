//! Decoders, `open`, `check` and `repair` never panic, whatever the bytes;
//! entries (with and without crc) and the blocks holding them round-trip.

mod common;

use common::*;
use proptest::prelude::*;
use std::sync::{Arc, OnceLock};
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_metadata::codec::{
    decode_journal_block, decode_snapshot_block, decode_superblock, encode_journal_block,
    encode_snapshot_block, entry_generation, pack, seal, unpack, Header, JournalBlock, PackedEntry,
    Record, JOURNAL_MAGIC, JOURNAL_RECORDS_PER_BLOCK, META_BLOCK, SNAPSHOT_MAGIC, SUPERBLOCK_MAGIC,
};
use tiercache_metadata::volume::{decode_volume_block, VOLUME_MAGIC};
use tiercache_metadata::{
    check, repair, Entry, MetadataStore, VolumeId, MAX_HINT, MAX_OBLOCK, SNAPSHOT_ENTRIES_PER_BLOCK,
};

fn any_entry() -> impl Strategy<Value = Option<Entry>> {
    proptest::option::of(
        (
            any::<u16>(),
            0..=MAX_OBLOCK,
            any::<bool>(),
            0..=MAX_HINT,
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(volume, oblock, dirty, hint, crc)| Entry {
                volume: VolumeId(volume),
                oblock,
                dirty,
                hint,
                crc,
            }),
    )
}

fn decode_all(b: &[u8], block: u64) {
    let _ = decode_superblock(b, block);
    let _ = decode_snapshot_block(b, block);
    let _ = decode_journal_block(b, block);
    let _ = decode_volume_block(b, block);
}

/// A small store with snapshots and a live journal, shut down uncleanly.
fn image() -> &'static (Vec<u8>, u64) {
    static IMG: OnceLock<(Vec<u8>, u64)> = OnceLock::new();
    IMG.get_or_init(|| {
        let dev = mem(600, 8);
        let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
        for i in 0..600u32 {
            s.record(i, entry(u64::from(i) * 3, i % 4 == 0, (i % 64) as u8))
                .unwrap();
            if i % 97 == 0 {
                s.commit().unwrap();
            }
        }
        s.snapshot().unwrap();
        for i in 0..5u32 {
            s.record(i * 11, None).unwrap();
            s.commit().unwrap();
        }
        let meta = s.layout().data_offset;
        drop(s);
        let mut img = vec![0u8; dev.size() as usize];
        dev.read_at(&mut img, 0).unwrap();
        (img, meta)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn entries_round_trip_with_and_without_crc(e in any_entry(), generation in 1u16..) {
        let p = pack(e, generation);
        prop_assert_eq!(unpack(p).unwrap(), e);
        prop_assert_eq!(p == [0u8; 16], e.is_none());
        prop_assert_eq!(entry_generation(&p), if e.is_some() { generation } else { 0 });
    }

    /// Any 16 bytes either fail to unpack or are the canonical packing of
    /// what they unpack to (with the generation they carry), up to the
    /// ignored spare bits 57..64.
    #[test]
    fn unpack_accepts_only_canonical_entries(
        p in any::<[u8; 16]>(),
        free_word in any::<bool>(),
    ) {
        let mut p = p;
        if free_word {
            // Reach the free-slot rules too.
            p[6] &= !1;
        }
        if let Ok(e) = unpack(p) {
            let mut canonical = p;
            canonical[7] &= 0x01; // spare bits 57..64 are not kept
            prop_assert_eq!(pack(e, entry_generation(&p)), canonical);
            prop_assert!(e.is_none() || entry_generation(&p) != 0);
        }
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(
        b in proptest::collection::vec(any::<u8>(), 0..5000),
        block in any::<u64>(),
    ) {
        decode_all(&b, block);
    }

    #[test]
    fn decoders_never_panic_on_sealed_blocks(
        mut b in proptest::collection::vec(any::<u8>(), META_BLOCK..=META_BLOCK),
        kind in 0usize..4,
        block in 0u64..4,
        small in any::<bool>(),
    ) {
        let magic = [SUPERBLOCK_MAGIC, SNAPSHOT_MAGIC, JOURNAL_MAGIC, VOLUME_MAGIC][kind];
        b[..8].copy_from_slice(&magic);
        b[16..24].copy_from_slice(&block.to_le_bytes());
        if small {
            // Small counts and sequences reach the deeper checks.
            for at in [48usize, 52, 56] {
                b[at + 2] = 0;
                b[at + 3] = 0;
            }
        }
        seal(&mut b);
        decode_all(&b, block);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random damage to the metadata region (optionally re-sealed so the
    /// crc passes): `open`, `check` and `repair` return errors or reports,
    /// never panic; and after a successful repair, `open` succeeds.
    #[test]
    fn damaged_devices_never_panic_and_repair_makes_them_openable(
        edits in proptest::collection::vec((any::<u32>(), any::<u8>(), any::<bool>()), 1..12),
    ) {
        let (img, meta) = image();
        let mut img = img.clone();
        for (at, x, reseal) in &edits {
            let at = (*at as u64 % meta) as usize;
            img[at] ^= x | 1;
            if *reseal {
                let b = at / META_BLOCK * META_BLOCK;
                seal(&mut img[b..b + META_BLOCK]);
            }
        }
        let dev = Arc::new(MemDevice::new(img.len() as u64));
        dev.write_at(&img, 0).unwrap();
        let _ = open_checked(dev.clone(), &backing());
        let report = check(&*dev);
        let _ = report.to_string();
        if let Ok(r) = repair(dev.clone()) {
            r.superblock.clone().expect("repair names its superblock");
            let opened = MetadataStore::open(dev.clone());
            prop_assert!(opened.is_ok(), "open after repair: {:?}\n{}", opened.err(), r);
            let after = check(&*dev);
            prop_assert!(after.is_clean(), "{}", after);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn snapshot_and_journal_blocks_round_trip_entries_with_crc(
        entries in proptest::collection::vec(any_entry(), 1..=SNAPSHOT_ENTRIES_PER_BLOCK),
        slots in proptest::collection::vec(any::<u32>(), JOURNAL_RECORDS_PER_BLOCK),
        seq in 0u64..1 << 40,
        block in 2u64..1 << 30,
    ) {
        let packed: Vec<PackedEntry> = entries
            .iter()
            .enumerate()
            .map(|(i, &e)| pack(e, i as u16 + 1))
            .collect();
        let mut b = vec![0u8; META_BLOCK];
        encode_snapshot_block([5; 16], seq, block, 7, &packed, &mut b);
        let d = decode_snapshot_block(&b, block).unwrap();
        prop_assert_eq!(&d.entries, &packed);
        let back: Vec<Option<Entry>> = d.entries.iter().map(|&p| unpack(p).unwrap()).collect();
        prop_assert_eq!(&back, &entries);

        let n = entries.len().min(JOURNAL_RECORDS_PER_BLOCK);
        let jb = JournalBlock {
            header: Header { block, uuid: [6; 16], seq },
            commit_start: seq,
            last: n % 2 == 0,
            records: (0..n).map(|i| Record { slot: slots[i], entry: packed[i] }).collect(),
        };
        encode_journal_block(&jb, &mut b);
        prop_assert_eq!(decode_journal_block(&b, block).unwrap(), jb);
    }
}
