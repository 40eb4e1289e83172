//! The block layer's IO scheduler in front of a device a front end makes
//! (`/dev/ublkbN`, or `/dev/nbdN` when the server configures the kernel's
//! NBD client itself).
//!
//! Linux gives a device with one hardware queue `mq-deadline` by default;
//! tiercache serves one ublk queue by default, and the kernel's NBD client
//! always has one. In front of a cache that scheduler only costs: it sorts
//! and holds requests that tiercache answers from the cache device or
//! sends on to the backing device, each of which has its own queue and
//! scheduler below. bcache's and device-mapper's devices have no scheduler
//! at all. So the server sets `none` on the devices it makes; a user who
//! wants another can write it to `/sys/block/NAME/queue/scheduler`
//! afterwards, as for any disk.
//!
//! Measured in the VM lab (docs/BENCHMARKS.md, "Where a hit's time goes
//! over ublk"): over ublk 8-15% more IOPS with the data fitting the cache,
//! over the kernel's NBD client 2.5-8%, the settings alternating by round
//! in one boot.

use std::path::PathBuf;

/// Sets the scheduler of block device `name` (`ublkb0`, `nbd0`) to
/// `none`. Ok(Some(old)) when it changed from `old`, Ok(None) when it was
/// `none` already, the device offers no choice or does not exist.
pub fn use_no_scheduler(name: &str) -> std::io::Result<Option<String>> {
    let path = PathBuf::from(format!("/sys/block/{name}/queue/scheduler"));
    let now = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match selected(&now) {
        Some(old) if old != "none" && offers_none(&now) => {
            std::fs::write(&path, "none")?;
            Ok(Some(old.to_string()))
        }
        _ => Ok(None),
    }
}

/// [`use_no_scheduler`] for a front end starting `/dev/{name}`: logs a
/// change, and a failure as a warning (the device works either way).
pub fn prefer_no_scheduler(name: &str) {
    match use_no_scheduler(name) {
        Ok(Some(old)) => log::info!(
            "/dev/{name}: IO scheduler none (was {old}): the cache and backing devices \
             schedule their own IO"
        ),
        Ok(None) => {}
        Err(e) => log::warn!("/dev/{name}: IO scheduler left as it is (setting none: {e})"),
    }
}

/// The bracketed entry of a `queue/scheduler` file ("none [mq-deadline]").
fn selected(list: &str) -> Option<&str> {
    list.split_whitespace()
        .find_map(|s| s.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
}

/// Whether `none` is among the choices.
fn offers_none(list: &str) -> bool {
    list.split_whitespace()
        .any(|s| s.trim_start_matches('[').trim_end_matches(']') == "none")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_selected_scheduler() {
        assert_eq!(selected("none [mq-deadline] kyber\n"), Some("mq-deadline"));
        assert_eq!(selected("[none] mq-deadline\n"), Some("none"));
        assert_eq!(selected("none\n"), None);
        assert!(offers_none("[mq-deadline] none\n"));
        assert!(!offers_none("[mq-deadline] kyber\n"));
    }

    #[test]
    fn a_device_that_does_not_exist_is_left_alone() {
        assert_eq!(use_no_scheduler("ublkb4294967295").unwrap(), None);
    }
}
