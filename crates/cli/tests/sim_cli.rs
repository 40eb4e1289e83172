//! `tiercache sim` end to end: a synthetic workload and a fio iolog trace,
//! table on stdout, JSON and PNG files.

use std::process::Command;

fn sim(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .arg("sim")
        .args(args)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn synthetic_workload_gives_table_json_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let png = dir.path().join("r.png");
    let (out, err, ok) = sim(&[
        "--workload",
        "zipf:1.2",
        "--size",
        "64M",
        "--ios",
        "200000",
        "--cache-sizes",
        "1M,8M,64M",
        "--policies",
        "smq+hotspot,lru+always",
        "--json",
        json.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for needle in [
        "smq+hotspot",
        "lru+always",
        "OPT",
        "LRU (MRC)",
        "1 MiB",
        "64 MiB",
    ] {
        assert!(out.contains(needle), "missing {needle} in:\n{out}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["configs"].as_array().expect("configs array");
    assert_eq!(results.len(), 6, "2 policies x 3 sizes");
    // A bigger cache never hits less (LRU is a stack algorithm).
    let lru: Vec<f64> = results
        .iter()
        .filter(|r| r["policy"] == "lru+always")
        .map(|r| r["read_hit_ratio"].as_f64().unwrap())
        .collect();
    assert!(lru.windows(2).all(|w| w[0] <= w[1]), "{lru:?}");
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn fio_iolog_trace_is_replayed_and_bad_input_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.iolog");
    let mut text = String::from("fio version 2 iolog\n/dev/x add\n/dev/x open\n");
    for i in 0..2000u64 {
        text.push_str(&format!("/dev/x read {} 4096\n", (i % 100) * 4096));
    }
    std::fs::write(&trace, &text).unwrap();
    let (out, err, ok) = sim(&[
        "--trace",
        trace.to_str().unwrap(),
        "--cache-sizes",
        "1M",
        "--policies",
        "lru+always",
    ]);
    assert!(ok, "{err}");
    // 100 distinct blocks read 20 times each: 95% hits once warm.
    assert!(out.contains("95.00%"), "{out}");
    std::fs::write(&trace, "fio version 2 iolog\n/dev/x read banana 4096\n").unwrap();
    let (_, err, ok) = sim(&["--trace", trace.to_str().unwrap(), "--cache-sizes", "1M"]);
    assert!(!ok);
    assert!(err.contains("t.iolog:2") && err.contains("banana"), "{err}");
}

/// A job file of two sections: the first is simulated and the other named
/// in a note; `--fio-section` takes the other; an unknown one is refused.
#[test]
fn a_fio_job_sections_are_chosen_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("two.fio");
    std::fs::write(
        &job,
        "[global]\nrw=randread\nbs=4k\n[small]\nsize=1m\n[large]\nsize=4m\n",
    )
    .unwrap();
    let job = job.to_str().unwrap();
    let args = ["--fio-job", job, "--cache-sizes", "1M", "--no-opt"];
    let (out, err, ok) = sim(&args);
    assert!(ok, "{err}");
    assert!(out.contains("[small]") && out.contains("ios=256 "), "{out}");
    assert!(out.contains("[large] beside [small]"), "{out}");
    let (out, err, ok) = sim(&[&args[..], &["--fio-section", "large"]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("ios=1024 "), "{out}");
    let (_, err, ok) = sim(&[&args[..], &["--fio-section", "nope"]].concat());
    assert!(!ok);
    assert!(err.contains("no section [nope]"), "{err}");
}

/// `--pool`: a Tencent CBS trace of three volumes (a hot loop, a
/// scanner, a small reader) replayed as one shared cache against static
/// splits; the table and the JSON (with each volume's curve) say so.
#[test]
fn a_multi_volume_trace_is_replayed_as_a_pool() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("cbs.csv");
    let json = dir.path().join("pool.json");
    let mut lines = String::new();
    let mut scan = 0u64;
    for i in 0..30_000u64 {
        // Timestamp,Offset(sectors),Size(sectors),IOType(0 read),VolumeID
        let (offset, volume) = match i % 3 {
            0 => ((i / 3) % 300 * 8, 7),
            1 => {
                scan += 1;
                (scan * 8, 8)
            }
            _ => ((i / 3) % 20 * 8, 9),
        };
        lines.push_str(&format!(
            "{},{offset},8,0,{volume}\n",
            1_538_323_200 + i / 1000
        ));
    }
    std::fs::write(&trace, lines).unwrap();
    let (out, err, ok) = sim(&[
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "tencent",
        "--cache-sizes",
        "1M,2M",
        "--policies",
        "default",
        "--sequential-cutoff",
        "0",
        "--no-opt",
        "--pool",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("best static split"), "{out}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let pool = r["pool"].as_array().expect("pool results");
    assert_eq!(pool.len(), 2);
    for p in pool {
        assert_eq!(p["volumes"], 3, "{p}");
        assert_eq!(p["curves"].as_array().unwrap().len(), 3);
        assert_eq!(p["shared_volumes"].as_array().unwrap().len(), 3);
        let refs = p["block_refs"].as_u64().unwrap();
        assert_eq!(refs, 30_000);
        for k in ["shared_hits", "best_static_hits", "equal_hits"] {
            assert!(p[k].as_u64().unwrap() <= refs, "{k}: {p}");
        }
    }
    // 2 MiB (512 blocks) holds the loop (300) and the reader (20): shared,
    // the scanner must not push them out.
    let big = &pool[1];
    let hits = big["shared_hits"].as_u64().unwrap();
    assert!(
        hits >= 18_000,
        "shared hits {hits} of 20,000 hot references"
    );
}
