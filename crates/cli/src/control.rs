//! The control socket: `stats`, `flush`, `detach` and `set-mode` talk to a
//! running server through a Unix socket (mode 0600, never on the network).
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
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    Progress { done: u64, total: u64 },
    Stats(Box<EngineStats>),
    Ok { message: String },
    Error { message: String },
}

/// What the control server needs from the running service.
pub struct ControlTarget {
    pub engine: Arc<Engine>,
    /// Set when a detach completed: the server should stop.
    pub detached: Arc<AtomicBool>,
    /// Called after a detach to wake the main loop.
    pub on_detach: Box<dyn Fn() + Send + Sync>,
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
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let l = UnixListener::bind(path)
        .with_context(|| format!("binding control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves control requests until the listener is closed or the process
/// ends. Each connection gets its own thread.
pub fn serve(listener: UnixListener, target: Arc<ControlTarget>) {
    std::thread::Builder::new()
        .name("tiercache-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let t = target.clone();
                let _ = std::thread::Builder::new()
                    .name("tiercache-control-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(conn, &t) {
                            log::warn!("control connection: {e:#}");
                        }
                    });
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
        Request::SetMode { mode } => match t.engine.set_mode(mode) {
            Ok(()) => {
                log::info!("mode set to {mode}");
                Reply::Ok {
                    message: format!("mode is now {mode}"),
                }
            }
            Err(e) => Reply::Error {
                message: e.to_string(),
            },
        },
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
            },
        ] {
            let s = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        }
        let s = serde_json::to_string(&Request::SetMode {
            mode: CacheMode::WriteAround,
        })
        .unwrap();
        assert_eq!(s, r#"{"cmd":"set-mode","mode":"writearound"}"#);
    }
}
