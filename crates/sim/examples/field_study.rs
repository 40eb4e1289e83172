//! The field study's question, scaled: zipf 1.2 random 4 KiB reads over two
//! files, caches from 1% to 50% of the data, NVMe in front of a hard disk.
//!
//! `cargo run --release -p tiercache-sim --example field_study -- [OUT_DIR] [DATA_GIB] [IOS]`
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
    let data = data_gib << 30;
    let spec = SimSpec {
        cache_sizes: [100, 50, 20, 10, 5, 2].iter().map(|d| data / d).collect(),
        ..SimSpec::default()
    };
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
