//! Fault injection: a decorator that fails chosen IOs with EIO.
//!
//! Rules can be changed at any time from any thread (share the device as
//! `Arc<FaultDevice<D>>`), so a test can break a device under a running
//! engine and heal it again.

use crate::BlockDevice;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Which kind of call a [`FaultRule`] applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Discard,
    /// Every kind of call.
    All,
}

impl FaultOp {
    fn covers(self, op: FaultOp) -> bool {
        self == FaultOp::All || self == op
    }

    fn name(self) -> &'static str {
        match self {
            FaultOp::Read => "read",
            FaultOp::Write => "write",
            FaultOp::Flush => "flush",
            FaultOp::Discard => "discard",
            FaultOp::All => "any",
        }
    }
}

/// One fault rule: calls of kind `op` that touch `range` fail with
/// probability `probability`.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    pub op: FaultOp,
    /// Byte range of the device; a read, write or discard matches when it
    /// overlaps the range. `None` matches everywhere. Flushes have no range
    /// and match only rules whose range is `None`.
    pub range: Option<Range<u64>>,
    /// Chance in `[0, 1]` that a matching call fails; 1.0 fails every one.
    pub probability: f64,
}

impl FaultRule {
    /// Every `op` call that overlaps `range` fails.
    pub fn range(op: FaultOp, range: Range<u64>) -> FaultRule {
        FaultRule {
            op,
            range: Some(range),
            probability: 1.0,
        }
    }

    /// Each `op` call fails with probability `probability`, anywhere.
    pub fn rate(op: FaultOp, probability: f64) -> FaultRule {
        FaultRule {
            op,
            range: None,
            probability,
        }
    }

    /// Every `op` call fails.
    pub fn always(op: FaultOp) -> FaultRule {
        FaultRule::rate(op, 1.0)
    }

    fn matches(&self, op: FaultOp, offset: u64, len: u64) -> bool {
        if !self.op.covers(op) {
            return false;
        }
        match (&self.range, op) {
            (None, _) => true,
            (Some(_), FaultOp::Flush) => false,
            // An empty IO overlaps nothing.
            (Some(r), _) => len > 0 && offset < r.end && r.start < offset + len,
        }
    }
}

/// Counts of injected faults per kind of call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.reads + self.writes + self.flushes + self.discards
    }
}

struct Rules {
    rules: Vec<FaultRule>,
    rng: StdRng,
}

/// Passes calls to the inner device unless a rule says to fail them.
///
/// A failed call does not reach the inner device, so an injected write
/// failure leaves the old data in place. Injected errors are
/// `io::Error::from_raw_os_error(EIO)` (so `raw_os_error() == Some(EIO)`,
/// which is what the NBD layer maps to an error code); `std::io::Error`
/// cannot carry a custom message as well, so [`FaultDevice::last_fault`]
/// describes the most recent injected fault.
pub struct FaultDevice<D> {
    inner: D,
    rules: Mutex<Rules>,
    last: Mutex<Option<String>>,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wraps `inner` with no rules (no faults) and a random-rule seed of 0.
    pub fn new(inner: D) -> Self {
        FaultDevice::with_seed(inner, 0)
    }

    /// Wraps `inner` with no rules; probabilistic rules draw from an RNG
    /// seeded with `seed`, so a single-threaded sequence of calls fails the
    /// same calls every run.
    pub fn with_seed(inner: D, seed: u64) -> Self {
        FaultDevice {
            inner,
            rules: Mutex::new(Rules {
                rules: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
            }),
            last: Mutex::new(None),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            discards: AtomicU64::new(0),
        }
    }

    /// The inner device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Replaces all rules. Calls that start after this returns see the new
    /// rules. Panics if a probability is outside `[0, 1]` or NaN.
    pub fn set_rules(&self, rules: Vec<FaultRule>) {
        for r in &rules {
            assert!(
                (0.0..=1.0).contains(&r.probability),
                "fault probability {} is not in [0, 1]",
                r.probability
            );
        }
        self.rules.lock().rules = rules;
    }

    /// Adds one rule to the current ones.
    pub fn add_rule(&self, rule: FaultRule) {
        let mut all = self.rules.lock().rules.clone();
        all.push(rule);
        self.set_rules(all);
    }

    /// Reseeds the RNG used by probabilistic rules.
    pub fn reseed(&self, seed: u64) {
        self.rules.lock().rng = StdRng::seed_from_u64(seed);
    }

    /// Makes every call fail, as a dead device would.
    pub fn fail_all(&self) {
        self.set_rules(vec![FaultRule::always(FaultOp::All)]);
    }

    /// Removes every rule: no call fails from now on.
    pub fn heal(&self) {
        self.set_rules(Vec::new());
    }

    /// The current rules.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.rules.lock().rules.clone()
    }

    /// How many faults were injected so far, per kind of call.
    pub fn injected(&self) -> FaultCounts {
        FaultCounts {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            discards: self.discards.load(Relaxed),
        }
    }

    /// A description of the most recent injected fault, if any.
    pub fn last_fault(&self) -> Option<String> {
        self.last.lock().clone()
    }

    /// Returns `Err(EIO)` when a rule fails this call.
    fn check(&self, op: FaultOp, offset: u64, len: u64) -> io::Result<()> {
        let fail = {
            let mut g = self.rules.lock();
            let Rules { rules, rng } = &mut *g;
            rules.iter().any(|r| {
                r.matches(op, offset, len)
                    && (r.probability >= 1.0
                        || (r.probability > 0.0 && rng.gen_bool(r.probability)))
            })
        };
        if !fail {
            return Ok(());
        }
        let counter = match op {
            FaultOp::Read => &self.reads,
            FaultOp::Write => &self.writes,
            FaultOp::Flush => &self.flushes,
            _ => &self.discards,
        };
        counter.fetch_add(1, Relaxed);
        let what = if op == FaultOp::Flush {
            format!("injected EIO: flush of {}", self.inner.describe())
        } else {
            format!(
                "injected EIO: {} of {len} bytes at offset {offset} of {}",
                op.name(),
                self.inner.describe()
            )
        };
        *self.last.lock() = Some(what);
        Err(io::Error::from_raw_os_error(libc::EIO))
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(FaultOp::Read, offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(FaultOp::Write, offset, buf.len() as u64)?;
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.check(FaultOp::Flush, 0, 0)?;
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(FaultOp::Discard, offset, len)?;
        self.inner.discard(offset, len)
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;
    use std::sync::Arc;

    fn is_eio(r: io::Result<()>) -> bool {
        matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
    }

    #[test]
    fn range_rules_hit_only_overlapping_ios() {
        let d = FaultDevice::new(MemDevice::new(1 << 16));
        d.set_rules(vec![FaultRule::range(FaultOp::Read, 8192..12288)]);
        let mut b = vec![0u8; 4096];
        assert!(d.read_at(&mut b, 4096).is_ok());
        assert!(d.read_at(&mut b, 12288).is_ok());
        assert!(is_eio(d.read_at(&mut b, 8192)));
        assert!(is_eio(d.read_at(&mut b[..512], 11776)));
        // The range also catches a larger read that covers it.
        let mut big = vec![0u8; 16384];
        assert!(is_eio(d.read_at(&mut big, 0)));
        // Writes and flushes are not affected by a read rule.
        assert!(d.write_at(&b, 8192).is_ok());
        assert!(d.flush().is_ok());
        assert_eq!(
            d.injected(),
            FaultCounts {
                reads: 3,
                ..Default::default()
            }
        );
        assert!(d
            .last_fault()
            .unwrap()
            .contains("read of 16384 bytes at offset 0"));
    }

    #[test]
    fn failed_writes_do_not_reach_the_device() {
        let d = FaultDevice::new(MemDevice::new(1 << 16));
        d.set_rules(vec![FaultRule::range(FaultOp::Write, 0..512)]);
        assert!(is_eio(d.write_at(&[7u8; 1024], 0)));
        let mut b = vec![1u8; 1024];
        d.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(d.injected().writes, 1);
    }

    #[test]
    fn rate_rules_are_deterministic_per_seed() {
        let run = |seed| {
            let d = FaultDevice::with_seed(MemDevice::new(1 << 16), seed);
            d.set_rules(vec![FaultRule::rate(FaultOp::All, 0.3)]);
            let mut b = vec![0u8; 512];
            (0..200)
                .map(|i| d.read_at(&mut b, (i % 64) * 512).is_err())
                .collect::<Vec<bool>>()
        };
        let a = run(42);
        assert_eq!(a, run(42));
        assert_ne!(a, run(43));
        let fails = a.iter().filter(|&&f| f).count();
        assert!(
            (30..=90).contains(&fails),
            "{fails} of 200 failed at rate 0.3"
        );
    }

    #[test]
    fn fail_all_and_heal_from_another_thread() {
        let d = Arc::new(FaultDevice::new(MemDevice::new(1 << 16)));
        let d2 = d.clone();
        std::thread::spawn(move || d2.fail_all()).join().unwrap();
        let mut b = vec![0u8; 512];
        assert!(is_eio(d.read_at(&mut b, 0)));
        assert!(is_eio(d.write_at(&b, 0)));
        assert!(is_eio(d.flush()));
        assert!(is_eio(d.discard(0, 512)));
        assert_eq!(d.injected().total(), 4);
        let d2 = d.clone();
        std::thread::spawn(move || d2.heal()).join().unwrap();
        assert!(d.read_at(&mut b, 0).is_ok());
        assert!(d.flush().is_ok());
        assert_eq!(d.injected().total(), 4);
    }

    #[test]
    fn flush_rules() {
        let d = FaultDevice::new(MemDevice::new(1 << 16));
        // A ranged rule never matches a flush.
        d.set_rules(vec![FaultRule::range(FaultOp::All, 0..512)]);
        assert!(d.flush().is_ok());
        d.set_rules(vec![FaultRule::always(FaultOp::Flush)]);
        assert!(is_eio(d.flush()));
        assert!(d.write_at(&[0u8; 512], 0).is_ok());
        assert_eq!(d.injected().flushes, 1);
    }

    #[test]
    #[should_panic(expected = "not in [0, 1]")]
    fn bad_probability_panics() {
        let d = FaultDevice::new(MemDevice::new(4096));
        d.set_rules(vec![FaultRule::rate(FaultOp::Read, 1.5)]);
    }
}
