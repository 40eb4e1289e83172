//! What a run measures: the command line ([`BenchArgs`]) and the sizes and
//! times it resolves to ([`Settings`]).

use anyhow::{bail, Result};
use serde::Serialize;
use std::path::PathBuf;
use tiercache_types::parse_size;

/// `tiercache bench` options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Data the two fio jobs read, both together (the study: 2 x 2 GiB).
    /// Default 32M (4G with --full).
    #[arg(long, value_parser = parse_size_arg)]
    pub data_size: Option<u64>,
    /// Cache device size for tiercache and nbdkit's cache filter. Default
    /// 40M (5G with --full).
    #[arg(long, value_parser = parse_size_arg)]
    pub cache_size: Option<u64>,
    /// Seconds each measured run lasts. Default 10 (1800 with --full).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Rounds: every configuration runs once per round, rounds
    /// interleave the configurations, and targets are judged on medians.
    /// Default 3 (1 with --full). `--rounds` is the same option.
    #[arg(long, visible_alias = "rounds")]
    pub repeats: Option<usize>,
    /// Cache block size of tiercache and nbdkit's cache filter.
    #[arg(long, default_value = "64k", value_parser = parse_size_arg)]
    pub block_size: u64,
    /// Where device files and fio outputs go (a disk, not tmpfs: the fast
    /// device is a file here, and nbdkit's cache file goes here too).
    #[arg(long, default_value = "/var/tmp/tiercache-bench")]
    pub work_dir: PathBuf,
    /// Where REPORT.md, the PNGs and results.json go. Default:
    /// WORK_DIR/report.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// The study's sizes: 4 GiB of data, 5 GiB cache, 30 minutes per run.
    #[arg(long)]
    pub full: bool,
    /// tiercache replacement policies to run, each optionally with an
    /// admission policy: `smq`, `lru`, `s3fifo+always`, ...
    #[arg(long, value_delimiter = ',', default_value = "adaptive+always")]
    pub policies: Vec<String>,
    /// tiercache cache modes to run (writethrough, writeback, writearound).
    #[arg(long, value_delimiter = ',', default_value = "writethrough")]
    pub modes: Vec<String>,
    /// Skip nbdkit's cache filter.
    #[arg(long)]
    pub no_nbdkit: bool,
    /// Memory cap (RSS + page cache) of the memory-capped nbdkit. Default:
    /// the peak RSS of tiercache serve with its file cache in the first
    /// round, i.e. the same memory budget.
    #[arg(long, value_parser = parse_size_arg)]
    pub nbdkit_memory: Option<u64>,
    /// Skip the runs of tiercache with its cache in RAM (`mem:`), the
    /// like-for-like comparison with nbdkit's uncapped, page-cache-backed
    /// cache file.
    #[arg(long)]
    pub no_ram_cache: bool,
    /// Also sweep the data size against the fixed cache size.
    #[arg(long)]
    pub sweep: bool,
    /// Data sizes of the sweep as multiples of the cache size (the study:
    /// 1..48 GiB against 4 GiB).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.25,0.5,1,2,4,8,12",
        requires = "sweep"
    )]
    pub sweep_factors: Vec<f64>,
    /// Seconds each sweep point is measured (after half as long filling
    /// the cache). Default: --runtime.
    #[arg(long)]
    pub sweep_runtime: Option<u64>,
    /// Also run the git workload (clone and `git grep`) on ext4 over the
    /// served device (needs root, FUSE and loop devices).
    #[arg(long)]
    pub git: bool,
    /// Files in the generated git repository.
    #[arg(long, default_value_t = 6000)]
    pub git_files: usize,
    /// `git grep` runs (cold page cache each) per configuration.
    #[arg(long, default_value_t = 5)]
    pub git_greps: usize,
    /// IOPS log window in milliseconds (fio's log_avg_msec).
    #[arg(long, default_value_t = 500)]
    pub log_msec: u64,
    /// Keep the device files in WORK_DIR afterwards.
    #[arg(long)]
    pub keep_files: bool,
    /// The pool benchmark instead: five volumes with different workloads
    /// at once on one shared cache, against equal static slices and the
    /// simulator's best static split, and without the scanner. Then
    /// --data-size is each volume's size (default 256M), --cache-size the
    /// shared cache's (default 64M), --runtime each measured run's after
    /// a warm-up of half as long (default 20), --rounds the rounds
    /// (default 3); --block-size, --policies (the first), --modes (the
    /// first), --work-dir, --out-dir and --keep-files apply, the other
    /// options do not.
    #[arg(long)]
    pub pool: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Sizes and times after applying --full and the defaults.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub data_size: u64,
    pub cache_size: u64,
    pub block_size: u64,
    pub runtime: u64,
    pub repeats: usize,
    pub sweep_runtime: u64,
    pub log_msec: u64,
    /// Bytes of region A (region B, as large as the data, follows it).
    pub junk_size: u64,
}

impl Settings {
    pub fn resolve(a: &BenchArgs) -> Result<Settings> {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let data = a.data_size.unwrap_or(if a.full { 4 * G } else { 32 * M });
        let cache = a.cache_size.unwrap_or(if a.full { 5 * G } else { 40 * M });
        let runtime = a.runtime.unwrap_or(if a.full { 1800 } else { 10 });
        let repeats = a.repeats.unwrap_or(if a.full { 1 } else { 3 });
        let bs = a.block_size;
        if !(4096..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
            bail!("--block-size {bs} must be a power of two from 4k to 1M");
        }
        // Two jobs, each over a whole number of cache blocks.
        let unit = 2 * bs;
        if data < unit || cache < 16 * bs {
            bail!("--data-size must be at least {unit} and --cache-size at least 16 blocks");
        }
        if runtime == 0 {
            bail!("--runtime must be at least 1 second");
        }
        if repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        if a.log_msec == 0 {
            bail!("--log-msec must be positive");
        }
        if a.sweep_factors.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
            bail!("--sweep-factors must be positive numbers");
        }
        let data = data / unit * unit;
        let cache = cache / bs * bs;
        Ok(Settings {
            data_size: data,
            cache_size: cache,
            block_size: bs,
            runtime,
            repeats,
            sweep_runtime: a.sweep_runtime.unwrap_or(runtime),
            log_msec: a.log_msec,
            junk_size: data.max(cache).div_ceil(unit) * unit,
        })
    }
}

/// `bench` options as parsed from `args` (the program name first), for the
/// crate's tests.
#[cfg(test)]
pub(crate) fn parse_args<const N: usize>(args: [&str; N]) -> BenchArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        b: BenchArgs,
    }
    Cli::parse_from(args).b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_full_sizes() {
        let a = parse_args(["x"]);
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(s.data_size, 32 << 20);
        assert_eq!(s.cache_size, 40 << 20);
        assert_eq!(s.junk_size, 40 << 20);
        assert_eq!((s.runtime, s.repeats), (10, 3));
        let a = parse_args(["x", "--full"]);
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(
            (s.data_size, s.cache_size, s.runtime, s.repeats),
            (4 << 30, 5 << 30, 1800, 1)
        );
        let a = parse_args(["x", "--full", "--repeats", "2"]);
        assert_eq!(Settings::resolve(&a).unwrap().repeats, 2);
        let a = parse_args(["x", "--block-size", "3k"]);
        assert!(Settings::resolve(&a).is_err());
        let a = parse_args(["x", "--repeats", "0"]);
        assert!(Settings::resolve(&a).is_err());
        let a = parse_args(["x", "--sweep", "--sweep-factors", "1,-2"]);
        assert!(Settings::resolve(&a).is_err());
    }
}
