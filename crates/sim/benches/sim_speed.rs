//! Simulator speed (harness = false):
//!
//! 1. requests/s/core through the Director for LRU and for the default
//!    policy (adaptive+always) on a 10M-request zipf:1.2 trace, exactly the
//!    per-request path `simulate` runs (`ConfigRunner::process`: Director
//!    plus device pricing and latency histogram), single thread;
//! 2. the whole `simulate` driver on the same trace with several
//!    configurations on all cores;
//! 3. exact LRU MRC on 100M block references, single thread;
//! 4. SHARDS (fixed-rate 0.01 and fixed-size 16k blocks) on the same
//!    references, with their mean absolute error against the exact curve;
//! 5. libCacheSim's LRU (its C core through the `libcachesim` Python
//!    package) on the same 10M trace, if Python and the package are there
//!    (skipped with a message otherwise; `scripts/python-deps.sh`
//!    installs it into `.venv`).
//!
//! Times are CPU times of the measuring thread (or process, for the
//! parallel driver) so that other load on the machine does not inflate
//! them; wall times are shown too.
//!
//! Environment: `SIM_BENCH_N` (trace requests, default 10M),
//! `SIM_BENCH_MRC_N` (MRC references, default 100M).

use std::io::Write;
use std::time::Instant;
use tiercache_sim::mrc::{mean_absolute_error, MrcBuilder, MrcMethod};
use tiercache_sim::simulate::{ConfigRunner, IterSource};
use tiercache_sim::*;
use tiercache_types::{AdmissionKind, ReplacementKind};

/// CPU time of the calling thread in seconds (Linux schedstat; falls back
/// to None elsewhere).
fn thread_cpu() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

/// CPU time of the whole process (all threads) in seconds.
fn process_cpu() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is [0]; utime [11], stime [12].
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

struct Timer {
    wall: Instant,
    cpu: Option<f64>,
    process: bool,
}

impl Timer {
    fn thread() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: thread_cpu(),
            process: false,
        }
    }
    fn process() -> Self {
        Timer {
            wall: Instant::now(),
            cpu: process_cpu(),
            process: true,
        }
    }
    /// (cpu seconds, wall seconds); cpu falls back to wall.
    fn stop(&self) -> (f64, f64) {
        let wall = self.wall.elapsed().as_secs_f64();
        let now = if self.process {
            process_cpu()
        } else {
            thread_cpu()
        };
        let cpu = match (self.cpu, now) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => wall,
        };
        (cpu, wall)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn zipf_workload(ios: u64, seed: u64) -> Workload {
    Workload {
        distribution: Distribution::Zipf {
            theta: 1.2,
            center: None,
        },
        size: 16 << 30,
        jobs: 1,
        ios,
        seed,
        ..Workload::default()
    }
}

fn policy(r: ReplacementKind, a: AdmissionKind) -> tiercache_policy::PolicyConfig {
    tiercache_policy::PolicyConfig {
        replacement: r,
        admission: a,
        ..Default::default()
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs us too: keep
    // that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n = env_u64("SIM_BENCH_N", if quick { 200_000 } else { 10_000_000 });
    let mrc_n = env_u64(
        "SIM_BENCH_MRC_N",
        if quick { 1_000_000 } else { 100_000_000 },
    );
    let cache_bytes: u64 = 1 << 30;
    println!(
        "sim_speed: zipf:1.2 over 16 GiB (4M blocks of 4 KiB), {n} requests, cache {} ",
        report::fmt_bytes(cache_bytes)
    );

    let t = Timer::thread();
    let reqs: Vec<Request> = zipf_workload(n, 1).requests().expect("workload").collect();
    let (cpu, _) = t.stop();
    println!(
        "  generate trace: {:.2} s ({:.1} M req/s)",
        cpu,
        n as f64 / cpu / 1e6
    );

    // 1. Director per-request path, single thread.
    let spec = SimSpec {
        cache_sizes: vec![cache_bytes],
        ..SimSpec::default()
    };
    let no_cutoff = SimSpec {
        sequential_cutoff: 0,
        ..spec.clone()
    };
    let mut director_rates = Vec::new();
    for (name, p, spec) in [
        (
            "lru+always",
            policy(ReplacementKind::Lru, AdmissionKind::Always),
            &spec,
        ),
        (
            "adaptive+always (default)",
            tiercache_policy::PolicyConfig::default(),
            &spec,
        ),
        (
            "lru+always, sequential cutoff off",
            policy(ReplacementKind::Lru, AdmissionKind::Always),
            &no_cutoff,
        ),
        (
            "adaptive+always (default), sequential cutoff off",
            tiercache_policy::PolicyConfig::default(),
            &no_cutoff,
        ),
    ] {
        // Best of three: the machine is shared, CPU time still varies.
        let mut best = (f64::MAX, 0.0);
        let mut res = None;
        for _ in 0..3 {
            let mut r = ConfigRunner::new(spec, &p, cache_bytes).expect("runner");
            let t = Timer::thread();
            for q in &reqs {
                r.process(q);
            }
            let (cpu, wall) = t.stop();
            if cpu < best.0 {
                best = (cpu, wall);
            }
            res = Some(r.result(spec.queue_depth));
        }
        let (cpu, wall) = best;
        let res = res.expect("ran");
        let rate = n as f64 / cpu;
        director_rates.push((name, rate));
        println!(
            "  Director {name}: {:.2} M req/s/core (best of 3: cpu {cpu:.2} s, wall {wall:.2} s), read hit {:.2}%",
            rate / 1e6,
            res.read_hit_ratio * 100.0
        );
    }

    // 2. The parallel driver: 4 sizes x 2 policies, no OPT/MRC.
    let spec8 = SimSpec {
        cache_sizes: vec![128 << 20, 256 << 20, 512 << 20, 1 << 30],
        policies: vec![
            policy(ReplacementKind::Lru, AdmissionKind::Always),
            tiercache_policy::PolicyConfig::default(),
        ],
        opt: None,
        mrc: None,
        ..SimSpec::default()
    };
    let t = Timer::process();
    let rep = simulate(
        &mut IterSource(reqs.iter().copied()),
        "bench",
        &spec8,
        &|_| {},
    )
    .expect("simulate");
    let (cpu, wall) = t.stop();
    println!(
        "  simulate(): {} configs x {n} requests on {} threads: wall {wall:.2} s, cpu {cpu:.2} s = {:.2} M config-req/s/core",
        rep.configs.len(),
        std::thread::available_parallelism().map_or(1, |x| x.get()),
        (rep.configs.len() as f64 * n as f64) / cpu / 1e6
    );

    // 5 (done early: it needs the 10M trace). libCacheSim LRU.
    libcachesim_lru(&reqs, cache_bytes / 4096, &director_rates);
    drop(reqs);

    // 3. Exact MRC on mrc_n references, single thread.
    println!("  MRC: {mrc_n} references of zipf:1.2 over 4M blocks");
    let t = Timer::thread();
    let blocks: Vec<u64> = zipf_workload(mrc_n, 2)
        .requests()
        .expect("workload")
        .map(|r| r.offset / 4096)
        .collect();
    let (cpu, _) = t.stop();
    println!("    generate: {cpu:.2} s");
    let t = Timer::thread();
    let mut exact = MrcBuilder::new(MrcMethod::Exact, 1);
    for &b in &blocks {
        exact.access(b);
    }
    let exact = exact.finish();
    let (cpu, wall) = t.stop();
    println!(
        "    exact: cpu {cpu:.2} s, wall {wall:.2} s ({:.1} M ref/s), {} distinct blocks",
        mrc_n as f64 / cpu / 1e6,
        exact.tracked_blocks
    );

    // 4. SHARDS.
    for method in [
        MrcMethod::Shards { rate: 0.01 },
        MrcMethod::Shards { rate: 0.001 },
        MrcMethod::ShardsFixedSize { max_blocks: 16_384 },
    ] {
        let t = Timer::thread();
        let mut b = MrcBuilder::new(method, 1);
        for &x in &blocks {
            b.access(x);
        }
        let m = b.finish();
        let (cpu, wall) = t.stop();
        println!(
            "    {}: cpu {cpu:.2} s, wall {wall:.2} s ({:.1} M ref/s), final rate {:.5}, MAE vs exact {:.4}",
            method.label(),
            mrc_n as f64 / cpu / 1e6,
            m.sample_rate,
            mean_absolute_error(&exact, &m, 1000)
        );
    }
    let _ = std::io::stdout().flush();
}

/// Writes the block ids in libCacheSim's oracleGeneral format and times its
/// LRU through Python.
fn libcachesim_lru(reqs: &[Request], cache_blocks: u64, ours: &[(&str, f64)]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = root.join(".venv/bin/python");
    let python = if venv.exists() {
        venv.display().to_string()
    } else {
        "python3".to_string()
    };
    let ok = std::process::Command::new(&python)
        .args(["-c", "import libcachesim"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        println!("  libCacheSim: skipped ({python} cannot import libcachesim; run scripts/python-deps.sh)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sim_speed_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("trace.oracleGeneral");
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).expect("trace file"));
        for (i, r) in reqs.iter().enumerate() {
            w.write_all(&(i as u32).to_le_bytes()).unwrap();
            w.write_all(&(r.offset / 4096).to_le_bytes()).unwrap();
            w.write_all(&1u32.to_le_bytes()).unwrap();
            w.write_all(&(-1i64).to_le_bytes()).unwrap();
        }
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/libcachesim_lru.py");
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(&path)
        .arg(cache_blocks.to_string())
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                let secs = v["seconds"].as_f64().unwrap_or(0.0);
                let cpu = v["cpu_seconds"].as_f64().unwrap_or(secs);
                let n = v["requests"].as_f64().unwrap_or(0.0);
                let rate = if cpu > 0.0 { n / cpu } else { 0.0 };
                println!(
                    "  libCacheSim LRU (C core via Python, trace reading included): {:.2} M req/s/core (cpu {cpu:.2} s, wall {secs:.2} s), misses {}",
                    rate / 1e6,
                    v["misses"]
                );
                for (name, ours) in ours {
                    println!(
                        "    Director {name} / libCacheSim LRU = {:.2}x",
                        ours / rate.max(1.0)
                    );
                }
            }
        }
        Ok(o) => println!(
            "  libCacheSim: failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => println!("  libCacheSim: could not run {python}: {e}"),
    }
}
