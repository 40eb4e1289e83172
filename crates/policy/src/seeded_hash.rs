//! The one hash the policies use for blocks: the splitmix64 finaliser over
//! the block number XORed with a per-use seed, so that tables and samples
//! keyed by it (the slot index, the ghost, the mini-caches' sample, the
//! fill gate's explorers, admission's counters) do not collide alike.

/// splitmix64's finaliser of `x ^ seed`: cheap and well mixed.
#[inline]
pub fn seeded_hash(x: u64, seed: u64) -> u64 {
    let mut z = (x ^ seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_give_unrelated_hashes_and_zero_is_plain_splitmix() {
        // splitmix64's first output for state 0 (Vigna's reference).
        assert_eq!(seeded_hash(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_ne!(seeded_hash(1, 0), seeded_hash(1, 1));
        let same_low_byte = (0..1000u64)
            .filter(|&x| seeded_hash(x, 7) & 0xFF == seeded_hash(x, 8) & 0xFF)
            .count();
        assert!(same_low_byte < 20, "{same_low_byte}");
    }
}
