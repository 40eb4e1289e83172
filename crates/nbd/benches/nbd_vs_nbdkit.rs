//! Benchmark: our NBD server (MemExport, 1 GiB) vs `nbdkit memory 1G` vs
//! `nbdkit file FILE cache=none`, all on Unix sockets, driven by fio
//! (ioengine=nbd, 4 KiB randread, zipf:1.2, iodepth=8, numjobs=2).
//!
//! `cargo bench -p tiercache-nbd --bench nbd_vs_nbdkit`
//! Environment: NBD_BENCH_RUNTIME (seconds per run, default 10),
//! NBD_BENCH_ROUNDS (interleaved runs per server, best kept, default 3),
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

/// CPU time (user + system) consumed so far by process `pid`, in seconds,
/// from /proc/PID/stat (fields 14 and 15, in clock ticks).
fn cpu_seconds(pid: u32, tick: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (num(11) + num(12)) / tick
}

fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// One measurement: read IOPS and server CPU microseconds per I/O.
#[derive(Clone, Copy, Default)]
struct Sample {
    iops: f64,
    cpu_us_per_io: f64,
}

/// Runs fio against `sock` while watching the CPU time of `server_pid`.
fn measure(sock: &Path, runtime: u64, server_pid: u32, tick: f64) -> Sample {
    let c0 = cpu_seconds(server_pid, tick);
    let (iops, ios) = fio(sock, runtime);
    let c1 = cpu_seconds(server_pid, tick);
    Sample {
        iops,
        cpu_us_per_io: (c1 - c0) * 1e6 / ios.max(1.0),
    }
}

/// Runs fio against `sock` and returns (read IOPS, total read I/Os).
fn fio(sock: &Path, runtime: u64) -> (f64, f64) {
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
    let r = &v["jobs"][0]["read"];
    (
        r["iops"].as_f64().expect("read iops"),
        r["total_ios"].as_f64().expect("read total_ios"),
    )
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
    let rounds = env_num("NBD_BENCH_ROUNDS", 3);
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

    // Rounds are interleaved so that background load hits every server
    // alike; the best round of each is kept (least disturbed).
    let tick = clock_tick();
    let targets = [
        (
            "tiercache-nbd MemExport 1G",
            ours_sock.as_path(),
            std::process::id(),
        ),
        ("nbdkit memory 1G", mem_sock.as_path(), mem.id()),
        ("nbdkit file cache=none", file_sock.as_path(), filekit.id()),
    ];
    let mut best = [Sample::default(); 3];
    for round in 0..rounds.max(1) {
        for (i, (name, sock, pid)) in targets.iter().enumerate() {
            let s = measure(sock, runtime, *pid, tick);
            println!(
                "  round {round}: {name:<30} {:>9.0} IOPS {:>7.1} server-CPU-us/IO",
                s.iops, s.cpu_us_per_io
            );
            if s.iops > best[i].iops {
                best[i] = s;
            }
        }
    }
    let ours = best[0];
    println!(
        "{:<32} {:>10} {:>12} {:>16} {:>16}",
        "server (best round)", "read IOPS", "ours/this", "CPU us/IO", "CPU ours/this"
    );
    for (i, (name, _, _)) in targets.iter().enumerate() {
        println!(
            "{:<32} {:>10.0} {:>12.2} {:>16.1} {:>16.2}",
            name,
            best[i].iops,
            ours.iops / best[i].iops,
            best[i].cpu_us_per_io,
            ours.cpu_us_per_io / best[i].cpu_us_per_io
        );
    }
    let verdict = if ours.iops >= 0.8 * best[1].iops {
        "MET"
    } else {
        "NOT MET"
    };
    println!("target (ours >= 80% of nbdkit memory IOPS): {verdict}");

    let _ = mem.kill();
    let _ = filekit.kill();
    let _ = mem.wait();
    let _ = filekit.wait();
    running.shutdown().unwrap();
}
