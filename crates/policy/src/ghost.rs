//! A compact ghost: an approximate FIFO set of recently evicted origin
//! blocks at 2 bytes per remembered block (S3-FIFO's ghost FIFO, without the
//! ~20 bytes per entry an exact table of origin ids costs).
//!
//! - **Layout.** `ceil(len / 32)` buckets of up to 32 16-bit fingerprints,
//!   each bucket one 64-byte cache line. A block's 64-bit hash (splitmix64
//!   with a seed of its own, independent of the slot table's index and of
//!   [`crate::Adaptive`]'s sampling) picks the bucket from its high bits
//!   (multiply-shift) and the fingerprint from its low 16 bits (0 is the
//!   empty word, so fingerprint 0 is stored as 1).
//! - **FIFO order.** Each bucket is an exact FIFO of its own entries,
//!   newest first, packed at the front: an insertion shifts the bucket one
//!   word back and drops the last word (its oldest entry, or an empty word);
//!   a removal closes the gap. No age bits are needed, so all 16 bits go to
//!   the fingerprint. The global FIFO of `len` entries is approximated by
//!   `len / width` bucket FIFOs of `width` entries: an entry is forgotten
//!   after `width` later insertions into its bucket, i.e. after about `len`
//!   insertions in all (a sum of `width` exponential gaps: mean `len`,
//!   standard deviation `len / sqrt(width)`, about 18% at width 32), instead
//!   of after exactly `len`. A removal (a ghost hit) frees a word in its
//!   bucket, so the entries behind it stay longer, as in an exact FIFO that
//!   shrinks by one.
//! - **False positives.** A block that is not in the ghost is reported
//!   present when a live entry of its bucket has the same fingerprint:
//!   probability `occupancy / 65535`, at most `32 / 65535` (~0.05%) per
//!   lookup once the buckets are full. The same collision makes an
//!   insertion a no-op (the block counts as already there, as an exact
//!   ghost does for a block it holds), and a removal may remove the other
//!   block's entry instead (it is forgotten early). No false negatives
//!   besides the approximate FIFO order above.
//!
//! Lookups and updates touch one cache line and cost a handful of
//! instructions (the 32-word comparison vectorises).

use tiercache_types::OriginBlock;

/// Fingerprints per bucket (one 64-byte cache line of `u16`).
pub const BUCKET_WORDS: usize = 32;

/// The empty word.
const EMPTY: u16 = 0;

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Bucket([u16; BUCKET_WORDS]);

/// An approximate FIFO set of origin blocks. See the module documentation.
#[derive(Clone)]
pub struct CompactGhost {
    buckets: Vec<Bucket>,
    /// Words used per bucket (`<= BUCKET_WORDS`).
    width: usize,
}

#[inline]
fn ghost_hash(o: u64) -> u64 {
    let mut z = (o ^ 0x6A09_E667_F3BC_C908).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl CompactGhost {
    /// A ghost remembering about the last `len` insertions: `ceil(len / 32)`
    /// buckets of `ceil(len / buckets)` words, so [`CompactGhost::len`] is
    /// `len` rounded up by less than one word per bucket. `len == 0` gives
    /// a ghost that remembers nothing.
    pub fn new(len: u32) -> Self {
        let len = len as usize;
        let n = len.div_ceil(BUCKET_WORDS);
        let width = if n == 0 { 0 } else { len.div_ceil(n) };
        CompactGhost {
            buckets: vec![Bucket([EMPTY; BUCKET_WORDS]); n],
            width,
        }
    }

    /// How many entries the ghost holds when full (the FIFO's length).
    pub fn len(&self) -> usize {
        self.buckets.len() * self.width
    }

    /// Whether the ghost remembers nothing at all (length 0).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Entries held now (a full scan; for tests and reports).
    pub fn occupancy(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.0.iter().filter(|&&w| w != EMPTY).count())
            .sum()
    }

    /// Bytes of RAM the ghost uses.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    /// The bucket index and fingerprint of `o`.
    #[inline]
    fn place(&self, o: OriginBlock) -> (usize, u16) {
        let h = ghost_hash(o.0);
        let b = ((h as u128 * self.buckets.len() as u128) >> 64) as usize;
        let fp = (h as u16).max(1);
        (b, fp)
    }

    #[inline]
    fn position(bucket: &Bucket, fp: u16) -> Option<usize> {
        // Unused words are EMPTY and fp is not, so all 32 can be compared.
        bucket.0.iter().position(|&w| w == fp)
    }

    /// Whether `o` is (probably) in the ghost.
    pub fn contains(&self, o: OriginBlock) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let (b, fp) = self.place(o);
        let bucket = &self.buckets[b];
        bucket.0.iter().fold(false, |any, &w| any | (w == fp))
    }

    /// Remembers `o` as the newest entry of its bucket, forgetting the
    /// bucket's oldest entry if it is full. A block (or fingerprint) already
    /// there keeps its place.
    pub fn insert(&mut self, o: OriginBlock) {
        if self.buckets.is_empty() {
            return;
        }
        let (b, fp) = self.place(o);
        let w = self.width;
        let bucket = &mut self.buckets[b].0;
        if bucket.contains(&fp) {
            return;
        }
        bucket.copy_within(0..w - 1, 1);
        bucket[0] = fp;
    }

    /// Forgets `o`; returns whether it was (probably) there.
    pub fn remove(&mut self, o: OriginBlock) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let (b, fp) = self.place(o);
        let w = self.width;
        let bucket = &mut self.buckets[b];
        match Self::position(bucket, fp) {
            Some(p) => {
                bucket.0.copy_within(p + 1..w, p);
                bucket.0[w - 1] = EMPTY;
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
        assert!(g.len() >= 943_718 && g.len() < 943_718 + 32 * 2);
        // 2 bytes per remembered block (one 64-byte line per 32 words).
        assert!(g.memory_bytes() as f64 / (g.len() as f64) < 2.001);
    }

    #[test]
    fn an_insertion_is_found_until_about_len_later_insertions() {
        let len = 32_768u32;
        let mut g = CompactGhost::new(len);
        let tracked = 1000u64;
        for o in 0..tracked {
            g.insert(OriginBlock(o));
        }
        let alive = |g: &CompactGhost| (0..tracked).filter(|&o| g.contains(OriginBlock(o))).count();
        assert_eq!(alive(&g), tracked as usize);
        // Fill with other blocks up to `len` insertions in all, in steps.
        let mut next = 1 << 40;
        let mut insert = |g: &mut CompactGhost, n: u64| {
            for _ in 0..n {
                g.insert(OriginBlock(next));
                next += 1;
            }
        };
        let len = len as u64;
        insert(&mut g, len / 2 - tracked);
        assert!(alive(&g) >= 999, "{} at len/2", alive(&g));
        insert(&mut g, len / 4);
        assert!(alive(&g) >= 900, "{} at 3/4 len", alive(&g));
        // At len the bucket FIFOs have lost about half (their median).
        insert(&mut g, len / 4);
        let half = alive(&g);
        assert!((350..=650).contains(&half), "{half} at len");
        insert(&mut g, len / 2);
        assert!(alive(&g) <= 50, "{} at 3/2 len", alive(&g));
        insert(&mut g, len);
        // Gone, but for a false positive or two (~0.05% each).
        assert!(alive(&g) <= 3, "{} at 5/2 len", alive(&g));
        assert_eq!(g.occupancy(), g.len());
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
        // Expected 32/65535 ~ 0.049% of probes.
        assert!(fp as f64 / (probes as f64) < 0.0007, "{fp} false positives");
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
        g.remove(OriginBlock(9));
        g.insert(OriginBlock(20)); // takes the freed word: 5 stays
        assert!(g.contains(OriginBlock(5)));
        g.insert(OriginBlock(21));
        assert!(!g.contains(OriginBlock(5)));
    }

    /// An exact FIFO ghost as S3-FIFO keeps it.
    struct Model {
        q: VecDeque<u64>,
        len: usize,
    }

    impl Model {
        fn insert(&mut self, o: u64) {
            if self.q.contains(&o) {
                return;
            }
            if self.q.len() == self.len {
                self.q.pop_front();
            }
            self.q.push_back(o);
        }
        fn remove(&mut self, o: u64) -> bool {
            match self.q.iter().position(|&x| x == o) {
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
        /// hits agree with an exact FIFO's of the same length within 10%
        /// of the hits plus a few.
        #[test]
        fn hits_agree_with_an_exact_fifo(
            len in 64u32..1024,
            keys_per_len in 1.2f64..4.0,
            seed in any::<u64>(),
        ) {
            let mut g = CompactGhost::new(len);
            let mut m = Model { q: VecDeque::new(), len: g.len() };
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
