//! Plots of fio runs made elsewhere: the VM lab's anchors bench
//! (vmlab/guest/anchors-bench.sh) runs fio in a guest against bcache,
//! lvmcache and tiercache, and leaves per run `fio-<run>.out` (fio's terse
//! line, then its `json+` report) and per-job IOPS logs
//! `iops-<run>_iops.<job>.log`. [`plot_dir`] draws them as `tiercache
//! bench` draws its own runs: IOPS over time and completion-latency
//! percentiles, one pair of plots per group of runs. A run's group is the
//! part of its name after the last `-` (the anchors bench: `fits`,
//! `nofit`); its label, the part before.

use crate::fio::{merge_iops_logs, parse_json};
use crate::plot;
use crate::run_result::{Kind, RunResult};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One fio run found in the directory.
struct FoundRun {
    label: String,
    group: String,
    report: PathBuf,
    iops_logs: Vec<PathBuf>,
}

fn find_runs(dir: &Path) -> Result<Vec<FoundRun>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut runs = Vec::new();
    for name in &names {
        let Some(run) = name
            .strip_prefix("fio-")
            .and_then(|n| n.strip_suffix(".out"))
        else {
            continue;
        };
        let (label, group) = run.rsplit_once('-').unwrap_or((run, ""));
        let log_prefix = format!("iops-{run}_iops.");
        let iops_logs = names
            .iter()
            .filter(|n| n.starts_with(&log_prefix) && n.ends_with(".log"))
            .map(|n| dir.join(n))
            .collect();
        runs.push(FoundRun {
            label: label.to_string(),
            group: group.to_string(),
            report: dir.join(name),
            iops_logs,
        });
    }
    Ok(runs)
}

/// The plot colour class of a run: the plain devices are the baselines.
fn kind_of(label: &str) -> Kind {
    if label.starts_with("ssd") || label.starts_with("fast") {
        Kind::Fast
    } else if label.starts_with("hdd") || label.starts_with("slow") {
        Kind::Slow
    } else if label.starts_with("tiercache") {
        Kind::Tiercache
    } else {
        Kind::Nbdkit
    }
}

/// Draws the plots of every fio run in `dir` into `out` (created if
/// missing), `<group>-iops.png` and `<group>-latency.png` per group, and
/// returns the files written. `window_ms`: the runs' `log_avg_msec`.
/// Within a group, runs are in name order.
pub fn plot_dir(dir: &Path, out: &Path, window_ms: u64) -> Result<Vec<PathBuf>> {
    let runs = find_runs(dir)?;
    if runs.is_empty() {
        bail!("no fio reports (fio-<run>.out) in {}", dir.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut groups: BTreeMap<String, Vec<RunResult>> = BTreeMap::new();
    for run in runs {
        let text = std::fs::read_to_string(&run.report)
            .with_context(|| format!("reading {}", run.report.display()))?;
        let mut measured =
            parse_json(&text).with_context(|| format!("parsing {}", run.report.display()))?;
        if !run.iops_logs.is_empty() {
            measured.series = merge_iops_logs(&run.iops_logs, window_ms)?;
        }
        let kind = kind_of(&run.label);
        let stale = run.label.contains("junk") || run.label.contains("stale");
        groups
            .entry(run.group)
            .or_default()
            .push(RunResult::new(&run.label, kind, stale, measured, None));
    }
    let mut written = Vec::new();
    for (group, runs) in &groups {
        let prefix = if group.is_empty() {
            "fio".to_string()
        } else {
            group.clone()
        };
        for file in plot::write_runs(runs, &prefix, &format!("data {group}"), out)? {
            written.push(out.join(file));
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{"jobs":[{"jobname":"study","error":0,"read":{"iops":1000.0,"total_ios":15000,"runtime":15000,
        "clat_ns":{"percentile":{"50.000000":100000,"90.000000":200000,"99.000000":900000,"99.900000":2000000,"99.990000":3000000}}}}]}"#;

    #[test]
    fn finds_groups_labels_and_logs_and_draws_them() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for run in [
            "ssd-alone-fits",
            "tiercache-ublk-empty-fits",
            "bcache-cutoff0-nofit",
        ] {
            std::fs::write(
                d.join(format!("fio-{run}.out")),
                format!("3;fio-3.33;study;0\n{JSON}"),
            )
            .unwrap();
            for job in 1..=2 {
                std::fs::write(
                    d.join(format!("iops-{run}_iops.{job}.log")),
                    "1000, 500, 0, 0, 0\n2000, 600, 0, 0, 0\n",
                )
                .unwrap();
            }
        }
        std::fs::write(d.join("rows.md"), "not a report").unwrap();
        let found = find_runs(d).unwrap();
        let names: Vec<(&str, &str, usize)> = found
            .iter()
            .map(|r| (r.label.as_str(), r.group.as_str(), r.iops_logs.len()))
            .collect();
        assert_eq!(
            names,
            [
                ("bcache-cutoff0", "nofit", 2),
                ("ssd-alone", "fits", 2),
                ("tiercache-ublk-empty", "fits", 2)
            ]
        );
        assert_eq!(kind_of("ssd-alone"), Kind::Fast);
        assert_eq!(kind_of("tiercache-ublk-empty"), Kind::Tiercache);
        let out = d.join("plots");
        let files = plot_dir(d, &out, 1000).unwrap();
        let mut names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "fits-iops.png",
                "fits-latency.png",
                "nofit-iops.png",
                "nofit-latency.png"
            ]
        );
        for f in files {
            assert!(
                std::fs::metadata(&f).unwrap().len() > 1000,
                "{} is a real PNG",
                f.display()
            );
        }
    }

    #[test]
    fn an_empty_directory_is_an_error_that_says_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let e = plot_dir(dir.path(), &dir.path().join("p"), 1000).unwrap_err();
        assert!(e.to_string().contains("no fio reports"), "{e}");
    }
}
