//! Inputs found by the fuzz targets in crates/sim/fuzz (and by reading the
//! readers while writing them) that once panicked, hung or filled memory.
//! Each must now end in a clean error or a correct result.

use std::io::{Cursor, Write};
use tiercache_sim::trace::{BlkEvent, VolumeMode, MAX_LINE_BYTES, MAX_VOLUME_NAME_BYTES};
use tiercache_sim::{parse_fio_job, Error, Request, TraceFormat, TraceOptions, TraceReader};

fn read(data: &[u8], format: Option<TraceFormat>) -> Result<Vec<Request>, Error> {
    let opts = TraceOptions {
        format,
        ..TraceOptions::default()
    };
    TraceReader::new(Cursor::new(data.to_vec()), "t", &opts)?.collect()
}

fn parse_error_line(e: &Error) -> u64 {
    match e {
        Error::Parse { line, .. } => *line,
        other => panic!("expected a parse error, got {other}"),
    }
}

/// `count * 512` overflowed (a panic in debug builds, a wrapped length in
/// release ones).
#[test]
fn blkparse_sector_count_past_u64_is_an_error() {
    let line = b"  8,0    3        1     0.000000000   697  Q  R 0 + 36028797018963968 [x]\n";
    for event in [BlkEvent::Queue, BlkEvent::Complete] {
        let text = if event == BlkEvent::Queue {
            line.to_vec()
        } else {
            String::from_utf8_lossy(line)
                .replace(" Q ", " C ")
                .into_bytes()
        };
        let opts = TraceOptions {
            format: Some(TraceFormat::Blkparse),
            blkparse_event: event,
            ..TraceOptions::default()
        };
        let err = TraceReader::new(Cursor::new(text), "t", &opts)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        assert_eq!(parse_error_line(&err), 1);
    }
    // The largest count that fits still reads.
    let max = u64::MAX / 512;
    let text = format!("  8,0    3        1     0.000000000   697  Q  R 0 + {max} [x]\n");
    let r = read(text.as_bytes(), Some(TraceFormat::Blkparse)).unwrap();
    assert_eq!(r[0].len, max * 512);
}

/// A line without a newline was read into memory whole: a zstd frame of a
/// few hundred bytes can expand to gigabytes of one "line".
#[test]
fn endless_line_is_an_error_not_a_memory_hog() {
    let blob = vec![b'7'; 3 * MAX_LINE_BYTES];
    let packed = zstd::encode_all(&blob[..], 19).unwrap();
    assert!(packed.len() < 4096, "{} bytes", packed.len());
    for format in [
        TraceFormat::Fio,
        TraceFormat::Blkparse,
        TraceFormat::Msr,
        TraceFormat::Tencent,
        TraceFormat::Alibaba,
    ] {
        let err = read(&packed, Some(format.clone())).unwrap_err();
        assert!(
            err.to_string().contains("line longer than"),
            "{format}: {err}"
        );
        assert_eq!(parse_error_line(&err), 1, "{format}");
    }
    // Uncompressed, after good lines: the error names the long line.
    let mut text = b"0,R,0,4096,10\n0,W,4096,4096,20\n".to_vec();
    text.extend_from_slice(&blob);
    let err = read(&text, Some(TraceFormat::Alibaba)).unwrap_err();
    assert_eq!(parse_error_line(&err), 3);
}

/// The limit is on the line without its newline: a line of exactly
/// MAX_LINE_BYTES is still read.
#[test]
fn line_of_exactly_the_limit_is_read() {
    let mut text = b"#".to_vec();
    text.resize(MAX_LINE_BYTES, b'x');
    text.extend_from_slice(b"\n0,R,0,4096,10\n");
    let r = read(&text, Some(TraceFormat::Alibaba)).unwrap();
    assert_eq!(r.len(), 1);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&text).unwrap();
    let r = read(&gz.finish().unwrap(), Some(TraceFormat::Alibaba)).unwrap();
    assert_eq!(r.len(), 1);
}

/// `numjobs` was cast to u32: 4294967297 silently became 1, and a large
/// count made a generator per job (gigabytes) when the workload started.
#[test]
fn fio_job_numjobs_over_fios_limit_is_an_error() {
    for n in ["4097", "4294967297", "1000000000"] {
        let text = format!("[j]\nrw=randread\nbs=4k\nsize=1m\nnumjobs={n}\n");
        let err = parse_fio_job(&text, None).unwrap_err();
        assert!(err.to_string().starts_with("job file:5: numjobs="), "{err}");
    }
    let ok = parse_fio_job("[j]\nbs=4k\nsize=1m\nnumjobs=4096\n", None).unwrap();
    assert_eq!(ok.workload.jobs, 4096);
}

/// `time_based` multiplied the pass length by 10 without overflow checks.
#[test]
fn fio_job_time_based_pass_count_saturates() {
    let text = "[j]\nrw=randread\nbs=1\nsize=18446744073709551615\ntime_based\n";
    let job = parse_fio_job(text, None).unwrap();
    assert_eq!(job.workload.ios, u64::MAX);
}

/// Volume names were kept whatever their length: 16384 volumes of a 1 MiB
/// name each (a few KiB of zstd) would take 16 GiB.
#[test]
fn overlong_volume_name_is_an_error_where_names_are_kept() {
    let long = "v".repeat(MAX_VOLUME_NAME_BYTES + 1);
    let text = format!("fio version 2 iolog\n/dev/a read 0 4096\n{long} read 0 4096\n");
    let err = read(text.as_bytes(), Some(TraceFormat::Fio)).unwrap_err();
    assert!(err.to_string().contains("volume name longer than"), "{err}");
    assert_eq!(parse_error_line(&err), 3);
    // At the limit it is kept; merged or filtered, names are not stored.
    let ok = format!("fio version 2 iolog\n{} read 0 4096\n", &long[1..]);
    assert_eq!(
        read(ok.as_bytes(), Some(TraceFormat::Fio)).unwrap().len(),
        1
    );
    for volumes in [VolumeMode::Merge, VolumeMode::Only(long.clone())] {
        let opts = TraceOptions {
            format: Some(TraceFormat::Fio),
            volumes,
            ..TraceOptions::default()
        };
        let r: Vec<Request> = TraceReader::new(Cursor::new(text.clone().into_bytes()), "t", &opts)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(!r.is_empty());
    }
}
