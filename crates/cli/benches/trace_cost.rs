//! What recording costs (`tiercache trace`): all-hit IOPS of the whole
//! stack (tiercache serve over NBD, every read a cache hit) and the
//! server's CPU time per IO, with no recording and with a recording of
//! every request running, side by side. The field study's fio job (4 KiB
//! randread, zipf:1.2, iodepth 8, 2 jobs); rounds interleaved (off/on, then
//! on/off) so background load hits both alike; medians reported.
//! Run: `cargo bench -p tiercache --bench trace_cost`.

mod nbd_job;

use nbd_job::{all_hit_server, fio, median, stats, tiercache, STUDY_JOB};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 6;
const RUNTIME: u32 = 6;

/// CPU time (user + system) of process `pid` so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which ends with ')'): utime is the
    // 14th field of the line, stime the 15th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn main() {
    if Command::new("fio").arg("--version").output().is_err() {
        println!("SKIPPED: fio is not installed (make deps)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (sock, ctl) = (d.join("tc.sock"), d.join("tc.ctl"));
    let mut server = all_hit_server(&sock, &ctl);
    // Warm: read everything once (no sequential bypass).
    fio(&sock, &["--rw=read", "--bs=1M"]);
    let rt = format!("--runtime={RUNTIME}");
    let mut job = STUDY_JOB.to_vec();
    job.push(&rt);
    let trace = d.join("run.trace");
    let one = |recording: bool| -> (f64, f64, u64, u64) {
        let mut client: Option<Child> = None;
        if recording {
            client = Some(
                tiercache()
                    .args(["trace", "--seconds", "3600", "--control"])
                    .arg(&ctl)
                    .arg("--out")
                    .arg(&trace)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while stats(&ctl)["trace"]["recording"] != true {
                assert!(Instant::now() < deadline, "recording never started");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let cpu0 = cpu_seconds(server.id());
        let (iops, ios) = fio(&sock, &job);
        let cpu = cpu_seconds(server.id()) - cpu0;
        let (mut requests, mut dropped) = (0, 0);
        if let Some(mut c) = client {
            let _ = c.kill();
            let _ = c.wait();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let t = stats(&ctl)["trace"].clone();
                if t["recording"] == false {
                    requests = t["requests"].as_u64().unwrap();
                    dropped = t["dropped"].as_u64().unwrap();
                    break;
                }
                assert!(Instant::now() < deadline, "recording never stopped");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        (iops, cpu * 1e6 / ios.max(1.0), requests, dropped)
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut recorded = Vec::new();
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for recording in order {
            let (iops, us, req, drop) = one(recording);
            if recording {
                on.push((iops, us));
                recorded.push((req, drop));
            } else {
                off.push((iops, us));
            }
        }
    }
    let bytes = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    let _ = server.kill();
    let _ = server.wait();
    let med = |v: &[(f64, f64)], i: usize| {
        median(v.iter().map(|x| if i == 0 { x.0 } else { x.1 }).collect())
    };
    println!(
        "all-hit 4 KiB randread zipf:1.2 qd8 x2 over NBD, {ROUNDS} interleaved rounds of {RUNTIME}s, medians"
    );
    println!(
        "  recording off   {:>9.0} IOPS  {:>6.2} us server CPU per IO   rounds {:.0?}",
        med(&off, 0),
        med(&off, 1),
        off.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    println!(
        "  recording on    {:>9.0} IOPS  {:>6.2} us server CPU per IO   rounds {:.0?}",
        med(&on, 0),
        med(&on, 1),
        on.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    println!(
        "  on / off: IOPS {:.3}, CPU per IO {:.3}",
        med(&on, 0) / med(&off, 0),
        med(&on, 1) / med(&off, 1)
    );
    println!(
        "  recorded (requests, dropped) per round: {recorded:?}; last trace file {bytes} bytes"
    );
}
