//! Device files for a run: written, sparse, or blank, and file-name slugs.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Lower-case, dashes: a file-name-safe form of a label.
pub(crate) fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// Creates `path` with `size` bytes of non-zero data, so reads hit real
/// extents (a sparse file's holes read without touching the disk, which
/// would flatter the fast-device baseline).
pub(crate) fn write_file(path: &Path, size: u64) -> Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() == size)
        .unwrap_or(false)
    {
        return Ok(()); // Left by an earlier run with --keep-files.
    }
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
        buf.rotate_left(1);
    }
    f.sync_all()?;
    Ok(())
}

/// Makes `path` a blank cache device of `size` bytes: every byte written
/// once (a real device has no holes, and writing into a sparse file's
/// holes would make the first promotions pay for the filesystem's block
/// allocation), then, on every call, its first and last MiB zeroed, where
/// tiercache keeps its superblock and metadata (as `wipefs` would), so
/// `tiercache serve --create` sees a blank device and formats it.
pub(crate) fn blank_device_file(path: &Path, size: u64) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    const SPAN: u64 = 1 << 20;
    let zeros = vec![0u8; SPAN as usize];
    let fresh = std::fs::metadata(path)
        .map(|m| m.len() != size)
        .unwrap_or(true);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(fresh)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    if fresh {
        let mut left = size;
        while left > 0 {
            let n = left.min(SPAN) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
    } else {
        let span = SPAN.min(size);
        for at in [0, size - span] {
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&zeros[..span as usize])?;
        }
    }
    f.sync_all()?;
    Ok(())
}

/// Creates `path` as a sparse file of `size` bytes. Used for the backing
/// device (its latency comes from the HDD model; the file's own is
/// negligible) and for cache devices (promotions write them).
pub(crate) fn sparse_file(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    Ok(())
}
