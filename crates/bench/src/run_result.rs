//! What one measured configuration produced: its runs (samples), the row
//! the table shows (`RunResult`, its repeats and representative run), the
//! points of the data-size sweep, and the statistics over repeats (median,
//! per-round ratios). Below both `report` (the tables) and `plot` (the
//! PNGs), which read it.

use crate::fio::Measured;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Fast,
    Slow,
    Tiercache,
    Nbdkit,
}

/// One run of one configuration (one round), as measured.
#[derive(Clone, Debug)]
pub struct Sample {
    pub round: usize,
    pub measured: Measured,
    /// Read hit ratio over the run (tiercache: its own counters).
    pub hit_ratio: Option<f64>,
    pub promotions: Option<u64>,
    pub demotions: Option<u64>,
    /// Share of the machine's CPU used by other processes meanwhile.
    pub others_cpu: Option<f64>,
    pub note: String,
}

impl Sample {
    pub fn new(round: usize, measured: Measured) -> Sample {
        Sample {
            round,
            measured,
            hit_ratio: None,
            promotions: None,
            demotions: None,
            others_cpu: None,
            note: String::new(),
        }
    }
}

/// What the table keeps of every repeat.
#[derive(Clone, Debug, Serialize)]
pub struct Repeat {
    /// Round (0-based) the run belongs to.
    pub round: usize,
    pub iops: f64,
    pub hit_ratio: Option<f64>,
    pub others_cpu: Option<f64>,
}

/// One measured configuration: its repeats, and the run of median IOPS
/// (the representative: latency, hit ratio, plots).
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub label: String,
    pub kind: Kind,
    /// Measured after the cache was filled with stale data.
    pub stale: bool,
    /// The representative run (median IOPS).
    pub measured: Measured,
    /// Read hit ratio of the representative run.
    pub hit_ratio: Option<f64>,
    pub promotions: Option<u64>,
    pub demotions: Option<u64>,
    /// tiercache with its cache device in RAM (a reference, not a target
    /// for "as fast as the fast device").
    pub ram_cache: bool,
    /// nbdkit in a memory cgroup (the like-for-like peer of tiercache's
    /// file cache).
    pub memory_capped: bool,
    /// Every repeat, in round order.
    pub repeats: Vec<Repeat>,
    pub note: String,
}

/// The median of `v` (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl RunResult {
    /// One sample, one repeat.
    pub fn new(
        label: &str,
        kind: Kind,
        stale: bool,
        measured: Measured,
        hit_ratio: Option<f64>,
    ) -> RunResult {
        let mut s = Sample::new(0, measured);
        s.hit_ratio = hit_ratio;
        RunResult::from_samples(label, kind, stale, vec![s])
    }

    /// The row of `samples` (at least one): the representative is the run
    /// of median IOPS (the lower middle one for an even count).
    pub fn from_samples(label: &str, kind: Kind, stale: bool, samples: Vec<Sample>) -> RunResult {
        assert!(!samples.is_empty(), "a row needs at least one run");
        let repeats: Vec<Repeat> = samples
            .iter()
            .map(|s| Repeat {
                round: s.round,
                iops: s.measured.iops,
                hit_ratio: s.hit_ratio,
                others_cpu: s.others_cpu,
            })
            .collect();
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by(|&a, &b| {
            samples[a]
                .measured
                .iops
                .total_cmp(&samples[b].measured.iops)
        });
        let rep = samples
            .into_iter()
            .nth(order[(order.len() - 1) / 2])
            .expect("index in range");
        RunResult {
            label: label.to_string(),
            kind,
            stale,
            measured: rep.measured,
            hit_ratio: rep.hit_ratio,
            promotions: rep.promotions,
            demotions: rep.demotions,
            ram_cache: false,
            memory_capped: false,
            repeats,
            note: rep.note,
        }
    }

    fn iops_values(&self) -> Vec<f64> {
        self.repeats.iter().map(|r| r.iops).collect()
    }

    /// Median IOPS over the repeats.
    pub fn median_iops(&self) -> f64 {
        median(&self.iops_values()).unwrap_or(0.0)
    }

    pub fn min_iops(&self) -> f64 {
        self.iops_values().into_iter().fold(f64::INFINITY, f64::min)
    }

    pub fn max_iops(&self) -> f64 {
        self.iops_values().into_iter().fold(0.0, f64::max)
    }

    /// Median share of the CPU used by other processes during its runs.
    pub fn others_cpu(&self) -> Option<f64> {
        median(
            &self
                .repeats
                .iter()
                .filter_map(|r| r.others_cpu)
                .collect::<Vec<_>>(),
        )
    }
}

/// `a / b` per round, for the rounds both ran (ratios of runs minutes
/// apart, so slow drift of the machine cancels); if they share no round,
/// the ratio of their medians.
pub fn paired_ratios(a: &RunResult, b: &RunResult) -> Vec<f64> {
    let v: Vec<f64> = a
        .repeats
        .iter()
        .filter_map(|x| {
            b.repeats
                .iter()
                .find(|y| y.round == x.round && y.iops > 0.0)
                .map(|y| x.iops / y.iops)
        })
        .collect();
    if v.is_empty() && b.median_iops() > 0.0 {
        return vec![a.median_iops() / b.median_iops()];
    }
    v
}

/// One point of the data-size sweep (tiercache, cache filled first).
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    /// Data size as a multiple of the cache size.
    pub factor: f64,
    pub data_size: u64,
    pub measured: Measured,
    pub hit_ratio: Option<f64>,
    /// Share of the machine's CPU used by other processes meanwhile.
    pub others_cpu: Option<f64>,
}
