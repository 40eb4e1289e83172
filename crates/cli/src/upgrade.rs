//! `tiercache upgrade`: the way from an on-disk format 2 cache to format 3.
//!
//! Format 3 stores more per slot (a volume index and generation with every
//! entry), so a format-2 cache cannot be converted in place. Instead:
//! 1. the format-2 metadata is read (read only, `tiercache_metadata::format2`)
//!    and checked against the backing device (size; fingerprint after a
//!    clean shutdown);
//! 2. every dirty block is copied from its cache slot to the backing
//!    device, then the backing device is flushed;
//! 3. only then is the cache device formatted as version 3 with one
//!    volume, keeping block size, mode and policy (the clean cached
//!    contents are dropped: the backing device has them).
//!
//! A crash during 2 leaves the format-2 cache untouched (run `upgrade`
//! again); during 3, the dirty data is already on the backing device.

use crate::devices;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_metadata::{claim_len, format2, ErrorKind};
use tiercache_policy::PolicyConfig;

#[derive(Args, Debug)]
pub struct UpgradeArgs {
    /// The format-2 cache device to upgrade (re-created as format 3).
    #[arg(long)]
    cache: String,
    /// Its backing device: receives the cache's dirty blocks.
    #[arg(long)]
    backing: String,
}

pub fn run(a: &UpgradeArgs) -> Result<()> {
    devices::ensure_distinct(&a.backing, &a.cache)?;
    let backing = devices::open(&a.backing).context("backing device")?;
    let cache = devices::open(&a.cache).context("cache device")?;
    let old = match format2::read(&*cache) {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::UnsupportedVersion => {
            // Read only: a format-3 cache reads, a newer one does not.
            if tiercache_metadata::check(&*cache).superblock.is_some() {
                println!("{} is already format 3: nothing to do", a.cache);
                return Ok(());
            }
            return Err(e).context("the cache device is not a format-2 cache");
        }
        Err(e) => return Err(e).context("reading the format-2 cache"),
    };
    if backing.size() != old.backing.size {
        bail!(
            "{} has {} bytes, but this cache belongs to a backing device of {} bytes (last seen at \
             '{}'); give its backing device",
            a.backing,
            backing.size(),
            old.backing.size,
            old.backing.path_hint
        );
    }
    if let (true, Some(want)) = (old.clean_shutdown, old.backing.fingerprint) {
        let got = tiercache_metadata::fingerprint(&*backing).context("backing device")?;
        if got != want {
            bail!(
                "{}: its first and last 64 KiB differ from those seen at the cache's last clean \
                 shutdown (fingerprint {got:08x}, expected {want:08x}): not this cache's backing \
                 device",
                a.backing
            );
        }
    }
    let dirty = old.dirty();
    let written = write_back(&*cache, &*backing, &old, &dirty)?;
    let cfg = tiercache_engine::EngineConfig {
        mode: old.mode,
        block_size: old.block_size,
        policy: old.policy.parse::<PolicyConfig>().unwrap_or_default(),
        ..tiercache_engine::EngineConfig::default()
    };
    let engine = tiercache_engine::Engine::create(
        backing,
        cache,
        &cfg,
        Arc::new(tiercache_types::MonotonicClock::new()),
        &a.backing,
        None,
    )
    .context("formatting the cache device as format 3")?;
    println!(
        "upgraded {}: wrote {} dirty blocks ({written} bytes) back to {}, then formatted it as \
         format 3: {} cache blocks of {} bytes, mode {}, one volume",
        a.cache,
        dirty.len(),
        a.backing,
        engine.capacity(),
        engine.block_size(),
        old.mode
    );
    engine.shutdown(false)?;
    Ok(())
}

/// Copies every dirty slot to its block on the backing device (only the
/// bytes that exist for the device's short last block), then flushes the
/// backing device. Returns the bytes written.
fn write_back(
    cache: &dyn BlockDevice,
    backing: &dyn BlockDevice,
    old: &format2::Format2Cache,
    dirty: &[(u32, u64)],
) -> Result<u64> {
    let bs = u64::from(old.block_size);
    let mut buf = AlignedBuf::new(old.block_size as usize);
    let mut written = 0;
    for &(slot, oblock) in dirty {
        let n = claim_len(old.block_size, old.backing.size, oblock);
        cache
            .read_at(&mut buf[..], old.data_offset + u64::from(slot) * bs)
            .with_context(|| format!("reading cache slot {slot}"))?;
        backing
            .write_at(&buf[..n], oblock * bs)
            .with_context(|| format!("writing block {oblock} back to the backing device"))?;
        written += n as u64;
    }
    backing.flush().context("flushing the backing device")?;
    Ok(written)
}
