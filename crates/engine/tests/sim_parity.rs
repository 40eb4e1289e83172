//! The simulator and the live engine run the same decision code: over the
//! same request stream (time included) they must count exactly the same
//! hits, misses, promotions, demotions and bypasses.

use std::sync::Arc;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig};
use tiercache_policy::PolicyConfig;
use tiercache_sim::{synth::Distribution, ConfigRunner, SimSpec, Workload};
use tiercache_types::{Access, AdmissionKind, CacheMode, ManualClock, ReplacementKind};

fn parity(mode: CacheMode, policy: PolicyConfig, block_size: u32, workload: &Workload) {
    let cache_bytes = 256 * block_size as u64;
    let spec = SimSpec {
        block_size,
        mode,
        sequential_cutoff: 256 * 1024,
        cache_sizes: vec![cache_bytes],
        policies: vec![policy.clone()],
        cleaner: None,
        opt: None,
        mrc: None,
        ..SimSpec::default()
    };
    let mut sim = ConfigRunner::new(&spec, &policy, cache_bytes).unwrap();

    let data = workload.size * workload.jobs as u64;
    let backing = Arc::new(MemDevice::new(data));
    let cache = Arc::new(MemDevice::new(cache_bytes));
    let clock = Arc::new(ManualClock::default());
    let cfg = EngineConfig {
        mode,
        block_size,
        sequential_cutoff: spec.sequential_cutoff,
        policy: policy.clone(),
        ..EngineConfig::default()
    };
    let engine = Engine::new(
        backing as Arc<dyn BlockDevice>,
        cache as Arc<dyn BlockDevice>,
        &cfg,
        clock.clone(),
    )
    .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0;
    for r in workload.requests().unwrap() {
        clock.set(r.time);
        let b = &mut buf[..r.len as usize];
        match r.access {
            Access::Read => engine.read(r.offset, b).unwrap(),
            Access::Write => engine.write(r.offset, b, false).unwrap(),
        }
        sim.process(&r);
        n += 1;
    }
    assert!(n > 1000);
    let live = engine.stats().decisions;
    let simulated = sim.result(8).counters;
    assert_eq!(
        live, simulated,
        "{mode} {}+{}",
        policy.replacement, policy.admission
    );
    if mode != CacheMode::PassThrough {
        assert!(
            live.promotions > 0 && live.read_hits > 0,
            "the workload exercised the cache: {live:?}"
        );
    }
}

#[test]
fn engine_and_simulator_count_the_same() {
    let workload = Workload {
        distribution: Distribution::Zipf {
            theta: 1.2,
            center: None,
        },
        rwmixread: 70,
        sequential_share: 0.1,
        sequential_run: 512 * 1024,
        block_size: 4096,
        size: 8 << 20,
        jobs: 2,
        ios: 20_000,
        seed: 42,
        ..Workload::default()
    };
    for &mode in CacheMode::ALL {
        for &replacement in ReplacementKind::ALL {
            for &admission in AdmissionKind::ALL {
                let policy = PolicyConfig {
                    replacement,
                    admission,
                    ..PolicyConfig::default()
                };
                parity(mode, policy, 4096, &workload);
            }
        }
    }
    // Blocks larger than the IO size: partial-block writes take other paths.
    parity(
        CacheMode::WriteBack,
        PolicyConfig::default(),
        16384,
        &workload,
    );
}
