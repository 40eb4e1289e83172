//! The volume table, and the isolation property it exists for: a block
//! recorded for one volume is never returned for another volume, nor for
//! a later attachment of the same volume index — not after slot reuse, a
//! crash (with power cuts in the middle of commits, attaches and
//! detaches), a stale claim or a detach.

mod common;

use common::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, CrashDevice};
use tiercache_metadata::codec::{self, META_BLOCK};
use tiercache_metadata::volume::{decode_volume_block, encode_volume_block, VolumeSlot};
use tiercache_metadata::{
    check, BackingIdentity, Entry, ErrorKind, FormatParams, MetadataStore, NewVolume, VolumeId,
    VolumeState,
};
use tiercache_types::CacheMode;

fn vol(name: &str, size_blocks: u64) -> NewVolume {
    NewVolume {
        name: name.into(),
        identity: BackingIdentity {
            size: size_blocks * u64::from(BS),
            path_hint: format!("/dev/{name}"),
            fingerprint: None,
        },
        mode: None,
        sequential_cutoff: None,
    }
}

fn pool_params(max_volumes: u32, volumes: Vec<NewVolume>) -> FormatParams {
    FormatParams {
        max_volumes: Some(max_volumes),
        volumes,
        ..params(8)
    }
}

fn e(volume: u16, oblock: u64, dirty: bool) -> Option<Entry> {
    Some(Entry {
        volume: VolumeId(volume),
        oblock,
        dirty,
        hint: 0,
        crc: None,
    })
}

#[test]
fn attach_validates_names_sizes_and_room() {
    let dev = mem(300, 8);
    let mut s = MetadataStore::format(dev.clone(), &pool_params(3, vec![vol("a", 10)])).unwrap();
    assert_eq!(s.attach(&vol("b", 10)).unwrap(), VolumeId(1));
    let dup = s.attach(&vol("a", 10)).unwrap_err();
    assert_eq!(dup.kind(), ErrorKind::InvalidArgument);
    assert!(dup.to_string().contains("already attached"), "{dup}");
    for bad in ["", "a b", "x/y", &"n".repeat(64)] {
        let err = s.attach(&vol(bad, 10)).unwrap_err().to_string();
        assert!(err.contains("volume name"), "{bad}: {err}");
    }
    assert!(s.attach(&vol("zero", 0)).is_err());
    assert_eq!(s.attach(&vol("c", 10)).unwrap(), VolumeId(2));
    let full = s.attach(&vol("d", 10)).unwrap_err().to_string();
    assert!(full.contains("full"), "{full}");
    // Duplicate names at format time are refused too.
    assert!(MetadataStore::format(dev, &pool_params(3, vec![vol("a", 1), vol("a", 2)])).is_err());
}

#[test]
fn records_need_an_attached_volume_and_stay_within_it() {
    let dev = mem(300, 8);
    let mut s = MetadataStore::format(dev, &pool_params(4, vec![vol("a", 10)])).unwrap();
    assert_eq!(
        s.record(0, e(1, 0, true)).unwrap_err().kind(),
        ErrorKind::NotAttached
    );
    assert_eq!(
        s.record(0, e(9, 0, true)).unwrap_err().kind(),
        ErrorKind::NotAttached
    );
    assert!(s.record(0, e(0, 10, true)).is_err(), "beyond volume a");
    s.record(0, e(0, 9, true)).unwrap();
    s.attach(&vol("b", 100)).unwrap();
    s.record(1, e(1, 99, false)).unwrap();
    s.commit().unwrap();
}

#[test]
fn detach_needs_the_volume_freed_and_reattach_gets_a_new_generation() {
    let dev = mem(300, 8);
    let mut s = MetadataStore::format(
        dev.clone(),
        &pool_params(4, vec![vol("a", 10), vol("b", 10)]),
    )
    .unwrap();
    assert_eq!(s.volume(VolumeId(0)).unwrap().generation, 1);
    s.record(3, e(0, 5, true)).unwrap();
    let err = s.detach(VolumeId(0)).unwrap_err().to_string();
    assert!(err.contains("1 buffered"), "{err}");
    s.commit().unwrap();
    let err = s.detach(VolumeId(0)).unwrap_err().to_string();
    assert!(err.contains("1 committed"), "{err}");
    s.set_volume_state(VolumeId(0), VolumeState::Detaching)
        .unwrap();
    // A detaching volume's blocks are still recorded (writeback marks
    // them clean).
    s.record(3, e(0, 5, false)).unwrap();
    s.record(3, None).unwrap();
    s.commit().unwrap();
    s.detach(VolumeId(0)).unwrap();
    assert!(s.volume(VolumeId(0)).is_none());
    assert_eq!(
        s.detach(VolumeId(0)).unwrap_err().kind(),
        ErrorKind::NotAttached
    );
    drop(s);
    // The free record keeps its generation across a reopen.
    let (mut s, rec) = MetadataStore::open(dev.clone()).unwrap();
    assert_eq!(rec.volumes[0], VolumeSlot::Free { last_generation: 1 });
    assert_eq!(s.attach(&vol("a2", 10)).unwrap(), VolumeId(0));
    assert_eq!(s.volume(VolumeId(0)).unwrap().generation, 2);
    s.set_volume_mode(VolumeId(1), CacheMode::WriteAround)
        .unwrap();
    s.set_volume_cutoff(VolumeId(1), Some(1 << 20)).unwrap();
    drop(s);
    let (_, rec) = MetadataStore::open(dev.clone()).unwrap();
    let b = rec.volume(VolumeId(1)).unwrap();
    assert_eq!(
        (b.mode, b.sequential_cutoff, b.state),
        (CacheMode::WriteAround, Some(1 << 20), VolumeState::Attached)
    );
    assert_eq!(rec.volume(VolumeId(0)).unwrap().name, "a2");
    assert!(check(&*dev).is_clean(), "{}", check(&*dev));
}

/// Rewrites the active volume table of `dev` with `edit` applied, sealed
/// as valid: what a bug, or an older table surviving somewhere, could
/// leave.
fn edit_table(dev: &dyn BlockDevice, edit: impl Fn(&mut Vec<VolumeSlot>)) {
    let mut buf = vec![0u8; 2 * META_BLOCK];
    dev.read_at(&mut buf, 0).unwrap();
    let sb = [0u64, 1]
        .iter()
        .filter_map(|&i| {
            codec::decode_superblock(&buf[i as usize * META_BLOCK..][..META_BLOCK], i).ok()
        })
        .max_by_key(|sb| sb.generation)
        .unwrap();
    let l = sb.layout;
    let first = l.volumes_start(sb.volumes_active);
    let mut blocks = vec![0u8; l.volume_blocks as usize * META_BLOCK];
    dev.read_at(&mut blocks, first * META_BLOCK as u64).unwrap();
    let mut table = Vec::new();
    for (i, b) in blocks.chunks(META_BLOCK).enumerate() {
        table.extend(decode_volume_block(b, first + i as u64).unwrap().slots);
    }
    edit(&mut table);
    for (i, out) in blocks.chunks_mut(META_BLOCK).enumerate() {
        let at = i * 15;
        let n = (table.len() - at).min(15);
        encode_volume_block(
            sb.uuid,
            sb.volumes_generation,
            first + i as u64,
            i as u32,
            &table[at..at + n],
            out,
        );
    }
    dev.write_at(&blocks, first * META_BLOCK as u64).unwrap();
}

#[test]
fn entries_of_another_generation_or_of_a_free_volume_are_stale() {
    let dev = mem(300, 8);
    let mut s = MetadataStore::format(
        dev.clone(),
        &pool_params(4, vec![vol("a", 10), vol("b", 10)]),
    )
    .unwrap();
    s.record(1, e(0, 1, true)).unwrap();
    s.record(2, e(1, 1, false)).unwrap();
    s.record(3, e(1, 2, true)).unwrap();
    s.commit().unwrap();
    drop(s);
    // Volume 0 attached again behind the entries' back (generation 2);
    // volume 1 freed.
    edit_table(&*dev, |t| {
        if let VolumeSlot::Used(r) = &mut t[0] {
            r.generation = 2;
        }
        t[1] = VolumeSlot::Free { last_generation: 1 };
    });
    let r = check(&*dev);
    assert_eq!(r.stale_entries, 3, "{r}");
    assert!(
        r.problems.iter().any(|p| p.message.contains("stale")),
        "{r}"
    );
    let (s, rec) = MetadataStore::open(dev.clone()).unwrap();
    assert_eq!(rec.stale_entries, 3);
    assert!(rec.mapping.iter().all(Option::is_none), "{:?}", rec.mapping);
    assert!(rec.warnings.iter().any(|w| w.contains("stale")));
    drop(s);
    // Open wrote them off: they are gone for good.
    let (_, rec) = MetadataStore::open(dev.clone()).unwrap();
    assert_eq!(rec.stale_entries, 0);
    assert!(check(&*dev).is_clean());
}

#[test]
fn duplicate_names_are_corruption_and_repair_renames() {
    let dev = mem(300, 8);
    let s = MetadataStore::format(
        dev.clone(),
        &pool_params(4, vec![vol("a", 10), vol("b", 10)]),
    )
    .unwrap();
    drop(s);
    edit_table(&*dev, |t| {
        if let VolumeSlot::Used(r) = &mut t[1] {
            r.name = "a".into();
        }
    });
    assert_eq!(
        MetadataStore::open(dev.clone()).unwrap_err().kind(),
        ErrorKind::Corrupt
    );
    let r = check(&*dev);
    assert!(
        r.problems.iter().any(|p| p
            .message
            .contains("volume name 'a' is used by several volumes")),
        "{r}"
    );
    let r = tiercache_metadata::repair(dev.clone()).unwrap();
    assert!(r.actions.iter().any(|a| a.contains("renamed")), "{r}");
    let (_, rec) = MetadataStore::open(dev.clone()).unwrap();
    assert_eq!(rec.volume(VolumeId(1)).unwrap().name, "dup1-a");
}

#[test]
fn a_damaged_volume_table_block_is_refused_and_reported() {
    let dev = mem(300, 8);
    let s = MetadataStore::format(dev.clone(), &pool_params(30, vec![vol("a", 10)])).unwrap();
    let first = s.layout().volumes_start(s.superblock().volumes_active);
    drop(s);
    let mut b = vec![0u8; META_BLOCK];
    dev.read_at(&mut b, (first + 1) * META_BLOCK as u64)
        .unwrap();
    b[100] ^= 1;
    dev.write_at(&b, (first + 1) * META_BLOCK as u64).unwrap();
    let err = MetadataStore::open(dev.clone()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("volume table"), "{err}");
    let r = check(&*dev);
    assert!(
        r.problems
            .iter()
            .any(|p| p.message.contains("volume-table block unreadable")),
        "{r}"
    );
}

// ---- The isolation property, by model ----

const NAMES: u8 = 5;
const MAXV: u32 = 3;
const OBLOCKS: u64 = 12;

#[derive(Clone, Debug)]
enum Op {
    Attach(u8),
    Record {
        slot: u32,
        volume: u16,
        oblock: u64,
        dirty: bool,
    },
    Free(u32),
    Commit,
    /// Free the volume's slots, commit, detach (the proper way).
    DetachFlow(u16),
    /// Detach without freeing: refused while the volume maps anything.
    DetachNow(u16),
    /// Drop the store (buffered records are lost) and reopen.
    Crash,
    /// Clean shutdown and reopen.
    Clean,
    /// Power cut after `budget` more writes and flushes during the next
    /// op, keeping a random subset of the unflushed blocks.
    Cut {
        budget: u8,
        seed: u64,
        op: Box<Op>,
    },
}

fn simple_op(slots: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..NAMES).prop_map(Op::Attach),
        8 => (0..slots, 0..MAXV as u16 + 1, 0..OBLOCKS, any::<bool>())
            .prop_map(|(slot, volume, oblock, dirty)| Op::Record { slot, volume, oblock, dirty }),
        2 => (0..slots).prop_map(Op::Free),
        4 => Just(Op::Commit),
        2 => (0..MAXV as u16).prop_map(Op::DetachFlow),
        1 => (0..MAXV as u16).prop_map(Op::DetachNow),
        1 => Just(Op::Crash),
        1 => Just(Op::Clean),
    ]
}

fn op(slots: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => simple_op(slots),
        2 => (0u8..12, any::<u64>(), prop_oneof![
            (0..NAMES).prop_map(Op::Attach),
            Just(Op::Commit),
            (0..MAXV as u16).prop_map(Op::DetachFlow),
        ])
            .prop_map(|(budget, seed, op)| Op::Cut { budget, seed, op: Box::new(op) }),
    ]
}

/// An entry of the model: volume, attachment epoch of the volume when it
/// was recorded (counted by the model, independently of the store),
/// origin block, dirty.
type MEntry = (u16, u32, u64, bool);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Durable {
    /// Per volume index: (name, epoch) when attached.
    vols: Vec<Option<(String, u32)>>,
    map: Vec<Option<MEntry>>,
}

impl Durable {
    /// Every entry belongs to the current attachment of its volume: the
    /// model's own invariant (the store is compared against it).
    fn assert_isolated(&self) {
        for me in self.map.iter().flatten() {
            let (v, epoch, _, _) = *me;
            assert_eq!(
                self.vols[v as usize].as_ref().map(|x| x.1),
                Some(epoch),
                "model entry {me:?} of a past attachment"
            );
        }
    }
}

struct Model {
    durable: Durable,
    /// Epochs handed out per index so far.
    epochs: Vec<u32>,
    pending: Vec<(u32, Option<MEntry>)>,
}

impl Model {
    fn effective(&self) -> Vec<Option<MEntry>> {
        let mut m = self.durable.map.clone();
        for &(slot, e) in &self.pending {
            m[slot as usize] = e;
        }
        m
    }
    fn committed(&self) -> Durable {
        Durable {
            vols: self.durable.vols.clone(),
            map: self.effective(),
        }
    }
    fn attach(&mut self, name: &str) -> Option<u16> {
        if self.durable.vols.iter().flatten().any(|(n, _)| n == name) {
            return None;
        }
        let id = self.durable.vols.iter().position(Option::is_none)?;
        self.epochs[id] += 1;
        self.durable.vols[id] = Some((name.to_string(), self.epochs[id]));
        Some(id as u16)
    }
}

/// What the store recovered, in the model's terms; fails if an entry's
/// volume is not attached.
fn view(
    rec: &tiercache_metadata::Recovered,
    candidates: &[&Durable],
) -> Result<Durable, TestCaseError> {
    let vols: Vec<Option<String>> = rec
        .volumes
        .iter()
        .map(|v| v.record().map(|r| r.name.clone()))
        .collect();
    for (slot, entry) in rec.mapping.iter().enumerate() {
        if let Some(en) = entry {
            prop_assert!(
                rec.volume(en.volume).is_some(),
                "slot {} returned for volume {} which is not attached",
                slot,
                en.volume
            );
        }
    }
    for c in candidates {
        let names: Vec<Option<String>> = c
            .vols
            .iter()
            .map(|v| v.as_ref().map(|x| x.0.clone()))
            .collect();
        let map: Vec<Option<Entry>> = c
            .map
            .iter()
            .map(|m| m.and_then(|(v, _, ob, d)| e(v, ob, d)))
            .collect();
        if names == vols && map == rec.mapping {
            return Ok((*c).clone());
        }
    }
    Err(TestCaseError::fail(format!(
        "recovered state is none of the allowed ones: volumes {vols:?}, mapped {:?}",
        rec.mapping
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|e| (i, e.volume.0, e.oblock, e.dirty)))
            .collect::<Vec<_>>()
    )))
}

fn run_ops(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let slots = 12usize;
    let crash = Arc::new(CrashDevice::new(device_size(300, 8)));
    let mut fa = Arc::new(FailAfter::new(crash.clone(), i64::MAX));
    let mut store = MetadataStore::format(fa.clone(), &pool_params(MAXV, vec![])).unwrap();
    let mut m = Model {
        durable: Durable {
            vols: vec![None; MAXV as usize],
            map: vec![None; store.layout().capacity as usize],
        },
        epochs: vec![0; MAXV as usize],
        pending: Vec::new(),
    };
    for op in ops {
        let (cut, op) = match op {
            Op::Cut { budget, seed, op } => (Some((budget, seed)), *op),
            op => (None, op),
        };
        // States a crash during this op may leave, besides the durable one
        // (`m.durable`, updated when the op succeeds).
        let mut allowed = vec![m.durable.clone()];
        if matches!(op, Op::Commit) {
            allowed.push(m.committed());
        }
        if let Some((budget, _)) = cut {
            fa.set_budget(i64::from(budget));
        }
        let mut failed = false;
        match &op {
            Op::Attach(n) => {
                let name = format!("vol-{n}");
                let want = m.clone_attach(&name);
                match store.attach(&vol(&name, OBLOCKS)) {
                    Ok(id) => {
                        prop_assert_eq!(Some(id.0), want.map(|(id, _)| id));
                        if m.epochs[id.index()] > 0 {
                            REATTACHES.fetch_add(1, Ordering::Relaxed);
                        }
                        m.attach(&name);
                    }
                    Err(err) if err.kind() == ErrorKind::Io => {
                        failed = true;
                        if let Some((_, d)) = want {
                            allowed.push(d);
                        }
                    }
                    Err(err) => prop_assert!(want.is_none(), "attach refused: {}", err),
                }
            }
            Op::Record {
                slot,
                volume,
                oblock,
                dirty,
            } => {
                let slot = slot % slots as u32;
                let eff = m.effective();
                // One slot per block of a volume (the engine's rule).
                let taken = eff.iter().enumerate().any(|(s, x)| {
                    s != slot as usize
                        && matches!(x, Some((v, _, ob, _)) if v == volume && ob == oblock)
                });
                if taken {
                    continue;
                }
                let r = store.record(slot, e(*volume, *oblock, *dirty));
                match m.durable.vols.get(*volume as usize).cloned().flatten() {
                    Some((_, epoch)) => {
                        prop_assert!(r.is_ok(), "{:?}", r);
                        if matches!(m.durable.map[slot as usize], Some((v, ep, ..)) if (v, ep) != (*volume, epoch))
                        {
                            SLOT_REUSE.fetch_add(1, Ordering::Relaxed);
                        }
                        m.pending
                            .push((slot, Some((*volume, epoch, *oblock, *dirty))));
                    }
                    None => prop_assert_eq!(r.unwrap_err().kind(), ErrorKind::NotAttached),
                }
            }
            Op::Free(slot) => {
                let slot = slot % slots as u32;
                store.record(slot, None).unwrap();
                m.pending.push((slot, None));
            }
            Op::Commit => match store.commit() {
                Ok(_) => {
                    m.durable = m.committed();
                    m.pending.clear();
                }
                Err(_) => failed = true,
            },
            Op::DetachFlow(v) => {
                if m.durable.vols[*v as usize].is_none() {
                    let r = store.detach(VolumeId(*v));
                    prop_assert!(
                        matches!(&r, Err(err) if err.kind() == ErrorKind::NotAttached),
                        "{:?}",
                        r
                    );
                } else {
                    let eff = m.effective();
                    for (s, x) in eff.iter().enumerate() {
                        if matches!(x, Some((xv, ..)) if xv == v) {
                            store.record(s as u32, None).unwrap();
                            m.pending.push((s as u32, None));
                        }
                    }
                    let freed = m.committed();
                    allowed.push(freed.clone());
                    let mut after = freed.clone();
                    after.vols[*v as usize] = None;
                    allowed.push(after.clone());
                    match store.commit().and_then(|_| store.detach(VolumeId(*v))) {
                        Ok(()) => {
                            m.durable = after;
                            m.pending.clear();
                        }
                        Err(err) => {
                            prop_assert_eq!(err.kind(), ErrorKind::Io, "{}", err);
                            failed = true;
                        }
                    }
                }
            }
            Op::DetachNow(v) => {
                let maps = m
                    .durable
                    .map
                    .iter()
                    .chain(m.pending.iter().map(|p| &p.1))
                    .any(|x| matches!(x, Some((xv, ..)) if xv == v));
                let attached = m.durable.vols[*v as usize].is_some();
                let r = store.detach(VolumeId(*v));
                prop_assert_eq!(r.is_ok(), attached && !maps, "{:?}", r);
                if r.is_ok() {
                    m.durable.vols[*v as usize] = None;
                }
            }
            Op::Crash | Op::Clean => {}
            Op::Cut { .. } => unreachable!("cuts are not nested"),
        }
        let reopen = cut.is_some() || failed || matches!(op, Op::Crash | Op::Clean);
        if !reopen {
            continue;
        }
        if matches!(op, Op::Clean) {
            // The committed mapping; buffered records are dropped.
            let fin = store.mapping();
            check_fin(&m, &fin);
            store.mark_clean_shutdown(&fin, &[]).unwrap();
        } else {
            drop(store);
        }
        match cut {
            Some((_, seed)) => {
                fa.crash_keep_blocks(seed);
            }
            None => {
                crash.crash();
            }
        }
        fa = Arc::new(FailAfter::new(crash.clone(), i64::MAX));
        let (s, rec) = MetadataStore::open(fa.clone())
            .map_err(|err| TestCaseError::fail(format!("open after {op:?}: {err}")))?;
        prop_assert_eq!(
            rec.stale_entries,
            0,
            "the protocol never leaves stale entries"
        );
        let mut cands: Vec<&Durable> = vec![&m.durable];
        cands.extend(allowed.iter());
        let got = view(&rec, &cands)?;
        REOPENS.fetch_add(1, Ordering::Relaxed);
        if cut.is_some() && got != m.durable {
            CUT_STATES.fetch_add(1, Ordering::Relaxed);
        }
        got.assert_isolated();
        // The store's generations count attachments as the model's epochs.
        for (i, v) in got.vols.iter().enumerate() {
            if let Some((_, epoch)) = v {
                prop_assert_eq!(
                    rec.volume(VolumeId(i as u16))
                        .map(|r| u32::from(r.generation)),
                    Some(*epoch)
                );
                m.epochs[i] = m.epochs[i].max(*epoch);
            }
        }
        m.durable = got;
        m.pending.clear();
        store = s;
        let r = check(&*crash);
        prop_assert!(r.is_clean(), "{}", r);
    }
    Ok(())
}

/// The store's committed mapping is the model's durable one.
fn check_fin(m: &Model, fin: &[Option<Entry>]) {
    for (me, f) in m.durable.map.iter().zip(fin) {
        assert_eq!(
            me.map(|(v, _, ob, d)| (v, ob, d)),
            f.map(|f| (f.volume.0, f.oblock, f.dirty))
        );
    }
}

impl Model {
    /// The id and committed state an attach of `name` would give, without
    /// changing the model.
    fn clone_attach(&self, name: &str) -> Option<(u16, Durable)> {
        let mut c = Model {
            durable: self.durable.clone(),
            epochs: self.epochs.clone(),
            pending: self.pending.clone(),
        };
        let id = c.attach(name)?;
        // An attach writes the table only; buffered records stay buffered.
        Some((id, c.durable))
    }
}

static REOPENS: AtomicU64 = AtomicU64::new(0);
static CUT_STATES: AtomicU64 = AtomicU64::new(0);
static REATTACHES: AtomicU64 = AtomicU64::new(0);
static SLOT_REUSE: AtomicU64 = AtomicU64::new(0);

/// Random attach / record / commit / detach (after freeing) / re-attach
/// of the same index / crash / power cut sequences against a model: every
/// recovered entry belongs to an attached volume and was recorded for it
/// during its current attachment.
#[test]
fn blocks_never_cross_volumes_or_attachments() {
    let cases = std::env::var("VOLUME_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(op(12), 1..60), run_ops)
        .unwrap();
    let (reopens, cut, reattach, reuse) = (
        REOPENS.load(Ordering::Relaxed),
        CUT_STATES.load(Ordering::Relaxed),
        REATTACHES.load(Ordering::Relaxed),
        SLOT_REUSE.load(Ordering::Relaxed),
    );
    eprintln!(
        "isolation cases: {cases}, reopens: {reopens}, reopened into a cut operation's partial \
         or whole state: {cut}, re-attaches of a used index: {reattach}, slots reused by \
         another volume or attachment: {reuse}"
    );
    assert!(reopens > 0 && cut > 0 && reattach > 0 && reuse > 0);
}
