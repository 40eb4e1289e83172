//! [`simulate`]: the threaded driver. The stream is read once, in chunks;
//! worker threads run the configurations and the block task over each
//! chunk while the next one is read.

use super::block_task::BlockTask;
use super::notes::{convergence_note, fill_notes, note_fills, ConvergeState};
use super::results::{
    ConfigResult, ConvergenceReport, LatencySummary, MrcReport, OptResult, Phase, Progress,
    SimReport, TraceSummary, WarmResult,
};
use super::runner::ConfigRunner;
use super::source::RequestSource;
use super::spec::{policy_label, MrcSpec, SimSpec};
use super::CHUNK;
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::mrc::{MrcBuilder, MrcMethod};
use crate::opt::{next_uses, opt_run, OptRun};
use crate::trace::{Request, VOLUME_SHIFT};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tiercache_policy::Counters;
use tiercache_types::{CacheMode, MAX_VOLUME_BLOCKS};

pub(super) enum Task {
    Config(Box<ConfigRunner>),
    Blocks(Box<BlockTask>),
}

impl Task {
    fn run(&mut self, chunk: &[Request]) {
        match self {
            Task::Config(r) => {
                for q in chunk {
                    r.process(q);
                }
            }
            Task::Blocks(b) => {
                b.distinct_after.clear();
                for q in chunk {
                    b.process(q);
                }
            }
        }
    }
}

/// The addresses a replay can take: a volume of the engine's has at most
/// [`MAX_VOLUME_BLOCKS`] blocks (the rest of a pool key names the volume),
/// so a request ending past them is refused with an error, as the engine
/// refuses such a volume, rather than taken for another volume's blocks.
#[derive(Clone, Copy)]
pub(super) struct AddressLimit {
    /// Bytes a volume's requests may reach (`u64::MAX`: any).
    end: u64,
    /// Replaying as a pool: the volume is in the offset's high bits.
    pool: bool,
}

impl AddressLimit {
    pub(super) fn new(block_size: u32, pool: bool) -> Self {
        let shift = block_size.trailing_zeros();
        let end = MAX_VOLUME_BLOCKS
            .checked_shl(shift)
            .filter(|&e| e >> shift == MAX_VOLUME_BLOCKS);
        AddressLimit {
            end: end.unwrap_or(u64::MAX),
            pool,
        }
    }

    fn check(&self, r: &Request, index: u64) -> Result<()> {
        let offset = if self.pool {
            r.offset & ((1 << VOLUME_SHIFT) - 1)
        } else {
            r.offset
        };
        if offset.saturating_add(r.len) > self.end {
            return Err(Error::Config(format!(
                "request {index} (offset {}, {} bytes) reaches past {} bytes, the largest volume \
                 tiercache addresses at this block size ({MAX_VOLUME_BLOCKS} blocks)",
                r.offset, r.len, self.end
            )));
        }
        Ok(())
    }
}

/// Reads the next chunk of at most [`CHUNK`] requests into `out`;
/// `read` counts the requests read so far (for the error's message).
pub(super) fn read_chunk(
    src: &mut dyn RequestSource,
    out: &mut Vec<Request>,
    limit: AddressLimit,
    read: &mut u64,
) -> Result<()> {
    out.clear();
    while out.len() < CHUNK {
        match src.next_request() {
            Some(Ok(r)) => {
                *read += 1;
                limit.check(&r, *read)?;
                out.push(r)
            }
            Some(Err(e)) => return Err(e),
            None => break,
        }
    }
    Ok(())
}

pub(super) fn threads_for(spec: &SimSpec, tasks: usize) -> usize {
    let t = if spec.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        spec.threads
    };
    t.clamp(1, tasks.max(1))
}

/// Replays `source` through every configuration of `spec`.
///
/// `progress` is called from the calling thread after each chunk of
/// [`CHUNK`] requests and after each OPT size. Configurations whose policy
/// cannot be built get a [`ConfigResult::error`] instead of failing the run;
/// an invalid spec (bad block size, no cache sizes) or a trace error fails
/// it.
pub fn simulate(
    source: &mut dyn RequestSource,
    source_name: &str,
    spec: &SimSpec,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<SimReport> {
    let started = std::time::Instant::now();
    let bs = spec.block_size;
    if !bs.is_power_of_two()
        || !(tiercache_types::MIN_BLOCK_SIZE..=tiercache_types::MAX_BLOCK_SIZE).contains(&bs)
    {
        return Err(Error::Config(format!(
            "block size {bs} must be a power of two between 4 KiB and 1 MiB"
        )));
    }
    if spec.cache_sizes.is_empty() {
        return Err(Error::Config("no cache sizes to simulate".into()));
    }
    let mut notes = Vec::new();
    let mut configs: Vec<Option<ConfigResult>> = Vec::new();
    let mut tasks: Vec<Mutex<Task>> = Vec::new();
    let mut config_slot: Vec<usize> = Vec::new();
    let exact = matches!(
        spec.mrc,
        Some(MrcSpec {
            method: MrcMethod::Exact,
            ..
        })
    );
    let block_task = BlockTask {
        shift: bs.trailing_zeros(),
        summary: TraceSummary::default(),
        ids: IdMap::default(),
        refs: spec.opt.is_some().then(Vec::new),
        mrc: spec.mrc.map(|m| MrcBuilder::new(m.method, m.bucket_blocks)),
        exact,
        distinct_after: Vec::with_capacity(CHUNK),
    };
    tasks.push(Mutex::new(Task::Blocks(Box::new(block_task))));
    for &size in &spec.cache_sizes {
        for p in &spec.policies {
            match ConfigRunner::new(spec, p, size) {
                Ok(r) => {
                    config_slot.push(configs.len());
                    configs.push(None);
                    tasks.push(Mutex::new(Task::Config(Box::new(r))));
                }
                Err(e) => configs.push(Some(ConfigResult {
                    policy: policy_label(p),
                    policy_config: p.clone(),
                    cache_bytes: size,
                    cache_blocks: (size / bs as u64).min(u32::MAX as u64) as u32,
                    error: Some(e),
                    counters: Counters::default(),
                    read_hit_ratio: 0.0,
                    write_hit_ratio: 0.0,
                    miss_ratio: 0.0,
                    cleaner_writebacks: 0,
                    latency: LatencySummary::default(),
                    iops: 0.0,
                    iops_limited_by: String::new(),
                    first_touch_misses: 0,
                    warm: None,
                    window_hit_ratios: Vec::new(),
                    volumes: Vec::new(),
                })),
            }
        }
    }
    let threads = threads_for(spec, tasks.len());
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut next = Vec::with_capacity(CHUNK);
    let limit = AddressLimit::new(bs, spec.pool);
    let mut read_so_far = 0;
    read_chunk(source, &mut chunk, limit, &mut read_so_far)?;
    // The cleaner's clock: the trace's own time if it has one, else the
    // modelled time (see `ConfigRunner::set_timestamps`).
    let timed = source.has_timestamps();
    for t in &tasks {
        if let Task::Config(r) = &mut *t.lock().expect("no task panicked yet") {
            r.set_timestamps(timed);
        }
    }
    let mut done: u64 = 0;
    // Per config task (index into `tasks`): distinct blocks seen when its
    // cache became full.
    let mut distinct_at_fill: Vec<Option<u64>> = vec![None; tasks.len()];
    let mut conv = spec.converge.map(|c| ConvergeState::new(c, tasks.len()));
    let mut stopped_by = "end of input";
    // (requests, distinct blocks) after each chunk.
    let mut distinct_hist: Vec<(u64, u64)> = Vec::new();
    while !chunk.is_empty() {
        let counter = AtomicUsize::new(0);
        let read = std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = counter.fetch_add(1, Ordering::Relaxed);
                    if i >= tasks.len() {
                        break;
                    }
                    tasks[i].lock().expect("task lock").run(&chunk);
                });
            }
            read_chunk(source, &mut next, limit, &mut read_so_far)
        });
        read?;
        let chunk_start = done;
        done += chunk.len() as u64;
        note_fills(
            &tasks,
            chunk_start,
            &mut distinct_at_fill,
            &mut distinct_hist,
        );
        std::mem::swap(&mut chunk, &mut next);
        let mut fraction = source.fraction_done();
        if let Some(c) = conv.as_ref() {
            // The time bound usually comes first.
            let t = (started.elapsed().as_secs_f64() / c.spec.max_seconds).min(1.0);
            fraction = Some(fraction.map_or(t, |f| f.max(t)));
        }
        progress(&Progress {
            phase: Phase::Replay,
            requests: done,
            fraction,
        });
        if let Some(c) = conv.as_mut() {
            if c.check(&tasks, done) {
                stopped_by = "converged";
                break;
            }
            if !chunk.is_empty() && started.elapsed().as_secs_f64() >= c.spec.max_seconds {
                stopped_by = "time bound";
                break;
            }
        }
    }

    let replay_s = started.elapsed().as_secs_f64();
    // Collect per-config results and the block task.
    let mut tasks = tasks
        .into_iter()
        .map(|m| m.into_inner().expect("task lock"));
    let Some(Task::Blocks(blocks)) = tasks.next() else {
        unreachable!("the block task is first")
    };
    let BlockTask {
        mut summary,
        ids,
        refs,
        mrc,
        ..
    } = *blocks;
    let distinct = ids.len() as u64;
    for (i, (task, slot)) in tasks.zip(config_slot).enumerate() {
        if let Task::Config(r) = task {
            let mut res = r.result(spec.queue_depth);
            res.first_touch_misses = distinct;
            if let (Some(w), Some(d)) = (res.warm.as_mut(), distinct_at_fill[i + 1]) {
                w.first_touch_misses = distinct - d;
            }
            if let Some(c) = conv.as_ref() {
                res.window_hit_ratios = c.windows[i + 1].iter().copied().collect();
            }
            configs[slot] = Some(res);
        }
    }
    summary.unique_blocks = Some(distinct);
    summary.timestamps = source.has_timestamps();
    if !summary.timestamps {
        summary.duration_s = 0.0;
    }

    // OPT per size, in parallel.
    let mut opt = Vec::new();
    if let (Some(variant), Some(refs)) = (spec.opt, refs) {
        if refs.len() >= u32::MAX as usize {
            notes.push("OPT skipped: 2^32 or more block references".into());
        } else {
            let n_ids = ids.len() as usize;
            let next_use = next_uses(&refs, n_ids);
            let sizes: Vec<u64> = spec.cache_sizes.clone();
            let results: Vec<Mutex<Option<OptRun>>> =
                sizes.iter().map(|_| Mutex::new(None)).collect();
            let counter = AtomicUsize::new(0);
            let finished = AtomicUsize::new(0);
            let threads = threads_for(spec, sizes.len());
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| loop {
                        let i = counter.fetch_add(1, Ordering::Relaxed);
                        if i >= sizes.len() {
                            break;
                        }
                        let m = opt_run(&refs, &next_use, n_ids, sizes[i] / bs as u64, variant);
                        *results[i].lock().expect("opt lock") = Some(m);
                        finished.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
            progress(&Progress {
                phase: Phase::Opt,
                requests: done,
                fraction: Some(finished.load(Ordering::Relaxed) as f64 / sizes.len().max(1) as f64),
            });
            for (size, m) in sizes.iter().zip(results) {
                let run = m.into_inner().expect("opt lock").unwrap_or_default();
                let misses = run.misses;
                let n = refs.len() as u64;
                opt.push(OptResult {
                    cache_bytes: *size,
                    cache_blocks: size / bs as u64,
                    variant,
                    misses,
                    miss_ratio: if refs.is_empty() {
                        0.0
                    } else {
                        misses as f64 / refs.len() as f64
                    },
                    first_touch_misses: distinct,
                    warm: run.fill.map(|f| {
                        let warm_refs = n - f.refs;
                        WarmResult::new(
                            f.refs,
                            warm_refs,
                            warm_refs - (misses - f.misses),
                            distinct - f.distinct,
                        )
                    }),
                });
            }
        }
    }

    let mrc = mrc.map(|b| {
        let m = b.finish();
        let bsz = bs as u64;
        let mut curve: Vec<(u64, f64)> = m
            .curve(200)
            .into_iter()
            .map(|(c, r)| (c * bsz, r))
            .collect();
        // Make sure the plotted range covers the simulated sizes.
        for &s in &spec.cache_sizes {
            curve.push((s, m.miss_ratio(s / bsz)));
        }
        curve.sort_by_key(|x| x.0);
        curve.dedup_by_key(|x| x.0);
        MrcReport {
            method: m.method.label(),
            sample_rate: m.sample_rate,
            bucket_blocks: m.bucket_blocks,
            tracked_blocks: m.tracked_blocks,
            at_sizes: spec
                .cache_sizes
                .iter()
                .map(|&s| (s, m.miss_ratio(s / bsz)))
                .collect(),
            curve,
            full: Some(m),
        }
    });
    let configs: Vec<ConfigResult> = configs
        .into_iter()
        .map(|c| c.expect("every config ran"))
        .collect();
    notes.extend(fill_notes(
        spec,
        &configs,
        distinct,
        &distinct_hist,
        done as f64 / replay_s.max(1e-9),
    ));
    if let Some(c) = conv.as_ref() {
        notes.push(convergence_note(c, stopped_by, done, &configs));
    }
    if spec.mode == CacheMode::WriteBack && spec.cleaner.is_none() {
        notes.push("writeback without a cleaner: dirty blocks are never written back".into());
    }
    progress(&Progress {
        phase: Phase::Done,
        requests: done,
        fraction: Some(1.0),
    });
    Ok(SimReport {
        source: source_name.to_string(),
        spec: spec.clone(),
        trace: summary,
        configs,
        opt,
        mrc,
        elapsed_s: started.elapsed().as_secs_f64(),
        notes,
        convergence: conv.map(|c| ConvergenceReport {
            rule: c.spec.describe(),
            converged: stopped_by == "converged",
            requests: done,
            stopped_by: stopped_by.to_string(),
        }),
        pool: Vec::new(),
    })
}
