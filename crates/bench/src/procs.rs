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
}

impl Stats {
    /// Counters accumulated since `before` (resident/capacity are "now").
    pub fn since(&self, before: &Stats) -> Stats {
        Stats {
            read_hits: self.read_hits - before.read_hits,
            read_misses: self.read_misses - before.read_misses,
            promotions: self.promotions - before.promotions,
            demotions: self.demotions - before.demotions,
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
    /// `backend_socket`, with its cache file in `dir` (TMPDIR). The stats
    /// filter under the cache filter counts the reads that reach the
    /// backend (the misses), written to `<name>.nbdkit-stats` at exit.
    pub fn nbdkit_cache(
        dir: &Path,
        name: &str,
        backend_socket: &Path,
        cache_size: u64,
        block_size: u64,
    ) -> Result<Server> {
        let socket = dir.join(format!("{name}.sock"));
        let pidfile = dir.join(format!("{name}.pid"));
        let log = dir.join(format!("{name}.nbdkit.log"));
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::create_dir_all(&tmp)?;
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&pidfile);
        let logf = std::fs::File::create(&log)?;
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(&socket)
            .arg("-P")
            .arg(&pidfile)
            .args(["--filter=cache", "--filter=stats", "nbd"])
            .arg(format!("socket={}", backend_socket.display()))
            .arg("export=default")
            .arg("cache-on-read=true")
            .arg(format!("cache-max-size={cache_size}"))
            .arg(format!("cache-min-block-size={block_size}"))
            .arg(format!(
                "statsfile={}",
                dir.join(format!("{name}.nbdkit-stats")).display()
            ))
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

/// Reads the read count of the nbdkit stats filter's file (`read: N ops,
/// ...`): the reads that reached the backend.
pub fn nbdkit_backend_reads(statsfile: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(statsfile).ok()?;
    parse_nbdkit_reads(&text)
}

fn parse_nbdkit_reads(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.trim_start().starts_with("read:"))?;
    line.trim_start()
        .strip_prefix("read:")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbdkit_stats_read_line() {
        let t =
            "total: 191 ops, 21.9 s, 25.13 GiB, 1.15 GiB/s\nread: 136 ops, 0.000230 s, 3.16 MiB\n";
        assert_eq!(parse_nbdkit_reads(t), Some(136));
        assert_eq!(parse_nbdkit_reads("total: 0 ops\n"), None);
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
