//! The whole benchmark at tiny sizes (seconds each): the report has a row
//! for every configuration with every repeat, the medians and ranges are
//! those of the repeats, the PNGs are valid and referenced, targets are
//! judged per round, and the cache beats the slow device (by far: an HDD
//! model at ~200 IOPS against a cache serving thousands). The sweep and
//! the git workload run at tiny sizes too.

use clap::Parser;
use std::path::{Path, PathBuf};
use tiercache_bench::BenchArgs;
use tiercache_testkit::{have, tool_exists};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    b: BenchArgs,
}

/// The `tiercache` executable: $TIERCACHE_EXE, or the one cargo built next
/// to this test (target/<profile>/tiercache; `cargo test --workspace`
/// builds it).
fn tiercache_exe() -> PathBuf {
    if let Ok(p) = std::env::var("TIERCACHE_EXE") {
        return PathBuf::from(p);
    }
    let me = std::env::current_exe().unwrap();
    let profile_dir = me.parent().unwrap().parent().unwrap();
    let exe = profile_dir.join("tiercache");
    assert!(
        exe.exists(),
        "{} is missing: build it first (`cargo build -p tiercache`, same profile) or set TIERCACHE_EXE",
        exe.display()
    );
    exe
}

/// Checks the PNG signature and decodes the whole image.
fn assert_png(p: &Path) {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        p.display()
    );
    let dec = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(
        info.width >= 800 && info.height >= 600,
        "{}: {}x{}",
        p.display(),
        info.width,
        info.height
    );
    // Not a blank canvas: some pixels are not white.
    assert!(buf.iter().any(|&b| b < 200), "{} is blank", p.display());
}

fn run_bench(extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    let mut argv = vec![
        "bench",
        "--data-size",
        "1M",
        "--cache-size",
        "2M",
        // Two seconds: at least 3 windows of 250 ms even when a loaded
        // machine starts fio late (one second gave 2 under load).
        "--runtime",
        "2",
        "--log-msec",
        "250",
        "--work-dir",
        work.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    let args = Cli::parse_from(argv).b;
    tiercache_bench::run(&args, &tiercache_exe()).unwrap();
    assert!(!work.join("fast.img").exists(), "device files removed");
    assert!(!work.join("cache.img").exists(), "cache file removed");
    (dir, out)
}

fn results(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

fn run_by_label<'a>(v: &'a serde_json::Value, label: &str) -> &'a serde_json::Value {
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no run {label}"))
}

fn median_iops(run: &serde_json::Value) -> f64 {
    let v: Vec<f64> = run["repeats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["iops"].as_f64().unwrap())
        .collect();
    tiercache_bench::median(&v).unwrap()
}

#[test]
fn tiny_bench_repeats_every_configuration_and_the_cache_beats_the_hdd() {
    if !have("fio", module_path!()) {
        return;
    }
    let with_nbdkit = tool_exists("nbdkit");
    // The RAM-cache variant is the same code path as the file cache with
    // another --cache (its labels are unit-tested); leaving it out keeps
    // this test under 30 s on two busy cores.
    let (_dir, out) = run_bench(&["--repeats", "2", "--no-ram-cache"]);

    let report = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    let mut labels = vec![
        "fast device alone",
        "slow device alone (HDD model)",
        "tiercache, empty cache",
        "tiercache, full of stale data",
    ];
    let v = results(&out);
    // Root with a memory controller: the memory-capped nbdkit runs too.
    let capped = v["nbdkit_memory_cap"].as_u64().is_some();
    if with_nbdkit && capped {
        labels.push("nbdkit cache filter (memory-capped), empty cache");
        labels.push("nbdkit cache filter (memory-capped), full of stale data");
    }
    if with_nbdkit {
        labels.push("nbdkit cache filter (in page cache), empty cache");
        labels.push("nbdkit cache filter (in page cache), full of stale data");
    }
    for l in &labels {
        // Once in the results table, once in the table by round.
        let rows = report
            .lines()
            .filter(|line| line.starts_with(&format!("| {l} |")))
            .count();
        assert_eq!(rows, 2, "rows for {l}:\n{report}");
    }
    assert!(report.contains("| round 1 | round 2 |"), "{report}");
    for png in ["iops.png", "iops-zoom.png", "latency.png"] {
        assert!(
            report.contains(&format!("]({png})")),
            "REPORT.md does not embed {png}"
        );
        assert_png(&out.join(png));
    }
    assert!(report.contains("## Targets"), "{report}");
    assert!(
        report.contains("**PASS**") || report.contains("**MISS**"),
        "targets are checked: {report}"
    );
    // Every target is judged on per-round ratios, both rounds listed.
    for line in report.lines().filter(|l| l.starts_with("- **")) {
        if line.contains("sweep") {
            continue;
        }
        let per_round = line.split("per round ").nth(1).unwrap_or("");
        assert_eq!(
            per_round.split(';').next().unwrap().split(", ").count(),
            2,
            "two rounds in {line}"
        );
    }
    if with_nbdkit && capped {
        assert!(
            report.contains("tiercache vs nbdkit cache filter (memory-capped)"),
            "{report}"
        );
    }

    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), labels.len(), "{v}");
    for r in runs {
        let reps = r["repeats"].as_array().unwrap();
        // The slow device runs once; everything else once per round.
        let want = if r["kind"] == "Slow" { 1 } else { 2 };
        assert_eq!(reps.len(), want, "{}", r["label"]);
        let rounds: Vec<u64> = reps.iter().map(|x| x["round"].as_u64().unwrap()).collect();
        if want == 2 {
            assert_eq!(rounds, vec![0, 1], "{}", r["label"]);
        }
        // The representative run is one of the repeats: the median one
        // (the lower of two).
        let iops: Vec<f64> = reps.iter().map(|x| x["iops"].as_f64().unwrap()).collect();
        let rep = r["measured"]["iops"].as_f64().unwrap();
        let lo = iops.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(rep, lo, "{}: representative {rep} of {iops:?}", r["label"]);
        for x in reps {
            let o = x["others_cpu"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&o), "{}: others {o}", r["label"]);
        }
        // Merged IOPS logs: one point per 250 ms window, both jobs summed.
        let series = r["measured"]["series"].as_array().unwrap();
        assert!(
            series.len() >= 3,
            "{}: {} windows",
            r["label"],
            series.len()
        );
        let pcts = r["measured"]["clat_percentiles"].as_array().unwrap();
        assert!(pcts.len() >= 5, "{}", r["label"]);
    }
    let slow = median_iops(run_by_label(&v, "slow device alone (HDD model)"));
    let cached = median_iops(run_by_label(&v, "tiercache, empty cache"));
    assert!(slow > 0.0);
    assert!(
        cached > 2.0 * slow,
        "tiercache ({cached:.0} IOPS) should beat the emulated HDD ({slow:.0}) by far"
    );
    // tiercache's own counters give a hit ratio; the empty cache warmed up.
    let hit = run_by_label(&v, "tiercache, empty cache")["hit_ratio"]
        .as_f64()
        .unwrap();
    assert!(hit > 0.5, "hit ratio {hit}");
    // The stale run met a full cache.
    let note = run_by_label(&v, "tiercache, full of stale data")["note"]
        .as_str()
        .unwrap()
        .to_string();
    let counts: Vec<u64> = note
        .trim_start_matches("before the run: ")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .take(2)
        .collect();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[1] > 0,
        "the cache is full before the stale run: {note}"
    );
    assert!(out.join("iops-tiercache-empty-cache.csv").exists());
}

#[test]
fn tiny_sweep_reports_every_data_size() {
    if !have("fio", module_path!()) {
        return;
    }
    let (_dir, out) = run_bench(&[
        "--repeats",
        "1",
        "--no-nbdkit",
        "--no-ram-cache",
        "--sweep",
        "--sweep-factors",
        "0.5,4",
        "--sweep-runtime",
        "1",
    ]);
    let report = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    assert!(
        report.contains("## Data size against a fixed 2 MiB cache"),
        "{report}"
    );
    for row in ["| 1 MiB | 0.5x |", "| 8 MiB | 4x |"] {
        assert!(report.contains(row), "no sweep row {row}: {report}");
    }
    for png in ["sweep.png", "sweep-latency.png"] {
        assert!(report.contains(&format!("]({png})")), "{report}");
        assert_png(&out.join(png));
    }
    let v = results(&out);
    let sweep = v["sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 2);
    assert_eq!(sweep[0]["data_size"], 1 << 20);
    assert_eq!(sweep[1]["data_size"], 8 << 20);
    // Data half the cache size fits: after the warm-up nearly every read
    // hits.
    let fits = sweep[0]["hit_ratio"].as_f64().unwrap();
    assert!(fits > 0.5, "hit ratio {fits} with the data fitting");
    assert!(sweep[1]["hit_ratio"].as_f64().is_some());
}

#[test]
fn tiny_git_workload_times_clone_and_greps() {
    if !have("fio", module_path!()) {
        return;
    }
    let (_dir, out) = run_bench(&[
        "--repeats",
        "1",
        "--no-nbdkit",
        "--no-ram-cache",
        "--git",
        "--git-files",
        "60",
        "--git-greps",
        "2",
    ]);
    let v = results(&out);
    let g = &v["git"];
    let report = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    assert!(report.contains("## Real application: git"), "{report}");
    if let Some(why) = g["skipped"].as_str() {
        // No root, FUSE or loop devices here: said plainly.
        assert!(report.contains("SKIPPED"), "{report}");
        eprintln!("git workload skipped: {why}");
        return;
    }
    let runs = g["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "slow device alone (HDD model)",
            "fast device alone",
            "tiercache"
        ]
    );
    for r in runs {
        assert!(r["clone_secs"].as_f64().unwrap() > 0.0);
        assert_eq!(r["grep_secs"].as_array().unwrap().len(), 2);
        assert!(report.contains(&format!("| {} |", r["label"].as_str().unwrap())));
    }
    // tiercache's counters over the greps: the greps read through it.
    let tc = &runs[2];
    assert!(tc["grep_reads"].as_u64().unwrap() > 0, "{tc}");
}
