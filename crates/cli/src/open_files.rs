//! The server's limit on open files (`RLIMIT_NOFILE`). A pool holds a few
//! descriptors per volume (its backing file; over ublk also its device's
//! character device and more: 200 for 64 volumes, measured in the VM
//! lab), and the usual soft limit of 1024 stopped a pool of 1024 volumes
//! at the 1022nd with "Too many open files". So the server raises its
//! soft limit to the hard one when it starts, as long-running servers do
//! (Go's runtime does it for every program), and refuses a pool that even
//! the hard limit cannot hold with a message that says how to proceed,
//! before it opens or writes anything.

use anyhow::{bail, Result};

/// Descriptors a server holds besides its volumes' (sockets, the cache,
/// rings, a few connections), and per volume: over NBD its backing file,
/// over ublk its device's too (3 measured: 200 for 64 volumes).
const BESIDES_VOLUMES: u64 = 64;
const PER_VOLUME_NBD: u64 = 1;
const PER_VOLUME_UBLK: u64 = 3;

/// The process's (soft, hard) limits.
fn limits() -> std::io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; the resource is valid.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

/// Raises the soft limit to the hard one; returns the limit now in force.
fn raise() -> std::io::Result<u64> {
    let (soft, hard) = limits()?;
    if soft >= hard {
        return Ok(soft);
    }
    let r = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct we own; the resource is valid.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        let e = std::io::Error::last_os_error();
        log::debug!("open files: cannot raise the limit from {soft} to {hard}: {e}");
        return Ok(soft);
    }
    log::debug!("open files: limit raised from {soft} to {hard}");
    Ok(hard)
}

/// Raises the limit, then refuses a pool of `volumes` that it cannot hold.
pub fn ensure_room(volumes: usize, ublk: bool) -> Result<()> {
    let limit = raise()?;
    let need = needed(volumes, ublk);
    if need > limit {
        bail!(
            "{volumes} volumes need about {need} open files, but this server may open only \
             {limit} (RLIMIT_NOFILE's hard limit); raise it, e.g. `ulimit -n {need}` as root \
             before starting the server, or LimitNOFILE={need} in its systemd unit"
        );
    }
    Ok(())
}

fn needed(volumes: usize, ublk: bool) -> u64 {
    let each = if ublk {
        PER_VOLUME_UBLK
    } else {
        PER_VOLUME_NBD
    };
    BESIDES_VOLUMES + volumes as u64 * each
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_never_lowers_the_limit() {
        let (soft, _) = limits().unwrap();
        assert!(raise().unwrap() >= soft);
        let (soft_after, hard) = limits().unwrap();
        assert_eq!(soft_after, hard);
    }
}
