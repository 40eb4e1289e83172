//! Fuzzes the libCacheSim oracleGeneral binary reader: arbitrary bytes read
//! as `--format oracleGeneral` with obj_id in bytes and in sectors.
//! Contract: see `tiercache_sim_fuzz::read_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::TraceFormat;

fuzz_target!(|data: &[u8]| {
    tiercache_sim_fuzz::read_trace(data, Some(TraceFormat::OracleGeneral(1)));
    tiercache_sim_fuzz::read_trace(data, Some(TraceFormat::OracleGeneral(512)));
});
