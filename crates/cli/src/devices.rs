//! Device specifications on the command line and in config files.
//!
//! A spec is a path to a file or block device, optionally prefixed:
//! - `mem:SIZE`: a RAM device (contents lost at exit), e.g. `mem:1G`;
//! - `hdd:SPEC`: SPEC behind the emulated HDD latency model (for machines
//!   without a real HDD), e.g. `hdd:/var/tmp/slow.img`.

use anyhow::{bail, Context, Result};
use std::sync::Arc;
use tiercache_device::{BlockDevice, EmulatedHdd, FileDevice, HddModel, MemDevice};
use tiercache_types::parse_size;

/// Opens the device a spec names.
pub fn open(spec: &str) -> Result<Arc<dyn BlockDevice>> {
    if let Some(inner) = spec.strip_prefix("hdd:") {
        let dev = open(inner)?;
        let hdd =
            EmulatedHdd::new(dev, HddModel::default()).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        return Ok(Arc::new(hdd));
    }
    if let Some(size) = spec.strip_prefix("mem:") {
        let bytes = parse_size(size).map_err(anyhow::Error::msg)?;
        if bytes == 0 || bytes % 512 != 0 {
            bail!("memory device size {bytes} must be a non-zero multiple of 512 bytes");
        }
        return Ok(Arc::new(MemDevice::new(bytes)));
    }
    let path = spec.strip_prefix("file:").unwrap_or(spec);
    let dev = FileDevice::open(path).with_context(|| format!("cannot open device {path}"))?;
    if let Some(w) = dev.warning() {
        log::warn!("{w}");
    }
    Ok(Arc::new(dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_open_or_explain() {
        assert_eq!(open("mem:1M").unwrap().size(), 1 << 20);
        assert!(open("hdd:mem:1M").unwrap().describe().contains("mem"));
        let e = open("/nonexistent/x.img").err().unwrap();
        assert!(format!("{e:#}").contains("/nonexistent/x.img"), "{e:#}");
        assert!(open("mem:1000").is_err());
    }
}
