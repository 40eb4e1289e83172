//! Fuzzes the transmission request parser and validator. The first 28
//! bytes are a request header, the next ones describe the negotiated
//! context. Contract: never panics; parsed headers re-encode to the same
//! bytes; executed commands are always in range and within limits (reads
//! and writes within the maximum block size).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_nbd::proto::*;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_request_header(data) else {
        return;
    };
    assert_eq!(&h.encode()[..], &data[..REQUEST_HEADER_LEN]);
    let rest = &data[REQUEST_HEADER_LEN..];
    let byte = |i: usize| rest.get(i).copied().unwrap_or(0);
    let size = u64::from_be_bytes(std::array::from_fn(|i| byte(i)));
    let ctx = TransmissionContext {
        size,
        flags: u16::from_be_bytes([byte(8), byte(9)]) | FLAG_HAS_FLAGS,
        min_block: 1 << (byte(10) % 17),
        max_block: (1u32 << (9 + byte(11) % 18)).max(1 << (byte(10) % 17)),
    };
    match validate_request(&h, &ctx) {
        Verdict::Execute(Command::Read { offset, len } | Command::Write { offset, len, .. }) => {
            assert!(offset + u64::from(len) <= ctx.size);
            assert!(len <= ctx.max_block);
            assert_eq!(offset % u64::from(ctx.min_block), 0);
        }
        // No payload, no maximum (Linux's nbd client sends write-zeroes
        // far above it).
        Verdict::Execute(Command::WriteZeroes { offset, len, .. }) => {
            assert!(offset + u64::from(len) <= ctx.size);
            assert_eq!(offset % u64::from(ctx.min_block), 0);
        }
        Verdict::Execute(Command::Trim { offset, len, .. }) => {
            assert!(offset + u64::from(len) <= ctx.size);
        }
        Verdict::Reject { discard, .. } => assert_eq!(discard, h.payload_len()),
        Verdict::Disconnect(_) => assert!(h.length > ctx.discard_limit()),
        Verdict::Execute(_) => {}
    }
});
