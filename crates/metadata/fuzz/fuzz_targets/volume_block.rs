//! Fuzzes `decode_volume_block` (and through it `decode_volume_slot`). The
//! first byte picks the block number (0..4) and whether the input is taken
//! raw or made to look plausible (right magic and block number, valid crc)
//! so the fuzzer reaches the record checks. A block that decodes must
//! encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_metadata::codec::{seal, META_BLOCK};
use tiercache_metadata::volume::{decode_volume_block, encode_volume_block, VOLUME_MAGIC};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let block = u64::from(ctl & 3);
    if ctl & 4 == 0 {
        let _ = decode_volume_block(rest, block);
        return;
    }
    let mut b = vec![0u8; META_BLOCK];
    let n = rest.len().min(META_BLOCK - 24);
    b[24..24 + n].copy_from_slice(&rest[..n]);
    b[..8].copy_from_slice(&VOLUME_MAGIC);
    b[16..24].copy_from_slice(&block.to_le_bytes());
    if ctl & 8 != 0 {
        // Small counts reach the records.
        b[53..56].fill(0);
    }
    seal(&mut b);
    if let Ok(v) = decode_volume_block(&b, block) {
        let mut again = vec![0u8; META_BLOCK];
        encode_volume_block(
            v.header.uuid,
            v.header.seq,
            block,
            v.index,
            &v.slots,
            &mut again,
        );
        assert_eq!(
            again, b,
            "a decoded volume-table block re-encodes to itself"
        );
    }
});
