//! End-to-end tests of the simulator: consistency between the Director,
//! OPT and the MRC; SHARDS accuracy; writeback; outputs; progress.

use std::io::Write;
use std::sync::Mutex;
use tiercache_policy::PolicyConfig;
use tiercache_sim::mrc::{mean_absolute_error, MrcBuilder, MrcMethod};
use tiercache_sim::simulate::{IterSource, MrcSpec};
use tiercache_sim::*;
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

fn lru() -> PolicyConfig {
    PolicyConfig {
        replacement: ReplacementKind::Lru,
        admission: AdmissionKind::Always,
        ..PolicyConfig::default()
    }
}

fn zipf(theta: f64, blocks: u64, ios: u64, seed: u64) -> Workload {
    Workload {
        distribution: Distribution::Zipf {
            theta,
            center: None,
        },
        size: blocks * 4096,
        jobs: 1,
        ios,
        seed,
        ..Workload::default()
    }
}

fn block_stream(w: &Workload) -> Vec<u64> {
    w.requests().unwrap().map(|r| r.offset / 4096).collect()
}

/// SHARDS stays within 0.01 mean absolute error of the exact curve, with
/// enough sampled blocks (spatial sampling error shrinks with the number of
/// distinct sampled blocks: uniform over 1M blocks at rate 0.01 samples
/// about 10k; over 100k blocks, about 1k, and the MAE is about 0.02).
#[test]
fn shards_mae_within_one_percent_on_zipf_and_uniform() {
    let uniform = Workload {
        distribution: Distribution::Uniform,
        randommap: false,
        ..zipf(1.2, 1_000_000, 3_000_000, 11)
    };
    let looped = Workload {
        distribution: Distribution::Uniform,
        ..zipf(1.2, 1_000_000, 3_000_000, 12)
    };
    for (name, w) in [
        ("zipf 1.2", zipf(1.2, 400_000, 1_500_000, 7)),
        ("zipf 0.9", zipf(0.9, 200_000, 1_500_000, 8)),
        ("uniform", uniform),
        ("uniform, random map", looped),
    ] {
        let blocks = block_stream(&w);
        let mut exact = MrcBuilder::new(MrcMethod::Exact, 1);
        let mut fixed_rate = MrcBuilder::new(MrcMethod::Shards { rate: 0.01 }, 1);
        let mut fixed_size = MrcBuilder::new(MrcMethod::ShardsFixedSize { max_blocks: 8192 }, 1);
        for &b in &blocks {
            exact.access(b);
            fixed_rate.access(b);
            fixed_size.access(b);
        }
        let exact = exact.finish();
        for m in [fixed_rate.finish(), fixed_size.finish()] {
            let mae = mean_absolute_error(&exact, &m, 500);
            eprintln!(
                "{name}: {} (rate {:.4}): MAE {mae:.4}",
                m.method.label(),
                m.sample_rate
            );
            assert!(mae < 0.01, "{name}: {} MAE {mae}", m.method.label());
            assert!(m.sample_rate < 0.5, "{name}: sampling did happen");
        }
    }
}

#[test]
fn director_lru_equals_exact_mrc_and_opt_bounds_every_policy() {
    let w = zipf(1.1, 50_000, 300_000, 3);
    let spec = SimSpec {
        sequential_cutoff: 0,
        cache_sizes: vec![1 << 20, 8 << 20, 64 << 20],
        policies: default_policies(),
        ..SimSpec::default()
    };
    let rep = run(&Input::Workload(w), &spec, &|_| {}).unwrap();
    let mrc = rep.mrc.as_ref().unwrap();
    assert_eq!(mrc.method, "exact");
    for c in &rep.configs {
        assert!(c.error.is_none(), "{}: {:?}", c.policy, c.error);
        let opt = rep
            .opt
            .iter()
            .find(|o| o.cache_bytes == c.cache_bytes)
            .unwrap();
        assert!(
            opt.miss_ratio <= c.miss_ratio + 1e-12,
            "{} at {}: OPT {} > {}",
            c.policy,
            c.cache_bytes,
            opt.miss_ratio,
            c.miss_ratio
        );
        if c.policy_config == lru() {
            let (_, m) = mrc.at_sizes.iter().find(|x| x.0 == c.cache_bytes).unwrap();
            assert!(
                (m - c.miss_ratio).abs() < 1e-12,
                "LRU {} vs MRC {m}",
                c.miss_ratio
            );
        }
        // Latencies are ordered and IOPS positive.
        let l = &c.latency;
        assert!(
            l.p50_us <= l.p90_us
                && l.p90_us <= l.p99_us
                && l.p99_us <= l.p999_us
                && l.p999_us <= l.max_us
        );
        assert!(c.iops > 0.0);
    }
    // Bigger caches miss less (LRU is a stack algorithm).
    let lru_ratios: Vec<f64> = rep
        .configs
        .iter()
        .filter(|c| c.policy_config == lru())
        .map(|c| c.miss_ratio)
        .collect();
    assert!(
        lru_ratios.windows(2).all(|w| w[1] <= w[0]),
        "{lru_ratios:?}"
    );
}

#[test]
fn one_thread_and_many_agree() {
    let w = Workload {
        rwmixread: 70,
        sequential_share: 0.2,
        sequential_run: 1 << 20,
        ..zipf(1.2, 20_000, 200_000, 5)
    };
    let mut spec = SimSpec {
        cache_sizes: vec![4 << 20, 16 << 20],
        mode: CacheMode::WriteBack,
        threads: 1,
        ..SimSpec::default()
    };
    let a = run(&Input::Workload(w.clone()), &spec, &|_| {}).unwrap();
    spec.threads = 3;
    let b = run(&Input::Workload(w), &spec, &|_| {}).unwrap();
    assert_eq!(a.configs, b.configs);
    assert_eq!(a.opt, b.opt);
    assert_eq!(a.trace, b.trace);
}

#[test]
fn writeback_cleaner_paces_like_the_engine() {
    let w = Workload {
        rwmixread: 30,
        ..zipf(0.9, 50_000, 200_000, 9)
    };
    let cache = 8 << 20; // 2048 blocks
    let mut spec = SimSpec {
        mode: CacheMode::WriteBack,
        cache_sizes: vec![cache],
        policies: vec![lru()],
        opt: None,
        mrc: None,
        ..SimSpec::default()
    };
    // The engine's PI controller on modelled time writes back, gently.
    let rep = run(&Input::Workload(w.clone()), &spec, &|_| {}).unwrap();
    let c = &rep.configs[0];
    assert!(c.cleaner_writebacks > 0);
    assert_eq!(c.counters.writebacks, c.cleaner_writebacks);
    assert!(c.write_hit_ratio > 0.0);

    spec.cleaner = None;
    let rep = run(&Input::Workload(w), &spec, &|_| {}).unwrap();
    let c = &rep.configs[0];
    assert_eq!(c.counters.writebacks, 0);
    assert_eq!(
        c.counters.dirty, 2048,
        "without a cleaner the cache fills with dirty blocks"
    );
    assert!(rep.notes.iter().any(|n| n.contains("without a cleaner")));
}

/// A timestamped trace: a burst of writes fills the cache with dirty
/// blocks; in an idle gap the cleaner writes back at full speed, as much
/// as the backing device can take in the gap (the engine's cleaner does
/// when the devices are idle; neighbours merge into one write), and one
/// right after the burst finds them still dirty.
#[test]
fn an_idle_gap_in_a_timestamped_trace_cleans_what_the_backing_device_can_write_in_it() {
    struct Timed(std::vec::IntoIter<Request>);
    impl RequestSource for Timed {
        fn next_request(&mut self) -> Option<Result<Request>> {
            self.0.next().map(Ok)
        }
        fn has_timestamps(&self) -> bool {
            true
        }
    }
    let spec = SimSpec {
        mode: CacheMode::WriteBack,
        cache_sizes: vec![4 << 20], // 1024 blocks
        policies: vec![lru()],
        opt: None,
        mrc: None,
        sequential_cutoff: 0,
        ..SimSpec::default()
    };
    // The default backing device is the `hdd` preset: 400 IOPS, so a
    // one-block write keeps it busy 2.5 ms.
    let dirty_after = |stride: u64, gap_ns: u64| {
        let mut reqs: Vec<Request> = (0..3000u64)
            .map(|i| Request {
                time: tiercache_types::Time(i * 10_000),
                offset: i * stride * 4096,
                len: 4096,
                access: tiercache_types::Access::Write,
            })
            .collect();
        reqs.push(Request {
            time: tiercache_types::Time(3000 * 10_000 + gap_ns),
            offset: 0,
            len: 4096,
            access: tiercache_types::Access::Read,
        });
        let rep = simulate(&mut Timed(reqs.into_iter()), "burst", &spec, &|_| {}).unwrap();
        rep.configs[0].counters.dirty
    };
    // Scattered blocks, one write each: 1024 take 2.56 s, after the
    // cleaner's 500 ms wait for idleness.
    assert_eq!(
        dirty_after(7, 3_100_000_000),
        0,
        "3.1 s idle: all written back"
    );
    let left = dirty_after(7, 1_500_000_000);
    assert!(
        (600..=640).contains(&left),
        "1.5 s idle: 400 written back, {left} left"
    );
    assert!(dirty_after(7, 1_000_000) > 900, "1 ms later: still dirty");
    // Neighbours: 4 MiB runs, 1 s is plenty.
    assert_eq!(dirty_after(1, 1_000_000_000), 0, "1 s idle, one run");
}

#[test]
fn bad_configurations_are_reported_not_fatal() {
    let spec = SimSpec {
        cache_sizes: vec![1000, 1 << 20],
        policies: vec![lru()],
        ..SimSpec::default()
    };
    let reqs = (0..100u64).map(|i| Request {
        time: tiercache_types::Time(i),
        offset: (i % 10) * 4096,
        len: 4096,
        access: tiercache_types::Access::Read,
    });
    let rep = simulate(&mut IterSource(reqs), "t", &spec, &|_| {}).unwrap();
    assert!(rep.configs[0]
        .error
        .as_deref()
        .unwrap()
        .contains("0 blocks"));
    assert!(rep.configs[1].error.is_none());
    assert_eq!(rep.configs[1].counters.read_misses, 10);
    // A bad spec fails as a whole.
    let bad = SimSpec {
        block_size: 3000,
        ..spec.clone()
    };
    assert!(simulate(&mut IterSource(std::iter::empty()), "t", &bad, &|_| {}).is_err());
    let none = SimSpec {
        cache_sizes: vec![],
        ..spec
    };
    assert!(simulate(&mut IterSource(std::iter::empty()), "t", &none, &|_| {}).is_err());
}

#[test]
fn outputs_table_json_png_and_progress() {
    let dir = tempfile::tempdir().unwrap();
    let w = zipf(1.2, 10_000, 150_000, 1);
    let spec = SimSpec {
        cache_sizes: vec![2 << 20, 8 << 20],
        mrc: Some(MrcSpec {
            method: MrcMethod::Shards { rate: 0.1 },
            bucket_blocks: 1,
        }),
        ..SimSpec::default()
    };
    let seen = Mutex::new(Vec::new());
    let rep = run(&Input::Workload(w), &spec, &|p: &Progress| {
        seen.lock().unwrap().push(p.clone())
    })
    .unwrap();
    let seen = seen.into_inner().unwrap();
    assert!(seen.len() >= 3, "{seen:?}");
    assert_eq!(seen.last().unwrap().phase, Phase::Done);
    let fr: Vec<f64> = seen
        .iter()
        .filter(|p| p.phase == Phase::Replay)
        .map(|p| p.fraction.unwrap())
        .collect();
    assert!(
        fr.windows(2).all(|w| w[1] >= w[0]) && (fr.last().unwrap() - 1.0).abs() < 1e-9,
        "{fr:?}"
    );

    let paths = OutputPaths {
        json: Some(dir.path().join("r.json")),
        png: Some(dir.path().join("r.png")),
    };
    let table = write_outputs(&rep, &paths).unwrap();
    assert!(
        table.contains("OPT (bypass)")
            && table.contains("LRU (MRC)")
            && table.contains("adaptive+always"),
        "{table}"
    );
    assert!(table.contains("SHARDS rate 0.1"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(paths.json.unwrap()).unwrap()).unwrap();
    assert_eq!(json["configs"].as_array().unwrap().len(), rep.configs.len());
    assert!(json["configs"][0]["latency"]["p99_us"].as_f64().is_some());
    assert!(json["mrc"]["sample_rate"].as_f64().unwrap() <= 0.1 + 1e-9);
    let png = std::fs::read(paths.png.unwrap()).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "a plot with lines and text is not tiny");
}

#[test]
fn compressed_trace_and_fio_job_inputs() {
    let dir = tempfile::tempdir().unwrap();
    // An MSR trace, gzip-compressed, with a misleading name.
    let mut text = String::new();
    for i in 0..2000u64 {
        let ts = 128166372003061629u64 + i * 10_000; // 1 ms apart
        let op = if i % 4 == 0 { "Write" } else { "Read" };
        text.push_str(&format!(
            "{ts},hm,0,{op},{},4096,100\n",
            (i * 7 % 300) * 4096
        ));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(text.as_bytes()).unwrap();
    let path = dir.path().join("trace.csv");
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let spec = SimSpec {
        cache_sizes: vec![1 << 20],
        policies: vec![lru()],
        ..SimSpec::default()
    };
    let rep = run(
        &Input::Trace {
            path: path.clone(),
            options: TraceOptions::default(),
        },
        &spec,
        &|_| {},
    )
    .unwrap();
    assert!(rep.source.contains("(msr)"), "{}", rep.source);
    assert_eq!((rep.trace.reads, rep.trace.writes), (1500, 500));
    assert!(rep.trace.timestamps);
    assert!(
        (rep.trace.duration_s - 1.999).abs() < 1e-9,
        "{}",
        rep.trace.duration_s
    );

    let job = dir.path().join("job.fio");
    std::fs::write(&job, "[global]\nbs=4k\nsize=16m\n[j]\nrw=randrw\nrwmixread=80\nrandom_distribution=pareto:0.3\nnumber_ios=5000\nfoo=bar\n").unwrap();
    let rep = run(
        &Input::FioJob {
            path: job.clone(),
            section: None,
            ios: None,
        },
        &spec,
        &|_| {},
    )
    .unwrap();
    // number_ios=5000 cannot extend the job past size: 16m / 4k IOs, as fio.
    assert_eq!(rep.trace.requests, 4096);
    assert!(
        rep.notes.iter().any(|n| n.contains("foo")),
        "{:?}",
        rep.notes
    );
    std::fs::write(&job, "[j]\nbs=4k\nsize=16m\nrw=randread\nnumber_ios=x\n").unwrap();
    let err = run(
        &Input::FioJob {
            path: job,
            section: None,
            ios: None,
        },
        &spec,
        &|_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("job.fio:5:"), "{err}");
}

#[test]
fn cache_sizes_parse() {
    assert_eq!(
        parse_cache_sizes("1G..4G, 512M,1G").unwrap(),
        vec![512 << 20, 1 << 30, 2 << 30, 4 << 30]
    );
    assert_eq!(parse_cache_sizes("10g").unwrap(), vec![10 << 30]);
    for bad in ["", "4G..1G", "0..1G", "ten"] {
        assert!(parse_cache_sizes(bad).is_err(), "{bad}");
    }
}

#[test]
fn policies_parse() {
    assert_eq!(parse_policy("lru").unwrap(), lru());
    assert_eq!(parse_policy("default").unwrap(), PolicyConfig::default());
    let p = parse_policy("s3fifo+nhit").unwrap();
    assert_eq!(
        (p.replacement, p.admission),
        (ReplacementKind::S3Fifo, AdmissionKind::NHit)
    );
    assert!(parse_policy("mru").is_err());
    assert_eq!(policy_label(&PolicyConfig::default()), "adaptive+always");
    let all = default_policies();
    assert_eq!(all[0], PolicyConfig::default());
    assert_eq!(
        all.len(),
        ReplacementKind::ALL.len(),
        "each stack once: {all:?}"
    );
}

#[test]
fn requests_at_the_end_of_the_address_space_do_not_overflow() {
    let run = |block_size: u32, offsets: &[u64]| {
        let spec = SimSpec {
            cache_sizes: vec![1 << 20],
            block_size,
            ..SimSpec::default()
        };
        let reqs: Vec<Request> = offsets
            .iter()
            .map(|&o| Request {
                time: tiercache_types::Time(0),
                offset: o,
                len: 1 << 20,
                access: tiercache_types::Access::Write,
            })
            .collect();
        simulate(&mut IterSource(reqs.into_iter()), "edge", &spec, &|_| {})
    };
    // 64 KiB blocks: every byte offset is within 2^48 blocks.
    let rep = run(65536, &[u64::MAX - 100, u64::MAX - 8192, 0]).unwrap();
    assert_eq!(rep.trace.requests, 3);
    // 4 KiB blocks: a volume has at most 2^48 blocks (2^60 bytes); up to
    // its end is replayed, past it is an error naming the request, not
    // another volume's blocks.
    let end = tiercache_types::MAX_VOLUME_BLOCKS << 12;
    let rep = run(4096, &[end - (1 << 20), 0]).unwrap();
    assert_eq!(rep.trace.requests, 2);
    let err = run(4096, &[0, end - 4096, u64::MAX - 100])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("request 2 ") && err.contains("largest volume"),
        "{err}"
    );
}
