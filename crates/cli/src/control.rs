//! The control socket: `stats`, `flush`, `detach`, `set-mode`, `attach`,
//! `detach-volume`, `set-limits` and `trace` talk to a running server
//! through a Unix socket (mode
//! 0600, never on the network).
//!
//! Protocol: the client sends one JSON request on one line; the server
//! answers with zero or more `progress` lines, then one final line
//! (`stats`, `ok` or `error`), then closes.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_engine::{Engine, EngineStats};
use tiercache_types::CacheMode;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Stats,
    /// Write back every dirty block and flush both devices.
    Flush,
    /// Flush, then stop serving, leaving the backing device whole.
    Detach,
    SetMode {
        mode: CacheMode,
        /// One volume of a pool (default: every volume).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        volume: Option<String>,
    },
    /// Adds a volume to the pool: `backing` as for `serve --backing`.
    Attach {
        name: String,
        backing: String,
        /// Bytes of the cache guaranteed to it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        share: Option<u64>,
        /// Bytes of the cache it may hold at most.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<u64>,
        /// Over ublk: the N of its /dev/ublkbN (None: the kernel picks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ublk_id: Option<u32>,
    },
    /// Sets a pool volume's guaranteed share and cap of the cache (bytes;
    /// no cap: none).
    SetLimits {
        volume: String,
        share: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cap: Option<u64>,
    },
    /// Takes a volume out of the pool: its dirty blocks written back (with
    /// progress), its slots freed, its export gone; the others undisturbed.
    DetachVolume {
        name: String,
    },
    /// Records the requests served into a trace file (`crate::recording`),
    /// with a progress line a second.
    Trace(crate::recording::TraceRequest),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    Progress { done: u64, total: u64 },
    Stats(Box<EngineStats>),
    Traced(crate::recording::TraceSummary),
    Ok { message: String },
    Error { message: String },
}

/// How the running service adds and removes a pool's volumes (the front
/// end's part: the export, an NBD export or a /dev/ublkbN).
pub trait PoolControl: Send + Sync {
    /// Opens `backing`, attaches it to the engine as `name` and exports it
    /// (over ublk as device `ublk_id`, if given); returns where it is
    /// served.
    fn attach(&self, name: &str, backing: &str, ublk_id: Option<u32>) -> Result<String>;
    /// Stops exporting `name` before its detach: over NBD no new
    /// connections (those already on it get errors once it is detached);
    /// over ublk its device is deleted once its requests in flight finish.
    fn unexport(&self, name: &str);
}

/// What the control server needs from the running service.
pub struct ControlTarget {
    pub engine: Arc<Engine>,
    /// The pool's attach and detach; `None` where the pool cannot change
    /// (a server without a cache).
    pub pool: Option<Box<dyn PoolControl>>,
    /// Set when a detach completed: the server should stop.
    pub detached: Arc<AtomicBool>,
    /// Called after a detach to wake the main loop.
    pub on_detach: Box<dyn Fn() + Send + Sync>,
    /// Recordings in progress (`tiercache trace`), ended by a stopping
    /// server.
    pub recordings: Arc<crate::recording::Recordings>,
}

/// Binds the control socket at `path` with mode 0600. A stale socket file
/// (nothing listening) is replaced; a live one is an error.
pub fn bind(path: &Path) -> Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!(
                "control socket {} is in use by a running server",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        socket_dir(dir)?;
    }
    // Bind under a temporary name, restrict, then rename into place: the
    // socket is never reachable under its real name with default modes.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let l = UnixListener::bind(&tmp)
        .with_context(|| format!("binding control socket {}", path.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("moving control socket into place at {}", path.display()))?;
    Ok(l)
}

/// Makes sure `dir` can hold our sockets: created 0700 if missing; the
/// default directory (which another user could have created first in /tmp)
/// must be ours and closed to others.
pub fn socket_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        return Ok(());
    }
    if dir == default_dir() {
        let meta = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        if meta.uid() != uid || meta.mode() & 0o077 != 0 {
            bail!(
                "{} belongs to uid {} with mode {:o}: refusing to put sockets there \
                 (remove it, or choose --socket/--control elsewhere)",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            );
        }
    }
    Ok(())
}

/// Control connections served at once; more are refused (each holds a
/// thread).
const MAX_CONTROL_CONNECTIONS: usize = 16;
/// A control client must send its request within this time.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves control requests until the listener is closed or the process
/// ends. Each connection gets its own thread.
pub fn serve(listener: UnixListener, target: Arc<ControlTarget>) {
    std::thread::Builder::new()
        .name("tiercache-control".into())
        .spawn(move || {
            let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if active.load(Ordering::SeqCst) >= MAX_CONTROL_CONNECTIONS {
                    let _ = send(
                        &mut conn,
                        &Reply::Error {
                            message: "too many control connections; try again".into(),
                        },
                    );
                    continue;
                }
                let _ = conn.set_read_timeout(Some(REQUEST_TIMEOUT));
                active.fetch_add(1, Ordering::SeqCst);
                let t = target.clone();
                let done = active.clone();
                let spawned = std::thread::Builder::new()
                    .name("tiercache-control-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(conn, &t) {
                            log::warn!("control connection: {e:#}");
                        }
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .expect("spawn control thread");
}

fn send(w: &mut UnixStream, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    w.write_all(&line)?;
    Ok(())
}

fn handle(conn: UnixStream, t: &ControlTarget) -> Result<()> {
    let mut w = conn.try_clone()?;
    let mut line = String::new();
    BufReader::new(conn).take(64 * 1024).read_line(&mut line)?;
    let req: Request = match serde_json::from_str(line.trim()) {
        Ok(r) => r,
        Err(e) => {
            return send(
                &mut w,
                &Reply::Error {
                    message: format!("malformed request: {e}"),
                },
            )
        }
    };
    let reply = match req {
        Request::Stats => Reply::Stats(Box::new(t.engine.stats())),
        Request::SetMode { mode, volume } => match set_mode(&t.engine, mode, volume.as_deref()) {
            Ok(message) => {
                log::info!("{message}");
                Reply::Ok { message }
            }
            Err(e) => Reply::Error {
                message: e.to_string(),
            },
        },
        Request::SetLimits { volume, share, cap } => {
            match set_limits(&t.engine, &volume, share, cap) {
                Ok(message) => {
                    log::info!("{message}");
                    Reply::Ok { message }
                }
                Err(e) => Reply::Error {
                    message: format!("set-limits {volume}: {e:#}"),
                },
            }
        }
        Request::Attach {
            name,
            backing,
            share,
            cap,
            ublk_id,
        } => match &t.pool {
            None => Reply::Error {
                message: "this server cannot attach volumes (it serves without a cache)".into(),
            },
            Some(p) => match p.attach(&name, &backing, ublk_id).and_then(|m| {
                if share.is_some() || cap.is_some() {
                    let limits = set_limits(&t.engine, &name, share.unwrap_or(0), cap)?;
                    Ok(format!("{m}; {limits}"))
                } else {
                    Ok(m)
                }
            }) {
                Ok(message) => {
                    log::info!("{message}");
                    Reply::Ok { message }
                }
                Err(e) => Reply::Error {
                    message: format!("attach {name}: {e:#}"),
                },
            },
        },
        Request::DetachVolume { name } => {
            let mut last_sent = std::time::Instant::now();
            match detach_volume(t, &name, |done, total| {
                if last_sent.elapsed().as_millis() >= 100 || done == total {
                    last_sent = std::time::Instant::now();
                    let _ = send(&mut w, &Reply::Progress { done, total });
                }
            }) {
                Ok(message) => {
                    log::info!("{message}");
                    Reply::Ok { message }
                }
                Err(e) => Reply::Error {
                    message: format!("detach {name}: {e:#}"),
                },
            }
        }
        Request::Trace(tr) => {
            // Held until the reply is sent, so that a stopping server
            // waits for it.
            let Some(_active) = t.recordings.begin() else {
                return send(
                    &mut w,
                    &Reply::Error {
                        message: "trace: the server is stopping".into(),
                    },
                );
            };
            let reply =
                match crate::recording::record(&t.engine, &t.recordings, &tr, |done, total| {
                    send(&mut w, &Reply::Progress { done, total }).is_ok()
                }) {
                    Ok(summary) => {
                        log::info!("{summary}");
                        Reply::Traced(summary)
                    }
                    Err(e) => Reply::Error {
                        message: format!("trace: {e:#}"),
                    },
                };
            return send(&mut w, &reply);
        }
        Request::Flush | Request::Detach => {
            let detach = req == Request::Detach;
            if detach {
                // No new dirty data while we drain.
                if let Err(e) = t.engine.set_mode(CacheMode::WriteThrough) {
                    log::warn!("detach: {e}");
                }
            }
            let mut last_sent = std::time::Instant::now();
            let drained = t.engine.drain(|done, total| {
                if last_sent.elapsed().as_millis() >= 100 || done == total {
                    last_sent = std::time::Instant::now();
                    let _ = send(&mut w, &Reply::Progress { done, total });
                }
            });
            match drained.and_then(|()| t.engine.flush()) {
                Err(e) => Reply::Error {
                    message: format!("flush failed: {e}"),
                },
                Ok(()) if detach => {
                    t.detached.store(true, Ordering::SeqCst);
                    (t.on_detach)();
                    Reply::Ok {
                        message: "detached: every dirty block written back, backing device flushed"
                            .into(),
                    }
                }
                Ok(()) => Reply::Ok {
                    message: "flushed: every dirty block written back".into(),
                },
            }
        }
    };
    send(&mut w, &reply)
}

/// Sets the mode of volume `name`, or of every volume.
fn set_mode(engine: &Engine, mode: CacheMode, name: Option<&str>) -> Result<String> {
    match name {
        None => {
            for (id, _) in engine.volume_names() {
                engine.set_volume_mode(id, mode)?;
            }
            engine.set_mode(mode)?;
            Ok(format!("mode is now {mode}"))
        }
        Some(name) => {
            let id = volume_id(engine, name)?;
            engine.set_volume_mode(id, mode)?;
            Ok(format!("volume {name}: mode is now {mode}"))
        }
    }
}

/// Gives volume `name` a share and cap of the cache (bytes, rounded down to
/// blocks).
fn set_limits(engine: &Engine, name: &str, share: u64, cap: Option<u64>) -> Result<String> {
    let id = volume_id(engine, name)?;
    let bs = engine.block_size() as u64;
    let limits = tiercache_engine::VolumeLimits {
        share: share / bs,
        cap: cap.map(|c| c / bs),
    };
    engine.set_volume_limits(id, limits)?;
    Ok(format!(
        "volume {name}: share {} blocks, cap {}",
        limits.share,
        limits
            .cap
            .map_or("none".to_string(), |c| format!("{c} blocks"))
    ))
}

fn volume_id(engine: &Engine, name: &str) -> Result<tiercache_types::VolumeId> {
    engine
        .volume_names()
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(id, _)| id)
        .with_context(|| format!("no volume named {name:?} in this pool"))
}

/// Takes volume `name` out of the pool: no new connections to it, its
/// dirty blocks written back, its slots freed.
fn detach_volume(t: &ControlTarget, name: &str, progress: impl FnMut(u64, u64)) -> Result<String> {
    let id = volume_id(&t.engine, name)?;
    let Some(pool) = &t.pool else {
        bail!("this server cannot detach volumes");
    };
    if id.0 == 0 {
        bail!("{name} is the pool's first volume, which stays while the server runs");
    }
    pool.unexport(name);
    t.engine.detach_volume(id, progress)?;
    Ok(format!(
        "volume {name} detached: every dirty block written back, its backing device is whole"
    ))
}

/// Sends `req` to the server at `path`, calling `on_progress` for progress
/// lines, and returns the final reply.
pub fn call(path: &Path, req: &Request, mut on_progress: impl FnMut(u64, u64)) -> Result<Reply> {
    let mut s = UnixStream::connect(path).with_context(|| {
        format!(
            "cannot reach a tiercache server at {} (is `tiercache serve` running? see --control)",
            path.display()
        )
    })?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    for line in BufReader::new(s).lines() {
        let line = line?;
        match serde_json::from_str::<Reply>(&line)
            .with_context(|| format!("bad reply from server: {line}"))?
        {
            Reply::Progress { done, total } => on_progress(done, total),
            other => return Ok(other),
        }
    }
    bail!("the server closed the control connection without answering")
}

/// Default directory for sockets: $XDG_RUNTIME_DIR/tiercache, else
/// /tmp/tiercache-UID.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("tiercache"),
        _ => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/tiercache-{uid}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_as_json() {
        for r in [
            Request::Stats,
            Request::Flush,
            Request::Detach,
            Request::SetMode {
                mode: CacheMode::WriteBack,
                volume: None,
            },
            Request::SetMode {
                mode: CacheMode::WriteBack,
                volume: Some("vm1".into()),
            },
            Request::Attach {
                name: "vm2".into(),
                backing: "/dev/sdc".into(),
                share: None,
                cap: Some(1 << 30),
                ublk_id: None,
            },
            Request::Attach {
                name: "vm3".into(),
                backing: "/dev/sdd".into(),
                share: None,
                cap: None,
                ublk_id: Some(7),
            },
            Request::SetLimits {
                volume: "vm2".into(),
                share: 1 << 28,
                cap: None,
            },
            Request::DetachVolume { name: "vm2".into() },
            Request::Trace(crate::recording::TraceRequest {
                out: "/tmp/t.trace".into(),
                volume: Some("vm2".into()),
                seconds: 2.5,
                sample: 0.01,
                buffer: 1024,
            }),
        ] {
            let s = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        }
        let s = serde_json::to_string(&Request::SetMode {
            mode: CacheMode::WriteAround,
            volume: None,
        })
        .unwrap();
        assert_eq!(s, r#"{"cmd":"set-mode","mode":"writearound"}"#);
    }
}

#[cfg(test)]
mod dir_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn socket_dirs_are_created_private_and_sockets_bound_0600() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/b");
        socket_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let sock = dir.join("x.ctl");
        let _l = bind(&sock).unwrap();
        assert_eq!(std::fs::metadata(&sock).unwrap().mode() & 0o777, 0o600);
        assert!(bind(&sock).is_err(), "a live socket is not replaced");
    }
}
