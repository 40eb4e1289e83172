//! Synthetic workloads with fio's definitions of its random distributions.
//!
//! The block-choice functions follow fio's `lib/zipf.c` and `lib/gauss.c`
//! (fio 3.x) step by step, with our own PRNG in place of fio's Tausworthe
//! generator, so the *distribution* is fio's but the exact sequence is not:
//! - `zipf:THETA[:CENTER]`: Gray et al.'s approximation as fio computes it
//!   (zeta(n) summed over at most 10 M terms, theta != 1);
//! - `pareto:H[:CENTER]`: `n = (nranges - 1) * u^(ln H / ln(1 - H))`;
//! - `normal:DEV[:CENTER]`: mean of 12 uniform draws plus a uniform
//!   deviation of `DEV` percent of the range, as fio does;
//! - `uniform` (fio's `random`): with fio's default random map every block is
//!   touched once per pass over the file. We draw a fresh pseudo-random
//!   permutation per pass (a keyed Feistel network); fio's map picks a random
//!   block and takes the next free one, which clusters a little more.
//!   `norandommap` gives independent uniform draws.
//!
//! Scrambling: like fio, zipf, pareto and normal map the drawn rank `r` to
//! block `(r * 0x61C8864680B583EB + off) mod nranges` (fio's `__hash_u64`
//! plus a random offset, or `CENTER * nranges` when a center is given), so
//! hot blocks are spread over the device rather than packed at its start.
//! As in fio this is not a bijection: a few ranks share a block and some
//! blocks get no rank. `scramble = false` is fio's `zipf_disable_hash`
//! (hot blocks at the low offsets, used by `fio-genzipf`).
//!
//! `nranges` is `size / bs`, fio's block count per file. Each of `jobs`
//! jobs has its own file of `size` bytes (job `j` at byte `j * size`), its
//! own PRNG stream, and the jobs' IOs are interleaved round-robin.
//!
//! Reads and writes: each IO (or each sequential run) is a read with
//! probability `rwmixread` percent; fio keeps the byte ratio exact instead,
//! which only matters over very short runs.
//!
//! Sequential scans: a `sequential_share` in 0..1 of the IOs belong to
//! sequential runs of `sequential_run` bytes starting at uniformly random
//! blocks; a share of 1 is a plain sequential job (fio's `rw=read`): one
//! stream from the start of the file, wrapping at its end.
//!
//! Time: synthetic requests carry the IO counter as their time.

use crate::error::{Error, Result};
use crate::rng::{mix64, Rng};
use crate::trace::Request;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use tiercache_types::{Access, Time};

/// fio's `GOLDEN_RATIO_64`, the multiplier of `__hash_u64`.
pub const FIO_GOLDEN_RATIO_64: u64 = 0x61C8_8646_80B5_83EB;
/// fio caps the zeta(n) sum at this many terms (`ZIPF_MAX_GEN`).
pub const FIO_ZIPF_MAX_GEN: u64 = 10_000_000;

/// fio's `random_distribution`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    Zipf { theta: f64, center: Option<f64> },
    Pareto { h: f64, center: Option<f64> },
    Normal { dev_pct: f64, center: Option<f64> },
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, v, c) = match *self {
            Distribution::Uniform => return f.write_str("uniform"),
            Distribution::Zipf { theta, center } => ("zipf", theta, center),
            Distribution::Pareto { h, center } => ("pareto", h, center),
            Distribution::Normal { dev_pct, center } => ("normal", dev_pct, center),
        };
        write!(f, "{name}:{v}")?;
        if let Some(c) = c {
            write!(f, ":{c}")?;
        }
        Ok(())
    }
}

impl FromStr for Distribution {
    type Err = Error;
    /// Accepts fio's spellings: `random`/`uniform`, `zipf:THETA[:CENTER]`,
    /// `pareto:H[:CENTER]`, `normal:DEV[:CENTER]` (also `gauss`). Without a
    /// value fio's defaults apply (zipf 1.1, pareto 0.2, normal 0).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |m: &str| Error::Config(format!("random_distribution '{s}': {m}"));
        let mut parts = s.trim().split(':');
        let name = parts.next().unwrap_or("").to_ascii_lowercase();
        let num = |p: Option<&str>, what: &str| -> Result<Option<f64>> {
            match p {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| bad(&format!("{what} '{v}' is not a number"))),
            }
        };
        let value = num(parts.next(), "value")?;
        let center = num(parts.next(), "center")?;
        if let Some(c) = center {
            if !(0.0..=1.0).contains(&c) {
                return Err(bad("center must be between 0 and 1"));
            }
        }
        if parts.next().is_some() {
            return Err(bad("too many ':' fields"));
        }
        let d = match name.as_str() {
            "random" | "uniform" => Distribution::Uniform,
            "zipf" => {
                let theta = value.unwrap_or(1.1);
                if theta == 1.0 || theta <= 0.0 || !theta.is_finite() {
                    return Err(bad("zipf theta must be positive and different from 1.0"));
                }
                Distribution::Zipf { theta, center }
            }
            "pareto" => {
                let h = value.unwrap_or(0.2);
                if !(h > 0.0 && h < 1.0) {
                    return Err(bad("pareto h must be between 0 and 1 (exclusive)"));
                }
                Distribution::Pareto { h, center }
            }
            "normal" | "gauss" => {
                let dev_pct = value.unwrap_or(0.0);
                if !(0.0..=100.0).contains(&dev_pct) {
                    return Err(bad("normal deviation must be 0..100 (percent)"));
                }
                Distribution::Normal { dev_pct, center }
            }
            "zoned" | "zoned_abs" => return Err(bad("zoned distributions are not supported")),
            _ => return Err(bad("expected random, zipf:T, pareto:H or normal:DEV")),
        };
        Ok(d)
    }
}

/// A synthetic workload. See the module documentation for the semantics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub distribution: Distribution,
    /// fio's hashing of ranks to blocks (fio's default: on).
    pub scramble: bool,
    /// Uniform only: each block once per pass (fio's default random map).
    pub randommap: bool,
    /// Percentage of reads, 0..=100.
    pub rwmixread: u8,
    /// Share of IOs that belong to sequential runs, 0..=1.
    pub sequential_share: f64,
    /// Bytes per sequential run (rounded down to whole blocks, at least one).
    pub sequential_run: u64,
    /// IO size and alignment in bytes (fio's `bs`).
    pub block_size: u64,
    /// Bytes per job file (fio's `size`).
    pub size: u64,
    /// Jobs, each on its own file (fio's `numjobs`).
    pub jobs: u32,
    /// Total IOs over all jobs.
    pub ios: u64,
    pub seed: u64,
}

impl Default for Workload {
    /// The field study's job: zipf 1.2 random 4 KiB reads over two 2 GiB
    /// files, one pass worth of IOs.
    fn default() -> Self {
        Workload {
            distribution: Distribution::Zipf {
                theta: 1.2,
                center: None,
            },
            scramble: true,
            randommap: true,
            rwmixread: 100,
            sequential_share: 0.0,
            sequential_run: 4 << 20,
            block_size: 4096,
            size: 2 << 30,
            jobs: 2,
            ios: 2 * (2 << 30) / 4096,
            seed: 1,
        }
    }
}

impl Workload {
    /// Blocks per job file.
    pub fn nranges(&self) -> u64 {
        self.size / self.block_size.max(1)
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("workload: {m}")));
        if self.block_size == 0 {
            return bad("block size must not be 0".into());
        }
        if self.nranges() == 0 {
            return bad(format!(
                "size {} is smaller than the block size {}",
                self.size, self.block_size
            ));
        }
        if self.jobs == 0 {
            return bad("need at least one job".into());
        }
        if self.rwmixread > 100 {
            return bad("rwmixread must be 0..=100".into());
        }
        if !(0.0..=1.0).contains(&self.sequential_share) {
            return bad("sequential share must be between 0 and 1".into());
        }
        if (self.jobs as u64).checked_mul(self.size).is_none() {
            return bad("jobs * size overflows".into());
        }
        // The same checks as parsing (a Distribution can be built directly).
        self.distribution
            .to_string()
            .parse::<Distribution>()
            .map_err(|e| Error::Config(format!("workload: {e}")))?;
        Ok(())
    }

    /// The request stream. Deterministic for a given workload (seed included).
    pub fn requests(&self) -> Result<Synthetic> {
        self.validate()?;
        let jobs = (0..self.jobs)
            .map(|j| JobGen::new(self, j))
            .collect::<Vec<_>>();
        Ok(Synthetic {
            jobs,
            next_job: 0,
            emitted: 0,
            total: self.ios,
            bs: self.block_size,
            size: self.size,
        })
    }
}

/// Per-distribution state, as fio keeps it per file.
#[derive(Clone, Debug)]
enum Picker {
    Uniform,
    UniformMap {
        pass: u64,
        pos: u64,
        perm: Permutation,
    },
    Zipf {
        theta: f64,
        zetan: f64,
        zeta2: f64,
        off: u64,
    },
    Pareto {
        pow: f64,
        off: u64,
    },
    Normal {
        stddev: u64,
        off: u64,
    },
}

/// fio's `__rand() / FRAND32_MAX`: uniform on [0, 1] from 32 bits.
fn fio_uniform(rng: &mut Rng) -> f64 {
    rng.next_u32() as f64 / u32::MAX as f64
}

fn center_or_random(center: Option<f64>, n: u64, rng: &mut Rng) -> u64 {
    match center {
        Some(c) => ((n as f64 * c) as u64).min(n.saturating_sub(1)),
        // fio: rand_off = __rand(), a 32-bit value, reduced mod n later.
        None => rng.next_u32() as u64,
    }
}

impl Picker {
    fn new(d: &Distribution, n: u64, randommap: bool, rng: &mut Rng) -> Picker {
        match *d {
            Distribution::Uniform if randommap => Picker::UniformMap {
                pass: 0,
                pos: 0,
                perm: Permutation::new(n, rng.next_u64()),
            },
            Distribution::Uniform => Picker::Uniform,
            Distribution::Zipf { theta, center } => {
                let off = center_or_random(center, n, rng);
                let zetan = (0..n.min(FIO_ZIPF_MAX_GEN))
                    .map(|i| (1.0 / (i + 1) as f64).powf(theta))
                    .sum();
                Picker::Zipf {
                    theta,
                    zetan,
                    zeta2: 1.0 + 0.5f64.powf(theta),
                    off,
                }
            }
            Distribution::Pareto { h, center } => Picker::Pareto {
                pow: h.ln() / (1.0 - h).ln(),
                off: center_or_random(center, n, rng),
            },
            Distribution::Normal { dev_pct, center } => {
                let mut stddev = if dev_pct != 0.0 {
                    ((n as f64 * dev_pct) / 100.0).ceil() as u64
                } else {
                    0
                };
                stddev = stddev.min(n / 2);
                // fio: rand_off = nranges * (center - 0.5), 0 without a center.
                let off = match center {
                    Some(c) => (((c - 0.5) * n as f64) as i64).rem_euclid(n as i64) as u64,
                    None => 0,
                };
                Picker::Normal { stddev, off }
            }
        }
    }

    /// The next block in [0, n).
    fn next(&mut self, n: u64, scramble: bool, rng: &mut Rng) -> u64 {
        let hash = |v: u64| {
            if scramble {
                v.wrapping_mul(FIO_GOLDEN_RATIO_64)
            } else {
                v
            }
        };
        match self {
            Picker::Uniform => rng.below(n),
            Picker::UniformMap { pass, pos, perm } => {
                if *pos == n {
                    *pass += 1;
                    *pos = 0;
                    *perm = Permutation::new(n, rng.next_u64());
                }
                let b = perm.apply(*pos);
                *pos += 1;
                b
            }
            Picker::Zipf {
                theta,
                zetan,
                zeta2,
                off,
            } => {
                let theta = *theta;
                let nf = n as f64;
                let alpha = 1.0 / (1.0 - theta);
                let eta = (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - *zeta2 / *zetan);
                let u = fio_uniform(rng);
                let z = u * *zetan;
                let val: u64 = if z < 1.0 {
                    1
                } else if z < 1.0 + 0.5f64.powf(theta) {
                    2
                } else {
                    1 + (nf * (eta * u - eta + 1.0).powf(alpha)) as u64
                };
                hash(val - 1).wrapping_add(*off) % n
            }
            Picker::Pareto { pow, off } => {
                let u = fio_uniform(rng);
                let v = ((n - 1) as f64 * u.powf(*pow)) as u64;
                hash(v).wrapping_add(*off) % n
            }
            Picker::Normal { stddev, off } => {
                const ITERS: u64 = 12;
                let mut sum: u64 = 0;
                for _ in 0..ITERS {
                    sum += rng.below(n + 1);
                }
                sum = sum.div_ceil(ITERS);
                if *stddev > 0 {
                    let r = rng.next_u32() as f64 / (u32::MAX as f64 + 1.0);
                    let vr = (*stddev as f64 * r) as i64;
                    let mut dev = vr - (*stddev / 2) as i64;
                    // fio halves the deviation until it stays in range. The
                    // mean rounds up to n at most, and a zero deviation cannot
                    // shrink further: fio's loop spins forever there (sum = n,
                    // dev = 0, which small n and stddev make likely); here the
                    // final `% n` folds it back into range instead.
                    while dev != 0 && (sum as i64 + dev >= n as i64 || (sum as i64 + dev) < 0) {
                        dev /= 2;
                    }
                    sum = (sum as i64 + dev) as u64;
                }
                hash(sum).wrapping_add(*off) % n
            }
        }
    }
}

/// A keyed pseudo-random permutation of [0, n): a 4-round Feistel network
/// over the smallest even-bit-width domain covering n, with cycle walking.
#[derive(Clone, Debug)]
struct Permutation {
    n: u64,
    half_bits: u32,
    key: u64,
}

impl Permutation {
    fn new(n: u64, key: u64) -> Self {
        let bits = 64 - (n.max(2) - 1).leading_zeros();
        Permutation {
            n,
            half_bits: bits.div_ceil(2).max(1),
            key,
        }
    }

    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for i in 0..4u64 {
            let f = mix64(r ^ self.key.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }

    fn apply(&self, i: u64) -> u64 {
        let mut x = self.round(i);
        while x >= self.n {
            x = self.round(x);
        }
        x
    }
}

#[derive(Clone, Debug)]
struct JobGen {
    rng: Rng,
    picker: Picker,
    n: u64,
    scramble: bool,
    rwmixread: u8,
    /// Probability of starting a sequential run at an IO boundary.
    run_start_p: f64,
    run_blocks: u64,
    pure_sequential: bool,
    /// Blocks left in the current run, its next block and direction.
    run_left: u64,
    run_next: u64,
    run_access: Access,
}

impl JobGen {
    fn new(w: &Workload, job: u32) -> Self {
        let mut rng = Rng::new(w.seed ^ (job as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        let n = w.nranges();
        let picker = Picker::new(&w.distribution, n, w.randommap, &mut rng);
        let run_blocks = (w.sequential_run / w.block_size).clamp(1, n);
        let s = w.sequential_share;
        let l = run_blocks as f64;
        // A run start yields L IOs, a random pick 1: share = qL / (qL + 1 - q).
        let run_start_p = if s >= 1.0 {
            1.0
        } else {
            s / (l * (1.0 - s) + s)
        };
        JobGen {
            rng,
            picker,
            n,
            scramble: w.scramble,
            rwmixread: w.rwmixread,
            run_start_p,
            run_blocks,
            pure_sequential: s >= 1.0,
            run_left: 0,
            run_next: 0,
            run_access: Access::Read,
        }
    }

    fn access(&mut self) -> Access {
        if (self.rng.below(100) as u8) < self.rwmixread {
            Access::Read
        } else {
            Access::Write
        }
    }

    /// (block, access) of the next IO of this job.
    fn next(&mut self) -> (u64, Access) {
        if self.pure_sequential {
            let b = self.run_next;
            self.run_next = (self.run_next + 1) % self.n;
            return (b, self.access());
        }
        if self.run_left == 0 && self.run_start_p > 0.0 && self.rng.next_f64() < self.run_start_p {
            self.run_left = self.run_blocks;
            self.run_next = self.rng.below(self.n - self.run_blocks + 1);
            self.run_access = self.access();
        }
        if self.run_left > 0 {
            self.run_left -= 1;
            let b = self.run_next;
            self.run_next += 1;
            return (b, self.run_access);
        }
        let b = self.picker.next(self.n, self.scramble, &mut self.rng);
        (b, self.access())
    }
}

/// Iterator over a synthetic workload's requests.
#[derive(Clone, Debug)]
pub struct Synthetic {
    jobs: Vec<JobGen>,
    next_job: usize,
    emitted: u64,
    total: u64,
    bs: u64,
    size: u64,
}

impl Iterator for Synthetic {
    type Item = Request;
    fn next(&mut self) -> Option<Request> {
        if self.emitted >= self.total {
            return None;
        }
        let j = self.next_job;
        self.next_job = if j + 1 == self.jobs.len() { 0 } else { j + 1 };
        let (block, access) = self.jobs[j].next();
        let r = Request {
            time: Time(self.emitted),
            offset: j as u64 * self.size + block * self.bs,
            len: self.bs,
            access,
        };
        self.emitted += 1;
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.total - self.emitted) as usize;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Synthetic {}

impl Synthetic {
    /// Share of the requests emitted so far (0..=1).
    pub fn fraction_done(&self) -> f64 {
        if self.total == 0 {
            1.0
        } else {
            self.emitted as f64 / self.total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn workload(d: &str, size_blocks: u64, ios: u64) -> Workload {
        Workload {
            distribution: d.parse().unwrap(),
            size: size_blocks * 4096,
            jobs: 1,
            ios,
            ..Workload::default()
        }
    }

    fn counts(w: &Workload) -> HashMap<u64, u64> {
        let mut m = HashMap::new();
        for r in w.requests().unwrap() {
            assert_eq!(r.len, 4096);
            assert_eq!(r.offset % 4096, 0);
            assert!(r.offset < w.size * w.jobs as u64);
            *m.entry(r.offset / 4096).or_insert(0) += 1;
        }
        m
    }

    #[test]
    fn parses_fio_distribution_names() {
        assert_eq!(
            "zipf:1.2".parse::<Distribution>().unwrap(),
            Distribution::Zipf {
                theta: 1.2,
                center: None
            }
        );
        assert_eq!(
            "pareto:0.3:0.5".parse::<Distribution>().unwrap(),
            Distribution::Pareto {
                h: 0.3,
                center: Some(0.5)
            }
        );
        assert_eq!(
            "random".parse::<Distribution>().unwrap(),
            Distribution::Uniform
        );
        for bad in [
            "zipf:1",
            "zipf:x",
            "pareto:1.5",
            "normal:200",
            "zoned:50/5",
            "lognormal",
        ] {
            assert!(bad.parse::<Distribution>().is_err(), "{bad}");
        }
        let d: Distribution = "normal:5:0.25".parse().unwrap();
        assert_eq!(d.to_string().parse::<Distribution>().unwrap(), d);
    }

    #[test]
    fn zipf_unscrambled_is_skewed_like_fio_genzipf() {
        // With theta 1.2 over 2^16 blocks, rank 1 gets 1/zeta(n) of the IOs.
        let n = 1u64 << 16;
        let mut w = workload("zipf:1.2:0", n, 200_000);
        w.scramble = false;
        let c = counts(&w);
        let zetan: f64 = (1..=n).map(|i| (i as f64).powf(-1.2)).sum();
        let p0 = c[&0] as f64 / 200_000.0;
        assert!(
            (p0 - 1.0 / zetan).abs() < 0.01,
            "p0 {p0} want {}",
            1.0 / zetan
        );
        // Hot blocks first: the lowest 10% of blocks get most of the IOs.
        let low: u64 = c.iter().filter(|(b, _)| **b < n / 10).map(|(_, v)| v).sum();
        assert!(low as f64 / 200_000.0 > 0.8, "{low}");
    }

    #[test]
    fn scrambled_zipf_spreads_hot_blocks() {
        let n = 1u64 << 16;
        let c = counts(&workload("zipf:1.2", n, 200_000));
        let low: u64 = c.iter().filter(|(b, _)| **b < n / 10).map(|(_, v)| v).sum();
        assert!((low as f64 / 200_000.0) < 0.5, "{low}");
        // Still skewed: the 10% hottest blocks take most IOs.
        let mut v: Vec<u64> = c.values().copied().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = v.iter().take((n / 10) as usize).sum();
        assert!(top as f64 / 200_000.0 > 0.8, "{top}");
    }

    #[test]
    fn uniform_with_random_map_covers_every_block_once_per_pass() {
        let n = 1000;
        let c = counts(&workload("random", n, 3 * n));
        assert_eq!(c.len() as u64, n);
        assert!(c.values().all(|&v| v == 3));
        let mut w = workload("random", n, 3 * n);
        w.randommap = false;
        let c = counts(&w);
        assert!(c.values().any(|&v| v != 3));
    }

    #[test]
    fn pareto_and_normal_stay_in_range_and_skew() {
        let n = 10_000;
        let c = counts(&workload("pareto:0.2", n, 100_000));
        let mut v: Vec<u64> = c.values().copied().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = v.iter().take((n / 5) as usize).sum();
        assert!(top > 60_000, "pareto 0.2: top 20% got {top}");
        let mut w = workload("normal:0", n, 100_000);
        w.scramble = false;
        let c = counts(&w);
        let mid: u64 = c
            .iter()
            .filter(|(b, _)| (4000..6000).contains(*b))
            .map(|(_, v)| v)
            .sum();
        // Mean of 12 uniforms: sd = n/12, so +-1000 blocks is +-1.2 sd: ~77%.
        assert!((70_000..85_000).contains(&mid), "{mid}");
    }

    #[test]
    fn normal_over_two_blocks_terminates_and_stays_in_range() {
        // Found by the fio_job fuzz target: 2 blocks and a 5% deviation give a
        // stddev of 1, so the deviation is often 0 while the mean is n.
        for n in 1..=4 {
            let c = counts(&workload("normal:5:0.25", n, 10_000));
            assert_eq!(c.values().sum::<u64>(), 10_000);
            assert!(c.keys().all(|&b| b < n), "{c:?}");
        }
    }

    #[test]
    fn mix_sequential_share_and_jobs() {
        let w = Workload {
            distribution: Distribution::Uniform,
            randommap: false,
            rwmixread: 70,
            sequential_share: 0.5,
            sequential_run: 64 * 4096,
            size: 1 << 30,
            jobs: 2,
            ios: 200_000,
            ..Workload::default()
        };
        let reqs: Vec<Request> = w.requests().unwrap().collect();
        assert_eq!(reqs.len(), 200_000);
        let reads = reqs.iter().filter(|r| r.access == Access::Read).count();
        assert!(
            (0.67..0.73).contains(&(reads as f64 / 200_000.0)),
            "{reads}"
        );
        // Jobs alternate and stay in their files.
        assert!(reqs.iter().step_by(2).all(|r| r.offset < 1 << 30));
        assert!(reqs.iter().skip(1).step_by(2).all(|r| r.offset >= 1 << 30));
        // IOs that continue the previous IO of the same job: about half.
        let job0: Vec<&Request> = reqs.iter().step_by(2).collect();
        let seq = job0
            .windows(2)
            .filter(|p| p[1].offset == p[0].offset + 4096)
            .count();
        let share = seq as f64 / job0.len() as f64;
        assert!((0.45..0.52).contains(&share), "{share}");
        // Deterministic.
        let again: Vec<Request> = w.requests().unwrap().collect();
        assert_eq!(reqs, again);
    }

    #[test]
    fn directly_built_bad_distributions_are_rejected() {
        for d in [
            Distribution::Zipf {
                theta: 1.0,
                center: None,
            },
            Distribution::Pareto {
                h: 1.0,
                center: None,
            },
            Distribution::Normal {
                dev_pct: 5.0,
                center: Some(2.0),
            },
        ] {
            let w = Workload {
                distribution: d,
                ..Workload::default()
            };
            assert!(w.requests().is_err(), "{d}");
        }
    }

    #[test]
    fn pure_sequential_wraps() {
        let w = Workload {
            sequential_share: 1.0,
            size: 4 * 4096,
            jobs: 1,
            ios: 6,
            ..Workload::default()
        };
        let offs: Vec<u64> = w.requests().unwrap().map(|r| r.offset / 4096).collect();
        assert_eq!(offs, vec![0, 1, 2, 3, 0, 1]);
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 17, 1000, 4096] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = p.apply(i);
                assert!(!seen[x as usize]);
                seen[x as usize] = true;
            }
        }
    }
}
