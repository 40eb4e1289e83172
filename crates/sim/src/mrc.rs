//! LRU miss-ratio curves: exact (Mattson stack distances) and SHARDS
//! (Waldspurger et al., FAST 2015) for traces too large for exact.
//!
//! Stack distance of a reference to block `b` = the number of distinct other
//! blocks referenced since the previous reference to `b`. An LRU cache of
//! `C` blocks hits exactly the references with distance `< C` (LRU is a
//! stack algorithm), so one histogram of distances gives the miss ratio of
//! every cache size at once.
//!
//! Exact method: every reference is a slot on a timeline; the slot of each
//! block's latest reference is marked (a bitmap, with a Fenwick tree over
//! its 64-bit words); the distance is the number of marked slots after the
//! block's previous slot, O(log n) per reference. The timeline is compacted (live slots renumbered in order)
//! whenever it fills up, so the tree has about 2-4 slots per distinct block
//! rather than one per reference: memory O(distinct blocks) and a tree that
//! stays cache-friendly.
//!
//! SHARDS: a reference is sampled when `hash(block) mod P < T` (rate
//! `R = T / P`, `P = 2^24`); distances measured in the sampled stream are
//! scaled by `1 / R`. Fixed-rate SHARDS keeps R; its histogram gets the
//! "SHARDS_adj" correction (Waldspurger et al., FAST '15: the difference
//! between the expected `R * N` and the actual number of sampled references
//! is added to the smallest distance bucket). The paper's histogram has
//! coarse buckets; ours has one bucket per block (or `bucket_blocks`), so
//! the first bucket holds only immediate re-references, and when hot
//! blocks sampled in make the sample too large, the difference is more than
//! that bucket holds: it is taken from the smallest distances up (the hits
//! of the hot blocks it stands for), never leaving a bucket negative. (Up
//! to 2026-11 it was clamped at 0 in the first bucket, which left most of
//! the excess counted as hits at every size: 0.08 to 0.12 too few misses on
//! Zipf 0.8 at rate 0.1.) Fixed-size SHARDS tracks at most `s_max` blocks,
//! lowering T to the largest tracked hash (evicting those blocks) when the
//! set overflows, and rescales the histogram counts by `R_new / R_old`; we
//! apply the same `R * N` correction to it at the end, which matters on
//! skewed workloads where one hot block holds a large share of references
//! (zipf 1.2: the hottest block alone is about 20%) and sampling it in or
//! out swings the estimate.

use crate::idmap::IdMap;
use crate::rng::mix64;
use serde::{Deserialize, Serialize};
use std::collections::BinaryHeap;

const NONE: u32 = u32::MAX;

/// Exact LRU stack distances over dense ids.
///
/// Live slots are bits in a bitmap; a Fenwick tree counts live slots per
/// 64-slot word. The tree is 64 times smaller than one over slots (a few
/// hundred KiB for millions of blocks), so it stays in cache.
#[derive(Clone, Debug)]
pub struct StackDistance {
    /// id -> slot of its latest reference (NONE: not tracked).
    last: Vec<u32>,
    /// slot -> id (NONE: not live); read only when compacting.
    owner: Vec<u32>,
    /// Live-slot bitmap.
    bits: Vec<u64>,
    /// Fenwick tree over the popcounts of `bits` words, 1-based.
    tree: Vec<u32>,
    next_slot: u32,
    live: u32,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    pub fn new() -> Self {
        let mut s = StackDistance {
            last: Vec::new(),
            owner: Vec::new(),
            bits: Vec::new(),
            tree: Vec::new(),
            next_slot: 0,
            live: 0,
        };
        s.rebuild(1024);
        s
    }

    /// Distinct ids currently tracked.
    pub fn live(&self) -> u32 {
        self.live
    }

    #[inline]
    fn tree_add(&mut self, word: usize, delta: u32) {
        let n = self.tree.len();
        let mut i = word + 1;
        while i < n {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Live slots in words [0, word).
    #[inline]
    fn tree_prefix(&self, word: usize) -> u32 {
        let mut i = word;
        let mut s = 0u32;
        while i > 0 {
            s = s.wrapping_add(self.tree[i]);
            i &= i - 1;
        }
        s
    }

    #[inline]
    fn set(&mut self, slot: u32) {
        let w = slot as usize / 64;
        self.bits[w] |= 1 << (slot % 64);
        self.tree_add(w, 1);
    }

    #[inline]
    fn clear(&mut self, slot: u32) {
        let w = slot as usize / 64;
        self.bits[w] &= !(1 << (slot % 64));
        self.tree_add(w, u32::MAX); // -1
    }

    /// Live slots in [0, slot].
    #[inline]
    fn prefix(&self, slot: u32) -> u32 {
        let w = slot as usize / 64;
        let b = slot % 64;
        let mask = if b == 63 {
            u64::MAX
        } else {
            (1u64 << (b + 1)) - 1
        };
        self.tree_prefix(w) + (self.bits[w] & mask).count_ones()
    }

    /// Renumbers live slots 0..live (in order) into a timeline of `cap`
    /// slots and rebuilds the bitmap and tree.
    fn rebuild(&mut self, cap: usize) {
        let cap = cap.div_ceil(64) * 64;
        let mut owner = vec![NONE; cap];
        let mut k = 0usize;
        for &id in &self.owner[..(self.next_slot as usize).min(self.owner.len())] {
            if id != NONE {
                owner[k] = id;
                self.last[id as usize] = k as u32;
                k += 1;
            }
        }
        debug_assert_eq!(k, self.live as usize);
        let words = cap / 64;
        let mut bits = vec![0u64; words];
        for (w, word) in bits.iter_mut().enumerate() {
            let lo = w * 64;
            if lo + 64 <= k {
                *word = u64::MAX;
            } else if lo < k {
                *word = (1u64 << (k - lo)) - 1;
            }
        }
        // Linear-time Fenwick construction over word popcounts.
        let mut tree = vec![0u32; words + 1];
        for (w, word) in bits.iter().enumerate() {
            tree[w + 1] = word.count_ones();
        }
        for i in 1..=words {
            let j = i + (i & i.wrapping_neg());
            if j <= words {
                tree[j] += tree[i];
            }
        }
        self.owner = owner;
        self.bits = bits;
        self.tree = tree;
        self.next_slot = k as u32;
    }

    /// Records a reference to `id`. Returns `None` on the first reference
    /// (a cold miss), else the stack distance (distinct other ids referenced
    /// since the previous reference to `id`).
    #[inline]
    pub fn access(&mut self, id: u32) -> Option<u64> {
        if self.next_slot as usize == self.owner.len() {
            // At least as many free slots as live ones: amortized O(1).
            self.rebuild((self.live as usize * 3).max(1024));
        }
        let idx = id as usize;
        if idx >= self.last.len() {
            self.last.resize((idx + 1).max(self.last.len() * 2), NONE);
        }
        let prev = self.last[idx];
        let t = self.next_slot;
        self.next_slot += 1;
        let dist = if prev == NONE {
            self.live += 1;
            None
        } else {
            let d = self.live - self.prefix(prev);
            self.clear(prev);
            self.owner[prev as usize] = NONE;
            Some(d as u64)
        };
        self.set(t);
        self.owner[t as usize] = id;
        self.last[idx] = t;
        dist
    }

    /// Stops tracking `id` (its next reference is a cold miss again).
    pub fn remove(&mut self, id: u32) {
        let idx = id as usize;
        if idx < self.last.len() && self.last[idx] != NONE {
            let s = self.last[idx];
            self.clear(s);
            self.owner[s as usize] = NONE;
            self.last[idx] = NONE;
            self.live -= 1;
        }
    }

    pub fn memory_bytes(&self) -> usize {
        self.last.len() * 4 + self.owner.len() * 4 + self.bits.len() * 8 + self.tree.len() * 4
    }
}

/// How to compute the LRU miss-ratio curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum MrcMethod {
    /// Every reference (memory O(distinct blocks)).
    Exact,
    /// Fixed-rate SHARDS with sampling rate `rate` in (0, 1].
    Shards { rate: f64 },
    /// Fixed-size SHARDS tracking at most `max_blocks` blocks.
    ShardsFixedSize { max_blocks: u32 },
    /// Exact while the trace has at most `max_exact_blocks` distinct
    /// blocks, else fixed-size SHARDS with `fallback_blocks` (fed from the
    /// start alongside the exact curve, which is dropped, memory and all,
    /// when the limit is passed). The resulting [`Mrc::method`] says which.
    Auto {
        max_exact_blocks: u32,
        fallback_blocks: u32,
    },
}

impl Default for MrcMethod {
    /// Auto: exact up to 50M distinct blocks (about 2 GB of RAM; 190 GiB
    /// of 4 KiB blocks), else fixed-size SHARDS with 64k blocks.
    fn default() -> Self {
        MrcMethod::Auto {
            max_exact_blocks: 50_000_000,
            fallback_blocks: 65_536,
        }
    }
}

impl MrcMethod {
    pub fn label(&self) -> String {
        match self {
            MrcMethod::Exact => "exact".into(),
            MrcMethod::Shards { rate } => format!("SHARDS rate {rate}"),
            MrcMethod::ShardsFixedSize { max_blocks } => {
                format!("SHARDS fixed-size {max_blocks} blocks")
            }
            MrcMethod::Auto {
                max_exact_blocks,
                fallback_blocks,
            } => format!(
                "exact up to {max_exact_blocks} blocks, else SHARDS fixed-size {fallback_blocks}"
            ),
        }
    }
}

/// SHARDS' hash modulus P.
pub const SHARDS_MODULUS: u64 = 1 << 24;

/// A miss-ratio curve: a histogram of (scaled) stack distances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mrc {
    pub method: MrcMethod,
    /// The sampling rate in force at the end (1 for exact).
    pub sample_rate: f64,
    /// Cache blocks per histogram bucket: miss ratios are exact at
    /// multiples of it.
    pub bucket_blocks: u64,
    /// References (estimated for SHARDS: sampled / rate).
    pub references: f64,
    /// First references (estimated for SHARDS).
    pub cold_misses: f64,
    /// Distance histogram: `hist[k]` counts distances in
    /// `[k * bucket_blocks, (k + 1) * bucket_blocks)`. Weighted for SHARDS.
    pub hist: Vec<f64>,
    /// Blocks actually tracked (distinct sampled blocks for SHARDS).
    pub tracked_blocks: u64,
}

impl Mrc {
    /// Miss ratio of an LRU cache of `cache_blocks` blocks (0..=1).
    pub fn miss_ratio(&self, cache_blocks: u64) -> f64 {
        if self.references <= 0.0 {
            return 0.0;
        }
        // Hits: distances < C. Buckets wholly below C count fully; the
        // bucket containing C counts in proportion.
        let g = self.bucket_blocks as f64;
        let c = cache_blocks as f64;
        let full = (cache_blocks / self.bucket_blocks) as usize;
        let mut hits: f64 = self.hist.iter().take(full).sum();
        if let Some(h) = self.hist.get(full) {
            hits += h * ((c - full as f64 * g) / g);
        }
        (1.0 - hits / self.references).clamp(0.0, 1.0)
    }

    /// Largest distance bucket boundary with data: beyond it the curve is
    /// flat at the cold-miss ratio.
    pub fn max_distance(&self) -> u64 {
        self.hist.len() as u64 * self.bucket_blocks
    }

    /// The curve at `points` cache sizes spread geometrically from 1 block
    /// to just past the largest distance: `(cache_blocks, miss_ratio)`.
    pub fn curve(&self, points: usize) -> Vec<(u64, f64)> {
        let max = self.max_distance().max(2);
        let mut out: Vec<(u64, f64)> = Vec::with_capacity(points + 1);
        let points = points.max(2);
        for i in 0..points {
            let x = (max as f64).powf(i as f64 / (points - 1) as f64).round() as u64;
            if out.last().is_some_and(|l| l.0 == x) {
                continue;
            }
            out.push((x, self.miss_ratio(x)));
        }
        out
    }
}

/// Mean absolute difference of two curves' miss ratios at `points` cache
/// sizes evenly spaced from `max / points` to `max`, where `max` is the
/// larger of the two curves' largest distances.
pub fn mean_absolute_error(a: &Mrc, b: &Mrc, points: usize) -> f64 {
    let max = a.max_distance().max(b.max_distance()).max(1);
    let points = points.max(1);
    let sum: f64 = (1..=points)
        .map(|i| {
            let c = (max as f64 * i as f64 / points as f64).round() as u64;
            (a.miss_ratio(c) - b.miss_ratio(c)).abs()
        })
        .sum();
    sum / points as f64
}

/// Builds an [`Mrc`] from a stream of block numbers.
#[derive(Clone, Debug)]
pub struct MrcBuilder {
    method: MrcMethod,
    ids: IdMap,
    stack: StackDistance,
    bucket: u64,
    hist: Vec<f64>,
    cold: f64,
    references: u64,
    sampled: u64,
    /// Sampling threshold T (sample when hash < T) and current rate.
    threshold: u64,
    rate: f64,
    /// Fixed-size: max-heap of (hash, id) of tracked blocks.
    heap: BinaryHeap<(u64, u32)>,
    tracked: Vec<bool>,
    max_blocks: u32,
    seed: u64,
    /// Fixed-size: stored counts times `unit` are the counts at the current
    /// rate (lowering the rate rescales all counts in O(1)).
    unit: f64,
    /// Auto: the SHARDS builder fed alongside, the distinct-block limit of
    /// the exact one, and whether it was dropped.
    fallback: Option<Box<MrcBuilder>>,
    max_exact: u32,
    dropped: bool,
}

impl MrcBuilder {
    /// `bucket_blocks`: histogram resolution in blocks (1 = every size).
    pub fn new(method: MrcMethod, bucket_blocks: u64) -> Self {
        if let MrcMethod::Auto {
            max_exact_blocks,
            fallback_blocks,
        } = method
        {
            let mut b = Self::new(MrcMethod::Exact, bucket_blocks);
            b.fallback = Some(Box::new(Self::new(
                MrcMethod::ShardsFixedSize {
                    max_blocks: fallback_blocks,
                },
                bucket_blocks,
            )));
            b.max_exact = max_exact_blocks;
            return b;
        }
        let (rate, max_blocks) = match method {
            MrcMethod::Exact => (1.0, u32::MAX),
            MrcMethod::Shards { rate } => (rate.clamp(1.0 / SHARDS_MODULUS as f64, 1.0), u32::MAX),
            MrcMethod::ShardsFixedSize { max_blocks } => (1.0, max_blocks.max(1)),
            MrcMethod::Auto { .. } => unreachable!("handled above"),
        };
        MrcBuilder {
            method,
            ids: IdMap::default(),
            stack: StackDistance::new(),
            bucket: bucket_blocks.max(1),
            hist: Vec::new(),
            cold: 0.0,
            references: 0,
            sampled: 0,
            threshold: (rate * SHARDS_MODULUS as f64).round() as u64,
            rate,
            heap: BinaryHeap::new(),
            tracked: Vec::new(),
            max_blocks,
            seed: 0x5851_F42D_4C95_7F2D,
            unit: 1.0,
            fallback: None,
            max_exact: u32::MAX,
            dropped: false,
        }
    }

    #[inline]
    fn record(&mut self, dist: Option<u64>, weight: f64) {
        match dist {
            None => self.cold += weight,
            Some(d) => {
                let scaled = if self.rate < 1.0 {
                    (d as f64 / self.rate) as u64
                } else {
                    d
                };
                let k = (scaled / self.bucket) as usize;
                if k >= self.hist.len() {
                    self.hist.resize(k + 1, 0.0);
                }
                self.hist[k] += weight;
            }
        }
    }

    /// Feeds one block reference.
    #[inline]
    pub fn access(&mut self, block: u64) {
        if let Some(f) = self.fallback.as_mut() {
            f.access(block);
            if self.dropped {
                return;
            }
        }
        self.references += 1;
        match self.method {
            MrcMethod::Exact => {
                let (id, new) = self.ids.get_or_insert(block);
                let d = self.stack.access(id);
                self.record(d, 1.0);
                if new && self.ids.len() > self.max_exact {
                    // Auto: too many blocks for exact; free it all.
                    self.dropped = true;
                    self.ids = IdMap::with_capacity(0);
                    self.stack = StackDistance::new();
                    self.hist = Vec::new();
                }
            }
            MrcMethod::Shards { .. } => {
                let h = mix64(block ^ self.seed) & (SHARDS_MODULUS - 1);
                if h >= self.threshold {
                    return;
                }
                self.sampled += 1;
                let (id, _) = self.ids.get_or_insert(block);
                let d = self.stack.access(id);
                self.record(d, 1.0);
            }
            MrcMethod::Auto { .. } => unreachable!("built as Exact"),
            MrcMethod::ShardsFixedSize { .. } => {
                let h = mix64(block ^ self.seed) & (SHARDS_MODULUS - 1);
                if h >= self.threshold {
                    return;
                }
                self.sampled += 1;
                let (id, _) = self.ids.get_or_insert(block);
                let i = id as usize;
                if i >= self.tracked.len() {
                    self.tracked
                        .resize((i + 1).max(self.tracked.len() * 2), false);
                }
                if !self.tracked[i] {
                    self.tracked[i] = true;
                    self.heap.push((h, id));
                }
                let d = self.stack.access(id);
                self.record(d, 1.0 / self.unit);
                while self.heap.len() > self.max_blocks as usize {
                    // Lower the threshold to the largest tracked hash and
                    // drop every block at or above it.
                    let top = self.heap.peek().map(|x| x.0).unwrap_or(0);
                    while self.heap.peek().is_some_and(|x| x.0 >= top) {
                        let (_, victim) = self.heap.pop().expect("peeked");
                        self.tracked[victim as usize] = false;
                        self.stack.remove(victim);
                    }
                    let new_rate = top as f64 / SHARDS_MODULUS as f64;
                    self.unit *= new_rate / self.rate;
                    self.threshold = top;
                    self.rate = new_rate;
                }
            }
        }
    }

    /// Feeds one reference by a dense id the caller assigned (first seen
    /// = next unused id). Exact method only; the SHARDS methods hash block
    /// numbers, so they need [`MrcBuilder::access`].
    #[inline]
    pub fn access_dense(&mut self, id: u32) {
        debug_assert!(matches!(self.method, MrcMethod::Exact));
        self.references += 1;
        let d = self.stack.access(id);
        self.record(d, 1.0);
    }

    /// References fed so far.
    pub fn references(&self) -> u64 {
        self.references
    }

    pub fn memory_bytes(&self) -> usize {
        self.ids.memory_bytes()
            + self.stack.memory_bytes()
            + self.hist.len() * 8
            + self.heap.len() * 16
    }

    /// The curve. For `Auto`, the exact one unless it was dropped.
    pub fn finish(mut self) -> Mrc {
        if let Some(f) = self.fallback.take() {
            if self.dropped {
                return f.finish();
            }
        }
        let mut hist = self.hist;
        let n = self.references as f64;
        let (references, cold) = match self.method {
            MrcMethod::Exact => (n, self.cold),
            MrcMethod::Shards { .. } => {
                // SHARDS_adj: expected samples R*N vs actual; the difference
                // goes to the first bucket. Then scale counts up by 1/R.
                let expected = self.rate * n;
                shards_adj(&mut hist, expected - self.sampled as f64);
                let up = 1.0 / self.rate;
                for x in &mut hist {
                    *x *= up;
                }
                (n, self.cold * up)
            }
            MrcMethod::ShardsFixedSize { .. } => {
                // Counts times `unit` are at the final rate R. The same
                // SHARDS_adj correction as fixed-rate: their total should
                // be R*N; the difference (mostly hits on hot blocks sampled
                // in or out) goes to the smallest distances (`shards_adj`).
                let up = 1.0 / self.rate;
                for x in &mut hist {
                    *x *= self.unit;
                }
                let cold = self.cold * self.unit;
                let sampled: f64 = hist.iter().sum::<f64>() + cold;
                shards_adj(&mut hist, self.rate * n - sampled);
                for x in &mut hist {
                    *x *= up;
                }
                (n, cold * up)
            }
            MrcMethod::Auto { .. } => unreachable!("built as Exact"),
        };
        Mrc {
            method: self.method,
            sample_rate: self.rate,
            bucket_blocks: self.bucket,
            references,
            cold_misses: cold,
            hist,
            tracked_blocks: match self.method {
                MrcMethod::Exact => self.stack.live() as u64,
                _ => self.ids.len() as u64,
            },
        }
    }
}

/// SHARDS_adj: adds `diff` (expected minus actual sampled references) to
/// the smallest distances: all of a surplus to the first bucket; a deficit
/// taken from the first buckets up, none left below 0.
fn shards_adj(hist: &mut Vec<f64>, diff: f64) {
    if hist.is_empty() {
        hist.push(0.0);
    }
    if diff >= 0.0 {
        hist[0] += diff;
        return;
    }
    let mut rest = -diff;
    for x in hist.iter_mut() {
        let take = rest.min(*x);
        *x -= take;
        rest -= take;
        if rest <= 0.0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Mean absolute difference of SHARDS at rate 0.1 from the exact curve,
    /// over 40 sizes, on requests to 300k blocks drawn Zipf(`skew`) (block
    /// numbers scattered, so that hash order is not rank order), each over
    /// 1 to 5 consecutive blocks as in the Python tests' traces. With the
    /// first bucket clamped at 0 (the old SHARDS_adj) Zipf 0.8 was 0.068
    /// off; now 0.010.
    fn shards_error(skew: f64, seed: u64) -> f64 {
        const BLOCKS: usize = 300_000;
        let mut cdf = Vec::with_capacity(BLOCKS);
        let mut sum = 0.0;
        for k in 1..=BLOCKS {
            sum += (k as f64).powf(-skew);
            cdf.push(sum);
        }
        let mut rng = Rng::new(seed);
        let mut exact = MrcBuilder::new(MrcMethod::Exact, 1);
        let mut shards = MrcBuilder::new(MrcMethod::Shards { rate: 0.1 }, 1);
        for _ in 0..1_000_000 {
            let u = rng.below(1 << 53) as f64 / (1u64 << 53) as f64 * sum;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            let first = mix64(rank ^ 0xDEAD_BEEF) % BLOCKS as u64;
            // 1 to 4 blocks, a quarter of them unaligned (one block more),
            // as the Python tests' synthetic traces.
            let n = 1 + rng.below(4) + u64::from(rng.below(4) == 0);
            for block in first..first + n {
                exact.access(block);
                shards.access(block);
            }
        }
        let (e, s) = (exact.finish(), shards.finish());
        let sizes: Vec<u64> = (0..40)
            .map(|i| (64.0 * (1_048_576f64 / 64.0).powf(i as f64 / 39.0)) as u64)
            .collect();
        sizes
            .iter()
            .map(|&c| (e.miss_ratio(c) - s.miss_ratio(c)).abs())
            .sum::<f64>()
            / sizes.len() as f64
    }

    #[test]
    fn fixed_rate_shards_stays_close_to_exact_on_skewed_traces() {
        for (skew, seed) in [(0.5, 5), (0.8, 6), (1.0, 8)] {
            let err = shards_error(skew, seed);
            eprintln!("zipf {skew} seed {seed}: {err:.4}");
            assert!(err < 0.03, "zipf {skew} seed {seed}: mean error {err:.4}");
        }
    }

    #[test]
    fn shards_adj_adds_a_surplus_to_the_first_bucket_and_takes_a_deficit_from_the_smallest() {
        let mut h = vec![1.0, 2.0, 3.0];
        shards_adj(&mut h, 2.5);
        assert_eq!(h, vec![3.5, 2.0, 3.0]);
        shards_adj(&mut h, -5.0);
        assert_eq!(h, vec![0.0, 0.5, 3.0]);
        shards_adj(&mut h, -10.0);
        assert_eq!(h, vec![0.0, 0.0, 0.0]);
        let mut empty = Vec::new();
        shards_adj(&mut empty, -1.0);
        assert_eq!(empty, vec![0.0]);
    }
    use std::collections::VecDeque;

    /// LRU miss count by brute force.
    fn lru_misses(trace: &[u64], c: usize) -> u64 {
        let mut q: VecDeque<u64> = VecDeque::new();
        let mut misses = 0;
        for &b in trace {
            if let Some(p) = q.iter().position(|&x| x == b) {
                q.remove(p);
            } else {
                misses += 1;
                if q.len() == c {
                    q.pop_back();
                }
            }
            q.push_front(b);
        }
        misses
    }

    #[test]
    fn exact_mrc_matches_brute_force_lru() {
        let mut rng = Rng::new(3);
        // Skewed, with enough distinct blocks to force compactions.
        let trace: Vec<u64> = (0..30_000)
            .map(|_| {
                let x = rng.next_f64();
                (x * x * x * 3000.0) as u64
            })
            .collect();
        let mut b = MrcBuilder::new(MrcMethod::Exact, 1);
        for &t in &trace {
            b.access(t);
        }
        let mrc = b.finish();
        for c in [1usize, 2, 10, 100, 500, 2999, 5000] {
            let want = lru_misses(&trace, c) as f64 / trace.len() as f64;
            let got = mrc.miss_ratio(c as u64);
            assert!((want - got).abs() < 1e-12, "c={c}: {got} vs {want}");
        }
    }

    #[test]
    fn stack_distance_basics_and_remove() {
        let mut s = StackDistance::new();
        assert_eq!(s.access(0), None);
        assert_eq!(s.access(1), None);
        assert_eq!(s.access(2), None);
        assert_eq!(s.access(0), Some(2));
        assert_eq!(s.access(0), Some(0));
        s.remove(1);
        assert_eq!(s.access(2), Some(1));
        assert_eq!(s.access(1), None);
        assert_eq!(s.live(), 3);
        for i in 0..5000u32 {
            s.access(i % 7);
        }
        assert_eq!(s.access(3), Some(5)); // 4, 5, 6, 0, 1 since
    }

    #[test]
    fn auto_is_exact_below_the_limit_and_shards_above() {
        let mut rng = Rng::new(4);
        let trace: Vec<u64> = (0..50_000).map(|_| rng.below(20_000)).collect();
        let run = |m: MrcMethod| {
            let mut b = MrcBuilder::new(m, 1);
            for &t in &trace {
                b.access(t);
            }
            b.finish()
        };
        let exact = run(MrcMethod::Exact);
        let small = run(MrcMethod::Auto {
            max_exact_blocks: 1000,
            fallback_blocks: 4096,
        });
        assert_eq!(
            small.method,
            MrcMethod::ShardsFixedSize { max_blocks: 4096 }
        );
        assert!(small.sample_rate < 1.0);
        let big = run(MrcMethod::default());
        assert_eq!(big.method, MrcMethod::Exact);
        assert_eq!(big, exact);
    }

    #[test]
    fn bucketed_histogram_is_exact_at_bucket_multiples() {
        let mut rng = Rng::new(9);
        let trace: Vec<u64> = (0..20_000).map(|_| rng.below(700)).collect();
        let mut exact = MrcBuilder::new(MrcMethod::Exact, 1);
        let mut coarse = MrcBuilder::new(MrcMethod::Exact, 50);
        for &t in &trace {
            exact.access(t);
            coarse.access(t);
        }
        let (e, c) = (exact.finish(), coarse.finish());
        for size in [50u64, 100, 350, 700] {
            assert!((e.miss_ratio(size) - c.miss_ratio(size)).abs() < 1e-12);
        }
    }
}
