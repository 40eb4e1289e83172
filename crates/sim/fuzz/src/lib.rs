//! Shared driver of the trace-reader fuzz targets.
//!
//! Contract checked for every input: opening and reading never panics, never
//! hangs, and uses memory bounded by the reader's own limits; errors are fine.
//! Beyond that, the yielded requests must satisfy the reader's documented
//! invariants (see `tiercache_sim::trace`).

use tiercache_sim::trace::{VolumeMode, VOLUME_SHIFT};
use tiercache_sim::{TraceFormat, TraceOptions, TraceReader};

/// Opens `data` as a trace in `format` (`None`: detect, as the CLI does)
/// with default options otherwise, and reads every record.
pub fn read_trace(data: &[u8], format: Option<TraceFormat>) {
    read_trace_with(
        data,
        TraceOptions {
            format,
            ..TraceOptions::default()
        },
    )
}

/// Like [`read_trace`] with explicit options.
pub fn read_trace_with(data: &[u8], opts: TraceOptions) {
    let Ok(mut reader) = TraceReader::new(std::io::Cursor::new(data.to_vec()), "fuzz", &opts)
    else {
        return;
    };
    let mut count = 0u64;
    let mut time_is_counter = true;
    let mut max_volume = None;
    for item in reader.by_ref() {
        let Ok(request) = item else {
            break;
        };
        time_is_counter &= request.time.0 == count;
        max_volume = max_volume.max(Some(request.offset >> VOLUME_SHIFT));
        count += 1;
    }
    // An error (or the end) is final.
    assert!(reader.next().is_none(), "reader yielded after its end");
    let volumes = reader.volumes().len() as u64;
    // Formats whose records name a volume (a generic CSV mapping may not;
    // the binary formats never do and may use the whole 64-bit range).
    let named_volumes = !matches!(
        reader.format(),
        TraceFormat::Csv(_) | TraceFormat::Vscsi | TraceFormat::OracleGeneral(_)
    );
    if named_volumes && opts.volumes == VolumeMode::Separate {
        // The i-th volume seen starts at i << VOLUME_SHIFT.
        if let Some(v) = max_volume {
            assert!(v < volumes, "volume index {v} but {volumes} volumes");
        }
    }
    if !reader.has_timestamps() {
        assert!(
            time_is_counter,
            "no timestamps, yet time is not the IO counter"
        );
    }
}
