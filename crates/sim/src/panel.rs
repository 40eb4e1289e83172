//! The policy panel's definition, shared by its benchmark
//! (`benches/policy_panel.rs`) and its test (`tests/panel_quality.rs`):
//! which real traces, block sizes and cache sizes, which simple policies
//! the default is held to, and the bar.

use crate::trace::TraceOptions;

/// The panel's traces (folders of `../shared/traces` from the workspace
/// root, each with `blocks.csv.zst`), in the order reported.
pub const PANEL_TRACES: [&str; 4] = [
    "1and1-linux-mysql",
    "arc-P2",
    "arc-P3",
    "tencent-cbs-sample",
];
/// 4 KiB, and the engine's 64 KiB blocks.
pub const PANEL_BLOCK_SIZES: [u32; 2] = [4096, 65536];
/// Cache sizes, in % of the trace's footprint at the block size.
pub const PANEL_SIZE_PCTS: [u32; 5] = [1, 5, 10, 25, 50];
/// The simple policies (with `always` admission) whose best the default
/// is held to.
pub const PANEL_BASELINES: [&str; 5] = ["lru", "fifo", "arc", "s3fifo", "sieve"];
/// The bar: the default misses at most this many points more than the
/// best of [`PANEL_BASELINES`] in each cell.
pub const PANEL_GAP_BAR_POINTS: f64 = 0.5;

/// How to read a panel trace's `blocks.csv.zst` (header
/// `time_us,offset_bytes,len_bytes,op`, op `R` or `W`).
pub fn panel_trace_options() -> TraceOptions {
    TraceOptions {
        format: Some(
            "csv:time=0,offset=1,len=2,op=3,op_read=R,op_write=W"
                .parse()
                .expect("the panel's csv mapping parses"),
        ),
        ..TraceOptions::default()
    }
}
