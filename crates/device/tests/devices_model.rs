//! Property tests: random read/write/flush/discard sequences against every
//! device type, checked against a plain `Vec<u8>` model; and crash
//! sequences against `CrashDevice`.

use proptest::prelude::*;
use std::sync::Arc;
use tiercache_device::{
    AlignedBuf, BlockDevice, CountingDevice, CrashDevice, DirectIo, EmulatedHdd, FaultDevice,
    FileDevice, HddModel, MemDevice,
};

const SECTOR: u64 = 512;
const SECTORS: u64 = 256;
const SIZE: u64 = SECTORS * SECTOR;

#[derive(Clone, Debug)]
enum Op {
    Write {
        sector: u64,
        sectors: u64,
        fill: u8,
        misaligned: bool,
    },
    Read {
        sector: u64,
        sectors: u64,
        misaligned: bool,
    },
    Flush,
    Discard {
        sector: u64,
        sectors: u64,
    },
}

fn extent() -> impl Strategy<Value = (u64, u64)> {
    (0..SECTORS, 1..=32u64).prop_map(|(s, n)| (s.min(SECTORS - n), n))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (extent(), any::<u8>(), any::<bool>()).prop_map(|((sector, sectors), fill, misaligned)| Op::Write { sector, sectors, fill, misaligned }),
        4 => (extent(), any::<bool>()).prop_map(|((sector, sectors), misaligned)| Op::Read { sector, sectors, misaligned }),
        1 => Just(Op::Flush),
        1 => extent().prop_map(|(sector, sectors)| Op::Discard { sector, sectors }),
    ]
}

/// A buffer of `len` bytes that is 4096-aligned, or deliberately not.
enum Buf {
    Aligned(AlignedBuf),
    Offset(Vec<u8>),
}

impl Buf {
    fn new(len: usize, misaligned: bool) -> Buf {
        if misaligned {
            Buf::Offset(vec![0u8; len + 1])
        } else {
            Buf::Aligned(AlignedBuf::new(len))
        }
    }
    fn get(&mut self) -> &mut [u8] {
        match self {
            Buf::Aligned(b) => b,
            Buf::Offset(v) => &mut v[1..],
        }
    }
}

/// Bytes whose value depends on the write and the position, so a sector
/// landing at the wrong place is caught.
fn pattern(fill: u8, sector: u64, sectors: u64) -> impl Iterator<Item = u8> {
    (0..sectors * SECTOR).map(move |i| fill ^ ((sector * SECTOR + i) % 251) as u8)
}

struct Model {
    data: Vec<u8>,
    /// false after a discard until rewritten: contents unspecified.
    known: Vec<bool>,
}

fn run(dev: &dyn BlockDevice, ops: &[Op]) -> Result<(), TestCaseError> {
    prop_assert_eq!(dev.size(), SIZE);
    let mut m = Model {
        data: vec![0u8; SIZE as usize],
        known: vec![true; SIZE as usize],
    };
    let check = |m: &Model, buf: &[u8], off: u64| -> Result<(), TestCaseError> {
        for (i, &b) in buf.iter().enumerate() {
            let at = off as usize + i;
            if m.known[at] {
                prop_assert_eq!(b, m.data[at], "byte {} on {}", at, dev.describe());
            }
        }
        Ok(())
    };
    for op in ops {
        match *op {
            Op::Write {
                sector,
                sectors,
                fill,
                misaligned,
            } => {
                let len = (sectors * SECTOR) as usize;
                let mut b = Buf::new(len, misaligned);
                for (d, s) in b.get().iter_mut().zip(pattern(fill, sector, sectors)) {
                    *d = s;
                }
                dev.write_at(b.get(), sector * SECTOR).unwrap();
                let at = (sector * SECTOR) as usize;
                m.data[at..at + len].copy_from_slice(b.get());
                m.known[at..at + len].fill(true);
            }
            Op::Read {
                sector,
                sectors,
                misaligned,
            } => {
                let mut b = Buf::new((sectors * SECTOR) as usize, misaligned);
                dev.read_at(b.get(), sector * SECTOR).unwrap();
                check(&m, b.get(), sector * SECTOR)?;
            }
            Op::Flush => dev.flush().unwrap(),
            Op::Discard { sector, sectors } => {
                dev.discard(sector * SECTOR, sectors * SECTOR).unwrap();
                let at = (sector * SECTOR) as usize;
                m.known[at..at + (sectors * SECTOR) as usize].fill(false);
            }
        }
    }
    let mut all = vec![0u8; SIZE as usize];
    dev.read_at(&mut all, 0).unwrap();
    check(&m, &all, 0)
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(64)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mem_device(ops in prop::collection::vec(op(), 1..60)) {
        run(&MemDevice::new(SIZE), &ops)?;
    }

    #[test]
    fn file_device_direct(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::create(dir.path().join("dev"), SIZE).unwrap();
        run(&d, &ops)?;
    }

    #[test]
    fn file_device_buffered(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        FileDevice::create(&p, SIZE).unwrap();
        run(&FileDevice::open_with(&p, DirectIo::Off).unwrap(), &ops)?;
    }

    #[test]
    fn emulated_hdd(ops in prop::collection::vec(op(), 1..60)) {
        let model = HddModel { spindles: 2, stripe_bytes: 4096, ..HddModel::zero_latency() };
        run(&EmulatedHdd::new(MemDevice::new(SIZE), model).unwrap(), &ops)?;
    }

    #[test]
    fn fault_device_without_faults(ops in prop::collection::vec(op(), 1..60)) {
        let d = FaultDevice::new(MemDevice::new(SIZE));
        run(&d, &ops)?;
        prop_assert_eq!(d.injected().total(), 0);
    }

    #[test]
    fn crash_device_without_crash(ops in prop::collection::vec(op(), 1..60)) {
        run(&CrashDevice::new(SIZE), &ops)?;
    }

    #[test]
    fn counting_device(ops in prop::collection::vec(op(), 1..60)) {
        let d = CountingDevice::new(MemDevice::new(SIZE));
        run(&d, &ops)?;
        let c = d.snapshot();
        let writes = ops.iter().filter(|o| matches!(o, Op::Write { .. })).count() as u64;
        prop_assert_eq!(c.writes, writes);
        prop_assert_eq!(c.reads, ops.iter().filter(|o| matches!(o, Op::Read { .. })).count() as u64 + 1);
    }

    #[test]
    fn stacked_decorators(ops in prop::collection::vec(op(), 1..60)) {
        let inner = Arc::new(CrashDevice::new(SIZE));
        let d = CountingDevice::new(FaultDevice::new(
            EmulatedHdd::new(inner, HddModel::zero_latency()).unwrap(),
        ));
        run(&d, &ops)?;
    }
}

#[derive(Clone, Debug)]
enum CrashOp {
    Write {
        sector: u64,
        sectors: u64,
    },
    Discard {
        sector: u64,
        sectors: u64,
    },
    Flush,
    /// `None`: drop every unflushed write; `Some(seed)`: keep a random subset.
    Crash(Option<u64>),
}

fn crash_op() -> impl Strategy<Value = CrashOp> {
    prop_oneof![
        6 => extent().prop_map(|(sector, sectors)| CrashOp::Write { sector, sectors }),
        1 => extent().prop_map(|(sector, sectors)| CrashOp::Discard { sector, sectors }),
        2 => Just(CrashOp::Flush),
        1 => prop::option::of(any::<u64>()).prop_map(CrashOp::Crash),
    ]
}

type SectorData = Vec<u8>;

/// The content written to `sector` by write number `id` (never all zeros).
fn sector_content(id: u32, sector: u64) -> SectorData {
    let mut s = vec![(id % 200) as u8 + 1; SECTOR as usize];
    s[..4].copy_from_slice(&id.to_le_bytes());
    s[4..12].copy_from_slice(&sector.to_le_bytes());
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// After a crash every sector holds what it held at the last flush, or
    /// something written to it since; a crash that keeps nothing restores
    /// exactly the flushed state. The device keeps working afterwards.
    #[test]
    fn crash_device_loses_only_unflushed_writes(ops in prop::collection::vec(crash_op(), 1..80)) {
        let n = 64u64;
        let d = CrashDevice::new(n * SECTOR);
        let mut flushed: Vec<SectorData> = vec![vec![0u8; SECTOR as usize]; n as usize];
        let mut since: Vec<Vec<SectorData>> = vec![Vec::new(); n as usize];
        let mut next_id = 1u32;
        for op in &ops {
            match *op {
                CrashOp::Write { sector, sectors } | CrashOp::Discard { sector, sectors } => {
                    let (sector, sectors) = (sector % n, sectors.min(n - sector % n));
                    let discard = matches!(op, CrashOp::Discard { .. });
                    let mut buf = Vec::new();
                    for s in sector..sector + sectors {
                        let c = if discard { vec![0u8; SECTOR as usize] } else { sector_content(next_id, s) };
                        buf.extend_from_slice(&c);
                        since[s as usize].push(c);
                    }
                    if discard {
                        d.discard(sector * SECTOR, sectors * SECTOR).unwrap();
                    } else {
                        d.write_at(&buf, sector * SECTOR).unwrap();
                        next_id += 1;
                    }
                }
                CrashOp::Flush => {
                    d.flush().unwrap();
                    for (f, s) in flushed.iter_mut().zip(since.iter_mut()) {
                        if let Some(last) = s.pop() {
                            *f = last;
                        }
                        s.clear();
                    }
                }
                CrashOp::Crash(mode) => {
                    let report = match mode {
                        None => d.crash(),
                        Some(seed) => d.crash_keep_random(seed),
                    };
                    let dirty = since.iter().filter(|s| !s.is_empty()).count() as u64;
                    prop_assert_eq!(report.unflushed_sectors, dirty);
                    let mut img = vec![0u8; (n * SECTOR) as usize];
                    d.read_at(&mut img, 0).unwrap();
                    for (i, got) in img.chunks(SECTOR as usize).enumerate() {
                        if mode.is_none() {
                            prop_assert_eq!(got, &flushed[i][..], "sector {} after a full crash", i);
                        } else {
                            prop_assert!(
                                got == &flushed[i][..] || since[i].iter().any(|v| v == got),
                                "sector {} holds data that was neither flushed nor written since", i
                            );
                        }
                        flushed[i] = got.to_vec();
                        since[i].clear();
                    }
                }
            }
            // Reads always see the newest write.
            let mut img = vec![0u8; (n * SECTOR) as usize];
            d.read_at(&mut img, 0).unwrap();
            for (i, got) in img.chunks(SECTOR as usize).enumerate() {
                let want = since[i].last().unwrap_or(&flushed[i]);
                prop_assert_eq!(got, &want[..], "sector {}", i);
            }
        }
    }
}
