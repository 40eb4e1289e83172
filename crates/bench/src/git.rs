//! The study's real-application check, scaled: a generated git repository
//! (no network) cloned from a local bare repository onto ext4 on the served
//! device, then `git grep -q` for a word that is not there (so every file is
//! read), with the page cache emptied before each grep.
//!
//! The device is made a block device the way crates/cli/tests/e2e.rs does:
//! nbdfuse exposes the export as a file, losetup makes it a loop device,
//! mkfs.ext4 and mount. "Caches dropped" means the whole stack is taken
//! down and put up again (umount, losetup -d, fusermount3 -u, then attach
//! and mount again) while the server keeps running: that empties ext4's
//! and the loop device's page caches (the loop device uses direct IO, so
//! the FUSE file has none), and works where
//! writing /proc/sys/vm/drop_caches is not allowed (containers). The
//! tiercache server keeps its cache, as the study's did.

use crate::procs::{have, Server, Stats};
use crate::{report::fmt_bytes, BenchArgs, Settings};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Planned seconds of the git workload, for the progress bar.
pub const PLANNED_SECS: f64 = 180.0;

/// A word no generated file contains.
const ABSENT_WORD: &str = "zyzzogeton";

#[derive(Clone, Debug, Serialize)]
pub struct GitRun {
    pub label: String,
    pub clone_secs: f64,
    /// Seconds of each `git grep -q` (cold page cache each).
    pub grep_secs: Vec<f64>,
    /// tiercache only: its counters over all the greps (block reads, hit
    /// ratio, IOs bypassed as sequential).
    pub grep_reads: Option<u64>,
    pub grep_hit_ratio: Option<f64>,
    pub grep_bypassed_ios: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GitResults {
    pub files: usize,
    pub commits: usize,
    pub repo_bytes: u64,
    /// Bytes of the checked-out work tree plus .git, on ext4.
    pub checkout_bytes: u64,
    pub device_size: u64,
    pub cache_size: u64,
    pub runs: Vec<GitRun>,
    /// Why the workload did not run, if it did not.
    pub skipped: Option<String>,
}

impl GitResults {
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(why) = &self.skipped {
            let _ = writeln!(s, "SKIPPED: {why}");
            return s;
        }
        let _ = writeln!(
            s,
            "A generated repository ({} files, {} commits, {} packed; {} on ext4 after the \
             checkout) cloned from a local bare repository onto ext4 on a {} device (clone time \
             includes `sync`), then `git grep -q {ABSENT_WORD}` (absent, so every file is read) \
             with every cache above the device emptied before each run (umount, loop and FUSE \
             detached). tiercache ({} cache file, default policy and mode) keeps its cache across \
             the greps, as in the study.\n",
            self.files,
            self.commits,
            fmt_bytes(self.repo_bytes),
            fmt_bytes(self.checkout_bytes),
            fmt_bytes(self.device_size),
            fmt_bytes(self.cache_size),
        );
        let _ = writeln!(
            s,
            "| configuration | clone | first git grep | git grep, median of the rest | tiercache counters over the greps |"
        );
        s.push_str("|---|---:|---:|---:|---|\n");
        for r in &self.runs {
            let rest = median(r.grep_secs.get(1..).unwrap_or(&[]));
            let counters = match (r.grep_reads, r.grep_hit_ratio, r.grep_bypassed_ios) {
                (Some(n), h, b) => format!(
                    "{n} block reads, hit ratio {}, {} IOs bypassed (sequential)",
                    crate::report::fmt_ratio(h),
                    b.unwrap_or(0)
                ),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {:.2} s | {} | {} | {counters} |",
                r.label,
                r.clone_secs,
                r.grep_secs
                    .first()
                    .map(|v| format!("{v:.2} s"))
                    .unwrap_or("-".into()),
                rest.map(|v| format!("{v:.2} s")).unwrap_or("-".into())
            );
        }
        s
    }
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Why this machine cannot run the workload, if it cannot.
fn unavailable() -> Option<String> {
    for tool in [
        "git",
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "mount",
        "umount",
        "fusermount3",
    ] {
        if !have(tool) {
            return Some(format!("{tool} is not installed (`make deps`)"));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing (no FUSE here)".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (losetup, mount)".into());
    }
    None
}

pub fn run(
    exe: &Path,
    work: &Path,
    st: &Settings,
    args: &BenchArgs,
    say: &mut dyn FnMut(&str),
) -> Result<GitResults> {
    let files = args.git_files.max(10);
    let commits = 20;
    // Large enough for ext4 to spread directories over several block
    // groups (128 MiB each), as on a real disk, so the slow device seeks;
    // sparse, so it costs nothing. The cache holds a quarter of it (the
    // study: 4 GiB for a 50 GiB disk and a 1-2 GiB repository).
    let device_size = 1u64 << 30;
    let cache_size = (device_size / 4).max(st.cache_size);
    let mut res = GitResults {
        files,
        commits,
        repo_bytes: 0,
        checkout_bytes: 0,
        device_size,
        cache_size,
        runs: Vec::new(),
        skipped: None,
    };
    if let Some(why) = unavailable() {
        say(&format!("  git workload SKIPPED: {why}"));
        res.skipped = Some(why);
        return Ok(res);
    }
    let dir = work.join("git");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("src.git");
    generate_repo(&src, files, commits)?;
    res.repo_bytes = dir_size(&src);

    let configs: [(&str, bool, bool); 3] = [
        ("slow device alone (HDD model)", true, false),
        ("fast device alone", false, false),
        ("tiercache", true, true),
    ];
    for (label, hdd, cached) in configs {
        let dev = dir.join("device.img");
        let cache = dir.join("cache.img");
        let _ = std::fs::remove_file(&dev);
        std::fs::File::create(&dev)?.set_len(device_size)?;
        if cached {
            crate::files::blank_device_file(&cache, cache_size)?;
        }
        let mut sargs = vec![
            "--backing".to_string(),
            if hdd {
                format!("hdd:{}", dev.display())
            } else {
                dev.display().to_string()
            },
        ];
        if cached {
            sargs.extend([
                "--cache".into(),
                cache.display().to_string(),
                "--block-size".into(),
                st.block_size.to_string(),
            ]);
        }
        let server = Server::tiercache(exe, &dir, "git", &sargs)?;
        match measure(&server, &dir, &src, args.git_greps.max(1)) {
            Ok((clone_secs, grep_secs, checkout, counters)) => {
                res.checkout_bytes = res.checkout_bytes.max(checkout);
                say(&format!(
                    "  git, {label}: clone {clone_secs:.2} s, greps {:?}",
                    grep_secs
                        .iter()
                        .map(|v| format!("{v:.2}"))
                        .collect::<Vec<_>>()
                ));
                res.runs.push(GitRun {
                    label: label.to_string(),
                    clone_secs,
                    grep_secs,
                    grep_reads: counters.map(|c| c.read_hits + c.read_misses),
                    grep_hit_ratio: counters.and_then(|c| c.hit_ratio()),
                    grep_bypassed_ios: counters.map(|c| c.bypassed_ios),
                });
            }
            Err(e) => {
                let why = format!("{label}: {e:#}");
                say(&format!("  git workload SKIPPED: {why}"));
                res.skipped = Some(why);
                server.stop().ok();
                break;
            }
        }
        server.stop()?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(res)
}

/// Clone time, grep times, bytes used on ext4 after the clone, and (for a
/// cached server) its counters over the greps.
fn measure(
    s: &Server,
    dir: &Path,
    src: &Path,
    greps: usize,
) -> Result<(f64, Vec<f64>, u64, Option<Stats>)> {
    let mnt = dir.join("fuse");
    let fs = dir.join("fs");
    std::fs::create_dir_all(&mnt)?;
    std::fs::create_dir_all(&fs)?;
    let mut stack = Stack::default();
    stack.attach(s, &mnt, dir)?;
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(stack.dev()?),
    )?;
    stack.mount(&fs)?;
    let repo = fs.join("repo");
    let t = Instant::now();
    run_ok(
        Command::new("git")
            .args(["clone", "-q", "--no-hardlinks"])
            .arg(format!("file://{}", src.display()))
            .arg(&repo),
    )?;
    run_ok(Command::new("sync").arg("-f").arg(&repo))?;
    let clone_secs = t.elapsed().as_secs_f64();
    let checkout = used_bytes(&fs);
    let before = s.control.as_ref().map(|_| s.stats()).transpose()?;
    let mut times = Vec::new();
    for _ in 0..greps {
        stack.release();
        stack.attach(s, &mnt, dir)?;
        stack.mount(&fs)?;
        let t = Instant::now();
        let st = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["grep", "-q", ABSENT_WORD])
            .stdout(Stdio::null())
            .status()?;
        let secs = t.elapsed().as_secs_f64();
        // Exit 1: no match, the expected outcome.
        if st.code() != Some(1) {
            bail!("git grep exited with {st} (expected 1: no match)");
        }
        times.push(secs);
    }
    stack.release();
    let counters = match before {
        Some(b) => Some(s.stats()?.since(&b)),
        None => None,
    };
    Ok((clone_secs, times, checkout, counters))
}

/// Bytes in use on the filesystem mounted at `p` (df).
fn used_bytes(p: &Path) -> u64 {
    Command::new("df")
        .args(["-B1", "--output=used"])
        .arg(p)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .and_then(|l| l.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// nbdfuse + loop device + mount, undone in reverse order on release/drop.
#[derive(Default)]
struct Stack {
    fuse: Option<(PathBuf, Child)>,
    loop_dev: Option<String>,
    fs: Option<PathBuf>,
}

impl Stack {
    fn attach(&mut self, s: &Server, mnt: &Path, dir: &Path) -> Result<()> {
        let pidfile = dir.join("nbdfuse.pid");
        let _ = std::fs::remove_file(&pidfile);
        let mut child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(mnt)
            .arg(s.uri())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting nbdfuse")?;
        let start = Instant::now();
        while !pidfile.exists() {
            if let Some(st) = child.try_wait()? {
                bail!("nbdfuse exited with {st}");
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                bail!("nbdfuse did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.fuse = Some((mnt.to_path_buf(), child));
        // Direct IO: the loop device reads the FUSE file without its page
        // cache, whose readahead would otherwise act as device-wide
        // readahead (one 128 KiB read bringing in dozens of small files),
        // which a real block device does not do.
        let out = Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(mnt.join("nbd"))
            .output()?;
        if !out.status.success() {
            bail!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        self.loop_dev = Some(String::from_utf8(out.stdout)?.trim().to_string());
        Ok(())
    }

    fn dev(&self) -> Result<&str> {
        self.loop_dev.as_deref().context("no loop device")
    }

    fn mount(&mut self, fs: &Path) -> Result<()> {
        run_ok(Command::new("mount").arg(self.dev()?).arg(fs)).context("mount")?;
        self.fs = Some(fs.to_path_buf());
        Ok(())
    }

    fn release(&mut self) {
        if let Some(m) = self.fs.take() {
            let _ = Command::new("umount").arg(&m).status();
        }
        if let Some(l) = self.loop_dev.take() {
            let _ = Command::new("losetup").args(["-d", &l]).status();
        }
        if let Some((m, mut c)) = self.fuse.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&m)
                .stderr(Stdio::null())
                .status();
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.release();
    }
}

fn run_ok(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Deterministic pseudo-random words.
struct Words(u64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn word(&mut self) -> String {
        const SYL: [&str; 16] = [
            "ka", "lo", "mi", "ne", "ru", "ta", "si", "po", "de", "fu", "ga", "hi", "be", "vo",
            "wu", "ch",
        ];
        let n = 1 + self.next() % 4;
        (0..n).map(|_| SYL[(self.next() % 16) as usize]).collect()
    }
    fn text(&mut self, bytes: usize) -> String {
        let mut s = String::with_capacity(bytes + 80);
        while s.len() < bytes {
            let line_words = 6 + self.next() % 8;
            for i in 0..line_words {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str(&self.word());
            }
            s.push('\n');
        }
        s
    }
}

/// A bare repository with `files` text files (about 2-6 KiB each, in
/// directories of 100) and `commits` commits, the later ones changing a few
/// percent of the files, built with `git fast-import` (fast, no network).
fn generate_repo(bare: &Path, files: usize, commits: usize) -> Result<()> {
    run_ok(Command::new("git").args(["init", "-q", "--bare"]).arg(bare))?;
    let mut child = Command::new("git")
        .arg("--git-dir")
        .arg(bare)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("git fast-import")?;
    let mut w = std::io::BufWriter::new(child.stdin.take().expect("piped"));
    let mut words = Words(0x2545_F491_4F6C_DD1D);
    let path = |i: usize| format!("src/d{:03}/file{:05}.txt", i / 100, i);
    for c in 0..commits {
        let msg = format!("commit {c}\n");
        writeln!(w, "commit refs/heads/main")?;
        writeln!(
            w,
            "committer Bench <bench@example.invalid> {} +0000",
            1_600_000_000 + c * 3600
        )?;
        writeln!(w, "data {}\n{msg}", msg.len())?;
        let changed: Vec<usize> = if c == 0 {
            (0..files).collect()
        } else {
            (0..files.div_ceil(30))
                .map(|_| (words.next() % files as u64) as usize)
                .collect()
        };
        for i in changed {
            let size = 2048 + (words.next() % 4096) as usize;
            let body = words.text(size);
            writeln!(w, "M 100644 inline {}", path(i))?;
            writeln!(w, "data {}", body.len())?;
            w.write_all(body.as_bytes())?;
            writeln!(w)?;
        }
    }
    w.flush()?;
    drop(w);
    let st = child.wait()?;
    if !st.success() {
        bail!("git fast-import failed: {st}");
    }
    run_ok(Command::new("git").arg("--git-dir").arg(bare).args([
        "symbolic-ref",
        "HEAD",
        "refs/heads/main",
    ]))?;
    run_ok(
        Command::new("git")
            .arg("--git-dir")
            .arg(bare)
            .args(["repack", "-adq"]),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_repo_has_the_files_and_not_the_word() {
        if !have("git") {
            tiercache_testkit::skip(
                "generated_repo_has_the_files_and_not_the_word",
                "git is not installed",
            );
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let bare = d.path().join("r.git");
        generate_repo(&bare, 30, 3).unwrap();
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&bare)
            .args(["ls-tree", "-r", "--name-only", "main"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 30);
        let n = Command::new("git")
            .arg("--git-dir")
            .arg(&bare)
            .args(["rev-list", "--count", "main"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&n.stdout).trim(), "3");
        let mut w = Words(1);
        assert!(!w.text(100_000).contains(ABSENT_WORD));
    }

    #[test]
    fn median_of_rest() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }
}
