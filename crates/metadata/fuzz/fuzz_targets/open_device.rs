//! Fuzzes `MetadataStore::open`, `check` and `repair` over a whole small
//! device built from the input.
//!
//! First byte even: the rest is a list of 6-byte edits (u32 LE offset into
//! the metadata region, a byte to XOR in, a flag whose bit 0 re-seals the
//! edited block's crc) applied to a valid store image (snapshots plus a
//! live journal, shut down uncleanly). First byte odd: the rest, padded to
//! 4 KiB blocks, is the device image itself.
//!
//! Properties: nothing panics; after a successful `repair`, `open`
//! succeeds and `check` is clean.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_metadata::codec::{seal, META_BLOCK};
use tiercache_metadata::{
    check, repair, BackingIdentity, Entry, FormatParams, MetadataStore, NewVolume, VolumeId,
};
use tiercache_types::CacheMode;

const SLOTS: u64 = 64;
const JOURNAL_BLOCKS: u64 = 8;
/// Two volume-table blocks per copy.
const MAX_VOLUMES: u32 = 20;

fn backing() -> BackingIdentity {
    BackingIdentity {
        size: 2000 * 4096,
        path_hint: "/dev/fuzz".into(),
        fingerprint: Some(7),
    }
}

fn image() -> &'static (Vec<u8>, u64) {
    static IMG: OnceLock<(Vec<u8>, u64)> = OnceLock::new();
    IMG.get_or_init(|| {
        let size = (2 + 2 * 2 + 2 * SLOTS.div_ceil(252) + JOURNAL_BLOCKS) * 4096 + SLOTS * 4096;
        let dev = Arc::new(MemDevice::new(size));
        let params = FormatParams {
            block_size: 4096,
            mode: CacheMode::WriteBack,
            policy: "smq".into(),
            journal_bytes: Some(JOURNAL_BLOCKS * 4096),
            max_volumes: Some(MAX_VOLUMES),
            volumes: ["a", "b", "c"]
                .iter()
                .map(|n| NewVolume {
                    name: n.to_string(),
                    identity: backing(),
                    mode: None,
                    sequential_cutoff: None,
                })
                .collect(),
        };
        let mut s = MetadataStore::format(dev.clone(), &params).unwrap();
        for i in 0..SLOTS as u32 {
            let e = Entry {
                volume: VolumeId((i % 3) as u16),
                oblock: u64::from(i) * 3,
                dirty: i % 4 == 0,
                hint: (i % 64) as u8,
                crc: (i % 3 == 0).then_some(i.wrapping_mul(0x9e37_79b9)),
            };
            s.record(i, Some(e)).unwrap();
            if i % 13 == 0 {
                s.commit().unwrap();
            }
        }
        s.snapshot().unwrap();
        // A detached and re-attached index: its generation moves on.
        for i in (2..SLOTS as u32).step_by(3) {
            s.record(i, None).unwrap();
        }
        s.commit().unwrap();
        s.detach(VolumeId(2)).unwrap();
        s.attach(&NewVolume {
            name: "c2".into(),
            identity: backing(),
            mode: None,
            sequential_cutoff: None,
        })
        .unwrap();
        for i in 0..5u32 {
            s.record(i * 7, None).unwrap();
            s.commit().unwrap();
        }
        let meta = s.layout().data_offset;
        drop(s);
        let mut img = vec![0u8; size as usize];
        dev.read_at(&mut img, 0).unwrap();
        (img, meta)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let img = if ctl & 1 == 1 {
        let len = rest
            .len()
            .clamp(2 * META_BLOCK, 1 << 20)
            .div_ceil(META_BLOCK)
            * META_BLOCK;
        let mut img = vec![0u8; len];
        let n = rest.len().min(len);
        img[..n].copy_from_slice(&rest[..n]);
        img
    } else {
        let (img, meta) = image();
        let mut img = img.clone();
        for e in rest.chunks_exact(6) {
            let at = (u64::from(u32::from_le_bytes([e[0], e[1], e[2], e[3]])) % meta) as usize;
            img[at] ^= e[4];
            if e[5] & 1 == 1 {
                let b = at / META_BLOCK * META_BLOCK;
                seal(&mut img[b..b + META_BLOCK]);
            }
        }
        img
    };
    let dev = Arc::new(MemDevice::new(img.len() as u64));
    dev.write_at(&img, 0).unwrap();
    if let Ok((_, rec)) = MetadataStore::open(dev.clone()) {
        // Isolation: every entry returned belongs to an attached volume.
        for e in rec.mapping.iter().flatten() {
            assert!(
                rec.volume(e.volume).is_some(),
                "{e:?} of a volume not attached"
            );
        }
    }
    let _ = check(&*dev).to_string();
    if let Ok(r) = repair(dev.clone()) {
        r.superblock.clone().expect("repair names its superblock");
        if let Err(e) = MetadataStore::open(dev.clone()) {
            panic!("open after repair failed: {e}\n{r}");
        }
        let after = check(&*dev);
        assert!(after.is_clean(), "{after}");
    }
});
