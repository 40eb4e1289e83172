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

/// The file or device node a spec names, with the prefixes that wrap it
/// (`hdd:`, `file:`) taken off; `None` for a memory device.
fn spec_path(spec: &str) -> Option<&str> {
    let mut s = spec;
    while let Some(inner) = s.strip_prefix("hdd:") {
        s = inner;
    }
    if s.starts_with("mem:") {
        return None;
    }
    Some(s.strip_prefix("file:").unwrap_or(s))
}

/// Refuses a backing and a cache spec that name one file or one block
/// device (by inode, or by device number for block device nodes, so two
/// paths of one device are caught too): formatting a cache over its own
/// backing device would destroy the data it is meant to cache.
pub fn ensure_distinct(backing: &str, cache: &str) -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let (Some(b), Some(c)) = (spec_path(backing), spec_path(cache)) else {
        return Ok(());
    };
    let (Ok(mb), Ok(mc)) = (std::fs::metadata(b), std::fs::metadata(c)) else {
        return Ok(()); // opening them says what is missing
    };
    let same = if mb.file_type().is_block_device() && mc.file_type().is_block_device() {
        mb.rdev() == mc.rdev()
    } else {
        (mb.dev(), mb.ino()) == (mc.dev(), mc.ino())
    };
    if same {
        bail!(
            "the backing device ({backing}) and the cache device ({cache}) are the same \
             file: a cache needs a device of its own"
        );
    }
    Ok(())
}

/// Bytes checked at each end of a device before formatting it.
const SIGNATURE_SPAN: u64 = 1 << 20;

/// Refuses to format a device that holds data: a cache device about to be
/// formatted must read as zeros in its first and last MiB (a new file, a
/// new or discarded SSD), as `make-bcache` refuses a device with a
/// signature unless told to wipe it. Returns a message naming what was
/// found and how to proceed.
pub fn ensure_blank(dev: &dyn BlockDevice, spec: &str) -> Result<()> {
    let size = dev.size();
    let span = SIGNATURE_SPAN.min(size);
    let mut buf = tiercache_device::AlignedBuf::new(span as usize);
    for at in [0, size - span] {
        dev.read_at(&mut buf, at)
            .with_context(|| format!("reading {spec} at byte {at}"))?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            let what = match tiercache_metadata::check(dev).problems.first() {
                Some(p) if at == 0 && i < 4096 => format!(" ({})", p.message),
                _ => String::new(),
            };
            bail!(
                "{spec} is not blank: byte {} holds data{what}. Formatting it as a cache would \
                 destroy that data. If it is really free, run `tiercache create --force` \
                 (or wipe it first, e.g. `blkdiscard` or `truncate -s 0`)",
                at + i as u64
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blank_devices_may_be_formatted() {
        let dev = MemDevice::new(4 << 20);
        ensure_blank(&dev, "m").unwrap();
        dev.write_at(&[1u8; 512], (4 << 20) - 512).unwrap();
        let e = ensure_blank(&dev, "m").unwrap_err().to_string();
        assert!(e.contains("not blank") && e.contains("--force"), "{e}");
        let small = MemDevice::new(4096);
        ensure_blank(&small, "s").unwrap();
    }

    #[test]
    fn one_file_cannot_be_both_backing_and_cache() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        let b = dir.path().join("b.img");
        let link = dir.path().join("link.img");
        for p in [&a, &b] {
            std::fs::File::create(p).unwrap().set_len(1 << 20).unwrap();
        }
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let (a, b, link) = (a.display(), b.display(), link.display());
        let e = ensure_distinct(&format!("hdd:{a}"), &format!("file:{link}")).unwrap_err();
        assert!(e.to_string().contains("are the same file"), "{e}");
        ensure_distinct(&a.to_string(), &b.to_string()).unwrap();
        ensure_distinct("mem:1M", "mem:1M").unwrap();
    }

    #[test]
    fn specs_open_or_explain() {
        assert_eq!(open("mem:1M").unwrap().size(), 1 << 20);
        assert!(open("hdd:mem:1M").unwrap().describe().contains("mem"));
        let e = open("/nonexistent/x.img").err().unwrap();
        assert!(format!("{e:#}").contains("/nonexistent/x.img"), "{e:#}");
        assert!(open("mem:1000").is_err());
    }
}
