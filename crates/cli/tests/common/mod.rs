//! Shared by the CLI's integration tests: a `tiercache serve` child process
//! and small helpers around the real tools.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

#[allow(unused_imports)] // not every test file skips
pub use tiercache_testkit::{have, skip};

/// The full path of `tool` on PATH (or the bare name).
pub fn which(tool: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|f| f.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(tool))
}

/// Runs `cmd`, panics with its output unless it succeeds, returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` and returns its output whatever the exit status.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

pub fn tiercache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

/// A sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `serve` flags that keep the background cleaner from writing anything
/// back while a test looks (no dirty target to reach, never idle enough):
/// dirty blocks stay in the cache until the test says otherwise.
pub const QUIET_CLEANER: [&str; 4] = ["--writeback-target", "1", "--writeback-idle-after", "3600"];

/// `tiercache serve` as a child process, on a unix socket in `dir`.
pub struct Served {
    pub dir: PathBuf,
    pub backing: String,
    pub cache: String,
    pub args: Vec<String>,
    child: Option<Child>,
}

impl Served {
    /// Formats `dir`/cache.img for `dir`/backing.img (with the `--mode` and
    /// `--block-size` of `args`), then serves them with `args`.
    pub fn start(dir: &Path, args: &[&str]) -> Served {
        let (backing, cache) = (dir.join("backing.img"), dir.join("cache.img"));
        let mut create = tiercache();
        create
            .arg("create")
            .arg("--backing")
            .arg(&backing)
            .arg("--cache")
            .arg(&cache);
        for pair in args.chunks(2) {
            if matches!(pair[0], "--mode" | "--block-size") {
                create.args(pair);
            }
        }
        run(&mut create);
        Served::spawn(
            dir,
            &backing.display().to_string(),
            &cache.display().to_string(),
            args,
        )
    }

    /// Serves without formatting first (use `--create` in `args`, or
    /// format with `tiercache create`).
    pub fn spawn(dir: &Path, backing: &str, cache: &str, args: &[&str]) -> Served {
        let mut s = Served::unstarted(dir, backing, cache, args);
        s.restart();
        s
    }

    /// The server's command line, not started (for `restart` or
    /// `expect_refusal`).
    pub fn unstarted(dir: &Path, backing: &str, cache: &str, args: &[&str]) -> Served {
        Served {
            dir: dir.to_path_buf(),
            backing: backing.to_string(),
            cache: cache.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }

    pub fn control(&self) -> PathBuf {
        self.dir.join("nbd.ctl")
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///default?socket={}", self.socket().display())
    }

    fn command(&self) -> Command {
        let mut c = tiercache();
        c.arg("serve");
        // No backing: a pool, its `--volume NAME=PATH`s in `args`.
        if !self.backing.is_empty() {
            c.arg("--backing").arg(&self.backing);
        }
        c.arg("--cache")
            .arg(&self.cache)
            .arg("--socket")
            .arg(self.socket())
            .arg("--control")
            .arg(self.control())
            .args(&self.args);
        c
    }

    /// Starts the server (again) and waits for its control socket.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let _ = std::fs::remove_file(self.control());
        let log = std::fs::File::create(self.dir.join("serve.log")).unwrap();
        let child = self
            .command()
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let start = Instant::now();
        while !self.control().exists() {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("serve exited with {st}: {}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "serve did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server and kills it (SIGKILL) `after` its start, wherever
    /// it is then (opening the cache, recovering, serving).
    pub fn start_and_kill_after(&mut self, after: Duration) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::File::create(self.dir.join("serve-killed.log")).unwrap();
        let mut child = self
            .command()
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Runs the server expecting it to refuse to start; returns its output.
    pub fn expect_refusal(&self) -> String {
        let out = output(&mut self.command());
        assert!(
            !out.status.success(),
            "serve started but should have refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    /// SIGTERM and wait: a clean stop. Panics if the server failed.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let st = c.wait().unwrap();
            assert!(st.success(), "serve exited with {st}: {}", self.log());
        }
    }

    /// Sends `sig` (e.g. `libc::SIGTERM`) without waiting; see
    /// [`Served::wait_exit`].
    pub fn signal(&self, sig: i32) {
        let c = self.child.as_ref().expect("running");
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(c.id() as i32, sig) };
    }

    /// SIGKILL and wait: a crash of the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the server to exit by itself (after a detach).
    ///
    /// Panics after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            let c = self.child.as_mut().expect("running");
            if let Some(st) = c.try_wait().unwrap() {
                self.child = None;
                return st;
            }
            assert!(
                start.elapsed() < limit,
                "serve did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stats(&self) -> serde_json::Value {
        let out = run(tiercache()
            .arg("stats")
            .arg("--json")
            .arg("--control")
            .arg(self.control()));
        serde_json::from_str(&out).unwrap()
    }

    /// Runs a Python snippet in `nbdsh` connected to the export (`h` is the
    /// handle). Returns its output, whatever the exit status.
    pub fn nbdsh(&self, code: &str) -> Output {
        // nbdsh runs `python3` from PATH, which may lack Debian's nbd
        // module (a pyenv python, say): prefer the system interpreter.
        let mut cmd = if Path::new("/usr/bin/python3").exists() {
            let mut c = Command::new("/usr/bin/python3");
            c.arg("-m").arg("nbd");
            c
        } else {
            Command::new("nbdsh")
        };
        output(cmd.arg("-u").arg(self.uri()).arg("-c").arg(code))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}
