//! Fuzzes the blkparse text reader, once for Q and once for C events, and
//! once keeping a single volume. Contract: see
//! `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::trace::{BlkEvent, VolumeMode};
use tiercache_sim::{TraceFormat, TraceOptions};

fuzz_target!(|data: &[u8]| {
    for (blkparse_event, volumes) in [
        (BlkEvent::Queue, VolumeMode::Separate),
        (BlkEvent::Complete, VolumeMode::Only("8,0".into())),
    ] {
        tiercache_sim_fuzz::read_trace_with(
            data,
            TraceOptions {
                format: Some(TraceFormat::Blkparse),
                blkparse_event,
                volumes,
            },
        );
    }
});
