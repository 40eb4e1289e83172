//! What the NBD benchmarks of this folder share: an all-hit tiercache
//! server (RAM backing and cache, 4 KiB blocks, no sequential bypass) and
//! fio's nbd engine against a unix socket, with medians over rounds.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The size of every served volume (tiercache's RAM backing, nbdkit's).
pub const SIZE: &str = "256M";

/// The field study's job: 4 KiB randread, zipf:1.2, iodepth 8, 2 jobs,
/// run for a time given by the caller's `--runtime`.
pub const STUDY_JOB: [&str; 6] = [
    "--rw=randread",
    "--bs=4k",
    "--random_distribution=zipf:1.2",
    "--iodepth=8",
    "--numjobs=2",
    "--time_based",
];

/// The tiercache binary under benchmark.
pub fn tiercache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

/// Starts `tiercache serve` on `sock` (control socket `ctl`) with a RAM
/// backing of `SIZE` and a RAM cache larger than it, so that once every
/// block has been read once, every read is a hit. Returns when the socket
/// is there.
pub fn all_hit_server(sock: &Path, ctl: &Path) -> Child {
    let child = tiercache()
        .args(["serve", "--backing", &format!("mem:{SIZE}")])
        .args(["--cache", "mem:300M", "--block-size", "4k"])
        .args(["--sequential-cutoff", "0", "--socket"])
        .arg(sock)
        .arg("--control")
        .arg(ctl)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(sock);
    child
}

/// Waits (up to 5 s) until `path` exists; panics if it never does.
pub fn wait_for(path: &Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

/// Runs fio's nbd engine against the export on `socket` over `SIZE`, with
/// the job options `extra`; returns the read IOPS and the reads done.
pub fn fio(socket: &Path, extra: &[&str]) -> (f64, f64) {
    let out = Command::new("fio")
        .args(["--name=x", "--ioengine=nbd"])
        .args(["--output-format=json", "--group_reporting"])
        .arg(format!("--uri=nbd+unix:///?socket={}", socket.display()))
        .arg(format!("--size={SIZE}"))
        .args(extra)
        .output()
        .expect("fio (make deps installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).expect("fio json");
    let r = &v["jobs"][0]["read"];
    (
        r["iops"].as_f64().unwrap_or(0.0),
        r["total_ios"].as_f64().unwrap_or(0.0),
    )
}

/// The server's `stats --json` over its control socket.
pub fn stats(ctl: &Path) -> serde_json::Value {
    let out = tiercache()
        .args(["stats", "--json", "--control"])
        .arg(ctl)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
