//! Benchmark: our NBD server (MemExport, 1 GiB) vs `nbdkit memory 1G` vs
//! `nbdkit file FILE cache=none`, all on Unix sockets, driven by fio
//! (ioengine=nbd, 4 KiB randread, zipf:1.2, iodepth=8, numjobs=2).
//!
//! `cargo bench -p tiercache-nbd --bench nbd_vs_nbdkit`
//! Environment: NBD_BENCH_RUNTIME (seconds per run, default 10),
//! NBD_BENCH_ROUNDS (runs per server, best kept, default 1),
//! NBD_BENCH_WORKERS (our workers per connection, default from config).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use tiercache_nbd::{Listener, MemExport, Server, ServerConfig};

const SIZE: u64 = 1 << 30;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs fio against `sock` and returns read IOPS.
fn fio(sock: &Path, runtime: u64) -> f64 {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            "--ioengine=nbd",
            &format!("--uri=nbd+unix:///?socket={}", sock.display()),
            "--rw=randread",
            "--bs=4k",
            "--random_distribution=zipf:1.2",
            "--iodepth=8",
            "--numjobs=2",
            "--time_based",
            &format!("--runtime={runtime}"),
            "--group_reporting",
            "--output-format=json",
        ])
        .output()
        .expect("run fio");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let json = &text[text.find('{').expect("fio JSON")..];
    let v: serde_json::Value = serde_json::from_str(json).expect("fio JSON");
    v["jobs"][0]["read"]["iops"].as_f64().expect("read iops")
}

/// Starts nbdkit in the foreground on `sock`; returns once it is ready.
fn nbdkit(sock: &Path, pidfile: &Path, plugin_args: &[&str]) -> Child {
    let mut c = Command::new("nbdkit")
        .arg("-f")
        .arg("-U")
        .arg(sock)
        .arg("-P")
        .arg(pidfile)
        .args(plugin_args)
        .stdout(Stdio::null())
        .spawn()
        .expect("start nbdkit");
    while !pidfile.exists() {
        if let Some(st) = c.try_wait().unwrap() {
            panic!("nbdkit exited early: {st}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    c
}

fn best_of(rounds: u64, mut f: impl FnMut() -> f64) -> f64 {
    (0..rounds.max(1)).map(|_| f()).fold(0.0, f64::max)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing
    // useful either: only run when invoked as a benchmark.
    if !std::env::args().any(|a| a == "--bench") {
        println!("nbd_vs_nbdkit: run with `cargo bench` to benchmark");
        return;
    }
    for tool in ["fio", "nbdkit"] {
        if !have(tool) {
            println!("SKIPPED nbd_vs_nbdkit: `{tool}` is not installed (scripts/install-deps.sh)");
            return;
        }
    }
    let runtime = env_num("NBD_BENCH_RUNTIME", 10);
    let rounds = env_num("NBD_BENCH_ROUNDS", 1);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    let mut cfg = ServerConfig::default();
    if let Ok(w) = std::env::var("NBD_BENCH_WORKERS") {
        cfg.workers = w.parse().expect("NBD_BENCH_WORKERS");
    }
    println!(
        "fio randread 4k zipf:1.2 iodepth=8 numjobs=2, {runtime}s x {rounds} round(s); our workers/conn = {}",
        cfg.workers
    );
    let ours_sock: PathBuf = d.join("ours.sock");
    let server = Server::single("", Arc::new(MemExport::new(SIZE)), cfg).unwrap();
    let running = server
        .spawn(Listener::bind_unix(&ours_sock).unwrap())
        .unwrap();

    let mem_sock = d.join("mem.sock");
    let mut mem = nbdkit(&mem_sock, &d.join("mem.pid"), &["memory", "1G"]);
    let file = d.join("disk.img");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let file_sock = d.join("file.sock");
    let file_arg = format!("file={}", file.display());
    let mut filekit = nbdkit(
        &file_sock,
        &d.join("file.pid"),
        &["file", &file_arg, "cache=none"],
    );

    let ours = best_of(rounds, || fio(&ours_sock, runtime));
    let kit_mem = best_of(rounds, || fio(&mem_sock, runtime));
    let kit_file = best_of(rounds, || fio(&file_sock, runtime));

    println!("{:<34} {:>12} {:>14}", "server", "read IOPS", "ours / this");
    println!(
        "{:<34} {:>12.0} {:>14}",
        "tiercache-nbd MemExport 1G", ours, "1.00"
    );
    println!(
        "{:<34} {:>12.0} {:>14.2}",
        "nbdkit memory 1G",
        kit_mem,
        ours / kit_mem
    );
    println!(
        "{:<34} {:>12.0} {:>14.2}",
        "nbdkit file cache=none",
        kit_file,
        ours / kit_file
    );
    let verdict = if ours >= 0.8 * kit_mem {
        "MET"
    } else {
        "NOT MET"
    };
    println!("target (ours >= 80% of nbdkit memory): {verdict}");

    let _ = mem.kill();
    let _ = filekit.kill();
    let _ = mem.wait();
    let _ = filekit.wait();
    running.shutdown().unwrap();
}
