//! The best static split of the pool's cache, as the simulator finds it
//! (`tiercache_sim::pool::compare_splits`, what `tiercache sim --pool`
//! runs): synthetic requests shaped like the fio jobs (the same
//! distributions, block sizes, directions and seeds, in fio's own
//! generator), one volume per `i << VOLUME_SHIFT` range, interleaved in
//! proportion to the IOs each volume did in the measured shared run.

use crate::pool_jobs::Workload;
use crate::pool_report::{PoolRun, PoolSettings, SimSplit};
use anyhow::{anyhow, Context, Result};
use tiercache_sim::synth::{Distribution, Workload as SynthWorkload};
use tiercache_sim::trace::VOLUME_SHIFT;
use tiercache_sim::{Request, SimSpec};
use tiercache_types::Time;

/// The simulated counterpart of `w` over a volume of `size` bytes: `ios`
/// requests.
fn synth(w: &Workload, size: u64, ios: u64) -> Result<SynthWorkload> {
    let distribution = match w.distribution {
        Some(d) => d
            .parse::<Distribution>()
            .map_err(|e| anyhow!("{}: {e}", w.name))?,
        None => Distribution::Uniform,
    };
    let sequential = w.rw == "read" || w.rw == "write";
    Ok(SynthWorkload {
        distribution,
        scramble: true,
        randommap: true,
        rwmixread: if w.rw.contains("write") { 0 } else { 100 },
        sequential_share: if sequential { 1.0 } else { 0.0 },
        sequential_run: size,
        block_size: w.bs,
        size,
        jobs: 1,
        ios,
        seed: w.seed,
    })
}

/// Every volume's requests, merged by virtual time: volume `i` issues
/// its `n_i` requests evenly over the same span, so each volume's share
/// of the stream is its share of the measured IOs (warm-up included, as
/// the runs scale: `(runtime + warmup) / runtime`).
pub fn requests(ws: &[Workload], st: &PoolSettings, shared: &PoolRun) -> Result<Vec<Request>> {
    let scale = (st.runtime + st.warmup) as f64 / st.runtime as f64;
    let mut tagged: Vec<(f64, Request)> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let Some(v) = shared.volume(w.name) else {
            continue;
        };
        let n = (v.total_ios as f64 * scale) as u64;
        if n == 0 {
            continue;
        }
        let reqs = synth(w, st.volume_size, n)?
            .requests()
            .map_err(|e| anyhow!("{}: {e}", w.name))?;
        for (k, mut r) in reqs.enumerate() {
            r.offset += (i as u64) << VOLUME_SHIFT;
            tagged.push(((k as f64 + 0.5) / n as f64, r));
        }
    }
    tagged.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(tagged
        .into_iter()
        .enumerate()
        .map(|(t, (_, mut r))| {
            r.time = Time(t as u64);
            r
        })
        .collect())
}

/// Shared against the best static and the equal split, in the simulator,
/// for the pool's cache size and policy.
pub fn best_split(ws: &[Workload], st: &PoolSettings, shared: &PoolRun) -> Result<SimSplit> {
    let reqs = requests(ws, st, shared)?;
    let policy: tiercache_policy::PolicyConfig = st
        .policy
        .parse()
        .map_err(|e| anyhow!("policy {}: {e}", st.policy))?;
    let spec = SimSpec {
        block_size: st.block_size as u32,
        cache_sizes: vec![st.cache_size],
        policies: vec![policy.clone()],
        opt: None,
        mrc: None,
        device_size: Some(st.volume_size),
        ..SimSpec::default()
    };
    let s = tiercache_sim::pool::compare_splits(&spec, &policy, st.cache_size, &reqs)
        .map_err(|e| anyhow!("{e}"))
        .context("the simulator's pool comparison")?;
    Ok(SimSplit {
        requests: reqs.len(),
        shared_hit_ratio: s.shared_hit_ratio(),
        best_static_hit_ratio: s.best_static_hit_ratio(),
        equal_hit_ratio: s.equal_hit_ratio(),
        best_split: s
            .best_split
            .iter()
            .filter_map(|&(v, b)| Some((ws.get(v as usize)?.name.to_string(), b)))
            .collect(),
        slices: Vec::new(),
    })
}

/// Slice sizes in bytes for `split` (blocks per volume, in `ws` order by
/// name; volumes it leaves out get none): each slice its share of
/// `cache` rounded down to whole blocks, at least `min` (a multiple of
/// `bs`); what the minimums add is taken from the largest slices.
pub fn slice_bytes(
    ws: &[Workload],
    split: &[(String, u64)],
    cache: u64,
    bs: u64,
    min: u64,
) -> Vec<u64> {
    let blocks = |n: &str| split.iter().find(|x| x.0 == n).map_or(0, |x| x.1);
    let sum: u64 = ws.iter().map(|w| blocks(w.name)).sum::<u64>().max(1);
    let mut bytes: Vec<u64> = ws
        .iter()
        .map(|w| ((cache as u128 * blocks(w.name) as u128 / sum as u128) as u64 / bs * bs).max(min))
        .collect();
    // Each round takes what is over from the largest slice still above
    // the floor (whole blocks, down to the floor at most).
    loop {
        let total: u64 = bytes.iter().sum();
        let big = (0..bytes.len()).max_by_key(|&i| bytes[i]).unwrap_or(0);
        if total <= cache || bytes.get(big).is_none_or(|&b| b <= min) {
            break;
        }
        let take = (total - cache).div_ceil(bs) * bs;
        bytes[big] = bytes[big].saturating_sub(take).max(min) / bs * bs;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool_jobs::workloads;

    #[test]
    fn slices_follow_the_split_with_a_floor() {
        let ws = workloads();
        let m = 1 << 20;
        let split = vec![("hot".to_string(), 600), ("hot2".to_string(), 400)];
        let b = slice_bytes(&ws, &split, 100 * m, 65536, 2 * m);
        assert_eq!(b.len(), 5);
        // hot: 60 MiB, hot2 40, the other three the floor, taken from hot.
        assert_eq!(b, vec![54 * m, 40 * m, 2 * m, 2 * m, 2 * m]);
        assert!(b.iter().sum::<u64>() <= 100 * m);
        // The floors add more than the largest slice can give.
        let split: Vec<(String, u64)> = [("hot", 48), ("hot2", 36), ("cold", 1), ("scan", 75)]
            .iter()
            .map(|&(n, b)| (n.to_string(), b))
            .collect();
        let b = slice_bytes(&ws, &split, 10 * m, 65536, 2 * m);
        assert_eq!(b, vec![2 * m; 5]);
    }

    #[test]
    fn requests_interleave_volumes_by_their_measured_ios() {
        use crate::pool_report::VolumeResult;
        let ws = workloads();
        let st = PoolSettings {
            volume_size: 4 << 20,
            cache_size: 10 << 20,
            block_size: 65536,
            runtime: 2,
            warmup: 1,
            rounds: 1,
            policy: "lru".into(),
            mode: "writethrough".into(),
        };
        let v = |name: &str, ios| VolumeResult {
            name: name.into(),
            total_ios: ios,
            ..VolumeResult::default()
        };
        let run = PoolRun {
            label: "x".into(),
            round: 0,
            volumes: vec![v("hot", 200), v("writer", 20)],
            others_cpu: None,
        };
        let r = requests(&ws, &st, &run).unwrap();
        assert_eq!(r.len(), 330, "(200 + 20) * 3 / 2");
        let writer: Vec<&Request> = r.iter().filter(|q| q.offset >> VOLUME_SHIFT == 4).collect();
        assert_eq!(writer.len(), 30);
        assert!(writer
            .iter()
            .all(|q| q.access == tiercache_types::Access::Write));
        // Spread over the stream, not bunched at one end.
        let first = r
            .iter()
            .position(|q| q.offset >> VOLUME_SHIFT == 4)
            .unwrap();
        assert!(first < 30, "{first}");
        assert!(r
            .iter()
            .all(|q| q.offset & ((1 << VOLUME_SHIFT) - 1) < 4 << 20));
    }
}
