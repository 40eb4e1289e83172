//! The simulator and the live engine run the same decision code: over the
//! same request stream (time included) they must count exactly the same
//! hits, misses, promotions, demotions, bypasses and writebacks, with the
//! cleaner on (the engine cleaned by its own pacing, the policy crate's
//! `RateController`, on the simulator's clock: how many and which blocks
//! are the shared decisions) and on a device whose last block is short.

use std::sync::Arc;
use tiercache_device::{BlockDevice, MemDevice};
use tiercache_engine::{Engine, EngineConfig};
use tiercache_policy::writeback::RateController;
use tiercache_policy::PolicyConfig;
use tiercache_sim::{synth::Distribution, CleanerSpec, ConfigRunner, SimSpec, Workload};
use tiercache_types::{Access, AdmissionKind, CacheMode, ManualClock, ReplacementKind};

fn parity(
    mode: CacheMode,
    policy: PolicyConfig,
    block_size: u32,
    workload: &Workload,
    cleaner: Option<CleanerSpec>,
) {
    let cache_bytes = 256 * block_size as u64;
    let data = workload.size * workload.jobs as u64;
    let spec = SimSpec {
        block_size,
        mode,
        sequential_cutoff: 256 * 1024,
        cache_sizes: vec![cache_bytes],
        policies: vec![policy.clone()],
        cleaner,
        opt: None,
        mrc: None,
        device_size: Some(data),
        ..SimSpec::default()
    };
    let mut sim = ConfigRunner::new(&spec, &policy, cache_bytes).unwrap();

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
    let mut pacer = cleaner
        .filter(|_| mode == CacheMode::WriteBack)
        .map(|c| RateController::new(c.config()));
    let mut n = 0;
    let mut quick_hits = 0;
    for r in workload.requests().unwrap() {
        clock.set(r.time);
        let b = &mut buf[..r.len as usize];
        match r.access {
            // Every other read the way the front ends serve one: the
            // quick hit path first, the full read when it declines.
            Access::Read => match (n % 2 == 0)
                .then(|| engine.read_if_cached(r.offset, b))
                .flatten()
            {
                Some(done) => {
                    done.unwrap();
                    quick_hits += 1;
                }
                None => engine.read(r.offset, b).unwrap(),
            },
            Access::Write => engine.write(r.offset, b, false).unwrap(),
        }
        sim.process(&r);
        if let Some(p) = pacer.as_mut() {
            let dirty = engine.dirty_blocks();
            let due = p.blocks_to_clean(dirty, engine.capacity() as u64, false, false, sim.clock());
            if due > 0 {
                assert_eq!(engine.clean(due as usize).unwrap() as u64, due);
            }
        }
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
            live.promotions > 0 && live.read_hits > 0 && quick_hits > 0,
            "the workload exercised the cache: {live:?}, {quick_hits} quick hits"
        );
    }
    if mode == CacheMode::WriteBack && cleaner.is_some() {
        assert!(live.writebacks > 0, "the cleaner ran: {live:?}");
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
                parity(mode, policy, 4096, &workload, None);
            }
        }
    }
    // Blocks larger than the IO size: partial-block writes take other paths.
    parity(
        CacheMode::WriteBack,
        PolicyConfig::default(),
        16384,
        &workload,
        None,
    );
}

#[test]
fn with_the_cleaner_and_a_short_last_block_they_count_the_same() {
    let workload = Workload {
        // Uniform, so that the last block is written often.
        distribution: Distribution::Uniform,
        rwmixread: 40,
        sequential_share: 0.05,
        sequential_run: 256 * 1024,
        block_size: 4096,
        // Not a multiple of the 16 KiB cache block: the device's last block
        // is 4 KiB, and a 4 KiB write there covers it whole.
        size: (8 << 20) + 4096,
        jobs: 1,
        ios: 30_000,
        seed: 7,
        ..Workload::default()
    };
    let cleaner = CleanerSpec::default();
    for &mode in CacheMode::ALL {
        for bs in [4096, 16384] {
            parity(mode, PolicyConfig::default(), bs, &workload, Some(cleaner));
        }
    }
}
