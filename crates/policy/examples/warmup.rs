//! Prints warm-up curves (read hit % per pass, empty vs stale cache) for
//! every replacement x admission stack.
//!
//! Usage: `warmup [CAPACITY [DATA_BLOCKS [PASSES]]]` (defaults 8192 16384 10).

#[path = "../tests/common/warmup.rs"]
mod warmup;

use tiercache_types::{AdmissionKind, ReplacementKind};
use warmup::*;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let capacity = args.first().copied().unwrap_or(8192) as u32;
    let data = args.get(1).copied().unwrap_or(16384);
    let passes = args.get(2).copied().unwrap_or(10) as usize;
    let z = Zipf::new(data, 1.2, 1);
    println!(
        "cache {capacity}, Zipf(1.2) over {data} blocks, best possible {:.2}%",
        100.0 * z.top_share(capacity as u64)
    );
    for &replacement in ReplacementKind::ALL {
        for &admission in AdmissionKind::ALL {
            let stack = Stack {
                replacement,
                admission,
            };
            let w = warmup(stack, capacity, data, passes, 7);
            for (name, c) in [("empty", &w.empty), ("stale", &w.stale)] {
                let mean = 100.0 * c.iter().sum::<f64>() / c.len() as f64;
                let curve: Vec<String> = c.iter().map(|h| format!("{:5.1}", 100.0 * h)).collect();
                println!(
                    "{:16} {name} mean {mean:5.1}: {}",
                    stack.name(),
                    curve.join(" ")
                );
            }
        }
    }
}
