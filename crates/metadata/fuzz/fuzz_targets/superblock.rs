//! Fuzzes `decode_superblock` (format version 3). The first byte picks the block number (0..4) and whether
//! the input is taken raw or made to look plausible (right magic and block
//! number, valid crc) so the fuzzer reaches the field checks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_metadata::codec::{
    decode_superblock, encode_superblock, seal, META_BLOCK, SUPERBLOCK_MAGIC,
};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let block = u64::from(ctl & 3);
    if ctl & 4 == 0 {
        let _ = decode_superblock(rest, block);
        return;
    }
    let mut b = vec![0u8; META_BLOCK];
    let n = rest.len().min(META_BLOCK - 24);
    b[24..24 + n].copy_from_slice(&rest[..n]);
    b[..8].copy_from_slice(&SUPERBLOCK_MAGIC);
    b[16..24].copy_from_slice(&block.to_le_bytes());
    seal(&mut b);
    if let Ok(sb) = decode_superblock(&b, block) {
        // A version-3 superblock that decodes is the canonical encoding of
        // what it decodes to (nothing the decoder ignores).
        assert_eq!(encode_superblock(&sb), b, "re-encoding differs");
    }
});
