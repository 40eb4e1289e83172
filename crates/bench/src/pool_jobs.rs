//! The pool benchmark's workloads: one fio job per volume, all running at
//! once in one fio process, each on its own NBD export, and what fio
//! measured per job (IOPS, p99 completion latency).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One volume's workload: its fio job, by name (also the volume's name
/// and NBD export).
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    pub name: &'static str,
    /// What it does, for the report.
    pub what: &'static str,
    /// fio `rw=`.
    pub rw: &'static str,
    /// fio `random_distribution=`; None: uniform (or sequential).
    pub distribution: Option<&'static str>,
    pub bs: u64,
    pub iodepth: u32,
    /// fio `randseed=`: the hot sets of the two Zipf readers differ.
    pub seed: u64,
    /// The sequential scanner, left out of the "scanner off" run.
    pub scanner: bool,
}

/// The five volumes, in table order: two Zipf readers with different hot
/// sets and skews, a uniform cold reader, a sequential scanner (larger
/// than the sequential cutoff per stream, so the cache should let it
/// pass) and a uniform random writer.
pub fn workloads() -> Vec<Workload> {
    let w = |name, what, rw, distribution, bs, iodepth, seed, scanner| Workload {
        name,
        what,
        rw,
        distribution,
        bs,
        iodepth,
        seed,
        scanner,
    };
    vec![
        w(
            "hot",
            "random reads, zipf:1.2, 4 KiB, iodepth 4",
            "randread",
            Some("zipf:1.2"),
            4096,
            4,
            1,
            false,
        ),
        w(
            "hot2",
            "random reads, zipf:0.9, another hot set, 4 KiB, iodepth 4",
            "randread",
            Some("zipf:0.9"),
            4096,
            4,
            2,
            false,
        ),
        w(
            "cold",
            "random reads, uniform, 4 KiB, iodepth 2",
            "randread",
            None,
            4096,
            2,
            3,
            false,
        ),
        w(
            "scan",
            "sequential reads, 256 KiB, iodepth 2",
            "read",
            None,
            256 << 10,
            2,
            4,
            true,
        ),
        w(
            "writer",
            "random writes, uniform, 4 KiB, iodepth 2",
            "randwrite",
            None,
            4096,
            2,
            5,
            false,
        ),
    ]
}

/// A fio job file running `jobs` at once for `runtime` seconds: job
/// `name` on `uris(name)`, over the first `size` bytes of its export.
///
/// The first `ramp` seconds are fio's `ramp_time`: the jobs run, fio
/// counts nothing, and the measured `runtime` seconds follow in the same
/// run, so they continue the jobs' request sequences. (A warm-up run of
/// its own would be replayed: fio starts every run of a job from the same
/// random state.)
pub fn job_file(
    jobs: &[&Workload],
    size: u64,
    ramp: u64,
    runtime: u64,
    uri: &dyn Fn(&str) -> String,
) -> String {
    let mut f = String::new();
    let _ = writeln!(
        f,
        "[global]\nioengine=nbd\ntime_based=1\nramp_time={ramp}\nruntime={runtime}\nsize={size}\npercentile_list=50:99:99.9\n"
    );
    for w in jobs {
        let _ = writeln!(f, "[{}]", w.name);
        let _ = writeln!(f, "uri={}", uri(w.name));
        let _ = writeln!(
            f,
            "rw={}\nbs={}\niodepth={}\nrandseed={}",
            w.rw, w.bs, w.iodepth, w.seed
        );
        if let Some(d) = w.distribution {
            let _ = writeln!(f, "random_distribution={d}");
        }
        f.push('\n');
    }
    f
}

/// What fio measured for one job (reads and writes together).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct JobMeasured {
    pub iops: f64,
    pub total_ios: u64,
    /// p99 completion latency (ns) of the job's main direction (the one
    /// with more IOs).
    pub p99_ns: Option<u64>,
}

/// Runs the job file `text` (written to `path`), fio's JSON output next
/// to it, and returns each job's figures by name. Calls `observe` with
/// fio's pid `at` after fio started (on another thread; not at all if fio
/// ended first): the end of the job file's `ramp_time`, give or take
/// fio's start-up.
pub fn run_jobs_observed(
    text: &str,
    path: &Path,
    at: Duration,
    observe: impl FnOnce(u32) + Send,
) -> Result<Vec<(String, JobMeasured)>> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    let json = path.with_extension("json");
    let _ = std::fs::remove_file(&json);
    let child = Command::new("fio")
        .arg("--output-format=json")
        .arg(format!("--output={}", json.display()))
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running fio (is it installed? `make deps`)")?;
    let pid = child.id();
    let done = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while start.elapsed() < at {
                if done.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10).min(at - start.elapsed()));
            }
            if !done.load(Ordering::SeqCst) {
                observe(pid);
            }
        });
        let out = child.wait_with_output();
        done.store(true, Ordering::SeqCst);
        out
    })
    .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    parse_jobs(&text)
}

/// Each job's figures from fio's JSON output (notes before the JSON
/// object skipped). A job that reports an error is an error.
pub fn parse_jobs(text: &str) -> Result<Vec<(String, JobMeasured)>> {
    let start = text.find('{').context("no JSON in fio output")?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio JSON output")?;
    let jobs = v["jobs"].as_array().context("fio JSON: no jobs")?;
    let mut res = Vec::new();
    for job in jobs {
        let name = job["jobname"].as_str().unwrap_or("").to_string();
        if job["error"].as_i64().unwrap_or(0) != 0 {
            bail!("fio job {name} failed: error {}", job["error"]);
        }
        let mut m = JobMeasured::default();
        let mut main_ios = 0;
        for dir in ["read", "write"] {
            let d = &job[dir];
            let ios = d["total_ios"].as_u64().unwrap_or(0);
            m.iops += d["iops"].as_f64().unwrap_or(0.0);
            m.total_ios += ios;
            if ios > main_ios {
                main_ios = ios;
                m.p99_ns = d["clat_ns"]["percentile"]["99.000000"].as_u64();
            }
        }
        res.push((name, m));
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_file_has_every_job_on_its_own_export() {
        let ws = workloads();
        let refs: Vec<&Workload> = ws.iter().collect();
        let f = job_file(&refs, 1 << 20, 2, 3, &|n| {
            format!("nbd+unix:///{n}?socket=s")
        });
        for w in &ws {
            assert!(
                f.contains(&format!(
                    "[{}]\nuri=nbd+unix:///{}?socket=s\n",
                    w.name, w.name
                )),
                "{f}"
            );
        }
        // The warm-up is the same run's ramp: no run of its own to replay.
        assert!(f.contains("ramp_time=2\nruntime=3\nsize=1048576\n"), "{f}");
        assert_eq!(f.matches("random_distribution=").count(), 2, "{f}");
        assert_eq!(ws.iter().filter(|w| w.scanner).count(), 1);
    }

    #[test]
    fn jobs_parsed_by_name_with_the_main_direction_p99() {
        let text = r#"fio-3.33 note
        {"jobs":[
          {"jobname":"hot","error":0,
           "read":{"iops":100.5,"total_ios":300,"clat_ns":{"percentile":{"99.000000":900}}},
           "write":{"iops":0.0,"total_ios":0,"clat_ns":{}}},
          {"jobname":"writer","error":0,
           "read":{"iops":0.0,"total_ios":0,"clat_ns":{}},
           "write":{"iops":50.0,"total_ios":150,"clat_ns":{"percentile":{"99.000000":7000}}}}]}"#;
        let j = parse_jobs(text).unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].0, "hot");
        assert_eq!(
            j[0].1,
            JobMeasured {
                iops: 100.5,
                total_ios: 300,
                p99_ns: Some(900)
            }
        );
        assert_eq!(j[1].1.p99_ns, Some(7000));
        assert_eq!(j[1].1.total_ios, 150);
        let bad = r#"{"jobs":[{"jobname":"x","error":5}]}"#;
        assert!(parse_jobs(bad).is_err());
    }
}
