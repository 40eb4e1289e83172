//! The notes a report carries: when each cache filled, whether the warm
//! hit ratio converged, and what a short trace cannot tell.

use super::driver::Task;
use super::results::ConfigResult;
use super::spec::{Convergence, SimSpec};
use std::sync::Mutex;

/// Records, for configurations whose cache became full during the chunk
/// just replayed (it began at request `chunk_start`), how many distinct
/// blocks had been seen by then.
pub(super) fn note_fills(
    tasks: &[Mutex<Task>],
    chunk_start: u64,
    distinct_at_fill: &mut [Option<u64>],
    distinct_hist: &mut Vec<(u64, u64)>,
) {
    let blocks = tasks[0].lock().expect("task lock");
    let Task::Blocks(b) = &*blocks else {
        unreachable!("the block task is first")
    };
    distinct_hist.push((
        chunk_start + b.distinct_after.len() as u64,
        b.ids.len() as u64,
    ));
    for (i, t) in tasks.iter().enumerate().skip(1) {
        if distinct_at_fill[i].is_some() {
            continue;
        }
        if let Task::Config(r) = &*t.lock().expect("task lock") {
            if let Some(at) = r.filled_at() {
                let idx = (at - chunk_start) as usize - 1;
                distinct_at_fill[i] = b.distinct_after.get(idx).copied();
            }
        }
    }
}

/// Window bookkeeping for [`Convergence`].
pub(super) struct ConvergeState {
    pub(super) spec: Convergence,
    pub(super) window: u64,
    /// Per task: (hits, refs) at the start of the current window, if the
    /// cache was full then.
    pub(super) start: Vec<Option<(u64, u64)>>,
    /// Per task: the last `windows` window hit ratios.
    pub(super) windows: Vec<std::collections::VecDeque<f64>>,
}

impl ConvergeState {
    pub(super) fn new(spec: Convergence, tasks: usize) -> Self {
        ConvergeState {
            spec,
            window: spec.window_requests(),
            start: vec![None; tasks],
            windows: vec![Default::default(); tasks],
        }
    }

    /// At a window boundary, records the window just ended and says
    /// whether every configuration has converged.
    pub(super) fn check(&mut self, tasks: &[Mutex<Task>], done: u64) -> bool {
        if done.checked_rem(self.window) != Some(0) {
            return false;
        }
        let k = self.spec.windows.max(1) as usize;
        let mut all = true;
        for (i, t) in tasks.iter().enumerate().skip(1) {
            let Task::Config(r) = &*t.lock().expect("task lock") else {
                continue;
            };
            let (h, n) = r.hits_refs();
            if let Some((h0, n0)) = self.start[i] {
                let w = &mut self.windows[i];
                w.push_back(if n > n0 {
                    (h - h0) as f64 / (n - n0) as f64
                } else {
                    0.0
                });
                if w.len() > k {
                    w.pop_front();
                }
            }
            self.start[i] = r.filled_at().map(|_| (h, n));
            let w = &self.windows[i];
            let ok = w.len() == k
                && r.warm_hit_ratio().is_some_and(|warm| {
                    let lo = w.iter().copied().fold(warm, f64::min);
                    let hi = w.iter().copied().fold(warm, f64::max);
                    hi - lo <= self.spec.tolerance
                });
            all &= ok;
        }
        all
    }
}

/// Requests after which `target` distinct blocks would have been seen, by
/// a power law fitted to the distinct-block counts at half the run and at
/// its end; `None` when the growth has (nearly) stopped.
pub fn requests_to_reach(hist: &[(u64, u64)], target: u64) -> Option<u64> {
    let &(n1, d1) = hist.last()?;
    let &(n0, d0) = hist.iter().find(|h| h.0 * 2 >= n1)?;
    if n0 == 0 || d0 == 0 || n0 >= n1 || d1 <= d0 {
        return None;
    }
    let a = (d1 as f64 / d0 as f64).ln() / (n1 as f64 / n0 as f64).ln();
    if a < 0.02 {
        return None;
    }
    let n = n1 as f64 * (target as f64 / d1 as f64).powf(1.0 / a);
    (n.is_finite() && n < 1e18).then_some(n as u64)
}

/// Notes for caches that never became full: their figures are cold-start
/// figures. One note per cache size when no configuration of it filled,
/// per configuration otherwise.
pub(super) fn fill_notes(
    spec: &SimSpec,
    configs: &[ConfigResult],
    distinct: u64,
    hist: &[(u64, u64)],
    requests_per_s: f64,
) -> Vec<String> {
    use crate::report::{fmt_bytes, fmt_count};
    let bs = spec.block_size as u64;
    let mut notes = Vec::new();
    let mut sizes = spec.cache_sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let of_size: Vec<&ConfigResult> = configs
            .iter()
            .filter(|c| c.cache_bytes == size && c.error.is_none())
            .collect();
        let unfilled: Vec<&&ConfigResult> = of_size.iter().filter(|c| c.warm.is_none()).collect();
        if unfilled.is_empty() {
            continue;
        }
        let blocks = size / bs;
        if distinct < blocks {
            let mut n = format!(
                "{}: cache never filled: the input touches only {} of its {} blocks ({} of {}); hit ratios are cold-start figures",
                fmt_bytes(size),
                fmt_count(distinct),
                fmt_count(blocks),
                fmt_bytes(distinct * bs),
                fmt_bytes(size)
            );
            if let Some(r) = requests_to_reach(hist, blocks) {
                let _ = std::fmt::Write::write_fmt(
                    &mut n,
                    format_args!(
                        " (at this input's rate of new blocks, filling it takes about {} requests, about {:.0} s of replay at this run's speed)",
                        fmt_count(r),
                        r as f64 / requests_per_s
                    ),
                );
            }
            notes.push(n);
        } else {
            for c in unfilled {
                notes.push(format!(
                    "{} {}: cache never filled ({} of {} blocks resident at the end); hit ratios are cold-start figures",
                    fmt_bytes(size),
                    c.policy,
                    fmt_count(c.counters.resident),
                    fmt_count(blocks)
                ));
            }
        }
    }
    notes
}

pub(super) fn convergence_note(
    c: &ConvergeState,
    stopped_by: &str,
    done: u64,
    configs: &[ConfigResult],
) -> String {
    use crate::report::fmt_count;
    if stopped_by == "converged" {
        return format!(
            "steady state: converged after {} requests ({})",
            fmt_count(done),
            c.spec.describe()
        );
    }
    let unsettled: Vec<String> = configs
        .iter()
        .filter(|r| r.error.is_none())
        .filter(|r| {
            let w = &r.window_hit_ratios;
            match r.warm {
                None => true,
                Some(warm) => {
                    w.len() < c.spec.windows.max(1) as usize || {
                        let lo = w.iter().copied().fold(warm.hit_ratio, f64::min);
                        let hi = w.iter().copied().fold(warm.hit_ratio, f64::max);
                        hi - lo > c.spec.tolerance
                    }
                }
            }
        })
        .map(|r| format!("{} {}", crate::report::fmt_bytes(r.cache_bytes), r.policy))
        .collect();
    format!(
        "NOT CONVERGED: stopped by the {} after {} requests; not yet steady: {}; the warm figures of these are not steady-state answers (rule: {})",
        if stopped_by == "time bound" {
            "time bound"
        } else {
            "IO bound"
        },
        fmt_count(done),
        if unsettled.len() > 8 {
            format!("{} configurations, e.g. {}", unsettled.len(), unsettled[..4].join(", "))
        } else {
            unsettled.join(", ")
        },
        c.spec.describe()
    )
}
