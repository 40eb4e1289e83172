//! Behaviour of the store: format, open, commit, snapshot, clean shutdown,
//! the refusals, check and repair.

mod common;

use common::*;
use std::sync::Arc;
use tiercache_device::{BlockDevice, CountingDevice, CrashDevice, MemDevice};
use tiercache_metadata::codec::{self, seal, META_BLOCK};
use tiercache_metadata::{
    check, check_with, content_crc, repair, repair_with, verify_clean_claims, BackingIdentity,
    CheckOptions, ClaimVerification, Entry, ErrorKind, Layout, MetadataError, MetadataStore,
    Severity, VolumeRecord, VolumeSlot, VolumeState,
};
use tiercache_types::CacheMode;

fn read_block(dev: &dyn BlockDevice, block: u64) -> Vec<u8> {
    let mut b = vec![0u8; META_BLOCK];
    dev.read_at(&mut b, block * META_BLOCK as u64).unwrap();
    b
}

fn write_block(dev: &dyn BlockDevice, block: u64, b: &[u8]) {
    dev.write_at(b, block * META_BLOCK as u64).unwrap();
}

#[test]
fn format_open_round_trip_with_journal_and_snapshots() {
    let dev = mem(1000, 8);
    let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    assert_eq!(s.layout().capacity, 1000);
    assert_eq!(s.layout().data_offset % 4096, 0);
    let mut want = vec![None; 1000];
    for round in 0..20u64 {
        for k in 0..37u64 {
            let slot = ((round * 37 + k) * 7 % 1000) as u32;
            let e = entry(
                (round * 37 + k) % BACKING_BLOCKS,
                k % 3 == 0,
                (k % 64) as u8,
            );
            // Keep origin blocks unique, as the engine does.
            if let Some(old) = want.iter().position(|x| *x == e) {
                s.record(old as u32, None).unwrap();
                want[old] = None;
            }
            s.record(slot, e).unwrap();
            want[slot as usize] = e;
        }
        s.commit().unwrap();
    }
    assert!(s.stats().snapshots_written > 1, "{:?}", s.stats());
    assert_eq!(s.mapping(), want);
    drop(s); // no clean shutdown: a crash
    let (s2, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert!(!rec.was_clean_shutdown);
    assert_eq!(rec.mapping, want);
    assert_eq!(s2.mapping(), want);
    assert_eq!(rec.superblock.mode, CacheMode::WriteBack);
    assert_eq!(rec.superblock.policy, "smq");
}

#[test]
fn clean_shutdown_flag_is_cleared_durably_by_open() {
    let dev = mem(600, 4);
    let mut s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    s.record(3, entry(10, true, 5)).unwrap();
    s.commit().unwrap();
    let mut fin = s.mapping();
    fin[3] = entry(10, true, 42); // fresh hint at shutdown
    s.mark_clean_shutdown(&fin, &vol0(backing())).unwrap();
    let (s, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert!(rec.was_clean_shutdown);
    assert_eq!(rec.mapping, fin);
    assert_eq!(rec.journal_blocks_replayed, 0);
    assert!(!s.superblock().clean_shutdown);
    drop(s);
    let (_, rec) = open_checked(dev, &backing()).unwrap();
    assert!(!rec.was_clean_shutdown, "a crash after open is unclean");
    assert_eq!(rec.mapping, fin);
}

#[test]
fn refuses_wrong_backing_device() {
    let dev = mem(600, 4);
    let s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    let fin = s.mapping();
    s.mark_clean_shutdown(&fin, &vol0(backing())).unwrap();
    let mut other = backing();
    other.size += 4096;
    let e = open_checked(dev.clone(), &other).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongBackingDevice);
    assert!(e.to_string().contains("wrong data"), "{e}");
    let mut other = backing();
    other.fingerprint = Some(1);
    let e = open_checked(dev.clone(), &other).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongBackingDevice, "{e}");
    // Unknown fingerprint: accepted.
    let mut unknown = backing();
    unknown.fingerprint = None;
    let (s, _) = open_checked(dev.clone(), &unknown).unwrap();
    drop(s);
    // After an unclean shutdown a fingerprint change is only a warning.
    let (_, rec) = open_checked(dev, &other).unwrap();
    assert!(rec.warnings.iter().any(|w| w.contains("fingerprint")));
}

#[test]
fn fingerprint_sees_start_and_end() {
    let d = MemDevice::new(1 << 20);
    let f0 = tiercache_metadata::fingerprint(&d).unwrap();
    d.write_at(&[1u8; 512], (1 << 20) - 512).unwrap();
    let f1 = tiercache_metadata::fingerprint(&d).unwrap();
    d.write_at(&[1u8; 512], 1 << 19).unwrap();
    assert_eq!(
        tiercache_metadata::fingerprint(&d).unwrap(),
        f1,
        "middle ignored"
    );
    assert_ne!(f0, f1);
    let id = BackingIdentity::of(&d, "/x").unwrap();
    assert_eq!(id.size, 1 << 20);
    assert_eq!(id.fingerprint, Some(f1));
}

#[test]
fn refuses_unformatted_future_and_featured_devices() {
    let dev = mem(600, 4);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFormatted);
    assert!(
        e.to_string().contains("not a tiercache cache device"),
        "{e}"
    );
    assert_eq!(
        check(&*dev).worst(),
        Some(Severity::Error),
        "check reports it"
    );

    let s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    let gen = s.superblock().generation;
    drop(s);
    let live = gen % 2;
    // Future version in the newest copy.
    let orig = read_block(&*dev, live);
    let orig_other = read_block(&*dev, 1 - live);
    let mut b = orig.clone();
    b[48..52].copy_from_slice(&4u32.to_le_bytes());
    seal(&mut b);
    write_block(&*dev, live, &b);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{e}");
    assert!(e.to_string().contains("upgrade tiercache"), "{e}");
    // A version-2 cache (one backing device, 12-byte entries): its own
    // error kind, and the message says how to proceed.
    let mut b = orig.clone();
    b[48..52].copy_from_slice(&2u32.to_le_bytes());
    seal(&mut b);
    write_block(&*dev, live, &b);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OldFormat, "{e}");
    let msg = e.to_string();
    for want in [
        "format version 2",
        "cannot be converted in place",
        "data is safe",
        "`tiercache upgrade --cache",
        "writes the cache's dirty blocks back",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    let r = check(&*dev);
    assert!(r.superblock.is_none());
    assert!(
        r.problems
            .iter()
            .any(|p| p.severity == Severity::Error && p.message.contains("format version 2")),
        "{r}"
    );
    // A version-1 cache (8-byte entries): both copies say version 1. The
    // error says how to proceed; check reports the same.
    for (block, orig) in [(live, &orig), (1 - live, &orig_other)] {
        let mut b = orig.clone();
        b[48..52].copy_from_slice(&1u32.to_le_bytes());
        seal(&mut b);
        write_block(&*dev, block, &b);
    }
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnsupportedVersion, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("format version 1"), "{msg}");
    assert!(msg.contains("supports version 3"), "{msg}");
    assert!(msg.contains("`tiercache detach`"), "{msg}");
    assert!(msg.contains("`tiercache create`"), "{msg}");
    let r = check(&*dev);
    assert!(r.superblock.is_none());
    assert!(
        r.problems
            .iter()
            .any(|p| p.severity == Severity::Error && p.message.contains("`tiercache create`")),
        "{r}"
    );
    write_block(&*dev, 1 - live, &orig_other);
    // Unknown incompat bit.
    let mut b = orig.clone();
    b[72] = 0x80;
    seal(&mut b);
    write_block(&*dev, live, &b);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert!(matches!(
        e,
        MetadataError::IncompatibleFeatures {
            read_only_ok: false,
            ..
        }
    ));
    // Unknown ro_compat bit: refused for writing, fine for check.
    let mut b = orig.clone();
    b[64] = 1;
    seal(&mut b);
    write_block(&*dev, live, &b);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert!(matches!(
        e,
        MetadataError::IncompatibleFeatures {
            read_only_ok: true,
            ..
        }
    ));
    assert!(check(&*dev).superblock.is_some());
    // Unknown compat bit: ignored.
    let mut b = orig.clone();
    b[56] = 1;
    seal(&mut b);
    write_block(&*dev, live, &b);
    open_checked(dev.clone(), &backing()).unwrap();
}

#[test]
fn torn_newest_superblock_falls_back_to_the_other_copy() {
    let dev = mem(600, 4);
    let mut s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    s.record(1, entry(1, false, 0)).unwrap();
    s.commit().unwrap();
    s.set_mode(CacheMode::PassThrough).unwrap();
    let gen = s.superblock().generation;
    drop(s);
    let mut b = read_block(&*dev, gen % 2);
    b[1000] ^= 1;
    write_block(&*dev, gen % 2, &b);
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.superblock.generation, gen - 1);
    assert_eq!(rec.superblock.mode, CacheMode::WriteBack, "older copy");
    assert_eq!(rec.mapping[1], entry(1, false, 0), "journal still replayed");
    assert!(rec.warnings.iter().any(|w| w.contains("copy")));
}

#[test]
fn mode_and_detached_persist() {
    let dev = mem(600, 4);
    let mut s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    s.set_mode(CacheMode::WriteAround).unwrap();
    s.set_detached(true).unwrap();
    s.set_policy("lru").unwrap();
    drop(s);
    let (_, rec) = open_checked(dev, &backing()).unwrap();
    assert_eq!(rec.superblock.mode, CacheMode::WriteAround);
    assert!(rec.superblock.detached);
    assert_eq!(rec.superblock.policy, "lru");
}

#[test]
fn records_are_validated() {
    let dev = mem(600, 4);
    let mut s = MetadataStore::format(dev, &params(4)).unwrap();
    assert_eq!(
        s.record(600, None).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        s.record(0, entry(BACKING_BLOCKS, false, 0))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(s.pending(), 0);
    s.record(0, entry(0, false, 255)).unwrap();
    s.commit().unwrap();
    assert_eq!(s.entry(0).unwrap().hint, 63, "hints saturate");
}

#[test]
fn a_commit_larger_than_the_journal_goes_into_a_snapshot() {
    let dev = mem(1500, 2);
    let mut s = MetadataStore::format(dev.clone(), &params(2)).unwrap();
    for slot in 0..1500u32 {
        s.record(slot, entry(u64::from(slot), slot % 2 == 0, 1))
            .unwrap();
    }
    let st = s.commit().unwrap();
    assert!(st.snapshot);
    assert_eq!(st.journal_blocks, 0);
    let want = s.mapping();
    drop(s);
    let (_, rec) = open_checked(dev, &backing()).unwrap();
    assert_eq!(rec.mapping, want);
}

#[test]
fn commit_bytes_are_counted_and_match_the_device() {
    let dev = Arc::new(CountingDevice::new(MemDevice::new(device_size(600, 64))));
    let mut s = MetadataStore::format(dev.clone(), &params(64)).unwrap();
    let before = dev.snapshot();
    let st0 = s.stats();
    for i in 0..10u32 {
        s.record(i, entry(u64::from(i), true, 0)).unwrap();
        let st = s.commit().unwrap();
        assert_eq!(st.journal_blocks, 1);
        assert_eq!(st.bytes_written, 4096);
        assert!(!st.snapshot);
    }
    let io = dev.snapshot().since(&before);
    assert_eq!(io.bytes_written, 10 * 4096);
    assert_eq!(io.flushes, 10, "one flush per commit");
    assert_eq!(s.stats().bytes_written() - st0.bytes_written(), 10 * 4096);
}

#[test]
fn a_write_error_poisons_the_store_and_open_recovers() {
    let crash = Arc::new(CrashDevice::new(device_size(600, 8)));
    let fa = Arc::new(FailAfter::new(crash.clone(), 1_000_000));
    let mut s = MetadataStore::format(fa.clone(), &params(8)).unwrap();
    s.record(1, entry(7, true, 0)).unwrap();
    s.commit().unwrap();
    drop(s);
    // Open's checkpoint: snapshot write + flush + superblock write + flush.
    let fa = Arc::new(FailAfter::new(crash.clone(), 4));
    let (mut s, _) = open_checked(fa.clone(), &backing()).unwrap();
    s.record(2, entry(8, true, 0)).unwrap();
    assert_eq!(s.commit().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(
        s.record(3, None).unwrap_err().kind(),
        ErrorKind::Failed,
        "poisoned"
    );
    assert_eq!(s.commit().unwrap_err().kind(), ErrorKind::Failed);
    crash.crash();
    let (_, rec) = open_checked(crash.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping[1], entry(7, true, 0));
    assert_eq!(rec.mapping[2], None);
}

#[test]
fn stale_journal_of_an_earlier_format_is_not_replayed() {
    let dev = mem(600, 8);
    let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    for i in 0..3u32 {
        s.record(i, entry(u64::from(i), true, 0)).unwrap();
        s.commit().unwrap();
    }
    drop(s);
    let s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    drop(s);
    let (_, rec) = open_checked(dev, &backing()).unwrap();
    assert!(rec.mapping.iter().all(Option::is_none));
    assert_eq!(rec.journal_blocks_replayed, 0);
}

#[test]
fn torn_commit_is_ignored_and_later_commits_are_never_confused_with_it() {
    // A three-block commit whose middle block is lost; then, after
    // recovery, new commits at the positions the torn one used.
    let dev = mem(1200, 16);
    let mut s = MetadataStore::format(dev.clone(), &params(16)).unwrap();
    s.record(0, entry(0, true, 0)).unwrap();
    s.commit().unwrap();
    let first_journal_block = s
        .layout()
        .journal_block_of(s.superblock().journal_start_seq);
    for slot in 1..700u32 {
        s.record(slot, entry(u64::from(slot), false, 0)).unwrap();
    }
    s.commit().unwrap(); // 3 blocks after the first one
    drop(s);
    // Zero the middle block of the 3-block commit.
    write_block(&*dev, first_journal_block + 2, &vec![0u8; META_BLOCK]);
    let r = check(&*dev);
    assert!(
        r.problems
            .iter()
            .any(|p| p.message.contains("incomplete commit")),
        "{r}"
    );
    assert!(
        r.problems.iter().any(|p| p.message.contains("journal gap")),
        "{r}"
    );
    let (mut s, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.torn_commit_blocks_ignored, 1);
    assert_eq!(rec.journal_blocks_replayed, 1);
    assert_eq!(rec.mapping.iter().flatten().count(), 1);
    // A two-block commit now; the old third block must not join it.
    for slot in 100..500u32 {
        s.record(slot, entry(u64::from(slot) + 1000, true, 0))
            .unwrap();
    }
    s.commit().unwrap();
    let want = s.mapping();
    drop(s);
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping, want);
    assert!(check(&*dev).is_clean(), "{}", check(&*dev));
}

#[test]
fn corrupt_snapshot_block_is_refused_then_repaired() {
    let dev = mem(1200, 4);
    let mut s = MetadataStore::format(dev.clone(), &params(4)).unwrap();
    for slot in 0..1200u32 {
        s.record(slot, entry(u64::from(slot), slot % 10 == 0, 3))
            .unwrap();
    }
    s.snapshot().unwrap();
    s.snapshot().unwrap(); // the previous snapshot holds the same entries
                           // A journal record after the snapshot re-maps slot 0 (block 0 lost).
    s.record(0, entry(1500, true, 0)).unwrap();
    s.commit().unwrap();
    let area = s.layout().area_start(s.superblock().active);
    drop(s);
    let mut b = read_block(&*dev, area);
    b[200] ^= 0xff;
    write_block(&*dev, area, &b);
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("repair"), "{e}");
    let r = check(&*dev);
    assert_eq!(r.worst(), Some(Severity::Error));
    assert!(
        r.problems
            .iter()
            .any(|p| p.block == Some(area) && p.message.contains("dirty")),
        "{r}"
    );
    let r = repair(dev.clone()).unwrap();
    assert!(!r.actions.is_empty());
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping[0], entry(1500, true, 0), "journal kept it");
    assert_eq!(rec.mapping[1], None, "lost with its block");
    assert_eq!(rec.mapping[504], entry(504, false, 3), "other blocks kept");
    assert!(check(&*dev).is_clean());
}

#[test]
fn repair_keeps_the_dirty_claimant_and_drops_clean_conflicts() {
    let dev = mem(600, 8);
    let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    s.record(1, entry(50, false, 0)).unwrap();
    s.record(2, entry(50, true, 0)).unwrap(); // a bug upstream: same origin block
    s.record(3, entry(60, false, 0)).unwrap();
    s.record(4, entry(60, false, 0)).unwrap();
    s.record(5, entry(70, true, 0)).unwrap();
    s.commit().unwrap();
    let jb = s
        .layout()
        .journal_block_of(s.superblock().journal_start_seq);
    drop(s);
    // Also a record beyond the backing device, sealed as valid.
    let mut b = read_block(&*dev, jb);
    let rec5 = 64 + 20 * 4;
    let bad = codec::pack(entry(BACKING_BLOCKS + 5, true, 0), 1);
    b[rec5 + 4..rec5 + 20].copy_from_slice(&bad);
    seal(&mut b);
    write_block(&*dev, jb, &b);

    assert_eq!(
        open_checked(dev.clone(), &backing()).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    let r = check(&*dev);
    let msgs: Vec<_> = r.problems.iter().map(|p| p.message.clone()).collect();
    assert!(
        msgs.iter().any(|m| m.contains("block 50 of volume v0")),
        "{r}"
    );
    assert!(
        msgs.iter().any(|m| m.contains("block 60 of volume v0")),
        "{r}"
    );
    assert!(msgs.iter().any(|m| m.contains("beyond")), "{r}");
    let r = repair(dev.clone()).unwrap();
    assert!(r.actions.iter().any(|a| a.contains("DIRTY")), "{r}");
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping[1], None);
    assert_eq!(rec.mapping[2], entry(50, true, 0), "dirty one kept");
    assert_eq!(
        [rec.mapping[3], rec.mapping[4]].iter().flatten().count(),
        1,
        "one clean claimant kept"
    );
    assert_eq!(rec.mapping[5], None, "beyond the backing device");
    assert!(check(&*dev).is_clean(), "{}", check(&*dev));
}

#[test]
fn check_of_a_healthy_store_is_clean() {
    let dev = mem(600, 8);
    let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    s.record(1, entry(50, true, 0)).unwrap();
    s.commit().unwrap();
    let r = check(&*dev);
    assert!(r.is_clean(), "{r}");
    assert_eq!(r.entries, 1);
    assert_eq!(r.dirty_entries, 1);
    assert_eq!(r.journal_blocks_replayed, 1);
    assert!(r.to_string().contains("600 slots"));
}

#[test]
fn store_can_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<MetadataStore>();
    assert_send::<MetadataError>();
}

#[test]
fn a_lost_acknowledged_journal_block_is_an_error_naming_the_dirty_records() {
    let dev = mem(600, 16);
    let mut s = MetadataStore::format(dev.clone(), &params(16)).unwrap();
    let first = s
        .layout()
        .journal_block_of(s.superblock().journal_start_seq);
    for i in 0..3u32 {
        s.record(i, entry(u64::from(i), true, 0)).unwrap();
        s.record(i + 10, entry(u64::from(i) + 10, false, 0))
            .unwrap();
        s.commit().unwrap();
    }
    drop(s);
    // Bit rot in the middle commit's only block.
    let mut b = read_block(&*dev, first + 1);
    b[3000] ^= 1;
    write_block(&*dev, first + 1, &b);
    let r = check(&*dev);
    let p = r
        .problems
        .iter()
        .find(|p| p.message.contains("acknowledged"))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(p.severity, Severity::Error);
    assert!(p.message.contains("1 records that mark slots dirty"), "{r}");
    assert_eq!(p.block, Some(first + 1));
    // Open refuses rather than silently losing acknowledged dirty data.
    let e = open_checked(dev.clone(), &backing()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(
        e.to_string().contains("1 records marking slots dirty"),
        "{e}"
    );
    // Repair salvages the first commit; the loss is in its report.
    let r = repair(dev.clone()).unwrap();
    assert_eq!(r.worst(), Some(Severity::Error));
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping.iter().flatten().count(), 2);
    assert!(check(&*dev).is_clean());
}

const VERIFY: CheckOptions = CheckOptions {
    verify_clean_claims: true,
};

/// Writes `fill` repeated over slot `slot` of the data area; returns the
/// crc of the whole slot.
fn fill_slot(dev: &dyn BlockDevice, l: &Layout, slot: u32, fill: u8) -> u32 {
    let b = vec![fill; BS as usize];
    dev.write_at(&b, l.data_offset + u64::from(slot) * u64::from(BS))
        .unwrap();
    content_crc(&b)
}

/// A device whose reads overlapping `[bad, bad + len)` fail.
struct BadRange {
    inner: Arc<MemDevice>,
    bad: u64,
    len: u64,
}

impl BlockDevice for BadRange {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if offset < self.bad + self.len && self.bad < offset + buf.len() as u64 {
            return Err(std::io::Error::other("medium error"));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn describe(&self) -> String {
        "bad-range".into()
    }
}

/// Slots 0..3 clean with a matching crc, slot 3 clean without a crc, slot
/// 4 dirty with a wrong crc, slot 5 clean with a wrong crc, slot 9 clean
/// with a matching crc. Committed, then "crashed".
fn store_with_claims() -> (Arc<MemDevice>, Layout) {
    let dev = mem(600, 8);
    let mut s = MetadataStore::format(dev.clone(), &params(8)).unwrap();
    let l = *s.layout();
    for slot in [0u32, 1, 2, 9] {
        let crc = fill_slot(&*dev, &l, slot, slot as u8 + 1);
        s.record(slot, clean_with_crc(u64::from(slot) + 100, crc))
            .unwrap();
    }
    s.record(3, entry(103, false, 0)).unwrap();
    let crc = fill_slot(&*dev, &l, 4, 0x44);
    s.record(
        4,
        Some(Entry {
            crc: Some(!crc),
            ..entry(104, true, 0).unwrap()
        }),
    )
    .unwrap();
    let crc = fill_slot(&*dev, &l, 5, 0x55);
    s.record(5, clean_with_crc(105, crc ^ 1)).unwrap();
    s.commit().unwrap();
    drop(s);
    (dev, l)
}

#[test]
fn check_counts_crcs_and_verification_reports_stale_clean_claims_as_a_note() {
    let (dev, l) = store_with_claims();
    // Metadata only: counted, nothing read from the data area.
    let r = check(&*dev);
    assert!(r.is_clean(), "{r}");
    assert_eq!((r.entries, r.dirty_entries, r.clean_with_crc), (7, 1, 5));
    assert!(r.stale_clean_claims.is_empty());
    assert!(r.to_string().contains("5 clean with a crc"), "{r}");
    assert!(
        r.problems
            .iter()
            .any(|p| p.severity == Severity::Info
                && p.message.contains("1 clean entries carry no crc")),
        "{r}"
    );
    // Verified: slot 5 is stale (a note, the start after this crash drops
    // it); dirty slot 4 is never judged by its content.
    let r = check_with(&*dev, &VERIFY);
    assert!(r.is_clean(), "{r}");
    assert_eq!(r.stale_clean_claims, vec![5]);
    let p = r
        .problems
        .iter()
        .find(|p| p.message.contains("stale clean claims"))
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(p.severity, Severity::Info);
    assert!(p.message.contains("would be dropped at start"), "{r}");
    // The same through the public function, on the recovered mapping.
    let (s, rec) = open_checked(dev.clone(), &backing()).unwrap();
    let v = verify_clean_claims(&*dev, &l, &rec.volumes, &rec.mapping);
    assert_eq!(
        v,
        ClaimVerification {
            checked: 5,
            mismatched: vec![5],
            unreadable: vec![],
        }
    );
    // After a clean shutdown the engine trusts clean claims: a stale one
    // is a warning.
    s.mark_clean_shutdown(&rec.mapping, &vol0(backing()))
        .unwrap();
    let r = check_with(&*dev, &VERIFY);
    assert_eq!(r.worst(), Some(Severity::Warning), "{r}");
    assert_eq!(r.stale_clean_claims, vec![5]);
}

#[test]
fn repair_withdraws_stale_clean_claims_and_never_dirty_ones() {
    let (dev, _) = store_with_claims();
    // Without verification, repair keeps them.
    let r = repair_with(dev.clone(), &CheckOptions::default()).unwrap();
    assert!(r.stale_clean_claims.is_empty());
    assert_eq!(r.entries, 7);
    let r = repair(dev.clone()).unwrap();
    assert_eq!(r.stale_clean_claims, vec![5]);
    assert!(
        r.actions
            .iter()
            .any(|a| a.contains("withdrew 1 stale clean claims")),
        "{r}"
    );
    assert_eq!(r.entries, 6);
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!(rec.mapping[5], None, "stale clean claim withdrawn");
    assert!(rec.mapping[4].unwrap().dirty, "dirty entry kept");
    assert!(rec.mapping[0].unwrap().crc.is_some(), "verified claim kept");
    assert_eq!(rec.mapping[3], entry(103, false, 0), "no crc: kept");
    assert!(rec.mapping[9].is_some());
    let r = check_with(&*dev, &VERIFY);
    assert!(r.is_clean() && r.stale_clean_claims.is_empty(), "{r}");
}

#[test]
fn unreadable_slots_are_retried_one_by_one_and_reported() {
    let (dev, l) = store_with_claims();
    // Slot 1 unreadable: the run 0..3 fails as a whole, slots 0 and 2 are
    // read alone.
    let bad = Arc::new(BadRange {
        inner: dev.clone(),
        bad: l.data_offset + u64::from(BS) + 512,
        len: 512,
    });
    let r = check_with(&*bad, &VERIFY);
    assert_eq!(r.stale_clean_claims, vec![1, 5]);
    assert!(
        r.problems.iter().any(|p| p.severity == Severity::Warning
            && p.message.contains("could not be read")
            && p.message.contains("slots 1")),
        "{r}"
    );
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    let v = verify_clean_claims(&*bad, &l, &rec.volumes, &rec.mapping);
    assert_eq!(
        (v.checked, v.mismatched, v.unreadable),
        (4, vec![5], vec![1])
    );
    let r = repair(bad.clone()).unwrap();
    assert_eq!(r.stale_clean_claims, vec![1, 5]);
    let (_, rec) = open_checked(dev.clone(), &backing()).unwrap();
    assert_eq!((rec.mapping[1], rec.mapping[5]), (None, None));
    assert!(rec.mapping[0].is_some() && rec.mapping[2].is_some());
}

#[test]
fn a_claim_on_the_short_last_block_covers_only_its_bytes() {
    let dev = mem(8, 4);
    let l = Layout::compute(dev.size(), BS, MAX_VOLUMES, Some(4 * 4096)).unwrap();
    // Backing device of 2 blocks and 100 bytes: block 2 is 100 bytes.
    let size = 2 * u64::from(BS) + 100;
    let mut slot = vec![0xabu8; BS as usize];
    slot[100..].fill(0x11); // beyond the end of the backing device
    dev.write_at(&slot, l.data_offset).unwrap();
    let short = content_crc(&slot[..100]);
    let whole = content_crc(&slot);
    let claim = |oblock, crc| {
        let mut m = vec![None; l.capacity as usize];
        m[0] = clean_with_crc(oblock, crc);
        let mut v = volume();
        v.identity.size = size;
        let table = [VolumeSlot::Used(VolumeRecord {
            generation: 1,
            state: VolumeState::Attached,
            uuid: [0; 16],
            name: v.name,
            size,
            fingerprint: None,
            mode: tiercache_types::CacheMode::WriteBack,
            sequential_cutoff: None,
            path_hint: String::new(),
        })];
        verify_clean_claims(&*dev, &l, &table, &m)
    };
    assert!(claim(2, short).mismatched.is_empty());
    assert_eq!(claim(2, whole).mismatched, vec![0]);
    // A whole block is checked whole.
    assert!(claim(1, whole).mismatched.is_empty());
    assert_eq!(claim(1, short).mismatched, vec![0]);
}
