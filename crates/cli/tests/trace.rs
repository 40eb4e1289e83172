//! `tiercache trace` against a real client: fio over NBD runs while the
//! server records, then the recorded trace holds exactly fio's requests
//! (count, offsets, lengths, reads and writes: compared with fio's own
//! iolog of the same run), `tiercache sim` runs on it, and a sampled
//! recording of the same job keeps exactly the requests of the sampled
//! blocks; a server stopped while it records still completes the file.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_sim::trace::recorded::{block_sampled, RecordedHeader};
use tiercache_sim::trace::{open_trace, TraceFormat, TraceOptions, VolumeMode};
use tiercache_types::Access;

const BS: u64 = 4096;
/// The fio job's IOs: random 4 KiB reads and writes over 16 MiB.
const IOS: usize = 3000;

/// (offset, len, is-write) of every request of a trace, sorted: the
/// requests of several in flight at once may arrive in either order.
fn requests(path: &Path, format: Option<TraceFormat>) -> Vec<(u64, u64, bool)> {
    let opts = TraceOptions {
        format,
        volumes: VolumeMode::Merge,
        ..Default::default()
    };
    let mut v: Vec<(u64, u64, bool)> = open_trace(path, &opts)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (r.offset, r.len, r.access == Access::Write)
        })
        .collect();
    v.sort_unstable();
    v
}

/// A server in `dir` over a 64 MiB backing file and an 8 MiB cache file,
/// 4 KiB blocks, no sequential bypass: every fio request is one block.
fn served_4k(dir: &Path) -> Served {
    sparse_file(&dir.join("backing.img"), 64 * MIB);
    sparse_file(&dir.join("cache.img"), 8 * MIB);
    Served::start(
        bin(),
        dir,
        &["--block-size", "4k", "--sequential-cutoff", "0"],
    )
}

/// Starts `tiercache trace` and waits until the server records.
fn start_trace(s: &Served, out: &Path, extra: &[&str]) -> Child {
    let child = tiercache()
        .arg("trace")
        .arg("--control")
        .arg(s.control())
        .args(["--seconds", "20", "--out"])
        .arg(out)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.stats()["trace"]["recording"] != true {
        assert!(Instant::now() < deadline, "the recording never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Runs the fio job (same offsets every time: fio's `randrepeat`), writing
/// fio's own iolog of it to `iolog`; returns (reads, writes) fio counted.
fn fio(s: &Served, iolog: &Path) -> (u64, u64) {
    fio_on(s, &s.uri(), iolog)
}

/// The fio job on the export at `uri`.
fn fio_on(s: &Served, uri: &str, iolog: &Path) -> (u64, u64) {
    let out = run(Command::new("fio")
        .current_dir(&s.dir)
        .args([
            "--name=trace",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            "--size=16m",
            "--iodepth=4",
            &format!("--number_ios={IOS}"),
            "--random_distribution=zipf:1.1",
            "--output-format=json",
        ])
        .arg(format!("--write_iolog={}", iolog.display())));
    let json = &out[out.find('{').expect("fio's json")..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let job = &v["jobs"][0];
    (
        job["read"]["total_ios"].as_u64().unwrap(),
        job["write"]["total_ios"].as_u64().unwrap(),
    )
}

/// Ends the recording early (the client goes away; the server notices at
/// its next progress line and completes the file) unless it ended.
fn finish(s: &Served, mut child: Child) {
    assert_eq!(
        s.stats()["trace"]["recording"],
        true,
        "fio outlasted the 20 s recording; the comparison would be wrong"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.stats()["trace"]["recording"] != false {
        assert!(Instant::now() < deadline, "the recording never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_recorded_fio_run_holds_exactly_fios_requests_and_sim_replays_it() {
    let t = "a_recorded_fio_run_holds_exactly_fios_requests_and_sim_replays_it";
    if !have("fio", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = served_4k(dir.path());

    // The whole run, the client staying to the end: its summary line.
    let full = dir.path().join("full.trace");
    let child = tiercache()
        .arg("trace")
        .arg("--control")
        .arg(s.control())
        .args(["--seconds", "1"])
        .arg("--out")
        .arg(&full)
        .output()
        .unwrap();
    assert!(child.status.success(), "{child:?}");
    let line = String::from_utf8_lossy(&child.stdout);
    assert!(
        line.starts_with("recorded 0 requests in 1.0 s (0 dropped)"),
        "{line}"
    );

    let child = start_trace(&s, &full, &[]);
    let fio_log = dir.path().join("fio.iolog");
    let (reads, writes) = fio(&s, &fio_log);
    assert_eq!(reads + writes, IOS as u64);
    finish(&s, child);
    let stats = &s.stats()["trace"];
    assert_eq!(stats["requests"], IOS as u64, "{stats}");
    assert_eq!(stats["dropped"], 0, "{stats}");

    let recorded = requests(&full, None);
    let from_fio = requests(&fio_log, Some(TraceFormat::Fio));
    assert_eq!(recorded.len(), IOS);
    assert_eq!(
        recorded.iter().filter(|r| r.2).count() as u64,
        writes,
        "writes"
    );
    assert_eq!(recorded, from_fio, "the same offsets, lengths and ops");

    // `tiercache sim` replays it (format detected).
    let sim = run(tiercache().arg("sim").arg("--trace").arg(&full).args([
        "--cache-sizes",
        "1M,4M",
        "--block-size",
        "4k",
    ]));
    assert!(sim.contains("adaptive+always"), "{sim}");
    assert!(sim.contains("4 MiB"), "{sim}");

    // The same job recorded at a quarter: the requests of sampled blocks,
    // exactly (4 KiB requests, aligned: one block each).
    let sampled = dir.path().join("sampled.trace");
    let child = start_trace(&s, &sampled, &["--sample", "0.25"]);
    fio(&s, &dir.path().join("fio2.iolog"));
    finish(&s, child);
    let threshold = RecordedHeader::threshold_of_rate(0.25);
    let want: Vec<_> = from_fio
        .iter()
        .copied()
        .filter(|r| block_sampled(0, r.0 / BS, threshold))
        .collect();
    assert!(!want.is_empty() && want.len() < IOS / 2, "{}", want.len());
    assert_eq!(requests(&sampled, None), want);
    let raw = zstd::decode_all(std::fs::File::open(&sampled).unwrap()).unwrap();
    let (header, _) = RecordedHeader::decode(&raw).unwrap();
    assert_eq!(header.sample_rate(), 0.25);
    assert_eq!(header.volumes, vec![(0, "backing.img".to_string())]);
}

#[test]
fn a_recording_of_one_volume_of_a_pool_holds_that_volume_alone() {
    let t = "a_recording_of_one_volume_of_a_pool_holds_that_volume_alone";
    if !have("fio", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b, cache) = (
        dir.path().join("a.img"),
        dir.path().join("b.img"),
        dir.path().join("cache.img"),
    );
    sparse_file(&a, 32 * MIB);
    sparse_file(&b, 32 * MIB);
    sparse_file(&cache, 16 * MIB);
    let (va, vb) = (
        format!("vm-a={}", a.display()),
        format!("vm-b={}", b.display()),
    );
    let s = Served::spawn(
        bin(),
        dir.path(),
        "",
        &cache.display().to_string(),
        &[
            "--volume",
            &va,
            "--volume",
            &vb,
            "--create",
            "--block-size",
            "4k",
        ],
    );
    let unknown = output(
        tiercache()
            .arg("trace")
            .arg("--control")
            .arg(s.control())
            .args(["--seconds", "1", "--volume", "vm-z", "--out"])
            .arg(dir.path().join("z.trace")),
    );
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no volume named \"vm-z\""),
        "{unknown:?}"
    );

    let out = dir.path().join("b.trace");
    let child = start_trace(&s, &out, &["--volume", "vm-b"]);
    let uri = |v: &str| format!("nbd+unix:///{v}?socket={}", s.socket().display());
    fio_on(&s, &uri("vm-a"), &dir.path().join("a.iolog"));
    fio_on(&s, &uri("vm-b"), &dir.path().join("b.iolog"));
    finish(&s, child);
    let from_fio = requests(&dir.path().join("b.iolog"), Some(TraceFormat::Fio));
    assert_eq!(
        requests(&out, None),
        from_fio,
        "vm-b's requests, and no others"
    );
    let raw = zstd::decode_all(std::fs::File::open(&out).unwrap()).unwrap();
    let (header, _) = RecordedHeader::decode(&raw).unwrap();
    assert_eq!(header.volumes, vec![(1, "vm-b".to_string())]);
}

#[test]
fn a_server_stopped_while_recording_completes_the_file_and_answers() {
    let t = "a_server_stopped_while_recording_completes_the_file_and_answers";
    if !have("fio", t) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = served_4k(dir.path());
    let out = dir.path().join("cut.trace");
    let child = start_trace(&s, &out, &[]);
    let fio_log = dir.path().join("fio.iolog");
    let (reads, writes) = fio(&s, &fio_log);
    assert_eq!(reads + writes, IOS as u64);
    // SIGTERM long before the 20 s asked are over.
    s.stop();
    let done = child.wait_with_output().unwrap();
    let line = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "trace failed: {line} {}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        line.starts_with(&format!("recorded {IOS} requests in "))
            && line.contains("the server stopped before the time asked was over"),
        "{line}"
    );
    // The file is whole: every request fio made, as fio logged them.
    assert_eq!(
        requests(&out, None),
        requests(&fio_log, Some(TraceFormat::Fio))
    );
}
