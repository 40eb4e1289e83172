//! A request stream's footprint: the distinct blocks it touches, the size
//! that cache sizes given in % of the footprint are taken of (the policy
//! panel, its test, the pool's curves).

use crate::trace::{open_trace, Request, TraceOptions};
use crate::Result;
use std::collections::HashSet;
use std::path::Path;

/// Distinct blocks of `block_size` bytes that `requests` touch (a request
/// of length 0 touches none).
pub fn distinct_blocks(requests: impl IntoIterator<Item = Request>, block_size: u64) -> u64 {
    let mut seen = HashSet::new();
    for r in requests {
        if r.len == 0 {
            continue;
        }
        for b in r.offset / block_size..=(r.offset + r.len - 1) / block_size {
            seen.insert(b);
        }
    }
    seen.len() as u64
}

/// Distinct blocks of `block_size` bytes that the trace at `path` touches:
/// one pass over it, streamed, before a run that needs cache sizes in % of
/// it. The first request that does not parse is the error.
pub fn trace_footprint(path: &Path, options: &TraceOptions, block_size: u32) -> Result<u64> {
    let mut bad = None;
    let requests = open_trace(path, options)?.map_while(|r| r.map_err(|e| bad = Some(e)).ok());
    let blocks = distinct_blocks(requests, u64::from(block_size));
    match bad {
        Some(e) => Err(e),
        None => Ok(blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_types::{Access, Time};

    fn req(offset: u64, len: u64) -> Request {
        Request {
            time: Time(0),
            offset,
            len,
            access: Access::Read,
        }
    }

    #[test]
    fn counts_each_block_once_whatever_requests_touch_it() {
        let reqs = [
            req(0, 4096),
            req(4095, 2),
            req(8192, 0),
            req(3 * 4096, 4096),
        ];
        // Blocks 0 and 1 (the second request straddles them) and 3; the
        // empty request touches nothing.
        assert_eq!(distinct_blocks(reqs, 4096), 3);
        assert_eq!(distinct_blocks(reqs, 65536), 1);
    }
}
