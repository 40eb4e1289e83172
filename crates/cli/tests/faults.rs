//! Faults around the real binary: a backing device that runs out of space,
//! cache files damaged or replaced while stopped, the daemon killed in the
//! middle of a detach or a mode switch. Clients are libnbd's `nbdsh`.
//! Tests that need root (loop mounts) or a tool skip with a printed reason.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Python for nbdsh: block `k` (of `bs` bytes) of generation `g`.
const PY_BLOCK: &str =
    "def blk(k, g, bs=4096):\n    return bytes([(k * 31 + g * 7 + 1) % 256]) * bs\n";

/// A small ext4 filesystem on a loop device, unmounted on drop.
struct SmallFs {
    mnt: PathBuf,
}

impl SmallFs {
    fn mount(dir: &Path, mib: u64, test: &str) -> Option<SmallFs> {
        if !have("mkfs.ext4", test) || !have("mount", test) {
            return None;
        }
        let img = dir.join("fs.img");
        sparse_file(&img, mib * MIB);
        run(Command::new("mkfs.ext4").arg("-q").arg("-F").arg(&img));
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let out = output(
            Command::new("mount")
                .arg("-o")
                .arg("loop")
                .arg(&img)
                .arg(&mnt),
        );
        if !out.status.success() {
            skip(
                test,
                &format!(
                    "cannot loop-mount ({})",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return None;
        }
        Some(SmallFs { mnt })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// Sparse `backing.img` and `cache.img` in `d` (sizes in MiB): their paths,
/// and the same as strings.
fn sparse_devices(
    d: &Path,
    backing_mib: u64,
    cache_mib: u64,
) -> (PathBuf, PathBuf, String, String) {
    let (backing, cache) = (d.join("backing.img"), d.join("cache.img"));
    sparse_file(&backing, backing_mib * MIB);
    sparse_file(&cache, cache_mib * MIB);
    let (b, c) = (backing.display().to_string(), cache.display().to_string());
    (backing, cache, b, c)
}

/// A writeback server, created with `--create` on sparse devices of
/// `backing_mib` and `cache_mib` MiB in a new temporary directory, for a
/// test `t` that talks to it with nbdsh. `None` when nbdsh is missing (the
/// test is then skipped, or failed under `make test`).
fn writeback_server(t: &str, backing_mib: u64, cache_mib: u64) -> Option<WritebackServer> {
    if !have("nbdsh", t) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, cache, b, c) = sparse_devices(dir.path(), backing_mib, cache_mib);
    let s = Served::spawn(
        bin(),
        dir.path(),
        &b,
        &c,
        &["--create", "--mode", "writeback"],
    );
    Some(WritebackServer {
        dir,
        cache,
        b,
        c,
        s,
    })
}

/// What [`writeback_server`] made: the directory, the cache file, the
/// backing and cache paths as given to `serve`, and the server (last, so
/// that it is dropped, and killed, before the directory goes).
struct WritebackServer {
    dir: tempfile::TempDir,
    cache: PathBuf,
    b: String,
    c: String,
    s: Served,
}

/// Runs a Python check in nbdsh that prints `verified` at its end; panics
/// with its error output otherwise.
fn assert_verified(s: &Served, code: &str, what: &str) {
    let out = s.nbdsh(code);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verified"),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sha(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut all = Vec::new();
    f.read_to_end(&mut all).unwrap();
    // crc32c per MiB is enough to notice any change.
    all.chunks(MIB as usize)
        .flat_map(|c| crc32c::crc32c(c).to_le_bytes())
        .collect()
}

/// [`sha`] of the cache file of `s` once the server has cleaned every
/// dirty block and the file has stopped changing (the same over 1 s).
fn settled_sha(s: &Served, cache: &Path) -> Vec<u8> {
    let start = std::time::Instant::now();
    while s.stats()["decisions"]["dirty"].as_u64() != Some(0) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never clean: {}",
            s.stats()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut last = sha(cache);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = sha(cache);
        if now == last {
            return now;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cache file never settled"
        );
        last = now;
    }
}

fn check_cache(cache: &str) -> (bool, String) {
    let out = output(
        tiercache()
            .arg("check")
            .arg("--verify")
            .arg("--cache")
            .arg(cache),
    );
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_full_backing_disk_is_an_error_for_the_client_and_nothing_else_breaks() {
    let t = "a_full_backing_disk_is_an_error_for_the_client_and_nothing_else_breaks";
    if !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(dir.path(), 24, t) else {
        return;
    };
    // A 64 MiB sparse backing file on a 24 MiB filesystem.
    let backing = fs.mnt.join("backing.img");
    sparse_file(&backing, 64 * MIB);
    let cache = dir.path().join("cache.img");
    sparse_file(&cache, 32 * MIB);
    let (b, c) = (backing.display().to_string(), cache.display().to_string());
    let mut s = Served::spawn(
        bin(),
        dir.path(),
        &b,
        &c,
        &["--create", "--block-size", "4k"],
    );
    // Write 64 KiB blocks until the device says no.
    let out = s.nbdsh(&format!(
        "{PY_BLOCK}
ok = 0\n
err = None\n
for k in range(1024):\n
    try:\n
        h.pwrite(blk(k, 1, 65536), k * 65536)\n
        ok += 1\n
    except nbd.Error as e:\n
        err = e\n
        break\n
h.flush() if err is None else None\n
print('written', ok, 'error', err.errno if err else None, err)\n"
    ));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(written < 1024, "the 24 MiB filesystem took 64 MiB: {text}");
    assert!(
        text.contains("ENOSPC") || text.contains("No space"),
        "{text}"
    );
    // The server lives on, counts the error and still serves what was
    // acknowledged.
    assert!(s.is_running(), "{}", s.log());
    let st = s.stats();
    assert!(st["backing_write_errors"].as_u64().unwrap() > 0, "{st}");
    let verify = format!(
        "{PY_BLOCK}
for k in range({written}):\n
    assert h.pread(65536, k * 65536) == blk(k, 1, 65536), k\n
print('verified')\n"
    );
    assert_verified(&s, &verify, "read back");
    // A crash now leaves consistent metadata, and a restart serves the
    // same data.
    s.kill();
    let (ok, report) = check_cache(&c);
    assert!(ok, "check after the crash: {report}");
    assert!(report.contains("clean with a crc"), "{report}");
    s.args = vec!["--block-size".into(), "4k".into()];
    s.restart();
    assert_verified(&s, &verify, "read back");
    s.kill();
    drop(fs);
}

#[test]
fn a_cache_file_damaged_or_replaced_while_stopped_is_refused_and_left_alone() {
    let t = "a_cache_file_damaged_or_replaced_while_stopped_is_refused_and_left_alone";
    let Some(WritebackServer {
        dir,
        cache,
        b,
        c,
        mut s,
    }) = writeback_server(t, 32, 16)
    else {
        return;
    };
    let d = dir.path();
    let out = s.nbdsh(&format!(
        "{PY_BLOCK}
for k in range(64):\n
    h.pwrite(blk(k, 2), k * 4096)\n
h.flush()\n"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.kill(); // dirty data stays in the cache file
    s.args = vec![];
    let good = std::fs::read(&cache).unwrap();

    // 1. Truncated to half.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&cache)
        .unwrap();
    f.set_len(8 * MIB).unwrap();
    drop(f);
    let before = sha(&cache);
    let msg = s.expect_refusal();
    assert!(msg.to_lowercase().contains("cache"), "{msg}");
    assert_eq!(sha(&cache), before, "truncated cache file was modified");

    // 2. Replaced by a cache formatted for another backing device.
    let other = d.join("other-backing.img");
    sparse_file(&other, 48 * MIB);
    sparse_file(&cache, 16 * MIB);
    std::fs::write(&cache, vec![0u8; 16 * MIB as usize]).unwrap();
    run(tiercache()
        .arg("create")
        .arg("--backing")
        .arg(&other)
        .arg("--cache")
        .arg(&cache));
    let before = sha(&cache);
    let msg = s.expect_refusal();
    assert!(msg.contains("backing"), "{msg}");
    assert_eq!(sha(&cache), before, "other cache was modified");

    // 3. Replaced by unrelated data; `--create` must not format over it.
    std::fs::write(&cache, pattern(9, 16 * MIB as usize)).unwrap();
    let before = sha(&cache);
    let msg = s.expect_refusal();
    assert!(msg.contains("not a tiercache cache"), "{msg}");
    assert_eq!(sha(&cache), before, "unrelated data was modified");
    s.args.push("--create".into());
    let msg = s.expect_refusal();
    assert!(msg.contains("not blank"), "{msg}");
    assert_eq!(sha(&cache), before, "--create formatted over data");
    let out = output(
        tiercache()
            .arg("create")
            .arg("--backing")
            .arg(&b)
            .arg("--cache")
            .arg(&c),
    );
    assert!(!out.status.success());
    assert_eq!(sha(&cache), before, "create formatted over data");

    // The original file still works, dirty data included.
    std::fs::write(&cache, good).unwrap();
    s.args = vec![];
    s.restart();
    assert_verified(
        &s,
        &format!(
            "{PY_BLOCK}
for k in range(64):\n
    assert h.pread(4096, k * 4096) == blk(k, 2), k\n
print('verified')\n"
        ),
        "read back",
    );
}

#[test]
fn killed_during_a_detach_the_dirty_data_survives_and_the_detach_completes_later() {
    let t = "killed_during_a_detach_the_dirty_data_survives_and_the_detach_completes_later";
    if !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (backing, cache) = (d.join("backing.img"), d.join("cache.img"));
    sparse_file(&backing, 256 * MIB);
    sparse_file(&cache, 64 * MIB);
    let b = format!("hdd:{}", backing.display());
    let c = cache.display().to_string();
    let args = ["--create", "--mode", "writeback", "--block-size", "4k"];
    let mut s = Served::spawn(bin(), d, &b, &c, &args);
    // 3000 scattered dirty blocks: the emulated HDD needs seconds to take
    // them back.
    let blocks = 3000;
    let write = format!(
        "{PY_BLOCK}
import random\n
r = random.Random(5)\n
ks = r.sample(range(65536), {blocks})\n
for k in ks:\n
    h.pwrite(blk(k, 3), k * 4096)\n
h.flush()\n
open('{}', 'w').write(' '.join(map(str, ks)))\n",
        d.join("blocks.txt").display()
    );
    let out = s.nbdsh(&write);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dirty = s.stats()["decisions"]["dirty"].as_u64().unwrap_or(0);
    assert!(dirty > 1000, "{}", s.stats());
    let mut detach = tiercache()
        .arg("detach")
        .arg("--control")
        .arg(s.control())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    s.kill();
    let _ = detach.wait();
    let (ok, report) = check_cache(&c);
    assert!(ok, "check after a kill mid-detach: {report}");
    // Restart: not detached, dirty blocks back, data intact.
    s.args = vec![];
    s.restart();
    let left = s.stats()["decisions"]["dirty"].as_u64().unwrap();
    assert!(left > 0 && left <= dirty, "dirty {dirty} -> {left}");
    let verify = format!(
        "{PY_BLOCK}
ks = map(int, open('{}').read().split())\n
for k in ks:\n
    assert h.pread(4096, k * 4096) == blk(k, 3), k\n
print('verified')\n",
        d.join("blocks.txt").display()
    );
    assert_verified(&s, &verify, "read back");
    // The detach now completes, and the backing file alone holds the data.
    run(tiercache().arg("detach").arg("--control").arg(s.control()));
    let st = s.wait_exit(Duration::from_secs(60));
    assert!(st.success(), "{}", s.log());
    let raw = std::fs::read(&backing).unwrap();
    let ks: Vec<u64> = std::fs::read_to_string(d.join("blocks.txt"))
        .unwrap()
        .split_whitespace()
        .map(|k| k.parse().unwrap())
        .collect();
    for k in ks {
        let want = ((k * 31 + 3 * 7 + 1) % 256) as u8;
        let got = &raw[(k * 4096) as usize..((k + 1) * 4096) as usize];
        assert!(
            got.iter().all(|&x| x == want),
            "block {k} on the backing file"
        );
    }
}

#[test]
fn killed_during_mode_switches_it_restarts_in_one_of_the_modes_with_data_intact() {
    let t = "killed_during_mode_switches_it_restarts_in_one_of_the_modes_with_data_intact";
    let Some(WritebackServer {
        dir: _dir,
        c,
        mut s,
        ..
    }) = writeback_server(t, 64, 16)
    else {
        return;
    };
    s.args = vec![];
    for round in 0..4u64 {
        let out = s.nbdsh(&format!(
            "{PY_BLOCK}
for k in range(256):\n
    h.pwrite(blk(k, {round}), k * 4096)\n
h.flush()\n"
        ));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let modes = ["writethrough", "writeback", "writearound", "passthrough"];
        let mut switch = tiercache()
            .arg("set-mode")
            .arg(modes[round as usize % 4])
            .arg("--control")
            .arg(s.control())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(5 * round));
        s.kill();
        let _ = switch.wait();
        let (ok, report) = check_cache(&c);
        assert!(ok, "round {round}: {report}");
        s.restart();
        let mode = s.stats()["mode"].as_str().unwrap().to_string();
        assert!(
            mode == modes[round as usize % 4] || mode == "writeback" || round > 0,
            "round {round}: restarted in {mode}"
        );
        assert_verified(
            &s,
            &format!(
                "{PY_BLOCK}
for k in range(256):\n
    assert h.pread(4096, k * 4096) == blk(k, {round}), k\n
print('verified')\n"
            ),
            "read back",
        );
        // Back to writeback for the next round.
        run(tiercache()
            .arg("set-mode")
            .arg("writeback")
            .arg("--control")
            .arg(s.control()));
    }
}

#[test]
fn a_second_server_on_a_served_cache_or_backing_device_is_refused() {
    let t = "a_second_server_on_a_served_cache_or_backing_device_is_refused";
    let Some(WritebackServer {
        dir,
        cache,
        b,
        c,
        mut s,
    }) = writeback_server(t, 32, 16)
    else {
        return;
    };
    let d = dir.path();
    let pid = s.pid().unwrap();
    assert_verified(
        &s,
        &format!("{PY_BLOCK}h.pwrite(blk(1, 1), 4096)\nh.flush()\nprint('verified')\n"),
        "first write",
    );
    // The server cleans the block once idle, and writes its metadata: what
    // the refused servers must leave alone is the cache after that.
    let before = settled_sha(&s, &cache);

    // The same cache again, from another directory (its own sockets).
    let d2 = d.join("second");
    std::fs::create_dir_all(&d2).unwrap();
    let other_backing = d2.join("other-backing.img");
    sparse_file(&other_backing, 32 * MIB);
    let again = Served::unstarted(bin(), &d2, &other_backing.display().to_string(), &c, &[]);
    let msg = again.expect_refusal();
    assert!(msg.contains(&format!("in use by process {pid}")), "{msg}");
    assert!(msg.contains(&c), "{msg}");
    // The same backing device behind another cache.
    let other_cache = d2.join("other-cache.img");
    sparse_file(&other_cache, 16 * MIB);
    let other = Served::unstarted(
        bin(),
        &d2,
        &b,
        &other_cache.display().to_string(),
        &["--create"],
    );
    let msg = other.expect_refusal();
    assert!(msg.contains(&format!("in use by process {pid}")), "{msg}");
    assert!(msg.contains(&b), "{msg}");
    // Offline commands that write the cache are refused as well.
    let out = output(
        tiercache()
            .arg("check")
            .arg("--repair")
            .arg("--cache")
            .arg(&c),
    );
    assert!(
        !out.status.success(),
        "check --repair ran on a served cache"
    );

    // The first server never noticed: it still serves, and the cache file
    // is as it was.
    assert!(s.is_running());
    assert_eq!(sha(&cache), before, "a refused server wrote the cache");
    assert_verified(
        &s,
        &format!("{PY_BLOCK}assert h.pread(4096, 4096) == blk(1, 1)\nprint('verified')\n"),
        "read back",
    );
    s.stop();
    // Once it has stopped, the cache is free again.
    s.restart();
    s.stop();
}

#[test]
fn one_file_given_as_backing_and_cache_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    sparse_file(&img, 32 * MIB);
    let p = img.display().to_string();
    for cmd in ["create", "serve"] {
        let mut c = tiercache();
        c.arg(cmd)
            .arg("--backing")
            .arg(&p)
            .arg("--cache")
            .arg(format!("file:{p}"));
        if cmd == "serve" {
            c.arg("--create")
                .arg("--socket")
                .arg(dir.path().join("s.sock"));
        }
        let out = output(&mut c);
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} accepted one file twice");
        assert!(msg.contains("are the same file"), "{cmd}: {msg}");
    }
    let data = std::fs::read(&img).unwrap();
    assert!(data.iter().all(|&b| b == 0), "the file was written");
}

#[test]
fn killed_again_and_again_while_recovering_the_next_start_recovers_everything() {
    let t = "killed_again_and_again_while_recovering_the_next_start_recovers_everything";
    if !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, _, b, c) = sparse_devices(d, 64, 32);
    let args = ["--create", "--mode", "writeback", "--block-size", "4k"];
    let mut s = Served::spawn(bin(), d, &b, &c, &args);
    // 1500 dirty blocks, and 1500 clean cached ones (reads of untouched
    // blocks promote them).
    assert_verified(
        &s,
        &format!(
            "{PY_BLOCK}
for k in range(1500):\n
    h.pwrite(blk(k, 4), k * 4096)\n
h.flush()\n
for k in range(2000, 3500):\n
    h.pread(4096, k * 4096)\n
print('verified')\n"
        ),
        "writes",
    );
    s.kill();
    s.args = vec![];
    // Killed at moments through opening and recovery, and once serving.
    for ms in [0, 3, 8, 15, 25, 40, 70, 120, 250] {
        s.start_and_kill_after(Duration::from_millis(ms));
    }
    s.restart();
    // The mode is the cache's own (the log once printed the default).
    let log = s.log();
    assert!(log.contains("after an unclean shutdown"), "{log}");
    assert!(log.contains("mode writeback"), "{log}");
    assert_verified(
        &s,
        &format!(
            "{PY_BLOCK}
for k in range(1500):\n
    assert h.pread(4096, k * 4096) == blk(k, 4), k\n
for k in range(2000, 3500):\n
    assert h.pread(4096, k * 4096) == bytes(4096), k\n
print('verified')\n"
        ),
        "read back",
    );
    s.stop();
    let (ok, report) = check_cache(&c);
    assert!(ok, "{report}");
}
