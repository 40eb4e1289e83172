//! A restart after `kill -9`: the server comes back serving at once, and
//! checks the clean blocks it restored lazily (docs/RESTART.md, fast
//! restart). A restored block whose slot no longer matches its crc is never
//! served: it is dropped and read from the backing device.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// Python for nbdsh: block `k`'s content, unique per block (its number in
/// every 4-byte word).
const PY_UNIQUE: &str = "def blk(k):\n    return k.to_bytes(4, 'little') * 1024\n";

const BLOCKS: u32 = 1024;

/// The system Python that has Debian's `nbd` module (see `Served::nbdsh`).
fn python() -> Command {
    if Path::new("/usr/bin/python3").exists() {
        Command::new("/usr/bin/python3")
    } else {
        Command::new("python3")
    }
}

#[test]
fn clean_blocks_corrupted_after_a_kill_are_never_served() {
    let t = "clean_blocks_corrupted_after_a_kill_are_never_served";
    if !have("nbdsh", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    sparse_file(&d.join("backing.img"), 16 * MIB);
    sparse_file(&d.join("cache.img"), 16 * MIB);
    let mut s = Served::start(bin(), d, &["--mode", "writethrough", "--block-size", "4k"]);
    // Every block written (writethrough: cached clean), then a FLUSH: their
    // clean claims, with crcs, are committed.
    let out = s.nbdsh(&format!(
        "{PY_UNIQUE}
for k in range({BLOCKS}):\n
    h.pwrite(blk(k), k * 4096)\n
h.flush()\n"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.kill();

    // Behind the server's back, one byte flips bits in the cached copy of
    // every third block (found by content in the cache file).
    let cache = std::fs::read(&s.cache).unwrap();
    let mut corrupted = Vec::new();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.cache)
        .unwrap();
    for (slot, chunk) in cache.chunks(4096).enumerate() {
        let k = u32::from_le_bytes(chunk[..4].try_into().unwrap());
        let whole = chunk.chunks(4).all(|w| w == k.to_le_bytes());
        // (Block 0 is all zeros, like unused space: left alone.)
        if k != 0 && k < BLOCKS && k % 3 == 0 && whole {
            use std::os::unix::fs::FileExt;
            let at = slot * 4096 + 2001;
            f.write_at(&[cache[at] ^ 0x5A], at as u64).unwrap();
            corrupted.push(k);
        }
    }
    f.sync_all().unwrap();
    assert_eq!(
        corrupted.len(),
        (BLOCKS as usize - 1) / 3,
        "the cache file holds every block"
    );

    // The next start restores them unchecked and serves at once; every
    // read returns the written data, whichever check (first use or the
    // background) meets a corrupted block first.
    s.restart();
    let log = s.log();
    assert!(log.contains("to check against their crc"), "{log}");
    let out = s.nbdsh(&format!(
        "{PY_UNIQUE}
for k in range({BLOCKS}):\n
    assert h.pread(4096, k * 4096) == blk(k), k\n
print('verified')\n"
    ));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verified"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = s.stats();
    let hits = st["decisions"]["read_hits"].as_u64().unwrap();
    let misses = st["decisions"]["read_misses"].as_u64().unwrap();
    assert_eq!(
        misses,
        corrupted.len() as u64,
        "exactly the corrupted blocks came from the backing device: {st}"
    );
    assert_eq!(hits + misses, BLOCKS as u64, "{st}");

    // A clean stop now writes a mapping the next start trusts without a
    // check: it holds the blocks read again from the backing device, not
    // the corrupted copies.
    s.stop();
    s.restart();
    let out = s.nbdsh(&format!(
        "{PY_UNIQUE}
for k in range({BLOCKS}):\n
    assert h.pread(4096, k * 4096) == blk(k), k\n
print('verified')\n"
    ));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verified"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.kill();
}

/// The restart time after `kill -9` of a cache of 2^20 4 KiB blocks with
/// 400k clean blocks claimed with a crc and 200k dirty: from spawning
/// `tiercache serve` to its answer to the first NBD read (a cached
/// block), median of interleaved rounds, for this build and, when
/// `TIERCACHE_BEFORE` names another `tiercache` binary, for that one too.
/// A measure, not a test: `cargo test --release -p tiercache --test
/// restart -- --ignored --nocapture` (needs ~4 GiB in
/// `TIERCACHE_BENCH_DIR`, default /var/tmp; with `TIERCACHE_RESTART_DIR`
/// the cache is made there and kept, and used again by the next run).
#[test]
#[ignore]
fn restart_time_of_a_million_block_cache() {
    use std::sync::Arc;
    use tiercache_device::{BlockDevice, FileDevice};
    use tiercache_engine::{Engine, EngineConfig};
    use tiercache_types::{CacheMode, MonotonicClock};

    let base = std::env::var("TIERCACHE_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).unwrap();
    let kept = std::env::var_os("TIERCACHE_RESTART_DIR").map(std::path::PathBuf::from);
    let d = kept.as_deref().unwrap_or(dir.path());
    let (bpath, cpath) = (d.join("backing.img"), d.join("cache.img"));
    let blocks: u64 = 1 << 20;
    if !cpath.exists() {
        let cache = Arc::new(FileDevice::create(&cpath, blocks * 4096 + (64 << 20)).unwrap())
            as Arc<dyn BlockDevice>;
        let backing =
            Arc::new(FileDevice::create(&bpath, 8 << 30).unwrap()) as Arc<dyn BlockDevice>;
        let cfg = EngineConfig {
            mode: CacheMode::WriteBack,
            block_size: 4096,
            sequential_cutoff: 0,
            ..EngineConfig::default()
        };
        let e = Engine::create(
            backing,
            cache,
            &cfg,
            Arc::new(MonotonicClock::new()),
            "backing.img",
            None,
        )
        .unwrap();
        // 1 MiB writes (256 blocks) at 1 MiB steps from 0, then all but
        // 200k cleaned: 400k clean blocks with crc claims, 200k dirty.
        let buf = vec![1u8; 1 << 20];
        for i in 0..(600_000 / 256) as u64 {
            e.write(i << 20, &buf, false).unwrap();
        }
        e.flush().unwrap();
        let to_clean = e.dirty_blocks().saturating_sub(200_000) as usize;
        let mut cleaned = 0;
        while cleaned < to_clean {
            cleaned += e.clean(to_clean - cleaned).unwrap();
        }
        e.flush().unwrap();
        // Dropped without a shutdown: as after kill -9.
    }
    let mut binaries = vec![(
        "this build".to_string(),
        env!("CARGO_BIN_EXE_tiercache").to_string(),
    )];
    if let Ok(before) = std::env::var("TIERCACHE_BEFORE") {
        binaries.push((format!("TIERCACHE_BEFORE ({before})"), before));
    }
    let sock = d.join("nbd.sock");
    // Python spawns the server, connects as soon as the socket answers,
    // reads block 0 (a clean, claimed block) and kills the server with
    // SIGKILL: the next round is again a restart after a crash.
    let script = format!(
        "import nbd, os, signal, subprocess, sys, time\n\
         t0 = time.monotonic()\n\
         p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n\
         while True:\n\
         \x20   try:\n\
         \x20       h = nbd.NBD(); h.connect_unix('{s}'); break\n\
         \x20   except nbd.Error:\n\
         \x20       time.sleep(0.002)\n\
         \x20   if time.monotonic() - t0 > 60: p.kill(); sys.exit('no answer')\n\
         h.pread(4096, 0)\n\
         print('%.3f' % (time.monotonic() - t0))\n\
         p.send_signal(signal.SIGKILL); p.wait()\n",
        s = sock.display()
    );
    let rounds: usize = std::env::var("TIERCACHE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); binaries.len()];
    for round in 0..rounds {
        for (i, (_, bin)) in binaries.iter().enumerate() {
            let _ = std::fs::remove_file(&sock);
            let out = run(python()
                .arg("-c")
                .arg(&script)
                .arg(bin)
                .arg("serve")
                .arg("--backing")
                .arg(&bpath)
                .arg("--cache")
                .arg(&cpath)
                .arg("--socket")
                .arg(&sock)
                .arg("--control")
                .arg(d.join("nbd.ctl")));
            let secs: f64 = out.trim().parse().unwrap();
            eprintln!("round {round}: {}: {secs:.3} s", binaries[i].0);
            times[i].push(secs);
        }
    }
    for ((name, _), mut t) in binaries.iter().zip(times) {
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "restart after kill -9, 2^20 blocks (400k clean claimed, 200k dirty), spawn to first \
             read answered: {name}: median {:.3} s (min {:.3}, max {:.3}, {} rounds)",
            t[t.len() / 2],
            t[0],
            t[t.len() - 1],
            t.len()
        );
    }
}
