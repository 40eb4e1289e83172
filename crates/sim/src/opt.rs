//! Belady's OPT (MIN): the fewest misses any cache of a given size can have
//! on a block reference stream, computed offline.
//!
//! Next-use times come from one backward pass ([`next_uses`]); the resident
//! set is a max-heap keyed by next use with lazy deletion (an entry whose key
//! is not in the future is stale: that reference has happened), rebuilt when
//! stale entries pile up. O(n log k) per cache size.
//!
//! Two variants ([`OptVariant`]):
//! - `Demand`: every miss is inserted, evicting the resident block used
//!   farthest in the future. This is libCacheSim's `Belady` and the classic
//!   demand-paging MIN.
//! - `Bypass`: a missed block is inserted only if it is used again sooner
//!   than the farthest resident block (else it bypasses the cache). Never
//!   more misses than `Demand`; this is the true bound for a cache with an
//!   admission policy, like ours.

use serde::{Deserialize, Serialize};
use std::collections::BinaryHeap;

/// "Never used again".
pub const NEVER: u32 = u32::MAX;

/// OPT variant, see the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptVariant {
    Demand,
    #[default]
    Bypass,
}

/// For each position `i`, the next position referencing the same id, or
/// [`NEVER`]. `ids` are dense (< `n_ids`). Caller guarantees
/// `ids.len() < u32::MAX`.
pub fn next_uses(ids: &[u32], n_ids: usize) -> Vec<u32> {
    assert!(
        ids.len() < NEVER as usize,
        "OPT supports fewer than 2^32 - 1 references"
    );
    let mut last = vec![NEVER; n_ids];
    let mut next = vec![NEVER; ids.len()];
    for i in (0..ids.len()).rev() {
        let id = ids[i] as usize;
        next[i] = last[id];
        last[id] = i as u32;
    }
    next
}

/// Misses of OPT with `capacity` blocks on `ids` (dense, `< n_ids`), given
/// `next = next_uses(ids, n_ids)`. Cold misses are included.
pub fn opt_misses(
    ids: &[u32],
    next: &[u32],
    n_ids: usize,
    capacity: u64,
    variant: OptVariant,
) -> u64 {
    opt_run(ids, next, n_ids, capacity, variant).misses
}

/// Where OPT's cache first became full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptFill {
    /// References replayed up to and including the one that filled it.
    pub refs: u64,
    /// Misses up to then.
    pub misses: u64,
    /// Distinct ids seen up to then.
    pub distinct: u64,
}

/// One OPT run: its misses and where its cache first became full (`None`
/// when the stream has fewer distinct ids than `capacity`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptRun {
    pub misses: u64,
    pub fill: Option<OptFill>,
}

/// [`opt_misses`] that also says where the cache first became full. `ids`
/// must be numbered in order of first appearance (as
/// [`IdMap`](crate::idmap::IdMap) numbers them): a reference is a first
/// touch exactly when its id equals the number of ids seen before it.
pub fn opt_run(
    ids: &[u32],
    next: &[u32],
    n_ids: usize,
    capacity: u64,
    variant: OptVariant,
) -> OptRun {
    assert_eq!(ids.len(), next.len());
    if capacity == 0 {
        return OptRun {
            misses: ids.len() as u64,
            fill: Some(OptFill::default()),
        };
    }
    let cap = capacity.min(n_ids as u64) as usize;
    let mut resident = vec![false; n_ids];
    let mut count = 0usize;
    let mut heap: BinaryHeap<(u32, u32)> = BinaryHeap::with_capacity(cap + 1);
    let mut misses = 0u64;
    let mut distinct = 0u64;
    let mut fill = None;
    for (i, (&id, &nu)) in ids.iter().zip(next).enumerate() {
        let now = i as u32;
        if id as u64 == distinct {
            distinct += 1;
        }
        let r = &mut resident[id as usize];
        if *r {
            // The entry keyed `now` is stale from here on.
            heap.push((nu, id));
        } else {
            misses += 1;
            if count < cap {
                *r = true;
                count += 1;
                heap.push((nu, id));
                if count as u64 == capacity {
                    fill = Some(OptFill {
                        refs: i as u64 + 1,
                        misses,
                        distinct,
                    });
                }
            } else {
                // Drop stale entries to find the farthest resident block.
                while heap.peek().is_some_and(|e| e.0 <= now) {
                    heap.pop();
                }
                let &(victim_next, victim) = heap.peek().expect("a full cache has a valid entry");
                let insert = match variant {
                    OptVariant::Demand => true,
                    OptVariant::Bypass => victim_next > nu,
                };
                if insert {
                    heap.pop();
                    resident[victim as usize] = false;
                    resident[id as usize] = true;
                    heap.push((nu, id));
                }
            }
        }
        if heap.len() > 2 * cap + 1024 {
            heap.retain(|e| e.0 > now);
        }
    }
    OptRun { misses, fill }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// OPT by brute force: on a miss with a full cache, evict the resident
    /// block whose next use is farthest (scanning forward).
    fn brute(ids: &[u32], cap: usize, bypass: bool) -> u64 {
        let next_of = |b: u32, from: usize| {
            ids[from..]
                .iter()
                .position(|&x| x == b)
                .map(|p| p + from)
                .unwrap_or(usize::MAX)
        };
        let mut cache: Vec<u32> = Vec::new();
        let mut misses = 0;
        for (i, &b) in ids.iter().enumerate() {
            if cache.contains(&b) {
                continue;
            }
            misses += 1;
            if cache.len() < cap {
                cache.push(b);
                continue;
            }
            let (vi, vn) = cache
                .iter()
                .enumerate()
                .map(|(k, &x)| (k, next_of(x, i + 1)))
                .max_by_key(|x| x.1)
                .unwrap();
            if !bypass || vn > next_of(b, i + 1) {
                cache[vi] = b;
            }
        }
        misses
    }

    #[test]
    fn matches_brute_force_and_bypass_never_loses() {
        let mut rng = Rng::new(5);
        for round in 0..20 {
            let n_ids = 5 + round * 3;
            let ids: Vec<u32> = (0..400).map(|_| rng.below(n_ids as u64) as u32).collect();
            let next = next_uses(&ids, n_ids);
            for cap in [1u64, 2, 3, 5, 8, 13] {
                let d = opt_misses(&ids, &next, n_ids, cap, OptVariant::Demand);
                let b = opt_misses(&ids, &next, n_ids, cap, OptVariant::Bypass);
                assert_eq!(d, brute(&ids, cap as usize, false), "demand cap {cap}");
                assert_eq!(b, brute(&ids, cap as usize, true), "bypass cap {cap}");
                assert!(b <= d);
            }
        }
    }

    #[test]
    fn bypass_beats_demand_on_a_b_a() {
        let ids = [0u32, 1, 0];
        let next = next_uses(&ids, 2);
        assert_eq!(opt_misses(&ids, &next, 2, 1, OptVariant::Demand), 3);
        assert_eq!(opt_misses(&ids, &next, 2, 1, OptVariant::Bypass), 2);
    }

    #[test]
    fn fill_point_counts_misses_and_first_touches() {
        // ids in order of first appearance: 0 1 0 2 1 3
        let ids = [0u32, 1, 0, 2, 1, 3];
        let next = next_uses(&ids, 4);
        let r = opt_run(&ids, &next, 4, 2, OptVariant::Demand);
        assert_eq!(
            r.fill,
            Some(OptFill {
                refs: 2,
                misses: 2,
                distinct: 2
            })
        );
        assert_eq!(opt_run(&ids, &next, 4, 5, OptVariant::Demand).fill, None);
    }
}
