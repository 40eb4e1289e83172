//! `tiercache serve --volume NAME=BACKING ...`: one cache device for a pool
//! of volumes, each its own NBD export, through real clients (nbdinfo,
//! nbdcopy): every export returns its own volume's data, across a restart;
//! stats count each volume; a pool refuses to start without one of its
//! volumes, or with a volume given as `--backing` too; a pool of more
//! volumes than the soft limit on open files is served, and one beyond the
//! hard limit refused with a message.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Sparse `a.img`, `b.img` and `cache.img` in `dir`, of these MiB.
fn pool_files(dir: &std::path::Path, mib: [u64; 3]) -> (PathBuf, PathBuf, PathBuf) {
    let files = ["a.img", "b.img", "cache.img"].map(|f| dir.join(f));
    for (f, m) in files.iter().zip(mib) {
        sparse_file(f, m * MIB);
    }
    let [a, b, cache] = files;
    (a, b, cache)
}

fn export_uri(s: &Served, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", s.socket().display())
}

#[test]
fn each_volume_is_its_own_export_and_keeps_its_data_across_a_restart() {
    let t = "each_volume_is_its_own_export_and_keeps_its_data_across_a_restart";
    if !have("nbdcopy", t) || !have("nbdinfo", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b, cache) = pool_files(dir.path(), [16, 24, 32]);
    let va = format!("vm-a={}", a.display());
    let vb = format!("vm-b={}", b.display());
    // Writeback with the cleaner quiet: the data stays in the cache only.
    let mut args = vec![
        "--volume",
        &va,
        "--volume",
        &vb,
        "--create",
        "--mode",
        "writeback",
        "--block-size",
        "64k",
    ];
    args.extend(QUIET_CLEANER);
    let mut s = Served::spawn(bin(), dir.path(), "", &cache.display().to_string(), &args);
    let list = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix:///?socket={}", s.socket().display())));
    assert!(list.contains("vm-a") && list.contains("vm-b"), "{list}");
    let size = run(Command::new("nbdinfo")
        .arg("--size")
        .arg(export_uri(&s, "vm-b")));
    assert_eq!(size.trim(), (24 * MIB).to_string());

    // The same offsets, different data on each volume.
    let (da, db) = (
        pattern(1, (4 * MIB) as usize),
        pattern(2, (4 * MIB) as usize),
    );
    let (fa, fb) = (dir.path().join("da"), dir.path().join("db"));
    std::fs::write(&fa, &da).unwrap();
    std::fs::write(&fb, &db).unwrap();
    run(Command::new("nbdcopy").arg(&fa).arg(export_uri(&s, "vm-a")));
    run(Command::new("nbdcopy").arg(&fb).arg(export_uri(&s, "vm-b")));
    let st = s.stats();
    let vols = st["volumes"].as_array().expect("per-volume stats");
    let dirty = |name: &str| {
        vols.iter()
            .find(|v| v["name"] == name)
            .map(|v| v["stats"]["decisions"]["dirty"].as_u64().unwrap())
    };
    assert_eq!((dirty("vm-a"), dirty("vm-b")), (Some(64), Some(64)), "{st}");
    assert_eq!(st["decisions"]["dirty"], 128, "{st}");
    let prom = run(tiercache()
        .args(["stats", "--prometheus", "--control"])
        .arg(s.control()));
    assert!(
        prom.contains("tiercache_dirty_blocks{volume=\"vm-b\"} 64"),
        "{prom}"
    );
    s.stop();
    // Neither backing device has the data: it lives in the cache.
    assert!(std::fs::read(&a).unwrap()[..da.len()] != da[..]);

    s.restart();
    for (name, want) in [("vm-a", &da), ("vm-b", &db)] {
        let out = dir.path().join(format!("{name}.out"));
        run(Command::new("nbdcopy").arg(export_uri(&s, name)).arg(&out));
        assert!(
            std::fs::read(&out).unwrap()[..want.len()] == want[..],
            "{name} returned another volume's data or lost its own"
        );
    }

    // Online: attach vm-c, write to it, set its mode alone, detach it
    // (written back, export gone); vm-a serves on throughout.
    let c = dir.path().join("c.img");
    sparse_file(&c, 8 * MIB);
    let ctl = |args: &[&str]| {
        let mut cmd = tiercache();
        cmd.args(args).arg("--control").arg(s.control());
        run(&mut cmd)
    };
    let out = ctl(&["attach", &format!("vm-c={}", c.display())]);
    assert!(out.contains("volume vm-c attached"), "{out}");
    let dc = pattern(3, (2 * MIB) as usize);
    let fc = dir.path().join("dc");
    std::fs::write(&fc, &dc).unwrap();
    run(Command::new("nbdcopy").arg(&fc).arg(export_uri(&s, "vm-c")));
    let out = ctl(&["set-mode", "writethrough", "--volume", "vm-c"]);
    assert!(out.contains("vm-c: mode is now writethrough"), "{out}");
    assert!(
        !std::fs::read(&c).unwrap().starts_with(&dc[..65536]),
        "still dirty"
    );
    let out = ctl(&["detach-volume", "vm-c"]);
    assert!(out.contains("volume vm-c detached"), "{out}");
    assert!(std::fs::read(&c).unwrap().starts_with(&dc), "written back");
    let list = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix:///?socket={}", s.socket().display())));
    assert!(!list.contains("vm-c") && list.contains("vm-a"), "{list}");
    let out = dir.path().join("vm-a.again");
    run(Command::new("nbdcopy")
        .arg(export_uri(&s, "vm-a"))
        .arg(&out));
    assert!(std::fs::read(&out).unwrap()[..da.len()] == da[..]);
    s.stop();
    // vm-c left the pool: the pool starts without it.
    s.restart();
    s.stop();

    // Without vm-b, the pool is refused, naming it; so is a pool given a
    // --backing as well.
    let lone = Served::unstarted(
        bin(),
        dir.path(),
        "",
        &cache.display().to_string(),
        &["--volume", &va],
    );
    let err = lone.expect_refusal();
    assert!(
        err.contains("vm-b") && err.contains("--volume vm-b="),
        "{err}"
    );
    let both = Served::unstarted(
        bin(),
        dir.path(),
        &a.display().to_string(),
        &cache.display().to_string(),
        &["--volume", &vb],
    );
    let err = both.expect_refusal();
    assert!(err.contains("not both"), "{err}");
}

#[test]
fn kill_9_loses_no_acknowledged_write_of_any_volume() {
    let t = "kill_9_loses_no_acknowledged_write_of_any_volume";
    if !have("nbdcopy", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.img");
    sparse_file(&cache, 32 * MIB);
    let mut args: Vec<String> = Vec::new();
    for v in ["v1", "v2", "v3"] {
        let p = dir.path().join(format!("{v}.img"));
        sparse_file(&p, 8 * MIB);
        args.push("--volume".into());
        args.push(format!("{v}={}", p.display()));
    }
    let flags = ["--create", "--mode", "writeback", "--block-size", "64k"];
    for a in flags.iter().chain(QUIET_CLEANER.iter()) {
        args.push(a.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = Served::spawn(bin(), dir.path(), "", &cache.display().to_string(), &args);
    let mut written = Vec::new();
    for (k, v) in ["v1", "v2", "v3"].iter().enumerate() {
        let data = pattern(10 + k as u64, (3 * MIB) as usize);
        let f = dir.path().join(format!("{v}.src"));
        std::fs::write(&f, &data).unwrap();
        // v1 with --flush (acknowledged and flushed before nbdcopy
        // returns); v2 and v3 only acknowledged: the server is killed
        // before the cleaner's next commit, and must not forget them.
        let mut copy = Command::new("nbdcopy");
        if k == 0 {
            copy.arg("--flush");
        }
        run(copy.arg(&f).arg(export_uri(&s, v)));
        written.push((v.to_string(), data));
    }
    s.kill();
    s.restart();
    assert!(s.log().contains("an unclean shutdown"), "{}", s.log());
    for (v, data) in &written {
        let out = dir.path().join(format!("{v}.out"));
        run(Command::new("nbdcopy").arg(export_uri(&s, v)).arg(&out));
        assert!(
            std::fs::read(&out).unwrap()[..data.len()] == data[..],
            "{v} lost acknowledged writes or got another volume's"
        );
    }
    s.stop();
}

/// `share=` and `cap=` per volume: given at `serve`, shown by `stats`,
/// changed by `set-limits`; impossible limits and unknown options are
/// refused with a message, and the server keeps serving.
#[test]
fn shares_and_caps_are_set_shown_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, cache) = pool_files(dir.path(), [16, 16, 16]);
    let va = format!("vm-a={},share=1M,cap=4M", a.display());
    let vb = format!("vm-b={}", b.display());
    let args = [
        "--volume",
        &va,
        "--volume",
        &vb,
        "--create",
        "--block-size",
        "64k",
    ];
    let s = Served::spawn(bin(), dir.path(), "", &cache.display().to_string(), &args);
    let sharing = |s: &Served, name: &str| {
        let stats = s.stats();
        stats["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {stats}"))["sharing"]
            .clone()
    };
    let shown = sharing(&s, "vm-a");
    assert_eq!(shown["share_blocks"], 16, "{shown}");
    assert_eq!(shown["cap_blocks"], 64, "{shown}");
    assert_eq!(sharing(&s, "vm-b")["cap_blocks"], serde_json::Value::Null);

    let set_limits = |extra: &[&str]| {
        let out = tiercache()
            .args(["set-limits", "--control"])
            .arg(s.control())
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = set_limits(&["--volume", "vm-b", "--share", "2M", "--cap", "3M"]);
    assert!(ok, "{text}");
    assert_eq!(sharing(&s, "vm-b")["cap_blocks"], 48);
    // The shares would add up to more than the cache.
    let (ok, text) = set_limits(&["--volume", "vm-b", "--share", "15M"]);
    assert!(!ok && text.contains("add up to"), "{text}");
    let (ok, text) = set_limits(&["--volume", "vm-c", "--share", "1M"]);
    assert!(!ok && text.contains("no volume named"), "{text}");
    assert_eq!(
        sharing(&s, "vm-b")["share_blocks"],
        32,
        "unchanged after a refusal"
    );

    // An unknown option of --volume is refused before anything starts.
    let out = tiercache()
        .args(["serve", "--cache"])
        .arg(&cache)
        .arg("--volume")
        .arg(format!("vm-a={},shares=1M", a.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("unknown option"),
        "{err}"
    );
}

/// A backing device given for two volumes of the pool is refused before
/// anything is written, with a message that names the cause.
#[test]
fn the_same_backing_device_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, cache) = (dir.path().join("a.img"), dir.path().join("cache.img"));
    sparse_file(&a, 16 * MIB);
    sparse_file(&cache, 16 * MIB);
    let out = tiercache()
        .args(["serve", "--create", "--cache"])
        .arg(&cache)
        .arg("--volume")
        .arg(format!("vm-a={}", a.display()))
        .arg("--volume")
        .arg(format!("vm-b={}", a.display()))
        .arg("--socket")
        .arg(dir.path().join("nbd.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("opened twice"), "{err}");
    let cache_bytes = std::fs::read(&cache).unwrap();
    assert!(cache_bytes.iter().all(|&b| b == 0), "the cache was written");
}

/// `bash -c 'ulimit LIMIT; exec tiercache "$@"'` as a script in `dir`: the
/// server under a lower limit on open files than the test's own (run
/// through `output` or `Served`, which retry while a just-written script is
/// busy).
fn under_ulimit(dir: &std::path::Path, limit: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("tiercache-limited");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nulimit {limit} || exit 97\nexec {} \"$@\"\n",
            bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// `--volume vmI=DIR/vI.img` for I in 1..=n, each a sparse 1 MiB file; and
/// a 64 MiB cache file, large enough for 1024 volume records.
fn many_volumes(dir: &std::path::Path, n: usize) -> (Vec<String>, PathBuf) {
    let args = (1..=n)
        .flat_map(|i| {
            let f = dir.join(format!("v{i}.img"));
            sparse_file(&f, MIB);
            ["--volume".to_string(), format!("vm{i}={}", f.display())]
        })
        .collect();
    let cache = dir.join("cache.img");
    sparse_file(&cache, 64 * MIB);
    (args, cache)
}

/// A pool with more volumes than the usual soft limit on open files allows
/// (here 64 for 100 volumes) is served: the server raises its soft limit
/// to the hard one (before, it stopped at the 61st volume with "Too many
/// open files").
#[test]
fn a_pool_beyond_the_soft_open_files_limit_is_served() {
    let t = "a_pool_beyond_the_soft_open_files_limit_is_served";
    if !have("nbdinfo", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (volumes, cache) = many_volumes(dir.path(), 100);
    let mut args: Vec<&str> = volumes.iter().map(String::as_str).collect();
    args.push("--create");
    let limited = under_ulimit(dir.path(), "-Sn 64");
    let s = Served::spawn(
        &limited,
        dir.path(),
        "",
        &cache.display().to_string(),
        &args,
    );
    let list = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix:///?socket={}", s.socket().display())));
    let exports = list.lines().filter(|l| l.starts_with("export=")).count();
    assert_eq!(exports, 100, "{list}");
}

/// A pool that even the hard limit on open files cannot hold is refused
/// before anything is written, with a message that says how to proceed.
#[test]
fn a_pool_beyond_the_hard_open_files_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (volumes, cache) = many_volumes(dir.path(), 100);
    let out = output(
        Command::new(under_ulimit(dir.path(), "-n 64"))
            .args(["serve", "--create", "--cache"])
            .arg(&cache)
            .args(&volumes)
            .arg("--socket")
            .arg(dir.path().join("nbd.sock")),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("100 volumes need about") && err.contains("ulimit -n"),
        "{err}"
    );
    let cache_bytes = std::fs::read(&cache).unwrap();
    assert!(cache_bytes.iter().all(|&b| b == 0), "the cache was written");
}
