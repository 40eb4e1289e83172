//! Maps a fio job file onto a [`Workload`].
//!
//! Understood options (from `[global]` and the chosen job section, the job
//! overriding): `rw`/`readwrite`, `rwmixread`/`rwmixwrite`,
//! `random_distribution`, `bs`/`blocksize` (the read value of `R,W`),
//! `size`, `numjobs`, `norandommap`, `randseed`, `number_ios`,
//! `io_size`/`io_limit`, `loops`, `time_based`. Everything else is ignored
//! and listed in [`FioJob::notes`].
//!
//! Number of IOs per job, as fio counts them:
//! - without `time_based`: `loops` (default 1) times one pass, a pass being
//!   `io_size / bs` if `io_size` is given, else `size / bs`. fio performs IOs
//!   "until it has exhausted the size of the region set by size=";
//!   `number_ios=N` only stops a job early (fio compares the IOs done with
//!   `number_ios * loops`), it never extends it: `min(number_ios, pass)`
//!   per loop. So `size=128m bs=4k number_ios=150000` is 32,768 IOs, and
//!   `number_ios=1000` on the same job is 1,000.
//! - `time_based`: fio repeats the job until `runtime`, which is not
//!   modelled. With `number_ios` the job stops there (`number_ios * loops`);
//!   without it the job is open-ended ([`FioJob::open_ended`]): the
//!   simulator runs it until its hit ratios converge (see
//!   [`crate::simulate::Convergence`]), or, without a convergence rule, ten
//!   passes. The notes say which.

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
    /// `time_based` without `number_ios`: fio would know no IO count up
    /// front; `workload.ios` is then ten passes, a placeholder.
    pub open_ended: bool,
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
    let others: Vec<&str> = sections
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "global" && n != name)
        .collect();
    if !others.is_empty() {
        notes.push(format!(
            "fio would run the job sections [{}] beside [{name}] (not modelled): only [{name}] is simulated (--fio-section NAME takes another; numjobs=N in one section runs N alike)",
            others.join("], [")
        ));
    }
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
    let mut loops = 1u64;
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
            "time_based" => time_based = !matches!(v.as_str(), "0" | "false"),
            "loops" => {
                loops = int_of(v, line, k)?;
                if loops == 0 {
                    return Err(err(line, "loops must be at least 1".into()));
                }
            }
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
    let pass = match io_size {
        Some(b) => b / w.block_size,
        None => w.size / w.block_size,
    };
    let mut open_ended = false;
    let per_job = match (time_based, number_ios) {
        (false, Some(n)) => {
            if n > pass {
                notes.push(format!(
                    "number_ios={n} only stops a job early: fio ends each loop after {pass} IOs ({} / bs)",
                    if io_size.is_some() { "io_size" } else { "size" }
                ));
            }
            n.min(pass).saturating_mul(loops)
        }
        (false, None) => pass.saturating_mul(loops),
        (true, Some(n)) => n.saturating_mul(loops),
        (true, None) => {
            open_ended = true;
            notes.push(format!(
                "time_based: runtime is not modelled; simulating 10 passes over each file ({} IOs per job); set ios to change",
                pass.saturating_mul(10)
            ));
            pass.saturating_mul(10)
        }
    };
    w.ios = per_job.saturating_mul(w.jobs as u64);
    w.validate()?;
    Ok(FioJob {
        name: name.clone(),
        workload: w,
        notes,
        open_ended,
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
    fn number_ios_only_stops_a_job_early() {
        let job = |extra: &str| {
            let text = format!("[j]\nrw=randread\nbs=4k\nsize=128m\nnumjobs=2\n{extra}");
            parse_fio_job(&text, None).unwrap()
        };
        // fio does 128m / 4k = 32768 IOs per job, number_ios cannot extend it.
        let j = job("number_ios=150000\n");
        assert_eq!(j.workload.ios, 2 * 32_768);
        assert!(
            j.notes.iter().any(|n| n.contains("only stops")),
            "{:?}",
            j.notes
        );
        assert_eq!(job("number_ios=1000\n").workload.ios, 2 * 1000);
        assert_eq!(job("").workload.ios, 2 * 32_768);
        // loops repeats the job, number_ios caps each loop.
        assert_eq!(job("loops=3\n").workload.ios, 2 * 3 * 32_768);
        assert_eq!(
            job("loops=3\nnumber_ios=150000\n").workload.ios,
            2 * 3 * 32_768
        );
        assert_eq!(job("loops=3\nnumber_ios=100\n").workload.ios, 2 * 3 * 100);
        // io_size sets the pass instead of size.
        assert_eq!(job("io_size=256m\n").workload.ios, 2 * 65_536);
        assert_eq!(
            job("io_size=256m\nnumber_ios=100000\n").workload.ios,
            2 * 65_536
        );
        // time_based: number_ios is the only count; without it, open-ended.
        let t = job("time_based=1\nnumber_ios=150000\n");
        assert_eq!((t.workload.ios, t.open_ended), (2 * 150_000, false));
        let t = job("time_based\n");
        assert!(t.open_ended);
        assert!(!job("time_based=0\n").open_ended);
        assert!(parse_fio_job("[j]\nloops=0\n", None).is_err());
    }

    #[test]
    fn the_other_job_sections_are_named_in_a_note() {
        let text = "[global]\nbs=4k\nsize=1m\n[a]\n[b]\n[c]\n";
        let a = parse_fio_job(text, None).unwrap();
        assert_eq!(a.name, "a");
        assert!(
            a.notes.iter().any(|n| n.contains("[b], [c] beside [a]")),
            "{:?}",
            a.notes
        );
        let b = parse_fio_job(text, Some("b")).unwrap();
        assert!(b.notes.iter().any(|n| n.contains("[a], [c] beside [b]")));
        let one = parse_fio_job("[global]\nbs=4k\nsize=1m\n[a]\n", None).unwrap();
        assert!(!one.notes.iter().any(|n| n.contains("beside")));
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
