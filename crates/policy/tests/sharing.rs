//! A pool's volumes sharing one cache: guaranteed shares, caps and
//! marginal utility, each checked against the same run without it (so
//! every test shows the sharing is what made the difference).

use tiercache_policy::director::ReadPlan;
use tiercache_policy::{
    BlockPlan, Director, DirectorConfig, IoRequest, PolicyConfig, VolumeLimits,
};
use tiercache_types::{Access, AdmissionKind, CacheMode, ReplacementKind, Time, VolumeId};

const BS: u64 = 4096;

fn pool(capacity: u32, replacement: ReplacementKind, utility: bool, volumes: u16) -> Director {
    let mut cfg = DirectorConfig::new(capacity, BS as u32);
    cfg.mode = CacheMode::WriteThrough;
    cfg.sequential_cutoff = 0;
    cfg.utility_sharing = utility;
    cfg.policy = PolicyConfig {
        replacement,
        admission: AdmissionKind::Always,
        ..PolicyConfig::default()
    };
    let mut d = Director::new(&cfg).unwrap();
    for v in 1..volumes {
        assert!(d.attach_volume(VolumeId(v), cfg.mode, 0));
    }
    d
}

/// Reads block `b` of volume `v`; true on a hit.
fn read(d: &mut Director, v: u16, b: u64, now: u64) -> bool {
    read_outcome(d, v, b, now).0
}

/// Reads block `b` of volume `v`: (a hit, a miss promoted into the cache).
fn read_outcome(d: &mut Director, v: u16, b: u64, now: u64) -> (bool, bool) {
    let req = IoRequest {
        volume: VolumeId(v),
        offset: b * BS,
        len: BS,
        access: Access::Read,
        volume_size: 1 << 50,
    };
    let mut outcome = (false, false);
    d.plan_io(&req, Time(now), |_, _, plan| {
        outcome = (
            matches!(plan, BlockPlan::Read(ReadPlan::Hit(_))),
            matches!(plan, BlockPlan::Read(ReadPlan::Promote(_))),
        );
    });
    outcome
}

/// A small xorshift generator, so runs repeat exactly.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Volume 0 loops over 600 blocks, volume 1 reads uniformly over a
/// million (no reuse), interleaved, in a 1000-block LRU cache. Without
/// sharing, LRU gives each about half the cache and the loop never hits;
/// by utility, volume 1 gains nothing from space, so volume 0 gets it.
/// Returns volume 0's hit ratio over the second half of the run.
fn loop_beside_noise(replacement: ReplacementKind, utility: bool) -> f64 {
    let mut d = pool(1000, replacement, utility, 2);
    let mut rng = Rng(0x9e37_79b9);
    let (mut hits, mut reads) = (0, 0);
    let rounds = 60_000u64;
    for i in 0..rounds {
        let hit = read(&mut d, 0, i % 600, 2 * i);
        if i >= rounds / 2 {
            hits += hit as u64;
            reads += 1;
        }
        read(&mut d, 1, rng.below(1_000_000), 2 * i + 1);
    }
    hits as f64 / reads as f64
}

#[test]
fn utility_gives_the_space_to_the_volume_that_gains_from_it() {
    let plain = loop_beside_noise(ReplacementKind::Lru, false);
    let shared = loop_beside_noise(ReplacementKind::Lru, true);
    assert!(plain < 0.2, "LRU alone: loop hit ratio {plain}");
    assert!(shared > 0.8, "shared by utility: loop hit ratio {shared}");
}

/// Volume 0 reads uniformly over 3000 blocks (every block of cache it
/// gets is worth hits), volume 1 uniformly over a million, interleaved, in
/// a 1000-block LRU cache: the split by utility gives volume 1 nothing.
/// Once the cache is full a volume given no space stops filling it (each
/// promotion would displace a block worth more), while its curve still
/// learns; without utility sharing every miss of volume 1 fills. Returns,
/// over the second half, volume 0's hit ratio and the share of volume 1's
/// reads promoted.
fn noise_beside_a_wide_reader(utility: bool) -> (f64, f64) {
    let mut d = pool(1000, ReplacementKind::Lru, utility, 2);
    let mut rng = Rng(0x9e37_79b9);
    let (mut hits, mut fills, mut reads) = (0, 0, 0);
    let rounds = 60_000u64;
    for i in 0..rounds {
        let hit = read(&mut d, 0, rng.below(3000), 2 * i);
        let (_, filled) = read_outcome(&mut d, 1, rng.below(1_000_000), 2 * i + 1);
        if i >= rounds / 2 {
            hits += hit as u64;
            fills += filled as u64;
            reads += 1;
        }
    }
    (hits as f64 / reads as f64, fills as f64 / reads as f64)
}

#[test]
fn a_volume_the_split_gives_nothing_fills_nothing() {
    let (plain_hits, plain_fills) = noise_beside_a_wide_reader(false);
    let (hits, fills) = noise_beside_a_wide_reader(true);
    assert!(
        plain_fills > 0.99,
        "without utility sharing: {plain_fills} of reads filled"
    );
    assert!(fills < 0.01, "shared by utility: {fills} of reads filled");
    // A third of 3000 blocks fits: the wide reader gets (nearly) it all.
    assert!(
        hits > 0.3 && plain_hits < 0.2,
        "hit ratio {plain_hits} -> {hits}"
    );
}

#[test]
fn utility_does_not_hurt_a_scan_resistant_default() {
    let plain = loop_beside_noise(ReplacementKind::Adaptive, false);
    let shared = loop_beside_noise(ReplacementKind::Adaptive, true);
    assert!(
        shared >= plain - 0.01,
        "adaptive: {plain} alone, {shared} shared"
    );
}

/// Volume 0 reads its 300 hot blocks, then volume 1 scans 20,000 blocks
/// of its own, then volume 0 reads its blocks again.
fn hot_set_after_a_scan(share: u64) -> u64 {
    let mut d = pool(400, ReplacementKind::Lru, false, 2);
    d.set_volume_limits(VolumeId(0), VolumeLimits { share, cap: None })
        .unwrap();
    let mut now = 0;
    for b in 0..300 {
        read(&mut d, 0, b, now);
        now += 1;
    }
    for b in 0..20_000 {
        read(&mut d, 1, b, now);
        now += 1;
    }
    (0..300)
        .filter(|&b| {
            now += 1;
            read(&mut d, 0, b, now)
        })
        .count() as u64
}

#[test]
fn a_guaranteed_share_survives_another_volumes_scan() {
    assert_eq!(hot_set_after_a_scan(0), 0, "without a share LRU loses all");
    assert_eq!(hot_set_after_a_scan(300), 300, "a share of 300 keeps all");
}

#[test]
fn a_capped_volume_never_holds_more_than_its_cap() {
    for &r in ReplacementKind::ALL {
        let mut d = pool(256, r, true, 3);
        let cap = VolumeLimits {
            share: 0,
            cap: Some(40),
        };
        d.set_volume_limits(VolumeId(2), cap).unwrap();
        let mut rng = Rng(7);
        let mut top = 0;
        for i in 0..20_000 {
            let v = (i % 3) as u16;
            read(&mut d, v, rng.below(500), i);
            top = top.max(d.volume_counters(VolumeId(2)).unwrap().resident);
        }
        assert_eq!(top, 40, "{r}: volume 2 peaked at {top} blocks");
        let total: u64 = (0..3)
            .map(|v| d.volume_counters(VolumeId(v)).unwrap().resident)
            .sum();
        assert_eq!(total, d.resident_len() as u64, "{r}");
        for v in 0..3 {
            let t = d.volume_target(VolumeId(v)).expect("a target is set");
            assert!(t <= 256, "{r}: volume {v} target {t}");
        }
        assert!(d.volume_target(VolumeId(2)).unwrap() <= 40);
    }
}

#[test]
fn limits_that_cannot_hold_are_refused() {
    let mut d = pool(100, ReplacementKind::Lru, true, 2);
    let bad = VolumeLimits {
        share: 50,
        cap: Some(10),
    };
    let e = d.set_volume_limits(VolumeId(0), bad).unwrap_err();
    assert!(e.to_string().contains("above its cap"), "{e}");
    let half = VolumeLimits {
        share: 60,
        cap: None,
    };
    d.set_volume_limits(VolumeId(0), half).unwrap();
    let e = d.set_volume_limits(VolumeId(1), half).unwrap_err();
    assert!(e.to_string().contains("add up to 120 blocks"), "{e}");
    assert!(d
        .set_volume_limits(VolumeId(9), VolumeLimits::default())
        .is_err());
}

#[test]
fn the_gain_of_more_space_is_read_off_the_live_curve() {
    // Two loops of 700 blocks in a 1000-block cache: both cannot fit, so
    // the sharing lets one fit (it gains nothing from more) and the other
    // would gain all its misses from enough more space, but nothing from
    // a little.
    let mut d = pool(1000, ReplacementKind::Lru, true, 2);
    for i in 0..60_000u64 {
        read(&mut d, 0, i % 700, 2 * i);
        read(&mut d, 1, i % 700, 2 * i + 1);
    }
    let held = |d: &Director, v| d.volume_counters(VolumeId(v)).unwrap().resident;
    let (big, small) = if held(&d, 0) > held(&d, 1) {
        (0, 1)
    } else {
        (1, 0)
    };
    assert!(held(&d, big) >= 700, "the larger holds {}", held(&d, big));
    let fits = d.volume_gain(VolumeId(big), 700).unwrap();
    let gains = d.volume_gain(VolumeId(small), 700).unwrap();
    let little = d.volume_gain(VolumeId(small), 50).unwrap();
    // The curve's buckets are a quarter apart, linear within: a loop that
    // just fits may still show a little gain.
    assert!(fits < 0.15, "the loop that fits gains {fits}");
    assert!(gains > 0.7, "the other gains {gains} from 700 blocks");
    assert!(little < 0.1, "the other gains {little} from 50 blocks");
}

/// The first targets come after one cache's worth of block references when
/// that is sooner than an epoch (4096): a small cache is steered from about
/// when it first fills, a large one after an epoch as before.
#[test]
fn the_first_targets_come_when_a_small_cache_has_filled() {
    for (capacity, first) in [(200u32, 200u64), (1000, 1000), (8192, 4096)] {
        let mut d = pool(capacity, ReplacementKind::Lru, true, 2);
        let mut refs = 0u64;
        while d.volume_target(VolumeId(0)).is_none() {
            assert!(refs < 10_000, "no target after {refs} references");
            read(&mut d, (refs % 2) as u16, refs, refs);
            refs += 1;
        }
        assert_eq!(
            refs, first,
            "capacity {capacity}: first targets after {refs} references"
        );
    }
}
