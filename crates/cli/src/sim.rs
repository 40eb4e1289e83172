//! `tiercache sim`: which cache size and policy give which hit ratio and
//! IOPS for a workload, answered by replaying it through the engine's own
//! decision code (crates/sim) instead of buying and filling a device.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use tiercache_sim::{
    synth::Distribution, DeviceModel, Input, MrcMethod, OutputPaths, SimSpec, TraceOptions,
    Workload,
};
use tiercache_types::{parse_size, CacheMode};

/// What to replay and which caches to try.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// A block trace: fio iolog v2/v3, blkparse text, MSR Cambridge, Tencent
    /// CBS, Alibaba or SPC CSV, libCacheSim vscsi (detected), a trace
    /// `tiercache trace` recorded (detected), or libCacheSim oracleGeneral
    /// (name it with --format); gzip, zstd or bzip2 compressed or not.
    #[arg(long, conflicts_with_all = ["fio_job", "workload"])]
    trace: Option<PathBuf>,
    /// Trace format instead of detection: fio, blkparse, msr, tencent,
    /// alibaba, spc (UMass Financial/WebSearch; one volume per ASU), vscsi
    /// (libCacheSim CloudPhysics binary, VSCSI1 or VSCSI2), tiercache
    /// (recorded by `tiercache trace`), `oracleGeneral[:UNIT]` (libCacheSim binary; obj_id is the offset in
    /// UNIT: byte (default), sector or block:BYTES), or csv:MAPPING (e.g.
    /// csv:time=0,op=1,op_read=R,offset=2,len=3,unit=sector; a sector offset
    /// with a byte length: offset_unit=sector,len_unit=byte).
    #[arg(long, requires = "trace")]
    format: Option<String>,
    /// A fio job file whose random_distribution/bs/size/rw/numjobs define
    /// the workload.
    #[arg(long)]
    fio_job: Option<PathBuf>,
    /// The job section of --fio-job to simulate (default: the first).
    #[arg(long, requires = "fio_job")]
    fio_section: Option<String>,
    /// A synthetic workload: zipf:THETA, pareto:H, uniform, normal:SIGMA
    /// (fio's definitions).
    #[arg(long)]
    workload: Option<String>,
    /// Synthetic: data size per job (e.g. 1T).
    #[arg(long, default_value = "2G", value_parser = parse_size)]
    size: u64,
    /// Synthetic: IO size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    bs: u64,
    /// Synthetic: jobs (each on its own range).
    #[arg(long, default_value_t = 2)]
    jobs: u32,
    /// Synthetic: percentage of reads.
    #[arg(long, default_value_t = 100)]
    rwmixread: u8,
    /// Synthetic or fio job: number of IOs. Default for a synthetic workload
    /// (and a time_based fio job): run until every configuration's warm hit
    /// ratio has converged (the last 3 windows of 1Mi IOs and the warm
    /// figure within 0.25 points), at most 200 million IOs and
    /// --max-seconds; a fio job with a size runs as fio would.
    #[arg(long)]
    ios: Option<u64>,
    /// Without --ios: stop replaying after this many seconds if the hit
    /// ratios have not converged by then (the output then says so).
    #[arg(long, default_value_t = 45.0)]
    max_seconds: f64,
    /// Cache sizes to try, comma separated (e.g. 1G,10G,100G).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, required = true)]
    cache_sizes: Vec<u64>,
    /// Policies to try, comma separated, as REPLACEMENT+ADMISSION (e.g.
    /// smq+hotspot,lru+always,s3fifo+always,arc+always). Default: all.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Cache mode to simulate.
    #[arg(long, default_value = "writethrough")]
    mode: CacheMode,
    /// Cache block size.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    block_size: u64,
    /// Sequential cutoff (0 disables).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    sequential_cutoff: u64,
    /// Device model FAST/SLOW, presets ram, nvme, sata-ssd, hdd (e.g. nvme/hdd).
    #[arg(long, default_value = "nvme/hdd")]
    devices: String,
    /// IOs in flight, for the IOPS prediction.
    #[arg(long, default_value_t = 8)]
    queue_depth: u32,
    /// Use SHARDS sampling at this rate for the miss-ratio curve (default:
    /// exact).
    #[arg(long)]
    shards: Option<f64>,
    /// Skip the Belady/OPT bound.
    #[arg(long)]
    no_opt: bool,
    /// Write the full results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw miss ratio against cache size per policy (PNG) here.
    #[arg(long)]
    png: Option<PathBuf>,
    /// A multi-volume trace as one pool: every volume its own volume of
    /// the shared cache (as `serve --volume` does), then, per cache size
    /// and for the first policy, the shared cache's hits against the best
    /// static split and equal slices, and the busiest volumes.
    #[arg(long, requires = "trace")]
    pool: bool,
}

pub fn run(a: &SimArgs) -> Result<()> {
    let input = if let Some(path) = &a.trace {
        let mut options = TraceOptions::default();
        if let Some(f) = &a.format {
            options.format = Some(
                f.parse()
                    .map_err(|e| anyhow::anyhow!("--format {f}: {e}"))?,
            );
        }
        Input::Trace {
            path: path.clone(),
            options,
        }
    } else if let Some(path) = &a.fio_job {
        Input::FioJob {
            path: path.clone(),
            section: a.fio_section.clone(),
            ios: a.ios,
        }
    } else {
        let dist: Distribution = match &a.workload {
            Some(w) => w
                .parse()
                .map_err(|e| anyhow::anyhow!("--workload {w}: {e}"))?,
            None => {
                bail!("say what to simulate: --trace FILE, --fio-job FILE or --workload zipf:1.2")
            }
        };
        Input::Workload(Workload {
            distribution: dist,
            rwmixread: a.rwmixread,
            block_size: a.bs,
            size: a.size,
            jobs: a.jobs,
            ios: a.ios.unwrap_or(tiercache_sim::OPEN_ENDED_IO_BOUND),
            ..Workload::default()
        })
    };
    let policies = if a.policies.is_empty() {
        tiercache_sim::default_policies()
    } else {
        a.policies
            .iter()
            .map(|p| {
                tiercache_sim::parse_policy(p).map_err(|e| anyhow::anyhow!("--policies {p}: {e}"))
            })
            .collect::<Result<_>>()?
    };
    let mut spec = SimSpec {
        block_size: u32::try_from(a.block_size).context("--block-size")?,
        mode: a.mode,
        sequential_cutoff: a.sequential_cutoff,
        cache_sizes: a.cache_sizes.clone(),
        policies,
        device: DeviceModel::parse(&a.devices).map_err(anyhow::Error::msg)?,
        queue_depth: a.queue_depth,
        ..SimSpec::default()
    };
    if a.ios.is_none() && a.trace.is_none() {
        spec.converge = Some(tiercache_sim::Convergence {
            max_seconds: a.max_seconds,
            ..Default::default()
        });
    }
    if a.no_opt {
        spec.opt = None;
    }
    spec.pool = a.pool;
    if let (Some(rate), Some(mrc)) = (a.shards, spec.mrc.as_mut()) {
        mrc.method = MrcMethod::Shards { rate };
    }
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:10} [{bar:40}] {percent}% {pos}‰ ({elapsed} elapsed, {eta} left)",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    let mut report = tiercache_sim::run(&input, &spec, &|p: &tiercache_sim::Progress| {
        bar.set_message(format!("{:?}", p.phase).to_lowercase());
        if let Some(f) = p.fraction {
            bar.set_position((f * 1000.0) as u64);
        }
    })?;
    bar.finish_and_clear();
    if a.pool {
        if let Input::Trace { path, options } = &input {
            report.pool = pool_splits(path, options, &spec)?;
        }
    }
    let table = tiercache_sim::write_outputs(
        &report,
        &OutputPaths {
            json: a.json.clone(),
            png: a.png.clone(),
        },
    )?;
    print!("{table}");
    if !report.pool.is_empty() {
        print_pool(&report.pool, &spec)?;
    }
    Ok(())
}

/// The pool's shared cache against static splits per cache size, for the
/// first policy (see `tiercache_sim::pool`).
fn pool_splits(
    path: &std::path::Path,
    options: &TraceOptions,
    spec: &SimSpec,
) -> Result<Vec<tiercache_sim::simulate::PoolSplit>> {
    let requests = tiercache_sim::trace::open_trace(path, options)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .with_context(|| format!("reading {}", path.display()))?;
    let policy = spec.policies.first().context("no policy")?;
    spec.cache_sizes
        .iter()
        .map(|&size| {
            tiercache_sim::pool::compare_splits(spec, policy, size, &requests)
                .map_err(anyhow::Error::msg)
        })
        .collect()
}

/// Prints the shared cache against static splits, and the busiest volumes
/// of the last size.
fn print_pool(splits: &[tiercache_sim::simulate::PoolSplit], spec: &SimSpec) -> Result<()> {
    let policy = spec.policies.first().context("no policy")?;
    println!();
    println!(
        "Pool: one shared cache against the same cache cut into a slice per volume ({policy})"
    );
    println!(
        "{:>10}  {:>7}  {:>7}  {:>17}  {:>11}",
        "cache", "volumes", "shared", "best static split", "equal split"
    );
    for s in splits {
        let size = s.cache_bytes;
        println!(
            "{:>10}  {:>7}  {:>6.2}%  {:>16.2}%  {:>10.2}%",
            tiercache_types::fmt_bytes(size),
            s.volumes,
            100.0 * s.shared_hit_ratio(),
            100.0 * s.best_static_hit_ratio(),
            100.0 * s.equal_hit_ratio()
        );
    }
    if let Some(s) = splits.last() {
        let mut vols = s.shared_volumes.clone();
        vols.sort_by_key(|v| {
            std::cmp::Reverse(
                v.counters.read_hits
                    + v.counters.read_misses
                    + v.counters.write_hits
                    + v.counters.write_misses,
            )
        });
        println!();
        println!(
            "Busiest volumes, shared cache of {}:",
            tiercache_types::fmt_bytes(s.cache_bytes)
        );
        println!(
            "{:>7}  {:>10}  {:>8}  {:>10}  {:>10}",
            "volume", "block refs", "hits", "resident", "target"
        );
        for v in vols.iter().take(10) {
            let c = &v.counters;
            let refs = c.read_hits + c.read_misses + c.write_hits + c.write_misses;
            let hits = c.read_hits + c.write_hits;
            println!(
                "{:>7}  {:>10}  {:>7.2}%  {:>10}  {:>10}",
                v.volume,
                refs,
                100.0 * hits as f64 / refs.max(1) as f64,
                c.resident,
                v.target_blocks.map_or("-".to_string(), |t| t.to_string())
            );
        }
    }
    Ok(())
}
