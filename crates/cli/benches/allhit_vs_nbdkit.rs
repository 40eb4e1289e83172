//! All-hit IOPS of the whole stack (tiercache serve: NBD server + engine,
//! every read a cache hit) against `nbdkit memory` and `nbdkit file`
//! (cache=none) serving the same size, with the field study's fio job
//! (4 KiB randread, zipf:1.2, iodepth 8, 2 jobs). Rounds are interleaved so
//! background load hits every server alike; medians are reported.
//! Run: `cargo bench -p tiercache --bench allhit_vs_nbdkit`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SIZE: &str = "256M";
const ROUNDS: usize = 5;
const RUNTIME: u32 = 6;

fn wait_for(path: &std::path::Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

fn fio(socket: &std::path::Path, extra: &[&str]) -> f64 {
    let out = Command::new("fio")
        .args([
            "--name=x",
            "--ioengine=nbd",
            "--output-format=json",
            "--group_reporting",
        ])
        .arg(format!("--uri=nbd+unix:///?socket={}", socket.display()))
        .arg(format!("--size={SIZE}"))
        .args(extra)
        .output()
        .expect("fio (make deps installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).expect("fio json");
    v["jobs"][0]["read"]["iops"].as_f64().unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if Command::new("nbdkit").arg("--version").output().is_err() {
        println!("SKIPPED: nbdkit is not installed (make deps)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = d.join("file.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let mut children: Vec<Child> = Vec::new();
    children.push(
        Command::new(env!("CARGO_BIN_EXE_tiercache"))
            .args([
                "serve",
                "--backing",
                &format!("mem:{SIZE}"),
                "--cache",
                "mem:300M",
                "--block-size",
                "4k",
            ])
            .args(["--sequential-cutoff", "0", "--socket"])
            .arg(d.join("tc.sock"))
            .arg("--control")
            .arg(d.join("tc.ctl"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    children.push(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(d.join("mem.sock"))
            .args(["memory", SIZE])
            .spawn()
            .unwrap(),
    );
    children.push(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(d.join("file.sock"))
            .arg("file")
            .arg(&file)
            .arg("cache=none")
            .spawn()
            .unwrap(),
    );
    for s in ["tc.sock", "mem.sock", "file.sock"] {
        wait_for(&d.join(s));
    }
    // Warm tiercache: read everything once (no sequential bypass).
    fio(&d.join("tc.sock"), &["--rw=read", "--bs=1M"]);
    let job = [
        "--rw=randread",
        "--bs=4k",
        "--random_distribution=zipf:1.2",
        "--iodepth=8",
        "--numjobs=2",
        "--time_based",
    ];
    let rt = format!("--runtime={RUNTIME}");
    let (mut tc, mut mem, mut fil) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut args: Vec<&str> = job.to_vec();
        args.push(&rt);
        tc.push(fio(&d.join("tc.sock"), &args));
        mem.push(fio(&d.join("mem.sock"), &args));
        fil.push(fio(&d.join("file.sock"), &args));
    }
    let stats = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["stats", "--json", "--control"])
        .arg(d.join("tc.ctl"))
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let (h, m) = (
        s["decisions"]["read_hits"].as_f64().unwrap(),
        s["decisions"]["read_misses"].as_f64().unwrap(),
    );
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let (t, k, f) = (median(tc.clone()), median(mem.clone()), median(fil.clone()));
    println!("all-hit 4 KiB randread zipf:1.2 qd8 x2, {ROUNDS} interleaved rounds of {RUNTIME}s, median IOPS");
    println!("  tiercache (engine, all hits)  {t:>9.0}   rounds {tc:.0?}");
    println!("  nbdkit memory                 {k:>9.0}   rounds {mem:.0?}");
    println!("  nbdkit file cache=none        {f:>9.0}   rounds {fil:.0?}");
    println!(
        "  tiercache / nbdkit memory = {:.2}   (target >= 0.80)",
        t / k
    );
    println!(
        "  tiercache / nbdkit file   = {:.2}   (target > 1.00)",
        t / f
    );
    println!(
        "  tiercache hit ratio over the whole run (warm-up included): {:.2}%",
        100.0 * h / (h + m)
    );
}
