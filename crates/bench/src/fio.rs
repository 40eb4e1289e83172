//! Running fio against an NBD export and reading back what it measured:
//! the JSON+ summary (IOPS, completion-latency percentiles and the full
//! latency histogram) and the per-job IOPS logs, merged into one series.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Percentiles fio is asked for (at most 20, fio's limit). The table and the
/// percentile plot use these.
pub const PERCENTILES: [f64; 12] = [
    50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
];

/// One fio run: `numjobs` jobs of `iodepth` each, job `i` covering
/// `[offset + i * size_per_job, offset + (i + 1) * size_per_job)` of the
/// export.
#[derive(Clone, Debug)]
pub struct Job {
    pub uri: String,
    /// fio `rw=` (randread everywhere in this benchmark).
    pub rw: String,
    /// fio `random_distribution=`; None: uniform.
    pub distribution: Option<String>,
    pub bs: u64,
    pub iodepth: u32,
    pub numjobs: u32,
    pub offset: u64,
    pub size_per_job: u64,
    /// Some(seconds): time based. None: every block of the region once
    /// (fio's random map), then stop.
    pub runtime: Option<u64>,
    /// Where fio's JSON+ output and IOPS logs go: `<prefix>.json`,
    /// `<prefix>_iops.N.log`.
    pub prefix: PathBuf,
    /// IOPS log window (`log_avg_msec`); 0: no IOPS logs.
    pub log_msec: u64,
}

impl Job {
    /// The study's job (randread, zipf:1.2, 4k, iodepth 8, 2 jobs).
    pub fn study(uri: &str, offset: u64, total: u64, runtime: u64, prefix: PathBuf) -> Job {
        Job {
            uri: uri.to_string(),
            rw: "randread".into(),
            distribution: Some("zipf:1.2".into()),
            bs: 4096,
            iodepth: 8,
            numjobs: 2,
            offset,
            size_per_job: total / 2,
            runtime: Some(runtime),
            prefix,
            log_msec: 500,
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--name=study".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={}", self.uri),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--iodepth={}", self.iodepth),
            format!("--numjobs={}", self.numjobs),
            format!("--offset={}", self.offset),
            format!("--size={}", self.size_per_job),
            format!("--offset_increment={}", self.size_per_job),
            "--group_reporting=1".into(),
            "--output-format=json+".into(),
            format!("--output={}", self.json_path().display()),
            format!(
                "--percentile_list={}",
                PERCENTILES
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            ),
        ];
        if let Some(d) = &self.distribution {
            a.push(format!("--random_distribution={d}"));
        }
        if let Some(r) = self.runtime {
            a.push("--time_based=1".into());
            a.push(format!("--runtime={r}"));
        }
        if self.log_msec > 0 {
            a.push("--per_job_logs=1".into());
            a.push(format!("--log_avg_msec={}", self.log_msec));
            a.push(format!("--write_iops_log={}", self.prefix.display()));
        }
        a
    }

    pub fn json_path(&self) -> PathBuf {
        self.prefix.with_extension("json")
    }

    /// Runs fio to completion and parses what it wrote.
    pub fn run(&self) -> Result<Measured> {
        let out = Command::new("fio")
            .args(self.args())
            .output()
            .context("running fio (is it installed? `make deps`)")?;
        if !out.status.success() {
            bail!(
                "fio failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = std::fs::read_to_string(self.json_path())
            .with_context(|| format!("reading {}", self.json_path().display()))?;
        let mut m = parse_json(&text)?;
        if self.log_msec > 0 {
            let logs: Vec<PathBuf> = (1..=self.numjobs)
                .map(|i| PathBuf::from(format!("{}_iops.{i}.log", self.prefix.display())))
                .collect();
            m.series = merge_iops_logs(&logs, self.log_msec)?;
        }
        Ok(m)
    }
}

/// What one fio run measured (all jobs together).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Measured {
    /// Average IOPS over the run, all jobs summed.
    pub iops: f64,
    pub total_ios: u64,
    pub runtime_ms: u64,
    /// (percentile, completion latency in ns), as fio computed them.
    pub clat_percentiles: Vec<(f64, u64)>,
    /// Completion-latency histogram: (latency ns, IO count), ascending.
    #[serde(skip)]
    pub clat_bins: Vec<(u64, u64)>,
    /// Merged IOPS log: (seconds since start, IOPS of all jobs summed).
    pub series: Vec<(f64, f64)>,
}

impl Measured {
    /// The completion latency at percentile `p` (one of [`PERCENTILES`]).
    pub fn pct(&self, p: f64) -> Option<u64> {
        self.clat_percentiles
            .iter()
            .find(|(q, _)| (q - p).abs() < 1e-9)
            .map(|&(_, v)| v)
    }

    /// Mean IOPS of the IOPS-log windows in the second half of the run
    /// (after any warm-up); None without IOPS logs.
    pub fn second_half_iops(&self) -> Option<f64> {
        let end = self.series.last()?.0;
        let late: Vec<f64> = self
            .series
            .iter()
            .filter(|p| p.0 > end / 2.0)
            .map(|p| p.1)
            .collect();
        (!late.is_empty()).then(|| late.iter().sum::<f64>() / late.len() as f64)
    }

    /// Share (0..=1) of IOs that completed within `ns`, from the histogram.
    pub fn share_within(&self, ns: u64) -> f64 {
        let total: u64 = self.clat_bins.iter().map(|b| b.1).sum();
        if total == 0 {
            return 0.0;
        }
        let within: u64 = self
            .clat_bins
            .iter()
            .filter(|b| b.0 <= ns)
            .map(|b| b.1)
            .sum();
        within as f64 / total as f64
    }
}

/// Parses fio's `--output-format=json+` output (fio may print notes before
/// the JSON object; they are skipped). With `group_reporting` there is one
/// job entry holding all jobs.
pub fn parse_json(text: &str) -> Result<Measured> {
    let start = text.find('{').context("no JSON in fio output")?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio JSON output")?;
    let jobs = v["jobs"].as_array().context("fio JSON: no jobs")?;
    let mut m = Measured::default();
    let mut bins = std::collections::BTreeMap::<u64, u64>::new();
    let mut pcts: Vec<(f64, u64)> = Vec::new();
    for job in jobs {
        if job["error"].as_i64().unwrap_or(0) != 0 {
            bail!("fio job {} failed: error {}", job["jobname"], job["error"]);
        }
        let r = &job["read"];
        m.iops += r["iops"].as_f64().unwrap_or(0.0);
        m.total_ios += r["total_ios"].as_u64().unwrap_or(0);
        m.runtime_ms = m.runtime_ms.max(r["runtime"].as_u64().unwrap_or(0));
        if let Some(p) = r["clat_ns"]["percentile"].as_object() {
            for (k, val) in p {
                if let (Ok(q), Some(ns)) = (k.parse::<f64>(), val.as_u64()) {
                    pcts.push((q, ns));
                }
            }
        }
        if let Some(b) = r["clat_ns"]["bins"].as_object() {
            for (k, val) in b {
                if let (Ok(ns), Some(n)) = (k.parse::<u64>(), val.as_u64()) {
                    *bins.entry(ns).or_default() += n;
                }
            }
        }
    }
    if jobs.len() > 1 {
        // Without group_reporting, percentiles of separate jobs cannot be
        // combined; recompute them from the merged histogram.
        pcts = PERCENTILES
            .iter()
            .map(|&p| (p, percentile_from_bins(&bins, p)))
            .collect();
    }
    pcts.sort_by(|a, b| a.0.total_cmp(&b.0));
    m.clat_percentiles = pcts;
    m.clat_bins = bins.into_iter().collect();
    Ok(m)
}

fn percentile_from_bins(bins: &std::collections::BTreeMap<u64, u64>, p: f64) -> u64 {
    let total: u64 = bins.values().sum();
    let want = (total as f64 * p / 100.0).ceil() as u64;
    let mut seen = 0;
    for (&ns, &n) in bins {
        seen += n;
        if seen >= want {
            return ns;
        }
    }
    0
}

/// Reads fio IOPS logs (`time_ms, iops, dir, bs, offset[, prio]` per line,
/// one file per job) and sums the jobs per `window_ms` window. A window is
/// kept only if every job logged it, so the last, partial window of a job
/// that stopped early does not show as a dip. Returns (window end in
/// seconds, summed IOPS).
pub fn merge_iops_logs(files: &[PathBuf], window_ms: u64) -> Result<Vec<(f64, f64)>> {
    let mut buckets = std::collections::BTreeMap::<u64, (f64, usize)>::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for (t, v) in parse_log(&text) {
            // fio stamps windows at about k * window_ms, give or take a ms.
            let k = (t + window_ms / 2) / window_ms;
            let e = buckets.entry(k).or_insert((0.0, 0));
            e.0 += v;
            e.1 += 1;
        }
    }
    Ok(buckets
        .into_iter()
        .filter(|(_, (_, n))| *n == files.len())
        .map(|(k, (v, _))| ((k * window_ms) as f64 / 1000.0, v))
        .collect())
}

fn parse_log(text: &str) -> Vec<(u64, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split(',').map(str::trim);
            let t = it.next()?.parse::<u64>().ok()?;
            let v = it.next()?.parse::<f64>().ok()?;
            Some((t, v))
        })
        .collect()
}

/// Removes fio's outputs for `prefix` (JSON and logs).
pub fn remove_outputs(prefix: &Path) {
    let _ = std::fs::remove_file(prefix.with_extension("json"));
    for i in 1..=64 {
        let p = PathBuf::from(format!("{}_iops.{i}.log", prefix.display()));
        if std::fs::remove_file(&p).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_merge_per_window_and_drop_partial_windows() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.log");
        let b = dir.path().join("b.log");
        std::fs::write(
            &a,
            "499, 100, 0, 0, 0\n999, 200, 0, 0, 0\n1500, 300, 0, 0, 0\n",
        )
        .unwrap();
        std::fs::write(&b, "500, 10, 0, 0, 0\n1001, 20, 0, 0, 0\n").unwrap();
        let m = merge_iops_logs(&[a, b], 500).unwrap();
        assert_eq!(m, vec![(0.5, 110.0), (1.0, 220.0)]);
    }

    #[test]
    fn json_plus_gives_percentiles_and_histogram_shares() {
        let text = r#"note: something
        {"jobs":[{"jobname":"study","error":0,"read":{"iops":1000.5,"total_ios":3000,"runtime":3000,
          "clat_ns":{"percentile":{"50.000000":100,"99.000000":900},
                     "bins":{"100":50,"500":40,"900":9,"5000000":1}}}}]}"#;
        let m = parse_json(text).unwrap();
        assert_eq!(m.iops, 1000.5);
        assert_eq!(m.pct(50.0), Some(100));
        assert_eq!(m.pct(99.0), Some(900));
        assert!((m.share_within(900) - 0.99).abs() < 1e-12);
        assert!((m.share_within(99) - 0.0).abs() < 1e-12);
        assert_eq!(m.second_half_iops(), None);
        let m = Measured {
            series: vec![(0.5, 10.0), (1.0, 20.0), (1.5, 100.0), (2.0, 300.0)],
            ..Measured::default()
        };
        assert_eq!(m.second_half_iops(), Some(200.0));
    }

    #[test]
    fn failed_jobs_are_errors() {
        let text = r#"{"jobs":[{"jobname":"study","error":5,"read":{}}]}"#;
        assert!(parse_json(text).is_err());
    }
}
