//! Policy quality over the panel of real traces (harness = false):
//! `cargo bench -p tiercache-sim --bench policy_panel`.
//!
//! For each trace of the panel (`../shared/traces/<name>/blocks.csv.zst`
//! from the workspace root, header `time_us,offset_bytes,len_bytes,op`),
//! each block size (4 KiB, 64 KiB) and each cache size of 1, 5, 10, 25 and
//! 50% of the trace's footprint (its distinct blocks at that block size),
//! runs the simulator ([`tiercache_sim::simulate`], the same Director the
//! engine runs) once with every policy: the default stack as it is
//! (`parse_policy("default")`, so it follows whatever the default
//! becomes), and lru, fifo, s3fifo, arc, sieve and smq with `always`
//! admission; writethrough, sequential cutoff 0 (no bypass); plus OPT
//! (Belady: demand, as libCacheSim's, and the bypass variant, the bound for
//! a cache with admission control).
//!
//! Per configuration: the miss ratio over block references (reads and
//! writes, as OPT counts them) and the blocks written to the cache device
//! per request (fills: read promotions and write allocations; the CSV also
//! has fills plus writethrough updates of cached blocks).
//!
//! Output (in `$POLICY_PANEL_OUT`, default `<target dir>/policy-panel/`):
//! `panel.md` (tables and the summary), `panel.csv` (one row per trace,
//! block size, cache size and policy) and `<trace>-<bs>.png` (miss ratio
//! against cache size, one line per policy, OPT dashed). Printed: the
//! tables, and per trace and size the default's miss ratio, the best of
//! lru/fifo/arc/s3fifo/sieve, the gap in points, and whether the default
//! fills more blocks per request than s3fifo; then the totals (cells
//! within 0.5 points, mean gap, worst cell, cells filling more) for the
//! panel's four traces, for any other folders (a hold-out set) and for
//! all.
//!
//! Environment: `POLICY_PANEL_TRACES` (the panel folder, default
//! `../shared/traces` from the workspace root; the bench fails if it is
//! missing, and skips with a message a trace folder that is missing; any
//! other folder in it holding a `blocks.csv.zst`, or a `trace.*` file in
//! any format `tiercache sim` detects (a libCacheSim `.vscsi` trace as
//! published, for one), runs too, after the four, in name order: a folder
//! of traces the policies were not tuned on is a hold-out check),
//! `POLICY_PANEL_ONLY` (comma-separated trace names to run),
//! `POLICY_PANEL_SIZES` (comma-separated cache sizes in % of the footprint
//! instead of 1,5,10,25,50),
//! `POLICY_PANEL_THREADS` (worker threads, default 2).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tiercache_policy::PolicyConfig;
use tiercache_sim::*;
use tiercache_types::CacheMode;

/// The policies besides the default, all with `always` admission.
const POLICIES: [&str; 6] = ["lru", "fifo", "s3fifo", "arc", "sieve", "smq"];
/// One row of results: a policy (or OPT) at one cache size.
struct Cell {
    miss_ratio: f64,
    /// Blocks filled into the cache per request (None for OPT).
    fills_per_req: Option<f64>,
    /// Fills plus writethrough updates of cached blocks, per request.
    cache_writes_per_req: Option<f64>,
}

struct SizeResult {
    pct: u32,
    blocks: u64,
    /// In column order: "default", POLICIES..., "opt", "opt-bypass".
    cells: Vec<(String, Cell)>,
}

impl SizeResult {
    fn get(&self, name: &str) -> &Cell {
        &self
            .cells
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no result for {name}"))
            .1
    }
}

struct RunResult {
    trace: String,
    block_size: u32,
    requests: u64,
    footprint: u64,
    sizes: Vec<SizeResult>,
}

fn columns() -> Vec<String> {
    let mut v = vec!["default".to_string()];
    v.extend(POLICIES.iter().map(|s| s.to_string()));
    v.push("opt".into());
    v.push("opt-bypass".into());
    v
}

/// The panel's four traces, then every other folder of `dir` that holds a
/// trace ([`trace_file`]), by name.
fn traces(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = PANEL_TRACES.iter().map(|t| t.to_string()).collect();
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| trace_file(&e.path()).is_some())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !PANEL_TRACES.contains(&n.as_str()))
        .collect();
    others.sort();
    names.extend(others);
    names
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `<target dir>/policy-panel`, found from this executable's path
/// (`<target>/<profile>/deps/policy_panel-*`), so CARGO_TARGET_DIR counts.
fn default_out() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.parent()?.parent()?.to_path_buf()))
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("policy-panel")
}

/// The trace in folder `dir` and how to read it: `blocks.csv.zst` in the
/// panel's common form, else the first `trace.*` file (by name) in
/// whatever format the simulator detects.
fn trace_file(dir: &Path) -> Option<(PathBuf, TraceOptions)> {
    let csv = dir.join("blocks.csv.zst");
    if csv.is_file() {
        return Some((csv, panel_trace_options()));
    }
    let mut others: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("trace."))
        })
        .collect();
    others.sort();
    Some((others.into_iter().next()?, TraceOptions::default()))
}

/// The cache sizes to run, in % of the footprint: `POLICY_PANEL_SIZES`
/// (comma-separated, e.g. `2,15,35`: sizes the panel's table does not
/// show, to check that a change holds beyond them), else [`PANEL_SIZE_PCTS`].
fn size_pcts() -> Vec<u32> {
    match std::env::var("POLICY_PANEL_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|p| match p.trim().parse() {
                Ok(p) if (1..=100).contains(&p) => p,
                _ => panic!("POLICY_PANEL_SIZES: {p:?} is not a percentage from 1 to 100"),
            })
            .collect(),
        Err(_) => PANEL_SIZE_PCTS.to_vec(),
    }
}

fn run_one(
    name: &str,
    path: &Path,
    options: &TraceOptions,
    block_size: u32,
    threads: usize,
) -> RunResult {
    let t0 = Instant::now();
    let fp = trace_footprint(path, options, block_size).expect("trace parses");
    let pcts = size_pcts();
    let blocks: Vec<u64> = pcts.iter().map(|&p| (fp * p as u64 / 100).max(1)).collect();
    let default = parse_policy("default").expect("the default policy");
    let mut named: Vec<(String, PolicyConfig)> = vec![("default".into(), default)];
    for p in POLICIES {
        named.push((p.into(), parse_policy(p).expect("policy name")));
    }
    // The default may be one of the others: simulate each stack once.
    let mut stacks: Vec<PolicyConfig> = Vec::new();
    for (_, c) in &named {
        if !stacks.contains(c) {
            stacks.push(c.clone());
        }
    }
    let spec = |policies: Vec<PolicyConfig>, opt| SimSpec {
        block_size,
        mode: CacheMode::WriteThrough,
        sequential_cutoff: 0,
        cache_sizes: blocks.iter().map(|b| b * block_size as u64).collect(),
        policies,
        opt: Some(opt),
        mrc: None,
        threads,
        ..SimSpec::default()
    };
    let input = Input::Trace {
        path: path.to_path_buf(),
        options: options.clone(),
    };
    let rep = run(&input, &spec(stacks, OptVariant::Demand), &|_| {}).expect("simulation runs");
    // OPT's bypass variant: a second pass without policies.
    let bypass =
        run(&input, &spec(Vec::new(), OptVariant::Bypass), &|_| {}).expect("simulation runs");
    assert_eq!(
        rep.trace.unique_blocks,
        Some(fp),
        "{name}: the simulator's distinct blocks"
    );
    let requests = rep.trace.requests;
    let mut sizes = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        let mut cells = Vec::new();
        for (label, cfg) in &named {
            let c = rep
                .configs
                .iter()
                .find(|c| c.cache_blocks as u64 == b && &c.policy_config == cfg)
                .expect("configuration ran");
            if let Some(e) = &c.error {
                panic!("{name}: {label} at {b} blocks: {e}");
            }
            let per_req = |x: u64| x as f64 / requests.max(1) as f64;
            cells.push((
                label.clone(),
                Cell {
                    miss_ratio: c.miss_ratio,
                    fills_per_req: Some(per_req(c.counters.promotions)),
                    cache_writes_per_req: Some(per_req(
                        c.counters.promotions + c.counters.write_hits,
                    )),
                },
            ));
        }
        for (label, r) in [("opt", &rep), ("opt-bypass", &bypass)] {
            let o = r.opt.iter().find(|o| o.cache_blocks == b).expect("OPT ran");
            cells.push((
                label.into(),
                Cell {
                    miss_ratio: o.miss_ratio,
                    fills_per_req: None,
                    cache_writes_per_req: None,
                },
            ));
        }
        sizes.push(SizeResult {
            pct: pcts[i],
            blocks: b,
            cells,
        });
    }
    eprintln!(
        "policy_panel: {name} {} KiB: {requests} requests, {fp} blocks, {:.1} s",
        block_size / 1024,
        t0.elapsed().as_secs_f64()
    );
    let out = out_dir();
    let png = out.join(format!("{name}-{}k.png", block_size / 1024));
    let mut plot = rep.clone();
    plot.source = format!("{name}, no sequential bypass");
    for c in &mut plot.configs {
        if c.policy_config == named[0].1 {
            c.policy = format!("default ({})", policy_label(&c.policy_config));
        }
    }
    if let Err(e) = plot::write_png(&plot, &png) {
        eprintln!("policy_panel: plot {}: {e}", png.display());
    }
    RunResult {
        trace: name.into(),
        block_size,
        requests,
        footprint: fp,
        sizes,
    }
}

fn out_dir() -> PathBuf {
    std::env::var_os("POLICY_PANEL_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(default_out)
}

fn pct(x: f64) -> String {
    format!("{:.2}", x * 100.0)
}

fn markdown(results: &[RunResult], summary: &str) -> String {
    let cols = columns();
    let default_label = policy_label(&parse_policy("default").expect("default"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Policy panel\n\nWritethrough, sequential cutoff 0, every policy with `always` \
         admission except `default` ({default_label}). Cache sizes are shares of the \
         trace's footprint (distinct blocks at the block size).\n"
    );
    let _ = writeln!(
        s,
        "## Miss ratio (%, block references)\n\n| trace | bs | size | blocks | {} |\n|---|---|---:|---:|{}",
        cols.join(" | "),
        "---:|".repeat(cols.len())
    );
    for r in results {
        for z in &r.sizes {
            let best = PANEL_BASELINES
                .iter()
                .map(|n| z.get(n).miss_ratio)
                .fold(f64::INFINITY, f64::min);
            let cells: Vec<String> = cols
                .iter()
                .map(|c| {
                    let m = z.get(c).miss_ratio;
                    if PANEL_BASELINES.contains(&c.as_str()) && m == best {
                        format!("**{}**", pct(m))
                    } else {
                        pct(m)
                    }
                })
                .collect();
            let _ = writeln!(
                s,
                "| {} | {}k | {}% | {} | {} |",
                r.trace,
                r.block_size / 1024,
                z.pct,
                z.blocks,
                cells.join(" | ")
            );
        }
    }
    let pols: Vec<&String> = cols.iter().filter(|c| !c.starts_with("opt")).collect();
    let _ = writeln!(
        s,
        "\n## Blocks filled into the cache per request\n\n| trace | bs | size | {} |\n|---|---|---:|{}",
        pols.iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(pols.len())
    );
    for r in results {
        for z in &r.sizes {
            let cells: Vec<String> = pols
                .iter()
                .map(|c| format!("{:.3}", z.get(c).fills_per_req.unwrap_or(0.0)))
                .collect();
            let _ = writeln!(
                s,
                "| {} | {}k | {}% | {} |",
                r.trace,
                r.block_size / 1024,
                z.pct,
                cells.join(" | ")
            );
        }
    }
    let _ = writeln!(s, "\n## Default against the best baseline\n\n{summary}");
    let _ = writeln!(s, "\n## Traces\n");
    for r in results {
        let _ = writeln!(
            s,
            "- {} at {} KiB: {} requests, footprint {} blocks",
            r.trace,
            r.block_size / 1024,
            r.requests,
            r.footprint
        );
    }
    s
}

fn csv(results: &[RunResult]) -> String {
    let default_label = policy_label(&parse_policy("default").expect("default"));
    let mut s = String::from(
        "trace,block_size,size_pct,cache_blocks,footprint_blocks,requests,policy,stack,\
         miss_ratio,fills_per_request,cache_writes_per_request\n",
    );
    let opt = |x: Option<f64>| x.map(|v| format!("{v:.6}")).unwrap_or_default();
    for r in results {
        for z in &r.sizes {
            for (name, c) in &z.cells {
                let stack = match name.as_str() {
                    "default" => default_label.clone(),
                    "opt" => "belady-demand".into(),
                    "opt-bypass" => "belady-bypass".into(),
                    p => format!("{p}+always"),
                };
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{},{},{:.6},{},{}",
                    r.trace,
                    r.block_size,
                    z.pct,
                    z.blocks,
                    r.footprint,
                    r.requests,
                    name,
                    stack,
                    c.miss_ratio,
                    opt(c.fills_per_req),
                    opt(c.cache_writes_per_req)
                );
            }
        }
    }
    s
}

/// One cell of the summary: where, the default's gap to the best baseline
/// in points, and whether it fills more blocks per request than s3fifo.
struct Gap {
    trace: String,
    block_size: u32,
    pct: u32,
    points: f64,
    fills_more: bool,
}

/// The totals of `gaps` as a table row: cells, cells within the bar, mean
/// gap, worst cell, cells where the default fills more than s3fifo.
fn totals_row(label: &str, gaps: &[&Gap]) -> String {
    let Some(worst) = gaps.iter().max_by(|a, b| a.points.total_cmp(&b.points)) else {
        return format!("| {label} | 0 | - | - | - | - |\n");
    };
    let within = gaps
        .iter()
        .filter(|g| g.points <= PANEL_GAP_BAR_POINTS)
        .count();
    let mean = gaps.iter().map(|g| g.points).sum::<f64>() / gaps.len() as f64;
    let fills_more = gaps.iter().filter(|g| g.fills_more).count();
    format!(
        "| {label} | {} | {within} | {mean:+.3} | {:+.2} ({} {}k {}%) | {fills_more} |\n",
        gaps.len(),
        worst.points,
        worst.trace,
        worst.block_size / 1024,
        worst.pct
    )
}

/// Per trace, block size and cache size: the default, the best baseline,
/// the gap, and the default's fills against s3fifo's; then the totals for
/// the panel's four traces, for any others (a hold-out set) and for all.
fn summary(results: &[RunResult]) -> String {
    let mut gaps = Vec::new();
    let mut s = String::from(
        "| trace | bs | size | default | best of lru/fifo/arc/s3fifo/sieve | gap (points) | default fills/req | s3fifo fills/req | default fills more |\n\
         |---|---|---:|---:|---|---:|---:|---:|---|\n",
    );
    for r in results {
        for z in &r.sizes {
            let d = z.get("default");
            let (best_name, best) = PANEL_BASELINES
                .iter()
                .map(|n| (*n, z.get(n).miss_ratio))
                .fold(("", f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
            let (df, sf) = (
                d.fills_per_req.unwrap_or(0.0),
                z.get("s3fifo").fills_per_req.unwrap_or(0.0),
            );
            let gap = Gap {
                trace: r.trace.clone(),
                block_size: r.block_size,
                pct: z.pct,
                points: (d.miss_ratio - best) * 100.0,
                fills_more: df > sf,
            };
            let _ = writeln!(
                s,
                "| {} | {}k | {}% | {} | {} {} | {:+.2} | {:.3} | {:.3} | {} |",
                r.trace,
                r.block_size / 1024,
                z.pct,
                pct(d.miss_ratio),
                best_name,
                pct(best),
                gap.points,
                df,
                sf,
                if gap.fills_more { "yes" } else { "no" }
            );
            gaps.push(gap);
        }
    }
    let (panel, others): (Vec<&Gap>, Vec<&Gap>) = gaps
        .iter()
        .partition(|g| PANEL_TRACES.contains(&g.trace.as_str()));
    let _ = write!(
        s,
        "\nTotals (the bar: within {PANEL_GAP_BAR_POINTS} points of the best baseline, \
         filling no more than s3fifo):\n\n\
         | traces | cells | within {PANEL_GAP_BAR_POINTS} | mean gap | worst | default fills more |\n\
         |---|---:|---:|---:|---|---:|\n{}{}{}",
        totals_row("the panel's four", &panel),
        totals_row("others", &others),
        totals_row("all", &gaps.iter().collect::<Vec<_>>()),
    );
    s
}

fn main() {
    let started = Instant::now();
    let dir = std::env::var_os("POLICY_PANEL_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/traces"));
    if !dir.is_dir() {
        eprintln!(
            "policy_panel: the trace panel folder {} is missing (set POLICY_PANEL_TRACES)",
            dir.display()
        );
        std::process::exit(1);
    }
    let only: Option<Vec<String>> = std::env::var("POLICY_PANEL_ONLY")
        .ok()
        .map(|s| s.split(',').map(|t| t.trim().to_string()).collect());
    let threads: usize = std::env::var("POLICY_PANEL_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let out = out_dir();
    std::fs::create_dir_all(&out).expect("create the output folder");
    let mut results = Vec::new();
    for name in traces(&dir) {
        let name = name.as_str();
        if only.as_ref().is_some_and(|o| !o.iter().any(|t| t == name)) {
            continue;
        }
        let Some((path, options)) = trace_file(&dir.join(name)) else {
            eprintln!(
                "policy_panel: skipping {name}: no blocks.csv.zst or trace.* in {}",
                dir.join(name).display()
            );
            continue;
        };
        for bs in PANEL_BLOCK_SIZES {
            results.push(run_one(name, &path, &options, bs, threads));
        }
    }
    if results.is_empty() {
        eprintln!("policy_panel: no trace ran");
        std::process::exit(1);
    }
    let sum = summary(&results);
    let md = markdown(&results, &sum);
    std::fs::write(out.join("panel.md"), &md).expect("write panel.md");
    std::fs::write(out.join("panel.csv"), csv(&results)).expect("write panel.csv");
    println!("{md}");
    println!(
        "policy_panel: wrote {}/panel.md, panel.csv and one plot per trace and block size in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
}
