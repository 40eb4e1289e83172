//! Calibration of EmulatedHdd: real (slept) IOPS at queue depth 1, 4 and 16
//! for 4 KiB random reads over a 1 GiB MemDevice, and sequential 1 MiB read
//! throughput, each next to what the pure model predicts.
//!
//! TIERCACHE_BENCH_SECS (default 4) is the run time of each step.
//! Run with `cargo bench -p tiercache-device --bench hdd`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, BlockDevice, EmulatedHdd, HddModel, MemDevice};

const SIZE: u64 = 1 << 30;
const BS: u64 = 4096;

type Hdd = EmulatedHdd<Arc<MemDevice>>;

/// Random 4 KiB reads from `threads` threads (= queue depth) for `secs`.
fn random_iops(hdd: Arc<Hdd>, threads: usize, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let blocks = hdd.size() / BS;
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (hdd, stop, ops) = (hdd.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(BS as usize);
                let mut x = 0x853c_49e6_748f_ea9bu64 ^ ((t as u64 + 1) << 40);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    hdd.read_at(&mut buf, (x % blocks) * BS).unwrap();
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Sequential 1 MiB reads from one thread for `secs`; MB/s (10^6 bytes).
fn sequential_mbps(hdd: &Hdd, secs: f64) -> f64 {
    let chunk = 1u64 << 20;
    let mut buf = AlignedBuf::new(chunk as usize);
    let start = Instant::now();
    let mut off = 0u64;
    let mut bytes = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        hdd.read_at(&mut buf, off).unwrap();
        bytes += chunk;
        off = (off + chunk) % hdd.size();
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let secs: f64 = std::env::var("TIERCACHE_BENCH_SECS")
        .unwrap_or_else(|_| "4".into())
        .parse()
        .expect("TIERCACHE_BENCH_SECS must be a number");
    let mem = Arc::new(MemDevice::new(SIZE));
    let model = HddModel::default();
    let predict = |m: &HddModel, qd: usize| {
        let n = 20_000;
        n as f64
            / m.simulate_random(SIZE / m.spindles as u64, BS, qd, n, 7)
                .as_secs_f64()
    };
    let new = |m: &HddModel| Arc::new(EmulatedHdd::new(mem.clone(), m.clone()).unwrap());

    println!(
        "EmulatedHdd over a 1 GiB MemDevice, default model ({} rpm, avg seek {:?}, {} MB/s)",
        model.rpm,
        model.average_seek,
        model.transfer_rate / 1_000_000
    );
    println!(
        "| {:<34} | {:>10} | {:>10} |",
        "workload", "measured", "model"
    );
    println!("|{:-<36}|{:->12}|{:->12}|", "", "", "");
    for qd in [1usize, 4, 16] {
        let got = random_iops(new(&model), qd, secs);
        println!(
            "| {:<34} | {:>10.0} | {:>10.0} |",
            format!("4 KiB random read IOPS, QD{qd}"),
            got,
            predict(&model, qd)
        );
    }
    let two = HddModel {
        spindles: 2,
        ..model.clone()
    };
    let got = random_iops(new(&two), 16, secs);
    // Each spindle sees about half of the 16 outstanding requests.
    println!(
        "| {:<34} | {:>10.0} | {:>10.0} |",
        "same, QD16, 2 spindles",
        got,
        2.0 * predict(&two, 8)
    );
    let fifo = HddModel {
        reorder: false,
        ..model.clone()
    };
    let got = random_iops(new(&fifo), 16, secs);
    println!(
        "| {:<34} | {:>10.0} | {:>10.0} |",
        "same, QD16, no reordering",
        got,
        predict(&fifo, 16)
    );
    let seq = sequential_mbps(&new(&model), secs);
    println!(
        "| {:<34} | {:>10.1} | {:>10.1} |",
        "sequential 1 MiB read MB/s, QD1",
        seq,
        model.transfer_rate as f64 / 1e6
    );
}
