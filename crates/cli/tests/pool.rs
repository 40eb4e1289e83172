//! `tiercache serve --volume NAME=BACKING ...`: one cache device for a pool
//! of volumes, each its own NBD export, through real clients (nbdinfo,
//! nbdcopy): every export returns its own volume's data, across a restart;
//! stats count each volume; a pool refuses to start without one of its
//! volumes, or with a volume given as `--backing` too.

mod common;

use common::*;
use std::process::Command;

const MIB: u64 = 1 << 20;

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
    let (a, b, cache) = (
        dir.path().join("a.img"),
        dir.path().join("b.img"),
        dir.path().join("cache.img"),
    );
    sparse_file(&a, 16 * MIB);
    sparse_file(&b, 24 * MIB);
    sparse_file(&cache, 32 * MIB);
    let va = format!("vm-a={}", a.display());
    let vb = format!("vm-b={}", b.display());
    // Writeback with the cleaner quiet: the data stays in the cache only.
    let args = [
        "--volume",
        &va,
        "--volume",
        &vb,
        "--create",
        "--mode",
        "writeback",
        "--block-size",
        "64k",
        "--writeback-target",
        "1",
        "--writeback-idle-after",
        "3600",
    ];
    let mut s = Served::spawn(dir.path(), "", &cache.display().to_string(), &args);
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
    s.stop();

    // Without vm-b, the pool is refused, naming it; so is a pool given a
    // --backing as well.
    let lone = Served::unstarted(
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
        dir.path(),
        &a.display().to_string(),
        &cache.display().to_string(),
        &["--volume", &vb],
    );
    let err = both.expect_refusal();
    assert!(err.contains("not both"), "{err}");
}
