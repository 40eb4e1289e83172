//! Golden test against libCacheSim: miss counts of our simulator on small
//! request streams (tests/golden/*.txt) must match the numbers libCacheSim
//! produced for the same streams (tests/golden/expected.json, regenerated
//! by `scripts/regen-golden.sh`).
//!
//! Setup: 4 KiB cache blocks, one 4 KiB read per stream entry (block id *
//! 4096), writethrough, sequential bypass off, `always` admission, so that
//! each policy sees exactly libCacheSim's unit-size get() stream.
//!
//! - LRU, FIFO and SIEVE (through the Director) and Belady (our OPT, demand
//!   variant, which is libCacheSim's `Belady`) must match exactly; so must
//!   the exact LRU miss-ratio curve.
//! - ARC and S3-FIFO are the policy crate's (written in parallel with this
//!   test). When this test was written they matched libCacheSim exactly on
//!   every stream and size except S3-FIFO with 10 blocks, where
//!   libCacheSim 0.3.5 misses every request (its small FIFO holds a
//!   single object: 10% of 10) and ours does not. The assertion allows a
//!   difference of up to 2% of the requests outside that case, and prints
//!   every difference, so a change in either shows.

use serde_json::Value;
use std::path::PathBuf;
use tiercache_policy::PolicyConfig;
use tiercache_sim::simulate::MrcSpec;
use tiercache_sim::*;
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

const TOLERANCE: f64 = 0.02;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn policy(r: ReplacementKind) -> PolicyConfig {
    PolicyConfig {
        replacement: r,
        admission: AdmissionKind::Always,
        ..PolicyConfig::default()
    }
}

#[test]
fn miss_counts_match_libcachesim() {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("expected.json")).expect("expected.json"),
    )
    .expect("valid json");
    let sizes: Vec<u64> = expected["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .map(|v| v.as_u64().expect("size"))
        .collect();
    let streams = expected["streams"].as_object().expect("streams");
    assert!(streams.len() >= 4, "golden streams missing");
    let mut report = String::new();
    let mut failures = Vec::new();
    for (name, exp) in streams {
        let path = dir().join(format!("{name}.txt"));
        let options = TraceOptions {
            format: Some(
                "csv:offset=0,fixed_len=4096,unit=block:4096"
                    .parse()
                    .unwrap(),
            ),
            ..TraceOptions::default()
        };
        let input = Input::Trace { path, options };
        let spec = SimSpec {
            block_size: 4096,
            mode: CacheMode::WriteThrough,
            sequential_cutoff: 0,
            cache_sizes: sizes.iter().map(|s| s * 4096).collect(),
            policies: vec![
                policy(ReplacementKind::Lru),
                policy(ReplacementKind::Arc),
                policy(ReplacementKind::S3Fifo),
                policy(ReplacementKind::Fifo),
                policy(ReplacementKind::Sieve),
            ],
            opt: Some(OptVariant::Demand),
            mrc: Some(MrcSpec::default()),
            threads: 2,
            ..SimSpec::default()
        };
        let rep = run(&input, &spec, &|_| {}).expect("simulation runs");
        let requests = exp["requests"].as_u64().unwrap();
        assert_eq!(rep.trace.requests, requests, "{name}: stream length");
        assert_eq!(
            rep.trace.unique_blocks,
            exp["distinct"].as_u64(),
            "{name}: distinct blocks"
        );
        for &size in &sizes {
            let want = |p: &str| exp[p][size.to_string()].as_u64().unwrap();
            let ours = |r: ReplacementKind| {
                let c = rep
                    .configs
                    .iter()
                    .find(|c| c.cache_blocks as u64 == size && c.policy_config.replacement == r)
                    .expect("config ran");
                assert!(c.error.is_none(), "{:?}", c.error);
                c.counters.read_misses
            };
            // Strict: LRU, FIFO, SIEVE, Belady, the exact MRC.
            for (label, kind) in [
                ("lru", ReplacementKind::Lru),
                ("fifo", ReplacementKind::Fifo),
                ("sieve", ReplacementKind::Sieve),
            ] {
                let (a, b) = (ours(kind), want(label));
                if a != b {
                    failures.push(format!(
                        "{name} size {size}: {label} {a} != libCacheSim {b}"
                    ));
                }
            }
            let opt = rep
                .opt
                .iter()
                .find(|o| o.cache_blocks == size)
                .expect("opt")
                .misses;
            if opt != want("belady") {
                failures.push(format!(
                    "{name} size {size}: OPT {opt} != libCacheSim Belady {}",
                    want("belady")
                ));
            }
            let mrc = rep.mrc.as_ref().expect("mrc");
            let mrc_misses = mrc.full.as_ref().unwrap().miss_ratio(size) * requests as f64;
            if (mrc_misses - want("lru") as f64).abs() > 1e-6 {
                failures.push(format!(
                    "{name} size {size}: MRC {mrc_misses} != LRU {}",
                    want("lru")
                ));
            }
            // Tolerant: ARC, S3-FIFO.
            for (label, kind) in [
                ("arc", ReplacementKind::Arc),
                ("s3fifo", ReplacementKind::S3Fifo),
            ] {
                let (a, b) = (ours(kind), want(label));
                if a != b {
                    report.push_str(&format!(
                        "{name} size {size}: {label} ours {a} libCacheSim {b}\n"
                    ));
                    let known = label == "s3fifo" && size == 10;
                    if !known && (a as f64 - b as f64).abs() > TOLERANCE * requests as f64 {
                        failures.push(format!(
                            "{name} size {size}: {label} {a} vs libCacheSim {b}: more than {}% of requests apart",
                            TOLERANCE * 100.0
                        ));
                    }
                }
            }
        }
    }
    if !report.is_empty() {
        eprintln!(
            "differences from libCacheSim (within tolerance unless listed as failures):\n{report}"
        );
    }
    assert!(
        failures.is_empty(),
        "golden mismatches:\n{}",
        failures.join("\n")
    );
}
