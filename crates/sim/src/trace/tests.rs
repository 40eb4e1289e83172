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
fn reads_gzip_zstd_and_bzip2_by_magic_bytes() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(FIO_V2.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let zs = zstd::encode_all(FIO_V2.as_bytes(), 1).unwrap();
    let plain = read_all(FIO_V2.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(read_all(&gz, &TraceOptions::default()).unwrap(), plain);
    assert_eq!(read_all(&zs, &TraceOptions::default()).unwrap(), plain);
    // bzip2, as two concatenated streams (as `cat a.bz2 b.bz2` makes):
    // both are read.
    let (head, tail) = FIO_V2.split_at(FIO_V2.find("\n").unwrap() + 1);
    let mut bz = Vec::new();
    for part in [head, tail] {
        let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        e.write_all(part.as_bytes()).unwrap();
        bz.extend(e.finish().unwrap());
    }
    assert!(bz.starts_with(b"BZh"));
    assert_eq!(read_all(&bz, &TraceOptions::default()).unwrap(), plain);
    // A truncated stream is an error, not a short trace.
    assert!(read_all(&bz[..bz.len() / 2], &TraceOptions::default()).is_err());

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
        TraceFormat::Spc,
        TraceFormat::Vscsi,
        TraceFormat::OracleGeneral(1),
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

/// One VSCSI1 record (32 bytes).
fn vscsi1(cmd: u16, len: u32, lbn: u64, ts_us: u64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&9u32.to_le_bytes()); // sn
    r.extend_from_slice(&len.to_le_bytes());
    r.extend_from_slice(&1u32.to_le_bytes()); // nSG
    r.extend_from_slice(&cmd.to_le_bytes());
    r.extend_from_slice(&0x0100u16.to_le_bytes()); // ver: 1 << 8
    r.extend_from_slice(&lbn.to_le_bytes());
    r.extend_from_slice(&ts_us.to_le_bytes());
    assert_eq!(r.len(), 32);
    r
}

/// One VSCSI2 record (40 bytes).
fn vscsi2(cmd: u16, len: u32, lbn: u64, ts_us: u64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&cmd.to_le_bytes());
    r.extend_from_slice(&0x0200u16.to_le_bytes()); // ver: 2 << 8
    r.extend_from_slice(&9u32.to_le_bytes()); // sn
    r.extend_from_slice(&len.to_le_bytes());
    r.extend_from_slice(&1u32.to_le_bytes()); // nSG
    r.extend_from_slice(&lbn.to_le_bytes());
    r.extend_from_slice(&ts_us.to_le_bytes());
    r.extend_from_slice(&250u64.to_le_bytes()); // rt
    assert_eq!(r.len(), 40);
    r
}

/// One oracleGeneral record (24 bytes).
fn oracle(clock_s: u32, obj_id: u64, size: u32, next: i64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&clock_s.to_le_bytes());
    r.extend_from_slice(&obj_id.to_le_bytes());
    r.extend_from_slice(&size.to_le_bytes());
    r.extend_from_slice(&next.to_le_bytes());
    assert_eq!(r.len(), 24);
    r
}

fn with_format(f: &str) -> TraceOptions {
    TraceOptions {
        format: Some(f.parse().unwrap()),
        ..Default::default()
    }
}

#[test]
fn vscsi_both_versions_sectors_bytes_and_scsi_commands() {
    let want = vec![
        req(0, 8 * 512, 4096, Access::Read),
        req(1_500_000_000, 0, 512, Access::Write),
    ];
    for rec in [vscsi1, vscsi2] {
        let mut t = rec(0x28, 4096, 8, 1_000_000);
        t.extend(rec(0x35, 0, 0, 1_000_100)); // SYNCHRONIZE CACHE: skipped
        t.extend(rec(0x2a, 512, 0, 2_500_000));
        assert_eq!(read_all(&t, &with_format("vscsi")).unwrap(), want);
        // Detected without a format name, compressed or not.
        assert_eq!(read_all(&t, &TraceOptions::default()).unwrap(), want);
        let zs = zstd::encode_all(&t[..], 1).unwrap();
        let r = TraceReader::new(std::io::Cursor::new(zs), "t", &TraceOptions::default()).unwrap();
        assert_eq!(r.format(), &TraceFormat::Vscsi);
        assert_eq!(r.collect::<Result<Vec<_>>>().unwrap(), want);
    }
    // Every data-moving SCSI opcode.
    let mut t = Vec::new();
    for cmd in [
        0x08, 0x28, 0xa8, 0x88, 0x0a, 0x2a, 0xaa, 0x8a, 0x2e, 0xae, 0x8e,
    ] {
        t.extend(vscsi1(cmd, 512, 1, 5));
    }
    let r = read_all(&t, &with_format("vscsi")).unwrap();
    let reads = r.iter().filter(|r| r.access == Access::Read).count();
    assert_eq!((reads, r.len()), (4, 11));
    // Empty input: an empty trace.
    assert!(read_all(b"", &with_format("vscsi")).unwrap().is_empty());
}

#[test]
fn vscsi_errors_name_the_record_and_its_byte() {
    let mut t = vscsi1(0x28, 4096, 8, 1);
    t.extend(vscsi1(0x28, 4096, 16, 2));
    t.extend(&vscsi1(0x28, 4096, 24, 3)[..20]);
    let err = read_all(&t, &with_format("vscsi")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "t: record 3 (byte 64): truncated: the last record has 20 of its 32 bytes"
    );
    assert!(matches!(
        err,
        Error::Record {
            record: 3,
            byte: 64,
            ..
        }
    ));
    // A version byte that is neither 1 nor 2.
    let mut t = vscsi1(0x28, 4096, 8, 1);
    t[15] = 3;
    let err = read_all(&t, &with_format("vscsi")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("t: record 1 (byte 0): not a vscsi trace"),
        "{err}"
    );
    let err = read_all(b"0,R,0,4096,10\n", &with_format("vscsi")).unwrap_err();
    assert!(err.to_string().contains("not a vscsi trace"), "{err}");
    // An LBA whose byte offset overflows.
    let t = vscsi2(0x28, 512, u64::MAX / 4, 1);
    let err = read_all(&t, &with_format("vscsi")).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn oracle_general_units_zstd_and_truncation() {
    let mut t = oracle(100, 4096, 4096, 2);
    t.extend(oracle(101, 0, 8192, -1));
    t.extend(oracle(103, 4096, 4096, -1));
    let want = vec![
        req(0, 4096, 4096, Access::Read),
        req(1_000_000_000, 0, 8192, Access::Read),
        req(3_000_000_000, 4096, 4096, Access::Read),
    ];
    assert_eq!(read_all(&t, &with_format("oracleGeneral")).unwrap(), want);
    let zs = zstd::encode_all(&t[..], 3).unwrap();
    assert_eq!(read_all(&zs, &with_format("oracleGeneral")).unwrap(), want);
    let sectors = read_all(&t, &with_format("oracleGeneral:sector")).unwrap();
    assert_eq!(sectors[0].offset, 4096 * 512);
    assert_eq!(sectors[0].len, 4096);
    let blocks = read_all(&t, &with_format("oraclegeneral:block:4k")).unwrap();
    assert_eq!(blocks[0].offset, 4096 * 4096);

    t.extend(&oracle(104, 1, 1, 1)[..23]);
    let err = read_all(&t, &with_format("oracleGeneral")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "t: record 4 (byte 72): truncated: the last record has 23 of its 24 bytes"
    );
    let t = oracle(1, u64::MAX, 512, -1);
    let err = read_all(&t, &with_format("oracleGeneral:sector")).unwrap_err();
    assert!(
        err.to_string().starts_with("t: record 1 (byte 0): obj_id"),
        "{err}"
    );
    // Without a format name: not mistaken for anything.
    let t = oracle(1, 1, 512, -1);
    assert!(read_all(&t, &TraceOptions::default()).is_err());
}

const SPC: &str = "0,20941264,8192,W,0.551706
1,20939840,4096,r,0.554041
0,8,512,R,1.5,extra,fields
";

#[test]
fn spc_sectors_bytes_seconds_and_one_volume_per_asu() {
    let r = read_all(SPC.as_bytes(), &TraceOptions::default()).unwrap();
    assert_eq!(
        r,
        vec![
            req(0, 20941264 * 512, 8192, Access::Write),
            req(
                2_335_000,
                (1 << VOLUME_SHIFT) | (20939840 * 512),
                4096,
                Access::Read
            ),
            req(948_294_000, 8 * 512, 512, Access::Read),
        ]
    );
    let only = read_all(
        SPC.as_bytes(),
        &TraceOptions {
            format: Some(TraceFormat::Spc),
            volumes: VolumeMode::Only("1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(only, vec![req(0, 20939840 * 512, 4096, Access::Read)]);

    for (bad, msg) in [
        (
            "0,1,512,R,0.1\n0,1,512,X,0.2\n",
            "t:2: Opcode 'X' is neither r nor w",
        ),
        ("0,1,512,R\n", "t:1: expected 5 comma-separated fields"),
        ("0,1,512,R,-1\n", "t:1: Timestamp '-1'"),
        ("0,x,512,R,1\n", "t:1: LBA 'x'"),
        ("a,1,512,R,1\n", "t:1: ASU 'a'"),
    ] {
        let err = read_all(bad.as_bytes(), &with_format("spc")).unwrap_err();
        assert!(err.to_string().starts_with(msg), "{bad:?}: {err}");
    }
}

#[test]
fn csv_offset_and_length_units_apart() {
    let m: CsvMapping = "offset=1,len=2,offset_unit=512,len_unit=1".parse().unwrap();
    assert_eq!((m.offset_unit, m.len_unit), (512, 1));
    assert_eq!(m.to_string().parse::<CsvMapping>().unwrap(), m);
    assert!(
        m.to_string().contains("offset_unit=sector,len_unit=byte"),
        "{m}"
    );
    let opts = TraceOptions {
        format: Some(TraceFormat::Csv(m)),
        ..Default::default()
    };
    let r = read_all(b"x,8,4096\n", &opts).unwrap();
    assert_eq!(r, vec![req(0, 4096, 4096, Access::Read)]);
    // The old spellings, and later keys overriding earlier ones.
    for (text, o, l) in [
        ("offset=0,len=1,unit=sector", 512, 512),
        ("offset=0,len=1,unit=512", 512, 512),
        ("offset=0,len=1,unit=block:4096", 4096, 4096),
        ("offset=0,len=1,unit=sector,len_unit=byte", 512, 1),
        ("offset=0,len=1,len_unit=4k", 1, 4096),
        ("offset=0,len=1,offset_unit=block:8k", 8192, 1),
    ] {
        let m: CsvMapping = text.parse().unwrap();
        assert_eq!((m.offset_unit, m.len_unit), (o, l), "{text}");
        assert_eq!(m.to_string().parse::<CsvMapping>().unwrap(), m, "{text}");
    }
    for bad in [
        "offset=0,len=1,offset_unit=0",
        "offset=0,len=1,len_unit=parsec",
    ] {
        assert!(bad.parse::<CsvMapping>().is_err(), "{bad}");
    }
}

#[test]
fn format_names_round_trip() {
    for name in [
        "fio",
        "blkparse",
        "msr",
        "tencent",
        "alibaba",
        "spc",
        "vscsi",
        "oracleGeneral",
        "oracleGeneral:sector",
        "oracleGeneral:block:4096",
        "csv:offset=1,len=2,offset_unit=sector,len_unit=byte",
    ] {
        let f: TraceFormat = name.parse().unwrap();
        assert_eq!(f.to_string().parse::<TraceFormat>().unwrap(), f, "{name}");
    }
    assert_eq!(
        "ORACLEGENERAL:512".parse::<TraceFormat>().unwrap(),
        TraceFormat::OracleGeneral(512)
    );
    assert!("oracleGeneral:furlong".parse::<TraceFormat>().is_err());
    assert!("oracleGeneral:0".parse::<TraceFormat>().is_err());
    assert_eq!(
        detect_format("0,20941264,8192,W,0.551706\n1,20939840,4096,r,0.554041\n"),
        Some(TraceFormat::Spc)
    );
}

/// Random bytes as binary traces: errors, never a panic.
#[test]
fn binary_garbage_never_panics() {
    let mut rng = crate::rng::Rng::new(78);
    for round in 0..500 {
        let len = rng.below(200) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        if round % 2 == 0 && data.len() > 16 {
            data[14] = 0; // a VSCSI1 version field
            data[15] = 1;
        }
        for f in ["vscsi", "oracleGeneral", "oracleGeneral:sector"] {
            let _ = read_all(&data, &with_format(f));
        }
        let _ = read_all(&data, &TraceOptions::default());
    }
}

#[test]
fn recorded_traces_round_trip_and_are_detected() {
    use recorded::*;
    let header = RecordedHeader {
        start_unix_ns: 1_700_000_000_000_000_000,
        block_bytes: 65536,
        sample_threshold: SAMPLE_MODULUS,
        volumes: vec![(0, "default".into()), (3, "vm3".into())],
    };
    let rq = |time_ns, volume, op, offset, len| RecordedRequest {
        time_ns,
        volume,
        op,
        offset,
        len,
    };
    let mut w = RecordedWriter::new(Vec::new(), &header).unwrap();
    for r in [
        rq(1000, 0, RecordedOp::Read, 4096, 4096),
        rq(2000, 3, RecordedOp::Write, 0, 8192),
        rq(2500, 3, RecordedOp::Trim, 0, 1 << 30),
        rq(3000, 0, RecordedOp::WriteZeroes, 1 << 40, 65536),
        rq(4000, 7, RecordedOp::Read, 512, 512),
    ] {
        w.write(&r).unwrap();
    }
    assert_eq!(w.requests(), 5);
    let bytes = w.finish(5000, 42).unwrap();
    assert!(bytes.starts_with(&ZSTD_MAGIC));
    let plain = zstd::decode_all(&bytes[..]).unwrap();
    let (back, len) = RecordedHeader::decode(&plain).unwrap();
    assert_eq!((back, len), (header, 72));
    // The end record: duration, drops, requests.
    let end = &plain[plain.len() - 24..];
    assert_eq!(le_u64(end, 0), 5000);
    assert_eq!(le_u64(end, 8), 42);
    assert_eq!(le_u64(end, 16), 5 | (255 << 56));

    // Detected without a format name; volumes apart; trims skipped.
    let mut r =
        TraceReader::new(std::io::Cursor::new(bytes), "t", &TraceOptions::default()).unwrap();
    let got: Vec<Request> = (&mut r).collect::<Result<_>>().unwrap();
    assert_eq!(r.format(), &TraceFormat::Recorded);
    assert_eq!(
        got,
        vec![
            req(0, 4096, 4096, Access::Read),
            req(1000, 1 << VOLUME_SHIFT, 8192, Access::Write),
            req(2000, 1 << 40, 65536, Access::Write),
            req(3000, (2 << VOLUME_SHIFT) | 512, 512, Access::Read),
        ]
    );
    assert_eq!(
        r.volumes(),
        vec![
            ("default".into(), 0),
            ("vm3".into(), 1),
            ("volume-7".into(), 2)
        ]
    );
    assert_eq!(
        "tiercache".parse::<TraceFormat>().unwrap(),
        TraceFormat::Recorded
    );
}

#[test]
fn sampled_runs_keep_whole_sampled_blocks_clipped_to_the_request() {
    use recorded::*;
    let t = RecordedHeader::threshold_of_rate(0.25);
    let kept = (0..100_000u64).filter(|&b| block_sampled(1, b, t)).count();
    assert!((23_000..27_000).contains(&kept), "about a quarter: {kept}");
    // A request over 64 blocks of 4 KiB, from the middle of block 0.
    let runs = sampled_runs(1, 2048, 64 * 4096, 4096, t);
    let want: Vec<u64> = (0..=64).filter(|&b| block_sampled(1, b, t)).collect();
    let covered: Vec<u64> = runs
        .iter()
        .flat_map(|&(o, l)| (o / 4096)..(o + l).div_ceil(4096))
        .collect();
    assert_eq!(covered, want);
    for &(o, l) in &runs {
        assert!(o >= 2048 && o + l <= 2048 + 64 * 4096);
    }
    assert_eq!(
        sampled_runs(1, 0, 4096, 4096, SAMPLE_MODULUS),
        vec![(0, 4096)]
    );
}
