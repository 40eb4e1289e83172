//! One writer per device: an exclusive `flock` held for as long as a
//! [`FileDevice`](crate::FileDevice) is open, so that two processes never
//! both write one device (a second `tiercache serve` on a cache already
//! served, or a backing device already behind another cache, is refused
//! with the holder named). The lock goes with the process: `kill -9`
//! releases it.
//!
//! Whether the holder is this very process (one device given twice, e.g.
//! as both backing and cache) is known from a registry kept here, not
//! guessed from `/proc/locks`; `/proc/locks` only names another holder.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// A device's identity: the `(st_dev, st_ino)` of the open file.
type Identity = (u64, u64);

/// How many open devices of this process hold the lock of each identity
/// (at most one but for the instant between one closing its descriptor and
/// dropping its [`ExclusiveLock`] while another takes the lock).
fn registry() -> &'static Mutex<HashMap<Identity, usize>> {
    static REGISTRY: OnceLock<Mutex<HashMap<Identity, usize>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The `io::ErrorKind` of EBUSY (`ResourceBusy`, named without needing a
/// newer Rust than the workspace's minimum).
pub(crate) fn busy_kind() -> io::ErrorKind {
    io::Error::from_raw_os_error(libc::EBUSY).kind()
}

/// This process's claim on one device, taken by [`lock_exclusive`]. The
/// kernel lock itself is released when the file's descriptor closes; this
/// guard only keeps the registry true, so drop it after the file.
#[derive(Debug)]
pub(crate) struct ExclusiveLock {
    identity: Identity,
}

impl Drop for ExclusiveLock {
    fn drop(&mut self) {
        let mut held = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.identity);
            }
        }
    }
}

/// Takes an exclusive, non-blocking `flock` on `file` (opened from `path`).
///
/// Fails with kind EBUSY and a message that says who holds it: this same
/// process ("opened twice by this command"), another process named by pid
/// and command from `/proc/locks`, or "another process" when that cannot
/// be read.
///
/// A holder that has exited is waited for, up to [`DEAD_HOLDER_WAIT`]: a
/// killed server's lock outlives it until its last IO in flight in the
/// kernel (an io_uring read of the device) lets go of the file, and the
/// next server started at once must not fail on that.
///
/// Any other holder is waited for up to [`FORK_WINDOW_WAIT`] before it is
/// named: a `flock` belongs to the open file, and a descriptor is copied
/// into every child forked while it is open, until that child's `exec`
/// closes it. A process whose other threads spawn commands (a test
/// harness, a bench driving fio) can thus hold, for an instant, the lock of
/// a device it has already closed, and the next open of that device, in
/// it or in a child it has just started, must not fail on that.
pub(crate) fn lock_exclusive(file: &File, path: &Path) -> io::Result<ExclusiveLock> {
    let start = std::time::Instant::now();
    loop {
        let waited = start.elapsed();
        match try_lock_exclusive(file, path) {
            Ok(lock) => return Ok(lock),
            Err(Busy::DeadHolder(_)) if waited < DEAD_HOLDER_WAIT => {}
            Err(Busy::Held(_)) if waited < FORK_WINDOW_WAIT => {}
            Err(Busy::DeadHolder(e) | Busy::Held(e) | Busy::Other(e)) => return Err(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long [`lock_exclusive`] waits for the lock of a process that has
/// exited.
pub(crate) const DEAD_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long [`lock_exclusive`] waits for a live holder (or one it cannot
/// name) before refusing: far longer than a fork's copy of a descriptor
/// lives before its `exec`, and short enough for a second server to be
/// refused at once to a human.
pub(crate) const FORK_WINDOW_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why [`try_lock_exclusive`] failed.
enum Busy {
    /// `/proc/locks` names a holder that no longer exists.
    DeadHolder(io::Error),
    /// Another open file holds the lock: another process, or a child
    /// between its fork and its exec.
    Held(io::Error),
    /// This process holds the lock through another open device, or the
    /// lock could not be tried at all.
    Other(io::Error),
}

fn try_lock_exclusive(file: &File, path: &Path) -> Result<ExclusiveLock, Busy> {
    let meta = file.metadata().map_err(|e| {
        Busy::Other(io::Error::new(
            e.kind(),
            format!("{}: cannot stat: {e}", path.display()),
        ))
    })?;
    let identity = (meta.dev(), meta.ino());
    // SAFETY: flock on a descriptor `file` keeps open; no pointers involved.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        *registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(identity)
            .or_default() += 1;
        return Ok(ExclusiveLock { identity });
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(Busy::Other(io::Error::new(
            e.kind(),
            format!("{}: cannot lock: {e}", path.display()),
        )));
    }
    let ours = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&identity);
    if ours {
        return Err(Busy::Other(io::Error::new(
            busy_kind(),
            format!(
                "{}: opened twice by this command (is the same device given twice, \
                 e.g. as both backing and cache?)",
                path.display()
            ),
        )));
    }
    let holder = lock_holder(identity);
    let dead = holder.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
    let who = match holder {
        Some(pid) if dead => format!("process {pid} (exited; its last IO still holds the file)"),
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("process {pid} ({})", comm.trim())
        }
        None => "another process".to_string(),
    };
    let e = io::Error::new(
        busy_kind(),
        format!(
            "{}: in use by {who}, which holds it open for writing (another `tiercache serve` \
             of this device?); two writers would corrupt it: stop that one first",
            path.display()
        ),
    );
    Err(if dead {
        Busy::DeadHolder(e)
    } else {
        Busy::Held(e)
    })
}

/// The pid of another process holding a `flock` on the inode `identity`,
/// from `/proc/locks` (lines such as `1: FLOCK ADVISORY WRITE 4242
/// fd:01:1311 0 EOF`; waiters, marked `->`, are skipped). Lines naming this
/// process are skipped too: a lock it took is known from the registry, and
/// such a line can only be a descriptor of ours briefly inherited by a
/// child between its fork and exec.
fn lock_holder((dev, ino): Identity) -> Option<u32> {
    let id = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let me = std::process::id();
    std::fs::read_to_string("/proc/locks")
        .ok()?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 5 && f[1] == "FLOCK" && f[5] == id)
        .filter_map(|f| f[4].parse().ok())
        .find(|&pid| pid != me && pid > 0)
}
