//! A real process killed with SIGKILL: this test binary re-runs itself as a
//! child that writes through a persistent writeback engine on files (with
//! the background cleaner running, a flush now and then), printing the
//! sequence number of each acknowledged write. The parent kills it at a
//! random moment, reopens the cache and checks that every acknowledged
//! write reads back, flushed or not (or a later write to the same sector),
//! and nothing else: the operating system outlives the server, so a file
//! system above it trusts every completed write. Rounds continue on the
//! same files, so recovery is itself recovered from. 20 rounds here;
//! `TIERCACHE_KILL_ROUNDS=500` for a soak.

use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tiercache_device::{BlockDevice, FileDevice};
use tiercache_engine::{Cleaner, CleanerConfig, Engine, EngineConfig, OpenOptions};
use tiercache_types::{CacheMode, MonotonicClock};

const SECTOR: u64 = 512;
const BACKING: u64 = 8 << 20;
const CACHE: u64 = 4 << 20;
const WRITES_PER_ROUND: u64 = 100_000;

fn tag(sector: u64, seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&sector.to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in out[16..].iter_mut().enumerate() {
        *b = (sector ^ seq.wrapping_mul(7) ^ i as u64) as u8;
    }
}

fn decode(sector: u64, data: &[u8]) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let mut want = vec![0u8; SECTOR as usize];
    tag(sector, seq, &mut want);
    (data == &want[..]).then_some(seq)
}

/// The writes of round `round`, in order: (first sector, sectors, seq).
/// Seqs are unique across rounds.
fn writes(round: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(round);
    (0..WRITES_PER_ROUND).map(move |i| {
        let sectors = rng.gen_range(1..=32u64);
        let first = rng.gen_range(0..BACKING / SECTOR - sectors);
        (first, sectors, round * WRITES_PER_ROUND + i + 1)
    })
}

fn devices(dir: &Path) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
    (
        Arc::new(FileDevice::open(dir.join("backing.img")).unwrap()),
        Arc::new(FileDevice::open(dir.join("cache.img")).unwrap()),
    )
}

/// A temporary directory holding a blank backing file and a cache file
/// formatted for it (writeback, 4 KiB blocks, no sequential bypass).
fn formatted_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap();
    for (name, size) in [("backing.img", BACKING), ("cache.img", CACHE)] {
        std::fs::File::create(dir.path().join(name))
            .unwrap()
            .set_len(size)
            .unwrap();
    }
    let (b, c) = devices(dir.path());
    let cfg = EngineConfig {
        mode: CacheMode::WriteBack,
        block_size: 4096,
        sequential_cutoff: 0,
        ..EngineConfig::default()
    };
    let e = Engine::create(b, c, &cfg, Arc::new(MonotonicClock::new()), "backing", None).unwrap();
    e.shutdown(false).unwrap();
    dir
}

/// This test binary started again as a child running only the test
/// `entry`, with `env` set; its stdout is piped, its stderr goes to
/// `dir/child-stderr.log` (see [`child_stderr`]).
fn spawn_child(dir: &Path, entry: &str, env: &[(&str, String)]) -> std::process::Child {
    let log = std::fs::File::create(dir.join("child-stderr.log")).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// What the last child started on `dir` wrote to stderr (its panic message,
/// when it ended before it should have).
fn child_stderr(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("child-stderr.log")).unwrap_or_default()
}

fn open(dir: &Path) -> Engine {
    let (b, c) = devices(dir);
    Engine::open(
        b,
        c,
        &OpenOptions::default(),
        Arc::new(MonotonicClock::new()),
        "backing",
    )
    .expect("reopen after SIGKILL")
    .0
}

/// Child mode: write round `round`'s writes forever-ish (a flush after
/// every 7th, FUA on every 53rd), printing each one's seq once it returned.
fn child(dir: &Path, round: u64) {
    let engine = Arc::new(open(dir));
    let _cleaner = Cleaner::spawn(
        engine.clone(),
        CleanerConfig {
            target_dirty: 0.3,
            idle_after: Duration::from_millis(5),
            ..CleanerConfig::default()
        },
    );
    // The first line on a line of its own: the test harness has printed
    // "test NAME ... " without a newline before the test started, and a
    // first "ACKED" glued to it would go unread.
    let mut out = std::io::stdout();
    writeln!(out).unwrap();
    let mut buf = vec![0u8; 32 * SECTOR as usize];
    for (first, sectors, seq) in writes(round) {
        for k in 0..sectors {
            tag(
                first + k,
                seq,
                &mut buf[(k * SECTOR) as usize..((k + 1) * SECTOR) as usize],
            );
        }
        engine
            .write(
                first * SECTOR,
                &buf[..(sectors * SECTOR) as usize],
                seq % 53 == 0,
            )
            .unwrap();
        if seq % 7 == 0 {
            engine.flush().unwrap();
        }
        writeln!(out, "ACKED {seq}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn kill_child() {
    // Only does something when started by `sigkill_rounds` below.
    if let (Ok(dir), Ok(round)) = (
        std::env::var("TIERCACHE_KILL_DIR"),
        std::env::var("TIERCACHE_KILL_ROUND"),
    ) {
        child(Path::new(&dir), round.parse().unwrap());
    }
}

/// Per sector: the seq that must be there at least, and all seqs written
/// later that may be there instead.
#[derive(Clone, Default)]
struct Expect {
    durable: u64,
    later: Vec<u64>,
}

#[test]
fn sigkill_rounds() {
    let rounds: u64 = std::env::var("TIERCACHE_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = formatted_dir("tiercache-kill");
    let mut expect = vec![Expect::default(); (BACKING / SECTOR) as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut acked_total = 0;
    for round in 1..=rounds {
        let dir_env = dir.path().display().to_string();
        let mut child = spawn_child(
            dir.path(),
            "kill_child",
            &[
                ("TIERCACHE_KILL_DIR", dir_env),
                ("TIERCACHE_KILL_ROUND", round.to_string()),
            ],
        );
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acked = 0u64;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("ACKED ") {
                    acked = n.parse().unwrap();
                }
            }
            acked
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..400)));
        child.kill().unwrap();
        child.wait().unwrap();
        // Every write up to `acked` was acknowledged, so it must be there;
        // the one after it may or may not be (killed between its return
        // and its line). A child killed before its first write reports none.
        let acked = reader.join().unwrap().max(round * WRITES_PER_ROUND);
        for (first, sectors, seq) in writes(round) {
            let durable = seq <= acked;
            if seq > acked + 1 {
                break;
            }
            for s in first..first + sectors {
                let e = &mut expect[s as usize];
                if durable && seq > e.durable {
                    e.durable = seq;
                    e.later.retain(|&l| l > seq);
                } else if !durable {
                    e.later.push(seq);
                }
            }
        }
        acked_total += acked.saturating_sub(round * WRITES_PER_ROUND);
        // Reopen (recovery) and verify every sector.
        let engine = open(dir.path());
        let mut all = vec![0u8; BACKING as usize];
        engine.read(0, &mut all).unwrap();
        for s in 0..BACKING / SECTOR {
            let got = decode(s, &all[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize]);
            let e = &expect[s as usize];
            let Some(got) = got else {
                panic!("round {round}: sector {s} holds data never written");
            };
            assert!(
                got == e.durable || e.later.contains(&got),
                "round {round}: sector {s} holds seq {got}, expected {} or one of {:?}",
                e.durable,
                e.later
            );
            // What is there now is what the next round builds on.
            let e = &mut expect[s as usize];
            e.durable = got;
            e.later.clear();
        }
        engine.shutdown(false).unwrap();
    }
    assert!(
        acked_total > 0,
        "the children acknowledged writes before being killed"
    );
    eprintln!("sigkill_rounds: {rounds} rounds, {acked_total} acknowledged writes verified");
}

/// The sectors of the trim test: a 4 KiB block at 1 MiB.
const TRIM_AT: u64 = 1 << 20;

/// Child mode of `trim_then_write_survives_sigkill`: makes the block at
/// `TRIM_AT` dirty and durably so (a flush), trims it, writes its first
/// sector (which goes to the backing device only: the block is no longer
/// cached), says so and waits to be killed, with no flush after the trim.
fn trim_child(dir: &Path) {
    let engine = open(dir);
    engine.write(TRIM_AT, &[1u8; 4096], false).unwrap();
    engine.flush().unwrap();
    engine.trim(TRIM_AT, 4096).unwrap();
    engine.write(TRIM_AT, &[2u8; 512], false).unwrap();
    // On a line of its own: the test harness has printed "test NAME ... "
    // without a newline before the test started.
    let mut out = std::io::stdout();
    writeln!(out, "\nACKED").unwrap();
    out.flush().unwrap();
    std::thread::sleep(Duration::from_secs(3600));
}

#[test]
fn trim_child_entry() {
    // Only does something when started by `trim_then_write_survives_sigkill`.
    if let Ok(dir) = std::env::var("TIERCACHE_TRIM_DIR") {
        trim_child(Path::new(&dir));
    }
}

/// A trim withdraws a dirty block's claim; a write acknowledged after the
/// trim must not be shadowed, after a SIGKILL, by the dirty copy the trim
/// dropped (the withdrawal commits before the trim is acknowledged).
#[test]
fn trim_then_write_survives_sigkill() {
    let dir = formatted_dir("tiercache-trim-kill");
    let mut child = spawn_child(
        dir.path(),
        "trim_child_entry",
        &[("TIERCACHE_TRIM_DIR", dir.path().display().to_string())],
    );
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let acked = BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
            .any(|l| l == "ACKED");
        let _ = tx.send(acked);
    });
    // A child that neither acknowledges nor ends is killed too, and fails.
    let acked = rx.recv_timeout(Duration::from_secs(120)).unwrap_or(false);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        acked,
        "the child never acknowledged its writes; its stderr:\n{}",
        child_stderr(dir.path())
    );
    let engine = open(dir.path());
    let mut sector = vec![0u8; 512];
    engine.read(TRIM_AT, &mut sector).unwrap();
    assert!(
        sector.iter().all(|&b| b == 2),
        "the write after the trim was lost: the sector reads {:?}...",
        &sector[..8]
    );
    engine.shutdown(false).unwrap();
}
