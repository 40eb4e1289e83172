//! The shared vocabulary of tiercache.
//!
//! Every other crate depends on this one and on nothing above it. It holds
//! newtypes for the address spaces (so that an origin block can never be
//! passed where a cache block is expected), the clock abstraction (time is an
//! input, never read from the OS inside a policy), and the small enums that
//! name modes and policies on the command line, in config files and on disk.

#![warn(missing_docs)]

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The unit of addressing on the wire and on devices: 512 bytes.
pub const SECTOR_SIZE: u64 = 512;

/// Smallest supported cache block size, in bytes.
pub const MIN_BLOCK_SIZE: u32 = 4096;
/// Largest supported cache block size, in bytes.
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;

/// Index of a block on the backing ("origin") device, in units of the cache
/// block size.
///
/// In a pool (one cache for many backing volumes) the key of a cached block
/// is its volume and its block together, [`OriginBlock::of`]: the volume in
/// the top 16 bits, the block in the low 48. A pool of one is volume 0, so
/// there the key is the block number itself. The policies only compare and
/// hash keys; two volumes' blocks are different keys by construction, which
/// is what keeps one volume's data from ever being served to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OriginBlock(pub u64);

/// A volume of a pool: the index of its record in the cache's volume table.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct VolumeId(pub u16);

impl VolumeId {
    /// The volume table index as a `usize`, for indexing per-volume arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Blocks per volume the pool key can address: 2^48 (1 EiB of 4 KiB blocks).
pub const MAX_VOLUME_BLOCKS: u64 = 1 << OriginBlock::VOLUME_SHIFT;

impl OriginBlock {
    /// Bit position of the volume in a pool key.
    pub const VOLUME_SHIFT: u32 = 48;

    /// The pool key of `block` of `volume`. `block` must be below
    /// [`MAX_VOLUME_BLOCKS`] (checked in debug builds; volumes are refused
    /// at attach when larger).
    pub fn of(volume: VolumeId, block: u64) -> OriginBlock {
        debug_assert!(block < MAX_VOLUME_BLOCKS, "block {block} past 2^48");
        OriginBlock(((volume.0 as u64) << Self::VOLUME_SHIFT) | block)
    }

    /// The volume of a pool key.
    pub fn volume(self) -> VolumeId {
        VolumeId((self.0 >> Self::VOLUME_SHIFT) as u16)
    }

    /// The block number within its volume.
    pub fn block(self) -> u64 {
        self.0 & (MAX_VOLUME_BLOCKS - 1)
    }
}

/// Index of a block (a "slot") on the cache device, in units of the cache
/// block size. 32 bits: 2^32 slots of 4 KiB is 16 TiB of cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CacheBlock(pub u32);

impl CacheBlock {
    /// The slot number as a `usize`, for indexing per-slot arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for OriginBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "o{}", self.0)
    }
}

impl fmt::Display for CacheBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A point in time in nanoseconds since an arbitrary epoch.
///
/// Policies take `Time` as an argument and never read a clock themselves, so
/// the simulator can drive them with a virtual clock and tests are
/// deterministic.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Time(pub u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);

    /// `secs` seconds after the epoch (truncated to whole nanoseconds).
    pub fn from_secs_f64(secs: f64) -> Time {
        Time((secs * 1e9) as u64)
    }
    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// Nanoseconds from `other` to `self`, 0 when `other` is later.
    pub fn saturating_sub(self, other: Time) -> u64 {
        self.0.saturating_sub(other.0)
    }
    /// `nanos` nanoseconds later (saturating at the end of time).
    pub fn add_nanos(self, nanos: u64) -> Time {
        Time(self.0.saturating_add(nanos))
    }
}

/// A source of time. The live engine uses [`MonotonicClock`]; tests and the
/// simulator use [`ManualClock`].
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Time;
}

/// Real monotonic time since the clock was created.
#[derive(Debug)]
pub struct MonotonicClock {
    start: std::time::Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        MonotonicClock {
            start: std::time::Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Time {
        Time(self.start.elapsed().as_nanos() as u64)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: std::sync::atomic::AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Time) -> Self {
        ManualClock {
            nanos: std::sync::atomic::AtomicU64::new(start.0),
        }
    }
    /// Moves the clock to `t` (earlier or later).
    pub fn set(&self, t: Time) {
        self.nanos.store(t.0, std::sync::atomic::Ordering::SeqCst);
    }
    /// Moves the clock `nanos` nanoseconds forward.
    pub fn advance(&self, nanos: u64) {
        self.nanos
            .fetch_add(nanos, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Time {
        Time(self.nanos.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// Whether an access reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// A read.
    Read,
    /// A write.
    Write,
}

/// Error returned when a name on the command line or in a file is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{given}' (expected one of: {expected})")]
pub struct ParseNameError {
    /// What was being named, e.g. "cache mode".
    pub what: &'static str,
    /// The name given.
    pub given: String,
    /// The names accepted, comma-separated.
    pub expected: &'static str,
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal, { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name used on the command line, in config files and in stats.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseNameError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.to_ascii_lowercase().as_str() {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParseNameError {
                        what: $what,
                        given: s.to_string(),
                        expected: concat!($($text, " "),+),
                    }),
                }
            }
        }
    };
}

named_enum!(
    /// How writes are handled. See docs/ARCHITECTURE.md for the exact rules.
    CacheMode, "cache mode", {
    /// Writes go to the backing device and, if the block is cached, to the
    /// cache too. Losing the cache device loses nothing. The default.
    WriteThrough = "writethrough",
    /// Writes go to the cache device only and are written back later.
    WriteBack = "writeback",
    /// Writes go to the backing device; cached copies are updated, misses are
    /// not allocated. Reads promote as usual.
    WriteAround = "writearound",
    /// Everything goes to the backing device; the cache is neither read nor
    /// filled (dirty blocks are still served from the cache until cleaned).
    PassThrough = "passthrough",
});

#[allow(clippy::derivable_impls)] // the enum is declared by a macro
impl Default for CacheMode {
    fn default() -> Self {
        CacheMode::WriteThrough
    }
}

named_enum!(
    /// Replacement policy: which cached block leaves when room is needed.
    ReplacementKind, "replacement policy", {
    /// Multiqueue in the spirit of dm-cache's smq; new entries enter at the top.
    Smq = "smq",
    /// Least recently used.
    Lru = "lru",
    /// S3-FIFO (Yang et al., SOSP 2023).
    S3Fifo = "s3fifo",
    /// Adaptive replacement cache (Megiddo and Modha, FAST 2003).
    Arc = "arc",
    /// First in, first out (hits change nothing).
    Fifo = "fifo",
    /// SIEVE (Zhang et al., NSDI 2024): FIFO with a visited bit and a hand.
    Sieve = "sieve",
    /// S3-FIFO whose small-FIFO share miniature simulations of the live
    /// request stream choose (crates/policy/src/adaptive.rs).
    Adaptive = "adaptive",
});

named_enum!(
    /// Admission policy: which missed block may enter the cache at all.
    AdmissionKind, "admission policy", {
    /// Promote every miss.
    Always = "always",
    /// Promote a block after it missed `n` times (Open CAS's nhit).
    NHit = "nhit",
    /// Promote a block whose region is hotter than what it would displace
    /// (dm-cache smq's hotspot queue).
    Hotspot = "hotspot",
});

/// Round `x` down to a multiple of `align` (a power of two).
pub fn align_down(x: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    x & !(align - 1)
}

/// Round `x` up to a multiple of `align` (a power of two).
pub fn align_up(x: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    (x + align - 1) & !(align - 1)
}

/// A size in binary units, the one way sizes are printed: `512 B`,
/// `4 KiB`, `1.5 GiB`, `1.25 MiB` (two decimals below 10, one above).
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if (v - v.round()).abs() < 0.005 {
        format!("{} {}", v.round(), UNITS[u])
    } else if v < 10.0 {
        format!("{v:.2} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Parse a size such as `4096`, `4k`, `64KiB`, `10G`, `1.5GiB` into bytes.
/// Suffixes are binary (k = 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!(
            "invalid size '{s}': expected a number with an optional unit such as 4k, 64KiB, 10G"
        )
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "s" | "sector" | "sectors" => SECTOR_SIZE,
        other => return Err(format!("invalid size '{s}': unknown unit '{other}'")),
    };
    Ok((value * mult as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_keep_volume_and_block_apart() {
        for (v, b) in [
            (0u16, 0u64),
            (0, 77),
            (1, 0),
            (7, MAX_VOLUME_BLOCKS - 1),
            (u16::MAX, 5),
        ] {
            let k = OriginBlock::of(VolumeId(v), b);
            assert_eq!((k.volume(), k.block()), (VolumeId(v), b));
        }
        // A pool of one: the key is the block number.
        assert_eq!(OriginBlock::of(VolumeId(0), 123), OriginBlock(123));
        // The same block of two volumes: two keys.
        assert_ne!(
            OriginBlock::of(VolumeId(1), 9),
            OriginBlock::of(VolumeId(2), 9)
        );
    }

    #[test]
    fn names_round_trip() {
        for m in CacheMode::ALL {
            assert_eq!(m.as_str().parse::<CacheMode>().unwrap(), *m);
        }
        for p in ReplacementKind::ALL {
            assert_eq!(p.as_str().parse::<ReplacementKind>().unwrap(), *p);
        }
        let err = "wb".parse::<CacheMode>().unwrap_err();
        assert!(err.to_string().contains("writeback"), "{err}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("8s").unwrap(), 4096);
        assert!(parse_size("ten").is_err());
        assert!(parse_size("4x").is_err());
    }

    #[test]
    fn alignment() {
        assert_eq!(align_down(4097, 4096), 4096);
        assert_eq!(align_up(4097, 4096), 8192);
        assert_eq!(align_up(0, 4096), 0);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Time(5));
        assert_eq!(c.now(), Time(5));
        c.advance(10);
        assert_eq!(c.now(), Time(15));
    }
}
