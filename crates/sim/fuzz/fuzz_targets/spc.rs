//! Fuzzes the SPC CSV trace reader (UMass Financial/WebSearch): arbitrary
//! bytes read as `--format spc`, with every ASU apart and all merged.
//! Contract: see `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::trace::VolumeMode;
use tiercache_sim::{TraceFormat, TraceOptions};

fuzz_target!(|data: &[u8]| {
    for volumes in [VolumeMode::Separate, VolumeMode::Merge] {
        tiercache_sim_fuzz::read_trace_with(
            data,
            TraceOptions {
                format: Some(TraceFormat::Spc),
                volumes,
                ..TraceOptions::default()
            },
        );
    }
});
