//! Fuzzes the 16-byte packed entry: `unpack` never panics, and an entry
//! that unpacks is the canonical packing of what it unpacks to (with the
//! generation it carries), up to the ignored spare bits 57..64; a mapped
//! entry never has generation 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tiercache_metadata::codec::{entry_generation, pack, unpack, PackedEntry, ENTRY_LEN};

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks_exact(ENTRY_LEN) {
        let p: PackedEntry = chunk.try_into().expect("16 bytes");
        if let Ok(e) = unpack(p) {
            let mut canonical = p;
            canonical[7] &= 0x01;
            assert_eq!(pack(e, entry_generation(&p)), canonical);
            assert!(e.is_none() || entry_generation(&p) != 0);
        }
    }
});
