//! The whole benchmark at a tiny size (seconds): the report has a row for
//! every configuration, the PNGs are valid and referenced, targets are
//! printed, and the cache beats the slow device (by far: an HDD model at
//! ~200 IOPS against a cache serving thousands).

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use tiercache_bench::BenchArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    b: BenchArgs,
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
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

#[test]
fn tiny_bench_writes_a_complete_report_and_the_cache_beats_the_hdd() {
    if !have("fio") {
        eprintln!("SKIPPED: fio is not installed (run `make deps`)");
        return;
    }
    let with_nbdkit = have("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    let args = Cli::parse_from([
        "bench",
        "--data-size",
        "2M",
        "--cache-size",
        "4M",
        "--runtime",
        "3",
        "--junk-runtime",
        "1",
        "--work-dir",
        work.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ])
    .b;
    tiercache_bench::run(&args, &tiercache_exe()).unwrap();

    let report = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    let mut labels = vec![
        "fast device alone",
        "slow device alone (HDD model)",
        "tiercache, empty cache",
        "tiercache, full of stale data",
        "tiercache (RAM cache), empty cache",
        "tiercache (RAM cache), full of stale data",
        "fast device alone, again at the end",
    ];
    if with_nbdkit {
        labels.push("nbdkit cache filter, empty cache");
        labels.push("nbdkit cache filter, full of stale data");
    }
    for l in &labels {
        assert!(
            report
                .lines()
                .any(|line| line.starts_with(&format!("| {l} |"))),
            "no table row for {l}:\n{report}"
        );
    }
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
    if with_nbdkit {
        assert!(report.contains("vs nbdkit cache filter"), "{report}");
    }

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), labels.len(), "{v}");
    let iops = |label: &str| {
        runs.iter()
            .find(|r| r["label"] == label)
            .unwrap_or_else(|| panic!("no run {label}"))["measured"]["iops"]
            .as_f64()
            .unwrap()
    };
    let slow = iops("slow device alone (HDD model)");
    let cached = iops("tiercache, empty cache");
    assert!(slow > 0.0);
    assert!(
        cached > 2.0 * slow,
        "tiercache ({cached:.0} IOPS) should beat the emulated HDD ({slow:.0}) by far"
    );
    for r in runs {
        // Merged IOPS logs: one point per 500 ms window, both jobs summed.
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
    // tiercache's own counters give a hit ratio; the empty cache warmed up.
    let hit = runs
        .iter()
        .find(|r| r["label"] == "tiercache, empty cache")
        .unwrap()["hit_ratio"]
        .as_f64()
        .unwrap();
    assert!(hit > 0.5, "hit ratio {hit}");
    assert!(out.join("iops-tiercache-empty-cache.csv").exists());
}
