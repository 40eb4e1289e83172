//! The request recorder (`tiercache trace`): what it records, and that a
//! full queue (a reader that stalled) drops and counts requests without
//! ever holding an IO up.

mod common;

use common::*;
use std::sync::Arc;
use tiercache_device::MemDevice;
use tiercache_engine::{Engine, TraceStats, TracedOp, TracedRequest};
use tiercache_types::{AdmissionKind, CacheMode, ReplacementKind, VolumeId};

const BS: u32 = 4096;

/// An engine with volume 0 ("default") and volume 1 ("vm1").
fn two_volumes() -> Arc<Engine> {
    let cfg = config(
        CacheMode::WriteThrough,
        ReplacementKind::Lru,
        AdmissionKind::Always,
        BS,
        0,
    );
    let engine = Arc::new(rig(256 * BS as u64, 32, &cfg).engine);
    engine
        .attach_volume(
            "vm1",
            "",
            Arc::new(MemDevice::new(256 * BS as u64)),
            CacheMode::WriteThrough,
            0,
        )
        .unwrap();
    engine
}

fn drain(rec: &tiercache_engine::Recording) -> Vec<TracedRequest> {
    std::iter::from_fn(|| rec.next_request()).collect()
}

#[test]
fn every_entry_point_is_recorded_in_order_with_its_volume_op_offset_and_length() {
    let engine = two_volumes();
    let (v0, v1) = (
        engine.volume_handle(VolumeId(0)).unwrap(),
        engine.volume_handle(VolumeId(1)).unwrap(),
    );
    let mut buf = vec![0u8; 8192];
    // Nothing is recorded before a recording starts.
    v0.read(0, &mut buf).unwrap();
    assert_eq!(engine.trace_stats(), None);

    let rec = engine.start_recording(None, 1024).unwrap();
    assert!(
        engine.start_recording(None, 16).is_err(),
        "one recording at a time"
    );
    v0.write(4096, &buf[..4096], false).unwrap();
    v1.read(8192, &mut buf).unwrap();
    v0.write_zeroes(0, 16384, false).unwrap();
    v1.trim(65536, 4096).unwrap();
    // A hit served by the front end itself is recorded once.
    v1.read(8192, &mut buf).unwrap();
    let quick = v1.read_if_cached(8192, &mut buf);
    assert!(matches!(quick, Some(Ok(()))), "the block was promoted");
    let got = drain(&rec);
    let seen: Vec<(u16, TracedOp, u64, u64)> = got
        .iter()
        .map(|r| (r.volume.0, r.op, r.offset, r.len))
        .collect();
    assert_eq!(
        seen,
        vec![
            (0, TracedOp::Write, 4096, 4096),
            (1, TracedOp::Read, 8192, 8192),
            (0, TracedOp::WriteZeroes, 0, 16384),
            (1, TracedOp::Trim, 65536, 4096),
            (1, TracedOp::Read, 8192, 8192),
            (1, TracedOp::Read, 8192, 8192),
        ]
    );
    assert!(got.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert_eq!(
        engine.trace_stats(),
        Some(TraceStats {
            recording: true,
            requests: 6,
            dropped: 0
        })
    );
    drop(rec);
    v0.read(0, &mut buf).unwrap();
    let stats = engine.trace_stats().unwrap();
    assert!(!stats.recording);
    assert!(engine.stats().to_string().contains("trace"));

    // A new recording of one volume sees only that volume, counted afresh.
    let rec = engine.start_recording(Some(VolumeId(1)), 1024).unwrap();
    v0.read(0, &mut buf).unwrap();
    v1.read(0, &mut buf).unwrap();
    let got = drain(&rec);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].volume, got[0].offset), (VolumeId(1), 0));
    assert_eq!(rec.stats().requests, 1);
}

#[test]
fn a_stalled_reader_drops_and_counts_requests_and_never_holds_an_io_up() {
    let engine = two_volumes();
    let v0 = engine.volume_handle(VolumeId(0)).unwrap();
    // A queue of 4 records that nobody reads while 4 threads do 2000 IOs.
    let rec = engine.start_recording(None, 4).unwrap();
    assert_eq!(rec.buffer_capacity(), 4);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let v0 = v0.clone();
            s.spawn(move || {
                let mut buf = vec![0u8; 4096];
                for i in 0..500u64 {
                    let off = ((t * 500 + i) % 256) * 4096;
                    if i % 2 == 0 {
                        v0.read(off, &mut buf).unwrap();
                    } else {
                        v0.write(off, &buf, false).unwrap();
                    }
                }
            });
        }
    });
    let stats = rec.stats();
    assert_eq!(stats.dropped, 2000 - 4, "all but the queue's 4 are dropped");
    assert_eq!(drain(&rec).len(), 4);
    assert_eq!(
        engine.stats().trace.map(|t| (t.requests, t.dropped)),
        Some((4, 1996)),
        "stats report the drops"
    );
    // Once read, the queue takes requests again.
    let mut buf = vec![0u8; 4096];
    v0.read(0, &mut buf).unwrap();
    assert_eq!(drain(&rec).len(), 1);
}
