//! NBD clients that reconnect: `tiercache serve` killed with `kill -9` and
//! started again while a real client runs IO (docs/RESTART.md, NBD).
//! qemu's NBD client (`reconnect-delay`) waits and re-sends by itself;
//! a libnbd application reconnects and re-sends what failed. Either way no
//! request gets an error reply, the data reads back, and a flush after the
//! reconnect covers what was acknowledged before it (in writethrough, the
//! default mode: see docs/RESTART.md for writeback).

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

/// 64 KiB requests, at 64 KiB steps.
const CHUNK: u64 = 65536;
const CHUNKS: u64 = 80;

/// Python for nbdsh: chunk `i`'s content.
const PY_CHUNK: &str = "def chunk(i):\n    return bytes([i % 251 + 1]) * 65536\n";

fn serve(d: &std::path::Path) -> Served {
    sparse_file(&d.join("backing.img"), 64 * MIB);
    sparse_file(&d.join("cache.img"), 16 * MIB);
    Served::start(bin(), d, &["--block-size", "4k"])
}

/// Kills the server twice while the client runs, each time starting it
/// again `down` later.
fn kill_twice_during_io(s: &mut Served, down: Duration) {
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(900));
        s.kill();
        std::thread::sleep(down);
        s.restart();
    }
}

/// After the client's final flush: one more `kill -9` and start, then a
/// fresh client reads every chunk back.
fn assert_all_chunks_survive_a_kill(s: &mut Served) {
    s.kill();
    s.restart();
    let out = s.nbdsh(&format!(
        "{PY_CHUNK}
for i in range({CHUNKS}):\n
    assert h.pread(65536, i * 65536) == chunk(i), i\n
print('verified')\n"
    ));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verified"),
        "after the kill that followed the flush: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn qemu_nbd_client_with_reconnect_delay_sees_no_error_across_kill_9() {
    let t = "qemu_nbd_client_with_reconnect_delay_sees_no_error_across_kill_9";
    if !have("qemu-io", t) || !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path());
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},export=default,reconnect-delay=30,\
         open-timeout=30",
        s.socket().display()
    );
    let mut qemu = Command::new("qemu-io");
    qemu.arg("--image-opts").arg(&opts);
    // Writes 40 ms apart (about 3.5 s of IO), a flush, then every chunk
    // read back with its pattern checked.
    for i in 0..CHUNKS {
        qemu.arg("-c")
            .arg(format!("write -P {} {} 64k", i % 251 + 1, i * CHUNK))
            .arg("-c")
            .arg("sleep 40");
    }
    qemu.arg("-c").arg("flush");
    for i in 0..CHUNKS {
        qemu.arg("-c")
            .arg(format!("read -P {} {} 64k", i % 251 + 1, i * CHUNK));
    }
    let child = qemu
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_twice_during_io(&mut s, Duration::from_millis(300));
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(
        !text.contains("failed") && !text.contains("error"),
        "qemu-io saw an error: {text}"
    );
    assert_eq!(
        text.matches("wrote 65536/65536").count() as u64,
        CHUNKS,
        "{text}"
    );
    assert_eq!(
        text.matches("read 65536/65536").count() as u64,
        CHUNKS,
        "every pattern verified: {text}"
    );
    assert_all_chunks_survive_a_kill(&mut s);
}

#[test]
fn libnbd_client_reconnects_and_resends_across_kill_9() {
    let t = "libnbd_client_reconnects_and_resends_across_kill_9";
    if !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path());
    // A request that fails because the connection died (the handle is
    // dead, or closed: a server killed between two requests leaves libnbd
    // an orderly EOF, and the next request fails with ENOTCONN) is re-sent
    // on a new connection; any other failure (an error reply from the
    // server) fails the script.
    let script = format!(
        "import nbd, sys, time\n\
         {PY_CHUNK}\
         sock = sys.argv[1]\n\
         def connect():\n\
         \x20   t0 = time.monotonic()\n\
         \x20   while True:\n\
         \x20       try:\n\
         \x20           h = nbd.NBD(); h.connect_unix(sock); return h\n\
         \x20       except nbd.Error:\n\
         \x20           if time.monotonic() - t0 > 30: raise\n\
         \x20           time.sleep(0.01)\n\
         h = connect()\n\
         print('connected', flush=True)\n\
         reconnects = 0\n\
         def retry(f):\n\
         \x20   global h, reconnects\n\
         \x20   while True:\n\
         \x20       try:\n\
         \x20           return f(h)\n\
         \x20       except nbd.Error:\n\
         \x20           if not (h.aio_is_dead() or h.aio_is_closed()): raise\n\
         \x20           reconnects += 1\n\
         \x20           h = connect()\n\
         for i in range({CHUNKS}):\n\
         \x20   retry(lambda h: h.pwrite(chunk(i), i * 65536))\n\
         \x20   time.sleep(0.04)\n\
         retry(lambda h: h.flush())\n\
         for i in range({CHUNKS}):\n\
         \x20   assert retry(lambda h: h.pread(65536, i * 65536)) == chunk(i), i\n\
         print('reconnects', reconnects)\n\
         print('verified')\n"
    );
    let python = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let mut child = Command::new(python)
        .arg("-c")
        .arg(&script)
        .arg(s.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The kills start once the client is connected (however slowly it
    // started), so each one breaks a live connection.
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert_eq!(first, "connected");
    kill_twice_during_io(&mut s, Duration::from_millis(300));
    let out = child.wait_with_output().unwrap();
    let stdout: String = lines.map_while(|l| l.ok()).map(|l| l + "\n").collect();
    assert!(
        out.status.success() && stdout.contains("verified"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reconnects: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("reconnects "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        reconnects >= 2,
        "the kills happened during the IO: {stdout}"
    );
    assert_all_chunks_survive_a_kill(&mut s);
}
