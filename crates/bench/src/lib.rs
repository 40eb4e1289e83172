//! `tiercache bench`: the field study run again, side by side, on this
//! machine.
//!
//! Every configuration is an NBD export read by the study's fio job
//! (randread, zipf:1.2, 4 KiB, iodepth 8, 2 jobs, per-job IOPS logs):
//!
//! | configuration | served by |
//! |---|---|
//! | fast device alone | `tiercache serve --backing FAST` (a file, no cache) |
//! | slow device alone | `tiercache serve --backing hdd:BACKING` (emulated HDD, no cache) |
//! | tiercache, empty cache / full of stale data | `tiercache serve --backing hdd:BACKING --cache CACHE` (O_DIRECT file) |
//! | tiercache (RAM cache), ... | the same with `--cache mem:SIZE` |
//! | nbdkit cache filter (memory-capped), ... | `nbdkit --filter=cache nbd` in front of the slow device alone, in a memory cgroup as large as tiercache's own memory |
//! | nbdkit cache filter (in page cache), ... | the same without the cap: its cache file lives in the page cache, i.e. RAM |
//!
//! nbdkit keeps its cache in a temporary file written through the page
//! cache; on an idle machine that file is RAM. The like-for-like peer of
//! tiercache's O_DIRECT file cache is therefore nbdkit with the same memory
//! budget (its RSS and page cache together capped at tiercache's peak RSS,
//! its cache file on the fast device's filesystem), and the peer of
//! tiercache's RAM cache is nbdkit uncapped.
//!
//! The backing device holds two regions: A (`max(data, cache)` bytes) and
//! B (`data` bytes). Each cached server measures two runs, as the study's
//! two runs met the cache: "empty cache" reads A's first `data` bytes from
//! a fresh cache, then every block of A is read once (the cache is then
//! full of A), then "full of stale data" reads B. fio's nbd engine has no
//! files, so regions stand in for the study's deleted and new files.
//!
//! The machine may be shared and noisy, so every configuration runs
//! `repeats` times, interleaved: each round runs every configuration once
//! (odd rounds in reverse order), the table shows min/median/max, and every
//! target is judged on the median of the per-round ratios (the two sides of
//! a ratio ran minutes apart at most). Each run also records the share of
//! the machine's CPU that other processes used meanwhile.
//!
//! Results go to `out_dir`: `REPORT.md` (table, targets, plots),
//! `results.json`, merged IOPS logs as CSV, and PNG plots. Device files
//! and fio outputs live in `work_dir`.

mod ctx;
mod files;
mod fio;
pub mod fio_dir;
mod git;
mod plot;
mod pool;
mod pool_jobs;
mod pool_report;
mod pool_rounds;
mod pool_sim;
mod procs;
mod progress;
mod report;
mod run;
mod run_result;
mod settings;
mod table;
mod variant;

pub use fio::{merge_iops_logs, parse_json, Measured, PERCENTILES};
pub use run::run;
pub use run_result::{median, Repeat, RunResult, SweepPoint};
pub use settings::{BenchArgs, Settings};
pub use variant::Variant;

use serde::Serialize;

/// Everything one `tiercache bench` run produced.
#[derive(Serialize)]
pub struct Results {
    pub settings: Settings,
    pub variants: Vec<Variant>,
    /// One row per configuration, in table order; each holds its repeats.
    pub runs: Vec<RunResult>,
    pub sweep: Vec<SweepPoint>,
    /// Completion latency (ns) at or below which an IO counts as served at
    /// fast-device latency: the fast device's own p99 (its median run).
    pub fast_threshold_ns: u64,
    /// The memory cap of the memory-capped nbdkit, if it ran.
    pub nbdkit_memory_cap: Option<u64>,
    pub git: Option<git::GitResults>,
    pub notes: Vec<String>,
    /// Wall-clock seconds of the whole benchmark.
    pub elapsed_secs: f64,
}

impl Results {
    /// Median IOPS of the fast device's repeats.
    pub fn fast_iops(&self) -> Option<f64> {
        self.fast_row().map(|r| r.median_iops())
    }

    pub fn fast_row(&self) -> Option<&RunResult> {
        self.runs.iter().find(|r| r.kind == run_result::Kind::Fast)
    }
}
