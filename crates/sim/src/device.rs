//! A device latency model and a latency histogram.
//!
//! Each device has a latency for one random 4 KiB IO, a bandwidth for the
//! bytes past the first 4 KiB of a larger IO, and a sustainable IOPS limit.
//! The simulator turns each block plan into device IOs:
//!
//! | plan | device IOs (foreground) |
//! |---|---|
//! | read hit | fast read |
//! | read miss (not promoted, bypassed) | slow read |
//! | read promote | slow read + fast write (the promotion fill) |
//! | write to backing only | slow write |
//! | write through | slow write + fast write |
//! | write back (dirty) | fast write |
//! | cleaner writeback (background) | fast read + slow write |
//!
//! A run of consecutive blocks of one request with the same plan is one
//! device IO of the run's length. A request's latency is the *sum* of its
//! device IOs' latencies (they are issued one after the other; pessimistic
//! for a request that mixes hits and misses, exact for single-block IOs).
//! Latency of an IO of `b` bytes = `latency_4k + max(0, b - 4096) /
//! bandwidth`.
//!
//! Predicted IOPS at queue depth `qd` = `min(qd / mean latency, per-device
//! limits)`: Little's law with `qd` IOs always in flight and no queueing
//! delay (the simplification: latencies do not grow with load), capped by
//! each device's capacity: a device whose busy time per request is `s`
//! seconds (each IO costing `1 / max_iops + extra bytes / bandwidth`,
//! background writebacks included) cannot serve more than `1 / s` requests
//! per second.

use crate::error::Error;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One device's performance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub name: String,
    /// Latency of one random 4 KiB IO at queue depth 1, in nanoseconds.
    pub latency_4k_ns: u64,
    /// Random 4 KiB IOs per second the device sustains at depth.
    pub max_iops: u64,
    /// Sequential bandwidth in bytes per second.
    pub bandwidth: u64,
}

impl DeviceProfile {
    /// The presets, with where the numbers come from:
    /// - `hdd`: 7200 rpm disk, 8 ms per random 4 KiB IO (about 4 ms average
    ///   seek plus 4.2 ms half a rotation), 400 IOPS with command queueing
    ///   over a short span (the field study measured 938 IOPS from a
    ///   two-disk RAID-1 at depth 16), 150 MB/s.
    /// - `sata-ssd`: 90 us, 90k IOPS (SATA 6 Gb/s parts top out near 100k;
    ///   the study's SSD RAID-10 gave 105k), 500 MB/s.
    /// - `nvme`: 60 us (a NAND NVMe drive's depth-1 4 KiB random read),
    ///   700k IOPS, 3 GB/s.
    /// - `ram`: 1 us (a memory copy plus the software path), 2M IOPS,
    ///   10 GB/s.
    pub fn preset(name: &str) -> Option<DeviceProfile> {
        let (lat, iops, bw) = match name.to_ascii_lowercase().as_str() {
            "hdd" => (8_000_000, 400, 150_000_000),
            "sata-ssd" | "ssd" | "sata" => (90_000, 90_000, 500_000_000),
            "nvme" => (60_000, 700_000, 3_000_000_000),
            "ram" | "memory" => (1_000, 2_000_000, 10_000_000_000),
            _ => return None,
        };
        Some(DeviceProfile {
            name: name.to_ascii_lowercase(),
            latency_4k_ns: lat,
            max_iops: iops,
            bandwidth: bw,
        })
    }

    pub const PRESETS: &'static str = "hdd, sata-ssd, nvme, ram";

    /// Latency of one IO of `bytes` bytes, in ns.
    #[inline]
    pub fn io_latency_ns(&self, bytes: u64) -> u64 {
        let extra = bytes.saturating_sub(4096);
        if extra == 0 {
            self.latency_4k_ns
        } else {
            self.latency_4k_ns
                + (extra as u128 * 1_000_000_000 / self.bandwidth.max(1) as u128) as u64
        }
    }

    /// Busy time one IO of `bytes` takes from the device's capacity, in ns.
    #[inline]
    pub fn busy_ns(&self, bytes: u64) -> u64 {
        let extra = bytes.saturating_sub(4096);
        1_000_000_000 / self.max_iops.max(1)
            + (extra as u128 * 1_000_000_000 / self.bandwidth.max(1) as u128) as u64
    }
}

/// The fast (cache) and slow (backing) devices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceModel {
    pub fast: DeviceProfile,
    pub slow: DeviceProfile,
}

impl Default for DeviceModel {
    /// NVMe in front of a hard disk.
    fn default() -> Self {
        DeviceModel {
            fast: DeviceProfile::preset("nvme").expect("preset"),
            slow: DeviceProfile::preset("hdd").expect("preset"),
        }
    }
}

impl DeviceModel {
    /// Parses `FAST/SLOW` preset names, e.g. `nvme/hdd`.
    pub fn parse(s: &str) -> Result<DeviceModel, Error> {
        let (f, sl) = s.split_once('/').ok_or_else(|| {
            Error::Config(format!(
                "device model '{s}': expected FAST/SLOW such as nvme/hdd"
            ))
        })?;
        let get = |n: &str| {
            DeviceProfile::preset(n.trim()).ok_or_else(|| {
                Error::Config(format!(
                    "device model '{s}': unknown device '{n}' (expected one of: {})",
                    DeviceProfile::PRESETS
                ))
            })
        };
        Ok(DeviceModel {
            fast: get(f)?,
            slow: get(sl)?,
        })
    }
}

impl fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.fast.name, self.slow.name)
    }
}

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS + 1) as usize) << SUB_BITS;

/// A log-linear histogram of nanosecond values: 128 linear sub-buckets per
/// power of two (under 0.8% relative bucket width). Each bucket remembers
/// the smallest value recorded in it, and percentiles report that value,
/// so a bucket that only ever saw one value reports it exactly (the usual
/// case: latencies here are sums of a few model constants).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    mins: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

#[inline]
fn bucket_of(v: u64) -> usize {
    if v < SUB {
        v as usize
    } else {
        let e = 63 - v.leading_zeros();
        let mantissa = v >> (e - SUB_BITS);
        (((e - SUB_BITS + 1) as u64) << SUB_BITS) as usize + (mantissa - SUB) as usize
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        LatencyHistogram {
            counts: vec![0; BUCKETS],
            mins: vec![u64::MAX; BUCKETS],
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        let b = bucket_of(v);
        self.counts[b] += 1;
        if v < self.mins[b] {
            self.mins[b] = v;
        }
        self.total += 1;
        self.sum += v as u128;
        if v > self.max {
            self.max = v;
        }
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the smallest recorded value of the
    /// bucket holding the `ceil(q * n)`-th smallest sample. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return self.mins[i];
            }
        }
        self.max
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for i in 0..BUCKETS {
            self.counts[i] += other.counts[i];
            self.mins[i] = self.mins[i].min(other.mins[i]);
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 40, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last && b < BUCKETS);
            last = b;
        }
        // Relative width under 1%.
        assert_eq!(bucket_of(10_000), bucket_of(10_040));
        assert_ne!(bucket_of(10_000), bucket_of(10_100));
    }

    #[test]
    fn quantiles_are_exact_for_few_distinct_values() {
        let mut h = LatencyHistogram::new();
        for _ in 0..900 {
            h.record(60_000);
        }
        for _ in 0..90 {
            h.record(8_060_000);
        }
        for _ in 0..10 {
            h.record(16_000_000);
        }
        assert_eq!(h.quantile(0.5), 60_000);
        assert_eq!(h.quantile(0.9), 60_000);
        assert_eq!(h.quantile(0.91), 8_060_000);
        assert_eq!(h.quantile(0.99), 8_060_000);
        assert_eq!(h.quantile(0.999), 16_000_000);
        assert_eq!(h.max(), 16_000_000);
        let mean = (900.0 * 60e3 + 90.0 * 8.06e6 + 10.0 * 16e6) / 1000.0;
        assert!((h.mean() - mean).abs() < 1e-6);
    }

    #[test]
    fn presets_and_parse() {
        let m = DeviceModel::parse("nvme/hdd").unwrap();
        assert_eq!(m, DeviceModel::default());
        assert!(DeviceModel::parse("nvme").is_err());
        assert!(DeviceModel::parse("nvme/floppy")
            .unwrap_err()
            .to_string()
            .contains("floppy"));
        let hdd = DeviceProfile::preset("hdd").unwrap();
        assert_eq!(hdd.io_latency_ns(4096), 8_000_000);
        // 1 MiB more at 150 MB/s: about 7 ms more.
        assert_eq!(hdd.io_latency_ns(4096 + (1 << 20)), 8_000_000 + 6_990_506);
    }
}
