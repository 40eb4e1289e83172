//! The main job's stale-cache run (`make run`, `tiercache bench`) at the
//! policy level, in a second instead of minutes: which blocks each stack
//! misses when a cache full of one region's blocks meets another region
//! (`main_job_stale_over_empty` in `tests/common/warmup.rs`), in each
//! layout: as the bench runs it on a cache file and in RAM, and with
//! region A read again page by page into 640 blocks (the case
//! `first_turnover.rs` was built on).
//! Prints, per layout and stack, the stale run's misses over the empty
//! run's, for seeds 1 to SEEDS (the adaptive default's varies with the
//! moment its minis move), and their median.
//!
//! Usage: `mainjob_stale [READS_PER_RUN [SEEDS]]` (defaults 300000 5).

#[path = "../tests/common/warmup.rs"]
mod warmup;

use warmup::*;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let reads = args.first().copied().unwrap_or(300_000);
    let seeds = args.get(1).copied().unwrap_or(5);
    for layout in [
        MainJobLayout::AsBench,
        MainJobLayout::AsBenchRam,
        MainJobLayout::PageFill640,
    ] {
        println!(
            "{layout:?}: {reads} Zipf(1.2) reads per run over {} blocks",
            MAIN_JOB_PAGES / MAIN_JOB_PAGES_PER_BLOCK
        );
        for stack in stacks() {
            print_stack(stack, layout, reads, seeds);
        }
    }
}

fn print_stack(stack: Stack, layout: MainJobLayout, reads: u64, seeds: u64) {
    {
        let mut ratios: Vec<f64> = (1..=seeds)
            .map(|seed| main_job_stale_over_empty(stack, layout, reads, seed))
            .collect();
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "{:16} stale/empty misses: median {:.2}x ({})",
            stack.name(),
            ratios[ratios.len() / 2],
            shown.join(" ")
        );
    }
}
