//! Fuzzes the entry path every trace takes: gzip/zstd detection and
//! decompression (`trace::decompress`), then format detection from the first
//! lines, then whichever reader that picks. Seeds are compressed traces.
//! Contract: see `tiercache_sim_fuzz::read_trace`; `detect_format` alone
//! never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_sim::trace::detect_format(&String::from_utf8_lossy(data));
    tiercache_sim_fuzz::read_trace(data, None);
});
