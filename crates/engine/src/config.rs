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
