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
//! | tiercache, empty cache | `tiercache serve --backing hdd:BACKING --cache CACHE` |
//! | tiercache, full of stale data | the same, after reading another region first |
//! | nbdkit cache filter, empty / stale | `nbdkit --filter=cache nbd` in front of the slow device alone |
//!
//! The backing device holds two regions: A (the junk, `max(data, cache)`
//! bytes) and B (the data every measured run reads). "Full of stale data"
//! means: first every block of region A is read once (the cache is then
//! full), then the study's job runs over region A for `junk_runtime` (the
//! junk is *hot*, as the study's first run left it), and only then is
//! region B measured. fio's nbd engine has no files, so regions stand in
//! for the study's deleted and new files.
//!
//! Results go to `out_dir`: `REPORT.md` (table, targets, plots),
//! `results.json`, merged IOPS logs as CSV, and PNG plots. Device files
//! and fio outputs live in `work_dir`.

mod fio;
mod git;
mod plot;
mod procs;
mod progress;
mod report;

pub use fio::{merge_iops_logs, parse_json, Measured, PERCENTILES};
pub use report::{RunResult, SweepPoint};

use anyhow::{bail, Context, Result};
use procs::Server;
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
    /// Seconds each measured run lasts. Default 20 (1800 with --full).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Seconds of the study's job over the junk region before a "full of
    /// stale data" run. Default: half of --runtime.
    #[arg(long)]
    pub junk_runtime: Option<u64>,
    /// Cache block size of tiercache and nbdkit's cache filter.
    #[arg(long, default_value = "64k", value_parser = parse_size_arg)]
    pub block_size: u64,
    /// Where device files and fio outputs go (a disk, not tmpfs: the fast
    /// device is a file here).
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
    #[arg(long, value_delimiter = ',', default_value = "smq")]
    pub policies: Vec<String>,
    /// tiercache cache modes to run (writethrough, writeback, writearound).
    #[arg(long, value_delimiter = ',', default_value = "writethrough")]
    pub modes: Vec<String>,
    /// Skip nbdkit's cache filter.
    #[arg(long)]
    pub no_nbdkit: bool,
    /// Skip the reference runs of tiercache with its cache in RAM
    /// (`mem:`), the like-for-like comparison with nbdkit, whose cache file
    /// lives in the kernel's page cache.
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
    /// Seconds each sweep point is measured (after as long again, halved,
    /// to fill the cache). Default: --runtime.
    #[arg(long)]
    pub sweep_runtime: Option<u64>,
    /// Also run the git workload (clone and `git grep`) on ext4 over the
    /// served device (needs root, FUSE and loop devices).
    #[arg(long)]
    pub git: bool,
    /// Files in the generated git repository.
    #[arg(long, default_value_t = 2000)]
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
    pub junk_runtime: u64,
    pub sweep_runtime: u64,
    pub log_msec: u64,
    /// Bytes of the junk region A (region B, the data, follows it).
    pub junk_size: u64,
}

impl Settings {
    pub fn resolve(a: &BenchArgs) -> Result<Settings> {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        let data = a.data_size.unwrap_or(if a.full { 4 * G } else { 32 * M });
        let cache = a.cache_size.unwrap_or(if a.full { 5 * G } else { 40 * M });
        let runtime = a.runtime.unwrap_or(if a.full { 1800 } else { 20 });
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
        if a.log_msec == 0 {
            bail!("--log-msec must be positive");
        }
        let data = data / unit * unit;
        let cache = cache / bs * bs;
        Ok(Settings {
            data_size: data,
            cache_size: cache,
            block_size: bs,
            runtime,
            junk_runtime: a.junk_runtime.unwrap_or(runtime.div_ceil(2)),
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
    pub runs: Vec<RunResult>,
    pub sweep: Vec<SweepPoint>,
    /// Completion latency (ns) at or below which an IO counts as served at
    /// fast-device latency: the fast device's own p99.
    pub fast_threshold_ns: u64,
    pub git: Option<git::GitResults>,
    pub notes: Vec<String>,
}

impl Results {
    /// Mean IOPS of the fast-device runs (measured first and last).
    pub fn fast_iops(&self) -> Option<f64> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.kind == report::Kind::Fast)
            .map(|r| r.measured.iops)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Runs the benchmark; `tiercache_exe` is the `tiercache` executable whose
/// `serve` command provides every configuration but nbdkit's.
pub fn run(args: &BenchArgs, tiercache_exe: &Path) -> Result<()> {
    let st = Settings::resolve(args)?;
    for tool in ["fio"] {
        if !procs::have(tool) {
            bail!("{tool} is not installed (run `make deps` or scripts/install-deps.sh)");
        }
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

    // The plan, for the progress bar: (label, planned seconds).
    let fill_secs = 5.0 + st.junk_size as f64 / st.block_size as f64 / 150.0;
    let stale_secs = fill_secs + (st.junk_runtime + st.runtime) as f64;
    let mut plan: Vec<f64> = vec![5.0, st.runtime as f64, st.runtime as f64];
    plan.push(st.runtime as f64); // The fast device again, at the end.
    for _ in &vars {
        plan.push(st.runtime as f64);
        plan.push(stale_secs);
    }
    if nbdkit {
        plan.push(st.runtime as f64);
        plan.push(stale_secs);
    }
    if args.sweep {
        for _ in &args.sweep_factors {
            plan.push((st.sweep_runtime + st.sweep_runtime.div_ceil(2)) as f64 + 2.0);
        }
    }
    if args.git {
        plan.push(120.0);
    }
    let mut prog = Progress::new(plan.iter().sum(), plan.len());
    prog.println(&format!(
        "tiercache bench: data {} (2 jobs), cache {}, blocks {}, {} s per run; work dir {}",
        report::fmt_bytes(st.data_size),
        report::fmt_bytes(st.cache_size),
        report::fmt_bytes(st.block_size),
        st.runtime,
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
    let mut runs = Vec::new();

    prog.step("fast device alone", st.runtime as f64);
    let m = ctx.baseline(&format!("{}", fast.display()), "fast", 0)?;
    runs.push(RunResult::new(
        "fast device alone",
        report::Kind::Fast,
        false,
        m,
        None,
    ));

    prog.step("slow device alone (emulated HDD)", st.runtime as f64);
    let m = ctx.baseline(&format!("hdd:{}", backing.display()), "slow", st.junk_size)?;
    runs.push(RunResult::new(
        "slow device alone (HDD model)",
        report::Kind::Slow,
        false,
        m,
        None,
    ));

    let only_default = vars.iter().filter(|v| !v.ram).count() == 1;
    for v in &vars {
        let label = v.label(only_default);
        for stale in [false, true] {
            let state = if stale {
                "full of stale data"
            } else {
                "empty cache"
            };
            prog.step(
                &format!("{label}, {state}"),
                if stale { stale_secs } else { st.runtime as f64 },
            );
            let r = ctx.tiercache(v, &backing, stale, &format!("{label}, {state}"));
            match r {
                Ok(r) => {
                    prog.println(&format!(
                        "  {}: {:.0} IOPS, hit ratio {}",
                        r.label,
                        r.measured.iops,
                        report::fmt_ratio(r.hit_ratio)
                    ));
                    runs.push(r)
                }
                Err(e) => {
                    prog.println(&format!("  {label}, {state}: FAILED: {e:#}"));
                    notes.push(format!("{label}, {state}: failed: {e:#}"));
                }
            }
        }
    }
    if nbdkit {
        for stale in [false, true] {
            let state = if stale {
                "full of stale data"
            } else {
                "empty cache"
            };
            prog.step(
                &format!("nbdkit cache filter, {state}"),
                if stale { stale_secs } else { st.runtime as f64 },
            );
            match ctx.nbdkit(&backing, stale) {
                Ok(r) => runs.push(r),
                Err(e) => {
                    prog.println(&format!("  nbdkit, {state}: FAILED: {e:#}"));
                    notes.push(format!("nbdkit cache filter, {state}: failed: {e:#}"));
                }
            }
        }
    }

    // The machine is shared and its disk's speed drifts: measuring the
    // fast device before and after everything else brackets the drift.
    prog.step("fast device alone, again", st.runtime as f64);
    let m = ctx.baseline(&format!("{}", fast.display()), "fast-again", 0)?;
    runs.push(RunResult::new(
        "fast device alone, again at the end",
        report::Kind::Fast,
        false,
        m,
        None,
    ));

    let mut sweep = Vec::new();
    if args.sweep {
        let max = args.sweep_factors.iter().copied().fold(0.0f64, f64::max);
        let sweep_backing = work.join("sweep-backing.img");
        let unit = 2 * st.block_size;
        let size_of = |f: f64| ((st.cache_size as f64 * f) as u64 / unit).max(1) * unit;
        sparse_file(&sweep_backing, size_of(max))?;
        for &f in &args.sweep_factors {
            prog.step(
                &format!("sweep: data = {f}x cache"),
                (st.sweep_runtime + st.sweep_runtime.div_ceil(2)) as f64 + 2.0,
            );
            match ctx.sweep_point(&vars[0], &sweep_backing, f, size_of(f)) {
                Ok(p) => sweep.push(p),
                Err(e) => notes.push(format!("sweep {f}x: failed: {e:#}")),
            }
        }
        let _ = std::fs::remove_file(&sweep_backing);
    }

    let git = if args.git {
        prog.step("git workload", 120.0);
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

    // The fast device's p99 (the larger of its two runs).
    let threshold = runs
        .iter()
        .filter(|r| r.kind == report::Kind::Fast)
        .filter_map(|r| r.measured.pct(99.0))
        .max()
        .unwrap_or(0);
    let results = Results {
        settings: st,
        variants: vars,
        runs,
        sweep,
        fast_threshold_ns: threshold,
        git,
        notes,
    };
    let summary = report::write(&results, &out)?;
    println!("{summary}");
    println!("report: {}", out.join("REPORT.md").display());
    if !args.keep_files {
        for f in [&fast, &backing] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&runs_dir);
    }
    Ok(())
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

    /// A device served alone by `tiercache serve` (no cache).
    fn baseline(&self, spec: &str, name: &str, offset: u64) -> Result<Measured> {
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            name,
            &["--backing".to_string(), spec.to_string()],
        )?;
        let m = self
            .study(&s.uri(), offset, self.st.data_size, self.st.runtime, name)
            .run()?;
        s.stop()?;
        Ok(m)
    }

    /// Fills a cache with junk: reads every block of region A once, then
    /// runs the study's job over region A's first `data_size` bytes.
    fn make_junk(&self, uri: &str, name: &str) -> Result<()> {
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
            prefix: self.runs.join(format!("{name}-junk-fill")),
            log_msec: 0,
        };
        fill.run().context("junk phase 1 (read region A once)")?;
        if st.junk_runtime > 0 {
            let mut hot = self.study(
                uri,
                0,
                st.data_size,
                st.junk_runtime,
                &format!("{name}-junk-hot"),
            );
            hot.log_msec = 0;
            hot.run()
                .context("junk phase 2 (the study's job on region A)")?;
        }
        Ok(())
    }

    fn fresh_cache(&self, name: &str) -> Result<PathBuf> {
        let p = self.work.join(format!("{name}.cache.img"));
        let _ = std::fs::remove_file(&p);
        sparse_file(&p, self.st.cache_size)?;
        Ok(p)
    }

    fn tiercache(
        &self,
        v: &Variant,
        backing: &Path,
        stale: bool,
        label: &str,
    ) -> Result<RunResult> {
        let name = slug(label);
        let cache = self.fresh_cache("tiercache")?;
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            &name,
            &v.serve_args(&self.st, backing, &cache),
        )?;
        let mut note = String::new();
        if stale {
            self.make_junk(&s.uri(), &name)?;
            let j = s.stats()?;
            note = format!(
                "before the run: {} of {} cache blocks held junk",
                j.resident, j.capacity
            );
        }
        let before = s.stats()?;
        let m = self
            .study(
                &s.uri(),
                self.st.junk_size,
                self.st.data_size,
                self.st.runtime,
                &name,
            )
            .run()?;
        let d = s.stats()?.since(&before);
        s.stop()?;
        let _ = std::fs::remove_file(&cache);
        let mut r = RunResult::new(label, report::Kind::Tiercache, stale, m, d.hit_ratio());
        r.ram_cache = v.ram;
        r.promotions = Some(d.promotions);
        r.demotions = Some(d.demotions);
        r.note = note;
        Ok(r)
    }

    fn nbdkit(&self, backing: &Path, stale: bool) -> Result<RunResult> {
        let name = if stale {
            "nbdkit-stale"
        } else {
            "nbdkit-empty"
        };
        let hdd = Server::tiercache(
            &self.exe,
            &self.work,
            &format!("{name}-hdd"),
            &["--backing".into(), format!("hdd:{}", backing.display())],
        )?;
        let nk = Server::nbdkit_cache(
            &self.work,
            name,
            &hdd.socket,
            self.st.cache_size,
            self.st.block_size,
        )?;
        if stale {
            self.make_junk(&nk.uri(), name)?;
        }
        let m = self
            .study(
                &nk.uri(),
                self.st.junk_size,
                self.st.data_size,
                self.st.runtime,
                name,
            )
            .run()?;
        nk.stop()?;
        hdd.stop()?;
        let _ = std::fs::remove_dir_all(self.work.join(format!("{name}.tmp")));
        // The stats filter counts the whole process lifetime, so the hit
        // ratio is known only when nothing ran before the measured job.
        let statsfile = self.work.join(format!("{name}.nbdkit-stats"));
        let hit = if stale {
            None
        } else {
            procs::nbdkit_backend_reads(&statsfile)
                .filter(|_| m.total_ios > 0)
                .map(|misses| 1.0 - (misses as f64 / m.total_ios as f64).min(1.0))
        };
        let label = if stale {
            "nbdkit cache filter, full of stale data"
        } else {
            "nbdkit cache filter, empty cache"
        };
        let mut r = RunResult::new(label, report::Kind::Nbdkit, stale, m, hit);
        r.note = if stale {
            "hit ratio unknown: nbdkit has no counters and its stats filter covers the junk phases too".into()
        } else {
            "hit ratio estimated: 1 - backend reads (stats filter) / client reads".into()
        };
        Ok(r)
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
        let cache = self.fresh_cache("sweep")?;
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
        let before = s.stats()?;
        let m = self
            .study(&s.uri(), 0, data, self.st.sweep_runtime, &name)
            .run()?;
        let d = s.stats()?.since(&before);
        s.stop()?;
        let _ = std::fs::remove_file(&cache);
        Ok(SweepPoint {
            factor,
            data_size: data,
            measured: m,
            hit_ratio: d.hit_ratio(),
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
        assert_eq!(s.junk_runtime, 10);
        let a = Cli::parse_from(["x", "--full"]).b;
        let s = Settings::resolve(&a).unwrap();
        assert_eq!(
            (s.data_size, s.cache_size, s.runtime),
            (4 << 30, 5 << 30, 1800)
        );
        let a = Cli::parse_from(["x", "--block-size", "3k"]).b;
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
