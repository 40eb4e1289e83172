//! A short soak (the long one: TIERCACHE_SOAK_SECS=600): 16 fio clients over
//! NBD with crc32c verification on disjoint ranges, a cache far smaller than
//! the data (promotions and demotions all the time), while an operator
//! thread reads stats, switches modes and flushes. Zero verification errors;
//! the server's open files and memory stay flat.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn tc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

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
    if Command::new("fio").arg("--version").output().is_err() {
        eprintln!("SKIPPED: fio is not installed (make deps)");
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
        .set_len(64 << 20)
        .unwrap();
    std::fs::File::create(d.join("c.img"))
        .unwrap()
        .set_len(6 << 20)
        .unwrap();
    let st = tc()
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
    let mut server = tc()
        .args(["serve", "--sequential-cutoff", "0", "--backing"])
        .arg(d.join("b.img"))
        .arg("--cache")
        .arg(d.join("c.img"))
        .arg("--socket")
        .arg(d.join("s.sock"))
        .arg("--control")
        .arg(d.join("s.ctl"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if d.join("s.ctl").exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ctl = d.join("s.ctl");
    let control = |args: &[&str]| -> String {
        let out = tc().args(args).arg("--control").arg(&ctl).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = fds_and_rss(server.id());
    let stop = Arc::new(AtomicBool::new(false));
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
        d.join("s.sock").display()
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
        ])
        .args(["--time_based", &format!("--runtime={secs}")])
        .output()
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let switches = operator.join().unwrap();
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
        ios += job["read"]["total_ios"].as_u64().unwrap()
            + job["write"]["total_ios"].as_u64().unwrap();
    }
    let stats: serde_json::Value = serde_json::from_str(&control(&["stats", "--json"])).unwrap();
    let after = fds_and_rss(server.id());
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let st = server.wait().unwrap();
    assert!(
        st.success(),
        "{}",
        std::fs::read_to_string(d.join("serve.log")).unwrap_or_default()
    );
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
    eprintln!(
        "soak: 16 clients x {secs}s, {ios} IOs verified, {switches} operator rounds, fds {}->{}, rss {}->{} KiB",
        before.0, after.0, before.1, after.1
    );
}
