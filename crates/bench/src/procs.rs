//! The servers a benchmark configuration runs: `tiercache serve` children
//! (with or without a cache) and nbdkit with its cache filter. Each is a
//! child process that is stopped (SIGTERM, then SIGKILL after a grace
//! period) when its handle is dropped, so a failed run leaves nothing
//! behind.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server child.
pub struct Server {
    pub name: String,
    child: Option<Child>,
    pub socket: PathBuf,
    /// tiercache's control socket (cached tiercache servers only).
    pub control: Option<PathBuf>,
    pub log: PathBuf,
    exe: PathBuf,
}

/// Counters read from `tiercache stats --json`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    pub read_hits: u64,
    pub read_misses: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub resident: u64,
    pub capacity: u64,
    /// IOs that bypassed the cache (sequential streams).
    pub bypassed_ios: u64,
}

impl Stats {
    /// Counters accumulated since `before` (resident/capacity are "now").
    pub fn since(&self, before: &Stats) -> Stats {
        Stats {
            read_hits: self.read_hits - before.read_hits,
            read_misses: self.read_misses - before.read_misses,
            promotions: self.promotions - before.promotions,
            demotions: self.demotions - before.demotions,
            bypassed_ios: self.bypassed_ios - before.bypassed_ios,
            ..*self
        }
    }

    /// read_hits / (read_hits + read_misses), None before any read.
    pub fn hit_ratio(&self) -> Option<f64> {
        let t = self.read_hits + self.read_misses;
        (t > 0).then(|| self.read_hits as f64 / t as f64)
    }
}

impl Server {
    /// The NBD URI fio and nbdkit connect to.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///default?socket={}", self.socket.display())
    }

    /// Starts `tiercache serve` (`exe` is the tiercache executable) with
    /// `args` plus `--socket`/`--control` in `dir`, and waits until it
    /// accepts connections (its socket exists; with a cache, also its
    /// control socket).
    pub fn tiercache(exe: &Path, dir: &Path, name: &str, args: &[String]) -> Result<Server> {
        let socket = dir.join(format!("{name}.sock"));
        let control = dir.join(format!("{name}.ctl"));
        let log = dir.join(format!("{name}.serve.log"));
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&control);
        let cached = args.iter().any(|a| a == "--cache");
        let logf = std::fs::File::create(&log)?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve").args(args);
        if cached && !args.iter().any(|a| a == "--create") {
            // A fresh cache file holds no tiercache metadata yet.
            cmd.arg("--create");
        }
        let child = cmd
            .arg("--socket")
            .arg(&socket)
            .arg("--control")
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("starting {} serve", exe.display()))?;
        let mut s = Server {
            name: name.to_string(),
            child: Some(child),
            socket: socket.clone(),
            control: cached.then_some(control.clone()),
            log,
            exe: exe.to_path_buf(),
        };
        let ready: Vec<PathBuf> = if cached {
            vec![socket, control]
        } else {
            vec![socket]
        };
        s.wait_ready(&ready)?;
        Ok(s)
    }

    /// Starts nbdkit's cache filter (cache-on-read, `cache_size` bytes at
    /// most, blocks of `block_size`) in front of the NBD server at
    /// `backend_socket`, with its cache file in `dir` (TMPDIR, the same
    /// filesystem as the fast device's file). With `cgroup`, nbdkit runs
    /// in that memory cgroup from its first instruction, so its page cache
    /// (where its cache file lives) is bounded. The log filter under the
    /// cache filter logs the reads that reach the backend (the misses) to
    /// `<name>.nbdkit-backend.log`; see [`nbdkit_backend_reads`].
    pub fn nbdkit_cache(
        dir: &Path,
        name: &str,
        backend_socket: &Path,
        cache_size: u64,
        block_size: u64,
        cgroup: Option<&MemCgroup>,
    ) -> Result<Server> {
        let socket = dir.join(format!("{name}.sock"));
        let pidfile = dir.join(format!("{name}.pid"));
        let log = dir.join(format!("{name}.nbdkit.log"));
        let tmp = dir.join(format!("{name}.tmp"));
        let backend_log = Self::nbdkit_backend_log(dir, name);
        std::fs::create_dir_all(&tmp)?;
        for p in [&socket, &pidfile, &backend_log] {
            let _ = std::fs::remove_file(p);
        }
        let logf = std::fs::File::create(&log)?;
        let mut cmd = match cgroup {
            // The shell joins the cgroup, then becomes nbdkit (same pid).
            Some(cg) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg("echo $$ > \"$0\" && exec \"$@\"")
                    .arg(cg.procs_file())
                    .arg("nbdkit");
                c
            }
            None => Command::new("nbdkit"),
        };
        let child = cmd
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&socket)
            .arg("-P")
            .arg(&pidfile)
            .args(["--filter=cache", "--filter=log", "nbd"])
            .arg(format!("socket={}", backend_socket.display()))
            .arg("export=default")
            .arg("cache-on-read=true")
            .arg(format!("cache-max-size={cache_size}"))
            .arg(format!("cache-min-block-size={block_size}"))
            .arg(format!("logfile={}", backend_log.display()))
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("starting nbdkit (is it installed? `make deps`)")?;
        let mut s = Server {
            name: name.to_string(),
            child: Some(child),
            socket,
            control: None,
            log,
            exe: PathBuf::new(),
        };
        // nbdkit writes its pid file once it accepts connections.
        s.wait_ready(&[pidfile])?;
        Ok(s)
    }

    /// Where [`Server::nbdkit_cache`] logs the backend's requests.
    pub fn nbdkit_backend_log(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.nbdkit-backend.log"))
    }

    /// The child's process id (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The child's peak resident set (VmHWM) in bytes, while it runs.
    pub fn peak_rss(&self) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        parse_status_kb(&text, "VmHWM:").map(|kb| kb * 1024)
    }

    fn wait_ready(&mut self, paths: &[PathBuf]) -> Result<()> {
        let start = Instant::now();
        while !paths.iter().all(|p| p.exists()) {
            if let Some(st) = self.child.as_mut().expect("running").try_wait()? {
                bail!("{} exited with {st}: {}", self.name, self.log_text());
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("{} did not start in 30 s: {}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// tiercache's own counters (`tiercache stats --json`).
    pub fn stats(&self) -> Result<Stats> {
        let ctl = self
            .control
            .as_ref()
            .context("this server has no control socket")?;
        let out = Command::new(&self.exe)
            .args(["stats", "--json", "--control"])
            .arg(ctl)
            .output()?;
        if !out.status.success() {
            bail!(
                "tiercache stats failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let d = &v["decisions"];
        let g = |k: &str| d[k].as_u64().unwrap_or(0);
        Ok(Stats {
            read_hits: g("read_hits"),
            read_misses: g("read_misses"),
            promotions: g("promotions"),
            demotions: g("demotions"),
            resident: g("resident"),
            capacity: g("capacity"),
            bypassed_ios: g("bypassed_ios"),
        })
    }

    /// SIGTERM, then wait (SIGKILL after 20 s). Errors if the child did
    /// not exit cleanly.
    pub fn stop(mut self) -> Result<()> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is
        // our own child's, not yet reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(st) = c.try_wait()? {
                if !st.success() {
                    bail!("{} exited with {st}: {}", self.name, self.log_text());
                }
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = c.kill();
                let _ = c.wait();
                bail!("{} did not stop within 20 s after SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Reads issued to the backend so far, from the log filter's file
/// (`... connection=N Read id=I offset=... count=...` per request; the
/// matching `...Read id=I return=...` lines are not counted).
pub fn nbdkit_backend_reads(log: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    Some(count_nbdkit_reads(&text))
}

fn count_nbdkit_reads(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.contains(" Read id=") && l.contains(" offset="))
        .count() as u64
}

/// `key` (e.g. `VmHWM:`) of a /proc/PID/status text, in kB.
fn parse_status_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// A memory cgroup of its own (cgroup v1 `memory` controller, or cgroup
/// v2 where the root delegates `memory`), removed on drop. Page cache is
/// charged to the cgroup of the process that brings a page in, so a
/// process started inside keeps at most `limit` bytes of anonymous memory
/// and page cache together.
pub struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// Creates `tiercache-bench-<pid>-<name>` with a limit of `limit`
    /// bytes. Fails without root or without a memory controller.
    pub fn create(name: &str, limit: u64) -> Result<MemCgroup> {
        let leaf = format!("tiercache-bench-{}-{name}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&leaf), false)
        } else {
            let root = Path::new("/sys/fs/cgroup");
            let ctl =
                std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !ctl.split_whitespace().any(|c| c == "memory") {
                bail!("no memory cgroup controller (neither cgroup v1 memory nor v2 with memory delegated at the root)");
            }
            (root.join(&leaf), true)
        };
        if !dir.exists() {
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating cgroup {} (needs root)", dir.display()))?;
        }
        let cg = MemCgroup { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(file), limit.to_string())
            .with_context(|| format!("setting {file} of {}", cg.dir.display()))?;
        if !v2 {
            // Reclaim rather than swap: the bench measures a page-cache
            // budget, not swap.
            let _ = std::fs::write(cg.dir.join("memory.swappiness"), "0");
        }
        Ok(cg)
    }

    /// Writing a pid here moves that process into the cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Peak memory charged (anonymous + page cache), in bytes.
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The members have exited; leftover page-cache charges move to
        // the parent on rmdir (v1: after force_empty tries to drop them).
        if !self.v2 {
            let _ = std::fs::write(self.dir.join("memory.force_empty"), "0");
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Share of the machine's CPU time used by processes outside the
/// benchmark during an interval: the noise indicator of every run.
/// "Ours" is this process, its reaped children (fio, `tiercache stats`)
/// and the servers whose pids are given; "the machine" is /proc/stat.
pub struct CpuMeter {
    machine: Option<(u64, u64)>,
    ours: f64,
}

impl CpuMeter {
    pub fn start(servers: &[u32]) -> CpuMeter {
        CpuMeter {
            machine: machine_ticks(),
            ours: own_cpu_secs(servers),
        }
    }

    /// Others' share (0..=1) of all CPUs' time since `start`. The servers
    /// must still be running.
    pub fn others_share(&self, servers: &[u32]) -> Option<f64> {
        let (busy0, total0) = self.machine?;
        let (busy1, total1) = machine_ticks()?;
        let tck = clock_ticks()?;
        let total = (total1 - total0) as f64 / tck;
        if total <= 0.0 {
            return None;
        }
        let busy = (busy1 - busy0) as f64 / tck;
        let ours = own_cpu_secs(servers) - self.ours;
        Some(((busy - ours) / total).clamp(0.0, 1.0))
    }
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as f64)
}

/// (busy, total) ticks of all CPUs from /proc/stat's first line.
fn machine_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine_ticks(text.lines().next()?)
}

fn parse_machine_ticks(cpu_line: &str) -> Option<(u64, u64)> {
    let v: Vec<u64> = cpu_line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4]; // idle + iowait
    Some((total - idle, total))
}

/// CPU seconds of this process, its reaped children and `servers`.
fn own_cpu_secs(servers: &[u32]) -> f64 {
    let mut secs = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: rusage is plain old data, fully written by getrusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage.
        if unsafe { libc::getrusage(who, &mut ru) } == 0 {
            for tv in [ru.ru_utime, ru.ru_stime] {
                secs += tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
            }
        }
    }
    let tck = clock_ticks().unwrap_or(100.0);
    for &pid in servers {
        if let Some(t) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| parse_pid_ticks(&s))
        {
            secs += t as f64 / tck;
        }
    }
    secs
}

/// utime + stime of a /proc/PID/stat text (fields 14 and 15; the command
/// name in parentheses may contain spaces).
fn parse_pid_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) is index 11.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbdkit_log_reads_counted_once_each() {
        let t = "2026-11-22 06:00:24.360079 connection=1 Connect export=default size=0x4800000\n\
                 2026-11-22 06:00:24.4 connection=1 Read id=1 offset=0x10000 count=0x10000 ...\n\
                 2026-11-22 06:00:24.5 connection=1 ...Read id=1 return=0 (Success)\n\
                 2026-11-22 06:00:24.6 connection=2 Read id=1 offset=0x0 count=0x10000 ...\n";
        assert_eq!(count_nbdkit_reads(t), 2);
        assert_eq!(count_nbdkit_reads(""), 0);
    }

    #[test]
    fn proc_parsers() {
        assert_eq!(
            parse_status_kb("Name:\tx\nVmHWM:\t   22360 kB\nVmRSS:\t 1 kB\n", "VmHWM:"),
            Some(22360)
        );
        let stat = "123 (a b) S 1 123 123 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0";
        assert_eq!(parse_pid_ticks(stat), Some(300));
        let (busy, total) = parse_machine_ticks("cpu  100 0 50 800 50 0 0 0 0 0").unwrap();
        assert_eq!((busy, total), (150, 1000));
    }

    #[test]
    fn stats_deltas_and_ratio() {
        let a = Stats {
            read_hits: 10,
            read_misses: 10,
            ..Stats::default()
        };
        let b = Stats {
            read_hits: 100,
            read_misses: 20,
            resident: 5,
            ..Stats::default()
        };
        let d = b.since(&a);
        assert_eq!(d.hit_ratio(), Some(0.9));
        assert_eq!(d.resident, 5);
        assert_eq!(Stats::default().hit_ratio(), None);
    }
}
