//! Sizing a pool: one cache shared by many volumes, against the same cache
//! cut into static slices, one per volume (what an operator without a
//! shared cache must do: lvmcache, or one server per volume).
//!
//! The shared figure is a pooled replay ([`SimSpec::pool`]): the policy
//! crate's own sharing decides. Each volume's hit curve is measured by
//! replaying its requests alone through the same policy at slice sizes
//! growing by a quarter from one block up to its footprint or the cache.
//! The best static split then hands out the cache with the policy
//! crate's own [`split`] (the same greedy the live sharing uses to set
//! targets), and each volume is replayed again at the slice it got; the
//! equal split gives every volume the same slice. All figures count the
//! same block references, so they compare hit for hit.

use crate::simulate::{ConfigRunner, PoolSplit, SimSpec, VolumeCurve};
use crate::trace::{Request, VOLUME_SHIFT};
use std::collections::HashMap;
use tiercache_policy::sharing::{split, SplitInput};
use tiercache_policy::PolicyConfig;

/// A measured hit curve: (slice blocks, block hits).
type Curve = Vec<(u64, u64)>;

/// Replays `requests` (a multi-volume trace, each volume in its own
/// `i << VOLUME_SHIFT` range) shared and split, for a cache of
/// `cache_bytes` under `policy`.
pub fn compare_splits(
    spec: &SimSpec,
    policy: &PolicyConfig,
    cache_bytes: u64,
    requests: &[Request],
) -> Result<PoolSplit, String> {
    let bs = spec.block_size as u64;
    let capacity = cache_bytes / bs;
    let alone = SimSpec {
        pool: false,
        ..spec.clone()
    };
    let pooled = SimSpec {
        pool: true,
        ..spec.clone()
    };
    let mut shared = ConfigRunner::new(&pooled, policy, cache_bytes)?;
    let mut by_volume: HashMap<u16, Vec<Request>> = HashMap::new();
    for r in requests {
        shared.process(r);
        let volume = (r.offset >> VOLUME_SHIFT).min(u16::MAX as u64) as u16;
        let mut own = *r;
        own.offset &= (1 << VOLUME_SHIFT) - 1;
        by_volume.entry(volume).or_default().push(own);
    }
    let (shared_hits, block_refs) = shared.hits_refs();
    let mut volumes: Vec<(u16, Vec<Request>)> = by_volume.into_iter().collect();
    volumes.sort_unstable_by_key(|v| v.0);
    let hits_at = |reqs: &[Request], blocks: u64| -> Result<u64, String> {
        if blocks == 0 {
            return Ok(0);
        }
        let mut r = ConfigRunner::new(&alone, policy, blocks * bs)?;
        for q in reqs {
            r.process(q);
        }
        Ok(r.hits_refs().0)
    };
    // Each volume's curve: (blocks, hits) at growing slice sizes, the
    // volumes shared out among worker threads.
    let curve_of = |reqs: &[Request]| -> Result<Curve, String> {
        let footprint = crate::distinct_blocks(reqs.iter().copied(), bs).min(capacity);
        let mut curve = vec![(0u64, 0u64)];
        let mut blocks = 1u64;
        while blocks <= footprint {
            curve.push((blocks, hits_at(reqs, blocks)?));
            if blocks == footprint {
                break;
            }
            blocks = (blocks + blocks.div_ceil(4)).min(footprint);
        }
        Ok(curve)
    };
    let threads = match spec.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut curves: Vec<Curve> = vec![Vec::new(); volumes.len()];
    let done: Vec<Result<Vec<(usize, Curve)>, String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((_, reqs)) = volumes.get(i) else {
                            return Ok(mine);
                        };
                        mine.push((i, curve_of(reqs)?));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a curve worker panicked"))
            .collect()
    });
    for part in done {
        for (i, c) in part? {
            curves[i] = c;
        }
    }
    let float: Vec<Vec<(u64, f64)>> = curves
        .iter()
        .map(|c| c.iter().map(|&(b, h)| (b, h as f64)).collect())
        .collect();
    let inputs: Vec<SplitInput<'_>> = float
        .iter()
        .map(|curve| SplitInput {
            curve,
            floor: 0,
            cap: capacity,
        })
        .collect();
    let blocks = split(&inputs, capacity);
    // Measured, not interpolated: each volume replayed at its slice.
    let mut best_static_hits = 0;
    let mut best_split = Vec::new();
    for ((v, reqs), &b) in volumes.iter().zip(&blocks) {
        if b > 0 {
            best_static_hits += hits_at(reqs, b)?;
            best_split.push((*v, b));
        }
    }
    let volume_curves = volumes
        .iter()
        .zip(&curves)
        .map(|((v, reqs), c)| VolumeCurve {
            volume: *v,
            requests: reqs.len() as u64,
            points: c.clone(),
        })
        .collect();
    let slice = capacity / volumes.len().max(1) as u64;
    let mut equal_hits = 0;
    for (_, reqs) in &volumes {
        equal_hits += hits_at(reqs, slice)?;
    }
    Ok(PoolSplit {
        cache_bytes,
        policy: crate::simulate::policy_label(policy),
        volumes: volumes.len(),
        block_refs,
        shared_hits,
        best_static_hits,
        equal_hits,
        best_split,
        shared_volumes: shared.volume_results(),
        curves: volume_curves,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_types::{Access, Time};

    fn req(volume: u64, block: u64, t: u64) -> Request {
        Request {
            time: Time(t),
            offset: (volume << VOLUME_SHIFT) + block * 4096,
            len: 4096,
            access: Access::Read,
        }
    }

    #[test]
    fn shared_beats_equal_slices_when_volumes_differ() {
        // Volume 0 loops over 300 blocks, volumes 1-3 over 20 each: a
        // 400-block cache holds everything shared; equal slices of 100
        // starve the loop; the best static split matches the shared cache.
        let mut reqs = Vec::new();
        let mut t = 0;
        for round in 0..20u64 {
            for b in 0..300 {
                reqs.push(req(0, b, t));
                t += 1;
                if b % 5 == 0 {
                    let v = 1 + (b / 5) % 3;
                    reqs.push(req(v, (round * 7 + b) % 20, t));
                    t += 1;
                }
            }
        }
        let spec = SimSpec {
            cache_sizes: vec![400 * 4096],
            sequential_cutoff: 0,
            ..SimSpec::default()
        };
        let policy: PolicyConfig = "lru".parse().unwrap();
        let s = compare_splits(&spec, &policy, 400 * 4096, &reqs).unwrap();
        assert_eq!(s.volumes, 4);
        assert_eq!(s.shared_volumes.len(), 4);
        let first_touches = 300 + 3 * 20;
        assert_eq!(s.shared_hits, s.block_refs - first_touches);
        assert!(s.best_static_hits >= s.shared_hits - 20, "{s:?}");
        assert!(s.equal_hits < s.shared_hits / 2, "{s:?}");
        let loop_slice = s.best_split.iter().find(|v| v.0 == 0).unwrap().1;
        assert!(loop_slice >= 300, "{:?}", s.best_split);
    }
}
