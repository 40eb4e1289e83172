//! `tiercache serve` as a child process of a test, on Unix sockets in a
//! directory of the test's: started (and waited for), restarted, signalled,
//! inspected, stopped cleanly or killed; killed at the latest when dropped.

use crate::command::{output, retry_if_busy, run};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// `tiercache serve` as a child process, on a unix socket in `dir`.
pub struct Served {
    /// The `tiercache` executable.
    pub bin: PathBuf,
    /// Where the sockets and `serve.log` are.
    pub dir: PathBuf,
    /// `--backing` (empty for a pool: `--volume`s in `args`).
    pub backing: String,
    /// `--cache`.
    pub cache: String,
    /// The other flags, given again at every restart.
    pub args: Vec<String>,
    child: Option<Child>,
}

impl Served {
    /// Formats `dir`/cache.img for `dir`/backing.img (with the `--mode` and
    /// `--block-size` of `args`), then serves them with `args`.
    pub fn start(bin: &Path, dir: &Path, args: &[&str]) -> Served {
        let (backing, cache) = (dir.join("backing.img"), dir.join("cache.img"));
        let mut create = Command::new(bin);
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
            bin,
            dir,
            &backing.display().to_string(),
            &cache.display().to_string(),
            args,
        )
    }

    /// Serves without formatting first (use `--create` in `args`, or
    /// format with `tiercache create`).
    pub fn spawn(bin: &Path, dir: &Path, backing: &str, cache: &str, args: &[&str]) -> Served {
        let mut s = Served::unstarted(bin, dir, backing, cache, args);
        s.restart();
        s
    }

    /// The server's command line, not started (for `restart` or
    /// `expect_refusal`).
    pub fn unstarted(bin: &Path, dir: &Path, backing: &str, cache: &str, args: &[&str]) -> Served {
        Served {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            backing: backing.to_string(),
            cache: cache.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
        }
    }

    /// The NBD socket, `dir/nbd.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }

    /// The control socket, `dir/nbd.ctl`.
    pub fn control(&self) -> PathBuf {
        self.dir.join("nbd.ctl")
    }

    /// The default export's NBD URI.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///default?socket={}", self.socket().display())
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
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
        let mut cmd = self.command();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        let child = retry_if_busy(|| cmd.spawn()).unwrap();
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
        let mut cmd = self.command();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        let mut child = retry_if_busy(|| cmd.spawn()).unwrap();
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

    /// What the server has printed (stdout and stderr) since its last start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Whether the server process is still running.
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

    /// `tiercache stats --json` through the control socket.
    pub fn stats(&self) -> serde_json::Value {
        let out = run(Command::new(&self.bin)
            .arg("stats")
            .arg("--json")
            .arg("--control")
            .arg(self.control()));
        serde_json::from_str(&out).unwrap()
    }

    /// Waits until the server's log contains `needle` (e.g. `tiercache:
    /// serving`, printed once every listener is up). Panics if the server
    /// exits first or after 30 s.
    pub fn wait_for_log(&mut self, needle: &str) {
        let start = Instant::now();
        while !self.log().contains(needle) {
            if let Some(st) = self.child.as_mut().expect("running").try_wait().unwrap() {
                panic!("serve exited with {st}: {}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "serve did not print {needle:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's threads, now.
    pub fn threads(&self) -> usize {
        let pid = self.pid().expect("running");
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    }

    /// TCP ports the server process listens on (IPv4 and IPv6).
    pub fn listening_tcp_ports(&self) -> HashSet<u16> {
        let pid = self.pid().expect("running");
        let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        let mut ports = HashSet::new();
        for table in ["tcp", "tcp6"] {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                // local_address, state (0A = LISTEN), inode.
                if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                    let port = f[1].rsplit(':').next().unwrap();
                    ports.insert(u16::from_str_radix(port, 16).unwrap());
                }
            }
        }
        ports
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
