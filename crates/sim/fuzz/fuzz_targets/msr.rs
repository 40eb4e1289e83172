//! Fuzzes the Msr CSV trace reader: arbitrary bytes read as
//! `--trace-format msr`. Contract: see `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::TraceFormat;

fuzz_target!(|data: &[u8]| {
    tiercache_sim_fuzz::read_trace(data, Some(TraceFormat::Msr));
});
