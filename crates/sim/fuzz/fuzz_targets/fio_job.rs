//! Fuzzes the fio job-file parser (`parse_fio_job`), first section and a
//! section named by the first line, and the first requests of the workload
//! it yields. Contract: never panics, errors are fine; an accepted workload
//! validates and generates requests inside its files. Requests are drawn
//! only for workloads of at most 2^20 blocks over all jobs: each job's zipf
//! picker sums up to 10 million terms at start, which would make the target
//! too slow to fuzz the parser.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let named = text.lines().next().map(|l| l.trim_matches(['[', ']', ' ']));
    for section in [None, named] {
        let Ok(job) = tiercache_sim::parse_fio_job(text, section) else {
            continue;
        };
        let w = &job.workload;
        w.validate().expect("an accepted job validates");
        if w.nranges().saturating_mul(u64::from(w.jobs)) > 1 << 20 {
            continue;
        }
        let requests = w.requests().expect("an accepted job generates requests");
        for r in requests.take(64) {
            assert!(r.len > 0 && r.len <= w.block_size, "{r:?}");
            assert!(
                r.offset.saturating_add(r.len) <= w.size * u64::from(w.jobs),
                "{r:?}"
            );
        }
    }
});
