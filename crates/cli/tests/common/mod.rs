//! Shared by the CLI's integration tests: the `tiercache` binary cargo
//! built for them, and the fixtures of crates/testkit (`Served`, tool
//! checks, running tools) at hand.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

pub const MIB: u64 = 1 << 20;

#[allow(unused_imports)] // not every test file uses every fixture
pub use tiercache_testkit::{have, output, run, skip, sparse_file, succeeds, which, Served};

/// The `tiercache` binary under test.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tiercache"))
}

pub fn tiercache() -> Command {
    Command::new(bin())
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `serve` flags that keep the background cleaner from writing anything
/// back while a test looks (no dirty target to reach, never idle enough):
/// dirty blocks stay in the cache until the test says otherwise.
pub const QUIET_CLEANER: [&str; 4] = ["--writeback-target", "1", "--writeback-idle-after", "3600"];
