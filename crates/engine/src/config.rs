//! How to build an engine: [`EngineConfig`].

use tiercache_policy::PolicyConfig;
use tiercache_types::CacheMode;

/// How to build an engine.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    pub mode: CacheMode,
    /// Cache block size in bytes: a power of two from 4 KiB to 1 MiB.
    pub block_size: u32,
    /// Sequential cutoff in bytes (bcache's default 4 MiB); 0 disables.
    pub sequential_cutoff: u64,
    pub policy: PolicyConfig,
    /// Byte offset of cache slot 0 on the cache device; the space before it
    /// belongs to the metadata.
    pub cache_data_offset: u64,
    /// Use at most this many cache blocks (default: all that fit).
    pub max_cache_blocks: Option<u32>,
    /// Cache device errors tolerated before the cache is taken out of use.
    pub cache_error_limit: u64,
}

/// The most cache blocks [`default_block_size`] lets a cache have before it
/// doubles the block size: 16 Mi blocks, 400 MiB of RAM at the engine's
/// bound of 25 B per block.
pub const DEFAULT_MAX_BLOCKS: u64 = 1 << 24;

/// The block size a cache of `cache_bytes` gets when none is asked for:
/// 4 KiB, doubled while the cache would hold more than
/// [`DEFAULT_MAX_BLOCKS`] blocks, and at most 64 KiB (so 4 KiB up to a 64
/// GiB cache, 64 KiB from 1 TiB on).
///
/// Why small blocks: a cache block is the unit of a hit. A hot 4 KiB piece
/// of a 64 KiB block holds the whole slot, so with random 4 KiB reads over
/// data larger than the cache, 64 KiB blocks keep a sixteenth of the hot
/// pieces 4 KiB blocks keep (bcache and Open CAS cache 4 KiB pieces too).
/// Why the bound: the RAM, which grows with the number of blocks
/// (lvmcache grows its chunk for the same reason). Measured in the VM lab
/// against bcache (docs/BENCHMARKS.md, "The block size from a quiet HDD").
pub fn default_block_size(cache_bytes: u64) -> u32 {
    let mut bs: u32 = 4096;
    while bs < 64 * 1024 && cache_bytes / u64::from(bs) > DEFAULT_MAX_BLOCKS {
        bs *= 2;
    }
    bs
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mode: CacheMode::WriteThrough,
            block_size: 64 * 1024,
            sequential_cutoff: 4 << 20,
            policy: PolicyConfig::default(),
            cache_data_offset: 0,
            max_cache_blocks: None,
            cache_error_limit: 16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_block_size_grows_with_the_cache_from_4k_to_64k() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_block_size(0), 4096);
        assert_eq!(default_block_size(256 << 20), 4096);
        assert_eq!(default_block_size(64 * GIB), 4096);
        assert_eq!(default_block_size(64 * GIB + 4096), 8192);
        assert_eq!(default_block_size(128 * GIB), 8192);
        assert_eq!(default_block_size(1024 * GIB), 64 * 1024);
        assert_eq!(default_block_size(64 * 1024 * GIB), 64 * 1024);
        for shift in 12..50 {
            let bs = u64::from(default_block_size(1 << shift));
            assert!(bs.is_power_of_two() && (4096..=65536).contains(&bs));
            assert!(bs == 65536 || (1u64 << shift) / bs <= DEFAULT_MAX_BLOCKS);
        }
    }
}
