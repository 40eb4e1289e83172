//! FileDevice against fio: 4 KiB O_DIRECT random reads from 16 threads on a
//! 1 GiB file, then fio on the same file with psync (16 jobs) and io_uring
//! (1 job, iodepth 16). Prints IOPS and the ratios.
//!
//! Environment: TIERCACHE_BENCH_DIR (default /var/tmp) holds the file;
//! TIERCACHE_BENCH_SECS (default 5) is the run time of each step;
//! TIERCACHE_BENCH_KEEP=1 keeps the file for the next run.
//!
//! Run with `cargo bench -p tiercache-device --bench file_vs_fio`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, BlockDevice, FileDevice};

const FILE_SIZE: u64 = 1 << 30;
const BS: u64 = 4096;
const THREADS: usize = 16;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Creates (or reuses) the test file, filled with non-zero data so no read
/// hits a hole.
fn prepare(path: &Path) -> FileDevice {
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.len() == FILE_SIZE && std::env::var("TIERCACHE_BENCH_KEEP").is_ok() {
            println!("reusing {}", path.display());
            return FileDevice::open(path).expect("open bench file");
        }
    }
    let t = Instant::now();
    let dev = FileDevice::create(path, FILE_SIZE).expect("create bench file");
    let mut buf = AlignedBuf::new(1 << 20);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    for i in 0..FILE_SIZE / buf.len() as u64 {
        buf[0..8].copy_from_slice(&i.to_le_bytes());
        dev.write_at(&buf, i * buf.len() as u64).expect("fill");
    }
    dev.flush().expect("flush");
    println!(
        "wrote {} ({} MiB) in {:.1} s",
        path.display(),
        FILE_SIZE >> 20,
        t.elapsed().as_secs_f64()
    );
    dev
}

/// 4 KiB random reads from `THREADS` threads for `secs`; returns IOPS.
fn run_device(dev: Arc<FileDevice>, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let blocks = dev.size() / BS;
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (dev, stop, ops) = (dev.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(BS as usize);
                let mut x = 0x2545_f491_4f6c_dd1du64 ^ ((t as u64 + 1) << 32);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    dev.read_at(&mut buf, (x % blocks) * BS).expect("read");
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Runs fio with the given engine options; returns read IOPS, or why not.
fn run_fio(path: &Path, secs: f64, extra: &[&str]) -> Result<f64, String> {
    let runtime = format!("--runtime={}", secs.ceil() as u64);
    let filename = format!("--filename={}", path.display());
    let mut args = vec![
        "--name=x",
        filename.as_str(),
        "--direct=1",
        "--rw=randread",
        "--bs=4k",
        "--time_based",
        runtime.as_str(),
        "--group_reporting",
        "--output-format=json",
    ];
    args.extend_from_slice(extra);
    let out = Command::new("fio")
        .args(&args)
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // fio may print notes before the JSON document.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').ok_or("no JSON from fio")?..];
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    v["jobs"][0]["read"]["iops"]
        .as_f64()
        .ok_or_else(|| "no jobs[0].read.iops in fio output".to_string())
}

fn main() {
    let dir = PathBuf::from(env_or("TIERCACHE_BENCH_DIR", "/var/tmp"));
    let secs: f64 = env_or("TIERCACHE_BENCH_SECS", "5")
        .parse()
        .expect("TIERCACHE_BENCH_SECS must be a number");
    let path = dir.join("tiercache-bench-1g.img");
    let dev = Arc::new(prepare(&path));
    println!(
        "{}: O_DIRECT {}{}",
        path.display(),
        if dev.direct_io() { "on" } else { "off" },
        dev.warning().map(|w| format!(" ({w})")).unwrap_or_default()
    );

    println!("running FileDevice, {THREADS} threads, {secs} s ...");
    let ours = run_device(dev.clone(), secs);
    println!("running fio psync, 16 jobs ...");
    let psync = run_fio(&path, secs, &["--ioengine=psync", "--numjobs=16"]);
    println!("running fio io_uring, 1 job, iodepth 16 ...");
    let uring = run_fio(
        &path,
        secs,
        &["--ioengine=io_uring", "--iodepth=16", "--numjobs=1"],
    );
    println!("running FileDevice again (to see drift) ...");
    let ours_again = run_device(dev, secs);

    // Runs before and after fio, averaged, so drift in the machine's load
    // does not count against either side.
    let ours_mean = (ours + ours_again) / 2.0;
    let row = |name: &str, r: &Result<f64, String>| match r {
        Ok(iops) => println!("| {name:<28} | {iops:>10.0} | {:>22.2} |", ours_mean / iops),
        Err(e) => println!("| {name:<28} | {:>10} | {:>22} |  {e}", "n/a", "n/a"),
    };
    println!();
    println!(
        "4 KiB random reads, O_DIRECT, 1 GiB file in {}",
        dir.display()
    );
    println!(
        "| {:<28} | {:>10} | {:>22} |",
        "run", "IOPS", "FileDevice mean / this"
    );
    println!("|{:-<30}|{:->12}|{:->24}|", "", "", "");
    row("FileDevice (16 threads)", &Ok(ours));
    row("FileDevice again", &Ok(ours_again));
    row("FileDevice, mean of both", &Ok(ours_mean));
    row("fio psync (16 jobs)", &psync);
    row("fio io_uring (QD16, 1 job)", &uring);

    if std::env::var("TIERCACHE_BENCH_KEEP").is_err() {
        let _ = std::fs::remove_file(&path);
    }
}
