//! `tiercache serve`: the engine behind an NBD server, with a control
//! socket and a background cleaner, until a signal or a detach.
//!
//! Signals: SIGTERM and SIGINT stop (the ublk device is deleted, the
//! `--nbd-device`s disconnected); SIGUSR1 hands a ublk device made with
//! user recovery, or the `--nbd-device`s, over to the next server (the
//! devices stay and hold their IO, the engine shuts down cleanly, the
//! process exits with [`HANDOVER_EXIT`]); see docs/RESTART.md.

use crate::control::{self, ControlTarget};
use crate::export::VolumeExport;
use crate::kernel_nbd::KernelDevices;
use crate::ServeSettings;
use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiercache_engine::{
    Cleaner, CleanerConfig, Engine, EngineConfig, EngineError, OpenOptions, PoolVolume,
    RestoreVerifier, VolumeLimits,
};
use tiercache_nbd::{Listener, RunningServer, Server, ServerConfig};
use tiercache_types::MonotonicClock;

/// The signal asking for a hand-over (see the module comment).
pub const HANDOVER_SIGNAL: i32 = signal_hook::consts::SIGUSR1;

/// Exit status after a hand-over: 75 (EX_TEMPFAIL, "try again"), so that a
/// supervisor starts the next server (docs/tiercache@.service).
pub const HANDOVER_EXIT: i32 = 75;

/// What ends the serving loop.
struct Signals {
    stop: Arc<AtomicBool>,
    handover: Arc<AtomicBool>,
}

impl Signals {
    fn register() -> Result<Signals> {
        let stop = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        let handover = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(HANDOVER_SIGNAL, handover.clone())?;
        Ok(Signals { stop, handover })
    }

    /// Serves until a stop, a hand-over, or the device going away by
    /// itself; true for a hand-over. A hand-over that `front` cannot do is
    /// refused with a warning and serving goes on.
    fn wait(&self, front: &FrontEnd) -> bool {
        loop {
            if self.handover.load(Ordering::SeqCst) {
                if front.can_hand_over() {
                    return true;
                }
                log::warn!(
                    "SIGUSR1 (hand-over) ignored: only a ublk device made with user recovery, \
                     or --nbd-device devices, can be handed over"
                );
                self.handover.store(false, Ordering::SeqCst);
            }
            if self.stop.load(Ordering::SeqCst) || front.has_exited() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Gives every volume its `share=`/`cap=` (bytes, rounded down to blocks).
fn apply_limits(engine: &Engine, s: &ServeSettings) -> Result<()> {
    let bs = engine.block_size() as u64;
    let ids = engine.volume_names();
    for v in &s.volumes {
        if v.share.is_none() && v.cap.is_none() {
            continue;
        }
        let name = v.name.as_deref().unwrap_or_default();
        let id = ids
            .iter()
            .find(|(_, n)| n == name)
            .map(|(id, _)| *id)
            .with_context(|| format!("volume {name} is not in the pool"))?;
        let limits = VolumeLimits {
            share: v.share.unwrap_or(0) / bs,
            cap: v.cap.map(|c| c / bs),
        };
        engine
            .set_volume_limits(id, limits)
            .with_context(|| format!("volume {name}: share/cap"))?;
    }
    Ok(())
}

pub fn run(s: &ServeSettings) -> Result<()> {
    if s.ublk.is_some() {
        crate::ublk::check_available()?;
    }
    crate::open_files::ensure_room(s.volumes.len(), s.ublk.is_some())?;
    if let Some(cache_spec) = &s.cache {
        for v in &s.volumes {
            crate::devices::ensure_distinct(&v.spec, cache_spec)?;
        }
    }
    let mut pool = Vec::with_capacity(s.volumes.len());
    for v in &s.volumes {
        let backing = crate::devices::open(&v.spec).with_context(|| match &v.name {
            Some(name) => format!("backing device of volume {name}"),
            None => "backing device".to_string(),
        })?;
        pool.push(PoolVolume {
            name: v.name.clone(),
            backing,
            path: v.spec.clone(),
        });
    }
    let backing = pool[0].backing.clone();
    let rotational = s.backing.starts_with("hdd:");
    let Some(cache_spec) = &s.cache else {
        if pool.len() > 1 {
            bail!("a pool of volumes needs a cache device (--cache)");
        }
        return run_uncached(s, backing, rotational);
    };
    let cache = crate::devices::open(cache_spec).context("cache device")?;
    let clock = Arc::new(MonotonicClock::new());
    // The block size of a cache formatted here (a RAM cache, `--create`).
    let block_size = s
        .block_size
        .unwrap_or_else(|| tiercache_engine::default_block_size(cache.size()));
    let engine = if cache_spec.starts_with("mem:") {
        // A RAM cache is volatile: nothing to open, nothing survives.
        let cfg = EngineConfig {
            mode: s.mode,
            block_size,
            sequential_cutoff: s.sequential_cutoff,
            policy: s.policy.clone(),
            ..EngineConfig::default()
        };
        Engine::new_pool(&pool, cache.clone(), &cfg, clock)?
    } else {
        let options = OpenOptions {
            mode: s.mode_given.then_some(s.mode),
            policy: s.policy_given.then(|| s.policy.clone()),
            sequential_cutoff: Some(s.sequential_cutoff),
            cache_error_limit: None,
            verify_clean_at_open: false,
        };
        match Engine::open_pool(&pool, cache.clone(), &options, clock.clone()) {
            Ok((engine, report)) => {
                for w in &report.warnings {
                    log::warn!("{w}");
                }
                log::info!(
                    "opened cache {cache_spec}: {} blocks restored ({} dirty) after {} shutdown{}{}",
                    report.restored_blocks,
                    report.restored_dirty,
                    if report.was_clean_shutdown { "a clean" } else { "an unclean" },
                    if report.was_clean_shutdown {
                        String::new()
                    } else {
                        format!(
                            "; {} clean blocks to check against their crc (before their first \
                             use, and in the background), {} clean claims dropped",
                            report.unverified_clean, report.dropped_clean
                        )
                    },
                    if report.was_detached { "; it had been detached, so it starts empty" } else { "" }
                );
                engine
            }
            Err(EngineError::Metadata(m))
                if m.kind() == tiercache_metadata::ErrorKind::NotFormatted && s.create =>
            {
                let cfg = EngineConfig {
                    mode: s.mode,
                    block_size,
                    sequential_cutoff: s.sequential_cutoff,
                    policy: s.policy.clone(),
                    ..EngineConfig::default()
                };
                crate::devices::ensure_blank(&*cache, cache_spec)?;
                log::info!("formatting cache device {cache_spec} (--create)");
                Engine::create_pool(
                    &pool,
                    cache.clone(),
                    &cfg,
                    Arc::new(MonotonicClock::new()),
                    None,
                )?
            }
            Err(EngineError::Metadata(m))
                if m.kind() == tiercache_metadata::ErrorKind::NotFormatted =>
            {
                if s.volumes.len() > 1 {
                    bail!(
                        "{cache_spec} is not a tiercache cache device yet. Format it as a pool \
                         of these volumes with --create (only the cache device is written; the \
                         backing devices keep their data)"
                    )
                }
                bail!(
                    "{cache_spec} is not a tiercache cache device yet. Format it first with\n  \
                     tiercache create --backing {} --cache {cache_spec}\n\
                     (create writes the cache device only; the backing device keeps its data)",
                    s.backing
                )
            }
            Err(e) => return Err(e.into()),
        }
    };
    apply_limits(&engine, s)?;
    let engine = Arc::new(engine);
    log_serving(&engine, &pool, &*cache)?;
    // After a crash: the restored clean blocks are checked in the
    // background while the server runs (each also before its first use).
    let verifier = RestoreVerifier::spawn(engine.clone());
    let cleaner = Cleaner::spawn(
        engine.clone(),
        CleanerConfig {
            target_dirty: s.writeback_target,
            idle_after: s.writeback_idle_after,
            ..CleanerConfig::default()
        },
    );

    // One export per volume: a pool of one keeps the --name export name,
    // a pool's volumes are exported under their own names.
    let mut exports: Vec<(String, Arc<dyn tiercache_frontend::Export>)> = Vec::new();
    for (id, name) in engine.volume_names() {
        let export_name = if s.volumes[0].name.is_none() {
            s.name.clone()
        } else {
            name
        };
        let volume = engine.volume_handle(id)?;
        exports.push((export_name, Arc::new(VolumeExport { volume, rotational })));
    }
    let front = FrontEnd::start_many(s, exports, cache_spec)?;

    let signals = Signals::register()?;
    let stop = signals.stop.clone();
    let detached = Arc::new(AtomicBool::new(false));
    let ctl = control::bind(&s.control)?;
    let stop2 = stop.clone();
    let recordings = Arc::new(crate::recording::Recordings::default());
    control::serve(
        ctl,
        Arc::new(ControlTarget {
            engine: engine.clone(),
            pool: match &front {
                FrontEnd::Nbd(server, _) => Some(Box::new(crate::pool::NbdPool {
                    engine: engine.clone(),
                    exports: server.exports(),
                    cache: cache_spec.clone(),
                    mode: s.mode,
                    sequential_cutoff: s.sequential_cutoff,
                })),
                FrontEnd::Ublk(devices) => Some(Box::new(crate::ublk_pool::UblkPool {
                    engine: engine.clone(),
                    devices: devices.clone(),
                    cache: cache_spec.clone(),
                    mode: s.mode,
                    sequential_cutoff: s.sequential_cutoff,
                })),
            },
            detached: detached.clone(),
            on_detach: Box::new(move || stop2.store(true, Ordering::SeqCst)),
            recordings: recordings.clone(),
        }),
    );
    announce(s, &front);

    let hand_over = signals.wait(&front) && !detached.load(Ordering::SeqCst);
    // A recording in progress ends now with its file complete, and its
    // client gets its summary, before the server goes.
    let unfinished = recordings.end_all(RECORDINGS_GRACE);
    if unfinished > 0 {
        log::warn!("{unfinished} recordings did not finish in {RECORDINGS_GRACE:?}");
    }
    let device = front.device_name();
    if hand_over {
        log::info!("handing over {device}: finishing the requests being run");
        front.hand_over()?;
    } else {
        log::info!("stopping: finishing in-flight requests");
        front.stop()?;
    }
    cleaner.stop();
    verifier.stop();
    let detach = detached.load(Ordering::SeqCst);
    if !engine.is_persistent() && engine.dirty_blocks() > 0 {
        // A volatile (RAM) cache loses its contents: write dirty data back.
        log::info!(
            "writing back {} dirty blocks before exit",
            engine.dirty_blocks()
        );
        engine
            .drain(|_, _| {})
            .context("writing back dirty blocks")?;
    }
    // Clean shutdown: the next start is warm (dirty blocks stay cached and
    // are written back later); after a detach it starts empty.
    engine.shutdown(detach).context("clean shutdown")?;
    let _ = std::fs::remove_file(&s.control);
    if hand_over {
        handed_over(&device);
    }
    if detach {
        if engine.dirty_blocks() != 0 {
            bail!(
                "detach incomplete: {} dirty blocks remain",
                engine.dirty_blocks()
            );
        }
        println!("tiercache: detached; the backing device is whole and can be used on its own");
    } else {
        println!("tiercache: stopped");
    }
    Ok(())
}

/// How long a stopping server waits for recordings in progress to write
/// the rest of their files.
const RECORDINGS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the backing device alone (no cache): a baseline for comparisons.
fn run_uncached(
    s: &ServeSettings,
    device: Arc<dyn tiercache_device::BlockDevice>,
    rotational: bool,
) -> Result<()> {
    log::info!(
        "serving {} ({} bytes) without a cache",
        device.describe(),
        device.size()
    );
    let front = FrontEnd::start(
        s,
        Arc::new(crate::export::DeviceExport { device, rotational }),
        &s.backing,
    )?;
    let signals = Signals::register()?;
    announce(s, &front);
    if signals.wait(&front) {
        let device = front.device_name();
        front.hand_over()?;
        handed_over(&device);
    }
    front.stop()?;
    println!("tiercache: stopped");
    Ok(())
}

/// After a hand-over, with everything shut down: says so and exits with
/// [`HANDOVER_EXIT`]. The device's queues are still open in this process;
/// exiting closes them, and only then can the next server take over.
fn handed_over(device: &str) -> ! {
    println!(
        "tiercache: handed over {device}; it waits (holding its IO) for the next `tiercache serve`"
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(HANDOVER_EXIT)
}

fn bind_nbd(s: &ServeSettings) -> Result<Listener> {
    Ok(match &s.listen {
        Some(addr) => {
            if !s.tls.required() {
                eprintln!(
                    "WARNING: serving NBD on TCP {addr} with TLS {}: plain-text clients get \
                     no authentication and no encryption. Anyone who can reach this address \
                     can read and overwrite the device.",
                    if s.tls.policy == TlsPolicy::Off {
                        "off"
                    } else {
                        "optional"
                    }
                );
            }
            Listener::bind_tcp(addr.as_str()).with_context(|| format!("listening on {addr}"))?
        }
        None => {
            if let Some(dir) = s.socket.parent() {
                crate::control::socket_dir(dir)?;
            }
            Listener::bind_unix(&s.socket)
                .with_context(|| format!("binding {}", s.socket.display()))?
        }
    })
}

/// What serves the exports: the NBD server (and the kernel NBD devices it
/// configured, `--nbd-device`), or a ublk device per volume (`--ublk`).
enum FrontEnd {
    Nbd(RunningServer, KernelDevices),
    Ublk(Arc<crate::ublk::UblkFrontEnd>),
}

impl FrontEnd {
    fn start(
        s: &ServeSettings,
        export: Arc<dyn tiercache_frontend::Export>,
        device_spec: &str,
    ) -> Result<FrontEnd> {
        Self::start_many(s, vec![(s.name.clone(), export)], device_spec)
    }

    /// Serves `exports` (name, export): over NBD each under its name, and
    /// the `--nbd-device`s (identified by `device_spec`, the cache, or the
    /// backing device when uncached); over ublk each as its own device
    /// (the volume of a pool of one given by `--backing` as the unnamed
    /// one, `--ublk-id`).
    fn start_many(
        s: &ServeSettings,
        exports: Vec<(String, Arc<dyn tiercache_frontend::Export>)>,
        device_spec: &str,
    ) -> Result<FrontEnd> {
        if let Some(u) = &s.ublk {
            let volumes = exports
                .into_iter()
                .map(|(name, export)| {
                    // A single volume is served under its own name (none
                    // for --backing), whatever the export is called.
                    let arg = match s.volumes.as_slice() {
                        [only] => Some(only),
                        all => all.iter().find(|v| v.name.as_ref() == Some(&name)),
                    };
                    crate::ublk::UblkVolume {
                        name: arg.and_then(|v| v.name.clone()),
                        export,
                        id: arg.and_then(|v| v.ublk_id),
                    }
                })
                .collect();
            return Ok(FrontEnd::Ublk(crate::ublk::start(u, volumes)?));
        }
        let listener = bind_nbd(s)?;
        let names: Vec<String> = exports.iter().map(|(name, _)| name.clone()).collect();
        let entries = exports
            .into_iter()
            .map(|(name, e)| tiercache_nbd::ExportEntry::new(name, e))
            .collect();
        let nbd = Server::new(entries, nbd_config(s)?)?.spawn(listener)?;
        let devices = match KernelDevices::attach(
            &nbd,
            &s.nbd_devices,
            &names,
            device_spec,
            s.nbd_device_timeout,
        ) {
            Ok(d) => d,
            Err(e) => {
                let _ = nbd.shutdown();
                return Err(e);
            }
        };
        Ok(FrontEnd::Nbd(nbd, devices))
    }

    /// True if [`FrontEnd::hand_over`] can leave the device to the next
    /// server: a ublk device made with user recovery, or kernel NBD
    /// devices.
    fn can_hand_over(&self) -> bool {
        match self {
            FrontEnd::Nbd(_, devices) => devices.any(),
            FrontEnd::Ublk(u) => u.can_hand_over(),
        }
    }

    /// Leaves the device waiting for the next server; the export gets no
    /// more calls once this returns. Only if [`FrontEnd::can_hand_over`].
    fn hand_over(self) -> Result<()> {
        match self {
            FrontEnd::Nbd(server, devices) => {
                // No new connections for the kernel; then the server's
                // connections finish what they run and close, and the
                // kernel holds the rest for the next server.
                devices.leave();
                server.shutdown().context("stopping the NBD server")
            }
            FrontEnd::Ublk(u) => u.hand_over(),
        }
    }

    /// What the user sees served (the device paths, or "the NBD export").
    fn device_name(&self) -> String {
        match self {
            FrontEnd::Nbd(_, devices) if devices.any() => devices.names(),
            FrontEnd::Nbd(..) => "the NBD export".to_string(),
            FrontEnd::Ublk(u) => u
                .device_paths()
                .iter()
                .map(|(_, path)| path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// The ublk device went away by itself (deleted from outside).
    fn has_exited(&self) -> bool {
        match self {
            FrontEnd::Nbd(..) => false,
            FrontEnd::Ublk(u) => u.has_exited(),
        }
    }

    /// Stops serving; requests in flight finish first.
    fn stop(self) -> Result<()> {
        match self {
            FrontEnd::Nbd(running, devices) => {
                // Disconnected first: the kernel says so on the
                // connections, which then close with their requests done.
                let detached = devices.detach();
                running.shutdown().context("stopping the NBD server")?;
                detached
            }
            FrontEnd::Ublk(u) => u.stop(),
        }
    }
}

/// What is served, in the log: the backing device of a pool of one, or
/// each volume of a pool, then the cache.
fn log_serving(
    engine: &Engine,
    pool: &[PoolVolume],
    cache: &dyn tiercache_device::BlockDevice,
) -> Result<()> {
    let names = engine.volume_names();
    let what = if let [(_, _)] = names.as_slice() {
        format!("{} ({} bytes)", pool[0].backing.describe(), engine.size())
    } else {
        for (id, name) in &names {
            let st = engine.volume_stats(*id)?;
            let device = pool
                .iter()
                .find(|v| v.name.as_deref() == Some(name.as_str()))
                .map_or(String::new(), |v| v.backing.describe());
            log::info!(
                "volume {name}: {device} ({} bytes), mode {}",
                st.backing_bytes,
                st.mode
            );
        }
        format!("{} volumes", names.len())
    };
    log::info!(
        "serving {what} cached by {} ({} blocks of {} bytes), mode {}, policy {}",
        cache.describe(),
        engine.capacity(),
        engine.block_size(),
        engine.mode(),
        engine.stats().policy
    );
    Ok(())
}

fn announce(s: &ServeSettings, front: &FrontEnd) {
    if let FrontEnd::Ublk(u) = front {
        for (name, path) in u.device_paths() {
            match name {
                None => println!(
                    "tiercache: serving {}  (control: {})",
                    path.display(),
                    s.control.display()
                ),
                Some(name) => println!(
                    "tiercache: serving volume {name} as {}  (control: {})",
                    path.display(),
                    s.control.display()
                ),
            }
        }
        return;
    }
    let names: Vec<String> = match s.volumes[0].name {
        None => vec![s.name.clone()],
        Some(_) => s.volumes.iter().filter_map(|v| v.name.clone()).collect(),
    };
    for name in names {
        match &s.listen {
            Some(addr) => println!("tiercache: serving {}://{addr}/{name}", s.tls.scheme()),
            None => println!(
                "tiercache: serving {}+unix:///{name}?socket={}  (control: {})",
                s.tls.scheme(),
                s.socket.display(),
                s.control.display()
            ),
        }
    }
    if let FrontEnd::Nbd(_, devices) = front {
        devices.announce();
    }
}

// ---------------------------------------------------------------------------
// TLS settings (flags and config file keys) and the NBD server config.

/// `--tls`: whether clients must, may or cannot use TLS (nbdkit's
/// `--tls=require|on|off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsPolicy {
    Off,
    On,
    Require,
}

/// TLS options as given (flag, else config file).
#[derive(Debug, Default)]
pub struct TlsFlags {
    pub policy: Option<TlsPolicy>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
    pub ca: Option<std::path::PathBuf>,
    pub psk: Option<std::path::PathBuf>,
    pub insecure: bool,
}

/// Checked TLS settings: credentials are consistent with the policy, and
/// TCP is served without required TLS only with `--insecure`. Files are
/// read when the server starts.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub policy: TlsPolicy,
    pub credentials: Option<TlsCredentials>,
}

#[derive(Debug, Clone)]
pub enum TlsCredentials {
    X509 {
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        client_ca: Option<std::path::PathBuf>,
    },
    Psk(std::path::PathBuf),
}

impl TlsSettings {
    pub fn resolve(f: TlsFlags, listen: Option<&str>) -> Result<TlsSettings> {
        let credentials = match (f.cert, f.key, f.psk) {
            (Some(_), Some(_), Some(_)) => {
                bail!("--tls-cert/--tls-key and --tls-psk exclude each other: choose one")
            }
            (Some(cert), Some(key), None) => Some(TlsCredentials::X509 {
                cert,
                key,
                client_ca: f.ca.clone(),
            }),
            (None, None, Some(psk)) => Some(TlsCredentials::Psk(psk)),
            (None, None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        if f.ca.is_some() && !matches!(credentials, Some(TlsCredentials::X509 { .. })) {
            bail!("--tls-ca (client certificates) needs --tls-cert and --tls-key");
        }
        let policy = match (f.policy, &credentials) {
            (None, Some(_)) => TlsPolicy::Require,
            (None, None) => TlsPolicy::Off,
            (Some(TlsPolicy::Off), Some(_)) => {
                bail!("--tls off contradicts the TLS credentials given")
            }
            (Some(p @ (TlsPolicy::On | TlsPolicy::Require)), None) => bail!(
                "--tls {} needs credentials: --tls-cert FILE --tls-key FILE, or --tls-psk FILE",
                if p == TlsPolicy::On { "on" } else { "require" }
            ),
            (Some(p), _) => p,
        };
        if let Some(addr) = listen {
            if policy != TlsPolicy::Require && !f.insecure {
                bail!(
                    "--listen {addr} without required TLS would let anyone who can reach it \
                     read and overwrite the device, unencrypted. Give --tls-cert FILE --tls-key \
                     FILE (X.509) or --tls-psk FILE (pre-shared keys), or add --insecure to serve \
                     {} anyway (trusted networks only).",
                    if policy == TlsPolicy::On {
                        "plain-text clients"
                    } else {
                        "plain NBD"
                    }
                );
            }
        }
        Ok(TlsSettings {
            policy,
            credentials,
        })
    }

    pub fn required(&self) -> bool {
        self.policy == TlsPolicy::Require
    }

    /// The URI scheme clients use.
    pub fn scheme(&self) -> &'static str {
        if self.required() {
            "nbds"
        } else {
            "nbd"
        }
    }
}

/// The NBD server's configuration: defaults plus TLS (credentials are
/// read here).
fn nbd_config(s: &ServeSettings) -> Result<ServerConfig> {
    use tiercache_nbd::{TlsConfig, TlsMode};
    let tls = match &s.tls.credentials {
        None => return Ok(ServerConfig::default()),
        Some(TlsCredentials::X509 {
            cert,
            key,
            client_ca,
        }) => TlsConfig::x509_from_files(cert, key, client_ca.as_deref())
            .context("loading the TLS certificate")?,
        Some(TlsCredentials::Psk(file)) => {
            TlsConfig::psk_from_file(file).context("loading the TLS pre-shared keys")?
        }
    };
    log::info!(
        "TLS {}: {}",
        if s.tls.required() {
            "required"
        } else {
            "optional"
        },
        tls.describe()
    );
    Ok(ServerConfig {
        tls: match s.tls.policy {
            TlsPolicy::Require => TlsMode::Required(tls),
            _ => TlsMode::Optional(tls),
        },
        ..ServerConfig::default()
    })
}
