//! `serve --nbd-device [EXPORT=]/dev/nbdN`: exports of the NBD server also
//! attached as kernel NBD devices by the server itself
//! (`tiercache_nbd::kernel_client`), so that a device outlives a crash,
//! `kill -9` or hand-over of the server: the next server with the same
//! settings takes it over (docs/RESTART.md).

use anyhow::{bail, Context, Result};
use tiercache_nbd::kernel_client::{
    Attached, KernelDevice, KernelDeviceConfig, DEFAULT_REQUEUE_CHECK,
};
use tiercache_nbd::RunningServer;

/// Default of `--nbd-device-timeout`: how long a device holds its IO
/// while no server serves it.
pub const DEFAULT_HOLD_SECS: u64 = 120;

/// One `--nbd-device` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdDeviceArg {
    /// The export (None: the only one, of a pool of one).
    pub export: Option<String>,
    /// The N of /dev/nbdN.
    pub index: u32,
}

impl NbdDeviceArg {
    /// Parses `[EXPORT=]/dev/nbdN` (or `nbdN`).
    pub fn parse(s: &str) -> Result<NbdDeviceArg> {
        let (export, dev) = match s.split_once('=') {
            Some((e, d)) => (Some(e.to_string()), d),
            None => (None, s),
        };
        let index = dev
            .strip_prefix("/dev/")
            .unwrap_or(dev)
            .strip_prefix("nbd")
            .and_then(|n| n.parse::<u32>().ok())
            .with_context(|| format!("--nbd-device {s:?}: give /dev/nbdN or EXPORT=/dev/nbdN"))?;
        Ok(NbdDeviceArg { export, index })
    }
}

/// The identifier a device is connected with: the cache (or, uncached,
/// the backing device) and the export, so that only a server of the same
/// cache and export can take the device over.
pub fn backend_identifier(device_spec: &str, export: &str) -> String {
    let spec = std::fs::canonicalize(device_spec)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| device_spec.to_string());
    format!("tiercache:{spec}#{export}")
}

/// The kernel devices of a running server.
#[derive(Default)]
pub struct KernelDevices(Vec<KernelDevice>);

impl KernelDevices {
    /// Attaches each of `args` to its export of `server` (`exports`: the
    /// server's export names, the first being a pool of one's), holding IO
    /// `hold_secs` while no server serves it. A device a previous server
    /// left waiting is taken over.
    pub fn attach(
        server: &RunningServer,
        args: &[NbdDeviceArg],
        exports: &[String],
        device_spec: &str,
        hold_secs: u64,
    ) -> Result<KernelDevices> {
        let mut devices = KernelDevices::default();
        for a in args {
            let export = match &a.export {
                Some(e) if exports.contains(e) => e.clone(),
                Some(e) => bail!(
                    "--nbd-device {e}=/dev/nbd{}: no export {e:?} (exports: {exports:?})",
                    a.index
                ),
                None if exports.len() == 1 => exports[0].clone(),
                None => bail!(
                    "--nbd-device /dev/nbd{}: a pool has several exports; give EXPORT=/dev/nbd{}",
                    a.index,
                    a.index
                ),
            };
            let cfg = KernelDeviceConfig {
                index: a.index,
                backend: backend_identifier(device_spec, &export),
                export: export.clone(),
                dead_conn_timeout: hold_secs,
                requeue_check: DEFAULT_REQUEUE_CHECK,
            };
            let (device, how) = KernelDevice::attach(server.local_connector(), cfg)
                .with_context(|| format!("attaching export {export:?} as /dev/nbd{}", a.index))?;
            match how {
                Attached::Connected => log::info!(
                    "{} attached (export {export:?}; IO held up to {hold_secs} s while no server serves it)",
                    device.path().display()
                ),
                Attached::TookOver(t) => log::info!(
                    "took over {} from the previous server in {} ms",
                    device.path().display(),
                    t.as_millis()
                ),
            }
            devices.0.push(device);
        }
        Ok(devices)
    }

    /// True if there is a device to hand over.
    pub fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// The devices' paths, for messages.
    pub fn names(&self) -> String {
        let names: Vec<String> = self
            .0
            .iter()
            .map(|d| d.path().display().to_string())
            .collect();
        names.join(", ")
    }

    /// Lines announcing the devices.
    pub fn announce(&self) {
        for d in &self.0 {
            println!(
                "tiercache: serving {} (export {})",
                d.path().display(),
                d.export()
            );
        }
    }

    /// A plain stop: every device disconnected (the first error).
    pub fn detach(self) -> Result<()> {
        let mut result = Ok(());
        for d in self.0 {
            let path = d.path();
            if let Err(e) = d.detach() {
                log::error!("disconnecting {}: {e}", path.display());
                if result.is_ok() {
                    result = Err(e).with_context(|| format!("disconnecting {}", path.display()));
                }
            }
        }
        result
    }

    /// A hand-over: the devices stay, waiting for the next server.
    pub fn leave(self) {
        for d in self.0 {
            d.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_arguments() {
        assert_eq!(
            NbdDeviceArg::parse("/dev/nbd3").unwrap(),
            NbdDeviceArg {
                export: None,
                index: 3
            }
        );
        assert_eq!(
            NbdDeviceArg::parse("vm1=nbd12").unwrap(),
            NbdDeviceArg {
                export: Some("vm1".into()),
                index: 12
            }
        );
        for bad in ["/dev/sda", "/dev/nbd", "nbdx", "vm1=/dev/ublkb0", ""] {
            assert!(NbdDeviceArg::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_backend_names_the_device_and_the_export() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache.img");
        std::fs::write(&cache, b"").unwrap();
        let relative = backend_identifier(cache.to_str().unwrap(), "default");
        assert!(relative.starts_with("tiercache:/"), "{relative}");
        assert!(relative.ends_with("#default"));
        assert_ne!(
            relative,
            backend_identifier(cache.to_str().unwrap(), "other")
        );
        assert_eq!(backend_identifier("mem:1G", "x"), "tiercache:mem:1G#x");
    }
}
