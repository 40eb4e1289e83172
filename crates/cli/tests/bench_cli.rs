//! `tiercache bench` through the real binary, at a tiny size (seconds):
//! the subcommand is wired, prints the table and the targets, and writes
//! REPORT.md. The library's own test (crates/bench/tests) checks the
//! report in depth.

use std::process::Command;

#[test]
fn bench_subcommand_runs_and_reports() {
    if !tiercache_testkit::have("fio", "bench_subcommand_runs_and_reports") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args([
            "bench",
            "--data-size",
            "1M",
            "--cache-size",
            "2M",
            "--runtime",
            "2",
            "--repeats",
            "1",
            "--no-nbdkit",
            "--no-ram-cache",
        ])
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .arg("--out-dir")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "| fast device alone |",
        "| slow device alone (HDD model) |",
        "| tiercache, empty cache |",
        "| tiercache, full of stale data |",
    ] {
        assert!(stdout.contains(row), "no row {row}: {stdout}");
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("PASS ") || l.starts_with("MISS ")),
        "{stdout}"
    );
    let report = std::fs::read_to_string(dir.path().join("out/REPORT.md")).unwrap();
    assert!(
        report.contains("![") && report.contains("iops.png"),
        "{report}"
    );
    assert!(
        !dir.path().join("work/fast.img").exists(),
        "device files removed"
    );
}
