//! Answers that hold in the steady state: warm hit ratios (from the moment
//! a cache first became full), first-touch (compulsory) misses, runs that
//! stop when the warm figures converge, notes for caches that never filled,
//! and fio's `number_ios` rule.

use tiercache_policy::PolicyConfig;
use tiercache_sim::simulate::IterSource;
use tiercache_sim::*;
use tiercache_types::{Access, AdmissionKind, ReplacementKind, Time};

fn lru() -> PolicyConfig {
    PolicyConfig {
        replacement: ReplacementKind::Lru,
        admission: AdmissionKind::Always,
        ..PolicyConfig::default()
    }
}

fn reads(blocks: &[u64]) -> Vec<Request> {
    blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| Request {
            time: Time(i as u64),
            offset: b * 4096,
            len: 4096,
            access: Access::Read,
        })
        .collect()
}

fn spec(cache_blocks: u64) -> SimSpec {
    SimSpec {
        cache_sizes: vec![cache_blocks * 4096],
        policies: vec![lru()],
        sequential_cutoff: 0,
        threads: 1,
        ..SimSpec::default()
    }
}

fn sim(blocks: &[u64], spec: &SimSpec) -> SimReport {
    simulate(
        &mut IterSource(reads(blocks).into_iter()),
        "t",
        spec,
        &|_| {},
    )
    .unwrap()
}

/// Blocks 0..10 once (cold), then 0..4 a hundred times, through a 4-block
/// LRU: the cache fills at the 4th request; the next 6 are first touches;
/// the loop then misses 4 times (those blocks were evicted) and hits 396.
#[test]
fn warm_figures_and_first_touch_misses_are_exact_on_a_small_trace() {
    let mut blocks: Vec<u64> = (0..10).collect();
    for _ in 0..100 {
        blocks.extend(0..4);
    }
    let r = sim(&blocks, &spec(4));
    let c = &r.configs[0];
    assert_eq!(c.counters.read_misses, 14);
    assert_eq!(c.first_touch_misses, 10);
    let w = c.warm.expect("the cache filled");
    assert_eq!(w.filled_at_request, 4);
    assert_eq!((w.block_refs, w.hits, w.first_touch_misses), (406, 396, 6));
    assert!((w.hit_ratio - 396.0 / 406.0).abs() < 1e-12);
    assert!((c.read_hit_ratio - 396.0 / 410.0).abs() < 1e-12);
    // OPT (bypass): fills with 0..4 and keeps them; 4..10 bypass.
    let o = &r.opt[0];
    assert_eq!((o.misses, o.first_touch_misses), (10, 10));
    let ow = o.warm.expect("OPT's cache filled");
    assert_eq!(
        (
            ow.filled_at_request,
            ow.block_refs,
            ow.hits,
            ow.first_touch_misses
        ),
        (4, 406, 400, 6)
    );
    let table = render_table(&r);
    assert!(table.contains("warm hit"), "{table}");
    assert!(table.contains("first-touch misses"), "{table}");
    assert!(table.contains("97.54%"), "warm LRU figure in:\n{table}");
    assert!(!table.contains("never filled"), "{table}");
    let json = to_json(&r);
    assert!(json.contains("\"first_touch_misses\": 10"), "{json}");
    assert!(json.contains("\"filled_at_request\": 4"), "{json}");
}

/// On a zipf workload whose footprint is far larger than the cache, the
/// whole-run hit ratio carries the cold start; the warm one does not.
#[test]
fn warm_and_whole_run_differ_on_zipf() {
    let w = Workload {
        distribution: "zipf:1.2".parse().unwrap(),
        size: 200_000 * 4096,
        jobs: 1,
        ios: 1_000_000,
        ..Workload::default()
    };
    let s = SimSpec {
        cache_sizes: vec![50_000 * 4096],
        policies: vec![lru()],
        opt: None,
        mrc: None,
        ..SimSpec::default()
    };
    let r = run(&Input::Workload(w), &s, &|_| {}).unwrap();
    let c = &r.configs[0];
    let warm = c.warm.expect("filled").hit_ratio;
    assert!(
        warm > c.read_hit_ratio + 0.005,
        "warm {warm} whole {}",
        c.read_hit_ratio
    );
    assert_eq!(c.first_touch_misses, r.trace.unique_blocks.unwrap());
}

#[test]
fn a_cache_that_never_fills_gets_a_note() {
    let blocks: Vec<u64> = (0..10).chain(0..10).collect();
    let r = sim(&blocks, &spec(256));
    assert_eq!(r.configs[0].warm, None);
    assert_eq!(r.opt[0].warm, None);
    assert!(
        r.notes.iter().any(|n| n
            .starts_with("1 MiB: cache never filled: the input touches only 10 of its 256 blocks")
            && n.contains("cold-start")),
        "{:?}",
        r.notes
    );
    let table = render_table(&r);
    assert!(table.contains("note: 1 MiB: cache never filled"), "{table}");
    // Every miss was a first touch.
    assert!(table.contains("10 (100%)"), "{table}");
}

fn zipf_bounded(blocks: u64, ios: u64) -> Workload {
    Workload {
        distribution: "zipf:1.2".parse().unwrap(),
        size: blocks * 4096,
        jobs: 1,
        ios,
        ..Workload::default()
    }
}

fn converging(cache_blocks: u64, c: Convergence) -> SimSpec {
    SimSpec {
        cache_sizes: vec![cache_blocks * 4096],
        policies: vec![lru(), parse_policy("s3fifo").unwrap()],
        opt: None,
        mrc: None,
        converge: Some(c),
        ..SimSpec::default()
    }
}

#[test]
fn a_synthetic_run_stops_when_the_warm_hit_ratio_converges() {
    let c = Convergence {
        window: 1 << 17,
        windows: 3,
        tolerance: 0.005,
        max_seconds: 600.0,
    };
    let bound = 50_000_000;
    let r = run(
        &Input::Workload(zipf_bounded(1 << 16, bound)),
        &converging(1 << 14, c),
        &|_| {},
    )
    .unwrap();
    let cr = r.convergence.as_ref().expect("a convergence report");
    assert!(cr.converged, "{cr:?}");
    assert_eq!(cr.stopped_by, "converged");
    assert!(r.trace.requests < bound);
    assert_eq!(r.trace.requests.checked_rem(1 << 17), Some(0));
    assert_eq!(cr.requests, r.trace.requests);
    for cfg in &r.configs {
        let warm = cfg.warm.unwrap().hit_ratio;
        assert_eq!(cfg.window_hit_ratios.len(), 3);
        for w in &cfg.window_hit_ratios {
            assert!((w - warm).abs() <= 0.005, "{w} vs {warm}");
        }
    }
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with("steady state: converged after")),
        "{:?}",
        r.notes
    );
    // Without the rule the same input runs to its IO bound.
    let w = zipf_bounded(1 << 16, 3 << 20);
    let full = run(&Input::Workload(w), &converging(1 << 14, c), &|_| {}).unwrap();
    assert!(full.trace.requests <= 3 << 20);
}

#[test]
fn a_run_that_does_not_converge_says_so() {
    // Uniform over 4M blocks, 1M IOs: a 2M-block cache never fills.
    let w = Workload {
        distribution: Distribution::Uniform,
        randommap: false,
        ..zipf_bounded(4 << 20, 1 << 20)
    };
    let c = Convergence {
        window: 1 << 17,
        ..Convergence::default()
    };
    let r = run(
        &Input::Workload(w.clone()),
        &converging(2 << 20, c),
        &|_| {},
    )
    .unwrap();
    let cr = r.convergence.as_ref().unwrap();
    assert!(!cr.converged);
    assert_eq!(cr.stopped_by, "end of input");
    assert_eq!(r.trace.requests, 1 << 20);
    let table = render_table(&r);
    assert!(
        table.contains("note: NOT CONVERGED: stopped by the IO bound after 1.05M requests"),
        "{table}"
    );
    assert!(table.contains("8 GiB lru+always"), "{table}");
    assert!(table.contains("cache never filled"), "{table}");
    // The time bound: stop after the first chunk.
    let c = Convergence {
        max_seconds: 0.0,
        ..c
    };
    let r = run(&Input::Workload(w), &converging(2 << 20, c), &|_| {}).unwrap();
    let cr = r.convergence.as_ref().unwrap();
    assert_eq!(
        (cr.converged, cr.stopped_by.as_str()),
        (false, "time bound")
    );
    assert_eq!(r.trace.requests, simulate::CHUNK as u64);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("stopped by the time bound")),
        "{:?}",
        r.notes
    );
}

/// A trace is replayed whole even when the spec carries a convergence rule.
#[test]
fn traces_ignore_the_convergence_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let mut text = String::new();
    for i in 0..1000u64 {
        text.push_str(&format!(
            "{},hm,0,Read,{},4096,100\n",
            128166372003061629u64 + i * 10_000,
            (i % 7) * 4096
        ));
    }
    std::fs::write(&path, text).unwrap();
    let r = run(
        &Input::Trace {
            path,
            options: TraceOptions::default(),
        },
        &converging(256, Convergence::default()),
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.trace.requests, 1000);
    assert!(r.convergence.is_none());
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("cache never filled: the input touches only 7 of its 256 blocks")),
        "{:?}",
        r.notes
    );
}

/// fio: `number_ios` never extends a job past `size`.
#[test]
fn fio_number_ios_only_stops_a_job_early() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("j.fio");
    let s = SimSpec {
        cache_sizes: vec![1 << 20],
        policies: vec![lru()],
        opt: None,
        mrc: None,
        converge: Some(Convergence::default()),
        ..SimSpec::default()
    };
    let go = |text: &str| {
        std::fs::write(&job, text).unwrap();
        run(
            &Input::FioJob {
                path: job.clone(),
                section: None,
                ios: None,
            },
            &s,
            &|_| {},
        )
        .unwrap()
    };
    let base = "[j]\nrw=randread\nbs=4k\nsize=128m\nnumjobs=2\n";
    let r = go(&format!("{base}number_ios=150000\n"));
    assert_eq!(r.trace.requests, 2 * 32_768);
    assert!(r.convergence.is_none(), "a sized job runs as fio would");
    assert_eq!(go(&format!("{base}number_ios=1000\n")).trace.requests, 2000);
    assert_eq!(
        go(&format!("{base}loops=2\n")).trace.requests,
        2 * 2 * 32_768
    );
}
