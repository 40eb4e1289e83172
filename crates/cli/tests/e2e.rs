//! End to end: the real `tiercache` binary served over NBD to real clients
//! (nbdinfo, fio, qemu-img, nbdcopy, nbdfuse + loop + ext4). Each test
//! skips with a printed reason only when a tool is missing (`make test`
//! installs them).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

fn devices(dir: &Path, backing: u64, cache: u64) {
    let b = std::fs::File::create(dir.join("backing.img")).unwrap();
    b.set_len(backing).unwrap();
    let c = std::fs::File::create(dir.join("cache.img")).unwrap();
    c.set_len(cache).unwrap();
}

#[test]
fn nbdinfo_shows_the_export_and_stats_answer() {
    let t = "nbdinfo_shows_the_export_and_stats_answer";
    if !have("nbdinfo", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    devices(dir.path(), 64 * MIB, 8 * MIB);
    let s = Served::start(bin(), dir.path(), &["--block-size", "16k"]);
    let info: serde_json::Value =
        serde_json::from_str(&run(Command::new("nbdinfo").arg("--json").arg(s.uri()))).unwrap();
    let ex = &info["exports"][0];
    assert_eq!(ex["export-size"], 64 * MIB);
    assert_eq!(ex["can_multi_conn"], true);
    assert_eq!(ex["can_flush"], true);
    assert_eq!(ex["can_fua"], true);
    assert_eq!(ex["can_trim"], true);
    assert_eq!(ex["block_size_minimum"], 512);
    assert_eq!(ex["block_size_preferred"], 16384);
    let st = s.stats();
    assert_eq!(st["mode"], "writethrough");
    assert_eq!(st["block_size"], 16384);
    // 8 MiB of 16 KiB blocks, less the room the metadata takes.
    let cap = st["decisions"]["capacity"].as_u64().unwrap();
    assert!((400..512).contains(&cap), "capacity {cap}");
    let prom = run(tiercache()
        .arg("stats")
        .arg("--prometheus")
        .arg("--control")
        .arg(s.control()));
    assert!(
        prom.contains("# TYPE tiercache_read_hits_total counter"),
        "{prom}"
    );
}

#[test]
fn fio_verify_passes_in_every_mode_with_a_churning_cache() {
    let t = "fio_verify_passes_in_every_mode_with_a_churning_cache";
    if !have("fio", t) {
        return;
    }
    for mode in ["writethrough", "writeback", "writearound", "passthrough"] {
        let dir = tempfile::tempdir().unwrap();
        // 2 MiB of cache for 32 MiB of data: promotions and demotions all the time.
        devices(dir.path(), 32 * MIB, 2 * MIB);
        let s = Served::start(
            bin(),
            dir.path(),
            &[
                "--mode",
                mode,
                "--block-size",
                "4k",
                "--sequential-cutoff",
                "0",
            ],
        );
        let out = run(Command::new("fio")
            .current_dir(dir.path()) // fio leaves verify state files in its working directory
            .arg("--output-format=json")
            .args(["--ioengine=nbd", &format!("--uri={}", s.uri())])
            .args([
                "--bs=4k",
                "--iodepth=8",
                "--verify=crc32c",
                "--verify_fatal=1",
            ])
            .args([
                "--name=writers",
                "--rw=randwrite",
                "--size=12M",
                "--offset_increment=12M",
                "--numjobs=2",
            ])
            .args([
                "--name=readers",
                "--rw=randread",
                "--size=24M",
                "--verify=0",
                "--numjobs=1",
                "--io_size=8M",
            ]));
        let v: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "{mode}: job {} failed", job["jobname"]);
        }
        let st = s.stats();
        let d = &st["decisions"];
        if mode == "passthrough" {
            assert_eq!(d["promotions"], 0, "{mode}");
        } else {
            assert!(d["promotions"].as_u64().unwrap() > 0, "{mode}: {d}");
            assert!(
                d["demotions"].as_u64().unwrap() > 0,
                "{mode}: the cache churned: {d}"
            );
        }
        assert_eq!(st["cache_state"], "ok");
    }
}

#[test]
fn qemu_img_round_trip_and_detach_leaves_backing_whole() {
    let t = "qemu_img_round_trip_and_detach_leaves_backing_whole";
    if !have("qemu-img", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    devices(dir.path(), 16 * MIB, 4 * MIB);
    let src = dir.path().join("src.img");
    let data = pattern(7, (16 * MIB) as usize);
    std::fs::write(&src, &data).unwrap();
    let mut s = Served::start(
        bin(),
        dir.path(),
        &["--mode", "writeback", "--sequential-cutoff", "0"],
    );
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(s.uri()));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(s.uri()));
    assert!(
        s.stats()["decisions"]["dirty"].as_u64().unwrap() > 0,
        "writeback kept dirty data"
    );
    let out = run(tiercache().arg("detach").arg("--control").arg(s.control()));
    assert!(out.contains("detached"), "{out}");
    let st = s.wait_exit(Duration::from_secs(60));
    assert!(st.success(), "{}", s.log());
    assert!(
        std::fs::read(dir.path().join("backing.img")).unwrap() == data,
        "backing device whole after detach"
    );
}

#[test]
fn bad_arguments_get_clear_errors() {
    let out = tiercache()
        .args([
            "serve",
            "--backing",
            "/nonexistent/b.img",
            "--cache",
            "mem:16M",
            "--socket",
            "/tmp/x.sock",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/b.img"), "{err}");
    let out = tiercache()
        .args([
            "serve",
            "--backing",
            "mem:1M",
            "--cache",
            "mem:1M",
            "--block-size",
            "3k",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("block-size"));
    let out = tiercache()
        .args(["stats", "--control", "/nonexistent/c.ctl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach a tiercache server"));
}

/// Undoes the mounts of the ext4 test even if it fails half-way.
#[derive(Default)]
struct Mounts {
    fs: Option<PathBuf>,
    loop_dev: Option<String>,
    fuse: Option<PathBuf>,
    child: Option<Child>,
}

impl Mounts {
    fn release(&mut self) {
        if let Some(m) = self.fs.take() {
            let _ = Command::new("umount").arg(&m).status();
        }
        if let Some(l) = self.loop_dev.take() {
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
        if let Some(m) = self.fuse.take() {
            let _ = Command::new("fusermount3").arg("-u").arg(&m).status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        self.release();
    }
}

/// nbdfuse exposes the export as a file; a loop device makes it a block
/// device. Returns None (after printing why) when this machine cannot.
fn attach(s: &Served, mnt: &Path, m: &mut Mounts, t: &str) -> Option<String> {
    let pidfile = s.dir.join("nbdfuse.pid");
    let _ = std::fs::remove_file(&pidfile);
    let mut child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(mnt)
        .arg(s.uri())
        .spawn()
        .unwrap();
    while !pidfile.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            skip(t, &format!("nbdfuse exited with {st}"));
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    m.child = Some(child);
    m.fuse = Some(mnt.to_path_buf());
    let out = Command::new("losetup")
        .arg("-f")
        .arg("--show")
        .arg(mnt.join("nbd"))
        .output()
        .unwrap();
    if !out.status.success() {
        skip(
            t,
            &format!("losetup failed: {}", String::from_utf8_lossy(&out.stderr)),
        );
        return None;
    }
    let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    m.loop_dev = Some(dev.clone());
    Some(dev)
}

#[test]
fn ext4_on_the_cache_survives_a_server_restart() {
    let t = "ext4_on_the_cache_survives_a_server_restart";
    for tool in [
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "fusermount3",
        "mount",
    ] {
        if !have(tool, t) {
            return;
        }
    }
    if !Path::new("/dev/fuse").exists() {
        skip(t, "/dev/fuse is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    devices(dir.path(), 128 * MIB, 16 * MIB);
    let (mnt, fs) = (dir.path().join("mnt"), dir.path().join("fs"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&fs).unwrap();
    let mut s = Served::start(
        bin(),
        dir.path(),
        &["--mode", "writeback", "--block-size", "16k"],
    );
    let mut m = Mounts::default();
    let Some(dev) = attach(&s, &mnt, &mut m, t) else {
        return;
    };
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    let st = Command::new("mount").arg(&dev).arg(&fs).output().unwrap();
    if !st.status.success() {
        skip(
            t,
            &format!("mount failed: {}", String::from_utf8_lossy(&st.stderr)),
        );
        return;
    }
    m.fs = Some(fs.clone());
    let mut files = Vec::new();
    for d in 0..4 {
        std::fs::create_dir(fs.join(format!("d{d}"))).unwrap();
        for f in 0..6 {
            let name = format!("d{d}/f{f}");
            let data = pattern((d * 10 + f) as u64, 10_000 + 97_531 * f);
            std::fs::write(fs.join(&name), &data).unwrap();
            files.push((name, data));
        }
    }
    run(Command::new("umount").arg(&fs));
    m.fs = None;
    run(Command::new("e2fsck").args(["-fn", &dev]));
    m.release();
    s.stop();

    s.restart();
    let Some(dev) = attach(&s, &mnt, &mut m, t) else {
        return;
    };
    run(Command::new("e2fsck").args(["-fn", &dev]));
    run(Command::new("mount").args(["-o", "ro"]).arg(&dev).arg(&fs));
    m.fs = Some(fs.clone());
    for (name, data) in &files {
        assert!(
            std::fs::read(fs.join(name)).unwrap() == *data,
            "{name} differs after restart"
        );
    }
    m.release();
    s.stop();
}

#[test]
fn a_clean_restart_is_warm_and_refuses_the_wrong_backing_device() {
    let t = "a_clean_restart_is_warm_and_refuses_the_wrong_backing_device";
    if !have("nbdcopy", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    devices(dir.path(), 32 * MIB, 8 * MIB);
    let data = pattern(3, (4 * MIB) as usize);
    let src = dir.path().join("src.img");
    std::fs::write(&src, &data).unwrap();
    // The cleaner left alone: nothing is written back while the test looks.
    let mut args = vec!["--mode", "writeback", "--block-size", "64k"];
    args.extend(QUIET_CLEANER);
    let mut s = Served::start(bin(), dir.path(), &args);
    // Write 4 MiB (stays dirty in the cache), read it once, stop cleanly.
    run(Command::new("nbdcopy").arg(&src).arg(s.uri()));
    let st = s.stats();
    assert_eq!(st["decisions"]["dirty"], 64, "{st}");
    s.stop();
    // The backing device does not have the data yet: it lives in the cache.
    assert!(std::fs::read(dir.path().join("backing.img")).unwrap()[..data.len()] != data[..]);
    s.restart();
    let out = dir.path().join("out.img");
    run(Command::new("nbdcopy").arg(s.uri()).arg(&out));
    assert!(std::fs::read(&out).unwrap()[..data.len()] == data[..]);
    let st = s.stats();
    assert!(
        st["decisions"]["read_hits"].as_u64().unwrap() >= 64,
        "served from the cache at once: {st}"
    );
    assert!(s.log().contains("64 dirty"), "{}", s.log());
    s.stop();
    // Another backing device of another size is refused, clearly.
    let other = dir.path().join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    let out = tiercache()
        .args(["serve", "--backing"])
        .arg(&other)
        .arg("--cache")
        .arg(dir.path().join("cache.img"))
        .arg("--socket")
        .arg(dir.path().join("x.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to backing device"), "{err}");
    // check reads the metadata and finds it consistent.
    let out = run(tiercache()
        .arg("check")
        .arg("--cache")
        .arg(dir.path().join("cache.img")));
    // (the cleaner may have written some back, and the copy-out promoted
    // more: at least the 64 written blocks are mapped)
    let mapped: u64 = out
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(mapped >= 64 && out.contains("no problems found"), "{out}");
}

#[test]
fn sigterm_stops_cleanly_after_the_socket_file_was_removed() {
    // A cleaned /tmp removes the NBD socket file while the server runs:
    // stopping must not depend on it (it used to wait forever for an
    // accept loop woken by connecting to that path).
    let dir = tempfile::tempdir().unwrap();
    devices(dir.path(), 32 * MIB, 8 * MIB);
    let mut s = Served::start(
        bin(),
        dir.path(),
        &["--mode", "writeback", "--block-size", "64k"],
    );
    std::fs::remove_file(s.socket()).unwrap();
    s.signal(libc::SIGTERM);
    let st = s.wait_exit(Duration::from_secs(30));
    let log = s.log();
    assert!(st.success(), "serve exited with {st}: {log}");
    assert!(
        log.contains("stopping: finishing in-flight requests"),
        "{log}"
    );
    assert!(log.contains("tiercache: stopped"), "{log}");
    // The engine shut down cleanly: the next start says so.
    s.restart();
    assert!(s.log().contains("after a clean shutdown"), "{}", s.log());
    s.stop();
}
