//! The pool benchmark over several rounds: the order each round runs the
//! configurations in, and each configuration's medians over its rounds
//! with the spread between rounds (min and max), per volume and for the
//! pool.
//!
//! The pool's own hit ratio weighs each volume by the block references it
//! made in that run, so it moves with the mix: a run whose scanner got
//! more IOs through (each of its bypassed 256 KiB reads four misses)
//! reads lower, whatever the cache did. The pool's hit ratio *at a fixed
//! mix* ([`at_mix`]) weighs every run's per-volume hit ratios by the same
//! references per volume (the shared runs' medians), so configurations
//! compare by what their cache did, not by how fast each volume ran.

use crate::pool_report::{PoolRun, VolumeResult};
use crate::run_result::median;
use serde::Serialize;

/// The configurations of round `round` (0-based): `labels` rotated left
/// by `round`, so each configuration runs at every position once in
/// `labels.len()` rounds and round 0 keeps `labels`' order (the first
/// runs first: the best split needs a shared run before it).
pub fn order<'a>(labels: &[&'a str], round: usize) -> Vec<&'a str> {
    let n = labels.len().max(1);
    (0..labels.len()).map(|i| labels[(i + round) % n]).collect()
}

/// One figure over the rounds: its median, min and max (None: no round
/// had it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        Spread {
            median: median(v),
            min: v.iter().copied().reduce(f64::min),
            max: v.iter().copied().reduce(f64::max),
        }
    }
}

/// One volume (or the pool) over a configuration's rounds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VolumeMedians {
    pub name: String,
    pub iops: Spread,
    /// p99 completion latency in ns.
    pub p99_ns: Spread,
    /// Each round's hit ratio ([`VolumeResult::hit_ratio`]), 0..1.
    pub hit_ratio: Spread,
    pub bypassed_ios: Spread,
    pub total_ios: Spread,
}

impl VolumeMedians {
    fn of(name: &str, rs: &[&VolumeResult]) -> VolumeMedians {
        let get = |f: &dyn Fn(&VolumeResult) -> Option<f64>| {
            Spread::of(&rs.iter().filter_map(|v| f(v)).collect::<Vec<_>>())
        };
        VolumeMedians {
            name: name.to_string(),
            iops: get(&|v| Some(v.iops)),
            p99_ns: get(&|v| v.p99_ns.map(|x| x as f64)),
            hit_ratio: get(&|v| v.hit_ratio()),
            bypassed_ios: get(&|v| Some(v.bypassed_ios as f64)),
            total_ios: get(&|v| Some(v.total_ios as f64)),
        }
    }
}

/// A configuration's medians over the rounds it ran.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigMedians {
    pub label: String,
    pub rounds: usize,
    /// Every volume any round ran, in the first round's order.
    pub volumes: Vec<VolumeMedians>,
    /// The pool's totals ([`PoolRun::total`]) per round.
    pub pool: VolumeMedians,
    /// The pool's totals without the scanner's volume per round.
    pub pool_but_scan: VolumeMedians,
    /// The pool's hit ratio at the fixed mix per round ([`at_mix`]).
    pub pool_at_mix: Spread,
    /// The same without the scanner's volume.
    pub pool_but_scan_at_mix: Spread,
}

impl ConfigMedians {
    /// Over `runs` (those of one label), `scan` the scanner's volume,
    /// `mix` the references per volume the fixed-mix ratios weigh by.
    pub fn of(label: &str, runs: &[&PoolRun], scan: &str, mix: &[(String, f64)]) -> ConfigMedians {
        let mut names: Vec<&str> = Vec::new();
        for r in runs {
            for v in &r.volumes {
                if !names.contains(&v.name.as_str()) {
                    names.push(&v.name);
                }
            }
        }
        let volumes = names
            .iter()
            .map(|n| {
                let rs: Vec<&VolumeResult> = runs.iter().filter_map(|r| r.volume(n)).collect();
                VolumeMedians::of(n, &rs)
            })
            .collect();
        let totals: Vec<VolumeResult> = runs.iter().map(|r| r.total()).collect();
        let buts: Vec<VolumeResult> = runs.iter().map(|r| r.total_but(scan)).collect();
        let but: Vec<(String, f64)> = mix.iter().filter(|m| m.0 != scan).cloned().collect();
        let per = |mix: &[(String, f64)]| -> Spread {
            Spread::of(
                &runs
                    .iter()
                    .filter_map(|r| at_mix(r, mix))
                    .collect::<Vec<_>>(),
            )
        };
        ConfigMedians {
            label: label.to_string(),
            rounds: runs.len(),
            volumes,
            pool: VolumeMedians::of("pool", &totals.iter().collect::<Vec<_>>()),
            pool_but_scan: VolumeMedians::of("pool", &buts.iter().collect::<Vec<_>>()),
            pool_at_mix: per(mix),
            pool_but_scan_at_mix: per(&but),
        }
    }

    pub fn volume(&self, name: &str) -> Option<&VolumeMedians> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

/// Each volume's median block references (hits and misses) over `runs`:
/// the fixed mix of [`at_mix`].
pub fn mix_of(runs: &[&PoolRun]) -> Vec<(String, f64)> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        for v in &r.volumes {
            if !names.contains(&v.name.as_str()) {
                names.push(&v.name);
            }
        }
    }
    names
        .iter()
        .filter_map(|n| {
            let refs: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.volume(n))
                .map(|v| (v.hits + v.misses) as f64)
                .collect();
            Some((n.to_string(), median(&refs)?))
        })
        .collect()
}

/// `run`'s pool hit ratio had each volume made `mix`'s references: its
/// per-volume hit ratios weighed by `mix`. None if the run lacks a hit
/// ratio for a volume of `mix` (the scanner-off run against the whole
/// pool's mix), or `mix` weighs nothing.
pub fn at_mix(run: &PoolRun, mix: &[(String, f64)]) -> Option<f64> {
    let (mut hits, mut refs) = (0.0, 0.0);
    for (name, w) in mix {
        let h = run.volume(name)?.hit_ratio()?;
        hits += h * w;
        refs += w;
    }
    (refs > 0.0).then(|| hits / refs)
}

/// Per round in which both ran: `f(a) - f(b)`, `a` and `b` the runs of
/// two labels (the rounds paired, minutes apart at most).
pub fn paired(runs: &[PoolRun], a: &str, b: &str, f: &dyn Fn(&PoolRun) -> Option<f64>) -> Spread {
    let mut d = Vec::new();
    for ra in runs.iter().filter(|r| r.label == a) {
        let rb = runs.iter().find(|r| r.label == b && r.round == ra.round);
        if let (Some(x), Some(y)) = (f(ra), rb.and_then(f)) {
            d.push(x - y);
        }
    }
    Spread::of(&d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_the_order() {
        let l = ["a", "b", "c", "d"];
        assert_eq!(order(&l, 0), l);
        assert_eq!(order(&l, 1), ["b", "c", "d", "a"]);
        assert_eq!(order(&l, 5), ["b", "c", "d", "a"]);
        // Each label once at each position over four rounds.
        for pos in 0..4 {
            let mut at: Vec<&str> = (0..4).map(|r| order(&l, r)[pos]).collect();
            at.sort();
            assert_eq!(at, l);
        }
    }

    fn run(label: &str, round: usize, vols: &[(&str, u64, u64)]) -> PoolRun {
        PoolRun {
            label: label.into(),
            round,
            volumes: vols
                .iter()
                .map(|&(n, hits, misses)| VolumeResult {
                    name: n.into(),
                    iops: (hits + misses) as f64,
                    hits,
                    misses,
                    ..VolumeResult::default()
                })
                .collect(),
            others_cpu: None,
        }
    }

    #[test]
    fn medians_and_spread_per_volume_and_pool() {
        let runs = [
            run("s", 0, &[("hot", 80, 20), ("scan", 0, 100)]),
            run("s", 1, &[("hot", 90, 10), ("scan", 0, 100)]),
            run("s", 2, &[("hot", 60, 40), ("scan", 10, 90)]),
        ];
        let refs: Vec<&PoolRun> = runs.iter().collect();
        let mix = mix_of(&refs);
        assert_eq!(mix, [("hot".into(), 100.0), ("scan".into(), 100.0)]);
        let m = ConfigMedians::of("s", &refs, "scan", &mix);
        assert_eq!(m.rounds, 3);
        let hot = m.volume("hot").unwrap();
        assert_eq!(hot.hit_ratio.median, Some(0.8));
        assert_eq!(
            (hot.hit_ratio.min, hot.hit_ratio.max),
            (Some(0.6), Some(0.9))
        );
        // The pool: each round's total, then the median of those.
        assert_eq!(m.pool.hit_ratio.median, Some(0.4));
        assert_eq!(m.pool_but_scan.hit_ratio.median, Some(0.8));
        assert_eq!(m.pool.iops.median, Some(200.0));
        assert_eq!(m.pool_at_mix.median, Some(0.4));
        assert_eq!(m.pool_but_scan_at_mix.median, Some(0.8));
    }

    #[test]
    fn a_fixed_mix_ignores_how_fast_each_volume_ran() {
        // The same hit ratios per volume (80%, 0%), the scanner four times
        // as fast in b: b's own pool ratio drops, its ratio at a's mix
        // does not.
        let a = run("a", 0, &[("hot", 80, 20), ("scan", 0, 100)]);
        let b = run("b", 0, &[("hot", 80, 20), ("scan", 0, 400)]);
        assert_eq!(a.total().hit_ratio(), Some(0.4));
        assert_eq!(b.total().hit_ratio(), Some(0.16));
        let mix = mix_of(&[&a]);
        assert_eq!(at_mix(&b, &mix), Some(0.4));
        // A run without one of the mix's volumes has no ratio at it.
        let c = run("c", 0, &[("hot", 50, 50)]);
        assert_eq!(at_mix(&c, &mix), None);
        assert_eq!(at_mix(&c, &mix[..1]), Some(0.5));
    }

    #[test]
    fn pairs_rounds_by_number() {
        let runs = vec![
            run("a", 0, &[("hot", 80, 20)]),
            run("b", 0, &[("hot", 70, 30)]),
            run("b", 1, &[("hot", 50, 50)]),
            run("a", 1, &[("hot", 90, 10)]),
            // No "b" in round 2: unpaired, left out.
            run("a", 2, &[("hot", 0, 10)]),
        ];
        let d = paired(&runs, "a", "b", &|r| r.total().hit_ratio());
        assert!((d.min.unwrap() - 0.1).abs() < 1e-12);
        assert!((d.max.unwrap() - 0.4).abs() < 1e-12);
        assert!((d.median.unwrap() - 0.25).abs() < 1e-12);
    }
}
