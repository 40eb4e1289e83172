//! Interoperability with real NBD clients: nbdinfo, nbdsh, nbdcopy, fio,
//! qemu-img, nbdfuse. Each test skips (with a printed reason) only when its
//! tool is missing.

mod common;

use common::*;
use std::process::Command;
use std::sync::Arc;
use tiercache_nbd::{BlockSizes, Export, MemExport, ServerConfig};

const MIB: u64 = 1 << 20;

#[test]
fn nbdinfo_reports_size_block_sizes_and_flags() {
    if !have("nbdinfo", "nbdinfo_reports_size_block_sizes_and_flags") {
        return;
    }
    let ex = MemExport::new(48 * MIB).with_block_sizes(BlockSizes {
        min: 512,
        preferred: 4096,
        max: 8 * MIB as u32,
    });
    let srv = start(Arc::new(ex), ServerConfig::default());
    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri()));
    let v: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo --json output");
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 48 * MIB, "{out}");
    assert_eq!(e["block_size_minimum"], 512, "{out}");
    assert_eq!(e["block_size_preferred"], 4096, "{out}");
    assert_eq!(e["block_size_maximum"], 8 * MIB, "{out}");
    assert_eq!(e["is_read_only"], false, "{out}");
    assert_eq!(e["can_flush"], true, "{out}");
    assert_eq!(e["can_fua"], true, "{out}");
    assert_eq!(e["can_trim"], true, "{out}");
    assert_eq!(e["can_zero"], true, "{out}");
    assert_eq!(e["can_multi_conn"], true, "{out}");
    assert_eq!(v["protocol"], "newstyle-fixed", "{out}");
    assert_eq!(v["TLS"], false, "{out}");

    // Read-only export without multi-conn.
    let ro = MemExport::new(MIB)
        .with_read_only(true)
        .with_multi_conn(false);
    let srv = start(Arc::new(ro), ServerConfig::default());
    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri()));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["is_read_only"], true, "{out}");
    assert_eq!(e["can_multi_conn"], false, "{out}");
    assert_eq!(e["can_trim"], false, "{out}");

    // --list goes through NBD_OPT_LIST then NBD_OPT_INFO per export.
    let out = run(Command::new("nbdinfo")
        .arg("--list")
        .arg("--json")
        .arg(srv.uri()));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["exports"].as_array().unwrap().len(), 1, "{out}");
}

/// nbdsh needs the distribution's python3 (with the nbd module) first in
/// PATH.
fn nbdsh() -> Command {
    let mut c = Command::new("nbdsh");
    let path = std::env::var("PATH").unwrap_or_default();
    c.env("PATH", format!("/usr/bin:{path}"));
    c
}

fn have_nbdsh(test: &str) -> bool {
    if !have("nbdsh", test) {
        return false;
    }
    let ok = nbdsh()
        .args(["-c", "pass"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        tiercache_testkit::skip(
            test,
            "nbdsh cannot import the nbd module (install python3-libnbd)",
        );
    }
    ok
}

#[test]
fn nbdsh_error_paths() {
    if !have_nbdsh("nbdsh_error_paths") {
        return;
    }
    let srv = start(Arc::new(MemExport::new(MIB)), ServerConfig::default());
    // libnbd checks bounds itself unless strict mode is relaxed; turn off
    // its client-side checks so the server's answers are what we see.
    let script = r#"
import errno
h.set_strict_mode(0)
h.connect_uri(URI)
assert h.get_size() == 1048576
assert h.can_multi_conn()
def expect(errnum, f, *a):
    try:
        f(*a)
    except nbd.Error as e:
        assert e.errnum == errnum, (f.__name__, e.errnum, e.string)
        return
    raise AssertionError("%s did not fail" % f.__name__)
expect(errno.EINVAL, h.pread, 4096, 1048576 - 512)
expect(errno.ENOSPC, h.pwrite, b"x" * 4096, 1048576 - 512)
expect(errno.ENOSPC, h.zero, 8192, 1048576 - 4096)
expect(errno.EINVAL, h.trim, 4096, 1048576)
expect(errno.EINVAL, h.pread, 64 * 1024 * 1024, 0)
h.pwrite(b"hello" * 100, 1000, nbd.CMD_FLAG_FUA)
assert h.pread(500, 1000) == b"hello" * 100
h.zero(4096, 0, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096, 0) == bytes(4096)
h.flush()
h.trim(65536, 65536)
h.shutdown()
print("ok")
"#
    .replace("URI", &format!("{:?}", srv.uri()));
    let out = run(nbdsh().args(["-c", &script]));
    assert_eq!(out.trim(), "ok");
}

#[test]
fn fio_randrw_verify_with_disjoint_writers_and_overlapping_readers() {
    if !have(
        "fio",
        "fio_randrw_verify_with_disjoint_writers_and_overlapping_readers",
    ) {
        return;
    }
    let srv = start(Arc::new(MemExport::new(64 * MIB)), ServerConfig::default());
    let uri = srv.uri();
    // Four writers on disjoint 8 MiB ranges verify their own data with
    // crc32c; two readers sweep the whole device concurrently.
    // fio writes verify state files into its working directory.
    let out = run(Command::new("fio").current_dir(srv.dir.path()).args([
        "--output-format=json",
        "--name=global",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--bs=4k",
        "--iodepth=8",
        "--group_reporting=0",
        "--name=writers",
        "--rw=randrw",
        "--numjobs=4",
        "--size=8m",
        "--offset_increment=8m",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--do_verify=1",
        "--name=readers",
        "--rw=randread",
        "--numjobs=2",
        "--offset=0",
        "--size=64m",
        "--io_size=16m",
    ]));
    // fio may print notes before the JSON document.
    let json = &out[out.find('{').expect("fio printed no JSON")..];
    let v: serde_json::Value = serde_json::from_str(json).expect("fio json");
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 6);
    for j in jobs {
        assert_eq!(j["error"], 0, "{}: {out}", j["jobname"]);
        assert!(j["read"]["io_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn qemu_img_convert_and_compare_round_trip() {
    if !have("qemu-img", "qemu_img_convert_and_compare_round_trip") {
        return;
    }
    let srv = start(Arc::new(MemExport::new(32 * MIB)), ServerConfig::default());
    let src = srv.dir.path().join("src.raw");
    let back = srv.dir.path().join("back.raw");
    // A source with data, holes and zero runs.
    let mut img = vec![0u8; 32 * MIB as usize];
    for (i, chunk) in img.chunks_mut(MIB as usize).enumerate() {
        if i % 3 != 1 {
            chunk[..300_000].copy_from_slice(&pattern(i as u64, 300_000));
        }
    }
    std::fs::write(&src, &img).unwrap();
    let uri = srv.uri();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri));
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&back));
    assert!(std::fs::read(&back).unwrap() == img, "round trip differs");
    // A changed byte must be noticed by compare (the test can fail).
    img[5 * MIB as usize + 7] ^= 0xff;
    std::fs::write(&src, &img).unwrap();
    let out = Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "compare must report a difference"
    );
}

#[test]
fn nbdcopy_multi_conn_round_trip() {
    if !have("nbdcopy", "nbdcopy_multi_conn_round_trip") {
        return;
    }
    let ex = Arc::new(MemExport::new(16 * MIB));
    let srv = start(ex.clone(), ServerConfig::default());
    let src = srv.dir.path().join("in.raw");
    let data = pattern(42, 16 * MIB as usize);
    std::fs::write(&src, &data).unwrap();
    // nbdcopy opens several connections when the server allows multi-conn.
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--requests=16", "--flush"])
        .arg(&src)
        .arg(srv.uri()));
    assert!(ex.flush_count() >= 1);
    let mut back = vec![0u8; data.len()];
    ex.read(0, &mut back).unwrap();
    assert!(back == data, "nbdcopy data differs");
    let out = srv.dir.path().join("out.raw");
    run(Command::new("nbdcopy")
        .args(["--connections=4"])
        .arg(srv.uri())
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == data);
}

/// Runs `args` until it succeeds (up to ~5 s: on a shared machine a
/// mount can be briefly busy, e.g. while something probes the device).
fn retry(args: &[&std::ffi::OsStr]) -> bool {
    for _ in 0..50 {
        let ok = Command::new(args[0])
            .args(&args[1..])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// Undoes the mounts of the nbdfuse test even if it fails half-way, falling
/// back to lazy unmounts, and never waits unboundedly for nbdfuse.
struct FsCleanup {
    fs_mount: Option<std::path::PathBuf>,
    loop_dev: Option<String>,
    fuse_mount: Option<std::path::PathBuf>,
    child: Option<std::process::Child>,
}

impl Drop for FsCleanup {
    fn drop(&mut self) {
        if let Some(m) = self.fs_mount.take() {
            if !retry(&[os("umount"), m.as_os_str()]) {
                let _ = Command::new("umount").arg("-l").arg(&m).status();
            }
        }
        if let Some(l) = self.loop_dev.take() {
            retry(&[os("losetup"), os("-d"), os(&l)]);
        }
        if let Some(m) = self.fuse_mount.take() {
            if !retry(&[os("fusermount3"), os("-u"), m.as_os_str()]) {
                let _ = Command::new("fusermount3").arg("-uz").arg(&m).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            for _ in 0..100 {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn nbdfuse_losetup_mkfs_ext4_round_trip() {
    let t = "nbdfuse_losetup_mkfs_ext4_round_trip";
    for tool in ["nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fusermount3"] {
        if !have(tool, t) {
            return;
        }
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        tiercache_testkit::skip(t, "/dev/fuse is missing");
        return;
    }
    let ex = Arc::new(MemExport::new(64 * MIB));
    let srv = start(ex.clone(), ServerConfig::default());
    let mnt = srv.dir.path().join("mnt");
    let fs = srv.dir.path().join("fs");
    let pidfile = srv.dir.path().join("nbdfuse.pid");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&fs).unwrap();
    let mut guard = FsCleanup {
        fs_mount: None,
        loop_dev: None,
        fuse_mount: None,
        child: None,
    };
    let mut child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&mnt)
        .arg(srv.uri())
        .spawn()
        .unwrap();
    // nbdfuse writes its pidfile once the FUSE mount is ready.
    while !pidfile.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            tiercache_testkit::skip(
                t,
                &format!("nbdfuse exited with {st} (FUSE unavailable here?)"),
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    guard.child = Some(child);
    guard.fuse_mount = Some(mnt.clone());
    let image = mnt.join("nbd");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 * MIB);

    let out = Command::new("losetup")
        .arg("-f")
        .arg("--show")
        .arg(&image)
        .output()
        .unwrap();
    if !out.status.success() {
        tiercache_testkit::skip(
            t,
            &format!(
                "losetup failed (no loop devices or privileges?): {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        );
        return;
    }
    let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    guard.loop_dev = Some(dev.clone());
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    let st = Command::new("mount").arg(&dev).arg(&fs).output().unwrap();
    if !st.status.success() {
        tiercache_testkit::skip(
            t,
            &format!("mount failed: {}", String::from_utf8_lossy(&st.stderr)),
        );
        return;
    }
    guard.fs_mount = Some(fs.clone());
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("f{i}"),
                pattern(100 + i, 1_000_000 + 4321 * i as usize),
            )
        })
        .collect();
    for (name, data) in &files {
        std::fs::write(fs.join(name), data).unwrap();
    }
    assert!(retry(&[os("umount"), fs.as_os_str()]), "umount failed");
    guard.fs_mount = None;
    run(Command::new("e2fsck").args(["-fn", &dev]));
    // Mount again and read everything back.
    run(Command::new("mount").args(["-o", "ro"]).arg(&dev).arg(&fs));
    guard.fs_mount = Some(fs.clone());
    for (name, data) in &files {
        assert!(
            std::fs::read(fs.join(name)).unwrap() == *data,
            "{name} differs"
        );
    }
    drop(guard);
    // The data really lives in the export: ext4's superblock magic 0xEF53
    // at byte 1024 + 0x38.
    let mut sb = [0u8; 2];
    ex.read(1024 + 0x38, &mut sb).unwrap();
    assert_eq!(sb, [0x53, 0xef]);
}

#[test]
fn qemu_io_write_zero_discard_flush_and_verify() {
    if !have("qemu-io", "qemu_io_write_zero_discard_flush_and_verify") {
        return;
    }
    let ex = Arc::new(MemExport::new(16 * MIB));
    let srv = start(ex.clone(), ServerConfig::default());
    let qemu_io = |cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]).arg(srv.uri());
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        run(&mut c)
    };
    // qemu's NBD client: structured replies, FUA writes, write-zeroes,
    // discard (trim), flush.
    let out = qemu_io(&[
        "write -P 0xab 0 1M",
        "write -f -P 0xcd 1M 64k",
        "write -z 4k 4k",
        "write -z -u 64k 64k",
        "discard 512k 128k",
        "flush",
        "read -P 0xab 0 4k",
        "read -P 0 4k 4k",
        "read -P 0 64k 64k",
        "read -P 0xab 8k 56k",
        "read -P 0xcd 1M 64k",
    ]);
    assert!(!out.contains("fail") && !out.contains("error"), "{out}");
    assert_eq!(out.matches("read ").count(), 5, "{out}");
    let mut b = [0u8; 1];
    ex.read(MIB + 100, &mut b).unwrap();
    assert_eq!(b, [0xcd]);
    // A wrong pattern is detected (the checks above can fail).
    let out = Command::new("qemu-io")
        .args(["-f", "raw"])
        .arg(srv.uri())
        .args(["-c", "read -P 0xee 0 4k"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Pattern verification failed"));
}
