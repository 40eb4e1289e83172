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
