//! `tiercache bench --pool`: one cache shared by several volumes against
//! the same cache cut into equal static slices.
//!
//! Five volumes (see [`workloads`]), each an emulated HDD (`hdd:`) over a
//! sparse file of `--data-size` bytes, run their fio jobs at once:
//!
//! 1. **shared**: one `tiercache serve --volume NAME=hdd:FILE ...` with one
//!    cache file of `--cache-size` bytes; each job on its own export.
//! 2. **equal static slices**: the cache file cut into one equal file per
//!    volume, one `tiercache serve --backing hdd:FILE --cache SLICE` each.
//! 3. **best static split**: as 2, the slices sized by the best static
//!    split the simulator finds for synthetic requests shaped like the
//!    jobs and weighted by the IOs each volume did in run 1 (see
//!    `pool_sim.rs`), each at least 2 MiB.
//! 4. **shared, scanner off**: as 1, without the scanner's job, to show
//!    what the scanner costs the other volumes.
//!
//! Each run starts from blank cache files and is one fio run: the jobs
//! warm up for half the runtime (fio's `ramp_time`), then are measured for
//! `--runtime` seconds, continuing their request sequences (a warm-up run
//! of its own would have been replayed at the measured run's start: fio
//! starts each run of a job from the same random state). Measured: fio's
//! IOPS and p99 per job, and the server's per-volume counters (`tiercache
//! stats --json`, its `volumes` list; a slice's server has one volume, its
//! top-level counters) from the warm-up's end (read then, give or take
//! fio's start-up) to the run's.
//!
//! `--rounds` rounds (default 3) each run every configuration once, the
//! order rotated each round (see `pool_rounds.rs`); the split of 3 comes
//! from round 1's shared run and serves every round. The targets are
//! judged on each configuration's medians over the rounds.

use crate::files::{blank_device_file, sparse_file};
use crate::pool_jobs::{job_file, run_jobs_observed, workloads, JobMeasured, Workload};
use crate::pool_report::{
    self, PoolResults, PoolRun, PoolSettings, SimSplit, VolumeCounters, VolumeResult, BEST, LABELS,
    NO_SCAN, SHARED, SLICES,
};
use crate::pool_rounds;
use crate::pool_sim;
use crate::procs::{self, CpuMeter, Server};
use crate::progress::Progress;
use crate::settings::BenchArgs;
use crate::variant::variants;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Smallest cache slice: room for tiercache's metadata and some blocks.
const MIN_SLICE: u64 = 2 << 20;

/// Resolves the pool's sizes: `--data-size` is each volume's (default
/// 256 MiB), `--cache-size` the shared cache's (default 64 MiB, a quarter
/// of one volume per volume), `--runtime` each measured run's (default
/// 20 s).
pub fn settings(a: &BenchArgs, volumes: usize) -> Result<PoolSettings> {
    const M: u64 = 1 << 20;
    let bs = a.block_size;
    if !(4096..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
        bail!("--block-size {bs} must be a power of two from 4k to 1M");
    }
    let volume = a.data_size.unwrap_or(256 * M) / bs * bs;
    let cache = a.cache_size.unwrap_or(64 * M) / (volumes as u64 * bs) * (volumes as u64 * bs);
    if volume < 1 << 20 {
        bail!("--data-size (each volume's) must be at least 1 MiB");
    }
    if cache / (volumes as u64) < MIN_SLICE {
        bail!(
            "--cache-size must be at least {} ({} volumes, slices of at least 2 MiB)",
            crate::report::fmt_bytes(volumes as u64 * MIN_SLICE),
            volumes
        );
    }
    let runtime = a.runtime.unwrap_or(20);
    if runtime == 0 {
        bail!("--runtime must be at least 1 second");
    }
    let rounds = a.repeats.unwrap_or(3);
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let v = &variants(a)[0];
    let mut policy = v.policy.clone();
    if let Some(adm) = &v.admission {
        policy = format!("{policy}+{adm}");
    }
    Ok(PoolSettings {
        volume_size: volume,
        cache_size: cache,
        block_size: bs,
        runtime,
        warmup: runtime.div_ceil(2),
        rounds,
        policy,
        mode: v.mode.clone(),
    })
}

/// Runs the pool benchmark; `exe` is the `tiercache` executable.
pub fn run(args: &BenchArgs, exe: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let ws = workloads();
    let st = settings(args, ws.len())?;
    if !procs::have("fio") {
        bail!("fio is not installed (run `make deps` or scripts/install-deps.sh)");
    }
    let work = args.work_dir.join("pool");
    let out = args.out_dir.clone().unwrap_or_else(|| work.join("report"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let per_run = (st.runtime + st.warmup) as f64 + 3.0;
    let mut prog = Progress::new(3.0 + (4 * st.rounds) as f64 * per_run, 1 + 4 * st.rounds);
    prog.println(&format!(
        "tiercache bench --pool: {} volumes of {}, one cache of {} (blocks of {}), {} rounds of 4 runs, {} s per run after {} s warm-up; work dir {}",
        ws.len(),
        crate::report::fmt_bytes(st.volume_size),
        crate::report::fmt_bytes(st.cache_size),
        crate::report::fmt_bytes(st.block_size),
        st.rounds,
        st.runtime,
        st.warmup,
        work.display()
    ));
    prog.step("writing the volume files", 3.0);
    let files: Vec<PathBuf> = ws
        .iter()
        .map(|w| work.join(format!("{}.img", w.name)))
        .collect();
    for f in &files {
        sparse_file(f, st.volume_size)?;
    }
    let pool = Pool {
        exe: exe.to_path_buf(),
        work: work.clone(),
        st: st.clone(),
        ws: ws.clone(),
        files: files.clone(),
    };
    let mut runs: Vec<PoolRun> = Vec::new();
    let mut notes = Vec::new();
    let mut sim: Option<SimSplit> = None;
    let mut best_bytes: Option<Vec<u64>> = None;
    let n = ws.len() as u64;
    let equal = vec![st.cache_size / n; ws.len()];
    for round in 0..st.rounds {
        for label in pool_rounds::order(&LABELS, round) {
            prog.step(
                &format!("round {}/{}: {}", round + 1, st.rounds, label),
                per_run,
            );
            let r = match label {
                SHARED => pool.shared(false),
                NO_SCAN => pool.shared(true),
                SLICES => pool.slices(SLICES, &equal),
                _ => {
                    if best_bytes.is_none() {
                        match split(&pool, &runs) {
                            Ok((x, bytes)) => {
                                sim = Some(x);
                                best_bytes = Some(bytes);
                            }
                            Err(e) => notes.push(format!("round {}: {BEST}: {e:#}", round + 1)),
                        }
                    }
                    match &best_bytes {
                        Some(b) => pool.slices(BEST, b),
                        None => continue,
                    }
                }
            };
            record(&prog, &mut runs, &mut notes, label, round, r);
        }
    }
    prog.finish();
    let results = PoolResults::new(st, ws, runs, sim, notes, started.elapsed().as_secs_f64());
    let md = pool_report::write(&results, &out)?;
    println!("{md}");
    println!("report: {}", out.join("POOL-REPORT.md").display());
    if !args.keep_files {
        for f in files {
            let _ = std::fs::remove_file(f);
        }
        for i in 0..results.workloads.len() {
            let _ = std::fs::remove_file(work.join(format!("slice{i}.img")));
        }
        let _ = std::fs::remove_file(work.join("cache.img"));
    }
    let want = LABELS.len() * results.settings.rounds;
    if results.runs.len() < want {
        bail!(
            "{} of {want} runs failed; see {}",
            want - results.runs.len(),
            out.join("POOL-REPORT.md").display()
        );
    }
    Ok(())
}

/// The simulator's best static split for the first shared run in `runs`,
/// and the slice sizes (bytes per volume) that measure it.
fn split(pool: &Pool, runs: &[PoolRun]) -> Result<(SimSplit, Vec<u64>)> {
    let shared = runs
        .iter()
        .find(|r| r.label == SHARED)
        .context("no shared run to weigh the volumes by")?;
    let mut x = pool_sim::best_split(&pool.ws, &pool.st, shared)?;
    let bytes = pool_sim::slice_bytes(
        &pool.ws,
        &x.best_split,
        pool.st.cache_size,
        pool.st.block_size,
        MIN_SLICE,
    );
    x.slices = pool
        .ws
        .iter()
        .map(|w| w.name.to_string())
        .zip(bytes.iter().copied())
        .collect();
    Ok((x, bytes))
}

/// Keeps a run's result, or notes its failure; prints either.
fn record(
    prog: &Progress,
    runs: &mut Vec<PoolRun>,
    notes: &mut Vec<String>,
    label: &str,
    round: usize,
    r: Result<PoolRun>,
) {
    match r {
        Ok(mut r) => {
            r.round = round;
            let t = r.total();
            prog.println(&format!(
                "  round {}, {label}: {:.0} IOPS, hit ratio {}, worst p99 {}",
                round + 1,
                t.iops,
                crate::report::fmt_ratio(t.hit_ratio()),
                crate::report::fmt_lat(t.p99_ns)
            ));
            runs.push(r);
        }
        Err(e) => {
            prog.println(&format!("  round {}, {label}: FAILED: {e:#}", round + 1));
            notes.push(format!("round {}, {label}: failed: {e:#}", round + 1));
        }
    }
}

/// What each configuration needs.
struct Pool {
    exe: PathBuf,
    work: PathBuf,
    st: PoolSettings,
    ws: Vec<Workload>,
    /// Each volume's backing file, in workload order.
    files: Vec<PathBuf>,
}

impl Pool {
    /// The serve options every server shares (cache, policy, mode).
    fn cache_args(&self, cache: &Path) -> Vec<String> {
        let (policy, admission) = match self.st.policy.split_once('+') {
            Some((p, a)) => (p.to_string(), Some(a.to_string())),
            None => (self.st.policy.clone(), None),
        };
        let mut a = vec![
            "--cache".into(),
            cache.display().to_string(),
            "--block-size".into(),
            self.st.block_size.to_string(),
            "--policy".into(),
            policy,
            "--mode".into(),
            self.st.mode.clone(),
        ];
        if let Some(adm) = admission {
            a.push("--admission".into());
            a.push(adm);
        }
        a
    }

    /// One server for every volume, one cache file; without the
    /// scanner's job if `no_scan` (its volume is served, idle).
    fn shared(&self, no_scan: bool) -> Result<PoolRun> {
        let label = if no_scan { NO_SCAN } else { SHARED };
        let cache = self.work.join("cache.img");
        blank_device_file(&cache, self.st.cache_size)?;
        let mut args = Vec::new();
        for (w, f) in self.ws.iter().zip(&self.files) {
            args.push("--volume".to_string());
            args.push(format!("{}=hdd:{}", w.name, f.display()));
        }
        args.extend(self.cache_args(&cache));
        let s = Server::tiercache(&self.exe, &self.work, "shared", &args)?;
        let jobs: Vec<&Workload> = self.ws.iter().filter(|w| !(no_scan && w.scanner)).collect();
        let socket = s.socket.clone();
        let uri = move |n: &str| format!("nbd+unix:///{n}?socket={}", socket.display());
        let ctl = s
            .control
            .clone()
            .context("the shared server has no control socket")?;
        let stats = || -> Result<Vec<(String, VolumeCounters)>> {
            let v = stats_json(&self.exe, &ctl)?;
            let vols = v["volumes"]
                .as_array()
                .context("stats --json: no volumes list")?;
            Ok(vols
                .iter()
                .map(|x| {
                    let name = x["name"].as_str().unwrap_or("").to_string();
                    (name, VolumeCounters::from_json(&x["stats"]["decisions"]))
                })
                .collect())
        };
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let (measured, before, after, others) = self.measure(&jobs, &uri, &pids, &stats)?;
        s.stop()?;
        finish(label, &jobs, &measured, &before, &after, others)
    }

    /// One server per volume, each with its own slice of the cache:
    /// `bytes[i]` for volume `i`.
    fn slices(&self, label: &str, bytes: &[u64]) -> Result<PoolRun> {
        let mut servers = Vec::new();
        for (i, (w, f)) in self.ws.iter().zip(&self.files).enumerate() {
            let cache = self.work.join(format!("slice{i}.img"));
            blank_device_file(&cache, bytes[i])?;
            let mut args = vec!["--backing".to_string(), format!("hdd:{}", f.display())];
            args.extend(self.cache_args(&cache));
            let s = Server::tiercache(&self.exe, &self.work, &format!("slice-{}", w.name), &args)?;
            servers.push((w.name, s));
        }
        let socks: Vec<(&str, PathBuf)> = servers
            .iter()
            .map(|(n, s)| (*n, s.socket.clone()))
            .collect();
        let uri = move |n: &str| {
            let sock = &socks.iter().find(|x| x.0 == n).expect("a server per job").1;
            format!("nbd+unix:///default?socket={}", sock.display())
        };
        let stats = || -> Result<Vec<(String, VolumeCounters)>> {
            servers
                .iter()
                .map(|(n, s)| {
                    let ctl = s
                        .control
                        .as_ref()
                        .context("a slice server has no control socket")?;
                    let v = stats_json(&self.exe, ctl)?;
                    Ok((n.to_string(), VolumeCounters::from_json(&v["decisions"])))
                })
                .collect()
        };
        let jobs: Vec<&Workload> = self.ws.iter().collect();
        let pids: Vec<u32> = servers.iter().filter_map(|(_, s)| s.pid()).collect();
        let (measured, before, after, others) = self.measure(&jobs, &uri, &pids, &stats)?;
        for (_, s) in servers {
            s.stop()?;
        }
        finish(label, &jobs, &measured, &before, &after, others)
    }

    /// Runs `jobs` in one fio run: a warm-up (half the runtime, fio's
    /// `ramp_time`), then the measured runtime; with the counters read at
    /// the warm-up's end and the run's, and the CPU others used between.
    #[allow(clippy::type_complexity)]
    fn measure(
        &self,
        jobs: &[&Workload],
        uri: &dyn Fn(&str) -> String,
        pids: &[u32],
        stats: &(dyn Fn() -> Result<Vec<(String, VolumeCounters)>> + Sync),
    ) -> Result<(
        Vec<(String, JobMeasured)>,
        Vec<(String, VolumeCounters)>,
        Vec<(String, VolumeCounters)>,
        Option<f64>,
    )> {
        let size = self.st.volume_size;
        let text = job_file(jobs, size, self.st.warmup, self.st.runtime, uri);
        let mut at_ramp_end = None;
        let measured = run_jobs_observed(
            &text,
            &self.work.join("measured.fio"),
            Duration::from_secs(self.st.warmup),
            |fio| {
                // fio's CPU so far is the warm-up's: counted as ours now,
                // and all of it once fio is reaped.
                let with_fio: Vec<u32> = pids.iter().copied().chain([fio]).collect();
                at_ramp_end = Some((stats(), CpuMeter::start(&with_fio)));
            },
        )?;
        let (before, meter) = at_ramp_end.context("fio ended before its warm-up did")?;
        let before = before.context("reading the counters at the warm-up's end")?;
        let others = meter.others_share(pids);
        let after = stats()?;
        Ok((measured, before, after, others))
    }
}

/// Pairs each job's fio figures with its volume's counter deltas.
fn finish(
    label: &str,
    jobs: &[&Workload],
    measured: &[(String, JobMeasured)],
    before: &[(String, VolumeCounters)],
    after: &[(String, VolumeCounters)],
    others: Option<f64>,
) -> Result<PoolRun> {
    let find = |v: &[(String, VolumeCounters)], n: &str| {
        v.iter()
            .find(|x| x.0 == n)
            .map(|x| x.1)
            .with_context(|| format!("no counters for volume {n}"))
    };
    let mut volumes = Vec::new();
    for w in jobs {
        let m = measured
            .iter()
            .find(|x| x.0 == w.name)
            .with_context(|| format!("fio reported no job {}", w.name))?;
        let d = find(after, w.name)?.since(&find(before, w.name)?);
        volumes.push(VolumeResult::new(w.name, &m.1, &d));
    }
    Ok(PoolRun {
        label: label.to_string(),
        round: 0,
        volumes,
        others_cpu: others,
    })
}

/// `tiercache stats --json --control CTL`.
fn stats_json(exe: &Path, ctl: &Path) -> Result<serde_json::Value> {
    let out = Command::new(exe)
        .args(["stats", "--json", "--control"])
        .arg(ctl)
        .output()?;
    if !out.status.success() {
        bail!(
            "tiercache stats failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::parse_args;

    #[test]
    fn pool_sizes_and_limits() {
        let s = settings(&parse_args(["x", "--pool"]), 5).unwrap();
        assert_eq!((s.volume_size, s.runtime, s.warmup), (256 << 20, 20, 10));
        // A whole number of blocks per slice.
        assert_eq!(s.cache_size % (5 * 65536), 0);
        assert!(s.cache_size <= 64 << 20 && s.cache_size > 63 << 20);
        let a = parse_args(["x", "--pool", "--cache-size", "5M"]);
        assert!(settings(&a, 5).is_err(), "slices under 2 MiB");
        let a = parse_args(["x", "--pool", "--runtime", "3", "--policies", "lru"]);
        let s = settings(&a, 5).unwrap();
        assert_eq!((s.runtime, s.warmup, s.policy.as_str()), (3, 2, "lru"));
        assert_eq!(s.rounds, 3);
        let a = parse_args(["x", "--pool", "--rounds", "5"]);
        assert_eq!(settings(&a, 5).unwrap().rounds, 5);
        let a = parse_args(["x", "--pool", "--rounds", "0"]);
        assert!(settings(&a, 5).is_err());
    }
}
