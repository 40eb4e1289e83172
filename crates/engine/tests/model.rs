//! Model-based tests: random sequences of reads, writes, flushes, trims,
//! mode switches and cleaning through every mode and policy stack, every
//! read checked against a plain in-memory disk.

mod common;

use common::*;
use proptest::prelude::*;
use tiercache_device::BlockDevice;
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind};

const SECTOR: u64 = 512;

#[derive(Clone, Debug)]
enum Op {
    Read {
        sector: u64,
        sectors: u64,
        /// Through `read_if_cached` first (the front ends' hit path).
        quick: bool,
    },
    Write {
        sector: u64,
        sectors: u64,
        seed: u64,
        fua: bool,
    },
    WriteZeroes {
        sector: u64,
        sectors: u64,
    },
    Trim {
        sector: u64,
        sectors: u64,
    },
    Flush,
    SetMode(CacheMode),
    Clean(usize),
    Tick(u64),
}

fn op(total_sectors: u64) -> impl Strategy<Value = Op> {
    let range =
        (0..total_sectors).prop_flat_map(move |s| (Just(s), 1..=(total_sectors - s).min(300)));
    prop_oneof![
        6 => (range.clone(), any::<bool>())
            .prop_map(|((sector, sectors), quick)| Op::Read { sector, sectors, quick }),
        5 => (range.clone(), any::<u64>(), any::<bool>())
            .prop_map(|((sector, sectors), seed, fua)| Op::Write { sector, sectors, seed, fua }),
        1 => range.clone().prop_map(|(sector, sectors)| Op::WriteZeroes { sector, sectors }),
        1 => range.prop_map(|(sector, sectors)| Op::Trim { sector, sectors }),
        1 => Just(Op::Flush),
        1 => prop::sample::select(CacheMode::ALL.to_vec()).prop_map(Op::SetMode),
        1 => (0usize..8).prop_map(Op::Clean),
        1 => (0u64..10_000_000_000).prop_map(Op::Tick),
    ]
}

struct Model {
    data: Vec<u8>,
    /// Sectors whose content is unspecified (trimmed and not rewritten).
    unknown: Vec<bool>,
}

impl Model {
    fn write(&mut self, off: u64, bytes: &[u8]) {
        self.data[off as usize..off as usize + bytes.len()].copy_from_slice(bytes);
        for s in off / SECTOR..(off + bytes.len() as u64) / SECTOR {
            self.unknown[s as usize] = false;
        }
    }
    fn check(&self, off: u64, got: &[u8], what: &str) -> Result<(), TestCaseError> {
        for (i, chunk) in got.chunks(SECTOR as usize).enumerate() {
            let s = off / SECTOR + i as u64;
            if self.unknown[s as usize] {
                continue;
            }
            let want = &self.data[(s * SECTOR) as usize..((s + 1) * SECTOR) as usize];
            prop_assert!(chunk == want, "{what}: sector {s} differs from the model");
        }
        Ok(())
    }
}

/// One engine set-up for a model run.
struct Setup {
    stack: (CacheMode, ReplacementKind, AdmissionKind),
    block_size: u32,
    cache_blocks: u32,
    cutoff: u64,
    total_sectors: u64,
}

fn run(setup: Setup, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let Setup {
        stack: (mode, repl, adm),
        block_size,
        cache_blocks,
        cutoff,
        total_sectors,
    } = setup;
    let cfg = config(mode, repl, adm, block_size, cutoff);
    let r = rig(total_sectors * SECTOR, cache_blocks, &cfg);
    let mut model = Model {
        data: vec![0; (total_sectors * SECTOR) as usize],
        unknown: vec![false; total_sectors as usize],
    };
    for op in ops {
        match op {
            Op::Read {
                sector,
                sectors,
                quick,
            } => {
                let mut buf = vec![0u8; (sectors * SECTOR) as usize];
                let before = r.engine.stats();
                let answered = quick
                    && match r.engine.read_if_cached(sector * SECTOR, &mut buf) {
                        Some(res) => {
                            res.unwrap();
                            let after = r.engine.stats();
                            prop_assert_eq!(
                                after.read_bytes,
                                before.read_bytes + sectors * SECTOR,
                                "a quick read is counted"
                            );
                            prop_assert_eq!(
                                after.decisions.read_misses,
                                before.decisions.read_misses,
                                "a quick read is all hits"
                            );
                            true
                        }
                        None => {
                            let after = r.engine.stats();
                            prop_assert_eq!(
                                (after.read_bytes, after.decisions.read_hits),
                                (before.read_bytes, before.decisions.read_hits),
                                "a declined quick read changes nothing"
                            );
                            false
                        }
                    };
                if !answered {
                    r.engine.read(sector * SECTOR, &mut buf).unwrap();
                }
                model.check(sector * SECTOR, &buf, "read")?;
            }
            Op::Write {
                sector,
                sectors,
                seed,
                fua,
            } => {
                let data = pattern(sector * SECTOR, (sectors * SECTOR) as usize, seed);
                r.engine.write(sector * SECTOR, &data, fua).unwrap();
                model.write(sector * SECTOR, &data);
            }
            Op::WriteZeroes { sector, sectors } => {
                r.engine
                    .write_zeroes(sector * SECTOR, sectors * SECTOR, false)
                    .unwrap();
                model.write(sector * SECTOR, &vec![0u8; (sectors * SECTOR) as usize]);
            }
            Op::Trim { sector, sectors } => {
                r.engine.trim(sector * SECTOR, sectors * SECTOR).unwrap();
                for s in sector..sector + sectors {
                    model.unknown[s as usize] = true;
                }
            }
            Op::Flush => r.engine.flush().unwrap(),
            Op::SetMode(m) => r.engine.set_mode(m).unwrap(),
            Op::Clean(n) => {
                r.engine.clean(n).unwrap();
            }
            Op::Tick(ns) => r.clock.advance(ns),
        }
        let s = r.engine.stats();
        prop_assert!(s.decisions.resident <= s.decisions.capacity);
        prop_assert!(s.decisions.dirty <= s.decisions.resident);
    }
    // Everything reads back, then after draining the backing device alone
    // holds the data: detaching leaves it whole.
    let mut all = vec![0u8; (total_sectors * SECTOR) as usize];
    r.engine.read(0, &mut all).unwrap();
    model.check(0, &all, "final read")?;
    r.engine.drain(|_, _| {}).unwrap();
    prop_assert_eq!(r.engine.dirty_blocks(), 0);
    r.backing.read_at(&mut all, 0).unwrap();
    model.check(0, &all, "backing after drain")?;
    Ok(())
}

fn stack() -> impl Strategy<Value = (CacheMode, ReplacementKind, AdmissionKind)> {
    prop::sample::select(all_stacks())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Small caches (1-12 blocks) over a device whose size is not a multiple
    /// of the block size, so the last block is partial.
    #[test]
    fn engine_matches_model(
        (mode, repl, adm) in stack(),
        block_size in prop::sample::select(vec![4096u32, 8192, 65536]),
        cache_blocks in 1u32..12,
        cutoff in prop::sample::select(vec![0u64, 16384]),
        extra_sectors in 0u64..8,
        ops in proptest::collection::vec(op(2048 + 7), 1..120),
    ) {
        let total = 2048 + extra_sectors.min(7);
        let ops: Vec<Op> = ops.into_iter().map(|o| clamp(o, total)).collect();
        run(Setup { stack: (mode, repl, adm), block_size, cache_blocks, cutoff, total_sectors: total }, ops)?;
    }
}

/// Keeps an op inside a device of `total` sectors.
fn clamp(op: Op, total: u64) -> Op {
    let fit = |sector: u64, sectors: u64| {
        let sector = sector.min(total - 1);
        (sector, sectors.min(total - sector).max(1))
    };
    match op {
        Op::Read {
            sector,
            sectors,
            quick,
        } => {
            let (sector, sectors) = fit(sector, sectors);
            Op::Read {
                sector,
                sectors,
                quick,
            }
        }
        Op::Write {
            sector,
            sectors,
            seed,
            fua,
        } => {
            let (sector, sectors) = fit(sector, sectors);
            Op::Write {
                sector,
                sectors,
                seed,
                fua,
            }
        }
        Op::WriteZeroes { sector, sectors } => {
            let (sector, sectors) = fit(sector, sectors);
            Op::WriteZeroes { sector, sectors }
        }
        Op::Trim { sector, sectors } => {
            let (sector, sectors) = fit(sector, sectors);
            Op::Trim { sector, sectors }
        }
        other => other,
    }
}

#[test]
fn every_stack_survives_a_fixed_mixed_workload() {
    for (mode, repl, adm) in all_stacks() {
        let total = 4096u64;
        let mut ops = Vec::new();
        let mut x = 12345u64;
        for i in 0..400u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let sector = (x >> 33) % (total - 64);
            let sectors = 1 + (x >> 20) % 64;
            ops.push(match i % 5 {
                0 | 1 => Op::Read {
                    sector,
                    sectors,
                    quick: i % 10 == 0,
                },
                2 | 3 => Op::Write {
                    sector,
                    sectors,
                    seed: x,
                    fua: i % 7 == 0,
                },
                _ => Op::Clean(2),
            });
        }
        let setup = Setup {
            stack: (mode, repl, adm),
            block_size: 8192,
            cache_blocks: 16,
            cutoff: 0,
            total_sectors: total,
        };
        run(setup, ops).unwrap_or_else(|e| panic!("{mode} {repl} {adm}: {e}"));
    }
}

#[test]
fn out_of_range_and_misaligned_requests_fail_cleanly() {
    let cfg = config(
        CacheMode::WriteBack,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        4096,
        0,
    );
    let r = rig(1 << 20, 8, &cfg);
    let mut buf = vec![0u8; 4096];
    assert!(matches!(
        r.engine.read(1 << 20, &mut buf),
        Err(tiercache_engine::EngineError::OutOfRange { .. })
    ));
    assert!(matches!(
        r.engine.write((1 << 20) - 512, &buf, false),
        Err(tiercache_engine::EngineError::OutOfRange { .. })
    ));
    assert!(matches!(
        r.engine.read(100, &mut buf),
        Err(tiercache_engine::EngineError::Misaligned { .. })
    ));
    assert!(matches!(
        r.engine.write(0, &buf[..100], false),
        Err(tiercache_engine::EngineError::Misaligned { .. })
    ));
    assert!(r.engine.read(u64::MAX - 511, &mut buf[..512]).is_err());
    assert_eq!(
        r.engine.stats().decisions.read_ios,
        0,
        "rejected IOs are not counted"
    );
    r.engine.read(0, &mut buf[..0]).unwrap();
}

#[test]
fn writeback_holds_data_until_cleaned_and_drain_writes_it_back() {
    let cfg = config(
        CacheMode::WriteBack,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        4096,
        0,
    );
    let r = rig(1 << 20, 64, &cfg);
    let data = pattern(0, 16384, 7);
    r.engine.write(0, &data, false).unwrap();
    assert_eq!(r.engine.dirty_blocks(), 4);
    let mut back = vec![0u8; 16384];
    r.backing.read_at(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "writeback must not touch the backing device yet"
    );
    let mut calls = Vec::new();
    r.engine
        .drain(|done, total| calls.push((done, total)))
        .unwrap();
    assert_eq!(calls.last(), Some(&(4, 4)));
    r.backing.read_at(&mut back, 0).unwrap();
    assert_eq!(back, data);
    let s = r.engine.stats();
    assert_eq!(s.decisions.writebacks, 4);
    assert_eq!(s.writeback_bytes, 16384);
}

#[test]
fn hits_are_served_from_the_cache_device() {
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        4096,
        0,
    );
    let r = rig(1 << 20, 64, &cfg);
    let data = pattern(8192, 4096, 1);
    r.backing.write_at(&data, 8192).unwrap();
    let mut buf = vec![0u8; 4096];
    r.engine.read(8192, &mut buf).unwrap();
    assert_eq!(buf, data);
    // Corrupt the backing copy behind the engine's back: a hit must not see it.
    r.backing.write_at(&[0xAA; 4096], 8192).unwrap();
    r.engine.read(8192, &mut buf).unwrap();
    assert_eq!(buf, data);
    let s = r.engine.stats();
    assert_eq!(
        (
            s.decisions.read_hits,
            s.decisions.read_misses,
            s.decisions.promotions
        ),
        (1, 1, 1)
    );
    assert_eq!(s.read_hit_bytes, 4096);
}

#[test]
fn sequential_stream_bypasses_the_cache() {
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        4096,
        1 << 20,
    );
    let r = rig(16 << 20, 4096, &cfg);
    let mut buf = vec![0u8; 128 * 1024];
    for i in 0..64u64 {
        r.engine.read(i * 131072, &mut buf).unwrap();
    }
    let s = r.engine.stats();
    assert_eq!(
        s.decisions.promotions, 256,
        "only the first 1 MiB is cached"
    );
    assert_eq!(s.decisions.bypassed_ios, 56);
    assert_eq!(s.decisions.bypassed_bytes, 56 * 131072);
}
