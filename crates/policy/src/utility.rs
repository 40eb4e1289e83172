//! A volume's hit curve, estimated live: how many of its recent block
//! references a cache of `n` blocks would have served, for every `n` up to
//! a reach (a few times the cache), at points a quarter apart. The pool's
//! sharing (`sharing.rs`) reads it to give cache space to the volumes that
//! gain the most hits from it.
//!
//! Method: SHARDS, fixed-size variant (Waldspurger et al., FAST '15). A
//! block is sampled when a hash of its pool key falls below a threshold;
//! only sampled blocks are tracked, with LRU stack distances counted among
//! them and scaled by the sampling rate. When more blocks than the curve's
//! sample size are tracked, the threshold drops to the largest tracked
//! hash and blocks at or above it are forgotten, so memory per volume is
//! bounded whatever the volume's footprint. The sample size comes from the
//! pool ([`samples_per_volume`]): a pool of few volumes affords large
//! samples (exact curves for volumes up to [`MAX_SAMPLES`] blocks), a pool
//! of thousands [`MIN_SAMPLES`] each (about 30 KiB). The curve is LRU's; the
//! live policy is not LRU, but the curve ranks volumes by what more space
//! is worth, which is all the sharing needs.
//!
//! Two parts, aged on two clocks. The curve's *shape* (the share of the
//! volume's references a cache of `n` blocks would hit) comes from the
//! volume's own references and halves after each
//! [`CURVE_REACH`](crate::sharing::CURVE_REACH) caches' worth of them
//! ([`UtilityCurve::age`]): a reuse distance of `n` blocks takes at least
//! `n` of the volume's references to be seen, whatever the others do, so
//! a quiet volume's curve is as complete as a busy one's. Its *rate* (the
//! volume's references per epoch of the pool's, [`UtilityCurve::end_epoch`])
//! follows the pool's clock, so a volume that goes idle soon has a curve
//! of nothing and gives its space up. The sharing compares
//! [`UtilityCurve::points`], shape times rate: hits per epoch.
//!
//! Cost per reference: one hash and a compare; a sampled one adds a hash
//! map lookup and two Fenwick-tree walks. No IO, no clock: references are
//! the only input.

use std::collections::{BinaryHeap, HashMap};
use tiercache_types::OriginBlock;

/// Blocks tracked per volume in a pool of many volumes.
pub const MIN_SAMPLES: usize = 512;
/// Blocks tracked per volume at most, in a pool of few.
pub const MAX_SAMPLES: usize = 16384;
/// Blocks tracked by all the pool's curves together, while each volume
/// tracks more than [`MIN_SAMPLES`] (about 72 bytes each: under 5 MiB).
pub const POOL_SAMPLES: usize = 65536;
/// Hashes are compared in this many bits.
const HASH_BITS: u32 = 24;
const HASH_SPACE: u64 = 1 << HASH_BITS;
/// Stamps live in a window of this many times the sample size before
/// renumbering.
const WINDOW_FACTOR: usize = 4;

/// The sample size of each curve in a pool of `volumes` volumes: the
/// pool's budget shared evenly, within [`MIN_SAMPLES`]..=[`MAX_SAMPLES`].
///
/// Why it matters: the split (`sharing.rs`) compares volumes' gains, and
/// where two volumes' gains are close, a sampled curve's error decides
/// which of them gets a step of a quarter of its space. With 512 samples
/// of a 4096-block volume, the hash that picks the sample alone moved 140
/// blocks between two volumes of the pool bench's recordings (one volume's
/// hit ratio by up to 2.7 points, the pool's by under 0.1).
pub fn samples_per_volume(volumes: usize) -> usize {
    (POOL_SAMPLES / volumes.max(1)).clamp(MIN_SAMPLES, MAX_SAMPLES)
}

/// The sampled hit curve of one volume.
#[derive(Clone, Debug)]
pub struct UtilityCurve {
    /// Bucket edges in blocks, growing by about a quarter, the last one
    /// the reach: bucket `i` holds distances in `[edges[i-1], edges[i])`
    /// (bucket 0: below `edges[0]` = 1).
    edges: std::sync::Arc<[u64]>,
    /// `hist[i]`: weighted references whose reuse distance fell in bucket
    /// `i`; distances beyond the reach and first references are only
    /// counted in `total`.
    hist: Vec<f64>,
    total: f64,
    /// Blocks whose hash is below this are sampled.
    threshold: u64,
    /// Sampled block -> (stamp, hash).
    tracked: HashMap<u64, (u32, u32)>,
    /// Tracked blocks by hash, largest first (to shrink the sample).
    by_hash: BinaryHeap<(u32, u64)>,
    /// Fenwick tree over stamps: 1 where a tracked block's latest stamp is.
    fenwick: Vec<i32>,
    next_stamp: u32,
    /// Most blocks tracked ([`UtilityCurve::set_samples`]).
    samples: usize,
    /// References (all, sampled or not) since the shape last aged.
    since_aged: u64,
    /// References (all) in the pool's current epoch.
    epoch_refs: u64,
    /// References per epoch of the pool's, recent epochs weighing more.
    refs_per_epoch: f64,
}

impl UtilityCurve {
    /// A curve whose buckets end at `edges` (from [`curve_edges`]),
    /// tracking [`MIN_SAMPLES`] blocks.
    pub fn new(edges: std::sync::Arc<[u64]>) -> Self {
        UtilityCurve {
            hist: vec![0.0; edges.len()],
            edges,
            total: 0.0,
            threshold: HASH_SPACE,
            tracked: HashMap::new(),
            by_hash: BinaryHeap::new(),
            fenwick: Vec::new(),
            next_stamp: 0,
            samples: MIN_SAMPLES,
            since_aged: 0,
            epoch_refs: 0,
            refs_per_epoch: 0.0,
        }
    }

    /// Tracks at most `samples` blocks from now on (at least one). A
    /// smaller sample forgets blocks at once, as when it fills; a larger
    /// one only grows as new blocks below the threshold come, since the
    /// threshold never rises.
    pub fn set_samples(&mut self, samples: usize) {
        self.samples = samples.max(1);
        if self.tracked.len() > self.samples {
            self.shrink();
        }
    }

    /// The bucket edges in blocks.
    pub fn edges(&self) -> &[u64] {
        &self.edges
    }

    /// The sampling rate now (1 = every block).
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / HASH_SPACE as f64
    }

    /// Records one reference to `block`.
    pub fn reference(&mut self, block: OriginBlock) {
        self.since_aged += 1;
        self.epoch_refs += 1;
        let hash = hash24(block.0);
        if hash as u64 >= self.threshold {
            return;
        }
        let weight = 1.0 / self.rate();
        self.total += weight;
        if self.fenwick.is_empty() {
            self.fenwick = vec![0; WINDOW_FACTOR * self.samples + 1];
        }
        if let Some(&(stamp, _)) = self.tracked.get(&block.0) {
            // Tracked blocks referenced since `stamp`: the stack distance.
            let newer = self.tracked.len() as i64 - self.prefix(stamp) as i64;
            let distance = (newer as f64 / self.rate()) as u64;
            let bucket = self.edges.partition_point(|&e| e <= distance);
            if let Some(h) = self.hist.get_mut(bucket) {
                *h += weight;
            }
            self.add(stamp, -1);
        } else {
            self.by_hash.push((hash, block.0));
        }
        if self.next_stamp as usize + 1 >= self.fenwick.len() {
            self.renumber();
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.add(stamp, 1);
        self.tracked.insert(block.0, (stamp, hash));
        if self.tracked.len() > self.samples {
            self.shrink();
        }
    }

    /// Weighted references an LRU cache of `blocks` blocks would have hit
    /// (reuse distance below `blocks`), linear within a bucket.
    pub fn hits(&self, blocks: u64) -> f64 {
        let mut sum = 0.0;
        let mut low = 0;
        for (i, &edge) in self.edges.iter().enumerate() {
            if blocks >= edge {
                sum += self.hist[i];
                low = edge;
                continue;
            }
            let width = (edge - low).max(1) as f64;
            sum += self.hist[i] * (blocks - low) as f64 / width;
            break;
        }
        sum
    }

    /// The curve as `(blocks, hits per epoch)` at every edge, from
    /// `(0, 0)`: the shape (hits per reference) times the rate.
    pub fn points(&self) -> Vec<(u64, f64)> {
        let scale = if self.total > 0.0 {
            self.refs_per_epoch / self.total
        } else {
            0.0
        };
        let mut sum = 0.0;
        let mut out = Vec::with_capacity(self.edges.len() + 1);
        out.push((0, 0.0));
        for (i, &edge) in self.edges.iter().enumerate() {
            sum += self.hist[i];
            out.push((edge, sum * scale));
        }
        out
    }

    /// Ends one of the pool's epochs: the rate takes in the references of
    /// the epoch, the past keeping `keep` (0..1) of its weight.
    pub fn end_epoch(&mut self, keep: f64) {
        self.refs_per_epoch = keep * self.refs_per_epoch + (1.0 - keep) * self.epoch_refs as f64;
        self.epoch_refs = 0;
    }

    /// References per epoch of the pool's, recent epochs weighing more.
    pub fn refs_per_epoch(&self) -> f64 {
        self.refs_per_epoch
    }

    /// Halves the shape's history once `span` of the volume's own
    /// references have come since it last did (so recent references weigh
    /// more and the shape follows a change of workload).
    pub fn age(&mut self, span: u64) {
        if self.since_aged >= span {
            self.decay();
            self.since_aged = 0;
        }
    }

    /// Weighted references recorded (sampled ones, scaled).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// Halves the history, so recent references weigh more.
    pub fn decay(&mut self) {
        for h in &mut self.hist {
            *h *= 0.5;
        }
        self.total *= 0.5;
    }

    /// Bytes of RAM this curve uses (about).
    pub fn memory_bytes(&self) -> usize {
        self.hist.len() * 8
            + self.tracked.capacity() * 24
            + self.by_hash.capacity() * 16
            + self.fenwick.len() * 4
    }

    /// Drops the tracked blocks with the largest hashes until at most
    /// the sample size remain, lowering the threshold to the largest
    /// dropped hash.
    fn shrink(&mut self) {
        while self.tracked.len() > self.samples {
            let Some((hash, _)) = self.by_hash.peek().copied() else {
                break;
            };
            self.threshold = hash as u64;
            while let Some(&(h, b)) = self.by_hash.peek() {
                if (h as u64) < self.threshold {
                    break;
                }
                self.by_hash.pop();
                if let Some((stamp, _)) = self.tracked.remove(&b) {
                    self.add(stamp, -1);
                }
            }
        }
    }

    /// Gives the tracked blocks stamps 0..n in their stamp order, in a
    /// window sized for the sample size now.
    fn renumber(&mut self) {
        let mut live: Vec<(u32, u64)> = self.tracked.iter().map(|(&b, &(s, _))| (s, b)).collect();
        live.sort_unstable();
        self.fenwick.clear();
        self.fenwick.resize(WINDOW_FACTOR * self.samples + 1, 0);
        for (i, &(_, b)) in live.iter().enumerate() {
            let e = self.tracked.get_mut(&b).expect("tracked");
            e.0 = i as u32;
        }
        self.next_stamp = 0;
        for _ in 0..live.len() {
            let s = self.next_stamp;
            self.next_stamp += 1;
            self.add(s, 1);
        }
    }

    /// Adds `v` at stamp `s`.
    fn add(&mut self, s: u32, v: i32) {
        let mut i = s as usize + 1;
        while i < self.fenwick.len() {
            self.fenwick[i] += v;
            i += i & i.wrapping_neg();
        }
    }

    /// Tracked blocks whose latest stamp is at most `s`.
    fn prefix(&self, s: u32) -> i32 {
        let mut i = s as usize + 1;
        let mut sum = 0;
        while i > 0 {
            sum += self.fenwick[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }
}

/// Bucket edges for a curve reaching `reach` blocks: 1, then growing by
/// a quarter (at least one block), the last edge `reach`.
pub fn curve_edges(reach: u64) -> std::sync::Arc<[u64]> {
    let mut edges = vec![1u64];
    while *edges.last().expect("one edge") < reach {
        let e = *edges.last().expect("one edge");
        edges.push((e + e.div_ceil(4)).min(reach));
    }
    edges.into()
}

/// A 24-bit hash of a pool key (splitmix64's finalizer, top bits).
fn hash24(x: u64) -> u32 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> (64 - HASH_BITS)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop over `n` blocks: LRU hits everything once the cache holds
    /// `n` blocks and nothing below.
    #[test]
    fn a_loop_hits_only_once_it_fits() {
        let mut c = UtilityCurve::new(curve_edges(2000));
        for _ in 0..20 {
            for b in 0..1000u64 {
                c.reference(OriginBlock(b));
            }
        }
        // Distance 999 for every re-reference.
        let total = c.total();
        assert!(c.hits(800) / total < 0.05, "{} of {total}", c.hits(800));
        assert!(c.hits(1300) / total > 0.85, "{} of {total}", c.hits(1300));
        let points = c.points();
        assert_eq!(points[0], (0, 0.0));
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(points.last().unwrap().0, 2000);
    }

    /// A large footprint keeps memory bounded and the estimate close.
    #[test]
    fn sampling_bounds_memory_and_keeps_the_shape() {
        let mut c = UtilityCurve::new(curve_edges(100_000));
        for _ in 0..6 {
            for b in 0..50_000u64 {
                c.reference(OriginBlock(b * 7 + 3));
            }
        }
        assert!(c.tracked.len() <= MIN_SAMPLES);
        assert!(c.rate() < 0.05, "rate {}", c.rate());
        let total = c.total();
        // Reuse distance 50,000 blocks.
        assert!(c.hits(40_000) / total < 0.1, "{}", c.hits(40_000) / total);
        assert!(c.hits(65_000) / total > 0.6, "{}", c.hits(65_000) / total);
    }

    /// Zipf-like references to a volume of `blocks` blocks, the pool
    /// key's volume set by `volume` (which moves the sample).
    fn skewed(c: &mut UtilityCurve, blocks: u64, volume: u64, n: u64) {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Squaring a uniform draw skews it towards low block numbers.
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let b = (u * u * blocks as f64) as u64;
            c.reference(OriginBlock(volume << 48 | b));
        }
    }

    /// With a sample as large as the volume the curve is exact, whichever
    /// blocks the hash would pick; with the small sample it depends on
    /// them.
    #[test]
    fn a_sample_as_large_as_the_volume_makes_the_curve_exact() {
        let curves = |samples: usize| -> Vec<Vec<(u64, f64)>> {
            (0..4)
                .map(|volume| {
                    let mut c = UtilityCurve::new(curve_edges(4096));
                    c.set_samples(samples);
                    skewed(&mut c, 4096, volume, 200_000);
                    c.end_epoch(0.5);
                    c.points()
                })
                .collect()
        };
        let exact = curves(4096);
        assert!(exact.windows(2).all(|w| w[0] == w[1]), "{exact:?}");
        // With 512 of the 4096 blocks, the hits at a quarter of the volume
        // are within 40% of the exact figure, but differ between samples
        // by more than a tenth (here 62k to 99k against 80k).
        let at = |p: &[(u64, f64)], b: u64| p.iter().find(|q| q.0 >= b).unwrap().1;
        let e = at(&exact[0], 1024);
        let sampled: Vec<f64> = curves(MIN_SAMPLES).iter().map(|p| at(p, 1024)).collect();
        assert!(
            sampled.iter().all(|s| (s - e).abs() / e < 0.4),
            "{sampled:?} against {e}"
        );
        let (lo, hi) = sampled
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &s| (l.min(s), h.max(s)));
        assert!(hi / lo > 1.1, "{sampled:?}");
    }

    #[test]
    fn a_smaller_sample_forgets_at_once_and_a_pool_shares_its_budget() {
        let mut c = UtilityCurve::new(curve_edges(4096));
        c.set_samples(4096);
        skewed(&mut c, 4096, 0, 100_000);
        assert!(c.tracked.len() > MIN_SAMPLES);
        c.set_samples(MIN_SAMPLES);
        assert!(c.tracked.len() <= MIN_SAMPLES);
        assert!(c.rate() < 0.5);
        // Still counting after the window was resized.
        skewed(&mut c, 4096, 0, 100_000);
        assert!(c.tracked.len() <= MIN_SAMPLES);

        assert_eq!(samples_per_volume(1), MAX_SAMPLES);
        assert_eq!(samples_per_volume(5), POOL_SAMPLES / 5);
        assert_eq!(samples_per_volume(1024), MIN_SAMPLES);
        assert!((1..5000).all(|n| samples_per_volume(n) * n <= POOL_SAMPLES.max(MIN_SAMPLES * n)));
    }

    /// Hot blocks among cold ones: the hot half of the references hits
    /// once the cache holds the hot set and the cold blocks between two
    /// references to it (about 4,000 blocks), however few of the hot
    /// blocks the sample holds.
    #[test]
    fn a_hot_set_shows_once_it_fits() {
        let mut c = UtilityCurve::new(curve_edges(10_000));
        let mut cold = 1_000_000u64;
        for i in 0..400_000u64 {
            if i % 2 == 0 {
                c.reference(OriginBlock((i / 2) % 2000));
            } else {
                cold += 1;
                c.reference(OriginBlock(cold));
            }
        }
        let total = c.total();
        let below = c.hits(3000) / total;
        let above = c.hits(5000) / total;
        assert!(below < 0.1, "hit at 3,000 blocks: {below}");
        assert!((0.4..0.6).contains(&above), "hit at 5,000 blocks: {above}");
        c.decay();
        assert!((c.hits(5000) / c.total() - above).abs() < 1e-9);
    }
}
