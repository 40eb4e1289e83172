//! Which misses are worth a fill: the default's gate on flash writes.
//!
//! S3-FIFO fills every miss into its small FIFO, and most of those blocks
//! leave it unhit: on the write-heavy traces of the policy panel a class
//! of requests (say, writes of 4 to 15 blocks on 1and1-linux-mysql at
//! 4 KiB) fills ~100k blocks of which under 1% are ever hit. Each such fill
//! is a write to the cache device for nothing, and it pushes a block that
//! might have been hit out of the small FIFO sooner.
//!
//! So the default measures, per [`RequestClass`] (read or write, the
//! request's length in blocks in five buckets, and whether it starts
//! where its volume's previous request ended), the share of its fills
//! that are hit at least once before they leave the cache, its **yield**.
//! A miss of a class whose yield is below [`FILL_YIELD_FLOOR`] is not
//! filled once the cache is full: the block goes to the ghost instead, as
//! if it had passed through the small FIFO unhit (`Adaptive::declines_fill`),
//! so that a second miss of it while the ghost remembers it is filled
//! into main, exactly as S3-FIFO would have. What the gate gives up is only
//! the hits such blocks would have had in the small FIFO, which the yield
//! bounds; a block reused later than that is not lost.
//!
//! The yield is measured on **explorers**: blocks picked by a hash (a
//! share of them, so that about [`EXPLORERS_RESIDENT`] are resident
//! whatever the cache size, at most one in 8), which are always filled,
//! so a class stays measured while it is gated and is let back in when its
//! yield recovers. An explorer's fill is counted when it is made and its
//! first hit when it comes (counting at eviction instead would see the
//! unhit leave first and the hit stay, and underrate every class while the
//! cache turns over: measured, it gated the 50% caches of arc-P6 and a
//! CloudPhysics trace into up to 0.6 points more misses). A class is gated
//! only when its yield is below the floor beyond noise ([`GATE_Z`]).
//!
//! Contract: no IO, no clock; the caller tells it of every fill, hit and
//! departure of a resident block. RAM: a table of [`TABLE_SLOTS`] 32-bit
//! words (8 KiB) for the explorers not yet hit, whatever the cache size.

use tiercache_types::{Access, OriginBlock};

/// Fills of a class that must be hit at least once, on average, for its
/// misses to be filled: one in 32. Measured on the panel and its five
/// hold-outs (docs/BENCHMARKS.md, session 58): 1/128 to 1/32 keep 83 to 84
/// of 90 cells within half a point of the best simple policy; 1/64 and up
/// gate most of 1and1-linux-mysql's and tencent-cbs-sample's writes.
pub const FILL_YIELD_FLOOR: f64 = 1.0 / 32.0;

/// A class is gated only when its first hits, plus this many standard
/// deviations, stay below the floor: with none seen, after 64 fills.
pub const GATE_Z: f64 = 2.0;

/// Resident explorers aimed at: the sampling rate is one in the power of
/// two nearest above `capacity / EXPLORERS_RESIDENT`, at most one in 8.
/// Fewer decide worse on a short trace: with 136 (one in 256) the gate
/// cost tencent-cbs-sample at 4 KiB and 10% 0.2 points more than with
/// ~1,000.
pub const EXPLORERS_RESIDENT: u32 = 1024;

/// Slots of the explorer table (a power of two), and the explorers it
/// tracks at most (7/8 of them).
pub const TABLE_SLOTS: usize = 2048;
const TABLE_MAX: usize = TABLE_SLOTS * 7 / 8;

/// Number of request classes.
pub const CLASSES: usize = 20;
/// Bits of an explorer table word that hold its class.
const CLASS_BITS: u32 = 5;
const CLASS_MASK: u32 = (1 << CLASS_BITS) - 1;
const _: () = assert!(CLASSES <= 1 << CLASS_BITS && CLASSES <= u32::BITS as usize);

/// What a request is, for the gate: read or write, its length in blocks
/// (1, 2-3, 4-15, 16-63, 64 or more), and whether it continues its
/// volume's previous request (starts at the byte where that one ended).
/// A log's appends and a file's sequential rewrite are read back
/// differently from scattered requests of the same length, so a class
/// mixing them is gated or filled as a whole. Split by continuation, the
/// gate filled the part worth it on libCacheSim's CloudPhysics trace: 2%
/// more fills at 4 KiB (still 27% fewer than S3-FIFO) and its mean gap to
/// the best simple policy from +0.68 to +0.55 points (docs/BENCHMARKS.md,
/// session 59).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestClass(u8);

impl RequestClass {
    pub fn of(access: Access, blocks: u64, continues: bool) -> Self {
        let bucket = match blocks {
            0..=1 => 0,
            2..=3 => 1,
            4..=15 => 2,
            16..=63 => 3,
            _ => 4,
        };
        RequestClass(bucket * 4 + u8::from(access == Access::Write) * 2 + u8::from(continues))
    }

    fn index(self) -> usize {
        self.0 as usize
    }
}

/// The gate: explorers, and per class their fills and first hits.
#[derive(Clone, Debug)]
pub struct FillGate {
    /// A block explores when `explore_hash(o) & mask == 0`.
    mask: u64,
    /// The explorers filled and not yet hit.
    unhit: ExplorerTable,
    fills: [u64; CLASSES],
    first_hits: [u64; CLASSES],
    /// Bit `c` set: class `c` is gated (kept by [`FillGate::judge`]).
    gated: u32,
}

/// The explorers' hash (splitmix64 finaliser, its own seed).
#[inline]
fn explore_hash(o: u64) -> u64 {
    crate::seeded_hash::seeded_hash(o, 0x0F11_6A7E_5EED_0001)
}

impl FillGate {
    pub fn new(capacity: u32) -> Self {
        let per_explorer = (capacity / EXPLORERS_RESIDENT).max(1);
        let mask = u64::from(per_explorer.next_power_of_two().max(8)) - 1;
        FillGate {
            mask,
            unhit: ExplorerTable::new(),
            fills: [0; CLASSES],
            first_hits: [0; CLASSES],
            gated: 0,
        }
    }

    /// `o`'s hash if `o` is an explorer (always filled).
    #[inline]
    fn explorer(&self, o: OriginBlock) -> Option<u64> {
        let h = explore_hash(o.0);
        (h & self.mask == 0).then_some(h)
    }

    /// Whether `o` is an explorer (always filled).
    pub fn explores(&self, o: OriginBlock) -> bool {
        self.explorer(o).is_some()
    }

    /// Whether a miss of `o` in `class` is worth a fill: an explorer's
    /// always is, another's unless its class yields less than
    /// [`FILL_YIELD_FLOOR`] beyond noise.
    pub fn worth_filling(&self, o: OriginBlock, class: RequestClass) -> bool {
        self.gated & (1 << class.index()) == 0 || self.explores(o)
    }

    /// Decides again whether `class` is gated, after its counts changed:
    /// only when its yield is below the floor beyond noise (its first hits
    /// and two Poisson standard deviations, as if one more were seen).
    fn judge(&mut self, class: RequestClass) {
        let (f, h) = (self.fills[class.index()], self.first_hits[class.index()]);
        let below = (h as f64) + GATE_Z * ((h + 1) as f64).sqrt() < FILL_YIELD_FLOOR * f as f64;
        let bit = 1 << class.index();
        if below {
            self.gated |= bit;
        } else {
            self.gated &= !bit;
        }
    }

    /// `o` was filled for a request of `class`.
    pub fn filled(&mut self, o: OriginBlock, class: RequestClass) {
        let Some(h) = self.explorer(o) else {
            return;
        };
        if self.unhit.len >= TABLE_MAX {
            // Only departures not reported one by one fill it: start over.
            self.unhit = ExplorerTable::new();
        }
        if self.unhit.insert(h, class) {
            self.fills[class.index()] += 1;
            self.judge(class);
        }
    }

    /// `o`, resident, was hit.
    pub fn hit(&mut self, o: OriginBlock) {
        if self.unhit.len == 0 {
            return;
        }
        if let Some(h) = self.explorer(o) {
            if let Some(class) = self.unhit.remove(h) {
                self.first_hits[class.index()] += 1;
                self.judge(class);
            }
        }
    }

    /// `o` left the cache (evicted or removed).
    pub fn left(&mut self, o: OriginBlock) {
        if let Some(h) = self.explorer(o) {
            self.unhit.remove(h);
        }
    }

    /// The yield measured for `class` (first hits per fill), if any fill.
    #[cfg(test)]
    fn class_yield(&self, class: RequestClass) -> Option<f64> {
        let f = self.fills[class.index()];
        (f > 0).then(|| self.first_hits[class.index()] as f64 / f as f64)
    }

    /// Bytes of RAM.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + TABLE_SLOTS * std::mem::size_of::<u32>()
    }
}

/// Explorers filled and not yet hit, with their class: an open-addressing
/// table of 32-bit words, `fingerprint << CLASS_BITS | class` (0: empty),
/// the fingerprint the top 27 bits of the explorer's hash, far above the
/// sampling bits (never 0), its home slot its low bits; linear probing,
/// deletion by backward shift. Two explorers resident at once with one
/// fingerprint (about one pair in 2^27 / 1,792) share an entry: a hit of
/// either ends it.
#[derive(Clone, Debug)]
struct ExplorerTable {
    words: Box<[u32]>,
    len: usize,
}

impl ExplorerTable {
    fn new() -> Self {
        ExplorerTable {
            words: vec![0; TABLE_SLOTS].into_boxed_slice(),
            len: 0,
        }
    }

    fn fingerprint(hash: u64) -> u32 {
        ((hash >> (32 + CLASS_BITS)) as u32).max(1)
    }

    fn home(fingerprint: u32) -> usize {
        fingerprint as usize & (TABLE_SLOTS - 1)
    }

    fn find(&self, fingerprint: u32) -> Option<usize> {
        let mut i = Self::home(fingerprint);
        loop {
            match self.words[i] {
                0 => return None,
                w if w >> CLASS_BITS == fingerprint => return Some(i),
                _ => i = (i + 1) & (TABLE_SLOTS - 1),
            }
        }
    }

    /// Adds the explorer of `hash` (or gives it `class` if there): true if
    /// it was not there.
    fn insert(&mut self, hash: u64, class: RequestClass) -> bool {
        let fp = Self::fingerprint(hash);
        let word = fp << CLASS_BITS | u32::from(class.0);
        if let Some(i) = self.find(fp) {
            self.words[i] = word;
            return false;
        }
        let mut i = Self::home(fp);
        while self.words[i] != 0 {
            i = (i + 1) & (TABLE_SLOTS - 1);
        }
        self.words[i] = word;
        self.len += 1;
        true
    }

    /// Removes the explorer of `hash`, returning its class if it was there.
    fn remove(&mut self, hash: u64) -> Option<RequestClass> {
        let mut hole = self.find(Self::fingerprint(hash))?;
        let class = RequestClass((self.words[hole] & CLASS_MASK) as u8);
        let mask = TABLE_SLOTS - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let w = self.words[j];
            if w == 0 {
                break;
            }
            // The entry at j may move into the hole unless its home lies
            // cyclically in (hole, j].
            let home = Self::home(w >> CLASS_BITS);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.words[hole] = w;
                hole = j;
            }
        }
        self.words[hole] = 0;
        self.len -= 1;
        Some(class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ1: RequestClass = RequestClass(0);

    fn explorers(g: &FillGate, n: usize, from: u64) -> Vec<OriginBlock> {
        (from..)
            .map(OriginBlock)
            .filter(|&o| g.explores(o))
            .take(n)
            .collect()
    }

    fn non_explorer(g: &FillGate) -> OriginBlock {
        (1u64 << 40..)
            .map(OriginBlock)
            .find(|&o| !g.explores(o))
            .expect("one")
    }

    #[test]
    fn classes_split_reads_writes_lengths_and_continuations() {
        let of = RequestClass::of;
        assert_eq!(of(Access::Read, 1, false), READ1);
        assert_ne!(of(Access::Read, 1, false), of(Access::Write, 1, false));
        assert_ne!(of(Access::Write, 1, false), of(Access::Write, 1, true));
        assert_eq!(of(Access::Write, 4, true), of(Access::Write, 15, true));
        assert_ne!(of(Access::Write, 15, false), of(Access::Write, 16, false));
        let all: std::collections::HashSet<_> = [1, 2, 4, 16, 64, 1 << 20]
            .iter()
            .flat_map(|&b| {
                [Access::Read, Access::Write]
                    .into_iter()
                    .flat_map(move |a| [false, true].map(|c| of(a, b, c).0))
            })
            .collect();
        assert_eq!(all.len(), CLASSES);
        assert!(all.iter().all(|&c| (c as usize) < CLASSES));
    }

    #[test]
    fn an_unmeasured_class_is_filled() {
        let g = FillGate::new(1 << 16);
        assert!(g.worth_filling(non_explorer(&g), READ1));
    }

    #[test]
    fn a_class_whose_explorers_are_never_hit_is_gated_beyond_noise_only() {
        let mut g = FillGate::new(1 << 16);
        // 64 fills, none hit: 0 + 2 deviations is not below 64 / 32.
        for o in explorers(&g, 64, 0) {
            g.filled(o, READ1);
            g.left(o);
        }
        assert_eq!(g.class_yield(READ1), Some(0.0));
        assert!(g.worth_filling(non_explorer(&g), READ1));
        for o in explorers(&g, 1, 1 << 30) {
            g.filled(o, READ1);
            g.left(o);
        }
        assert!(!g.worth_filling(non_explorer(&g), READ1));
        // Explorers still fill, and another class is not touched.
        assert!(g.worth_filling(explorers(&g, 1, 1 << 31)[0], READ1));
        assert!(g.worth_filling(non_explorer(&g), RequestClass(1)));
    }

    #[test]
    fn first_hits_reopen_the_class_and_count_once_per_fill() {
        let mut g = FillGate::new(1 << 16);
        let es = explorers(&g, 200, 0);
        for &o in &es {
            g.filled(o, READ1);
        }
        // Floor: 200 / 32 = 6.25. One explorer hit ten times is one first
        // hit (1 + 2 * 1.41 < 6.25); two: 2 + 2 * 1.73 < 6.25; three:
        // 3 + 2 * 2 >= 6.25.
        for _ in 0..10 {
            g.hit(es[0]);
        }
        assert!(!g.worth_filling(non_explorer(&g), READ1));
        g.hit(es[1]);
        assert!(!g.worth_filling(non_explorer(&g), READ1));
        g.hit(es[2]);
        assert!(g.worth_filling(non_explorer(&g), READ1));
        // A departed explorer's later hit (a stale one) counts nothing.
        g.left(es[3]);
        g.hit(es[3]);
        assert_eq!(g.class_yield(READ1), Some(3.0 / 200.0));
    }

    #[test]
    fn explorers_are_one_in_8_of_a_small_cache_and_about_1024_of_a_large_one() {
        let small = FillGate::new(1000);
        let n = (0..80_000u64)
            .filter(|&o| small.explores(OriginBlock(o)))
            .count();
        assert!((9_000..11_000).contains(&n), "{n}");
        let large = FillGate::new(1 << 20);
        let n = (0..1u64 << 20)
            .filter(|&o| large.explores(OriginBlock(o)))
            .count();
        assert!((900..1150).contains(&n), "{n}");
    }

    #[test]
    fn the_table_tracks_every_unhit_explorer_through_insertions_and_removals() {
        let mut g = FillGate::new(8);
        let es = explorers(&g, TABLE_MAX, 0);
        for (i, &o) in es.iter().enumerate() {
            g.filled(o, RequestClass((i % CLASSES) as u8));
        }
        assert_eq!(g.unhit.len, TABLE_MAX);
        // Remove every third, then every one of the rest is still found
        // with its class (backward shift kept the probe chains whole).
        for &o in es.iter().step_by(3) {
            g.left(o);
        }
        for (i, &o) in es.iter().enumerate() {
            let h = explore_hash(o.0);
            let found = g.unhit.find(ExplorerTable::fingerprint(h));
            if i % 3 == 0 {
                assert_eq!(found, None, "{i}");
            } else {
                let w = g.unhit.words[found.expect("tracked")];
                assert_eq!((w & CLASS_MASK) as usize, i % CLASSES, "{i}");
            }
        }
        // A full table starts over rather than refusing to track.
        let more = explorers(&g, TABLE_MAX, 1 << 32);
        for &o in &more {
            g.filled(o, READ1);
        }
        assert!(g.unhit.len <= TABLE_MAX);
        assert!(g.memory_bytes() < 9 * 1024, "{}", g.memory_bytes());
    }
}
