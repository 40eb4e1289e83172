//! Fuzzes the fio iolog (v2 and v3) reader: arbitrary bytes read as
//! `--trace-format fio`. Contract: see `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::TraceFormat;

fuzz_target!(|data: &[u8]| {
    tiercache_sim_fuzz::read_trace(data, Some(TraceFormat::Fio));
});
