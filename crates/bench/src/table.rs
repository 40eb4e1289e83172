//! The results table while rounds run: one row per configuration and
//! cache state, found by its [`RowKey`] (never by its printed label or its
//! position), each collecting its repeats.

use crate::run_result::{self, Kind, RunResult};
use crate::variant::Variant;

/// One configuration measured once per round.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Config {
    Fast,
    /// Index into the variants.
    Tiercache(usize),
    /// nbdkit's cache filter; `capped`: in a memory cgroup.
    Nbdkit {
        capped: bool,
    },
}

/// Which row a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKey {
    Fast,
    Slow,
    /// A tiercache variant (index into the variants), in a cache state.
    Tiercache {
        variant: usize,
        stale: bool,
    },
    /// nbdkit's cache filter, memory-capped or not, in a cache state.
    Nbdkit {
        capped: bool,
        stale: bool,
    },
}

/// A table row while its repeats are being collected.
struct Row {
    key: RowKey,
    label: String,
    kind: Kind,
    stale: bool,
    ram_cache: bool,
    memory_capped: bool,
    samples: Vec<run_result::Sample>,
}

pub(crate) fn state_label(stale: bool) -> &'static str {
    if stale {
        "full of stale data"
    } else {
        "empty cache"
    }
}

/// The label of nbdkit's row.
pub(crate) fn nbdkit_label(capped: bool) -> &'static str {
    if capped {
        "nbdkit cache filter (memory-capped)"
    } else {
        "nbdkit cache filter (in page cache)"
    }
}

/// The rows in table order.
pub(crate) struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// The baselines, then each variant's two states, then nbdkit's
    /// (capped if `memcg`, uncapped if `nbdkit`).
    pub(crate) fn new(vars: &[Variant], only_default: bool, memcg: bool, nbdkit: bool) -> Table {
        let row = |key, label: String, kind, stale| Row {
            key,
            label,
            kind,
            stale,
            ram_cache: false,
            memory_capped: false,
            samples: Vec::new(),
        };
        let mut rows = vec![
            row(RowKey::Fast, "fast device alone".into(), Kind::Fast, false),
            row(
                RowKey::Slow,
                "slow device alone (HDD model)".into(),
                Kind::Slow,
                false,
            ),
        ];
        for (variant, v) in vars.iter().enumerate() {
            for stale in [false, true] {
                let label = format!("{}, {}", v.label(only_default), state_label(stale));
                let mut r = row(
                    RowKey::Tiercache { variant, stale },
                    label,
                    Kind::Tiercache,
                    stale,
                );
                r.ram_cache = v.ram;
                rows.push(r);
            }
        }
        for (on, capped) in [(memcg, true), (nbdkit, false)] {
            if on {
                for stale in [false, true] {
                    let label = format!("{}, {}", nbdkit_label(capped), state_label(stale));
                    let mut r = row(RowKey::Nbdkit { capped, stale }, label, Kind::Nbdkit, stale);
                    r.memory_capped = capped;
                    rows.push(r);
                }
            }
        }
        Table { rows }
    }

    /// Adds a repeat to row `key` (ignored if the table has no such row).
    pub(crate) fn push(&mut self, key: RowKey, sample: run_result::Sample) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.key == key) {
            r.samples.push(sample);
        }
    }

    /// The rows that got samples, as results, in table order.
    pub(crate) fn into_results(self) -> Vec<RunResult> {
        self.rows
            .into_iter()
            .filter(|r| !r.samples.is_empty())
            .map(|r| {
                let mut x = RunResult::from_samples(&r.label, r.kind, r.stale, r.samples);
                x.ram_cache = r.ram_cache;
                x.memory_capped = r.memory_capped;
                x
            })
            .collect()
    }
}
