//! The `tiercache` command.

mod control;
mod devices;
mod export;
mod kernel_nbd;
mod open_files;
mod parallel;
mod pool;
mod recording;
mod serve;
mod sim;
mod trace;
mod ublk;
mod ublk_pool;
mod upgrade;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tiercache_policy::PolicyConfig;
use tiercache_types::{parse_size, AdmissionKind, CacheMode, ReplacementKind};

/// tiercache: a small fast device caching a large slow one, served as a
/// block device over NBD.
#[derive(Parser, Debug)]
#[command(name = "tiercache", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Format a cache device for a backing device. Only the cache device is
    /// written; the backing device keeps its data and stays usable.
    Create(CreateArgs),
    /// Serve a backing device through a cache device over NBD.
    Serve(ServeArgs),
    /// Check a cache device's metadata (read only), or repair it.
    Check(CheckArgs),
    /// Upgrade a cache of on-disk format 2: write its dirty blocks back to
    /// the backing device, then re-create the cache as format 3 (one
    /// volume; the clean cached contents are dropped).
    Upgrade(upgrade::UpgradeArgs),
    /// What would a cache of a given size and policy do for a workload?
    /// Replays a trace or a synthetic workload through the engine's own
    /// decision code and prints hit ratios, predicted IOPS and latency.
    Sim(sim::SimArgs),
    /// Show a running server's statistics.
    Stats(StatsArgs),
    /// Record the requests a running server receives (time, volume,
    /// offset, length, read/write) into a trace file for `tiercache sim`.
    Trace(trace::TraceArgs),
    /// Write back every dirty block and flush both devices.
    Flush(ControlArgs),
    /// Write back everything, then stop serving; the backing device is left
    /// whole and usable on its own.
    Detach(ControlArgs),
    /// Change the cache mode of a running server.
    SetMode {
        /// writethrough, writeback, writearound or passthrough.
        mode: CacheMode,
        /// Only this volume of a pool (default: every volume).
        #[arg(long)]
        volume: Option<String>,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Add a volume to a running pool: `NAME=BACKING[,share=SIZE][,cap=SIZE]`
    /// (BACKING as for `serve --backing`); it is exported over NBD as NAME
    /// at once.
    Attach {
        #[arg(value_name = "NAME=BACKING")]
        volume: String,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Set a pool volume's guaranteed share and cap of the cache on a
    /// running server (beyond them the volumes share by marginal utility).
    SetLimits {
        /// The volume.
        #[arg(long)]
        volume: String,
        /// Cache guaranteed to it (e.g. 2G; 0: none).
        #[arg(long, default_value = "0", value_parser = parse_size)]
        share: u64,
        /// Most cache it may hold (e.g. 8G; default: no cap).
        #[arg(long, value_parser = parse_size)]
        cap: Option<u64>,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Take a volume out of a running pool: its dirty blocks are written
    /// back (with progress), its cache blocks freed, its export removed;
    /// the other volumes are undisturbed.
    DetachVolume {
        #[arg(value_name = "NAME")]
        volume: String,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Reproduce the field study side by side (fio over NBD): report, plots.
    Bench(tiercache_bench::BenchArgs),
    /// Draw the bench plots of fio runs made elsewhere (e.g. the VM lab's
    /// anchors bench): every `fio-<run>.out` (fio's json+ report) in DIR with
    /// its `iops-<run>_iops.N.log` files; one IOPS and one latency plot per
    /// group (the part of `<run>` after its last '-').
    PlotFio {
        /// Directory holding the fio reports and IOPS logs.
        dir: std::path::PathBuf,
        /// Where the PNG files go (default: DIR/plots).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// The runs' IOPS log window in milliseconds (fio's log_avg_msec).
        #[arg(long, default_value_t = 1000)]
        log_msec: u64,
    },
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// Backing (slow) device; only read, to record its identity.
    #[arg(long)]
    backing: String,
    /// Cache (fast) device to format.
    #[arg(long)]
    cache: String,
    /// writethrough (default), writeback, writearound or passthrough.
    #[arg(long, default_value = "writethrough")]
    mode: CacheMode,
    /// Cache block size, 4k to 1M (default: 4k, doubled up to 64k while the
    /// cache would hold more than 16Mi blocks, to bound the RAM).
    #[arg(long, value_parser = parse_size_arg)]
    block_size: Option<u64>,
    /// Replacement policy: adaptive, smq, lru, s3fifo, arc, fifo, sieve.
    #[arg(long, default_value = "adaptive")]
    policy: ReplacementKind,
    /// Admission policy: always, hotspot, nhit.
    #[arg(long, default_value = "always")]
    admission: AdmissionKind,
    /// Metadata journal size (default: twice the mapping, at least 1M).
    #[arg(long, value_parser = parse_size_arg)]
    journal_size: Option<u64>,
    /// Format even if the device already holds a tiercache cache (its
    /// contents, dirty data included, are lost).
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Cache device to check.
    #[arg(long)]
    cache: String,
    /// Salvage what is consistent and rewrite the metadata (keeps every
    /// readable dirty block).
    #[arg(long)]
    repair: bool,
    /// Also read every clean-claimed slot and compare its crc (reads up to
    /// the whole cache device): reports the claims a start after a crash
    /// would drop. `--repair` always does this.
    #[arg(long)]
    verify: bool,
}

/// Where to find a running server.
#[derive(Args, Debug, Clone)]
struct ControlArgs {
    /// Name of the server (as given to `serve --name`).
    #[arg(long, default_value = "default")]
    name: String,
    /// Path of the control socket (default: derived from --name).
    #[arg(long)]
    control: Option<PathBuf>,
}

impl ControlArgs {
    fn path(&self) -> PathBuf {
        self.control
            .clone()
            .unwrap_or_else(|| control::default_dir().join(format!("{}.ctl", self.name)))
    }
}

#[derive(Args, Debug)]
struct StatsArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// Print JSON.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print Prometheus text exposition format.
    #[arg(long)]
    prometheus: bool,
    /// Refresh every SECONDS until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1")]
    watch: Option<f64>,
}

/// `serve` options; every one can also come from a TOML file (`--config`),
/// flags win.
#[derive(Args, Debug, Default)]
struct ServeArgs {
    /// TOML file with any of the options below (keys as the long flag
    /// names, with underscores).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Backing (slow) device: a file or block device path; `hdd:PATH` adds
    /// the emulated HDD latency model; `mem:SIZE` is a RAM device.
    #[arg(long)]
    backing: Option<String>,
    /// A volume of a pool: NAME=BACKING (BACKING as for --backing), given
    /// once per volume instead of --backing. One cache serves them all,
    /// each its own NBD export named NAME (with --ublk: its own
    /// /dev/ublkbN). Options after the backing device: `,share=SIZE`,
    /// `,cap=SIZE`, `,ublk-id=N` (the N of its /dev/ublkbN).
    #[arg(long = "volume", value_name = "NAME=BACKING")]
    volumes: Vec<String>,
    /// Cache (fast) device, same syntax as --backing. Without one, the
    /// backing device is served alone (a baseline for comparisons).
    #[arg(long)]
    cache: Option<String>,
    /// writethrough (default), writeback, writearound or passthrough.
    #[arg(long)]
    mode: Option<CacheMode>,
    /// Cache block size of a cache this formats (`--create`, `mem:`), 4k to
    /// 1M (default: as `create`'s, from the cache's size).
    #[arg(long, value_parser = parse_size_arg)]
    block_size: Option<u64>,
    /// Replacement policy: adaptive (default), smq, lru, s3fifo, arc, fifo, sieve.
    #[arg(long)]
    policy: Option<ReplacementKind>,
    /// Admission policy: always (default), hotspot, nhit.
    #[arg(long)]
    admission: Option<AdmissionKind>,
    /// Sequential streams longer than this bypass the cache (default 4M; 0 disables).
    #[arg(long, value_parser = parse_size_arg)]
    sequential_cutoff: Option<u64>,
    /// Dirty share the background cleaner aims for in writeback, 0..1 (default 0.1).
    #[arg(long)]
    writeback_target: Option<f64>,
    /// Seconds without client IO after which the cleaner writes every dirty
    /// block back at full speed (default 0.5).
    #[arg(long)]
    writeback_idle_after: Option<f64>,
    /// Export name (default "default").
    #[arg(long)]
    name: Option<String>,
    /// Unix socket to serve on (default: $XDG_RUNTIME_DIR/tiercache/NAME.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Serve on TCP ADDR:PORT instead of a Unix socket. Needs TLS
    /// (--tls-cert/--tls-key or --tls-psk), or --insecure for plain NBD.
    #[arg(long)]
    listen: Option<String>,
    /// Control socket (default: next to the socket, NAME.ctl).
    #[arg(long)]
    control: Option<PathBuf>,
    /// TLS server certificate chain (PEM), with --tls-key: clients connect
    /// with nbds:// URIs.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA in FILE (PEM).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// TLS with pre-shared keys instead of certificates: a psktool keys
    /// file (identity:hexkey per line).
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,
    /// require (default with credentials): clients must use TLS; on: TLS
    /// is optional for clients; off (default without credentials).
    #[arg(long, value_name = "MODE")]
    tls: Option<serve::TlsPolicy>,
    /// Allow --listen without required TLS: plain NBD on the network, no
    /// authentication, no encryption.
    #[arg(long)]
    insecure: bool,
    /// Format the cache device first if it does not hold a tiercache cache
    /// yet (as `tiercache create` would). Never formats a device that does.
    #[arg(long)]
    create: bool,
    /// Serve as a Linux block device, /dev/ublkbN, through the kernel's
    /// ublk driver (Linux >= 6.0, root) instead of over NBD.
    #[arg(long)]
    ublk: bool,
    /// ublk hardware queues, one thread each (default 1).
    #[arg(long, value_name = "N")]
    ublk_queues: Option<u16>,
    /// ublk requests in flight per queue (default 64).
    #[arg(long, value_name = "D")]
    ublk_depth: Option<u16>,
    /// The N of /dev/ublkbN (default: the one this server's last run
    /// used, recorded next to the control socket, else the kernel picks
    /// one). A device N that a dead or handed-over server left waiting is
    /// taken over.
    #[arg(long, value_name = "N")]
    ublk_id: Option<u32>,
    /// Make the ublk device without user recovery: when the server dies
    /// its IO fails instead of waiting for the next server.
    #[arg(long)]
    ublk_no_recovery: bool,
    /// Read hits and bypassed reads straight into the requests' pages
    /// where the kernel can register them (Linux >= 6.16), instead of
    /// copying through a buffer of the server's; ignored on older kernels,
    /// and on 6.17 reads are still copied (its block layer can misplace
    /// them).
    #[arg(long)]
    ublk_zero_copy: bool,
    /// Also serve an export as the kernel NBD device `/dev/nbdN`, which
    /// the server configures itself (netlink; root): the device outlives
    /// a crash, kill -9 or hand-over of the server, and the next server
    /// takes it over. `EXPORT=/dev/nbdN` for an export of a pool.
    /// Repeatable.
    #[arg(long = "nbd-device", value_name = "DEVICE")]
    nbd_devices: Vec<String>,
    /// Seconds an --nbd-device holds its IO while no server serves it
    /// (default 120); then the IO fails.
    #[arg(long, value_name = "SECONDS")]
    nbd_device_timeout: Option<u64>,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// The same options as read from a config file.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ServeFile {
    backing: Option<String>,
    cache: Option<String>,
    mode: Option<CacheMode>,
    block_size: Option<String>,
    policy: Option<ReplacementKind>,
    admission: Option<AdmissionKind>,
    sequential_cutoff: Option<String>,
    writeback_target: Option<f64>,
    writeback_idle_after: Option<f64>,
    name: Option<String>,
    socket: Option<PathBuf>,
    listen: Option<String>,
    control: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_psk: Option<PathBuf>,
    tls: Option<serve::TlsPolicy>,
    insecure: Option<bool>,
    ublk: Option<bool>,
    ublk_queues: Option<u16>,
    ublk_depth: Option<u16>,
    ublk_id: Option<u32>,
    ublk_no_recovery: Option<bool>,
    ublk_zero_copy: Option<bool>,
    #[serde(default, rename = "nbd_device")]
    nbd_devices: Vec<String>,
    nbd_device_timeout: Option<u64>,
    #[serde(default, rename = "volume")]
    volumes: Vec<String>,
}

/// One backing volume to serve: `--backing SPEC` (no name: a pool of one)
/// or `--volume NAME=SPEC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeArg {
    pub name: Option<String>,
    pub spec: String,
    /// Bytes of the cache guaranteed to this volume (`share=SIZE`).
    pub share: Option<u64>,
    /// Bytes of the cache it may hold at most (`cap=SIZE`).
    pub cap: Option<u64>,
    /// With `--ublk`: the N of its /dev/ublkbN (`ublk-id=N`).
    pub ublk_id: Option<u32>,
}

impl VolumeArg {
    /// Parses `NAME=BACKING[,share=SIZE][,cap=SIZE][,ublk-id=N]`.
    fn parse(s: &str) -> Result<VolumeArg> {
        let Some((name, rest)) = s.split_once('=') else {
            bail!("--volume {s:?}: give NAME=BACKING, e.g. --volume vm1=/dev/sdb");
        };
        tiercache_metadata::validate_name(name)
            .map_err(|e| anyhow::anyhow!("--volume {s:?}: {e}"))?;
        let mut parts = rest.split(',');
        let spec = parts.next().unwrap_or_default();
        if spec.is_empty() {
            bail!("--volume {s:?}: no backing device after '='");
        }
        let (mut share, mut cap, mut ublk_id) = (None, None, None);
        for part in parts {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            if key == "ublk-id" {
                let id = value.parse::<u32>().map_err(|e| {
                    anyhow::anyhow!("--volume {s:?}: ublk-id={value}: {e} (give a device number)")
                })?;
                ublk_id = Some(id);
                continue;
            }
            let bytes = parse_size(value)
                .map_err(|e| anyhow::anyhow!("--volume {s:?}: {key}={value}: {e}"))?;
            match key {
                "share" => share = Some(bytes),
                "cap" => cap = Some(bytes),
                _ => {
                    bail!("--volume {s:?}: unknown option {part:?} (options: share=SIZE, cap=SIZE, ublk-id=N)")
                }
            }
        }
        Ok(VolumeArg {
            name: Some(name.to_string()),
            spec: spec.to_string(),
            share,
            cap,
            ublk_id,
        })
    }
}

/// Fully resolved `serve` settings.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// The first volume's backing device (the only one of a pool of one).
    pub backing: String,
    /// Every volume, the first being `backing`'s.
    pub volumes: Vec<VolumeArg>,
    pub cache: Option<String>,
    pub mode: CacheMode,
    /// The block size of a cache this formats; None: from the cache's size
    /// ([`tiercache_engine::default_block_size`]).
    pub block_size: Option<u32>,
    pub policy: PolicyConfig,
    /// Whether mode / policy were given (else an existing cache keeps its own).
    pub mode_given: bool,
    pub policy_given: bool,
    pub sequential_cutoff: u64,
    pub writeback_target: f64,
    /// No client IO for this long counts as idle: clean at full speed.
    pub writeback_idle_after: std::time::Duration,
    pub name: String,
    pub socket: PathBuf,
    pub listen: Option<String>,
    /// TLS for the NBD server (checked against `listen`).
    pub tls: serve::TlsSettings,
    pub control: PathBuf,
    pub create: bool,
    /// Serve over ublk instead of NBD.
    pub ublk: Option<ublk::UblkSettings>,
    /// Exports also served as kernel NBD devices (`--nbd-device`).
    pub nbd_devices: Vec<kernel_nbd::NbdDeviceArg>,
    /// Seconds those devices hold their IO while no server serves them.
    pub nbd_device_timeout: u64,
}

impl ServeArgs {
    fn resolve(self) -> Result<ServeSettings> {
        let file: ServeFile = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("in config file {}", p.display()))?
            }
            None => ServeFile::default(),
        };
        let size = |flag: Option<u64>, file: Option<String>, default: u64| -> Result<u64> {
            match (flag, file) {
                (Some(v), _) => Ok(v),
                (None, Some(s)) => parse_size(&s).map_err(anyhow::Error::msg),
                (None, None) => Ok(default),
            }
        };
        let named = if self.volumes.is_empty() {
            file.volumes
        } else {
            self.volumes
        };
        let volumes: Vec<VolumeArg> = match (self.backing.or(file.backing), named.is_empty()) {
            (Some(_), false) => bail!(
                "give either --backing (one volume) or --volume NAME=BACKING (a pool), not both"
            ),
            (Some(spec), true) => vec![VolumeArg {
                name: None,
                spec,
                share: None,
                cap: None,
                ublk_id: None,
            }],
            (None, false) => named
                .iter()
                .map(|v| VolumeArg::parse(v))
                .collect::<Result<_>>()?,
            (None, true) => {
                bail!("no backing device: give --backing PATH, or --volume NAME=PATH per volume")
            }
        };
        for (i, v) in volumes.iter().enumerate() {
            if volumes[..i].iter().any(|w| w.name == v.name) {
                bail!(
                    "volume {:?} is given twice",
                    v.name.as_deref().unwrap_or("")
                );
            }
        }
        let backing = volumes[0].spec.clone();
        let cache = self.cache.or(file.cache);
        let block_size = match (self.block_size, file.block_size) {
            (None, None) => None,
            (flag, file) => Some(size(flag, file, 0)?),
        };
        if let Some(block_size) = block_size {
            if !(4096..=1 << 20).contains(&block_size) || !block_size.is_power_of_two() {
                bail!("--block-size {block_size} must be a power of two from 4k to 1M");
            }
        }
        let writeback_target = self
            .writeback_target
            .or(file.writeback_target)
            .unwrap_or(0.1);
        if !(0.0..=1.0).contains(&writeback_target) {
            bail!("--writeback-target {writeback_target} must be between 0 and 1");
        }
        let idle = self
            .writeback_idle_after
            .or(file.writeback_idle_after)
            .unwrap_or(0.5);
        let writeback_idle_after = std::time::Duration::try_from_secs_f64(idle)
            .ok()
            .filter(|d| d.as_secs() <= 365 * 86400)
            .with_context(|| {
                format!("--writeback-idle-after {idle} must be between 0 and a year of seconds")
            })?;
        let name = self.name.or(file.name).unwrap_or_else(|| "default".into());
        let socket = self
            .socket
            .or(file.socket)
            .unwrap_or_else(|| control::default_dir().join(format!("{name}.sock")));
        let control = self
            .control
            .or(file.control)
            .unwrap_or_else(|| socket.with_extension("ctl"));
        let mode_given = self.mode.is_some() || file.mode.is_some();
        let policy_given = self.policy.is_some()
            || file.policy.is_some()
            || self.admission.is_some()
            || file.admission.is_some();
        let ublk = self.ublk || file.ublk.unwrap_or(false);
        if !ublk
            && (self.ublk_queues.or(self.ublk_depth).is_some()
                || self.ublk_id.is_some()
                || self.ublk_no_recovery
                || self.ublk_zero_copy)
        {
            bail!("--ublk-queues, --ublk-depth, --ublk-id, --ublk-no-recovery and --ublk-zero-copy go with --ublk");
        }
        let nbd_devices = if self.nbd_devices.is_empty() {
            file.nbd_devices
        } else {
            self.nbd_devices
        };
        let nbd_devices: Vec<kernel_nbd::NbdDeviceArg> = nbd_devices
            .iter()
            .map(|d| kernel_nbd::NbdDeviceArg::parse(d))
            .collect::<Result<_>>()?;
        if ublk && !nbd_devices.is_empty() {
            bail!("--nbd-device serves an NBD export; it does not go with --ublk");
        }
        if !ublk && volumes.iter().any(|v| v.ublk_id.is_some()) {
            bail!("--volume ...,ublk-id=N goes with --ublk");
        }
        if volumes.len() > 1 && self.ublk_id.or(file.ublk_id).is_some() {
            bail!(
                "--ublk-id names the device of a single volume; in a pool give each volume its \
                 own: --volume NAME=BACKING,ublk-id=N"
            );
        }
        for (i, v) in volumes.iter().enumerate() {
            if let Some(id) = v.ublk_id {
                if volumes[..i].iter().any(|w| w.ublk_id == Some(id)) {
                    bail!("ublk-id={id} is given to two volumes");
                }
            }
        }
        let tls = serve::TlsSettings::resolve(
            serve::TlsFlags {
                policy: self.tls.or(file.tls),
                cert: self.tls_cert.or(file.tls_cert),
                key: self.tls_key.or(file.tls_key),
                ca: self.tls_ca.or(file.tls_ca),
                psk: self.tls_psk.or(file.tls_psk),
                insecure: self.insecure || file.insecure.unwrap_or(false),
            },
            self.listen.as_deref().or(file.listen.as_deref()),
        )?;
        Ok(ServeSettings {
            backing,
            volumes,
            cache,
            mode_given,
            policy_given,
            mode: self.mode.or(file.mode).unwrap_or_default(),
            block_size: block_size.map(|b| b as u32),
            policy: PolicyConfig {
                replacement: self
                    .policy
                    .or(file.policy)
                    .unwrap_or(PolicyConfig::default().replacement),
                admission: self
                    .admission
                    .or(file.admission)
                    .unwrap_or(PolicyConfig::default().admission),
                ..PolicyConfig::default()
            },
            sequential_cutoff: size(self.sequential_cutoff, file.sequential_cutoff, 4 << 20)?,
            writeback_target,
            writeback_idle_after,
            name,
            socket,
            listen: self.listen.or(file.listen),
            tls,
            control: control.clone(),
            create: self.create,
            ublk: ublk.then(|| ublk::UblkSettings {
                queues: self.ublk_queues.or(file.ublk_queues),
                depth: self.ublk_depth.or(file.ublk_depth),
                id: self.ublk_id.or(file.ublk_id),
                recovery: !(self.ublk_no_recovery || file.ublk_no_recovery.unwrap_or(false)),
                zero_copy: self.ublk_zero_copy || file.ublk_zero_copy.unwrap_or(false),
                state_file: ublk::state_file(&control),
            }),
            nbd_devices,
            nbd_device_timeout: self
                .nbd_device_timeout
                .or(file.nbd_device_timeout)
                .unwrap_or(kernel_nbd::DEFAULT_HOLD_SECS),
        })
    }
}

fn progress_bar(what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} blocks ({eta} left)")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn control_call(args: &ControlArgs, req: control::Request, what: &str) -> Result<()> {
    let bar = progress_bar(what);
    let reply = control::call(&args.path(), &req, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    match reply {
        control::Reply::Ok { message } => {
            println!("{message}");
            Ok(())
        }
        control::Reply::Error { message } => bail!("{message}"),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn stats(a: &StatsArgs) -> Result<()> {
    loop {
        let reply = control::call(&a.control.path(), &control::Request::Stats, |_, _| {})?;
        let control::Reply::Stats(s) = reply else {
            bail!("unexpected reply {reply:?}");
        };
        let mut text = String::new();
        if a.watch.is_some() && !a.json && !a.prometheus {
            text.push_str("\x1b[2J\x1b[H");
        }
        if a.json {
            text.push_str(&serde_json::to_string_pretty(&s)?);
            text.push('\n');
        } else if a.prometheus {
            text.push_str(&s.to_prometheus());
        } else {
            text.push_str(&format!("{s}\n"));
        }
        // A reader that went away (`stats --watch | head`) ends us quietly.
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        drop(out);
        match a.watch {
            Some(secs) => std::thread::sleep(Duration::from_secs_f64(secs.max(0.1))),
            None => return Ok(()),
        }
    }
}

fn create(a: &CreateArgs) -> Result<()> {
    if a.cache.starts_with("mem:") {
        bail!(
            "a memory cache needs no create: it is volatile (give it to `serve --cache` directly)"
        );
    }
    if let Some(bs) = a.block_size {
        if !(4096..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
            bail!("--block-size {bs} must be a power of two from 4k to 1M");
        }
    }
    devices::ensure_distinct(&a.backing, &a.cache)?;
    let backing = devices::open(&a.backing).context("backing device")?;
    let cache = devices::open(&a.cache).context("cache device")?;
    let block_size = a.block_size.map_or_else(
        || tiercache_engine::default_block_size(cache.size()),
        |b| b as u32,
    );
    let existing = tiercache_metadata::check(&*cache);
    if existing.superblock.is_some() && !a.force {
        bail!(
            "{} already holds a tiercache cache ({} blocks cached, {} dirty); \
             use --force to format it anyway (its contents are lost)",
            a.cache,
            existing.entries,
            existing.dirty_entries
        );
    }
    if !a.force {
        devices::ensure_blank(&*cache, &a.cache)?;
    }
    let cfg = tiercache_engine::EngineConfig {
        mode: a.mode,
        block_size,
        policy: PolicyConfig {
            replacement: a.policy,
            admission: a.admission,
            ..PolicyConfig::default()
        },
        ..tiercache_engine::EngineConfig::default()
    };
    let engine = tiercache_engine::Engine::create(
        backing,
        cache,
        &cfg,
        std::sync::Arc::new(tiercache_types::MonotonicClock::new()),
        &a.backing,
        a.journal_size,
    )?;
    println!(
        "formatted {}: {} cache blocks of {} bytes for backing device {} ({} bytes), mode {}, policy {}+{}",
        a.cache,
        engine.capacity(),
        engine.block_size(),
        a.backing,
        engine.size(),
        a.mode,
        a.policy,
        a.admission
    );
    engine.shutdown(false)?;
    Ok(())
}

fn check(a: &CheckArgs) -> Result<()> {
    let cache = devices::open(&a.cache).context("cache device")?;
    let report = if a.repair {
        tiercache_metadata::repair(cache)?
    } else {
        tiercache_metadata::check_with(
            &*cache,
            &tiercache_metadata::CheckOptions {
                verify_clean_claims: a.verify,
            },
        )
    };
    println!(
        "{}: {} blocks mapped, {} dirty, {} clean with a crc, {} journal blocks replayed",
        a.cache,
        report.entries,
        report.dirty_entries,
        report.clean_with_crc,
        report.journal_blocks_replayed
    );
    for (i, v) in report.volumes.iter().enumerate() {
        if let Some(r) = v.record() {
            println!(
                "volume {i}: '{}', {} bytes, {:?}, mode {}, generation {}{}",
                r.name,
                r.size,
                r.state,
                r.mode,
                r.generation,
                if r.path_hint.is_empty() {
                    String::new()
                } else {
                    format!(", last seen at {}", r.path_hint)
                }
            );
        }
    }
    if report.stale_entries > 0 {
        println!(
            "{} stale entries (of volumes not attached, or of an earlier attachment)",
            report.stale_entries
        );
    }
    for p in &report.problems {
        match p.block {
            Some(b) => println!("{:?}: {} (metadata block {b})", p.severity, p.message),
            None => println!("{:?}: {}", p.severity, p.message),
        }
    }
    for action in &report.actions {
        println!("repaired: {action}");
    }
    if report.is_clean() || a.repair {
        println!(
            "{}",
            if a.repair {
                "repair done"
            } else {
                "no problems found"
            }
        );
        Ok(())
    } else {
        bail!(
            "problems found; `tiercache check --repair --cache {}` salvages what is consistent",
            a.cache
        )
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Create(a) => create(&a),
        Command::Check(a) => check(&a),
        Command::Upgrade(a) => upgrade::run(&a),
        Command::Sim(a) => sim::run(&a),
        Command::Serve(args) => args.resolve().and_then(|s| serve::run(&s)),
        Command::Stats(a) => stats(&a),
        Command::Trace(a) => trace::run(&a),
        Command::Flush(c) => control_call(&c, control::Request::Flush, "flushing"),
        Command::Detach(c) => control_call(&c, control::Request::Detach, "detaching"),
        Command::Attach { volume, control } => VolumeArg::parse(&volume).and_then(|v| {
            let req = control::Request::Attach {
                name: v.name.unwrap_or_default(),
                backing: v.spec,
                share: v.share,
                cap: v.cap,
                ublk_id: v.ublk_id,
            };
            control_call(&control, req, "attach")
        }),
        Command::DetachVolume { volume, control } => control_call(
            &control,
            control::Request::DetachVolume { name: volume },
            "detaching volume",
        ),
        Command::SetLimits {
            volume,
            share,
            cap,
            control,
        } => control_call(
            &control,
            control::Request::SetLimits { volume, share, cap },
            "set-limits",
        ),
        Command::SetMode {
            mode,
            volume,
            control,
        } => control_call(
            &control,
            control::Request::SetMode { mode, volume },
            "set-mode",
        ),
        Command::PlotFio { dir, out, log_msec } => {
            let out = out.unwrap_or_else(|| dir.join("plots"));
            tiercache_bench::fio_dir::plot_dir(&dir, &out, log_msec.max(1)).map(|files| {
                for f in files {
                    println!("{}", f.display());
                }
            })
        }
        Command::Bench(a) => std::env::current_exe()
            .map_err(Into::into)
            .and_then(|exe| tiercache_bench::run(&a, &exe)),
    };
    if let Err(e) = result {
        eprintln!("tiercache: error: {e:#}");
        std::process::exit(1);
    }
}
