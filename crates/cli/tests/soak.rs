//! A short soak (the long one: TIERCACHE_SOAK_SECS=600): 16 fio clients over
//! NBD with crc32c verification on disjoint ranges, a cache far smaller than
//! the data (promotions and demotions all the time), while an operator
//! thread reads stats, switches modes and flushes. Zero verification errors;
//! the server's open files and memory stay flat.

mod common;

use common::{bin, tiercache, Served};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

#[test]
fn sixteen_verifying_clients_with_mode_switches_and_flushes() {
    if !tiercache_testkit::have(
        "fio",
        "sixteen_verifying_clients_with_mode_switches_and_flushes",
    ) {
        return;
    }
    let secs: u64 = std::env::var("TIERCACHE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("b.img"))
        .unwrap()
        .set_len(72 << 20)
        .unwrap();
    std::fs::File::create(d.join("c.img"))
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    let st = tiercache()
        .args([
            "create",
            "--block-size",
            "4k",
            "--mode",
            "writeback",
            "--backing",
        ])
        .arg(d.join("b.img"))
        .arg("--cache")
        .arg(d.join("c.img"))
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let mut server = Served::spawn(
        bin(),
        d,
        &d.join("b.img").display().to_string(),
        &d.join("c.img").display().to_string(),
        &["--sequential-cutoff", "0"],
    );
    let pid = server.pid().unwrap();
    let ctl = server.control();
    let control = |args: &[&str]| -> String {
        let out = tiercache()
            .args(args)
            .arg("--control")
            .arg(&ctl)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = fds_and_rss(pid);
    let stop = Arc::new(AtomicBool::new(false));
    // Samples of (fds, RSS) through the run: after warm-up they must stay
    // flat, not just end below a bound.
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                samples.push(fds_and_rss(pid));
                std::thread::sleep(Duration::from_millis(250));
            }
            samples
        })
    };
    let operator = {
        let stop = stop.clone();
        let ctl = ctl.clone();
        std::thread::spawn(move || {
            let modes = ["writeback", "writethrough", "writearound", "passthrough"];
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let run = |args: &[&str]| {
                    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
                        .args(args)
                        .arg("--control")
                        .arg(&ctl)
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{args:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                };
                run(&["stats", "--json"]);
                run(&["set-mode", modes[i % modes.len()]]);
                if i % 3 == 0 {
                    run(&["flush"]);
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(150));
            }
            i
        })
    };
    let uri = format!(
        "--uri=nbd+unix:///default?socket={}",
        server.socket().display()
    );
    let out = Command::new("fio")
        .current_dir(d)
        .args([
            "--output-format=json",
            "--ioengine=nbd",
            &uri,
            "--name=soak",
        ])
        .args([
            "--rw=randrw",
            "--bs=4k",
            "--bssplit=4k/60:16k/30:64k/10",
            "--iodepth=4",
            "--numjobs=16",
        ])
        .args([
            "--size=4M",
            "--offset_increment=4M",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_backlog=64",
            // A flush from each client every 64 writes.
            "--fsync=64",
        ])
        .args(["--time_based", &format!("--runtime={secs}")])
        // A 17th client trims and rewrites its own 8 MiB (trimmed data is
        // undefined, so it is not verified) while the others run.
        .args([
            "--name=trimmer",
            "--rw=trimwrite",
            "--bs=64k",
            "--offset=64M",
            "--size=8M",
            "--iodepth=2",
            "--numjobs=1",
            "--time_based",
            &format!("--runtime={secs}"),
        ])
        .output()
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let switches = operator.join().unwrap();
    let samples = sampler.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let mut ios = 0u64;
    for job in v["jobs"].as_array().unwrap() {
        assert_eq!(
            job["error"], 0,
            "job {} failed verification",
            job["jobname"]
        );
        if job["jobname"] == "soak" {
            ios += job["read"]["total_ios"].as_u64().unwrap()
                + job["write"]["total_ios"].as_u64().unwrap();
        }
    }
    let stats: serde_json::Value = serde_json::from_str(&control(&["stats", "--json"])).unwrap();
    assert!(
        stats["trims"].as_u64().unwrap() > 0,
        "no trim reached the engine"
    );
    let after = fds_and_rss(pid);
    server.stop();
    let dec = &stats["decisions"];
    assert!(
        dec["promotions"].as_u64().unwrap() > 0 && dec["demotions"].as_u64().unwrap() > 0,
        "{dec}"
    );
    assert!(
        switches >= 3,
        "the operator switched modes {switches} times"
    );
    assert!(
        after.0 <= before.0 + 8,
        "open files grew from {} to {}",
        before.0,
        after.0
    );
    assert!(
        after.1 < before.1 + 256 * 1024,
        "RSS grew from {} KiB to {} KiB",
        before.1,
        after.1
    );
    // Flat: the second half of the run never needs much more than the
    // first half did.
    let half = samples.len() / 2;
    let peak = |s: &[(usize, u64)]| {
        s.iter()
            .fold((0, 0), |(f, r), &(f2, r2)| (f.max(f2), r.max(r2)))
    };
    let (first, second) = (peak(&samples[..half]), peak(&samples[half..]));
    assert!(
        second.0 <= first.0 + 4 && second.1 <= first.1 + 64 * 1024,
        "not flat: first half peak {first:?}, second half peak {second:?} (fds, RSS KiB)"
    );
    eprintln!(
        "soak: 16 verifying clients + 1 trimming x {secs}s, {ios} IOs verified, {} trims, {switches} operator rounds, fds {}->{}, rss {}->{} KiB (peak first half {} KiB, second half {} KiB)",
        stats["trims"],
        before.0, after.0, before.1, after.1, first.1, second.1
    );
}
