use super::*;
use std::io::Write;

fn read_all(text: &[u8], opts: &TraceOptions) -> Result<Vec<Request>> {
    TraceReader::new(std::io::Cursor::new(text.to_vec()), "t", opts)?.collect()
}

fn req(t: u64, off: u64, len: u64, a: Access) -> Request {
    Request {
        time: Time(t),
        offset: off,
        len,
        access: a,
    }
}

const FIO_V2: &str = "fio version 2 iolog
/dev/sdb add
/dev/sdc add
/dev/sdb open
/dev/sdb read 4096 4096
/dev/sdb write 0 8192
/dev/sdb sync 0 0
/dev/sdc read 512 512
/dev/sdb trim 0 4096
/dev/sdb close
";

#[test]
fn fio_v2_counts_ios_as_time_and_separates_files() {
    let r = read_all(FIO_V2.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 4096, 4096, Access::Read),
            req(1, 0, 8192, Access::Write),
            req(2, 1 << VOLUME_SHIFT | 512, 512, Access::Read),
        ]
    );
    let merged = read_all(
        FIO_V2.as_bytes(),
        &TraceOptions {
            volumes: VolumeMode::Merge,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(merged[2].offset, 512);
    let only = read_all(
        FIO_V2.as_bytes(),
        &TraceOptions {
            volumes: VolumeMode::Only("/dev/sdc".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(only, vec![req(0, 512, 512, Access::Read)]);
}

#[test]
fn fio_v3_timestamps_are_microseconds_relative_to_the_first() {
    let text = "fio version 3 iolog\n5 f add\n7 f open\n10 f read 0 4096\n25 f write 4096 4096\n";
    let r = read_all(text.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 0, 4096, Access::Read),
            req(15_000, 4096, 4096, Access::Write)
        ]
    );
}

#[test]
fn malformed_lines_are_reported_with_their_line_number() {
    let text = "fio version 2 iolog\nf read 0 4096\nf read zero 4096\n";
    let err = read_all(text.as_bytes(), &TraceOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("t:3: offset 'zero'"), "{msg}");

    let text = "fio version 2 iolog\nf fly 0 4096\n";
    let err = read_all(text.as_bytes(), &TraceOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("t:2: unknown action 'fly'"),
        "{err}"
    );

    let opts = TraceOptions {
        format: Some(TraceFormat::Fio),
        ..Default::default()
    };
    let err = read_all(b"hello\n", &opts).unwrap_err();
    assert!(
        err.to_string().starts_with("t:1: expected the header"),
        "{err}"
    );

    let opts = TraceOptions {
        format: Some(TraceFormat::Msr),
        ..Default::default()
    };
    let err = read_all(
        b"128166372003061629,hm,0,Read,383496192,32768,4109\n1,2,3\n",
        &opts,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("t:2: expected 7 comma-separated fields"),
        "{err}"
    );
}

const BLKPARSE: &str = "  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]
  8,0    3        2     0.000001829   697  G  WS 3417048 + 8 [kjournald]
  8,0    3        3     0.000002000   697  Q   R 100 + 16 [fio]
  8,0    3        4     0.000003000   697  Q  FWS [fio]
  8,0    3        5     0.000004000   697  Q   D 100 + 16 [fio]
  8,0    1        6     0.000100000     0  C   R 100 + 16 [0]
  8,16   1        7     0.000200000   697  Q   R 8 + 8 [fio]
CPU0 (8,0):
 Reads Queued:           1,        8KiB\t Writes Queued:           1,        4KiB
Total (8,0):
";

#[test]
fn blkparse_uses_queue_events_by_default() {
    let r = read_all(BLKPARSE.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 3417048 * 512, 4096, Access::Write),
            req(2000, 100 * 512, 8192, Access::Read),
            req(200_000, (1 << VOLUME_SHIFT) + 8 * 512, 4096, Access::Read),
        ]
    );
    let c = read_all(
        BLKPARSE.as_bytes(),
        &TraceOptions {
            blkparse_event: BlkEvent::Complete,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c, vec![req(0, 100 * 512, 8192, Access::Read)]);
}

#[test]
fn blkparse_event_without_range_is_an_error() {
    let text = "  8,0    3        1     0.000000000   697  Q   R [fio]\n";
    let err = read_all(text.as_bytes(), &TraceOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("t:1: Q event with RWBS 'R' lacks"),
        "{err}"
    );
}

#[test]
fn msr_tencent_alibaba() {
    let msr = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime
128166372003061629,hm,0,Read,383496192,32768,4109
128166372003071629,hm,0,Write,4096,4096,100
128166372003081629,hm,1,Read,0,512,100
";
    let r = read_all(msr.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 383496192, 32768, Access::Read),
            req(1_000_000, 4096, 4096, Access::Write),
            req(2_000_000, 1 << VOLUME_SHIFT, 512, Access::Read),
        ]
    );
    let tencent = "1538323200,2048,8,0,1063\n1538323201,16,16,1,1063\n";
    let r = read_all(tencent.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 2048 * 512, 4096, Access::Read),
            req(1_000_000_000, 8192, 8192, Access::Write)
        ]
    );
    let ali = "0,R,8192,4096,1577808000000000\n0,W,0,512,1577808000000010\n";
    let r = read_all(ali.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 8192, 4096, Access::Read),
            req(10_000, 0, 512, Access::Write)
        ]
    );
}

#[test]
fn generic_csv_mapping() {
    let m: CsvMapping = "time=0,offset=2,len=3,op=1,op_read=R,unit=sector,time_unit=s"
        .parse()
        .unwrap();
    assert_eq!(m.to_string().parse::<CsvMapping>().unwrap(), m);
    let text = "ts,op,lba,n\n0.5,R,8,8\n1.25,W,0,1\n";
    let opts = TraceOptions {
        format: Some(TraceFormat::Csv(m)),
        ..Default::default()
    };
    let r = read_all(text.as_bytes(), &opts).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 4096, 4096, Access::Read),
            req(750_000_000, 0, 512, Access::Write)
        ]
    );

    let f: TraceFormat = "csv:offset=0,fixed_len=4k,unit=block:4096".parse().unwrap();
    let opts = TraceOptions {
        format: Some(f),
        ..Default::default()
    };
    let r = read_all(b"3\n5\n", &opts).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 3 * 4096, 4096, Access::Read),
            req(1, 5 * 4096, 4096, Access::Read)
        ]
    );

    for bad in [
        "len=1",
        "offset=x,len=1",
        "offset=0",
        "offset=0,len=1,op=2",
        "offset=0,len=1,colour=2",
    ] {
        assert!(bad.parse::<CsvMapping>().is_err(), "{bad}");
    }
    let strict: CsvMapping = "offset=0,len=1,op=2,op_read=r,op_write=w".parse().unwrap();
    let opts = TraceOptions {
        format: Some(TraceFormat::Csv(strict)),
        ..Default::default()
    };
    let err = read_all(b"0,1,r\n0,1,x\n", &opts).unwrap_err();
    assert!(err.to_string().starts_with("t:2: op 'x'"), "{err}");
}

#[test]
fn detects_formats() {
    assert_eq!(detect_format(FIO_V2), Some(TraceFormat::Fio));
    assert_eq!(detect_format(BLKPARSE), Some(TraceFormat::Blkparse));
    assert_eq!(
        detect_format("128166372003061629,hm,0,Read,383496192,32768,4109\n"),
        Some(TraceFormat::Msr)
    );
    assert_eq!(
        detect_format("1538323200,2048,8,0,1063\n"),
        Some(TraceFormat::Tencent)
    );
    assert_eq!(
        detect_format("device_id,opcode,offset,length,timestamp\n0,R,8192,4096,15\n"),
        Some(TraceFormat::Alibaba)
    );
    assert_eq!(detect_format("hello world\n1 2 3\n"), None);
    let err = read_all(b"hello world\n", &TraceOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("cannot tell the trace format"),
        "{err}"
    );
}

#[test]
fn reads_gzip_and_zstd_by_magic_bytes() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(FIO_V2.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let zs = zstd::encode_all(FIO_V2.as_bytes(), 1).unwrap();
    let plain = read_all(FIO_V2.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(read_all(&gz, &TraceOptions::default()).unwrap(), plain);
    assert_eq!(read_all(&zs, &TraceOptions::default()).unwrap(), plain);

    // Through a real file with a misleading name.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("trace.txt");
    std::fs::write(&p, &zs).unwrap();
    let r: Vec<Request> = open_trace(&p, &TraceOptions::default())
        .unwrap()
        .collect::<Result<_>>()
        .unwrap();
    assert_eq!(r, plain);
}

/// Garbage in gives errors or skipped lines, never a panic.
#[test]
fn garbage_never_panics() {
    let mut rng = crate::rng::Rng::new(77);
    let alphabet = b"0123456789,.+ \t\nRWQCDrwfio version23iolog-:#abc\xff";
    let formats = [
        TraceFormat::Fio,
        TraceFormat::Blkparse,
        TraceFormat::Msr,
        TraceFormat::Tencent,
        TraceFormat::Alibaba,
        "csv:time=0,offset=1,len=2,op=3,op_read=R,volume=4,unit=sector"
            .parse()
            .unwrap(),
    ];
    for round in 0..300 {
        let len = rng.below(400) as usize;
        let mut text: Vec<u8> = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
            .collect();
        if round % 3 == 0 {
            text.splice(0..0, b"fio version 3 iolog\n".iter().copied());
        }
        for f in &formats {
            let opts = TraceOptions {
                format: Some(f.clone()),
                ..Default::default()
            };
            let _ = read_all(&text, &opts);
        }
        let _ = read_all(&text, &TraceOptions::default());
    }
}
