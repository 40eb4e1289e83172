//! Device errors: counted, named, and, past the cache device's error
//! limit, the cache taken out of use (passthrough from then on).

use crate::stats::IoCounters;
use crate::Engine;
use tiercache_types::CacheMode;

impl Engine {
    /// Counts a cache device error and takes the cache out of use once
    /// there were too many.
    pub(crate) fn cache_error(&self, e: &std::io::Error, write: bool) {
        let c = if write {
            &self.io.cache_write_errors
        } else {
            &self.io.cache_read_errors
        };
        IoCounters::add(c, 1);
        let total = self
            .io
            .cache_read_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            + self
                .io
                .cache_write_errors
                .load(std::sync::atomic::Ordering::Relaxed);
        log::warn!(
            "cache device {}: {} error: {e}",
            self.cache.describe(),
            if write { "write" } else { "read" }
        );
        if total >= self.cache_error_limit {
            let mut failure = self.cache_failure.lock();
            if failure.is_none() {
                let reason = format!("{total} IO errors, last: {e}");
                log::error!(
                    "cache device {} taken out of use ({reason}); serving from the backing device",
                    self.cache.describe()
                );
                *failure = Some(reason);
                self.director.lock().set_mode_all(CacheMode::PassThrough);
            }
        }
    }
}
