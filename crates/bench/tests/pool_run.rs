//! `tiercache bench --pool` at a tiny size (seconds per run, two rounds):
//! every run (shared, equal slices, the simulator's best split, scanner
//! off) of every round reports every volume it ran, each with IOs and
//! sane counters, round 2 runs them in another order, the medians cover
//! both rounds, and the report has a row per volume and the pool's, the
//! targets judged, and a row per run.

use clap::Parser;
use std::path::PathBuf;
use tiercache_bench::BenchArgs;
use tiercache_testkit::have;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    b: BenchArgs,
}

/// The `tiercache` executable: $TIERCACHE_EXE, or the one cargo built next
/// to this test (`cargo build -p tiercache`, same profile).
fn tiercache_exe() -> PathBuf {
    if let Ok(p) = std::env::var("TIERCACHE_EXE") {
        return PathBuf::from(p);
    }
    let me = std::env::current_exe().unwrap();
    let exe = me.parent().unwrap().parent().unwrap().join("tiercache");
    assert!(exe.exists(), "{} is missing: build it first", exe.display());
    exe
}

const VOLUMES: [&str; 5] = ["hot", "hot2", "cold", "scan", "writer"];

#[test]
fn tiny_pool_reports_every_volume_shared_sliced_and_without_the_scanner() {
    if !have("fio", module_path!()) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    let args = Cli::parse_from([
        "bench",
        "--pool",
        "--data-size",
        "8M",
        "--cache-size",
        "10M",
        "--runtime",
        "1",
        "--rounds",
        "2",
        "--work-dir",
        work.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ])
    .b;
    tiercache_bench::run(&args, &tiercache_exe()).unwrap();
    for f in ["hot.img", "cache.img", "slice0.img"] {
        assert!(!work.join("pool").join(f).exists(), "{f} removed");
    }

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("pool-results.json")).unwrap())
            .unwrap();
    assert!(v["notes"].as_array().unwrap().is_empty(), "{}", v["notes"]);
    let runs = v["runs"].as_array().unwrap();
    let labels: Vec<(u64, &str)> = runs
        .iter()
        .map(|r| (r["round"].as_u64().unwrap(), r["label"].as_str().unwrap()))
        .collect();
    const SHARED: &str = "shared cache, one server";
    const SLICES: &str = "equal static slices, one server each";
    const BEST: &str = "best static split (simulator), one server each";
    const NO_SCAN: &str = "shared cache, scanner off";
    assert_eq!(
        labels,
        [
            (0, SHARED),
            (0, SLICES),
            (0, BEST),
            (0, NO_SCAN),
            (1, SLICES),
            (1, BEST),
            (1, NO_SCAN),
            (1, SHARED)
        ]
    );
    // Medians per configuration, over both rounds.
    let medians = v["medians"].as_array().unwrap();
    let ml: Vec<&str> = medians
        .iter()
        .map(|m| m["label"].as_str().unwrap())
        .collect();
    assert_eq!(ml, [SHARED, SLICES, BEST, NO_SCAN]);
    for m in medians {
        assert_eq!(m["rounds"], 2, "{m}");
        let h = &m["pool"]["hit_ratio"];
        let (lo, med, hi) = (
            h["min"].as_f64().unwrap(),
            h["median"].as_f64().unwrap(),
            h["max"].as_f64().unwrap(),
        );
        assert!(lo <= med && med <= hi && hi <= 1.0, "{m}");
        assert!(m["pool"]["iops"]["median"].as_f64().unwrap() > 0.0, "{m}");
        // At the whole pool's mix: every run but the scanner-off one.
        let x = m["pool_but_scan_at_mix"]["median"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&x), "{m}");
        let all = m["pool_at_mix"]["median"].as_f64();
        assert_eq!(all.is_none(), m["label"] == NO_SCAN, "{m}");
    }
    // The fixed mix: every volume's references in the shared runs.
    let mix = v["mix"].as_array().unwrap();
    assert_eq!(mix.len(), VOLUMES.len(), "{}", v["mix"]);
    assert!(
        mix.iter().all(|x| x[1].as_f64().unwrap() > 0.0),
        "{}",
        v["mix"]
    );
    // The simulator's split: ratios, and slices for volumes it names.
    let sim = &v["sim"];
    for k in [
        "shared_hit_ratio",
        "best_static_hit_ratio",
        "equal_hit_ratio",
    ] {
        let r = sim[k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&r), "{k} {r}");
    }
    let split = sim["best_split"].as_array().unwrap();
    assert!(!split.is_empty(), "{sim}");
    for x in split {
        assert!(VOLUMES.contains(&x[0].as_str().unwrap()), "{sim}");
    }
    // The measured best-split run: a slice per volume, within the cache.
    let slices = sim["slices"].as_array().unwrap();
    assert_eq!(slices.len(), VOLUMES.len(), "{sim}");
    let bytes: u64 = slices.iter().map(|x| x[1].as_u64().unwrap()).sum();
    assert!(bytes <= 10 << 20, "{sim}");
    assert!(
        slices.iter().all(|x| x[1].as_u64().unwrap() >= 2 << 20),
        "{sim}"
    );
    for r in runs {
        let label = r["label"].as_str().unwrap();
        let names: Vec<&str> = r["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = if label.contains("scanner off") {
            VOLUMES.iter().copied().filter(|n| *n != "scan").collect()
        } else {
            VOLUMES.to_vec()
        };
        assert_eq!(names, want, "{label}");
        for x in r["volumes"].as_array().unwrap() {
            let n = x["name"].as_str().unwrap();
            let ios = x["total_ios"].as_u64().unwrap();
            assert!(ios > 0, "{label}: {n} did no IO");
            assert!(x["iops"].as_f64().unwrap() > 0.0, "{label}: {n}");
            assert!(x["p99_ns"].as_u64().unwrap() > 0, "{label}: {n}");
            let (hits, misses) = (x["hits"].as_u64().unwrap(), x["misses"].as_u64().unwrap());
            let (rh, rm) = (
                x["read_hits"].as_u64().unwrap(),
                x["read_misses"].as_u64().unwrap(),
            );
            assert!(rh <= hits && rm <= misses, "{label}: {n}: {x}");
            if n != "writer" && n != "scan" {
                // 4 KiB random reads: each touches one block, hit or miss
                // (fio counts IOs it completed, the server also those of
                // the last, cut-off moment; never fewer than half).
                assert!(rh + rm > 0, "{label}: {n} read nothing: {x}");
                assert!(2 * (rh + rm) >= ios, "{label}: {n}: {x}");
            }
            if n == "writer" {
                assert_eq!(rh + rm, 0, "{label}: the writer only writes: {x}");
                assert!(hits + misses > 0, "{label}: writes counted: {x}");
            }
        }
    }
    // The report: a row per volume, the pool's row, the targets judged.
    let report = std::fs::read_to_string(out.join("POOL-REPORT.md")).unwrap();
    for n in VOLUMES {
        let rows = report
            .lines()
            .filter(|l| l.starts_with(&format!("| {n} |")))
            .count();
        assert_eq!(rows, 1, "row for {n}:\n{report}");
    }
    assert!(report.contains("| **pool** | all together |"), "{report}");
    assert!(
        report.contains("Shared against equal static slices"),
        "{report}"
    );
    assert!(
        report.contains("**MET**") || report.contains("**MISSED**"),
        "{report}"
    );
    assert!(report.contains("| **pool but scan** |"), "{report}");
    // A row per run: round, configuration.
    for (round, short) in [(1, "shared"), (2, "shared"), (2, "no scan")] {
        assert!(
            report.contains(&format!("| {round} | {short} |")),
            "{round} {short}:\n{report}"
        );
    }
}
