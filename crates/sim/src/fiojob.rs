//! Maps a fio job file onto a [`Workload`].
//!
//! Understood options (from `[global]` and the chosen job section, the job
//! overriding): `rw`/`readwrite`, `rwmixread`/`rwmixwrite`,
//! `random_distribution`, `bs`/`blocksize` (the read value of `R,W`),
//! `size`, `numjobs`, `norandommap`, `randseed`, `number_ios`,
//! `io_size`/`io_limit`, `time_based`. Everything else is ignored and listed
//! in [`FioJob::notes`].
//!
//! Number of IOs: `number_ios` per job if given, else `io_size / bs` per job,
//! else one pass over the file (`size / bs`) per job, as fio does without
//! `time_based`. A `time_based` job has no IO count fio would know up front:
//! we simulate ten passes and say so in the notes; set [`Workload::ios`] to
//! change it.

use crate::error::{Error, Result};
use crate::synth::{Distribution, Workload};
use std::collections::BTreeMap;
use tiercache_types::parse_size;

/// A parsed job.
#[derive(Clone, Debug, PartialEq)]
pub struct FioJob {
    /// The job section used.
    pub name: String,
    pub workload: Workload,
    /// Options ignored, assumptions made.
    pub notes: Vec<String>,
}

/// Options that change nothing about the block access pattern we model.
const HARMLESS: &[&str] = &[
    "ioengine",
    "direct",
    "iodepth",
    "unlink",
    "runtime",
    "per_job_logs",
    "log_avg_msec",
    "write_iops_log",
    "write_bw_log",
    "write_lat_log",
    "filename",
    "directory",
    "group_reporting",
    "thread",
    "name",
    "buffered",
    "ramp_time",
    "stonewall",
    "invalidate",
    "description",
    "iodepth_batch",
    "iodepth_batch_complete",
    "randrepeat",
    "allrandrepeat",
];

/// fio's own limit on the number of jobs (`REAL_MAX_JOBS`); every job is
/// a generator in memory here, so larger counts are refused like fio does.
pub const MAX_JOBS: u64 = 4096;

/// Option name -> (value, line number).
type Options = BTreeMap<String, (String, u64)>;

/// Parses fio job text. `section`: the job to take; `None` takes the first
/// job section (any section other than `[global]`).
pub fn parse_fio_job(text: &str, section: Option<&str>) -> Result<FioJob> {
    // section name -> ordered options, plus the order of job sections.
    let mut sections: Vec<(String, Options)> = Vec::new();
    let mut current: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest
                .strip_suffix(']')
                .ok_or_else(|| {
                    Error::parse(
                        "job file",
                        line_no,
                        format!("unclosed section header '{line}'"),
                    )
                })?
                .trim()
                .to_string();
            let idx = match sections.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    sections.push((name, BTreeMap::new()));
                    sections.len() - 1
                }
            };
            current = Some(idx);
            continue;
        }
        let Some(idx) = current else {
            return Err(Error::parse(
                "job file",
                line_no,
                format!("option '{line}' before any [section]"),
            ));
        };
        // Strip a trailing comment.
        let line = line.split(" #").next().unwrap_or(line).trim();
        let (k, v) = match line.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), v.trim().to_string()),
            None => (line.to_ascii_lowercase(), String::new()),
        };
        sections[idx].1.insert(k, (v, line_no));
    }
    let global = sections
        .iter()
        .find(|(n, _)| n == "global")
        .map(|(_, o)| o.clone())
        .unwrap_or_default();
    let (name, job) = match section {
        Some(want) => sections
            .iter()
            .find(|(n, _)| n == want)
            .ok_or_else(|| Error::Config(format!("job file has no section [{want}]")))?,
        None => sections
            .iter()
            .find(|(n, _)| n != "global")
            .ok_or_else(|| Error::Config("job file has no job section".into()))?,
    };
    let mut opts = global;
    for (k, v) in job {
        opts.insert(k.clone(), v.clone());
    }
    let mut notes = Vec::new();
    let mut w = Workload {
        distribution: Distribution::Uniform,
        rwmixread: 100,
        sequential_share: 0.0,
        jobs: 1,
        seed: 1,
        ..Workload::default()
    };
    let err = |line: u64, m: String| Error::parse("job file", line, m);
    let size_of = |v: &str, line: u64, key: &str| -> Result<u64> {
        if v.ends_with('%') {
            return Err(err(
                line,
                format!("{key}={v}: sizes in percent of a device are not supported"),
            ));
        }
        parse_size(v).map_err(|e| err(line, format!("{key}: {e}")))
    };
    let int_of = |v: &str, line: u64, key: &str| -> Result<u64> {
        v.parse::<u64>()
            .map_err(|_| err(line, format!("{key}={v}: expected an integer")))
    };

    if !opts.contains_key("rw") && !opts.contains_key("readwrite") {
        notes.push("no rw option: fio's default is rw=read (sequential reads)".into());
        w.sequential_share = 1.0;
    }
    let mut mix_given = false;
    let mut rw_default_mix = 100u8;
    let mut time_based = false;
    let mut number_ios = None;
    let mut io_size = None;
    for (k, (v, line)) in &opts {
        let line = *line;
        match k.as_str() {
            "rw" | "readwrite" => {
                let (mode, modifier) = match v.split_once(':') {
                    Some((m, x)) => (m, Some(x)),
                    None => (v.as_str(), None),
                };
                if let Some(x) = modifier {
                    notes.push(format!("rw modifier ':{x}' ignored"));
                }
                let (mix, seq) = match mode {
                    "read" => (100, 1.0),
                    "write" => (0, 1.0),
                    "randread" => (100, 0.0),
                    "randwrite" => (0, 0.0),
                    "rw" | "readwrite" => (50, 1.0),
                    "randrw" => (50, 0.0),
                    other => {
                        return Err(err(
                            line,
                            format!("rw={other} is not supported (read, write, randread, randwrite, rw, randrw)"),
                        ))
                    }
                };
                rw_default_mix = mix;
                w.sequential_share = seq;
            }
            "rwmixread" => {
                let p = int_of(v, line, k)?;
                if p > 100 {
                    return Err(err(line, "rwmixread must be 0..100".into()));
                }
                w.rwmixread = p as u8;
                mix_given = true;
            }
            "rwmixwrite" => {
                let p = int_of(v, line, k)?;
                if p > 100 {
                    return Err(err(line, "rwmixwrite must be 0..100".into()));
                }
                w.rwmixread = 100 - p as u8;
                mix_given = true;
            }
            "random_distribution" => {
                w.distribution = v.parse().map_err(|e: Error| err(line, e.to_string()))?;
            }
            "bs" | "blocksize" => {
                let first = v.split(',').next().unwrap_or("");
                if v.contains(',') {
                    notes.push(format!("bs={v}: using the read size {first} for every IO"));
                }
                w.block_size = size_of(first, line, k)?;
            }
            "size" => w.size = size_of(v, line, k)?,
            "numjobs" => {
                let jobs = int_of(v, line, k)?;
                if jobs > MAX_JOBS {
                    return Err(err(
                        line,
                        format!("numjobs={v}: fio runs at most {MAX_JOBS} jobs"),
                    ));
                }
                w.jobs = jobs as u32;
            }
            "norandommap" => w.randommap = false,
            "randseed" => w.seed = int_of(v, line, k)?,
            "number_ios" => number_ios = Some(int_of(v, line, k)?),
            "io_size" | "io_limit" => io_size = Some(size_of(v, line, k)?),
            "time_based" => time_based = true,
            other if HARMLESS.contains(&other) => {}
            other => notes.push(format!("option '{other}' ignored")),
        }
    }
    if !mix_given {
        w.rwmixread = rw_default_mix;
    } else if rw_default_mix == 100 || rw_default_mix == 0 {
        // rwmixread only applies to mixed modes in fio.
        notes.push("rwmixread ignored: rw is not a mixed mode".into());
        w.rwmixread = rw_default_mix;
    }
    if w.block_size == 0 {
        return Err(Error::Config("bs must not be 0".into()));
    }
    let per_job = match (number_ios, io_size) {
        (Some(n), _) => n,
        (None, Some(b)) => b / w.block_size,
        (None, None) => {
            let pass = w.size / w.block_size;
            if time_based {
                notes.push(format!(
                    "time_based: simulating 10 passes over each file ({} IOs per job); set ios to change",
                    pass.saturating_mul(10)
                ));
                pass.saturating_mul(10)
            } else {
                pass
            }
        }
    };
    w.ios = per_job.saturating_mul(w.jobs as u64);
    w.validate()?;
    Ok(FioJob {
        name: name.clone(),
        workload: w,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELD_STUDY: &str = "
[partial]
ioengine=libaio
direct=1
iodepth=8
numjobs=2
readwrite=randread
random_distribution=zipf:1.2
bs=4k
size=2g
unlink=1
runtime=1800
time_based=1
per_job_logs=1
log_avg_msec=1000        # later 500
write_iops_log=/var/tmp/fio-${FIOTEST}
";

    #[test]
    fn field_study_job() {
        let j = parse_fio_job(FIELD_STUDY, None).unwrap();
        assert_eq!(j.name, "partial");
        let w = &j.workload;
        assert_eq!(
            w.distribution,
            Distribution::Zipf {
                theta: 1.2,
                center: None
            }
        );
        assert_eq!(
            (w.block_size, w.size, w.jobs, w.rwmixread),
            (4096, 2 << 30, 2, 100)
        );
        assert_eq!(w.sequential_share, 0.0);
        assert_eq!(w.ios, 2 * 10 * (2 << 30) / 4096);
        assert!(
            j.notes.iter().any(|n| n.contains("time_based")),
            "{:?}",
            j.notes
        );
    }

    #[test]
    fn global_section_mixed_rw_and_overrides() {
        let text = "[global]\nbs=8k\nsize=64m\nrw=randrw\nrwmixread=70\n\n[a]\nnumber_ios=1000\n[b]\nrw=read\nbs=16k\n";
        let a = parse_fio_job(text, None).unwrap();
        assert_eq!(a.name, "a");
        assert_eq!(
            (a.workload.block_size, a.workload.rwmixread, a.workload.ios),
            (8192, 70, 1000)
        );
        let b = parse_fio_job(text, Some("b")).unwrap();
        assert_eq!(
            (b.workload.block_size, b.workload.sequential_share),
            (16384, 1.0)
        );
        assert_eq!(b.workload.ios, (64 << 20) / 16384);
        assert!(parse_fio_job(text, Some("c")).is_err());
    }

    #[test]
    fn bad_values_name_their_line() {
        let e = parse_fio_job("[x]\nbs=4k\nrw=trim\n", None).unwrap_err();
        assert!(e.to_string().starts_with("job file:3: rw=trim"), "{e}");
        let e = parse_fio_job("[x]\nrandom_distribution=zipf:1\n", None).unwrap_err();
        assert!(e.to_string().starts_with("job file:2:"), "{e}");
        let e = parse_fio_job("bs=4k\n", None).unwrap_err();
        assert!(e.to_string().contains("before any [section]"), "{e}");
    }
}
