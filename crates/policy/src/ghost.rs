//! A compact ghost: an approximate FIFO set of recently evicted origin
//! blocks at about 2.7 bytes per remembered block (S3-FIFO's ghost FIFO,
//! without the ~20 bytes per entry an exact table of origin ids costs).
//!
//! - **Lifetime, not position.** An exact FIFO of `len` entries forgets a
//!   block `len` insertions after it entered (a little later for each
//!   entry removed ahead of it). Here every entry carries its age, in
//!   generations of about `len / 13.5` insertions, and is forgotten once
//!   it is 14 generations old: between 0.96 and 1.04 times `len`
//!   insertions after it entered (exactly `len` for a ghost of at most 15
//!   entries).
//!   A removal does not lengthen the others' lives.
//! - **Layout.** `ceil(len / 24)` buckets of 32 16-bit words, each bucket
//!   one 64-byte cache line; a word is a 12-bit fingerprint and a 4-bit
//!   generation (0 is the empty word). A block's 64-bit hash (splitmix64
//!   with a seed of its own, independent of the slot table's index and of
//!   [`crate::Adaptive`]'s sampling) picks the bucket from its high bits
//!   (multiply-shift) and the fingerprint from its low 12 bits. A bucket
//!   holds 24 live entries on average, so an insertion nearly always finds
//!   a free or forgotten word; when all 32 are live it takes the oldest's.
//! - **Why ages.** The previous compact ghost kept each bucket an exact
//!   FIFO of 32 entries with no ages: an entry lived for 32 insertions
//!   into its bucket, about `len` in all but spread by 18% (one in six
//!   still there after 1.2 `len`, one in ten gone by 0.8 `len`). On the
//!   policy panel the default then missed up to 0.74 points more than
//!   with an exact ghost (1and1-linux-mysql, 4 KiB, 10%); with ages, 0.12
//!   (docs/BENCHMARKS.md, session 49).
//! - **Wrap-around.** Generations count modulo 16. Every insertion also
//!   clears the forgotten words of one bucket, in turn (a hand), so a word
//!   is cleared within `ceil(len / 24)` insertions of being forgotten,
//!   well before its generation comes round again.
//! - **False positives.** A block that is not in the ghost is reported
//!   present when a live entry of its bucket has the same fingerprint:
//!   probability about `live entries per bucket / 4095`, ~0.6% per lookup
//!   once the ghost is full. The same collision makes an insertion a
//!   no-op (the block counts as already there, as an exact ghost does for
//!   a block it holds), and a removal may remove the other block's entry
//!   instead (it is forgotten early).
//!
//! Lookups and updates touch one cache line (an insertion two: its
//! bucket's and the hand's) and cost a handful of instructions (the
//! 32-word comparison vectorises).

use tiercache_types::OriginBlock;

/// Words per bucket (one 64-byte cache line of `u16`).
pub const BUCKET_WORDS: usize = 32;
/// Live entries per bucket on average when the ghost is full.
const MEAN_LOAD: usize = 24;
/// Generations an entry lives, at most (a ghost of more than 15 entries;
/// the two generations left of the 16 leave the hand time to clear a
/// forgotten word before its generation comes round again).
const LIFETIME_GENERATIONS: u16 = 14;
/// Bits of a word that hold its generation.
const GENERATION_BITS: u32 = 4;
const GENERATION_MASK: u16 = (1 << GENERATION_BITS) - 1;

/// The empty word.
const EMPTY: u16 = 0;

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Bucket([u16; BUCKET_WORDS]);

/// An approximate FIFO set of origin blocks. See the module documentation.
#[derive(Clone)]
pub struct CompactGhost {
    buckets: Vec<Bucket>,
    /// The FIFO length this ghost stands for.
    len: usize,
    /// Insertions per generation.
    generation_len: u64,
    /// Generations an entry lives.
    lifetime: u16,
    /// Insertions so far.
    clock: u64,
    /// The bucket the next insertion clears of forgotten words.
    hand: usize,
}

#[inline]
fn ghost_hash(o: u64) -> u64 {
    let mut z = (o ^ 0x6A09_E667_F3BC_C908).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether word `w` is an entry still remembered in generation `now`, for
/// entries that live `lifetime` generations.
#[inline]
fn remembered(w: u16, now: u16, lifetime: u16) -> bool {
    w != EMPTY && (now.wrapping_sub(w) & GENERATION_MASK) < lifetime
}

impl CompactGhost {
    /// A ghost remembering each insertion for about `len` later ones:
    /// `ceil(len / 24)` buckets. `len == 0` gives a ghost that remembers
    /// nothing.
    pub fn new(len: u32) -> Self {
        let len = len as usize;
        let n = len.div_ceil(MEAN_LOAD);
        // Generations of about len / 13.5 insertions and a life of 14 of
        // them: an entry entered at a uniform point of its first
        // generation lives 13 to 14 generations, len on average. A ghost
        // of at most 15 entries counts insertions exactly.
        let (generation_len, lifetime) = if len <= 15 {
            (1, len as u16)
        } else {
            let g = (len as f64 / (f64::from(LIFETIME_GENERATIONS) - 0.5)).ceil();
            let lifetime = ((len as f64 / g + 0.5).round() as u16).min(LIFETIME_GENERATIONS);
            (g as u64, lifetime)
        };
        debug_assert!(lifetime < 1 << GENERATION_BITS);
        CompactGhost {
            buckets: vec![Bucket([EMPTY; BUCKET_WORDS]); n],
            len,
            generation_len,
            lifetime,
            clock: 0,
            hand: 0,
        }
    }

    /// The FIFO length the ghost stands for: an entry lives about this
    /// many insertions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the ghost remembers nothing at all (length 0).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Entries held now (a full scan; for tests and reports).
    pub fn occupancy(&self) -> usize {
        let now = self.generation();
        self.buckets
            .iter()
            .map(|b| b.0.iter().filter(|&&w| self.live(w, now)).count())
            .sum()
    }

    /// Bytes of RAM the ghost uses.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    /// The current generation (modulo 16).
    #[inline]
    fn generation(&self) -> u16 {
        (self.clock / self.generation_len) as u16 & GENERATION_MASK
    }

    /// Whether word `w` is a remembered entry in generation `now`.
    #[inline]
    fn live(&self, w: u16, now: u16) -> bool {
        remembered(w, now, self.lifetime)
    }

    /// The bucket index and fingerprint of `o` (the fingerprint in the
    /// word's high 12 bits, never 0).
    #[inline]
    fn place(&self, o: OriginBlock) -> (usize, u16) {
        let h = ghost_hash(o.0);
        let b = ((h as u128 * self.buckets.len() as u128) >> 64) as usize;
        let fp = ((h as u16) >> GENERATION_BITS).max(1);
        (b, fp << GENERATION_BITS)
    }

    /// The position in `bucket` of a live entry with fingerprint `fp`.
    #[inline]
    fn position(&self, bucket: usize, fp: u16) -> Option<usize> {
        let now = self.generation();
        self.buckets[bucket]
            .0
            .iter()
            .position(|&w| w & !GENERATION_MASK == fp && self.live(w, now))
    }

    /// Whether `o` is (probably) in the ghost.
    pub fn contains(&self, o: OriginBlock) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let (b, fp) = self.place(o);
        let now = self.generation();
        self.buckets[b].0.iter().fold(false, |any, &w| {
            any | (w & !GENERATION_MASK == fp && self.live(w, now))
        })
    }

    /// Empties the words of bucket `b` that are no longer remembered.
    fn clear_forgotten(&mut self, b: usize) {
        let (now, lifetime) = (self.generation(), self.lifetime);
        for w in &mut self.buckets[b].0 {
            if !remembered(*w, now, lifetime) {
                *w = EMPTY;
            }
        }
    }

    /// Remembers `o` for about [`CompactGhost::len`] insertions from now
    /// (in a free or forgotten word of its bucket, or in place of the
    /// bucket's oldest entry if all 32 are live). A block (or fingerprint)
    /// already there keeps its age.
    pub fn insert(&mut self, o: OriginBlock) {
        if self.buckets.is_empty() {
            return;
        }
        let (b, fp) = self.place(o);
        if self.position(b, fp).is_some() {
            return;
        }
        self.clock += 1;
        let hand = self.hand;
        self.hand = (hand + 1) % self.buckets.len();
        self.clear_forgotten(hand);
        self.clear_forgotten(b);
        let now = self.generation();
        let words = &mut self.buckets[b].0;
        let at = match words.iter().position(|&w| w == EMPTY) {
            Some(p) => p,
            None => {
                // All live: the oldest goes (the first of equal ages).
                let age = |w: u16| now.wrapping_sub(w) & GENERATION_MASK;
                let mut oldest = 0;
                for (p, &w) in words.iter().enumerate() {
                    if age(w) > age(words[oldest]) {
                        oldest = p;
                    }
                }
                oldest
            }
        };
        words[at] = fp | now;
    }

    /// Forgets `o`; returns whether it was (probably) there.
    pub fn remove(&mut self, o: OriginBlock) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let (b, fp) = self.place(o);
        match self.position(b, fp) {
            Some(p) => {
                self.buckets[b].0[p] = EMPTY;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn sizes() {
        assert_eq!(CompactGhost::new(0).len(), 0);
        assert!(!CompactGhost::new(0).contains(OriginBlock(1)));
        assert_eq!(CompactGhost::new(1).len(), 1);
        assert_eq!(CompactGhost::new(18).len(), 18);
        assert_eq!(CompactGhost::new(50).len(), 50);
        let g = CompactGhost::new(943_718);
        assert_eq!(g.len(), 943_718);
        // 64 bytes per 24 remembered blocks.
        let per_entry = g.memory_bytes() as f64 / (g.len() as f64);
        assert!((2.66..2.67).contains(&per_entry), "{per_entry} B per entry");
    }

    #[test]
    fn an_insertion_is_found_until_about_len_later_insertions() {
        let len = 32_768u32;
        let mut g = CompactGhost::new(len);
        let mut next = 1u64 << 40;
        let mut insert = |g: &mut CompactGhost, n: u64| {
            for _ in 0..n {
                g.insert(OriginBlock(next));
                next += 1;
            }
        };
        // A full ghost, so that the tracked blocks compete for words.
        insert(&mut g, 3 * len as u64);
        let tracked = 1000u64;
        for o in 0..tracked {
            g.insert(OriginBlock(o));
        }
        let alive = |g: &CompactGhost| (0..tracked).filter(|&o| g.contains(OriginBlock(o))).count();
        assert_eq!(alive(&g), tracked as usize);
        let len = len as u64;
        // All there at 0.95 len but for a few percent (a bucket whose 32
        // words are all live gives up its oldest: the tracked blocks are
        // the oldest), none at 1.05 len but for a false positive or a few
        // (~0.6% each).
        insert(&mut g, len * 95 / 100 - tracked);
        assert!(alive(&g) >= 950, "{} at 0.95 len", alive(&g));
        insert(&mut g, len / 10);
        assert!(alive(&g) <= 20, "{} at 1.05 len", alive(&g));
        let held = g.occupancy() as f64 / len as f64;
        assert!((0.95..1.01).contains(&held), "holds {held} of len");
    }

    #[test]
    fn false_positives_are_rare() {
        let mut g = CompactGhost::new(100_000);
        for o in 0..200_000u64 {
            g.insert(OriginBlock(o));
        }
        let probes = 1_000_000u64;
        let fp = (1u64 << 50..(1 << 50) + probes)
            .filter(|&o| g.contains(OriginBlock(o)))
            .count();
        // Expected about 24/4095 ~ 0.59% of probes.
        assert!(fp as f64 / (probes as f64) < 0.008, "{fp} false positives");
        assert!(fp > 0);
    }

    #[test]
    fn remove_forgets_and_frees_a_word() {
        let mut g = CompactGhost::new(64);
        assert!(!g.remove(OriginBlock(7)));
        g.insert(OriginBlock(7));
        g.insert(OriginBlock(8));
        g.insert(OriginBlock(7)); // already there: no duplicate
        assert_eq!(g.occupancy(), 2);
        assert!(g.contains(OriginBlock(7)));
        assert!(g.remove(OriginBlock(7)));
        assert!(!g.contains(OriginBlock(7)));
        assert!(!g.remove(OriginBlock(7)));
        assert!(g.contains(OriginBlock(8)));
        assert_eq!(g.occupancy(), 1);
    }

    #[test]
    fn a_one_bucket_ghost_is_an_exact_fifo() {
        let mut g = CompactGhost::new(10);
        for o in 0..15u64 {
            g.insert(OriginBlock(o));
        }
        let alive: Vec<u64> = (0..15).filter(|&o| g.contains(OriginBlock(o))).collect();
        assert_eq!(alive, (5..15).collect::<Vec<_>>());
        // A removal does not lengthen the others' lives.
        assert!(g.remove(OriginBlock(9)));
        g.insert(OriginBlock(20));
        assert!(!g.contains(OriginBlock(5)));
        assert!(g.contains(OriginBlock(6)));
        assert_eq!(g.occupancy(), 9);
    }

    /// The contract made exact: each insertion remembered until `len`
    /// later insertions, a removal lengthening no other entry's life.
    struct Model {
        q: VecDeque<(u64, u64)>,
        len: u64,
        clock: u64,
    }

    impl Model {
        fn insert(&mut self, o: u64) {
            if self.q.iter().any(|&(x, _)| x == o) {
                return;
            }
            self.clock += 1;
            self.q.push_back((o, self.clock));
            while self
                .q
                .front()
                .is_some_and(|&(_, t)| self.clock - t >= self.len)
            {
                self.q.pop_front();
            }
        }
        fn remove(&mut self, o: u64) -> bool {
            match self.q.iter().position(|&(x, _)| x == o) {
                Some(p) => {
                    self.q.remove(p);
                    true
                }
                None => false,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// S3-FIFO's use: every miss asks the ghost (removing on a hit),
        /// every eviction from the small FIFO inserts. Over a stream whose
        /// reuse distances straddle the ghost's length, the compact ghost's
        /// hits agree with the exact contract's within 10% of the hits plus
        /// a few (its lifetimes are within 4% of `len`, its fingerprints
        /// 12 bits).
        #[test]
        fn hits_agree_with_an_exact_fifo(
            len in 64u32..1024,
            keys_per_len in 1.2f64..4.0,
            seed in any::<u64>(),
        ) {
            let mut g = CompactGhost::new(len);
            let mut m = Model { q: VecDeque::new(), len: g.len() as u64, clock: 0 };
            let keys = (g.len() as f64 * keys_per_len) as u64;
            let mut x = seed | 1;
            let (mut hits_g, mut hits_m, mut both) = (0u64, 0u64, 0u64);
            for _ in 0..20 * g.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let o = x % keys;
                let (hg, hm) = (g.remove(OriginBlock(o)), m.remove(o));
                hits_g += u64::from(hg);
                hits_m += u64::from(hm);
                both += u64::from(hg && hm);
                // Re-enters the ghost when evicted later: here at once.
                g.insert(OriginBlock(o));
                m.insert(o);
            }
            let tol = hits_m / 10 + 20;
            prop_assert!(hits_g.abs_diff(hits_m) <= tol, "compact {} exact {}", hits_g, hits_m);
            prop_assert!(hits_m - both <= tol, "exact-only {} of {}", hits_m - both, hits_m);
        }
    }
}
