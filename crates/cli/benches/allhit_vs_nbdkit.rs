//! All-hit IOPS of the whole stack (tiercache serve: NBD server + engine,
//! every read a cache hit) against `nbdkit memory` and `nbdkit file`
//! (cache=none) serving the same size, with the field study's fio job
//! (4 KiB randread, zipf:1.2, iodepth 8, 2 jobs). Rounds are interleaved so
//! background load hits every server alike; medians are reported.
//! Run: `cargo bench -p tiercache --bench allhit_vs_nbdkit`.

mod nbd_job;

use nbd_job::{all_hit_server, fio, median, stats, wait_for, SIZE, STUDY_JOB};
use std::process::{Child, Command};

const ROUNDS: usize = 5;
const RUNTIME: u32 = 6;

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
    let mut children: Vec<Child> = vec![all_hit_server(&d.join("tc.sock"), &d.join("tc.ctl"))];
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
    for s in ["mem.sock", "file.sock"] {
        wait_for(&d.join(s));
    }
    // Warm tiercache: read everything once (no sequential bypass).
    fio(&d.join("tc.sock"), &["--rw=read", "--bs=1M"]);
    let rt = format!("--runtime={RUNTIME}");
    let (mut tc, mut mem, mut fil) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let mut args: Vec<&str> = STUDY_JOB.to_vec();
        args.push(&rt);
        tc.push(fio(&d.join("tc.sock"), &args).0);
        mem.push(fio(&d.join("mem.sock"), &args).0);
        fil.push(fio(&d.join("file.sock"), &args).0);
    }
    let s = stats(&d.join("tc.ctl"));
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
