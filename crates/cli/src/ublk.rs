//! `serve --ublk`: every volume of the pool as its own `/dev/ublkbN`
//! instead of an NBD export (crates/ublk; behind the cargo feature `ublk`,
//! on by default). All the devices are served by this one process and its
//! one engine; each device has its own queues and worker threads.
//!
//! The devices outlive the server (user recovery, docs/RESTART.md): which
//! device serves which volume is recorded in a state file next to the
//! control socket ([`state_file`], [`DeviceIds`]), so the next `serve`
//! with the same control socket takes each volume's device over, never
//! another volume's. A plain stop deletes the devices and the file; a
//! hand-over ([`UblkFrontEnd::hand_over`]) and a crash leave both. Online
//! attach adds a device and detach deletes one ([`crate::ublk_pool`]); the
//! file is rewritten after each.

use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_frontend::Export;

/// `--ublk-queues`, `--ublk-depth`, `--ublk-id` (None: the defaults of
/// `tiercache_ublk::UblkConfig`, i.e. one queue, depth 64, the
/// device number in `state_file`, else one the kernel picks),
/// `--ublk-no-recovery` (`recovery` false). The same for every device of
/// a pool, but `id`, which is for a pool of one (a pool's volumes give
/// theirs in [`UblkVolume::id`]).
#[derive(Debug, Clone, Default)]
pub struct UblkSettings {
    pub queues: Option<u16>,
    pub depth: Option<u16>,
    pub id: Option<u32>,
    pub recovery: bool,
    /// `--ublk-zero-copy`.
    pub zero_copy: bool,
    /// Holds the device numbers of the devices served for this control
    /// socket (see [`state_file`]).
    pub state_file: PathBuf,
}

/// One volume to serve as a device.
pub struct UblkVolume {
    /// The volume's name in the pool; None for the volume of a pool of one
    /// given by `--backing` (its state file is the bare number it always
    /// was).
    pub name: Option<String>,
    pub export: Arc<dyn Export>,
    /// The N of /dev/ublkbN asked for (None: the one recorded for this
    /// volume, else one the kernel picks).
    pub id: Option<u32>,
}

/// The state file of the server whose control socket is `control`:
/// `<control without extension>.ublk-id`.
pub fn state_file(control: &Path) -> PathBuf {
    control.with_extension("ublk-id")
}

/// Which device serves which volume, as the state file holds it: a pool of
/// one given by `--backing` is one line with N of /dev/ublkbN (the format
/// of a single device, kept); named volumes are one line `NAME N` each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIds(Vec<(Option<String>, u32)>);

impl DeviceIds {
    /// Reads `file`; an absent or unreadable file is empty, a line that is
    /// neither form is ignored with a warning.
    #[cfg_attr(not(feature = "ublk"), allow(dead_code))]
    pub fn read(file: &Path) -> DeviceIds {
        let Ok(text) = std::fs::read_to_string(file) else {
            return DeviceIds::default();
        };
        DeviceIds::parse(&text, file)
    }

    fn parse(text: &str, file: &Path) -> DeviceIds {
        let mut ids = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let parsed = match line.split_once(char::is_whitespace) {
                None => line.parse().ok().map(|id| (None, id)),
                Some((name, id)) => id
                    .trim()
                    .parse()
                    .ok()
                    .map(|id| (Some(name.to_string()), id)),
            };
            match parsed {
                Some(entry) => ids.push(entry),
                None => log::warn!(
                    "ignoring {:?} in {}: not a device number",
                    line,
                    file.display()
                ),
            }
        }
        DeviceIds(ids)
    }

    /// The device recorded for volume `name` (None: the volume of a pool
    /// of one).
    pub fn of(&self, name: Option<&str>) -> Option<u32> {
        self.0
            .iter()
            .find(|(n, _)| n.as_deref() == name)
            .map(|(_, id)| *id)
    }

    /// The recorded devices of volumes not in `names`.
    #[cfg_attr(not(feature = "ublk"), allow(dead_code))]
    pub fn others<'a>(&'a self, names: &'a [Option<String>]) -> impl Iterator<Item = u32> + 'a {
        self.0
            .iter()
            .filter(|(n, _)| !names.contains(n))
            .map(|(_, id)| *id)
    }

    fn render(&self) -> String {
        self.0
            .iter()
            .map(|(name, id)| match name {
                None => format!("{id}\n"),
                Some(name) => format!("{name} {id}\n"),
            })
            .collect()
    }

    /// Writes the file aside, then renames it into place.
    #[cfg_attr(not(feature = "ublk"), allow(dead_code))]
    pub fn write(&self, file: &Path) -> std::io::Result<()> {
        let tmp = file.with_extension("ublk-id.tmp");
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, file)
    }
}

/// The running ublk devices, one per volume. Shared by the main loop
/// (stop, hand-over) and the control socket (attach, detach).
pub struct UblkFrontEnd {
    #[cfg(feature = "ublk")]
    devices: std::sync::Mutex<Vec<imp::Device>>,
    #[cfg(feature = "ublk")]
    settings: UblkSettings,
}

#[cfg(feature = "ublk")]
mod imp {
    use super::*;
    use anyhow::Context;

    /// One volume's device.
    pub(super) struct Device {
        pub(super) name: Option<String>,
        pub(super) server: tiercache_ublk::UblkServer,
    }

    /// Fails early, before any device is opened, when the kernel has no
    /// ublk or this process may not use it.
    pub fn check_available() -> Result<()> {
        Ok(tiercache_ublk::check_kernel_support()?)
    }

    /// Devices started at once by [`start`]. Most of a device's start is
    /// the kernel's, partly waiting, which overlaps across devices: in the
    /// VM lab (Linux 6.12, 2 vCPUs under TCG) a device took about 175 ms
    /// alone, 130 ms of it switching its IO scheduler to none; 8 at once
    /// brought 64 devices up in 6.4-7.4 s instead of 9.2-10.3 s, with both
    /// vCPUs busy.
    const STARTS_AT_ONCE: usize = 8;

    /// Serves every volume as its own device; a device recorded for a
    /// volume (or asked for) that a dead server left waiting is taken over.
    /// The devices' numbers are fixed one after another in the volumes'
    /// order (so that numbers the kernel picks ascend with it), then up to
    /// [`STARTS_AT_ONCE`] devices start at a time; the devices are logged
    /// and listed in the volumes' order. If one fails, the error names
    /// its volume (the first in order, if several fail), and all are
    /// undone: a device taken over is left waiting again (handed over), a
    /// new one deleted, and the state file is left as it was.
    pub fn start(s: &UblkSettings, volumes: Vec<UblkVolume>) -> Result<Arc<UblkFrontEnd>> {
        if let Some(dir) = s.state_file.parent() {
            crate::control::socket_dir(dir)?;
        }
        let recorded = DeviceIds::read(&s.state_file);
        let names: Vec<Option<String>> = volumes.iter().map(|v| v.name.clone()).collect();
        for id in recorded.others(&names) {
            log::warn!(
                "{} records /dev/ublkb{id} for a volume this server does not serve; it is left \
                 as it is (if it waits for a server, serve that volume again, or delete it)",
                s.state_file.display()
            );
        }
        // `--ublk-id` is the device of a single volume (refused for more).
        let single_id = if volumes.len() == 1 { s.id } else { None };
        let mut added = Vec::with_capacity(volumes.len());
        for v in volumes {
            let id =
                v.id.or(single_id)
                    .or_else(|| recorded.of(v.name.as_deref()));
            // On an error, dropping `added` deletes the devices added and
            // leaves those to take over untouched.
            let t0 = std::time::Instant::now();
            let device = add_device(s, v.name.as_deref(), v.export, id)?;
            added.push((v.name, device, t0.elapsed()));
        }
        let started = crate::parallel::in_order(
            added,
            STARTS_AT_ONCE,
            |(_, r): &(Option<String>, Result<Started>)| r.is_err(),
            |(name, device, add_took)| {
                let started = start_added(name.as_deref(), device, add_took);
                (name, started)
            },
        );
        let mut devices = Vec::with_capacity(started.len());
        let mut failed = None;
        for result in started {
            match result {
                Ok((name, Ok(started))) => {
                    log_started(s, name.as_deref(), &started);
                    devices.push(Device {
                        name,
                        server: started.server,
                    });
                }
                Ok((_, Err(e))) => {
                    failed.get_or_insert(e);
                }
                // Never begun: dropped, as on an error above.
                Err(_) => {}
            }
        }
        if let Some(e) = failed {
            for d in devices {
                undo(d.server);
            }
            return Err(e);
        }
        record(&devices, &s.state_file).with_context(|| {
            format!("recording the device numbers in {}", s.state_file.display())
        })?;
        Ok(Arc::new(UblkFrontEnd {
            devices: std::sync::Mutex::new(devices),
            settings: s.clone(),
        }))
    }

    /// Undoes a device started by a `start` that failed later.
    fn undo(server: tiercache_ublk::UblkServer) {
        let path = server.device_path();
        let undone = if server.recovered() {
            server.hand_over()
        } else {
            server.stop()
        };
        if let Err(e) = undone {
            log::warn!("{}: {e}", path.display());
        }
    }

    /// " of volume NAME", or nothing for the volume of a pool of one.
    fn of_volume(name: Option<&str>) -> String {
        name.map_or(String::new(), |n| format!(" of volume {n}"))
    }

    /// Fixes the number of volume `name`'s device (`id`, else the one the
    /// kernel picks), adding the device unless it is one to take over
    /// (see `tiercache_ublk::AddedDevice::add`).
    fn add_device(
        s: &UblkSettings,
        name: Option<&str>,
        export: Arc<dyn Export>,
        id: Option<u32>,
    ) -> Result<tiercache_ublk::AddedDevice> {
        let defaults = tiercache_ublk::UblkConfig::default();
        let cfg = tiercache_ublk::UblkConfig {
            queues: s.queues.unwrap_or(defaults.queues),
            depth: s.depth.unwrap_or(defaults.depth),
            dev_id: id,
            recovery: s.recovery,
            zero_copy: s.zero_copy,
            ..defaults
        };
        tiercache_ublk::AddedDevice::add(export, &cfg)
            .with_context(|| format!("starting the ublk device{}", of_volume(name)))
    }

    /// A device started, for [`log_started`].
    struct Started {
        server: tiercache_ublk::UblkServer,
        /// Its own time: adding (or probing) it and starting it, not the
        /// other devices' in between.
        took: std::time::Duration,
    }

    /// Starts (or takes over) volume `name`'s device, which
    /// [`add_device`] added in `add_took`; on any thread.
    fn start_added(
        name: Option<&str>,
        device: tiercache_ublk::AddedDevice,
        add_took: std::time::Duration,
    ) -> Result<Started> {
        let t0 = std::time::Instant::now();
        let server = tiercache_ublk::UblkServer::start_added(device)
            .with_context(|| format!("starting the ublk device{}", of_volume(name)))?;
        Ok(Started {
            server,
            took: add_took + t0.elapsed(),
        })
    }

    /// Logs volume `name`'s device, started with settings `s`.
    fn log_started(s: &UblkSettings, name: Option<&str>, started: &Started) {
        let defaults = tiercache_ublk::UblkConfig::default();
        let server = &started.server;
        let what = of_volume(name);
        let g = server.geometry();
        let path = server.device_path();
        log::info!(
            "ublk: {}{what} with {} queues of depth {}, {}-byte logical blocks, IO up to {} KiB{}",
            path.display(),
            s.queues.unwrap_or(defaults.queues),
            s.depth.unwrap_or(defaults.depth),
            g.logical_block,
            g.max_io_bytes >> 10,
            if s.recovery { ", user recovery on" } else { "" }
        );
        if server.recovered() {
            log::info!(
                "ublk: took over {}{what} from the previous server in {} ms",
                path.display(),
                started.took.as_millis()
            );
        }
    }

    impl UblkFrontEnd {
        /// Serves `export` as volume `name`'s device (device `id`, else one
        /// the kernel picks) and records it in the state file; returns the
        /// device's path.
        pub fn add(
            &self,
            name: Option<String>,
            export: Arc<dyn Export>,
            id: Option<u32>,
        ) -> Result<PathBuf> {
            let t0 = std::time::Instant::now();
            let device = add_device(&self.settings, name.as_deref(), export, id)?;
            let started = start_added(name.as_deref(), device, t0.elapsed())?;
            log_started(&self.settings, name.as_deref(), &started);
            let server = started.server;
            let path = server.device_path();
            let mut devices = self.devices();
            devices.push(Device { name, server });
            let file = &self.settings.state_file;
            record(&devices, file)
                .with_context(|| format!("recording the device numbers in {}", file.display()))?;
            Ok(path)
        }

        fn devices(&self) -> std::sync::MutexGuard<'_, Vec<Device>> {
            self.devices.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Deletes volume `name`'s device (its requests in flight finish
        /// first) and records that; false if it has none.
        pub fn remove(&self, name: &str) -> Result<bool> {
            let mut devices = self.devices();
            let Some(i) = devices.iter().position(|d| d.name.as_deref() == Some(name)) else {
                return Ok(false);
            };
            let device = devices.remove(i);
            record(&devices, &self.settings.state_file)?;
            drop(devices);
            let path = device.server.device_path();
            device
                .server
                .stop()
                .map_err(|e| anyhow::anyhow!("stopping {}: {e}", path.display()))?;
            log::info!("ublk: {} of volume {name} deleted", path.display());
            Ok(true)
        }

        /// (volume name, /dev/ublkbN) of every device, in the order served.
        pub fn device_paths(&self) -> Vec<(Option<String>, PathBuf)> {
            self.devices()
                .iter()
                .map(|d| (d.name.clone(), d.server.device_path()))
                .collect()
        }

        /// True once every device has stopped by itself (deleted from
        /// outside, e.g. `ublk del`). One deleted alone leaves its volume
        /// without a device, the others served.
        pub fn has_exited(&self) -> bool {
            self.devices().iter().all(|d| d.server.has_exited())
        }

        /// True if every device was made with user recovery.
        pub fn can_hand_over(&self) -> bool {
            self.devices().iter().all(|d| d.server.can_hand_over())
        }

        /// Deletes every device (requests in flight finish first) and the
        /// state file.
        pub fn stop(&self) -> Result<()> {
            let devices = std::mem::take(&mut *self.devices());
            let mut failed = Vec::new();
            for d in devices {
                let path = d.server.device_path();
                if let Err(e) = d.server.stop() {
                    failed.push(format!("{}: {e}", path.display()));
                }
            }
            let _ = std::fs::remove_file(&self.settings.state_file);
            if !failed.is_empty() {
                anyhow::bail!("stopping the ublk devices: {}", failed.join("; "));
            }
            Ok(())
        }

        /// Leaves every device waiting for the next server (see
        /// `tiercache_ublk::UblkServer::hand_over`): once this returns the
        /// exports get no more calls; the state file stays.
        pub fn hand_over(&self) -> Result<()> {
            let devices = std::mem::take(&mut *self.devices());
            let mut failed = Vec::new();
            for d in devices {
                let path = d.server.device_path();
                if let Err(e) = d.server.hand_over() {
                    failed.push(format!("{}: {e}", path.display()));
                }
            }
            if !failed.is_empty() {
                anyhow::bail!("handing the ublk devices over: {}", failed.join("; "));
            }
            Ok(())
        }
    }

    /// Records which device serves which volume.
    fn record(devices: &[Device], file: &Path) -> std::io::Result<()> {
        DeviceIds(
            devices
                .iter()
                .map(|d| (d.name.clone(), d.server.dev_id()))
                .collect(),
        )
        .write(file)
    }
}

#[cfg(not(feature = "ublk"))]
mod imp {
    use super::*;

    pub fn check_available() -> Result<()> {
        anyhow::bail!("this tiercache was built without ublk support (cargo feature `ublk`)")
    }

    pub fn start(_: &UblkSettings, _: Vec<UblkVolume>) -> Result<Arc<UblkFrontEnd>> {
        check_available().map(|()| Arc::new(UblkFrontEnd {}))
    }

    impl UblkFrontEnd {
        pub fn add(
            &self,
            _: Option<String>,
            _: Arc<dyn Export>,
            _: Option<u32>,
        ) -> Result<PathBuf> {
            check_available().map(|()| PathBuf::new())
        }
        pub fn remove(&self, _: &str) -> Result<bool> {
            Ok(false)
        }
        pub fn device_paths(&self) -> Vec<(Option<String>, PathBuf)> {
            Vec::new()
        }
        pub fn has_exited(&self) -> bool {
            true
        }
        pub fn can_hand_over(&self) -> bool {
            false
        }
        pub fn stop(&self) -> Result<()> {
            Ok(())
        }
        pub fn hand_over(&self) -> Result<()> {
            Ok(())
        }
    }
}

pub use imp::{check_available, start};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_sits_next_to_the_control_socket() {
        assert_eq!(
            state_file(Path::new("/run/tiercache/data.ctl")),
            PathBuf::from("/run/tiercache/data.ublk-id")
        );
    }

    #[test]
    fn a_single_device_is_recorded_as_a_bare_number() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data.ublk-id");
        assert_eq!(DeviceIds::read(&file).of(None), None);
        DeviceIds(vec![(None, 7)]).write(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "7\n");
        assert_eq!(DeviceIds::read(&file).of(None), Some(7));
        DeviceIds(vec![(None, 3)]).write(&file).unwrap();
        assert_eq!(DeviceIds::read(&file).of(None), Some(3));
        std::fs::write(&file, "not a number\n").unwrap();
        assert_eq!(DeviceIds::read(&file), DeviceIds::default());
    }

    #[test]
    fn each_volume_reads_back_its_own_device_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pool.ublk-id");
        let ids = DeviceIds(vec![
            (Some("a".into()), 4),
            (Some("b".into()), 0),
            (Some("c".into()), 9),
        ]);
        ids.write(&file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a 4\nb 0\nc 9\n");
        let back = DeviceIds::read(&file);
        assert_eq!(back, ids);
        assert_eq!(back.of(Some("a")), Some(4));
        assert_eq!(back.of(Some("b")), Some(0));
        assert_eq!(back.of(Some("c")), Some(9));
        // A volume not recorded gets none, not another volume's device.
        assert_eq!(back.of(Some("d")), None);
        assert_eq!(back.of(None), None);
        let served = [Some("a".to_string()), Some("c".to_string())];
        assert_eq!(back.others(&served).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn a_bad_line_is_skipped_and_the_others_kept() {
        let ids = DeviceIds::parse("a 1\nb x\n\n  c 2  \n", Path::new("f"));
        assert_eq!(
            ids,
            DeviceIds(vec![(Some("a".into()), 1), (Some("c".into()), 2)])
        );
    }
}
