//! [`run`]: the whole benchmark, round after round, then the sweep, the git
//! workload and the report.

use crate::ctx::Ctx;
use crate::files::{sparse_file, write_file};
use crate::procs::{self, MemCgroup};
use crate::progress::Progress;
use crate::report;
use crate::run_result;
use crate::settings::{BenchArgs, Settings};
use crate::table::{nbdkit_label, Config, RowKey, Table};
use crate::variant::variants;
use crate::{git, Results};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Runs the benchmark; `tiercache_exe` is the `tiercache` executable whose
/// `serve` command provides every configuration but nbdkit's.
/// With `--pool`, the pool benchmark instead (`pool.rs`).
pub fn run(args: &BenchArgs, tiercache_exe: &Path) -> Result<()> {
    if args.pool {
        return crate::pool::run(args, tiercache_exe);
    }
    let started = std::time::Instant::now();
    let st = Settings::resolve(args)?;
    if !procs::have("fio") {
        bail!("fio is not installed (run `make deps` or scripts/install-deps.sh)");
    }
    let work = args.work_dir.clone();
    let out = args.out_dir.clone().unwrap_or_else(|| work.join("report"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let runs_dir = work.join("runs");
    std::fs::create_dir_all(&runs_dir)?;
    let vars = variants(args);
    let mut notes = Vec::new();
    let nbdkit = !args.no_nbdkit && procs::have("nbdkit");
    if !args.no_nbdkit && !nbdkit {
        notes.push(
            "nbdkit is not installed: its cache filter was not measured (`make deps`).".into(),
        );
    }
    // Whether a memory cgroup can be made here (root, controller present).
    let memcg = nbdkit
        && match MemCgroup::create("probe", 1 << 30) {
            Ok(_) => true,
            Err(e) => {
                notes.push(format!(
                    "the memory-capped nbdkit was not measured: {e:#}; tiercache's file cache has no like-for-like peer in this run"
                ));
                false
            }
        };

    // The configurations of a round, in forward order.
    let mut configs = vec![Config::Fast];
    configs.extend((0..vars.len()).map(Config::Tiercache));
    if memcg {
        configs.push(Config::Nbdkit { capped: true });
    }
    if nbdkit {
        configs.push(Config::Nbdkit { capped: false });
    }

    // The table rows, in table order.
    let only_default = vars.iter().filter(|v| !v.ram).count() == 1;
    let mut table = Table::new(&vars, only_default, memcg, nbdkit);

    // The plan, for the progress bar: (label, planned seconds).
    let t = st.runtime as f64;
    let fill_secs = 2.0 + st.junk_size as f64 / st.block_size as f64 / 150.0;
    let pair_secs = 2.0 * t + fill_secs + 1.0;
    let round_secs: f64 = configs
        .iter()
        .map(|c| match c {
            Config::Fast => t + 1.0,
            _ => pair_secs,
        })
        .sum();
    let mut plan: Vec<f64> = vec![5.0, t + 1.0];
    for _ in 0..st.repeats {
        plan.extend(configs.iter().map(|c| match c {
            Config::Fast => t + 1.0,
            _ => pair_secs,
        }));
    }
    let sweep_point_secs = (st.sweep_runtime + st.sweep_runtime.div_ceil(2)) as f64 + 2.0;
    if args.sweep {
        plan.extend(args.sweep_factors.iter().map(|_| sweep_point_secs));
    }
    if args.git {
        plan.push(git::PLANNED_SECS);
    }
    let mut prog = Progress::new(plan.iter().sum(), plan.len());
    prog.println(&format!(
        "tiercache bench: data {} (2 jobs), cache {}, blocks {}, {} s per run, {} round(s) of {} configurations (~{:.0} s each); work dir {}",
        report::fmt_bytes(st.data_size),
        report::fmt_bytes(st.cache_size),
        report::fmt_bytes(st.block_size),
        st.runtime,
        st.repeats,
        configs.len(),
        round_secs,
        work.display()
    ));

    prog.step("writing the device files", 5.0);
    let fast = work.join("fast.img");
    let backing = work.join("backing.img");
    write_file(&fast, st.data_size)?;
    sparse_file(&backing, st.junk_size + st.data_size)?;

    let ctx = Ctx {
        exe: tiercache_exe.to_path_buf(),
        work: work.clone(),
        runs: runs_dir.clone(),
        st: st.clone(),
    };

    prog.step("slow device alone (emulated HDD)", t + 1.0);
    let s = ctx.baseline(&format!("hdd:{}", backing.display()), "slow", 0)?;
    table.push(RowKey::Slow, s);

    let mut cap: Option<u64> = args.nbdkit_memory;
    for round in 0..st.repeats {
        let mut order = configs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for c in &order {
            let tag = format!("round {}/{}", round + 1, st.repeats);
            match c {
                Config::Fast => {
                    prog.step(&format!("{tag}: fast device alone"), t + 1.0);
                    let s = ctx.baseline(&format!("{}", fast.display()), "fast", round)?;
                    prog.println(&format!(
                        "  {tag}: fast device alone: {:.0} IOPS",
                        s.measured.iops
                    ));
                    table.push(RowKey::Fast, s);
                }
                Config::Tiercache(i) => {
                    let v = &vars[*i];
                    let label = v.label(only_default);
                    prog.step(&format!("{tag}: {label}"), pair_secs);
                    match ctx.tiercache_pair(v, &backing, round, &label) {
                        Ok((empty, stale, rss)) => {
                            if cap.is_none() && !v.ram {
                                cap = rss;
                            }
                            report_pair(&prog, &tag, &label, &empty, &stale);
                            let key = |stale| RowKey::Tiercache { variant: *i, stale };
                            table.push(key(false), empty);
                            table.push(key(true), stale);
                        }
                        Err(e) => {
                            prog.println(&format!("  {tag}: {label}: FAILED: {e:#}"));
                            notes.push(format!("{tag}: {label}: failed: {e:#}"));
                        }
                    }
                }
                Config::Nbdkit { capped } => {
                    let name = nbdkit_label(*capped);
                    prog.step(&format!("{tag}: {name}"), pair_secs);
                    let limit = match (capped, cap) {
                        (false, _) => None,
                        (true, Some(c)) => Some(c),
                        (true, None) => {
                            notes.push(format!(
                                "{tag}: {name}: skipped, tiercache's memory use was not measured yet"
                            ));
                            continue;
                        }
                    };
                    match ctx.nbdkit_pair(&backing, round, limit) {
                        Ok((empty, stale)) => {
                            report_pair(&prog, &tag, name, &empty, &stale);
                            let capped = *capped;
                            table.push(
                                RowKey::Nbdkit {
                                    capped,
                                    stale: false,
                                },
                                empty,
                            );
                            table.push(
                                RowKey::Nbdkit {
                                    capped,
                                    stale: true,
                                },
                                stale,
                            );
                        }
                        Err(e) => {
                            prog.println(&format!("  {tag}: {name}: FAILED: {e:#}"));
                            notes.push(format!("{tag}: {name}: failed: {e:#}"));
                        }
                    }
                }
            }
        }
    }

    let mut sweep = Vec::new();
    if args.sweep {
        let max = args.sweep_factors.iter().copied().fold(0.0f64, f64::max);
        let sweep_backing = work.join("sweep-backing.img");
        let unit = 2 * st.block_size;
        let size_of = |f: f64| ((st.cache_size as f64 * f) as u64 / unit).max(1) * unit;
        sparse_file(&sweep_backing, size_of(max))?;
        for &f in &args.sweep_factors {
            prog.step(&format!("sweep: data = {f}x cache"), sweep_point_secs);
            match ctx.sweep_point(&vars[0], &sweep_backing, f, size_of(f)) {
                Ok(p) => {
                    prog.println(&format!(
                        "  sweep {f}x ({}): {:.0} IOPS, hit ratio {}",
                        report::fmt_bytes(p.data_size),
                        p.measured.iops,
                        report::fmt_ratio(p.hit_ratio)
                    ));
                    sweep.push(p)
                }
                Err(e) => notes.push(format!("sweep {f}x: failed: {e:#}")),
            }
        }
        let _ = std::fs::remove_file(&sweep_backing);
    }

    let git = if args.git {
        prog.step("git workload", git::PLANNED_SECS);
        match git::run(&ctx.exe, &work, &st, args, &mut |l| prog.println(l)) {
            Ok(g) => Some(g),
            Err(e) => {
                notes.push(format!("git workload: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    prog.finish();

    let runs = table.into_results();
    let threshold = runs
        .iter()
        .find(|r| r.kind == run_result::Kind::Fast)
        .and_then(|r| r.measured.pct(99.0))
        .unwrap_or(0);
    let results = Results {
        settings: st,
        variants: vars,
        runs,
        sweep,
        fast_threshold_ns: threshold,
        nbdkit_memory_cap: if memcg { cap } else { None },
        git,
        notes,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    let summary = report::write(&results, &out)?;
    println!("{summary}");
    println!(
        "report: {} (the benchmark took {:.0} s)",
        out.join("REPORT.md").display(),
        results.elapsed_secs
    );
    if !args.keep_files {
        for f in [&fast, &backing, &work.join("cache.img")] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&runs_dir);
    }
    Ok(())
}

fn report_pair(
    prog: &Progress,
    tag: &str,
    label: &str,
    empty: &run_result::Sample,
    stale: &run_result::Sample,
) {
    prog.println(&format!(
        "  {tag}: {label}: empty {:.0} IOPS (hits {}), stale {:.0} IOPS (hits {}); other processes used {} / {} of the CPU",
        empty.measured.iops,
        report::fmt_ratio(empty.hit_ratio),
        stale.measured.iops,
        report::fmt_ratio(stale.hit_ratio),
        report::fmt_ratio(empty.others_cpu),
        report::fmt_ratio(stale.others_cpu),
    ));
}
