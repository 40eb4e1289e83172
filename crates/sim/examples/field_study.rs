//! The field study's question, scaled: zipf 1.2 random 4 KiB reads over two
//! files, caches from 1% to 50% of the data, NVMe in front of a hard disk.
//!
//! `cargo run --release -p tiercache-sim --example field_study -- [OUT_DIR] [DATA_GIB] [IOS] [CACHE_PERCENTS]`
//!
//! e.g. `... /tmp 1024 50000000 1,2,5` asks the study's open question: what
//! would 10 GiB of SSD do for 1 TiB of data? (SHARDS for the MRC there.)
use tiercache_sim::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let out = std::path::PathBuf::from(args.get(1).cloned().unwrap_or_else(|| ".".into()));
    let data_gib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let ios: u64 = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_000_000);
    let w = Workload {
        size: (data_gib << 30) / 2,
        ios,
        ..Workload::default()
    };
    let percents: Vec<f64> = args
        .get(4)
        .map(|s| s.split(',').filter_map(|p| p.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
    let data = data_gib << 30;
    let mut spec = SimSpec {
        cache_sizes: percents
            .iter()
            .map(|p| ((data as f64 * p / 100.0) as u64) / 4096 * 4096)
            .collect(),
        ..SimSpec::default()
    };
    if data_gib > 64 {
        spec.mrc = Some(simulate::MrcSpec {
            method: MrcMethod::Shards { rate: 0.01 },
            bucket_blocks: 1,
        });
    }
    let report = run(&Input::Workload(w), &spec, &|p: &Progress| {
        if p.phase != Phase::Replay {
            eprintln!("{p:?}");
        }
    })
    .expect("simulation");
    let table = write_outputs(
        &report,
        &OutputPaths {
            json: Some(out.join("field_study.json")),
            png: Some(out.join("field_study.png")),
        },
    )
    .expect("outputs");
    print!("{table}");
}
