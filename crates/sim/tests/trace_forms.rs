//! One trace in every form a public dataset may come in (generic CSV with
//! sector offsets and byte lengths, SPC, libCacheSim vscsi VSCSI1 and
//! VSCSI2, oracleGeneral plain and zstd-compressed, in bytes and in
//! sectors) reads as the same requests and simulates to the same miss
//! ratios. The forms are written here from one generated request list; no
//! trace file is committed or downloaded.

use std::path::Path;
use tiercache_sim::*;

/// (second, sector, bytes): reads only (oracleGeneral has no operation),
/// whole seconds (its clock), sector-aligned offsets of 0.5 to 16 KiB over
/// 64 MiB, skewed so that caches of a few MiB hit.
fn requests() -> Vec<(u32, u64, u32)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..20_000u32)
        .map(|i| {
            let r = next();
            // Half the requests go to the first 2 MiB.
            let span = if r & 1 == 0 { 4096 } else { 131_072 };
            let sector = (r >> 8) % span;
            let len = 512 * (1 + (r >> 40) % 32) as u32;
            (i / 10, sector, len)
        })
        .collect()
}

fn write_forms(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let reqs = requests();
    let mut csv = String::from("seconds,sector,bytes,op\n");
    let mut spc = String::new();
    let (mut v1, mut v2, mut og, mut og_sectors) = (vec![], vec![], vec![], vec![]);
    for (n, &(t, sector, len)) in reqs.iter().enumerate() {
        csv += &format!("{t},{sector},{len},R\n");
        spc += &format!("0,{sector},{len},r,{t}.000000\n");
        let us = t as u64 * 1_000_000;
        // VSCSI1: sn, len, nSG, cmd, ver, lbn, ts.
        v1.extend_from_slice(&(n as u32).to_le_bytes());
        v1.extend_from_slice(&len.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&0x28u16.to_le_bytes());
        v1.extend_from_slice(&0x0100u16.to_le_bytes());
        v1.extend_from_slice(&sector.to_le_bytes());
        v1.extend_from_slice(&us.to_le_bytes());
        // VSCSI2: cmd, ver, sn, len, nSG, lbn, ts, rt.
        v2.extend_from_slice(&0x28u16.to_le_bytes());
        v2.extend_from_slice(&0x0200u16.to_le_bytes());
        v2.extend_from_slice(&(n as u32).to_le_bytes());
        v2.extend_from_slice(&len.to_le_bytes());
        v2.extend_from_slice(&1u32.to_le_bytes());
        v2.extend_from_slice(&sector.to_le_bytes());
        v2.extend_from_slice(&us.to_le_bytes());
        v2.extend_from_slice(&100u64.to_le_bytes());
        // oracleGeneral: clock_time, obj_id, obj_size, next_access_vtime.
        for (out, id) in [(&mut og, sector * 512), (&mut og_sectors, sector)] {
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(-1i64).to_le_bytes());
        }
    }
    let files: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "csv:time=0,offset=1,len=2,op=3,op_read=R,op_write=W,offset_unit=sector,\
             len_unit=byte,time_unit=s",
            "trace.csv",
            csv.into_bytes(),
        ),
        ("spc", "trace.spc", spc.into_bytes()),
        ("vscsi", "trace1.vscsi", v1),
        ("vscsi", "trace2.vscsi", v2),
        ("oracleGeneral", "trace.oracleGeneral.bin", og.clone()),
        (
            "oracleGeneral",
            "trace.oracleGeneral.bin.zst",
            zstd::encode_all(&og[..], 3).unwrap(),
        ),
        (
            "oracleGeneral:sector",
            "sectors.oracleGeneral.bin",
            og_sectors,
        ),
    ];
    files
        .into_iter()
        .map(|(format, name, data)| {
            let path = dir.join(name);
            std::fs::write(&path, data).unwrap();
            (format.to_string(), path)
        })
        .collect()
}

fn options(format: &str) -> TraceOptions {
    TraceOptions {
        format: Some(format.parse().unwrap()),
        ..TraceOptions::default()
    }
}

#[test]
fn every_form_reads_the_same_requests_and_miss_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let forms = write_forms(dir.path());
    let read = |format: &str, path: &Path| -> Vec<Request> {
        open_trace(path, &options(format))
            .unwrap()
            .collect::<Result<_>>()
            .unwrap()
    };
    let (format0, path0) = &forms[0];
    let want = read(format0, path0);
    assert_eq!(want.len(), 20_000);
    assert_eq!(want[10].time.0, 1_000_000_000);
    for (format, path) in &forms[1..] {
        assert!(read(format, path) == want, "{format} {}", path.display());
    }
    // vscsi is found without naming it.
    let detected = open_trace(&forms[2].1, &TraceOptions::default()).unwrap();
    assert_eq!(detected.format(), &TraceFormat::Vscsi);

    let spec = SimSpec {
        cache_sizes: vec![1 << 20, 4 << 20, 16 << 20],
        threads: 1,
        ..SimSpec::default()
    };
    let summary = |format: &str, path: &Path| {
        let rep = run(
            &Input::Trace {
                path: path.to_path_buf(),
                options: options(format),
            },
            &spec,
            &|_| {},
        )
        .unwrap();
        let configs: Vec<(String, u64, f64)> = rep
            .configs
            .iter()
            .map(|c| (c.policy.clone(), c.cache_bytes, c.miss_ratio))
            .collect();
        let opt: Vec<String> = rep.opt.iter().map(|o| format!("{o:?}")).collect();
        (configs, opt, rep.trace.block_refs)
    };
    let base = summary(format0, path0);
    assert!(base.0.iter().any(|c| c.2 > 0.0 && c.2 < 1.0), "{base:?}");
    for (format, path) in &forms[1..] {
        assert_eq!(summary(format, path), base, "{format} {}", path.display());
    }
}
