//! `tiercache bench`: the field study (docs: /work/shared/reference) run
//! again, side by side, on this machine.
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

mod fio;
pub mod fio_dir;
mod git;
mod plot;
mod procs;
mod progress;
mod report;

pub use fio::{merge_iops_logs, parse_json, Measured, PERCENTILES};
pub use report::{median, Repeat, RunResult, SweepPoint};

use anyhow::{bail, Context, Result};
use procs::{CpuMeter, MemCgroup, Server, Stats};
use progress::Progress;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
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
    /// Default 3 (1 with --full).
    #[arg(long)]
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

/// One tiercache variant: replacement+admission policy and cache mode.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub policy: String,
    pub admission: Option<String>,
    pub mode: String,
    /// Cache device in RAM (`mem:SIZE`) instead of a file.
    pub ram: bool,
}

impl Variant {
    /// "tiercache" for the defaults, else "tiercache lru+always writeback".
    pub fn label(&self, only_default: bool) -> String {
        let ram = if self.ram { " (RAM cache)" } else { "" };
        if only_default {
            return format!("tiercache{ram}");
        }
        let mut s = format!("tiercache {}", self.policy);
        if let Some(a) = &self.admission {
            s.push('+');
            s.push_str(a);
        }
        if self.mode != "writethrough" {
            s.push(' ');
            s.push_str(&self.mode);
        }
        s.push_str(ram);
        s
    }

    fn serve_args(&self, st: &Settings, backing: &Path, cache: &Path) -> Vec<String> {
        let mut a = vec![
            "--backing".into(),
            format!("hdd:{}", backing.display()),
            "--cache".into(),
            if self.ram {
                format!("mem:{}", st.cache_size)
            } else {
                cache.display().to_string()
            },
            "--block-size".into(),
            st.block_size.to_string(),
            "--policy".into(),
            self.policy.clone(),
            "--mode".into(),
            self.mode.clone(),
        ];
        if let Some(adm) = &self.admission {
            a.push("--admission".into());
            a.push(adm.clone());
        }
        a
    }
}

/// The file-cache variants (policies x modes), then, unless
/// --no-ram-cache, the first of them again with its cache in RAM.
fn variants(a: &BenchArgs) -> Vec<Variant> {
    let mut v = Vec::new();
    for p in &a.policies {
        let (policy, admission) = match p.split_once('+') {
            Some((p, adm)) => (p.to_string(), Some(adm.to_string())),
            None => (p.to_string(), None),
        };
        for m in &a.modes {
            v.push(Variant {
                policy: policy.clone(),
                admission: admission.clone(),
                mode: m.clone(),
                ram: false,
            });
        }
    }
    if !a.no_ram_cache {
        if let Some(first) = v.first().cloned() {
            v.push(Variant { ram: true, ..first });
        }
    }
    v
}

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
        self.runs.iter().find(|r| r.kind == report::Kind::Fast)
    }
}

/// One configuration measured once per round.
#[derive(Clone, Debug)]
enum Config {
    Fast,
    /// Index into the variants.
    Tiercache(usize),
    /// nbdkit's cache filter; `capped`: in a memory cgroup.
    Nbdkit {
        capped: bool,
    },
}

/// A table row while its repeats are being collected.
struct Row {
    label: String,
    kind: report::Kind,
    stale: bool,
    ram_cache: bool,
    memory_capped: bool,
    samples: Vec<report::Sample>,
}

impl Row {
    fn new(label: &str, kind: report::Kind, stale: bool) -> Row {
        Row {
            label: label.to_string(),
            kind,
            stale,
            ram_cache: false,
            memory_capped: false,
            samples: Vec::new(),
        }
    }
}

fn state_label(stale: bool) -> &'static str {
    if stale {
        "full of stale data"
    } else {
        "empty cache"
    }
}

const NBDKIT_CAPPED: &str = "nbdkit cache filter (memory-capped)";
const NBDKIT_PAGE_CACHE: &str = "nbdkit cache filter (in page cache)";

/// Runs the benchmark; `tiercache_exe` is the `tiercache` executable whose
/// `serve` command provides every configuration but nbdkit's.
pub fn run(args: &BenchArgs, tiercache_exe: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let st = Settings::resolve(args)?;
    if !procs::have("fio") {
        bail!("fio is not installed (run `make deps` or scripts/install-deps.sh)");
    }
    let work = args.work_dir.clone();
    let out = args.out_dir.clone().unwrap_or_else(|| work.join("report"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let runs_dir = work.join("runs");
    std::fs::create_dir_all(&runs_dir)?;
    let vars = variants(args);
    let mut notes = Vec::new();
    let nbdkit = !args.no_nbdkit && procs::have("nbdkit");
    if !args.no_nbdkit && !nbdkit {
        notes.push(
            "nbdkit is not installed: its cache filter was not measured (`make deps`).".into(),
        );
    }
    // Whether a memory cgroup can be made here (root, controller present).
    let memcg = nbdkit
        && match MemCgroup::create("probe", 1 << 30) {
            Ok(_) => true,
            Err(e) => {
                notes.push(format!(
                    "the memory-capped nbdkit was not measured: {e:#}; tiercache's file cache has no like-for-like peer in this run"
                ));
                false
            }
        };

    // The configurations of a round, in forward order.
    let mut configs = vec![Config::Fast];
    configs.extend((0..vars.len()).map(Config::Tiercache));
    if memcg {
        configs.push(Config::Nbdkit { capped: true });
    }
    if nbdkit {
        configs.push(Config::Nbdkit { capped: false });
    }

    // The table rows, in table order.
    let only_default = vars.iter().filter(|v| !v.ram).count() == 1;
    let mut rows = vec![
        Row::new("fast device alone", report::Kind::Fast, false),
        Row::new("slow device alone (HDD model)", report::Kind::Slow, false),
    ];
    for v in &vars {
        for stale in [false, true] {
            let mut r = Row::new(
                &format!("{}, {}", v.label(only_default), state_label(stale)),
                report::Kind::Tiercache,
                stale,
            );
            r.ram_cache = v.ram;
            rows.push(r);
        }
    }
    for (on, capped, name) in [
        (memcg, true, NBDKIT_CAPPED),
        (nbdkit, false, NBDKIT_PAGE_CACHE),
    ] {
        if on {
            for stale in [false, true] {
                let mut r = Row::new(
                    &format!("{name}, {}", state_label(stale)),
                    report::Kind::Nbdkit,
                    stale,
                );
                r.memory_capped = capped;
                rows.push(r);
            }
        }
    }

    // The plan, for the progress bar: (label, planned seconds).
    let t = st.runtime as f64;
    let fill_secs = 2.0 + st.junk_size as f64 / st.block_size as f64 / 150.0;
    let pair_secs = 2.0 * t + fill_secs + 1.0;
    let round_secs: f64 = configs
        .iter()
        .map(|c| match c {
            Config::Fast => t + 1.0,
            _ => pair_secs,
        })
        .sum();
    let mut plan: Vec<f64> = vec![5.0, t + 1.0];
    for _ in 0..st.repeats {
        plan.extend(configs.iter().map(|c| match c {
            Config::Fast => t + 1.0,
            _ => pair_secs,
        }));
    }
    let sweep_point_secs = (st.sweep_runtime + st.sweep_runtime.div_ceil(2)) as f64 + 2.0;
    if args.sweep {
        plan.extend(args.sweep_factors.iter().map(|_| sweep_point_secs));
    }
    if args.git {
        plan.push(git::PLANNED_SECS);
    }
    let mut prog = Progress::new(plan.iter().sum(), plan.len());
    prog.println(&format!(
        "tiercache bench: data {} (2 jobs), cache {}, blocks {}, {} s per run, {} round(s) of {} configurations (~{:.0} s each); work dir {}",
        report::fmt_bytes(st.data_size),
        report::fmt_bytes(st.cache_size),
        report::fmt_bytes(st.block_size),
        st.runtime,
        st.repeats,
        configs.len(),
        round_secs,
        work.display()
    ));

    prog.step("writing the device files", 5.0);
    let fast = work.join("fast.img");
    let backing = work.join("backing.img");
    write_file(&fast, st.data_size)?;
    sparse_file(&backing, st.junk_size + st.data_size)?;

    let ctx = Ctx {
        exe: tiercache_exe.to_path_buf(),
        work: work.clone(),
        runs: runs_dir.clone(),
        st: st.clone(),
    };

    prog.step("slow device alone (emulated HDD)", t + 1.0);
    let s = ctx.baseline(&format!("hdd:{}", backing.display()), "slow", 0)?;
    rows[1].samples.push(s);

    let mut cap: Option<u64> = args.nbdkit_memory;
    for round in 0..st.repeats {
        let mut order = configs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for c in &order {
            let tag = format!("round {}/{}", round + 1, st.repeats);
            match c {
                Config::Fast => {
                    prog.step(&format!("{tag}: fast device alone"), t + 1.0);
                    let s = ctx.baseline(&format!("{}", fast.display()), "fast", round)?;
                    prog.println(&format!(
                        "  {tag}: fast device alone: {:.0} IOPS",
                        s.measured.iops
                    ));
                    rows[0].samples.push(s);
                }
                Config::Tiercache(i) => {
                    let v = &vars[*i];
                    let label = v.label(only_default);
                    prog.step(&format!("{tag}: {label}"), pair_secs);
                    match ctx.tiercache_pair(v, &backing, round, &label) {
                        Ok((empty, stale, rss)) => {
                            if cap.is_none() && !v.ram {
                                cap = rss;
                            }
                            report_pair(&prog, &tag, &label, &empty, &stale);
                            push_pair(&mut rows, &label, empty, stale);
                        }
                        Err(e) => {
                            prog.println(&format!("  {tag}: {label}: FAILED: {e:#}"));
                            notes.push(format!("{tag}: {label}: failed: {e:#}"));
                        }
                    }
                }
                Config::Nbdkit { capped } => {
                    let name = if *capped {
                        NBDKIT_CAPPED
                    } else {
                        NBDKIT_PAGE_CACHE
                    };
                    prog.step(&format!("{tag}: {name}"), pair_secs);
                    let limit = match (capped, cap) {
                        (false, _) => None,
                        (true, Some(c)) => Some(c),
                        (true, None) => {
                            notes.push(format!(
                                "{tag}: {name}: skipped, tiercache's memory use was not measured yet"
                            ));
                            continue;
                        }
                    };
                    match ctx.nbdkit_pair(&backing, round, limit) {
                        Ok((empty, stale)) => {
                            report_pair(&prog, &tag, name, &empty, &stale);
                            push_pair(&mut rows, name, empty, stale);
                        }
                        Err(e) => {
                            prog.println(&format!("  {tag}: {name}: FAILED: {e:#}"));
                            notes.push(format!("{tag}: {name}: failed: {e:#}"));
                        }
                    }
                }
            }
        }
    }

    let mut sweep = Vec::new();
    if args.sweep {
        let max = args.sweep_factors.iter().copied().fold(0.0f64, f64::max);
        let sweep_backing = work.join("sweep-backing.img");
        let unit = 2 * st.block_size;
        let size_of = |f: f64| ((st.cache_size as f64 * f) as u64 / unit).max(1) * unit;
        sparse_file(&sweep_backing, size_of(max))?;
        for &f in &args.sweep_factors {
            prog.step(&format!("sweep: data = {f}x cache"), sweep_point_secs);
            match ctx.sweep_point(&vars[0], &sweep_backing, f, size_of(f)) {
                Ok(p) => {
                    prog.println(&format!(
                        "  sweep {f}x ({}): {:.0} IOPS, hit ratio {}",
                        report::fmt_bytes(p.data_size),
                        p.measured.iops,
                        report::fmt_ratio(p.hit_ratio)
                    ));
                    sweep.push(p)
                }
                Err(e) => notes.push(format!("sweep {f}x: failed: {e:#}")),
            }
        }
        let _ = std::fs::remove_file(&sweep_backing);
    }

    let git = if args.git {
        prog.step("git workload", git::PLANNED_SECS);
        match git::run(&ctx.exe, &work, &st, args, &mut |l| prog.println(l)) {
            Ok(g) => Some(g),
            Err(e) => {
                notes.push(format!("git workload: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    prog.finish();

    let runs: Vec<RunResult> = rows
        .into_iter()
        .filter(|r| !r.samples.is_empty())
        .map(|r| {
            let mut x = RunResult::from_samples(&r.label, r.kind, r.stale, r.samples);
            x.ram_cache = r.ram_cache;
            x.memory_capped = r.memory_capped;
            x
        })
        .collect();
    let threshold = runs
        .iter()
        .find(|r| r.kind == report::Kind::Fast)
        .and_then(|r| r.measured.pct(99.0))
        .unwrap_or(0);
    let results = Results {
        settings: st,
        variants: vars,
        runs,
        sweep,
        fast_threshold_ns: threshold,
        nbdkit_memory_cap: if memcg { cap } else { None },
        git,
        notes,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    let summary = report::write(&results, &out)?;
    println!("{summary}");
    println!(
        "report: {} (the benchmark took {:.0} s)",
        out.join("REPORT.md").display(),
        results.elapsed_secs
    );
    if !args.keep_files {
        for f in [&fast, &backing, &work.join("cache.img")] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&runs_dir);
    }
    Ok(())
}

fn report_pair(
    prog: &Progress,
    tag: &str,
    label: &str,
    empty: &report::Sample,
    stale: &report::Sample,
) {
    prog.println(&format!(
        "  {tag}: {label}: empty {:.0} IOPS (hits {}), stale {:.0} IOPS (hits {}); other processes used {} / {} of the CPU",
        empty.measured.iops,
        report::fmt_ratio(empty.hit_ratio),
        stale.measured.iops,
        report::fmt_ratio(stale.hit_ratio),
        report::fmt_ratio(empty.others_cpu),
        report::fmt_ratio(stale.others_cpu),
    ));
}

fn push_pair(rows: &mut [Row], base: &str, empty: report::Sample, stale: report::Sample) {
    for (s, state) in [(empty, false), (stale, true)] {
        let label = format!("{base}, {}", state_label(state));
        if let Some(r) = rows.iter_mut().find(|r| r.label == label) {
            r.samples.push(s);
        }
    }
}

/// What every configuration needs.
struct Ctx {
    exe: PathBuf,
    work: PathBuf,
    runs: PathBuf,
    st: Settings,
}

impl Ctx {
    fn study(&self, uri: &str, offset: u64, total: u64, runtime: u64, name: &str) -> fio::Job {
        let prefix = self.runs.join(name);
        fio::remove_outputs(&prefix);
        let mut j = fio::Job::study(uri, offset, total, runtime, prefix);
        j.log_msec = self.st.log_msec;
        j
    }

    /// The study's job over `data_size` bytes at `offset`, with the CPU
    /// used by other processes meanwhile (`servers`: pids of ours).
    fn measure(
        &self,
        uri: &str,
        offset: u64,
        name: &str,
        servers: &[u32],
    ) -> Result<(Measured, Option<f64>)> {
        let meter = CpuMeter::start(servers);
        let m = self
            .study(uri, offset, self.st.data_size, self.st.runtime, name)
            .run()?;
        Ok((m, meter.others_share(servers)))
    }

    /// A device served alone by `tiercache serve` (no cache).
    fn baseline(&self, spec: &str, name: &str, round: usize) -> Result<report::Sample> {
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            name,
            &["--backing".to_string(), spec.to_string()],
        )?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let (m, others) = self.measure(&s.uri(), 0, &format!("{name}-r{round}"), &pids)?;
        s.stop()?;
        let mut x = report::Sample::new(round, m);
        x.others_cpu = others;
        Ok(x)
    }

    /// Reads every block of region A once (fio's random map, blocks of
    /// the cache block size): after an "empty cache" run over A's first
    /// `data_size` bytes, this fills the cache with A.
    fn fill_region_a(&self, uri: &str, name: &str) -> Result<()> {
        let st = &self.st;
        let fill = fio::Job {
            uri: uri.to_string(),
            rw: "randread".into(),
            distribution: None,
            bs: st.block_size,
            iodepth: 8,
            numjobs: 2,
            offset: 0,
            size_per_job: st.junk_size / 2,
            runtime: None,
            prefix: self.runs.join(format!("{name}-fill")),
            log_msec: 0,
        };
        fill.run()
            .context("filling the cache with region A")
            .map(|_| ())
    }

    /// The cache device file, blank (see [`blank_device_file`]).
    fn cache_file(&self) -> Result<PathBuf> {
        let p = self.work.join("cache.img");
        blank_device_file(&p, self.st.cache_size)?;
        Ok(p)
    }

    /// One tiercache server, measured with an empty cache (region A) and
    /// then, after filling the cache with region A, full of stale data
    /// (region B). Returns both samples and the server's peak RSS.
    fn tiercache_pair(
        &self,
        v: &Variant,
        backing: &Path,
        round: usize,
        label: &str,
    ) -> Result<(report::Sample, report::Sample, Option<u64>)> {
        let name = format!("{}-r{round}", slug(label));
        let cache = self.cache_file()?;
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            &name,
            &v.serve_args(&self.st, backing, &cache),
        )?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let sample = |m: Measured, others: Option<f64>, d: Stats| {
            let mut x = report::Sample::new(round, m);
            x.others_cpu = others;
            x.hit_ratio = d.hit_ratio();
            x.promotions = Some(d.promotions);
            x.demotions = Some(d.demotions);
            x
        };
        let before = s.stats()?;
        let (m, others) = self.measure(&s.uri(), 0, &format!("{name}-empty"), &pids)?;
        let empty = sample(m, others, s.stats()?.since(&before));
        self.fill_region_a(&s.uri(), &name)?;
        let before = s.stats()?;
        let (m, others) =
            self.measure(&s.uri(), self.st.junk_size, &format!("{name}-stale"), &pids)?;
        let mut stale = sample(m, others, s.stats()?.since(&before));
        stale.note = format!(
            "before the run: {} of {} cache blocks held stale data (region A)",
            before.resident, before.capacity
        );
        let rss = s.peak_rss();
        s.stop()?;
        Ok((empty, stale, rss))
    }

    /// nbdkit's cache filter in front of the slow device alone, measured
    /// as [`Ctx::tiercache_pair`] does; in a memory cgroup of `limit`
    /// bytes if given. The hit ratio is estimated as 1 - (reads reaching
    /// the backend) / (client reads).
    fn nbdkit_pair(
        &self,
        backing: &Path,
        round: usize,
        limit: Option<u64>,
    ) -> Result<(report::Sample, report::Sample)> {
        let name = format!(
            "nbdkit-{}-r{round}",
            if limit.is_some() {
                "capped"
            } else {
                "pagecache"
            }
        );
        let cg = limit
            .map(|l| MemCgroup::create(&format!("nbdkit-r{round}"), l))
            .transpose()?;
        let hdd = Server::tiercache(
            &self.exe,
            &self.work,
            &format!("{name}-hdd"),
            &["--backing".into(), format!("hdd:{}", backing.display())],
        )?;
        let nk = Server::nbdkit_cache(
            &self.work,
            &name,
            &hdd.socket,
            self.st.cache_size,
            self.st.block_size,
            cg.as_ref(),
        )?;
        let pids: Vec<u32> = hdd.pid().into_iter().chain(nk.pid()).collect();
        let log = Server::nbdkit_backend_log(&self.work, &name);
        let reads = || procs::nbdkit_backend_reads(&log).unwrap_or(0);
        let sample = |m: Measured, others: Option<f64>, misses: u64| {
            let mut x = report::Sample::new(round, m);
            x.others_cpu = others;
            x.hit_ratio = (x.measured.total_ios > 0)
                .then(|| 1.0 - (misses as f64 / x.measured.total_ios as f64).min(1.0));
            x
        };
        let r0 = reads();
        let (m, others) = self.measure(&nk.uri(), 0, &format!("{name}-empty"), &pids)?;
        let mut empty = sample(m, others, reads() - r0);
        self.fill_region_a(&nk.uri(), &name)?;
        let r1 = reads();
        let (m, others) = self.measure(
            &nk.uri(),
            self.st.junk_size,
            &format!("{name}-stale"),
            &pids,
        )?;
        let mut stale = sample(m, others, reads() - r1);
        let mem = match &cg {
            Some(cg) => cg.peak(),
            None => nk.peak_rss(),
        };
        let memo = match (limit, mem) {
            (Some(l), Some(p)) => format!(
                "memory cgroup limit {}, peak charged {} (RSS + page cache)",
                report::fmt_bytes(l),
                report::fmt_bytes(p)
            ),
            (None, Some(p)) => format!(
                "peak RSS {} plus its cache file in the page cache (uncapped)",
                report::fmt_bytes(p)
            ),
            _ => String::new(),
        };
        empty.note = format!("hit ratio estimated: 1 - backend reads / client reads; {memo}");
        stale.note = empty.note.clone();
        nk.stop()?;
        hdd.stop()?;
        drop(cg);
        let _ = std::fs::remove_dir_all(self.work.join(format!("{name}.tmp")));
        Ok((empty, stale))
    }

    /// One point of the data-size sweep: cache filled by the study's job
    /// over the same data (half the runtime), then measured.
    fn sweep_point(
        &self,
        v: &Variant,
        backing: &Path,
        factor: f64,
        data: u64,
    ) -> Result<SweepPoint> {
        let name = format!("sweep-{factor}");
        let cache = self.cache_file()?;
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            &name,
            &v.serve_args(&self.st, backing, &cache),
        )?;
        let mut warm = self.study(
            &s.uri(),
            0,
            data,
            self.st.sweep_runtime.div_ceil(2),
            &format!("{name}-warm"),
        );
        warm.log_msec = 0;
        warm.run().context("filling the cache")?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let before = s.stats()?;
        let meter = CpuMeter::start(&pids);
        let m = self
            .study(&s.uri(), 0, data, self.st.sweep_runtime, &name)
            .run()?;
        let others = meter.others_share(&pids);
        let d = s.stats()?.since(&before);
        s.stop()?;
        Ok(SweepPoint {
            factor,
            data_size: data,
            measured: m,
            hit_ratio: d.hit_ratio(),
            others_cpu: others,
        })
    }
}

/// Lower-case, dashes: a file-name-safe form of a label.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// Creates `path` with `size` bytes of non-zero data, so reads hit real
/// extents (a sparse file's holes read without touching the disk, which
/// would flatter the fast-device baseline).
fn write_file(path: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() == size)
        .unwrap_or(false)
    {
        return Ok(()); // Left by an earlier run with --keep-files.
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
        buf.rotate_left(1);
    }
    f.sync_all()?;
    Ok(())
}

/// Makes `path` a blank cache device of `size` bytes: every byte written
/// once (a real device has no holes, and writing into a sparse file's
/// holes would make the first promotions pay for the filesystem's block
/// allocation), then, on every call, its first and last MiB zeroed, where
/// tiercache keeps its superblock and metadata (as `wipefs` would), so
/// `tiercache serve --create` sees a blank device and formats it.
fn blank_device_file(path: &Path, size: u64) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    const SPAN: u64 = 1 << 20;
    let zeros = vec![0u8; SPAN as usize];
    let fresh = std::fs::metadata(path)
        .map(|m| m.len() != size)
        .unwrap_or(true);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(fresh)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    if fresh {
        let mut left = size;
        while left > 0 {
            let n = left.min(SPAN) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
    } else {
        let span = SPAN.min(size);
        for at in [0, size - span] {
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&zeros[..span as usize])?;
        }
    }
    f.sync_all()?;
    Ok(())
}

/// Creates `path` as a sparse file of `size` bytes. Used for the backing
/// device (its latency comes from the HDD model; the file's own is
/// negligible) and for cache devices (promotions write them).
fn sparse_file(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        b: BenchArgs,
    }

    #[test]
    fn defaults_and_full_sizes() {
        let a = Cli::parse_from(["x"]).b;
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(s.data_size, 32 << 20);
        assert_eq!(s.cache_size, 40 << 20);
        assert_eq!(s.junk_size, 40 << 20);
        assert_eq!((s.runtime, s.repeats), (10, 3));
        let a = Cli::parse_from(["x", "--full"]).b;
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(
            (s.data_size, s.cache_size, s.runtime, s.repeats),
            (4 << 30, 5 << 30, 1800, 1)
        );
        let a = Cli::parse_from(["x", "--full", "--repeats", "2"]).b;
        assert_eq!(Settings::resolve(&a).unwrap().repeats, 2);
        let a = Cli::parse_from(["x", "--block-size", "3k"]).b;
        assert!(Settings::resolve(&a).is_err());
        let a = Cli::parse_from(["x", "--repeats", "0"]).b;
        assert!(Settings::resolve(&a).is_err());
        let a = Cli::parse_from(["x", "--sweep", "--sweep-factors", "1,-2"]).b;
        assert!(Settings::resolve(&a).is_err());
    }

    #[test]
    fn variants_and_labels() {
        let a = Cli::parse_from(["x", "--policies", "smq,lru+always", "--modes", "writeback"]).b;
        let v = variants(&a);
        assert_eq!(v.len(), 3);
        assert_eq!(v[1].label(false), "tiercache lru+always writeback");
        assert_eq!(v[2].label(false), "tiercache smq writeback (RAM cache)");
        assert!(v[2].ram && !v[0].ram);
        let a = Cli::parse_from(["x", "--no-ram-cache"]).b;
        assert_eq!(variants(&a).len(), 1);
        assert_eq!(
            slug("tiercache lru, empty cache"),
            "tiercache-lru-empty-cache"
        );
    }
}
