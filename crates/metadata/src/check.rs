//! Offline consistency check and repair.

use crate::codec::{claim_len, content_crc, unpack, Entry, PackedEntry, Superblock, FREE_ENTRY};
use crate::error::{MetadataError, Result};
use crate::layout::{Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
use crate::read::{
    check_features, choose_superblock, drop_stale, entries_in_block, find_conflicts, read_snapshot,
    read_superblocks, read_volume_table, replay_journal, scan_beyond, Beyond,
};
use crate::store::MetadataStore;
use crate::volume::{duplicate_names, VolumeSlot, MAX_NAME_LEN};
use std::fmt;
use std::sync::Arc;
use tiercache_device::BlockDevice;
use tiercache_types::VolumeId;

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Expected after a crash; `open` handles it.
    Info,
    /// Damage `open` tolerates, or that may hide lost work.
    Warning,
    /// `open` refuses the device, or data may be lost.
    Error,
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// The metadata block (4 KiB units) concerned, if one is.
    pub block: Option<u64>,
    pub message: String,
}

/// What `check` or `repair` found (and did).
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub problems: Vec<Problem>,
    /// The superblock used, if one was valid.
    pub superblock: Option<Superblock>,
    /// The volume table read (bad blocks read as free records).
    pub volumes: Vec<VolumeSlot>,
    /// Entries of volumes that are not attached, or of an earlier
    /// attachment of their index: the next open drops them (after
    /// `repair`: the ones it dropped).
    pub stale_entries: u64,
    /// Mapped slots and dirty slots in the recovered mapping (after repair,
    /// in the repaired one).
    pub entries: u64,
    pub dirty_entries: u64,
    /// Clean entries that carry a content crc (verifiable after a crash).
    pub clean_with_crc: u64,
    /// Clean claims whose slot content does not match their crc (or could
    /// not be read), ascending; only filled when the claims were verified
    /// ([`CheckOptions::verify_clean_claims`]). After `repair`: the claims
    /// it withdrew.
    pub stale_clean_claims: Vec<u32>,
    pub journal_blocks_replayed: u64,
    /// What repair changed (empty for `check`).
    pub actions: Vec<String>,
}

impl Report {
    /// No warnings or errors (informational findings are allowed).
    pub fn is_clean(&self) -> bool {
        self.problems.iter().all(|p| p.severity == Severity::Info)
    }

    /// The worst severity found.
    pub fn worst(&self) -> Option<Severity> {
        self.problems.iter().map(|p| p.severity).max()
    }

    fn push(&mut self, severity: Severity, block: Option<u64>, message: impl Into<String>) {
        self.problems.push(Problem {
            severity,
            block,
            message: message.into(),
        });
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.superblock {
            Some(sb) => writeln!(
                f,
                "cache: {} slots of {} bytes, {} of {} volumes attached, default mode {}, generation {}, snapshot {} ({:?}), {} mapped ({} dirty, {} clean with a crc), {} journal blocks replayed",
                sb.layout.capacity,
                sb.layout.block_size,
                self.volumes.iter().filter(|v| v.record().is_some()).count(),
                sb.layout.max_volumes,
                sb.mode,
                sb.generation,
                sb.snapshot_seq,
                sb.active,
                self.entries,
                self.dirty_entries,
                self.clean_with_crc,
                self.journal_blocks_replayed
            )?,
            None => writeln!(f, "cache: no valid superblock")?,
        }
        for (i, v) in self.volumes.iter().enumerate() {
            if let Some(r) = v.record() {
                writeln!(
                    f,
                    "volume {i}: '{}', {} bytes, {:?}, mode {}, generation {}",
                    r.name, r.size, r.state, r.mode, r.generation
                )?;
            }
        }
        if self.problems.is_empty() {
            writeln!(f, "no problems found")?;
        }
        for p in &self.problems {
            match p.block {
                Some(b) => writeln!(f, "{:?}: block {b}: {}", p.severity, p.message)?,
                None => writeln!(f, "{:?}: {}", p.severity, p.message)?,
            }
        }
        for a in &self.actions {
            writeln!(f, "repaired: {a}")?;
        }
        Ok(())
    }
}

/// Everything a lenient read of the device recovered.
struct Scan {
    report: Report,
    sb: Superblock,
    table: Vec<VolumeSlot>,
    map: Vec<PackedEntry>,
    /// Per slot: sequence of the commit that last set it (0: the snapshot).
    updated: Vec<u64>,
    /// Highest journal sequence seen anywhere in the ring (for a new epoch).
    max_seq: u64,
}

fn scan(dev: &dyn BlockDevice, writing: bool) -> Result<Scan> {
    let device = dev.describe();
    let mut report = Report::default();
    let copies = read_superblocks(dev)?;
    let (sb, block, warnings) = choose_superblock(&device, &copies)?;
    for w in warnings {
        report.push(Severity::Warning, Some(1 - block), w);
    }
    check_features(&device, &sb, writing)?;
    report.superblock = Some(sb.clone());
    let l = sb.layout;
    if dev.size() < l.required_device_size() {
        report.push(
            Severity::Error,
            Some(block),
            format!(
                "the device has {} bytes but the layout needs {}",
                dev.size(),
                l.required_device_size()
            ),
        );
        return Err(MetadataError::corrupt(
            "cache device smaller than its layout",
            block,
        ));
    }
    if sb.clean_shutdown {
        report.push(Severity::Info, None, "last shutdown was clean");
    } else {
        report.push(
            Severity::Info,
            None,
            "last shutdown was not clean (or the cache is in use)",
        );
    }

    let mut bad_table = Vec::new();
    let table = read_volume_table(
        dev,
        &sb,
        Some(&mut |block, why| bad_table.push((block, why))),
    )?;
    for (block, why) in bad_table {
        report.push(
            Severity::Error,
            Some(block),
            format!(
                "volume-table block unreadable ({why}): its volumes read as not attached, so \
                 their cache entries are dropped as stale"
            ),
        );
    }
    for (name, ids) in duplicate_names(&table) {
        report.push(
            Severity::Error,
            Some(l.volumes_start(sb.volumes_active)),
            format!("volume name '{name}' is used by several volumes: {ids:?}"),
        );
    }
    report.volumes = table.clone();

    let mut bad_blocks = Vec::new();
    let mut map = read_snapshot(
        dev,
        &sb,
        Some(&mut |block, index, why| bad_blocks.push((block, index, why))),
    )?;
    if !bad_blocks.is_empty() {
        // Slots of unreadable snapshot blocks are lost unless the journal
        // sets them again. Say what the previous snapshot had there.
        let mut older = sb.clone();
        older.active = sb.active.other();
        older.snapshot_seq = sb.snapshot_seq.wrapping_sub(1);
        let prev = read_snapshot(dev, &older, Some(&mut |_, _, _| {})).ok();
        for (block, index, why) in bad_blocks {
            let first = index as usize * SNAPSHOT_ENTRIES_PER_BLOCK;
            let count = entries_in_block(l.capacity, index);
            let prev_dirty = prev.as_ref().map(|p| {
                p[first..first + count]
                    .iter()
                    .filter(|&&w| matches!(unpack(w), Ok(Some(e)) if e.dirty))
                    .count()
            });
            report.push(
                Severity::Error,
                Some(block),
                format!(
                    "snapshot block {index} unreadable ({why}): slots {first}..{} are lost unless \
                     the journal maps them again{}",
                    first + count,
                    match prev_dirty {
                        Some(n) if n > 0 => format!(
                            "; the previous snapshot had {n} dirty slots there (not trusted: they may be stale)"
                        ),
                        _ => String::new(),
                    }
                ),
            );
        }
    }

    let mut updated = vec![0u64; l.capacity as usize];
    let replay = replay_journal(dev, &sb, &mut map, false, |seq, slot| {
        updated[slot as usize] = seq;
    })?;
    report.journal_blocks_replayed = replay.blocks;
    if let Some((block, why)) = &replay.corrupt {
        report.push(
            Severity::Error,
            Some(*block),
            format!("journal ends at an impossible block: {why}"),
        );
    }
    if replay.discarded > 0 {
        report.push(
            Severity::Info,
            None,
            format!(
                "the last {} journal blocks form an incomplete commit (torn by a crash, never acknowledged); ignored",
                replay.discarded
            ),
        );
    }

    // Journal gaps: valid blocks of this cache and epoch beyond the end of
    // the log.
    let gap = replay.end_seq + replay.discarded;
    let (beyond, max_seq) = scan_beyond(dev, &sb, gap)?;
    let max_seq = max_seq.max(replay.end_seq);
    // Commits run one at a time, each flushed before the next starts: a
    // block of a commit that started after the gap proves the gap block
    // was once durable (acknowledged) and has since been lost. Blocks of
    // the commit that spans the gap are a commit torn by a crash.
    let (later, torn): (Vec<&Beyond>, Vec<&Beyond>) = beyond.iter().partition(|b| b.later);
    if !torn.is_empty() {
        report.push(
            Severity::Warning,
            Some(torn[0].block),
            format!(
                "journal gap: the log ends at sequence {gap} but {} later blocks of the commit \
                 in progress there exist (first: sequence {}): a commit torn by a crash, never \
                 acknowledged",
                torn.len(),
                torn[0].seq
            ),
        );
    }
    if !later.is_empty() {
        let dirty: usize = later.iter().map(|b| b.dirty_records).sum();
        report.push(
            Severity::Error,
            Some(l.journal_block_of(gap)),
            format!(
                "journal gap: block at sequence {gap} is lost, but {} blocks of later \
                 (acknowledged) commits follow it (first: sequence {}); their updates cannot be \
                 replayed safely and are lost, including {dirty} records that mark slots dirty",
                later.len(),
                later[0].seq
            ),
        );
    }

    let stale = drop_stale(&table, &mut map);
    report.stale_entries = stale.len() as u64;
    if !stale.is_empty() {
        report.push(
            Severity::Warning,
            None,
            format!(
                "{} cache entries belong to volumes that are not attached, or to an earlier \
                 attachment of their volume index (first: slot {}): stale, never served; the \
                 next start drops them",
                stale.len(),
                stale[0]
            ),
        );
    }

    Ok(Scan {
        report,
        sb,
        table,
        map,
        updated,
        max_seq,
    })
}

fn count(report: &mut Report, map: &[PackedEntry]) {
    report.entries = 0;
    report.dirty_entries = 0;
    report.clean_with_crc = 0;
    for &w in map {
        if let Ok(Some(e)) = unpack(w) {
            report.entries += 1;
            report.dirty_entries += u64::from(e.dirty);
            report.clean_with_crc += u64::from(!e.dirty && e.crc.is_some());
        }
    }
}

/// After an unclean shutdown, clean entries without a crc cannot be
/// verified: the next start drops them.
fn uncrced_note(scan: &mut Scan) {
    if scan.sb.clean_shutdown {
        return;
    }
    let n = scan
        .map
        .iter()
        .filter(|&&w| matches!(unpack(w), Ok(Some(e)) if !e.dirty && e.crc.is_none()))
        .count();
    if n > 0 {
        scan.report.push(
            Severity::Info,
            None,
            format!(
                "{n} clean entries carry no crc: trusted only after a clean shutdown, so the \
                 next start drops them"
            ),
        );
    }
}

fn conflict_problems(scan: &mut Scan) {
    let l = scan.sb.layout;
    let c = find_conflicts(&scan.map, &scan.table, l.block_size);
    let snap_block = |slot: u32| {
        l.area_start(scan.sb.active) + u64::from(slot) / SNAPSHOT_ENTRIES_PER_BLOCK as u64
    };
    for ((volume, oblock), slots) in &c.duplicates {
        scan.report.push(
            Severity::Error,
            Some(snap_block(slots[0])),
            format!("block {oblock} of volume {volume} is mapped by several slots: {slots:?}"),
        );
    }
    for &slot in &c.beyond {
        scan.report.push(
            Severity::Error,
            Some(snap_block(slot)),
            format!("slot {slot} maps an origin block beyond the end of its volume"),
        );
    }
}

/// Reads the whole metadata of `dev` without writing and lists every
/// problem: damaged superblock copies, snapshot blocks with bad crcs or of
/// the wrong snapshot, journal gaps, origin blocks mapped twice, origin
/// blocks beyond the backing device.
///
/// A device that cannot be read at all (not formatted, unsupported version
/// or features, no valid superblock, IO errors) gives a report with one
/// `Error` problem and no superblock.
///
/// Reads the metadata only; [`check_with`] can also verify the clean
/// claims against the data area.
pub fn check(dev: &dyn BlockDevice) -> Report {
    check_with(dev, &CheckOptions::default())
}

/// [`check`], and with `options.verify_clean_claims` also reads every slot
/// a clean entry with a crc claims: claims whose content does not match
/// are listed in [`Report::stale_clean_claims`] and reported as a note
/// (`Info`: the next start after an unclean shutdown drops them anyway) or,
/// when the last shutdown was clean (the next start trusts clean claims),
/// as a `Warning`. Unreadable slots are a `Warning`.
pub fn check_with(dev: &dyn BlockDevice, options: &CheckOptions) -> Report {
    match scan(dev, false) {
        Ok(mut s) => {
            conflict_problems(&mut s);
            count(&mut s.report, &s.map);
            uncrced_note(&mut s);
            if options.verify_clean_claims {
                report_claims(dev, &mut s);
            }
            s.report
        }
        Err(e) => {
            let mut r = Report::default();
            let block = match &e {
                MetadataError::Corrupt { block, .. } => Some(*block),
                _ => None,
            };
            r.push(Severity::Error, block, e.to_string());
            r
        }
    }
}

/// Salvages what is consistent and rewrites a fresh snapshot and both
/// superblock copies, so that `open` accepts the device.
///
/// Rules: every readable entry is kept, dirty ones above all. When several
/// slots claim one origin block, a dirty slot wins over clean ones (the
/// most recently committed dirty slot if several are dirty, reported as an
/// error since the others' data is given up); clean claimants are
/// dropped. Entries beyond the backing device are dropped (reported as
/// errors when dirty: their data has nowhere to go). Unreadable snapshot
/// blocks lose their slots (reported). The journal is replayed as `open`
/// would; a new journal epoch starts past every sequence seen.
///
/// Clean claims whose slot content does not match their crc, or whose slot
/// cannot be read, are withdrawn (always safe: the backing device has
/// their data); dirty entries are never dropped for their content. This
/// reads every slot a clean entry with a crc claims; [`repair_with`] can
/// skip it.
///
/// Refuses (returns an error) when no superblock is valid, or when the
/// format version or feature bits are unknown.
pub fn repair(dev: Arc<dyn BlockDevice>) -> Result<Report> {
    repair_with(
        dev,
        &CheckOptions {
            verify_clean_claims: true,
        },
    )
}

/// [`repair`], verifying and withdrawing stale clean claims only with
/// `options.verify_clean_claims`.
pub fn repair_with(dev: Arc<dyn BlockDevice>, options: &CheckOptions) -> Result<Report> {
    let mut s = scan(&*dev, true)?;
    conflict_problems(&mut s);
    let l = s.sb.layout;
    let c = find_conflicts(&s.map, &s.table, l.block_size);
    let mut actions = Vec::new();
    if s.report.stale_entries > 0 {
        actions.push(format!(
            "dropped {} stale entries (volume not attached, or an earlier attachment)",
            s.report.stale_entries
        ));
    }
    // Names must be unique: later holders of a name are renamed.
    for (name, ids) in duplicate_names(&s.table) {
        for id in &ids[1..] {
            if let VolumeSlot::Used(r) = &mut s.table[id.index()] {
                let mut new = format!("dup{}-{name}", id.0);
                new.truncate(MAX_NAME_LEN);
                actions.push(format!(
                    "volume {id}: renamed '{name}' (also used by {}) to '{new}'",
                    ids[0]
                ));
                r.name = new;
            }
        }
    }
    for &slot in &c.beyond {
        let e = unpack(s.map[slot as usize]).ok().flatten();
        if let Some(e) = e {
            actions.push(format!(
                "dropped slot {slot} (origin block {} beyond the backing device{})",
                e.oblock,
                if e.dirty {
                    "; it was DIRTY: its data cannot be written anywhere"
                } else {
                    ""
                }
            ));
        }
        s.map[slot as usize] = FREE_ENTRY;
    }
    for ((volume, oblock), slots) in &c.duplicates {
        if slots.iter().any(|sl| c.beyond.contains(sl)) {
            continue; // already dropped above
        }
        let dirty: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|&sl| matches!(unpack(s.map[sl as usize]), Ok(Some(e)) if e.dirty))
            .collect();
        let keep = if dirty.is_empty() {
            // All clean: any one is correct; keep the most recently set.
            *slots
                .iter()
                .max_by_key(|&&sl| (s.updated[sl as usize], sl))
                .expect("duplicates have two slots")
        } else {
            *dirty
                .iter()
                .max_by_key(|&&sl| (s.updated[sl as usize], sl))
                .expect("non-empty")
        };
        for &sl in slots {
            if sl != keep {
                let was_dirty = dirty.contains(&sl);
                if was_dirty {
                    s.report.push(
                        Severity::Error,
                        None,
                        format!(
                            "block {oblock} of volume {volume}: slots {dirty:?} are all dirty; kept \
                             slot {keep} (most recently committed), gave up the dirty data in slot {sl}"
                        ),
                    );
                }
                actions.push(format!(
                    "block {oblock} of volume {volume}: dropped {} slot {sl}, kept slot {keep}",
                    if was_dirty { "DIRTY" } else { "clean" }
                ));
                s.map[sl as usize] = FREE_ENTRY;
            }
        }
    }
    if options.verify_clean_claims {
        // After the conflicts: slots dropped above need no reading.
        let v = report_claims(&*dev, &mut s);
        for &slot in &v.stale() {
            debug_assert!(matches!(unpack(s.map[slot as usize]), Ok(Some(e)) if !e.dirty));
            s.map[slot as usize] = FREE_ENTRY;
        }
        if !v.mismatched.is_empty() {
            actions.push(format!(
                "withdrew {} stale clean claims (content does not match the claim's crc)",
                v.mismatched.len()
            ));
        }
        if !v.unreadable.is_empty() {
            actions.push(format!(
                "withdrew {} clean claims on unreadable slots",
                v.unreadable.len()
            ));
        }
    }
    // New snapshot and both superblock copies, journal epoch past anything
    // seen.
    let next = s.max_seq.max(s.sb.journal_start_seq + l.journal_blocks) + 1;
    let store =
        MetadataStore::rewrite_for_repair(dev, s.sb.clone(), s.table.clone(), s.map.clone(), next)?;
    s.report.volumes = s.table.clone();
    actions.push(format!(
        "wrote snapshot {} and superblock generations {} and {}; journal restarts at sequence {next}",
        store.superblock().snapshot_seq,
        store.superblock().generation - 1,
        store.superblock().generation
    ));
    s.report.actions = actions;
    s.report.superblock = Some(store.superblock().clone());
    count(&mut s.report, &s.map);
    Ok(s.report)
}

/// What [`check_with`] and [`repair_with`] do beyond reading the metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Read every slot that a clean entry with a crc claims and compare
    /// the content's crc32c ([`verify_clean_claims`]). Reads up to the
    /// whole data area.
    pub verify_clean_claims: bool,
}

/// The outcome of [`verify_clean_claims`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimVerification {
    /// Clean claims with a crc that were read and compared.
    pub checked: u64,
    /// Slots whose content does not match the claim's crc, ascending.
    pub mismatched: Vec<u32>,
    /// Slots that could not be read (IO error), ascending.
    pub unreadable: Vec<u32>,
}

impl ClaimVerification {
    /// Every slot whose clean claim cannot be trusted (mismatched or
    /// unreadable), ascending. Dropping them is always safe: a clean
    /// claim's data is also on the backing device.
    pub fn stale(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .mismatched
            .iter()
            .chain(&self.unreadable)
            .copied()
            .collect();
        v.sort_unstable();
        v
    }
}

/// Bytes read per IO when verifying runs of adjacent claimed slots.
const VERIFY_RUN_BYTES: u64 = 4 << 20;

/// Verifies the clean claims of `mapping` against the slot content on
/// `dev`: for every clean entry with a crc, reads slot `slot` at
/// `layout.data_offset + slot * block_size` and compares
/// [`content_crc`] of its first [`claim_len`] bytes (the whole block, or
/// the part of its volume's short last block that exists; sizes from
/// `volumes`, the volume table). Dirty entries, clean entries without a
/// crc and entries of volumes not in `volumes` are not read. Adjacent
/// claimed slots are read together, in slot order.
///
/// A read error does not stop the verification: the slots of the failed
/// read are retried one by one, and those that still fail are listed as
/// unreadable.
pub fn verify_clean_claims(
    dev: &dyn BlockDevice,
    layout: &Layout,
    volumes: &[VolumeSlot],
    mapping: &[Option<Entry>],
) -> ClaimVerification {
    verify_claims(
        dev,
        layout,
        mapping.iter().enumerate().filter_map(|(slot, e)| {
            let e = e.as_ref()?;
            let size = volume_size(volumes, e.volume)?;
            Some((slot as u32, e.oblock, e.crc?, size)).filter(|_| !e.dirty)
        }),
    )
}

fn volume_size(volumes: &[VolumeSlot], v: VolumeId) -> Option<u64> {
    Some(volumes.get(v.index())?.record()?.size)
}

/// [`verify_clean_claims`] over the packed mapping.
fn verify_packed(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    table: &[VolumeSlot],
    map: &[PackedEntry],
) -> ClaimVerification {
    verify_claims(
        dev,
        &sb.layout,
        map.iter()
            .enumerate()
            .filter_map(|(slot, &w)| match unpack(w) {
                Ok(Some(Entry {
                    volume,
                    oblock,
                    dirty: false,
                    crc: Some(crc),
                    ..
                })) => Some((slot as u32, oblock, crc, volume_size(table, volume)?)),
                _ => None,
            }),
    )
}

/// `claims`: (slot, origin block, crc, volume size), slots ascending.
fn verify_claims(
    dev: &dyn BlockDevice,
    layout: &Layout,
    claims: impl Iterator<Item = (u32, u64, u32, u64)>,
) -> ClaimVerification {
    let bs = u64::from(layout.block_size);
    let run_max = (VERIFY_RUN_BYTES / bs).max(1) as usize;
    let mut out = ClaimVerification::default();
    let mut buf = vec![0u8; run_max * bs as usize];
    let mut run: Vec<(u32, u64, u32, u64)> = Vec::with_capacity(run_max);
    let mut flush_run = |run: &mut Vec<(u32, u64, u32, u64)>, out: &mut ClaimVerification| {
        let Some(&(first, _, _, _)) = run.first() else {
            return;
        };
        let len = run.len() * bs as usize;
        let at = |slot: u32| layout.data_offset + u64::from(slot) * bs;
        let whole = dev.read_at(&mut buf[..len], at(first)).is_ok();
        for (i, &(slot, oblock, crc, backing_size)) in run.iter().enumerate() {
            let block = &mut buf[i * bs as usize..(i + 1) * bs as usize];
            if !whole && dev.read_at(block, at(slot)).is_err() {
                out.unreadable.push(slot);
                continue;
            }
            out.checked += 1;
            let n = claim_len(layout.block_size, backing_size, oblock);
            if content_crc(&block[..n]) != crc {
                out.mismatched.push(slot);
            }
        }
        run.clear();
    };
    for claim in claims {
        if claim.0 >= layout.capacity {
            continue; // not a slot of this layout: nothing to read
        }
        let adjacent = run
            .last()
            .is_some_and(|&(last, _, _, _)| last + 1 == claim.0);
        if !adjacent || run.len() == run_max {
            flush_run(&mut run, &mut out);
        }
        run.push(claim);
    }
    flush_run(&mut run, &mut out);
    out
}

/// Reports the verification of the clean claims of `scan`; returns it.
fn report_claims(dev: &dyn BlockDevice, scan: &mut Scan) -> ClaimVerification {
    let v = verify_packed(dev, &scan.sb, &scan.table, &scan.map);
    let list = |slots: &[u32]| {
        let shown: Vec<String> = slots.iter().take(10).map(u32::to_string).collect();
        format!(
            "{}{}",
            shown.join(", "),
            if slots.len() > 10 { ", ..." } else { "" }
        )
    };
    if !v.mismatched.is_empty() {
        let (severity, consequence) = if scan.sb.clean_shutdown {
            (
                Severity::Warning,
                "the last shutdown was clean, so the next start trusts them and would serve \
                 this content; `repair` withdraws them",
            )
        } else {
            (
                Severity::Info,
                "would be dropped at start (the last shutdown was not clean); `repair` \
                 withdraws them",
            )
        };
        scan.report.push(
            severity,
            None,
            format!(
                "{} stale clean claims (slot content does not match the claim's crc): slots {}; {consequence}",
                v.mismatched.len(),
                list(&v.mismatched)
            ),
        );
    }
    if !v.unreadable.is_empty() {
        scan.report.push(
            Severity::Warning,
            None,
            format!(
                "{} clean-claimed slots could not be read from the data area: slots {}; \
                 `repair` withdraws their claims",
                v.unreadable.len(),
                list(&v.unreadable)
            ),
        );
    }
    scan.report.stale_clean_claims = v.stale();
    v
}
