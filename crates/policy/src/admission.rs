//! Admission: which missed blocks may enter the cache, apart from which
//! blocks leave it.

use crate::seeded_hash::seeded_hash;
use tiercache_types::{Access, AdmissionKind, OriginBlock, Time};

/// Decides whether a missed block is promoted.
///
/// Contract: never does IO or reads a clock; `now` is the only time.
pub trait Admission: Send {
    fn kind(&self) -> AdmissionKind;

    /// Records a miss on `oblock` and says whether to promote it now.
    /// `occupancy` is the resident share of the cache (0..=1); `victim` is
    /// the block a promotion would most likely evict (None when a slot is
    /// free), so an admission rule can compare the candidate with it.
    fn admit(
        &mut self,
        oblock: OriginBlock,
        access: Access,
        now: Time,
        occupancy: f64,
        victim: Option<OriginBlock>,
    ) -> bool;

    /// Records a hit on a resident block (some rules track all accesses).
    fn on_hit(&mut self, oblock: OriginBlock, now: Time) {
        let _ = (oblock, now);
    }

    /// Bytes of RAM used.
    fn memory_bytes(&self) -> usize {
        0
    }
}

/// Promotes every miss (bcache, nbdkit's cache filter with cache-on-read).
#[derive(Clone, Copy, Debug, Default)]
pub struct AlwaysAdmit;

impl Admission for AlwaysAdmit {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Always
    }
    fn admit(
        &mut self,
        _: OriginBlock,
        _: Access,
        _: Time,
        _: f64,
        _: Option<OriginBlock>,
    ) -> bool {
        true
    }
}

/// `x * n / 2^32`: maps a 32-bit hash onto `0..n` without a division.
#[inline]
fn reduce(x: u32, n: usize) -> usize {
    ((x as u64 * n as u64) >> 32) as usize
}

/// Halves every 8-bit counter in `v` (eight at a time).
fn halve_all(v: &mut [u8]) {
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes((&*c).try_into().expect("8 bytes"));
        c.copy_from_slice(&((w >> 1) & 0x7f7f_7f7f_7f7f_7f7f).to_le_bytes());
    }
    for b in chunks.into_remainder() {
        *b >>= 1;
    }
}

/// Open CAS's `nhit` promotion policy: while the cache is less than
/// `free_occupancy` full every miss is promoted; above that, a block is
/// promoted on its `threshold`-th miss. (OCF decides per request, promoting
/// only when every line of it qualifies; the director asks per block.)
///
/// It is the baseline, not a default: a cache full of stale blocks is above
/// the trigger from the start, so every block must miss `threshold` times
/// before it may displace junk, and warm-up from a stale cache is slow.
///
/// Misses are counted in a fixed-size, 4-way set-associative table of
/// `max(capacity / 4, 1024)` entries (rounded up to whole sets): a 32-bit
/// tag (of a 64-bit hash of the origin block) and an 8-bit count, 5 bytes
/// per entry, so ~1.25 bytes per cache block. A block not in its set takes
/// the entry with the lowest count. Aging: after every `2 * entries`
/// recorded misses all counts are halved, so a block must reach the
/// threshold within roughly that window; a block that is promoted has its
/// entry freed. Two blocks with the same set and tag share a count (a
/// false promotion, rare: one in 2^32 per pair).
#[derive(Clone, Debug)]
pub struct NHitAdmit {
    threshold: u32,
    free_occupancy: f64,
    tags: Vec<u32>,
    counts: Vec<u8>,
    sets: usize,
    until_aging: u64,
    aging_period: u64,
}

const NHIT_WAYS: usize = 4;
const NHIT_SEED: u64 = 0x6e68_6974;

impl NHitAdmit {
    /// `threshold`: misses needed for promotion (OCF: 3), at least 1.
    /// `free_occupancy`: below this occupancy (0..=1) everything is promoted
    /// (OCF: 0.8). `capacity`: the cache size in blocks.
    pub fn new(threshold: u32, free_occupancy: f64, capacity: u32) -> Self {
        let entries = (capacity as usize / 4).max(1024).div_ceil(NHIT_WAYS) * NHIT_WAYS;
        let aging_period = 2 * entries as u64;
        NHitAdmit {
            threshold: threshold.max(1),
            free_occupancy,
            tags: vec![0; entries],
            counts: vec![0; entries],
            sets: entries / NHIT_WAYS,
            until_aging: aging_period,
            aging_period,
        }
    }

    /// Records a miss on `o`; returns its miss count (saturating at 255).
    fn record(&mut self, o: OriginBlock) -> u32 {
        let h = seeded_hash(o.0, NHIT_SEED);
        let base = reduce(h as u32, self.sets) * NHIT_WAYS;
        let tag = ((h >> 32) as u32).max(1); // 0 marks an empty entry
        let ways = base..base + NHIT_WAYS;
        let i = match ways.clone().find(|&i| self.tags[i] == tag) {
            Some(i) => i,
            None => {
                let i = ways
                    .min_by_key(|&i| self.counts[i])
                    .expect("at least one way");
                self.tags[i] = tag;
                self.counts[i] = 0;
                i
            }
        };
        self.counts[i] = self.counts[i].saturating_add(1);
        let n = self.counts[i] as u32;
        if n >= self.threshold {
            self.tags[i] = 0;
            self.counts[i] = 0;
        }
        self.until_aging -= 1;
        if self.until_aging == 0 {
            self.until_aging = self.aging_period;
            halve_all(&mut self.counts);
        }
        n
    }
}

impl Admission for NHitAdmit {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::NHit
    }
    fn admit(
        &mut self,
        oblock: OriginBlock,
        _access: Access,
        _now: Time,
        occupancy: f64,
        _victim: Option<OriginBlock>,
    ) -> bool {
        if occupancy < self.free_occupancy {
            return true;
        }
        self.record(oblock) >= self.threshold
    }
    fn memory_bytes(&self) -> usize {
        self.tags.len() * 4 + self.counts.len()
    }
}

/// Cache blocks per hotspot block (dm-cache's smq uses 16).
pub const HOTSPOT_BLOCKS: u64 = 16;

/// Admission after dm-cache smq's hotspot queue, decided TinyLFU-style.
///
/// Accesses (misses, and hits through [`Admission::on_hit`]) are counted
/// per *hotspot block* of [`HOTSPOT_BLOCKS`] consecutive cache blocks, in a
/// count-min sketch: one array of 8-bit counters saturating at
/// [`HOTSPOT_MAX`] (the "level", 0..=15), two positions per hotspot block,
/// the estimate being the smaller, and only the smaller ones incremented
/// (conservative update). The array has `max(capacity / 4, 1024)` counters:
/// **0.25 bytes per cache block**, whatever the size of the origin.
///
/// Decay: every `max(capacity / 8, 64)` recorded accesses (an *epoch*)
/// every counter is halved, so a level is roughly the access rate over the
/// last two epochs, and a region nobody touches falls from the top level to
/// 0 in four epochs, half a pass over a cache-sized working set.
///
/// The rule, for a miss on `o` with `victim` the block it would displace:
/// 1. record the miss;
/// 2. promote if a slot is free (`occupancy < 1` or no victim): an empty
///    cache fills at once, as with `always`;
/// 3. otherwise promote iff level(o's hotspot) > level(victim's hotspot).
///
/// Why a cache full of stale blocks warms as fast as an empty one: the
/// victim a replacement policy offers is its least valuable block, and a
/// stale block is never accessed, so its region decays to level 0 within
/// four epochs and any candidate (level >= 1, counting this very miss)
/// wins against it. smq's 2017 failure was a promotion threshold that
/// stayed high while the cache was full of junk; here the threshold *is*
/// the victim, so junk lowers it. Against a live victim the rule keeps
/// smq's protection: a one-off miss (level 1) does not displace a block
/// whose region is being hit.
///
/// Pairing: the rule trusts `victim` to be the replacement's least valuable
/// block. smq and LRU offer exactly that (stale blocks sink to the bottom).
/// ARC and S3-FIFO offer the oldest block of their probationary queue (T1,
/// the small FIFO), a newcomer, while junk that was hit before sits in T2 or
/// the main FIFO: paired with them, this rule protects the junk (in the
/// benchmark their warm-up from a stale cache never reaches 95%). Use
/// `always` with ARC and S3-FIFO; they filter one-hit wonders themselves.
#[derive(Clone, Debug)]
pub struct HotspotAdmit {
    counters: Vec<u8>,
    shift: u32,
    until_decay: u64,
    epoch: u64,
}

/// The top level of a hotspot counter.
pub const HOTSPOT_MAX: u8 = 15;
const HOTSPOT_SEED: u64 = 0x0068_6f74_7370_6f74;

impl HotspotAdmit {
    /// `capacity`: cache size in blocks. `block_size` is accepted for future
    /// use (the hotspot block is a fixed 16 cache blocks, as in smq).
    pub fn new(capacity: u32, block_size: u32) -> Self {
        let _ = block_size;
        let n = (capacity as usize / 4).max(1024);
        let epoch = (capacity as u64 / 8).max(64);
        HotspotAdmit {
            counters: vec![0; n],
            shift: HOTSPOT_BLOCKS.trailing_zeros(),
            until_decay: epoch,
            epoch,
        }
    }

    fn positions(&self, o: OriginBlock) -> (usize, usize) {
        let h = seeded_hash(o.0 >> self.shift, HOTSPOT_SEED);
        let n = self.counters.len();
        (reduce(h as u32, n), reduce((h >> 32) as u32, n))
    }

    /// The level (0..=15) of `o`'s hotspot block.
    pub fn level(&self, o: OriginBlock) -> u8 {
        let (a, b) = self.positions(o);
        self.counters[a].min(self.counters[b])
    }

    fn record(&mut self, o: OriginBlock) {
        let (a, b) = self.positions(o);
        let m = self.counters[a].min(self.counters[b]);
        if m < HOTSPOT_MAX {
            for i in [a, b] {
                if self.counters[i] == m {
                    self.counters[i] = m + 1;
                }
            }
        }
        self.until_decay -= 1;
        if self.until_decay == 0 {
            self.until_decay = self.epoch;
            halve_all(&mut self.counters);
        }
    }
}

impl Admission for HotspotAdmit {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Hotspot
    }
    fn admit(
        &mut self,
        oblock: OriginBlock,
        _access: Access,
        _now: Time,
        occupancy: f64,
        victim: Option<OriginBlock>,
    ) -> bool {
        self.record(oblock);
        match victim {
            Some(v) if occupancy >= 1.0 => self.level(oblock) > self.level(v),
            _ => true,
        }
    }
    fn on_hit(&mut self, oblock: OriginBlock, _now: Time) {
        self.record(oblock);
    }
    fn memory_bytes(&self) -> usize {
        self.counters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn miss(a: &mut dyn Admission, o: u64, occupancy: f64, victim: Option<u64>) -> bool {
        a.admit(
            OriginBlock(o),
            Access::Read,
            Time(0),
            occupancy,
            victim.map(OriginBlock),
        )
    }

    #[test]
    fn nhit_promotes_everything_below_the_trigger_then_on_the_nth_miss() {
        let mut a = NHitAdmit::new(3, 0.8, 10_000);
        assert!(miss(&mut a, 1, 0.5, None));
        assert!(!miss(&mut a, 2, 0.9, Some(7)));
        assert!(!miss(&mut a, 2, 0.9, Some(7)));
        assert!(miss(&mut a, 2, 0.9, Some(7)));
        // The entry is freed on promotion: counting starts over.
        assert!(!miss(&mut a, 2, 0.9, Some(7)));
        // Many distinct blocks in between do not make others promote early.
        for o in 1000..1100 {
            assert!(!miss(&mut a, o, 0.95, None));
        }
    }

    #[test]
    fn nhit_counts_age_out() {
        let mut a = NHitAdmit::new(2, 0.0, 4096); // 1024 entries, aging every 2048
        assert!(!miss(&mut a, 5, 1.0, None));
        for o in 0..4096u64 {
            miss(&mut a, 1_000_000 + o * 3, 1.0, None);
        }
        // 5's single miss was halved to 0 (or its entry reused).
        assert!(!miss(&mut a, 5, 1.0, None));
        assert!(miss(&mut a, 5, 1.0, None));
        assert!(a.memory_bytes() <= 1024 * 5);
    }

    #[test]
    fn hotspot_fills_free_slots_and_prefers_hotter_regions() {
        let mut a = HotspotAdmit::new(4096, 4096);
        assert!(miss(&mut a, 1, 0.3, None));
        // Region of blocks 32..48 is hot: hits recorded.
        for _ in 0..5 {
            for o in 32..48u64 {
                a.on_hit(OriginBlock(o), Time(0));
            }
        }
        // A one-off miss elsewhere does not displace a hot-region block...
        assert!(!miss(&mut a, 5000, 1.0, Some(40)));
        // ...but a block of the hot region displaces a cold one.
        assert!(miss(&mut a, 33, 1.0, Some(5000)));
        // With no clean victim, the answer does not matter: say yes.
        assert!(miss(&mut a, 9999, 1.0, None));
    }

    #[test]
    fn hotspot_stale_regions_decay_so_any_miss_beats_them() {
        let mut a = HotspotAdmit::new(8192, 4096); // epoch 1024 accesses
        for _ in 0..3 {
            for o in 0..8192u64 {
                a.on_hit(OriginBlock(1 << 40 | o), Time(0));
            }
        }
        let stale = OriginBlock(1 << 40 | 8191);
        assert!(a.level(stale) > 0);
        // Four epochs of accesses elsewhere (half a pass over the cache).
        for o in 0..4096u64 {
            a.on_hit(OriginBlock(o * 7919), Time(0));
        }
        assert_eq!(a.level(stale), 0);
        assert!(miss(&mut a, 123_456_789, 1.0, Some(stale.0)));
        assert!(a.memory_bytes() * 4 <= 8192);
    }
}
