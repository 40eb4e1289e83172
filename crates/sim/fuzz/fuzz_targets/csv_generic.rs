//! Fuzzes the generic CSV reader and its column-mapping parser. The first
//! line of the input is the mapping (`time=0,offset=2,...`), the rest the
//! trace; the trace is also read with every volume merged. Contract: see
//! `tiercache_sim_fuzz::read_trace`; a mapping that parses prints back to
//! one that parses to the same mapping.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_sim::trace::{CsvMapping, VolumeMode};
use tiercache_sim::{TraceFormat, TraceOptions};

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(mapping_text) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let Ok(mapping) = mapping_text.parse::<CsvMapping>() else {
        return;
    };
    let printed = mapping.to_string();
    let reparsed: CsvMapping = printed
        .parse()
        .unwrap_or_else(|e| panic!("mapping '{printed}' does not parse back: {e}"));
    assert_eq!(
        reparsed, mapping,
        "mapping '{printed}' changed in a round trip"
    );
    let trace = &data[(split + 1).min(data.len())..];
    for volumes in [VolumeMode::Separate, VolumeMode::Merge] {
        tiercache_sim_fuzz::read_trace_with(
            trace,
            TraceOptions {
                format: Some(TraceFormat::Csv(mapping.clone())),
                volumes,
                ..TraceOptions::default()
            },
        );
    }
});
