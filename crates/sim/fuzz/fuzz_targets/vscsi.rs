//! Fuzzes the libCacheSim vscsi binary reader: arbitrary bytes read as
//! `--format vscsi` (version detection from the first records, then 32- or
//! 40-byte records), and through format detection. Contract: see
//! `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::TraceFormat;

fuzz_target!(|data: &[u8]| {
    tiercache_sim_fuzz::read_trace(data, Some(TraceFormat::Vscsi));
    let _ = tiercache_sim::trace::detect_binary_format(data);
});
